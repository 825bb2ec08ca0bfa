"""GLM-OCR (transformers' `GlmOcrVisionModel`, model_type glm_ocr): the tower against transformers'
with the same weights on real photos and video; graph safety (padded metadata, the emulated graph
runner with a NaN-poisoned pool on every correct placement; odd grids, captured metadata buffers, the
FLOP model and the fused kernels in tests/test_families.py, outer, none and double in
tests/test_runner.py, the tower's own norm against
transformers and bf16 against float64 in tests/test_towers.py); model folders saved by transformers
(tests/test_checkpoints.py's MODELS saves and loads one too) and bad ones; preprocessing against
the processor its checkpoint names (Glm46VImageProcessor)."""
import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.checkpoints import CheckpointError, load_vision_weights, read_vision_config, resolve_config
from workbench.reference import hf_embeddings, hf_vision_model, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower
from workbench.towers.common import budget_padding

from test_checkpoints import save_model
from test_families import matched_towers, max_err

TINY = "tiny-glm-ocr"
FP32_TOL = 1e-5




# ---- faithful: transformers' GlmOcrVisionModel with the same weights -------------------------------

@pytest.mark.parametrize("max_pixels", [256 * 256, pytest.param(None, marks=pytest.mark.slow)])
def test_tower_matches_transformers_on_photos_a_mixed_batch_and_video(max_pixels, photos, seed):
    """Photos resized within 256 x 256 pixels (the tiny preset's own bound, ~1 MP, in the slow run)."""
    cfg = wb.VisionConfig.preset(TINY)
    cfg = cfg if max_pixels is None else dataclasses.replace(cfg, max_pixels=max_pixels)
    hf, ours = matched_towers(cfg, seed)
    items = [photos["chelsea"], photos["rocket"], wb.Video(wb.sample_video(4))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert batch.grid_thw[:, 0].tolist() == [1, 1, 2]
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)      # the video as its frames, as GlmOcrModel does
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
        parts = [ours(item.pixels, item.grid_thw) for item in batch.split()]
        # without a position table transformers also takes a video's (t, h, w) grid whole: the same
        video = batch.split()[-1]
        whole = hf(video.pixels, video.grid_thw).pooler_output
    assert out.shape == ref.shape == (batch.n_rows // 4, cfg.out_hidden)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL
    assert rel_err(whole, parts[-1]) < FP32_TOL
    # item by item equals the batch (no cross-item attention leaks)
    for one, sl in zip(parts, batch.item_slices):
        assert rel_err(one, out[sl.start // 4: sl.stop // 4]) < 1e-6


@pytest.mark.slow
def test_the_published_width_at_reduced_depth_matches_transformers(photos, seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset("glm-ocr-0.9b").reduced(2), min_pixels=4096,
                              max_pixels=224 * 224)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["coffee"], photos["rocket"]], cfg, normalize=True)
    with torch.no_grad():
        out, ref = ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


def test_parameter_count_is_that_of_the_tower():
    """(The FLOP model against torch's count: tests/test_families.py.)"""
    cfg = wb.VisionConfig.preset(TINY)
    assert cfg.n_params == sum(p.numel() for p in hf_vision_model(cfg).parameters())
    real = wb.VisionConfig.preset("glm-ocr-0.9b")
    with torch.device("meta"):
        assert real.n_params == sum(p.numel() for p in real.spec.hf_model_class()(real.to_hf()).parameters())


def test_the_published_config_maps_to_transformers_defaults():
    """The preset is zai-org/GLM-OCR's vision_config, which transformers' GlmOcrVisionConfig defaults
    also hold; the merger is out_hidden * in_channels wide."""
    from transformers.models.glm_ocr.configuration_glm_ocr import GlmOcrVisionConfig
    cfg = wb.VisionConfig.preset("glm-ocr-0.9b")
    default, ours = GlmOcrVisionConfig().to_dict(), cfg.to_hf().to_dict()
    for key in ("depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size", "patch_size",
                "spatial_merge_size", "temporal_patch_size", "rms_norm_eps", "attention_bias", "hidden_act"):
        assert ours[key] == default[key], key
    assert cfg.merger_hidden == 4608 and cfg.num_position_embeddings == 0
    assert cfg.spec.from_hf(ours) == {k: getattr(cfg, k) for k in cfg.spec.from_hf(ours)}
    with pytest.raises(ValueError, match=r"merger_hidden=96 must equal out_hidden \* in_channels = 144"):
        dataclasses.replace(wb.VisionConfig.preset(TINY), merger_hidden=96)
    with pytest.raises(ValueError, match=r"num_position_embeddings=64: the glm-ocr tower has no use for it"):
        dataclasses.replace(wb.VisionConfig.preset(TINY), num_position_embeddings=64)


# ---- graph-safe: host metadata, padding, the runner ---------------------------------------------

@pytest.mark.parametrize("backend", ["loop", pytest.param("masked", marks=pytest.mark.slow)])
def test_padded_metadata_gives_the_same_valid_rows(backend, seed):
    """Rows padded to a budget with NaN and sequence slots padded with repeated tails: the valid
    rows are eager's; the rotary tables and cu_seqlens are the only grid-dependent tensors."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, attn_backend=backend).init_random(seed).eval()
    grid = torch.tensor([[1, 8, 12], [2, 16, 8], [1, 4, 4]])
    n, pad = int(grid.prod(1).sum()), 64
    x = torch.randn(n, cfg.patch_dim)
    with torch.no_grad():
        ref = tower(x, grid)
        meta = tower.prepare(grid, **budget_padding(cfg, (n + pad) // 4, 8))
        assert meta.cu_seqlens.shape == (9,) and meta.cu_seqlens[-1] == n and meta.pos_index is None
        out = tower.forward_prepared(torch.cat([x, torch.full((pad, cfg.patch_dim), float("nan"))]), meta)
    assert out.shape == ((n + pad) // 4, cfg.out_hidden)
    assert torch.isfinite(out[: n // 4]).all() and rel_err(out[: n // 4], ref) < 1e-6


@pytest.fixture(scope="module")
def items():
    """Merged tokens at max_pixels 200 x 200: several items that pack into the budgets below with
    padding, a 4-frame video, and one photo larger than every budget (it runs eager)."""
    p = wb.sample_images()
    return [p["chelsea"].resize((120, 84)), p["coffee"].resize((150, 100)), wb.Video(wb.sample_video(4, size=(56, 84))),
            p["astronaut"].resize((64, 64)), p["rocket"]]


BUDGETS = [8, 16, 24, 32]


@pytest.mark.parametrize("placement, buffer_dtype", [
    ("tower", torch.uint8),         # the fast run; fold's cells there: tests/test_placements_fold_device.py
    *(pytest.param(p, d, marks=pytest.mark.slow) for p, d in (("fold", torch.uint8), ("device", torch.float32),
                                                              ("processor", torch.float32), ("runner", torch.float32),
                                                              ("tower", torch.bfloat16)))])
def test_runner_replays_equal_eager_with_padding_several_items_and_a_poisoned_pool(placement, buffer_dtype, items,
                                                                                  seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset(TINY), max_pixels=200 * 200)
    st = replays_equal_eager_from_a_poisoned_pool(cfg, placement, buffer_dtype, items, seed)
    assert st.miss.sum() == 1 and (~st.miss).sum() >= 2 and st.padded_rows.sum() > 0


def replays_equal_eager_from_a_poisoned_pool(cfg, placement, buffer_dtype, items, seed):
    """The emulated graph runner (budgets BUDGETS, 4 items a replay) on ``items`` against eager, then
    again after its pool is poisoned with garbage padding: equal; returns the runner's stats."""
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    batch = wb.preprocess(items, cfg, normalize=enc.input_kind == "normalized")
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=buffer_dtype, max_items=4)
    assert runner.backend == "emulated"
    eager = enc.encode(batch)
    clean = enc.encode(batch, path="cudagraph", runner=runner)
    # not asserted bit for bit: on the CPU a matmul's rounding may follow its row count (most seeds
    # gave equal bits, one a few ulps, 2e-11 relative); replays among themselves are equal below
    assert rel_err(clean, eager) < 1e-8
    stats = runner.stats_frame()
    runner.poison_pool()
    # padding rows of garbage: NaN where the buffer holds floats, the brightest value in a uint8 one
    poisoned = runner.encode(batch, pad_value=float("nan") if buffer_dtype.is_floating_point else 255)
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)
    return stats


