"""wb.preprocess's backends: ``torchvision`` against transformers' torchvision processors (row
hashes recorded on a host that has torchvision: tests/data/torchvision_rows.json, made by
tools/verify_preprocess_backends.py), one row layout for all three, threads, bad input."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import workbench as wb
from workbench.patches import patchify_array
from workbench.photos import random_images, sample_images
from workbench.preprocess import Video, preprocess
from workbench.limits import cpu_count

from backend_inputs import backend_inputs

RECORD = json.loads((Path(__file__).parent / "data" / "torchvision_rows.json").read_text())
FAMILY_PRESETS = {"qwen2-vl": "qwen2-vl-7b", "qwen2.5-vl": "qwen2.5-vl-7b", "qwen3-vl": "qwen3-vl-8b",
                  "qwen3.5": "tiny-qwen3.5", "glm4v": "glm-4.1v-9b", "pixtral": "mistral-small-3.1-24b",
                  "gemma3": "gemma-3-27b"}
# inputs whose transformers rows are not the ones a tower takes, so not compared (measured with
# transformers 5.17 / torchvision 0.26 on the H200 host): a grey [H, W, 1] array gives 1-channel
# rows and an RGBA array 4-channel rows (no RGB conversion of arrays there); a PIL RGBA image
# loses its alpha instead of being composited on white. wb.preprocess makes RGB of all three as
# the PIL processors do (transformers 5.24's torchvision backend composites the same way).
NOT_COMPARABLE = {"grey_array", "rgba_array", "rgba_pil"}
# torch's native uint8 kernel itself changed between the H200 host's torch 2.11 (the record) and
# torch 2.13 for this input: 17% of its values, by up to 3 levels (same AVX512 capability). Both
# transformers and wb.preprocess call that kernel, so they agree under any one torch; the record
# pins one torch only.
VERSION_SENSITIVE = {"wide_40x1900"}
INPUTS = backend_inputs()


def _sha(rows: torch.Tensor) -> str:
    return hashlib.sha256(rows.contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("family", sorted(FAMILY_PRESETS))
def test_torchvision_backend_rows_equal_transformers_torchvision_processor(family):
    cfg = wb.VisionConfig.preset(FAMILY_PRESETS[family])
    if not any(k.startswith(f"{family}/") for k in RECORD["rows"]):
        pytest.skip(f"the record predates {family}: run tools/verify_preprocess_backends.py on a host with "
                    f"torchvision and commit its torchvision_rows.json")
    differ = []
    for name, x in INPUTS.items():
        if name in NOT_COMPARABLE or (name in VERSION_SENSITIVE
                                      and not torch.__version__.startswith(RECORD["torch"].split("+")[0])):
            continue
        rec = RECORD["rows"][f"{family}/{name}"]
        batch = preprocess(x, cfg, backend="torchvision")
        assert batch.grid_thw.tolist() == rec["grid"], name
        if _sha(batch.pixels) != rec["sha256"]:
            differ.append(name)
    assert not differ, f"{family}: rows differ from transformers' torchvision processor for {differ}"


def test_every_backend_gives_the_same_grids_and_layout():
    """An image already at its target size is not resized: every backend gives the same rows."""
    cfg = wb.VisionConfig.preset("tiny-qwen2.5-vl")
    rng = np.random.default_rng(5)
    same = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((56, 84), (112, 56))]
    rows = [preprocess(same, cfg, backend=b) for b in wb.PREPROCESS_BACKENDS]
    for r in rows[1:]:
        assert torch.equal(r.grid_thw, rows[0].grid_thw) and torch.equal(r.pixels, rows[0].pixels)
    resized = [preprocess(list(sample_images().values()), cfg, backend=b) for b in wb.PREPROCESS_BACKENDS]
    for r in resized[1:]:
        assert torch.equal(r.grid_thw, resized[0].grid_thw) and r.pixels.shape == resized[0].pixels.shape


def test_torchvision_backend_is_close_to_pil_on_photos():
    """torch's uint8 kernel and PIL's are both fixed-point antialiased bicubic: mostly within a
    level or two (0.1-0.3% of values at the real presets' sizes), but up to 7 levels on 7% of
    the values where one axis shrinks and the other grows a little (rocket, 427x640 -> 420x644)."""
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    fracs = []
    for name, im in sample_images().items():
        a = preprocess(im, cfg).pixels.int()
        b = preprocess(im, cfg, backend="torchvision").pixels.int()
        d = (a - b).abs()
        assert 0 < int(d.max()) <= 8 and float((d > 0).float().mean()) < 0.1, name
        fracs.append(float((d > 0).float().mean()))
    assert sorted(fracs)[len(fracs) // 2] < 0.01


def test_cuda_backend_is_torchvisions_float_path_in_the_qwen_layout():
    """Emulated on the CPU: resize in float32, clamp, round (torchvision off the CPU), checked
    against an independent float64-free reference built with numpy's patchify."""
    cfg = wb.VisionConfig.preset("tiny-qwen3-vl")
    for x in random_images(3, seed=21, min_side=20, max_side=300) + [np.asarray(sample_images(["coffee"])["coffee"])]:
        batch = preprocess(x, cfg, backend="cuda")
        g = batch.grid_thw[0].tolist()
        size = [g[1] * cfg.patch_size, g[2] * cfg.patch_size]
        t = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)[None].float()
        if list(t.shape[-2:]) != size:
            t = F.interpolate(t, size=size, mode="bicubic", align_corners=False, antialias=True).clamp(0, 255).round()
        frame = t.to(torch.uint8)[0].permute(1, 2, 0).numpy()[None]
        want = np.empty(tuple(batch.pixels.shape), np.uint8)
        patchify_array(frame, cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size, want)
        assert torch.equal(batch.pixels, torch.from_numpy(want))


