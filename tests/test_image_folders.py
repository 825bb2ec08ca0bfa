"""Folders from anyone (issue 28): a folder mix reads every file as wb.preprocess reads the PIL
image it opens (`workbench.preprocess.load_image`), so what the folder shows, plans and draws is
what preprocess makes of it; a special file (a named pipe, a socket) is skipped with a warning and
never opened; a file the reader refuses refuses the folder, naming the file, before a run starts."""
from __future__ import annotations

import dataclasses
import os
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import workbench as wb
from workbench.preprocess import load_image, preprocess, smart_resize
from workbench.samples import check_image_folder, folder_mix_name, get_mix, image_mix, sample_images
from workbench.studies import ParamError
from workbench.studies import encoder_latency as el
from workbench.studies import padding_waste as pw

REPO = Path(__file__).resolve().parents[1]
CFG = wb.VisionConfig.preset("tiny-qwen2-vl")
ORIENTATION = 0x0112


def photo(h: int, w: int, name: str = "coffee") -> np.ndarray:
    """A real photo resized to h x w: uint8 [h, w, 3]."""
    return np.asarray(sample_images([name])[name].resize((w, h), Image.Resampling.BICUBIC))


def with_alpha(rgb: np.ndarray, seed: int) -> np.ndarray:
    """``rgb`` with a random alpha: uint8 [h, w, 4], fully transparent in its left quarter."""
    alpha = np.random.default_rng(seed).integers(0, 256, rgb.shape[:2], dtype=np.uint8)
    alpha[:, : rgb.shape[1] // 4] = 0
    return np.dstack([rgb, alpha])


def turned_exif(orientation: int = 6) -> Image.Exif:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation       # 6: stored landscape, shown turned 90 degrees clockwise
    return exif


def png_with_exif_after_the_pixels(path: Path, rgb: np.ndarray, orientation: int = 6) -> None:
    """A PNG whose eXIf chunk follows its IDAT data (PIL's writer puts it before): PIL sees the
    orientation only once the image is decoded."""
    Image.fromarray(rgb).save(path)
    data = path.read_bytes()
    assert data[-8:-4] == b"IEND"
    body = turned_exif(orientation).tobytes(8)
    body = body[6:] if body.startswith(b"Exif\x00\x00") else body
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body + struct.pack(">I", zlib.crc32(b"eXIf" + body))
    path.write_bytes(data[:-12] + chunk + data[-12:])


def shown_sizes(folder: Path) -> dict[str, tuple[int, int]]:
    """{file: (H, W)} as the folder mix lists them."""
    mix = get_mix(folder_mix_name(folder))
    return {f: (e.height, e.width) for e, files in zip(mix.entries, mix.files) for f in files}


def refusal(call) -> str:
    with pytest.raises(ValueError) as e:
        call()
    return str(e.value)


def preprocess_refusal(path: Path) -> str:
    """preprocess's own message for the PIL image the file opens as."""
    return refusal(lambda: preprocess(Image.open(path), CFG))


# ---- special files: skipped with a warning, never opened -----------------------------------------
@pytest.mark.timeout(20)
def test_a_named_pipe_is_skipped_with_a_warning_and_never_opened(tmp_path):
    Image.fromarray(photo(60, 90)).save(tmp_path / "good.png")
    os.mkfifo(tmp_path / "cam.png")
    os.symlink(tmp_path / "cam.png", tmp_path / "link-to-pipe.jpg")
    skipped = (r"skipping 2 entry\(ies\) that are not regular files \(never opened\): "
               r"cam.png \(a FIFO\); link-to-pipe.jpg \(a FIFO\)")
    with pytest.warns(UserWarning, match=skipped):
        assert shown_sizes(tmp_path) == {"good.png": (60, 90)}
    with pytest.warns(UserWarning, match=skipped):
        assert wb.plan_budgets(f"folder:{tmp_path}", 4)
    with pytest.warns(UserWarning, match=skipped):
        check_image_folder(str(tmp_path))
    with pytest.warns(UserWarning, match=skipped):
        assert np.array_equal(np.asarray(image_mix(folder_mix_name(tmp_path), 1)[0]), photo(60, 90))
    with pytest.raises(ValueError, match=r"cam.png: a FIFO, not an image file; valid: a regular"):
        load_image(tmp_path / "cam.png")                                  # the reader itself opens no pipe


@pytest.mark.timeout(20)
def test_a_folder_of_special_files_only_is_refused_naming_them(tmp_path):
    os.mkfifo(tmp_path / "a.png")
    os.symlink(tmp_path / "gone.png", tmp_path / "broken.png")
    with pytest.warns(UserWarning, match="a.png"):
        msg = refusal(lambda: get_mix(folder_mix_name(tmp_path)))
    assert (f"image folder '{tmp_path}' holds no readable image (0 file(s) with an image suffix; skipped: "
            f"a.png (a FIFO); broken.png (a broken symbolic link))") in msg


@pytest.mark.timeout(20)
def test_a_socket_is_skipped_with_a_warning(tmp_path):
    Image.fromarray(photo(60, 90)).save(tmp_path / "good.png")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.png"))
    except OSError as e:                      # a path too long for a socket address
        pytest.skip(f"cannot bind a socket in {tmp_path}: {e}")
    with sock, pytest.warns(UserWarning, match=r"s.png \(a socket\)"):
        assert shown_sizes(tmp_path) == {"good.png": (60, 90)}


def test_a_link_to_an_image_elsewhere_is_followed(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "picked").mkdir()
    Image.fromarray(photo(60, 90)).save(tmp_path / "library" / "a.png")
    os.symlink(tmp_path / "library" / "a.png", tmp_path / "picked" / "a.png")
    assert shown_sizes(tmp_path / "picked") == {"a.png": (60, 90)}


# ---- the same conversions as wb.preprocess ------------------------------------------------------
@pytest.mark.parametrize("make, mode", [
    (lambda rgb: (rgb[..., 0].astype(np.uint16) * 257), "I;16"),     # a 16-bit grey PNG
    (lambda rgb: rgb[..., 0].astype(np.float32) / 255, "F"),         # a 0..1 float TIFF
])
def test_a_mode_preprocess_refuses_refuses_the_folder_with_its_message(tmp_path, make, mode):
    path = tmp_path / ("deep.png" if mode == "I;16" else "float.tif")
    Image.fromarray(make(photo(40, 60))).save(path)
    Image.fromarray(photo(40, 60)).save(tmp_path / "fine.png")
    assert Image.open(path).mode == mode
    msg = refusal(lambda: get_mix(folder_mix_name(tmp_path)))
    assert f"image folder '{tmp_path}': 1 of 2 image file(s) cannot be read as wb.preprocess reads images" in msg
    assert f"{path}: {preprocess_refusal(path)}" in msg and f"PIL image mode '{mode}' is not supported" in msg


@pytest.mark.parametrize("kind", ["RGBA", "LA", "P"])
def test_transparency_is_composited_on_white_as_preprocess_does(tmp_path, kind, seed):
    rgba = with_alpha(photo(56, 84), seed)
    path = tmp_path / f"{kind}.png"
    if kind == "RGBA":
        Image.fromarray(rgba).save(path)
    elif kind == "LA":
        Image.fromarray(rgba[..., [0, 3]], "LA").save(path)
    else:                                   # a palette image whose index 0 is transparent
        pal = Image.fromarray(rgba[..., :3]).quantize(16)
        idx = np.asarray(pal).copy()
        idx[:, :20] = 0
        pal = Image.fromarray(idx, "P")
        pal.putpalette(Image.fromarray(rgba[..., :3]).quantize(16).getpalette())
        pal.save(path, transparency=0)
    opened = Image.open(path)
    assert opened.mode == kind and (kind != "P" or "transparency" in opened.info)
    item = image_mix(folder_mix_name(tmp_path), 1)[0]
    assert np.array_equal(np.asarray(item), np.asarray(load_image(path)))
    assert np.asarray(item)[:, :14].min() == 255                      # transparent: white, not black
    ours, theirs = preprocess(item, CFG), preprocess(Image.open(path), CFG)
    assert theirs.grid_thw.tolist() == ours.grid_thw.tolist()
    assert (ours.pixels == theirs.pixels).all()


# ---- EXIF orientation, from wherever the file keeps it -----------------------------------------
def test_a_turned_tiff_is_shown_turned(tmp_path):
    stored = photo(40, 64)
    Image.fromarray(stored).save(tmp_path / "turned.tif", exif=turned_exif(6))
    assert shown_sizes(tmp_path) == {"turned.tif": (64, 40)}
    item = image_mix(folder_mix_name(tmp_path), 1)[0]
    assert np.array_equal(np.asarray(item), np.rot90(stored, k=-1))   # 6: turned clockwise, not squeezed


def test_exif_after_the_pixel_data_of_a_png_is_seen(tmp_path):
    stored = photo(40, 64)
    path = tmp_path / "late.png"
    png_with_exif_after_the_pixels(path, stored)
    with Image.open(path) as im:
        assert "exif" not in im.info           # the header does not hold it ...
        im.load()
        assert im.getexif()[ORIENTATION] == 6   # ... the chunk after the pixel data does
    assert shown_sizes(tmp_path) == {"late.png": (64, 40)}
    item = image_mix(folder_mix_name(tmp_path), 1)[0]
    assert np.array_equal(np.asarray(item), np.rot90(stored, k=-1))


def test_the_listed_sizes_are_the_readers(tmp_path, seed):
    """Every size the folder lists (and plans with) is the size load_image returns, and a drawn
    full-size item is exactly load_image's image."""
    Image.fromarray(photo(50, 70)).save(tmp_path / "plain.jpg")
    Image.fromarray(photo(40, 64)).save(tmp_path / "turned.jpg", exif=turned_exif(8))
    Image.fromarray(photo(40, 64)).save(tmp_path / "turned.tif", exif=turned_exif(5))
    png_with_exif_after_the_pixels(tmp_path / "late.png", photo(30, 44), orientation=6)
    Image.fromarray(with_alpha(photo(36, 48), seed)).save(tmp_path / "alpha.png")
    sizes = shown_sizes(tmp_path)
    assert sizes == {f: load_image(tmp_path / f).size[::-1] for f in os.listdir(tmp_path)}
    assert sizes["turned.jpg"] == sizes["turned.tif"] == (64, 40) and sizes["late.png"] == (44, 30)
    name = folder_mix_name(tmp_path)
    mix = get_mix(name)
    for item, drawn in zip(image_mix(name, 10, seed=seed % 1000), wb.mix_sizes(name, 10, seed=seed % 1000)):
        candidates = [np.asarray(load_image(tmp_path / f)) for f in mix.files[drawn.entry]]
        assert any(np.array_equal(np.asarray(item), c) for c in candidates)


def test_resized_draws_decode_a_jpeg_small_and_still_turned(tmp_path):
    """resized=True decodes a JPEG at a reduced scale (PIL draft): the item has the processor's
    size and looks like the full decode resized, turned the same way."""
    Image.fromarray(photo(480, 720)).save(tmp_path / "turned.jpg", exif=turned_exif(6), quality=95)
    cfg = dataclasses.replace(CFG, max_pixels=28 * 28 * 16)
    h, w = smart_resize(720, 480, 28, cfg.min_pixels, cfg.max_pixels)       # shown portrait
    item = image_mix(folder_mix_name(tmp_path), 1, resized=True, cfg=cfg)[0]
    full = load_image(tmp_path / "turned.jpg")
    assert full.size == (480, 720) and item.size == (w, h)
    small = load_image(tmp_path / "turned.jpg", reduce_to=(h, w)).size
    assert small[0] < 480 and small[1] < 720 and small[0] >= w and small[1] >= h          # decoded smaller
    want = np.asarray(full.resize(item.size, Image.Resampling.BICUBIC), np.float64)
    assert np.abs(np.asarray(item, np.float64) - want).mean() < 4     # the same picture, the same way up
    assert preprocess(item, cfg).grid_thw.tolist() == preprocess(full, cfg).grid_thw.tolist()


# ---- files the reader refuses: named, before any run --------------------------------------------
def truncated_jpeg(path: Path) -> None:
    Image.fromarray(photo(120, 160)).save(path, quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_jpeg_is_refused_by_the_check_naming_it(tmp_path):
    Image.fromarray(photo(60, 90)).save(tmp_path / "good.png")
    truncated_jpeg(tmp_path / "cut.jpg")
    assert Image.open(tmp_path / "cut.jpg").size == (160, 120)     # its header alone looks fine
    msg = refusal(lambda: check_image_folder(str(tmp_path)))
    assert (f"image folder '{tmp_path}': 1 of 2 image file(s) cannot be read as wb.preprocess reads images (fix or "
            f"remove them): {tmp_path / 'cut.jpg'} could not be decoded (OSError: image file is truncated") in msg
    assert "\n" not in msg


def test_an_image_over_the_aspect_cap_is_named(tmp_path):
    Image.fromarray(photo(60, 90)).save(tmp_path / "good.png")
    Image.fromarray(photo(2, 500)).save(tmp_path / "strip.png")
    msg = refusal(lambda: get_mix(folder_mix_name(tmp_path)))
    assert (f"{tmp_path / 'strip.png'}: image of 2x500 (HxW) has aspect ratio 250.0; Qwen2-VL accepts at most 200"
            in msg)


def test_every_refused_file_is_named_in_one_error(tmp_path):
    truncated_jpeg(tmp_path / "cut.jpg")
    Image.fromarray(photo(2, 500)).save(tmp_path / "strip.png")
    (tmp_path / "text.webp").write_text("not an image")
    msg = refusal(lambda: get_mix(folder_mix_name(tmp_path)))
    assert "3 of 3 image file(s)" in msg
    assert all(f"{tmp_path / f}" in msg for f in ("cut.jpg", "strip.png", "text.webp"))


@pytest.mark.timeout(20)
def test_the_planner_and_the_sweep_parameter_refuse_and_warn_alike(tmp_path):
    Image.fromarray(photo(60, 90)).save(tmp_path / "good.png")
    os.mkfifo(tmp_path / "cam.png")
    truncated_jpeg(tmp_path / "cut.jpg")
    with pytest.warns(UserWarning, match=r"cam.png \(a FIFO\)"):
        planned = refusal(lambda: wb.plan_budgets(f"folder:{tmp_path}", 4))
    for study in (pw, el):
        with pytest.warns(UserWarning, match=r"cam.png \(a FIFO\)"), pytest.raises(ParamError) as e:
            study.PARAMS.resolve({"image_folder": str(tmp_path)})
        assert str(e.value) == f"image_folder={str(tmp_path)!r}: {planned}"
    assert f"{tmp_path / 'cut.jpg'} could not be decoded" in planned


def test_the_sweep_refuses_a_truncated_jpeg_before_a_run_folder_exists(tmp_path):
    (tmp_path / "imgs").mkdir()
    Image.fromarray(photo(60, 90)).save(tmp_path / "imgs" / "good.png")
    truncated_jpeg(tmp_path / "imgs" / "cut.jpg")
    results = tmp_path / "results"
    p = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--results", str(results), "--direct",
                        "--studies", "padding_waste", "--set", f"image_folder={tmp_path / 'imgs'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if "cut.jpg" in line]
    assert len(lines) == 1 and "could not be decoded" in lines[0], p.stderr
    assert not results.exists() or not any(results.iterdir())