# ---- model folders ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm-ocr") / "m"
    visual = save_model("glm_ocr", path, seed=5)
    return path, visual


@pytest.fixture
def saved(pristine, tmp_path):
    return Path(shutil.copytree(pristine[0], tmp_path / "m"))


def _edit(path, dotted, value):
    data = json.loads(path.read_text())
    *outer, key = dotted.split(".")
    d = data
    for k in outer:
        d = d[k]
    d[key] = value
    path.write_text(json.dumps(data))


def test_a_folder_in_the_other_key_layout_loads(pristine, saved, photos):
    """transformers 5 writes `model.visual.*`; an older layout's `visual.*` loads the same."""
    from safetensors.torch import load_file, save_file
    sd = load_file(str(saved / "model.safetensors"))
    assert any(k.startswith("model.visual.blocks.0.attn.q_norm") for k in sd)
    save_file({k.replace("model.visual.", "visual.", 1): v for k, v in sd.items()}, str(saved / "model.safetensors"))
    cfg = resolve_config(saved)
    assert cfg.family == "glm-ocr"
    assert (cfg.width, cfg.mlp_hidden, cfg.out_hidden, cfg.merger_hidden) == (32, 48, 32, 96)
    assert (cfg.min_pixels, cfg.max_pixels) == (12544 // 2, (1 << 21) // 2)
    tower = load_vision_weights(build_tower(cfg).eval(), saved)
    batch = wb.preprocess([photos["coffee"]], cfg, normalize=True)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
    assert rel_err(out, hf_embeddings(pristine[1], batch.pixels, batch.grid_thw)) < FP32_TOL


@pytest.mark.parametrize("dotted, value, match", [
    ("model_type", "glm_ocr_v2", r"model_type 'glm_ocr_v2' is not a known family; known families .*glm4v "
                                 r"\(glm4v, glm4v_moe, glm46v\).*glm-ocr \(glm_ocr\)"),
    ("vision_config.attention_bias", False, r"vision_config attention_bias=False: this tower supports only True"),
    ("vision_config.hidden_act", "gelu", r"vision_config hidden_act='gelu': this tower supports only 'silu'"),
])
def test_a_config_the_tower_cannot_run_is_refused_naming_the_field(saved, dotted, value, match):
    _edit(saved / "config.json", dotted, value)
    with pytest.raises(CheckpointError, match=match):
        read_vision_config(saved)


def test_a_processor_that_disagrees_with_the_vision_config_is_named_before_any_weights_are_read(saved, monkeypatch):
    import safetensors
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **kw: pytest.fail("a tensor file was opened"))
    _edit(saved / "preprocessor_config.json", "patch_size", 16)
    with pytest.raises(CheckpointError, match=r"preprocessor_config\.json: patch_size=16 disagrees with config\.json's "
                                              r"vision_config \(patch_size=14\)"):
        resolve_config(saved)


