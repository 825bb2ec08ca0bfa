"""Bad inputs at every entry point of the library: each must end in a clear error that names the
bad value and what was expected (for a cap: the cap and how to raise it), before anything large is
allocated. The huge inputs here are never materialized: videos and images are zero-stride numpy
views (np.broadcast_to) or PNG headers, so a test that allocated what it refuses would fail by
running out of memory rather than pass by accident."""
import dataclasses
import io
import math
import re
import struct
import sys
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

import workbench as wb
from workbench import limits, planner
from workbench.config import PRESETS
from workbench.images import composite_on_white
from workbench.limits import LimitError
from workbench.preprocess import Video, preprocess
from workbench.runner import EncoderGraphRunner, default_budgets
from workbench.samples import image_mix, mix_sizes, mix_tokens, random_images, sample_images, sample_video

CFG = PRESETS["tiny-qwen2-vl"]
PHOTO = sample_images(["chelsea"])["chelsea"]


def small_photo(side=56):
    return PHOTO.resize((side, side), Image.Resampling.BICUBIC)


def huge(*shape):
    """A uint8 array of any shape that takes no memory (every element is the same byte)."""
    return np.broadcast_to(np.zeros((1,) * len(shape), np.uint8), shape)


def png_header(width, height):
    """A PNG that PIL opens (size, mode) but cannot decode: the header of a real photo with its
    size replaced (checksum fixed), and no pixel data to match."""
    buf = io.BytesIO()
    small_photo(8).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4: ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17: ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr: ihdr + 17])))
    return bytes(data)


def names_cap(e, name):
    msg = str(e.value)
    cap = getattr(limits.current(), name)
    assert f"{cap:,}" in msg and f"limit {name!r}" in msg and f"WORKBENCH_LIMITS={name}=N" in msg \
        and f"limits.raised({name}=N)" in msg, msg


def tiny_encoder(preset="tiny-qwen2-vl", **kw):
    kw = dict(placement="tower", norm="eager", dtype=torch.float32, device="cpu") | kw
    return wb.build_encoder(preset, **kw)


# ---- 1. preprocess: every size capped from shapes, before any pixel is converted --------------
@pytest.fixture
def no_conversion(monkeypatch):
    """Fail the test if preprocess converts or resizes a single pixel."""
    def refuse(*a, **k):
        raise AssertionError("a pixel was converted before the caps were checked")
    monkeypatch.setattr(sys.modules["workbench.preprocess"], "rgb_resized", refuse)


@pytest.mark.parametrize("make, name, value", [
    (lambda: huge(10000, 1080, 1920, 3), "frames", "10,000"),                     # tens of GB as real frames
    (lambda: Video([huge(1080, 1920, 3)] * 1000), "frames", "1,000"),
    (lambda: huge(30000, 30000, 3), "input_pixels", "30000x30000"),
    (lambda: torch.zeros(1, 1, 3, dtype=torch.uint8).expand(30000, 30000, 3), "input_pixels", "30000x30000"),
    (lambda: Video([huge(28, 28, 3), huge(20000, 20000, 3)]), "input_pixels", "frame 1 of 20000x20000"),
    (lambda: huge(768, 1080, 1920, 3), "item_rows", "768 frame(s) of 1080x1920"),  # frames within their cap
    (lambda: [huge(2000, 2000, 3)] * 300, "batch_rows", "300 items"),              # each item within its cap
    (lambda: [huge(28, 28, 3)] * 5000, "items", "5,000"),
])
def test_preprocess_caps_are_checked_from_shapes(no_conversion, make, name, value):
    with pytest.raises(LimitError, match=re.escape(value)) as e:
        preprocess(make(), CFG)
    names_cap(e, name)