def test_normalized_torchvision_rows_are_its_fused_normalization_of_its_uint8_rows():
    cfg = wb.VisionConfig.preset("tiny-glm4v")
    im = sample_images(["rocket"])["rocket"]
    raw = preprocess(im, cfg, backend="torchvision").pixels
    norm = preprocess(im, cfg, backend="torchvision", normalize=True).pixels
    ref = wb.patches.normalize_reference(raw, cfg)
    assert norm.dtype == torch.float32
    assert float((norm.double() - ref).abs().max()) < 1e-6
    ref_pil = preprocess(im, cfg, normalize=True).pixels     # the PIL backend: its own uint8 levels
    assert 0 < float((norm - ref_pil).abs().max()) < 0.12    # rocket: up to 7 levels apart


@pytest.mark.parametrize("backend", ["pil", "torchvision"])
def test_threads_do_not_change_the_rows(backend):
    if cpu_count() < 2:
        pytest.skip("needs two cores")
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    items = list(sample_images().values()) + random_images(3, seed=2)
    one = preprocess(items, cfg, backend=backend, threads=1)
    two = preprocess(items, cfg, backend=backend, threads=2)
    assert torch.equal(one.pixels, two.pixels) and torch.equal(one.grid_thw, two.grid_thw)
    assert torch.get_num_threads() >= 1


@pytest.mark.parametrize("backend", wb.PREPROCESS_BACKENDS)
def test_still_video_equals_its_image_on_every_backend(backend):
    cfg = wb.VisionConfig.preset("tiny-qwen2.5-vl")
    frame = np.asarray(sample_images(["chelsea"])["chelsea"])
    image = preprocess(frame, cfg, backend=backend)
    video = preprocess(Video(np.stack([frame, frame])), cfg, backend=backend)
    assert torch.equal(image.pixels, video.pixels) and torch.equal(image.grid_thw, video.grid_thw)


def test_rgba_and_grey_arrays_are_made_rgb_on_the_torchvision_backend():
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    x = INPUTS["rgba_array"]
    a = preprocess(x, cfg, backend="torchvision").pixels.int()
    b = preprocess(x, cfg).pixels.int()           # the PIL backend composites in float64 and rounds
    assert a.shape == b.shape and int((a - b).abs().max()) <= 3
    g = INPUTS["grey_array"]
    rows = preprocess(g, cfg, backend="torchvision").pixels.view(-1, 3, 2 * 14 * 14)
    assert torch.equal(rows[:, 0], rows[:, 1]) and torch.equal(rows[:, 1], rows[:, 2])


@pytest.mark.parametrize("kw, match", [
    (dict(backend="opencv"), r"unknown preprocessing backend 'opencv'; valid: pil, torchvision, cuda"),
    (dict(backend=None), r"unknown preprocessing backend None"),
    (dict(threads=0), r"threads=0 must be a positive integer"),
    (dict(threads=1.5), r"threads=1.5 must be a positive integer"),
    (dict(threads=True), r"threads=True must be a positive integer"),
    (dict(threads=10_000), r"threads=10000 exceeds the \d+ cores this process may run on; valid: 1\.\.\d+"),
    (dict(device="cpu"), r"device='cpu' is for backend 'cuda'"),
    (dict(backend="cuda", device="tpu"), r"unsupported device 'tpu'|invalid device 'tpu'"),
])
def test_bad_backend_arguments_fail_before_any_work(kw, match):
    with pytest.raises(ValueError, match=match):
        preprocess(np.zeros((28, 28, 3), np.uint8), "tiny-qwen2-vl", **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_device_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device"):
        preprocess(np.zeros((28, 28, 3), np.uint8), "tiny-qwen2-vl", backend="cuda", device="cuda")
