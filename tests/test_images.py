"""Your own images as a mix ("folder:PATH", the studies' ``image_folder``): its distribution is the
sizes of the folder's images, the studies run on it, and a bad folder is refused naming it."""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from workbench import cli, limits
from workbench.config import VisionConfig
from workbench.preprocess import preprocess, smart_resize
from workbench.samples import (folder_mix_name, get_mix, image_mix, mix_columns, mix_distribution, mix_label,
                               mix_sizes, sample_images, with_folder)
from workbench.studies import ParamError, check_table, wide
from workbench.studies import encoder_latency as el
from workbench.studies import padding_waste as pw
import workbench.studies.encoder_latency.summary  # noqa: F401  (binds encoder_latency.summary)
import workbench.studies.padding_waste.summary  # noqa: F401  (binds padding_waste.summary)

PRESET = "tiny-qwen2-vl"
# (photo, height, width, file): the shipped photos saved at several sizes, one size twice
SAVED = [("astronaut", 512, 512, "astronaut.jpg"), ("astronaut", 128, 160, "small/astronaut.png"),
         ("chelsea", 300, 451, "chelsea.png"), ("coffee", 200, 300, "deep/er/coffee.webp"),
         ("rocket", 200, 300, "deep/rocket.png"), ("grace_hopper", 90, 120, "grace.bmp")]


def make_folder(root: Path) -> Path:
    """SAVED under ``root``, beside a text file and a hidden image (both ignored)."""
    photos = sample_images()
    for name, h, w, rel in SAVED:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        photos[name].resize((w, h), Image.Resampling.BICUBIC).save(root / rel)
    (root / "notes.txt").write_text("not an image")
    photos["coffee"].save(root / ".hidden.png")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = make_folder(tmp_path_factory.mktemp("imgs") / "my photos")
    get_mix(folder_mix_name(root))
    return root