def test_a_huge_pil_image_is_refused_from_its_header(no_conversion, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # the tester's setting: PIL's own guard off
    img = Image.open(io.BytesIO(png_header(30000, 30000)))
    with pytest.raises(LimitError, match=r"image 1 of 30000x30000 \(HxW\) pixels: 900,000,000 exceeds") as e:
        preprocess([small_photo(), img], CFG)
    names_cap(e, "input_pixels")


def truncated_png(photo):
    buf = io.BytesIO()
    photo.save(buf, "PNG")
    return Image.open(io.BytesIO(buf.getvalue()[: len(buf.getvalue()) // 2]))  # opens (header), fails on decode


def test_a_truncated_image_names_its_item():
    with pytest.raises(ValueError, match=r"^item 3: the image could not be decoded \(OSError: .*truncated.*\); "
                                         r"the file is truncated or corrupt"):
        preprocess([small_photo(), small_photo(), np.asarray(small_photo()), truncated_png(PHOTO)], CFG)
    frames = [small_photo(), truncated_png(small_photo())]
    with pytest.raises(ValueError, match=r"^item 1: frame 1 of the video could not be decoded"):
        preprocess([small_photo(), Video(frames)], CFG)


def test_min_pixels_and_max_pixels_are_capped():
    with pytest.raises(LimitError, match=r"min_pixels=10000000000: 10,000,000,000 exceeds") as e:
        dataclasses.replace(CFG, min_pixels=10 ** 10, max_pixels=10 ** 10)
    names_cap(e, "frame_pixels")
    assert "max_pixels=10000000000" in str(e.value)


def test_the_caps_leave_real_inputs_alone():
    """A 768-frame clip at a size the processor keeps small, and a long pan: both fit."""
    batch = preprocess(huge(768, 56, 56, 3), CFG)
    assert batch.grid_thw.tolist() == [[384, 4, 4]]
    assert preprocess([PHOTO, Video(sample_video(8, size=(56, 84), step=4))], CFG).n_items == 2


def test_rgba_compositing_in_bands_equals_the_whole_frame_formula():
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, ((1 << 20) + 7, 2, 4), dtype=np.uint8)   # three bands of rows
    a = arr[..., 3:4] / 255.0
    want = np.round(a * arr[..., :3] + (1.0 - a) * 255.0).astype(np.uint8)
    assert np.array_equal(composite_on_white(arr), want)


def test_merge_unit_must_be_positive():
    batch = preprocess(small_photo(), CFG)
    with pytest.raises(ValueError, match=r"merge_unit=0 must be a positive integer"):
        batch.n_merged_tokens(0)


# ---- 2. budgets: one validator, capped, numpy integers accepted -------------------------------
def _runner(budgets, **kw):
    return EncoderGraphRunner(tiny_encoder(), budgets=budgets, **kw)


BUDGET_USERS = {
    "runner": lambda b: _runner(b, max_items=1),
    "expected_padding": lambda b: planner.expected_padding([4, 16], b),
    "graph_pool_bytes": lambda b: planner.graph_pool_bytes("tiny-qwen2-vl", b),
}


@pytest.mark.parametrize("user", list(BUDGET_USERS))
def test_a_budget_above_its_cap_is_refused_everywhere(user):
    with pytest.raises(LimitError, match=r"budgets\[1\]=1000000000 merged tokens: 1,000,000,000 exceeds") as e:
        BUDGET_USERS[user]([64, 10 ** 9])       # the runner would allocate 9.4 TB for it
    names_cap(e, "budget_tokens")


@pytest.mark.parametrize("user", list(BUDGET_USERS))
def test_too_many_budgets_are_refused_everywhere(user):
    with pytest.raises(LimitError, match=r"budgets: a list of 65 budgets: 65 exceeds") as e:
        BUDGET_USERS[user]([64 * k for k in range(1, 66)])
    names_cap(e, "budgets")


@pytest.mark.parametrize("user", list(BUDGET_USERS))
@pytest.mark.parametrize("bad", [[True], [16.0], [float("nan")], ["64"], [-64]])
def test_non_integer_budgets_are_refused_everywhere(user, bad):
    with pytest.raises(ValueError, match=rf"budgets must be positive integers \(merged tokens\); bad values: "
                                         rf"\[{bad[0]!r}\]"):
        BUDGET_USERS[user](bad)


def test_numpy_integer_budgets_are_accepted():
    runner = _runner([np.int64(16), np.int32(64)], max_items=np.int64(2))
    assert runner.budgets == [16, 64] and all(type(b) is int for b in runner.budgets)
    assert runner.max_items == 2 and type(runner.max_items) is int
    assert _runner(np.array([16, 64]), max_items=1).budgets == [16, 64]
    assert planner.expected_padding([4, 16], np.array([8, 16]))["padded_tokens"] == 2.0
    assert planner.graph_pool_bytes("tiny-qwen2-vl", [np.int64(16)]) > 0


@pytest.mark.parametrize("kw, match, cap", [
    (dict(max_items=5000), r"max_items=5000: 5,000 exceeds", "items"),
    (dict(max_items=0), r"max_items=0 must be a positive integer", None),
    (dict(max_items=True), r"max_items=True must be a positive integer", None),
    (dict(warmup=-1), r"warmup=-1 must be a non-negative integer", None),
    (dict(warmup=2.5), r"warmup=2\.5 must be a non-negative integer", None),
    (dict(warmup=10 ** 9), r"warmup=1000000000: 1,000,000,000 exceeds", "reps"),
    (dict(max_graphs=0), r"max_graphs=0 must be a positive integer", None),
    (dict(max_graphs=2.0), r"max_graphs=2\.0 must be a positive integer", None),
    (dict(max_graphs="8"), r"max_graphs='8' must be a positive integer", None),
    (dict(max_graphs=10 ** 6), r"max_graphs=1000000: 1,000,000 exceeds", "graphs"),
])
def test_runner_counts_are_checked(kw, match, cap):
    with pytest.raises(ValueError, match=match) as e:
        _runner([8192], **kw)
    if cap:
        assert e.type is LimitError
        names_cap(e, cap)


def test_max_graphs_must_cover_every_budget():
    with pytest.raises(ValueError, match=r"max_graphs=2 is below the runner's 3 budgets \[16, 32, 64\]: each "
                                         r"budget's general graph counts; valid: 3 to 4,096"):
        _runner([16, 32, 64], max_items=1, max_graphs=2)
    runner = _runner([16, 32, 64], max_items=1, max_graphs=np.int64(3))
    assert runner.max_graphs == 3 and runner.n_graphs() == 3


def test_runner_takes_an_encoder():
    with pytest.raises(TypeError, match=r"encoder must be a wb\.VisionEncoder .*got str"):
        EncoderGraphRunner("tiny-qwen2-vl", budgets=[64])


@pytest.mark.parametrize("call, match, cap", [
    (lambda: wb.plan_budgets([4, 16], 1000), r"max_graphs=1000 budgets: 1,000 exceeds", "budgets"),
    (lambda: wb.plan_budgets([4, 10 ** 6], 2), r"largest item of the mix, 1000000 merged tokens", "budget_tokens"),
    (lambda: wb.plan_budgets([4, 16], 2, max_pool_bytes=float("nan"), cfg=CFG), r"max_pool_bytes.*got nan", None),
    (lambda: planner.capture_pool_bytes(CFG, 10 ** 9), r"budget=1000000000: 1,000,000,000 exceeds",
     "budget_tokens"),
    (lambda: planner.capture_pool_bytes(CFG, 64, max_items="x"), r"max_items='x' must be a positive integer",
     None),
    (lambda: planner.graph_pool_bytes(CFG, [64], max_items=10 ** 6), r"max_items=1000000: 1,000,000 exceeds",
     "items"),
    (lambda: wb.geometric_budgets(10 ** 9), r"max_tokens=1000000000: 1,000,000,000 exceeds", "budget_tokens"),
    (lambda: wb.geometric_budgets(60000, ratio=1.0000001, smallest=1), r"ratio=1\.0000001.*budgets in the ladder",
     "budgets"),
    (lambda: default_budgets(10 ** 9), r"max_tokens=1000000000: 1,000,000,000 exceeds", "budget_tokens"),
    (lambda: default_budgets(100, smallest=0), r"smallest=0 must be a positive integer", None),  # used to hang
    (lambda: default_budgets(100.5), r"max_tokens=100\.5 must be a positive integer", None),
])
def test_planner_and_ladders_check_their_sizes(call, match, cap):
    with pytest.raises(ValueError, match=match) as e:
        call()
    if cap:
        assert e.type is LimitError
        names_cap(e, cap)


# ---- 3. the processor placement checks the values of normalized input -------------------------
@pytest.fixture(scope="module")
def normalized():
    return preprocess(small_photo(), CFG, normalize=True)


def _poisoned(batch, value):
    pixels = batch.pixels.clone()
    pixels[3, 500] = value
    return wb.PatchBatch(pixels, batch.grid_thw)


@pytest.mark.parametrize("placement", ["processor", "double"])
@pytest.mark.parametrize("value, match", [
    (float("nan"), r"found nan at row 3, column 500 \(channel 1, expected -1\.7521\.\.2\.0749\): not finite"),
    (float("inf"), r"found inf at row 3, column 500 .*: not finite"),
    (-3.0, r"found -3\.0 at row 3, column 500 .*: outside what the processor makes of levels 0\.\.255"),
])
def test_normalized_input_must_be_finite_and_in_range(normalized, placement, value, match):
    enc = tiny_encoder(placement=placement)
    with pytest.raises(ValueError, match=match):
        enc.encode(_poisoned(normalized, value))


@pytest.mark.parametrize("placement", ["processor", "double"])
def test_raw_pixels_as_floats_are_refused_as_the_missing_normalization(normalized, placement):
    raw = preprocess(small_photo(), CFG)
    enc = tiny_encoder(placement=placement)
    with pytest.raises(ValueError, match=r"placement '\w+' takes CPU-normalized pixels.*found \d+\.0 at row 0, "
                                         r"column \d+ .*raw 0\.\.255 pixel values\? the processor's normalization "
                                         r"is missing"):
        enc.encode(wb.PatchBatch(raw.pixels.float(), raw.grid_thw))
    with pytest.raises(ValueError, match=r"raw 0\.\.255"):
        EncoderGraphRunner(enc, budgets=[64], buffer_dtype=torch.float32).encode(
            wb.PatchBatch(raw.pixels.float(), raw.grid_thw))


def test_valid_normalized_input_passes_and_the_check_can_be_switched_off(normalized):
    enc = tiny_encoder(placement="processor")
    out = enc.encode(normalized)
    assert torch.isfinite(out).all()
    # the processor's float32 cast to bf16 rounds the extremes beyond the range by a little
    enc.encode(wb.PatchBatch(normalized.pixels.bfloat16(), normalized.grid_thw))
    engine_like = tiny_encoder(placement="processor", check_inputs=False)   # the studies' engines
    assert torch.isnan(engine_like.encode(_poisoned(normalized, float("nan")))).all()


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_check_inputs_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=rf"check_inputs must be True or False, got {bad!r}"):
        tiny_encoder(check_inputs=bad)


# ---- 4. config, seeds, samples ------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["tiny-qwen2-vl", "tiny-qwen2.5-vl"])
@pytest.mark.parametrize("change, match", [
    (dict(max_pixels=1), r"max_pixels=1 is below one merge block \(28x28 = 784 pixels"),
    (dict(max_pixels=700, min_pixels=100), r"max_pixels=700 is below one merge block"),
    (dict(min_pixels=5000, max_pixels=4000), r"min_pixels=5000 exceeds max_pixels=4000"),
    (dict(window_size=0), r"window_size=0 must be a positive integer"),
    (dict(window_size="112"), r"window_size='112' must be a positive integer"),
    (dict(depth=2.0), r"depth=2\.0 must be a positive integer"),
    (dict(fullatt_blocks=(1, 1)), r"fullatt_blocks=\(1, 1\) repeats block\(s\) \[1\]"),
    (dict(fullatt_blocks=[0.5]), r"fullatt_blocks=\(0\.5,\) must be a tuple \(or list\) of block indices"),
    (dict(fullatt_blocks="13"), r"fullatt_blocks='13' must be a tuple"),
    (dict(fullatt_blocks=(True,)), r"fullatt_blocks=\(True,\) must be a tuple"),
])
def test_config_refuses_bad_values(preset, change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PRESETS[preset], **change)


def test_fullatt_blocks_range_is_checked_for_qwen25():
    with pytest.raises(ValueError, match=r"fullatt_blocks \[-1, 9\] are outside 0\.\.3 \(depth=4\)"):
        dataclasses.replace(PRESETS["tiny-qwen2.5-vl"], fullatt_blocks=(-1, 1, 9))


def test_config_lists_and_numpy_integers_are_taken():
    cfg = dataclasses.replace(PRESETS["tiny-qwen2.5-vl"], fullatt_blocks=[1, 3], depth=np.int64(4),
                              image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    assert cfg.fullatt_blocks == (1, 3) and cfg.image_mean == (0.5,) * 3 and type(cfg.depth) is int
    assert cfg == dataclasses.replace(cfg, fullatt_blocks=(1, 3)) and hash(cfg)
    assert list(cfg.to_hf().fullatt_block_indexes) == [1, 3]
    assert planner.graph_pool_bytes(cfg, [16]) > 0     # cached by config: must hash


@pytest.mark.parametrize("change, name, match", [
    (dict(depth=1000), "depth", r"depth=1000: 1,000 exceeds"),
    (dict(width=1 << 16, heads=16, mlp_hidden=1 << 16), "tower_params", r"tower parameters .*width=65536"),
    (dict(patch_size=100), "patch_dim", r"patch_dim=60000 \(in_channels\*temporal_patch_size\*patch_size\^2"),
])
def test_config_sizes_that_become_allocations_are_capped(change, name, match):
    with pytest.raises(LimitError, match=match) as e:
        dataclasses.replace(CFG, **change)
    names_cap(e, name)


@pytest.mark.parametrize("preset", ["tiny-qwen2-vl", "tiny-qwen2.5-vl"])
def test_n_params_counts_the_towers_parameters(preset):
    cfg = PRESETS[preset]
    sd = wb.build_encoder(cfg, norm="eager", device="cpu", seed=None).visual.state_dict()
    assert cfg.n_params == sum(v.numel() for k, v in sd.items() if not k.startswith("input_norm."))


@pytest.mark.parametrize("seed, match", [
    ("x", r"seed='x' must be a non-negative integer"),
    (-1, r"seed=-1 must be a non-negative integer"),
    (1.5, r"seed=1\.5 must be a non-negative integer"),
    (True, r"seed=True must be a non-negative integer"),
    (1 << 40, r"seed=1099511627776: 1,099,511,627,776 exceeds the cap of 4,294,967,295"),
])
def test_seeds_are_checked_at_every_entry_point(seed, match):
    calls = [lambda: wb.build_encoder("tiny-qwen2-vl", norm="eager", device="cpu", seed=seed),
             lambda: image_mix("photos", 2, seed=seed), lambda: mix_sizes("charts", 2, seed=seed),
             lambda: mix_tokens("charts", 2, seed=seed), lambda: random_images(1, seed=seed)]
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call()
    assert wb.build_encoder("tiny-qwen2-vl", norm="eager", device="cpu", seed=np.int64(3)) is not None


@pytest.mark.parametrize("kw, match, cap", [
    (dict(step=float("nan")), r"step=nan must be a non-negative integer", None),
    (dict(step=-1), r"step=-1 must be a non-negative integer", None),
    (dict(step=2.5), r"step=2\.5 must be a non-negative integer", None),
    (dict(n_frames=0), r"n_frames=0 must be a positive integer", None),
    (dict(n_frames=4.0), r"n_frames=4\.0 must be a positive integer", None),
    (dict(size=(0, 10)), r"size\[0\]=0 must be a positive integer", None),
    (dict(size=(10, float("inf"))), r"size\[1\]=inf must be a positive integer", None),
    (dict(size=100), r"size=100 must be two positive sides", None),
    (dict(n_frames=10000), r"n_frames=10000: 10,000 exceeds", "frames"),
    (dict(size=(20000, 20000)), r"frames of 20000x20000 \(HxW\) pixels", "input_pixels"),
    (dict(n_frames=768, size=(2000, 2000)), r"768 frames of 2000x2000 pixels", "total_pixels"),
    (dict(n_frames=2, step=10 ** 7), r"step=10000000.*pixels of the upscaled photo", "input_pixels"),
])
def test_sample_video_checks_its_arguments(kw, match, cap):
    with pytest.raises(ValueError, match=match) as e:
        sample_video(**kw)
    if cap:
        assert e.type is LimitError
        names_cap(e, cap)


@pytest.mark.parametrize("call, match, cap", [
    (lambda: image_mix("photos", 10 ** 5), r"n=100000: 100,000 exceeds", "items"),
    (lambda: image_mix("photos", -1), r"n=-1 must be a non-negative integer", None),
    (lambda: image_mix("phone_photos", 1000), r"image_mix\('phone_photos', n=1000, resized=False\): pixels of all "
                                              r"1000 items", "total_pixels"),
    (lambda: mix_sizes("charts", 10 ** 9), r"n=1000000000: 1,000,000,000 exceeds", "draws"),
    (lambda: random_images(10 ** 5), r"n=100000: 100,000 exceeds", "items"),
    (lambda: random_images(1, max_side=10 ** 6), r"up to 1000000x1000000 pixels", "input_pixels"),
    (lambda: random_images(2, min_side=0), r"min_side=0 must be a positive integer", None),
    (lambda: random_images(2, min_side=10, max_side=5), r"min_side <= max_side, got min_side=10, max_side=5", None),
])
def test_mix_and_noise_draws_are_capped(call, match, cap):
    with pytest.raises(ValueError, match=match) as e:
        call()
    if cap:
        assert e.type is LimitError
        names_cap(e, cap)


# ---- raising a cap on purpose ------------------------------------------------------------------
def test_raised_and_the_environment_let_a_larger_value_through(monkeypatch):
    clip = huge(1000, 28, 28, 3)
    with pytest.raises(LimitError, match=r"1,000 exceeds the cap of 768"):
        preprocess(clip, CFG)
    with limits.raised(frames=1000):
        assert preprocess(clip, CFG).grid_thw.tolist() == [[500, 4, 4]]
    with pytest.raises(LimitError):  # only inside the block
        preprocess(clip, CFG)
    monkeypatch.setenv(limits.LIMITS_ENV, "frames=1000,budget_tokens=131072")
    assert preprocess(clip, CFG).n_items == 1
    assert planner.expected_padding([100], [1 << 17])["padded_tokens"] == (1 << 17) - 100
    assert wb.VisionConfig("big", family="qwen2-vl", max_pixels=1 << 24).max_pixels == 1 << 24
    monkeypatch.setenv(limits.LIMITS_ENV, "frames=1000,frame_pixels=33554432")
    assert dataclasses.replace(CFG, max_pixels=1 << 25).max_pixels == 1 << 25


def test_a_bad_limits_variable_is_named(monkeypatch):
    monkeypatch.setenv(limits.LIMITS_ENV, "frames=lots")
    with pytest.raises(ValueError, match=r"WORKBENCH_LIMITS='frames=lots': frames must be a positive integer"):
        preprocess(small_photo(), CFG)
    assert math.isfinite(limits.Limits().frames)
