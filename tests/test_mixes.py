"""Image-size mixes: data/image_mixes.toml and the workbench.samples mix API."""
from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

import workbench as wb
from workbench.preprocess import Video, preprocess, smart_resize
from workbench.samples import MIX_NAMES, SAMPLE_NAMES, get_mix, image_mix, mix_distribution, mix_sizes, mix_tokens

CFG = wb.VisionConfig.preset("tiny-qwen2-vl")
FILE_MIXES = ("phone_photos", "screenshots", "documents", "charts", "video_clips", "thumbnails")
# mixes whose full-size items are small enough to preprocess quickly on a CPU
SMALL = ("charts", "thumbnails", "photos")


def test_every_mix_loads_with_sources_and_sizes():
    assert set(FILE_MIXES) <= set(MIX_NAMES) and "photos" in MIX_NAMES
    assert len(set(MIX_NAMES)) == len(MIX_NAMES)
    for name in MIX_NAMES:
        mix = get_mix(name)
        assert mix.description.strip() and mix.weights.strip() and mix.entries
        for e in mix.entries:
            assert e.height > 0 and e.width > 0 and e.frames > 0 and e.weight > 0
            assert e.source.strip()
    assert all(e.kind == "video" for e in get_mix("video_clips").entries)
    assert all(e.kind == "image" for n in MIX_NAMES if n != "video_clips" for e in get_mix(n).entries)


def test_photos_mix_is_the_shipped_photos_at_their_own_sizes():
    photos = wb.sample_images()
    entries = get_mix("photos").entries
    assert len(entries) == len(SAMPLE_NAMES)
    for name, e in zip(SAMPLE_NAMES, entries):
        if name in photos:
            assert (photos[name].height, photos[name].width) == (e.height, e.width)
    items = image_mix("photos")
    assert [np.asarray(x).tobytes() for x in items] == [np.asarray(p).tobytes() for p in photos.values()]


def test_distribution_sums_to_one_and_stays_in_the_claimed_range():
    for name in MIX_NAMES:
        dist = mix_distribution(name)
        tokens = [t for t, _ in dist]
        assert tokens == sorted(set(tokens)) and all(isinstance(t, int) for t in tokens)
        assert math.isclose(sum(p for _, p in dist), 1.0, rel_tol=1e-12)
        assert all(p > 0 for _, p in dist)
        lo, hi = get_mix(name).tokens
        assert lo <= tokens[0] and tokens[-1] <= hi, name
        assert (tokens[0], tokens[-1]) == (lo, hi), f"{name}: claimed range is not tight"
        # every preset shares the geometry, so cfg changes nothing
        assert mix_distribution(name, "qwen2.5-vl-72b") == dist == mix_distribution(name, CFG)