def test_glm4v_tensors_under_a_glm_ocr_config_are_refused_naming_them(saved, tmp_path):
    """GLM-4.1V's tower is not GLM-OCR's: its tensors (no q/k norms or biases, a position table)
    do not load as this family."""
    other = tmp_path / "glm4v"
    save_model("glm4v", other, seed=1)
    (saved / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"q_norm\.weight|qkv\.bias"):
        resolve_config(saved)


# ---- preprocessing: the processor GLM-OCR's checkpoint names --------------------------------------

def _processor(cfg, raw):
    from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil
    # GLM's size bounds cover a frame's two temporal copies
    kw = dict(size={"shortest_edge": cfg.min_pixels * cfg.temporal_patch_size,
                    "longest_edge": cfg.max_pixels * cfg.temporal_patch_size})
    return Glm46VImageProcessorPil(**kw, **(dict(do_rescale=False, do_normalize=False) if raw else {}))


def test_pil_rows_equal_glm46v_pil_processor_bit_for_bit(photos):
    """The published preprocessor_config.json's constants are the processor's defaults."""
    cfg = wb.VisionConfig.preset("glm-ocr-0.9b")
    proc = _processor(cfg, raw=True)
    assert (proc.patch_size, proc.merge_size, proc.temporal_patch_size) == (14, 2, 2)
    assert tuple(proc.image_mean) == cfg.image_mean and tuple(proc.image_std) == cfg.image_std
    assert (proc.size.shortest_edge, proc.size.longest_edge) == (12544, 9633792)
    rng = np.random.default_rng(7)
    odd = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((61, 97), (20, 30), (700, 45))]
    for x in [photos["rocket"], photos["chelsea"], *odd]:
        ours = wb.preprocess(x, cfg)
        theirs = proc(images=[x], return_tensors="pt", input_data_format="channels_last")
        assert torch.equal(ours.grid_thw, theirs["image_grid_thw"])
        assert torch.equal(ours.pixels.float(), theirs["pixel_values"])
    normalized = wb.preprocess(photos["rocket"], cfg, normalize=True).pixels
    ref = _processor(cfg, raw=False)(images=[photos["rocket"]], return_tensors="pt")["pixel_values"]
    assert float((normalized - ref).abs().max()) < 1e-6