def test_the_mix_is_the_sizes_saved_each_weighted_by_its_images(folder):
    mix = get_mix(folder_mix_name(folder))
    assert {(e.height, e.width): e.weight for e in mix.entries} == Counter((h, w) for _, h, w, _ in SAVED)
    assert all(e.kind == "image" and e.frames == 1 for e in mix.entries)
    assert mix.folder == str(folder) and mix.fingerprint.startswith(f"{len(SAVED)}-")
    assert sorted(f for files in mix.files for f in files) == sorted(rel for *_, rel in SAVED)
    # the exact distribution: each saved size through the processor's resize, by count
    cfg = VisionConfig.preset(PRESET)
    f = cfg.patch_size * cfg.merge_size
    expect = Counter()
    for _, h, w, _ in SAVED:
        rh, rw = smart_resize(h, w, f, cfg.min_pixels, cfg.max_pixels)
        expect[(rh // f) * (rw // f)] += 1 / len(SAVED)
    got = mix_distribution(folder_mix_name(folder), cfg)
    assert [t for t, _ in got] == sorted(expect) and [p for _, p in got] == pytest.approx([expect[t] for t in sorted(expect)])
    assert mix.tokens == (got[0][0], got[-1][0])


def test_names_labels_and_the_study_columns(folder):
    name = folder_mix_name(folder)
    assert name == f"folder:{folder}" and get_mix(f"folder:{folder}/small/..").name == name
    assert mix_label(name) == "folder:my photos" and mix_label("charts") == "charts"
    assert with_folder(["photos"], str(folder)) == ["photos", name] and with_folder(["photos"], None) == ["photos"]
    assert mix_columns(name) == {"mix": "folder:my photos", "fingerprint": get_mix(name).fingerprint}
    assert mix_columns("photos") == {"mix": "photos"}


def test_the_fingerprint_follows_the_content_not_the_place(folder, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert get_mix(folder_mix_name(copy)).fingerprint == get_mix(folder_mix_name(folder)).fingerprint
    sample_images(["chelsea"])["chelsea"].resize((64, 48)).save(copy / "chelsea.png")   # a changed file is read again
    changed = get_mix(folder_mix_name(copy))
    assert changed.fingerprint != get_mix(folder_mix_name(folder)).fingerprint
    assert (48, 64) in {(e.height, e.width) for e in changed.entries}


def test_the_size_is_the_shown_one_exif_orientation_applied(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6                                       # stored landscape, shown turned: portrait
    sample_images(["coffee"])["coffee"].resize((300, 200)).save(tmp_path / "turned.jpg", exif=exif)
    name = folder_mix_name(tmp_path)
    assert [(e.height, e.width) for e in get_mix(name).entries] == [(300, 200)]
    assert image_mix(name, 1)[0].size == (200, 300)        # PIL: (width, height)


def test_drawn_items_are_the_folders_own_images(folder):
    name = folder_mix_name(folder)
    mix = get_mix(name)
    items = image_mix(name, 8, seed=5)
    drawn = mix_sizes(name, 8, seed=5)
    assert [im.size for im in items] == [(it.width, it.height) for it in drawn]
    for im, it in zip(items, drawn):
        files = mix.files[it.entry]
        candidates = [np.asarray(Image.open(folder / f).convert("RGB")) for f in files]
        assert any(np.array_equal(np.asarray(im), c) for c in candidates)    # decoded as stored, not resized
    cfg = VisionConfig.preset(PRESET)
    assert (preprocess(image_mix(name, 8, seed=5, resized=True), cfg).grid_thw.tolist()
            == preprocess(items, cfg).grid_thw.tolist())


def _refused(path) -> str:
    with pytest.raises(ValueError) as e:
        get_mix(folder_mix_name(path))
    return str(e.value)


def test_a_bad_folder_is_refused_naming_it_and_what_is_valid(tmp_path):
    valid = "valid: a folder of image files (.bmp, .gif, .jpeg, .jpg, .png"
    msg = _refused(tmp_path / "nowhere")
    assert f"image folder '{tmp_path / 'nowhere'}' does not exist" in msg and valid in msg
    (tmp_path / "a.png").write_bytes(b"x")
    msg = _refused(tmp_path / "a.png")
    assert f"'{tmp_path / 'a.png'}' is a file, not a folder" in msg and valid in msg
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no images")
    assert f"image folder '{tmp_path / 'empty'}' holds no readable image (0 file(s)" in _refused(tmp_path / "empty")
    assert f"{tmp_path / 'a.png'}: not an image file PIL can open (UnidentifiedImageError)" in _refused(tmp_path)
    with pytest.raises(ValueError, match="unknown image mix 'nope'; valid: .*photos, or folder:PATH with PATH a folder"):
        get_mix("nope")
    with pytest.raises(ValueError, match="'folder:' names no folder"):
        get_mix("folder:")


def test_too_many_files_or_too_large_an_image_hit_a_cap(folder):
    with limits.raised(folder_images=3):
        with pytest.raises(limits.LimitError, match=rf"image folder '{folder}' holds too many image files.*"
                                                    rf"'folder_images'"):
            get_mix(folder_mix_name(folder))
    with limits.raised(input_pixels=512 * 511):
        with pytest.raises(limits.LimitError, match=r"/astronaut.jpg: an image of 512x512 \(HxW\) pixels.*'input_pixels'"):
            get_mix(folder_mix_name(folder))


def test_the_parameter_is_checked_before_any_work(folder, tmp_path):
    for study in (pw, el):
        assert study.PARAMS.resolve({"image_folder": str(folder)})["image_folder"] == str(folder)
        assert study.PARAMS.resolve({})["image_folder"] is None
        with pytest.raises(ParamError, match=r"image_folder='my photos': a relative path; give the whole path"):
            study.PARAMS.resolve({"image_folder": "my photos"}, study="x")
    results = tmp_path / "results"
    with pytest.raises(SystemExit, match=rf"image_folder='{tmp_path}/nope': image folder '{tmp_path}/nope' does not exist"):
        cli.main(["sweep", "--results", str(results), "--direct", "--studies", "padding_waste",
                  "--set", f"image_folder={tmp_path}/nope"])
    assert not results.exists() or not any(results.iterdir())


def test_padding_waste_runs_on_the_folder_and_draws_its_sizes(folder):
    t = pw.run(device="cpu", progress=False, preset=PRESET, mixes=["photos"], image_folder=str(folder), n_items=3,
               max_items=[1], budget_sets=["pow2", "planner"], reps=1)
    check_table(t)
    w = wide(t)
    mine = w[w.mix == "folder:my photos"]
    assert set(mine.case) == {"sizes", "curve", "expected", "runner", "out_of_sample"}
    assert (mine.fingerprint == get_mix(folder_mix_name(folder)).fingerprint).all()
    assert w[w.mix == "photos"].fingerprint.isna().all()
    sizes = mine[mine.case == "sizes"]
    assert dict(zip(zip(sizes.height, sizes.width), sizes.images)) == Counter((h, w) for _, h, w, _ in SAVED)
    assert (sizes.folder == str(folder)).all() and sizes.share.sum() == pytest.approx(1.0)
    assert (mine[mine.case == "runner"].rel_err_vs_eager < 1e-5).all()
    fig = pw.summary.plot_sizes(t)
    assert len(fig.axes) == 2                               # tokens per item of both mixes; the folder's sizes
    assert pw.summary.plot_sizes(t[t.mix == "photos"]).axes.__len__() == 1


def test_encoder_latency_times_the_folders_images(folder):
    t = el.run(device="cpu", progress=False, presets=[PRESET], tokens=[64], images=[1], mixes=[],
               image_folder=str(folder), mix_items=[2], reference=False, reps=1, warmup=0, engine_max_budget=256)
    w = wide(el.summary.mix_cells(t))
    assert set(w.mix) == {"folder:my photos"} and set(w.images) == {2}
    assert (w.fingerprint == get_mix(folder_mix_name(folder)).fingerprint).all()
    assert "eager" in set(w.path)