def test_distribution_uses_the_preprocessors_resize():
    for name in MIX_NAMES:
        dist = dict(mix_distribution(name))
        mix = get_mix(name)
        total = sum(e.weight for e in mix.entries)
        want: dict[int, float] = {}
        for e in mix.entries:
            h, w = smart_resize(e.height, e.width, 28, CFG.min_pixels, CFG.max_pixels)
            t = (e.frames // 2 if e.kind == "video" else 1) * (h // 28) * (w // 28)
            want[t] = want.get(t, 0) + e.weight / total
        assert dist.keys() == want.keys() and all(math.isclose(dist[k], want[k]) for k in want)


def test_draws_cover_every_entry_and_follow_the_weights(seed):
    n = 20000
    for name in MIX_NAMES:
        dist = mix_distribution(name)
        toks = mix_tokens(name, n, seed)
        items = mix_sizes(name, n, seed)
        assert len(toks) == len(items) == n
        assert {it.entry for it in items} == set(range(len(get_mix(name).entries)))
        counts = {t: 0 for t, _ in dist}
        for t in toks:
            counts[t] += 1
        assert all(counts[t] > 0 for t, _ in dist)
        for t, p in dist:
            # 5 standard deviations of a binomial proportion
            assert abs(counts[t] / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, (name, t)


def test_draws_are_deterministic_given_the_seed():
    for name in MIX_NAMES:
        assert mix_sizes(name, 50, 3) == mix_sizes(name, 50, 3)
        assert mix_tokens(name, 50, 3) == mix_tokens(name, 50, 3)
    assert mix_sizes("charts", 50, 3) != mix_sizes("charts", 50, 4)
    a, b = image_mix("thumbnails", 6, seed=5), image_mix("thumbnails", 6, seed=5)
    assert [np.asarray(x).tobytes() for x in a] == [np.asarray(x).tobytes() for x in b]
    assert mix_sizes("charts", 0) == [] and mix_tokens("charts", 0) == []


def _grid_tokens(batch) -> list[int]:
    return [int(t * h * w) // CFG.merge_unit for t, h, w in batch.grid_thw.tolist()]


@pytest.mark.parametrize("name", SMALL)
def test_full_size_items_give_the_drawn_tokens(name):
    items = image_mix(name, 8, seed=2)
    assert all(isinstance(x, Image.Image) and x.mode == "RGB" for x in items)
    sizes = mix_sizes(name, 8, seed=2)
    assert [(x.height, x.width) for x in items] == [(s.height, s.width) for s in sizes]
    assert _grid_tokens(preprocess(items, CFG)) == mix_tokens(name, 8, seed=2)


@pytest.mark.parametrize("preset", ["qwen2.5-vl-7b", "qwen3-vl-8b", "glm-4.1v-9b"])
@pytest.mark.parametrize("name", MIX_NAMES)
def test_resized_items_give_the_same_grids(name, preset):
    """Items drawn at the resized size of a tower's own processor (patch 14 or 16, its pixel
    bounds) give that processor's grids: the tokens the mix's distribution says, for that tower."""
    cfg = wb.VisionConfig.preset(preset)
    n = 6
    items = image_mix(name, n, seed=1, resized=True, cfg=cfg)
    batch = preprocess(items, cfg)
    assert _grid_tokens(batch) == mix_tokens(name, n, seed=1, cfg=cfg)
    for x, s in zip(items, mix_sizes(name, n, seed=1)):
        unit = cfg.patch_size * cfg.merge_size
        h, w = smart_resize(s.height, s.width, unit, cfg.min_pixels, cfg.max_pixels)
        if s.kind == "video":
            assert isinstance(x, Video) and x.frames.shape == (s.frames, h, w, 3) and x.frames.dtype == np.uint8
        else:
            assert (x.height, x.width) == (h, w)


@pytest.mark.parametrize("preset", ["kimi-k2.5-1t", "mistral-small-3.1-24b", "tiny-gemma3", "gemma-4-e2b"])
@pytest.mark.parametrize("name", MIX_NAMES)
def test_towers_that_size_their_own_way_get_the_rows_the_mix_counts(name, preset):
    """Kimi-K2.5 (navit_resize, then zero padding to whole merge blocks; video cut into chunks),
    Pixtral (a longest-edge box), Gemma-3 (every image and frame one fixed size) and Gemma-4 (aspect kept within
    280 soft tokens an image, 70 a video frame): the mix's token
    counts, which the planner budgets from, are the rows / merge_unit wb.preprocess makes."""
    cfg = wb.VisionConfig.preset(preset)
    # Gemma-4's rule has no fixed point (an image at its resized size may resize again): full size only
    if cfg.family != "gemma4":
        items = image_mix(name, 6, seed=1, resized=True, cfg=cfg)
        assert preprocess(items, cfg).n_rows // cfg.merge_unit == sum(mix_tokens(name, 6, seed=1, cfg=cfg))
    if name == "documents" or cfg.family == "gemma4":    # at full size, where Kimi's resize differs from smart_resize
        full = image_mix(name, 2, seed=1)
        assert [b.n_rows // cfg.merge_unit for b in preprocess(full, cfg).split()] == \
            mix_tokens(name, 2, seed=1, cfg=cfg)


@pytest.mark.slow
@pytest.mark.parametrize("name", ("phone_photos", "screenshots", "documents", "video_clips"))
def test_full_size_big_items_give_the_drawn_tokens(name):
    n = 3
    items = image_mix(name, n, seed=4)
    full = preprocess(items, CFG)
    assert _grid_tokens(full) == mix_tokens(name, n, seed=4)
    assert full.grid_thw.tolist() == preprocess(image_mix(name, n, seed=4, resized=True), CFG).grid_thw.tolist()


def test_bad_names_and_arguments():
    valid = ", ".join(MIX_NAMES)
    for call in (lambda: image_mix("mixed"), lambda: mix_distribution("nope"), lambda: mix_sizes("nope", 3),
                 lambda: mix_tokens("nope", 3), lambda: get_mix("nope")):
        with pytest.raises(ValueError, match="unknown image mix .*; valid: " + valid):
            call()
    with pytest.raises(ValueError, match="needs n"):
        image_mix("charts")
    with pytest.raises(ValueError, match="n=-1 must be a non-negative integer"):
        mix_sizes("charts", -1)
    with pytest.raises(ValueError, match="n=2.5"):
        mix_tokens("charts", 2.5)
    with pytest.raises(TypeError, match="resized must be a bool"):
        image_mix("charts", 2, resized="yes")
    with pytest.raises(ValueError, match="unknown preset"):
        mix_distribution("charts", "qwen-9")