def test_torchvision_and_cuda_rows_are_glm4vs_whose_processor_glm_ocr_runs():
    """GLM-OCR's Glm46VImageProcessor runs Glm4vImageProcessor's code with the same constants, so
    its torchvision rows are the glm4v rows recorded from transformers on the GPU host
    (tests/data/torchvision_rows.json); every backend cuts the two presets' rows alike. (Checked
    directly once on the GPU host, transformers 5.17: Glm46VImageProcessor's torchvision and
    device='cuda' rows, raw and normalized, equal the torchvision and cuda backends' on every input
    of backend_inputs that test_backends compares.)"""
    from backend_inputs import backend_inputs
    ocr, glm = wb.VisionConfig.preset("glm-ocr-0.9b"), wb.VisionConfig.preset("glm-4.1v-9b")
    fields = ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels", "image_mean",
              "image_std", "rescale_factor")
    assert all(getattr(ocr, f) == getattr(glm, f) for f in fields)
    record = json.loads((Path(__file__).parent / "data" / "torchvision_rows.json").read_text())
    inputs = backend_inputs()
    for name in ("photo_chelsea", "photo_rocket", "noise_0", "tiny_20x30", "palette_pil"):
        rows = wb.preprocess(inputs[name], ocr, backend="torchvision")
        rec = record["rows"][f"glm4v/{name}"]
        assert rows.grid_thw.tolist() == rec["grid"], name
        assert hashlib.sha256(rows.pixels.contiguous().numpy().tobytes()).hexdigest() == rec["sha256"], name
    for backend in wb.PREPROCESS_BACKENDS:
        a = wb.preprocess([inputs["photo_coffee"], inputs["noise_1"]], ocr, backend=backend)
        b = wb.preprocess([inputs["photo_coffee"], inputs["noise_1"]], glm, backend=backend)
        assert torch.equal(a.grid_thw, b.grid_thw) and torch.equal(a.pixels, b.pixels), backend
