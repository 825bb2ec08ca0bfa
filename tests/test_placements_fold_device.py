"""Placements `fold` (the normalization folded into the patch embedding) and `device` (the GPU
preprocessor normalizes before the encoder) on every path: against the float64 reference, against
placement `tower`, across weight reloads and dtype changes, and their refusals of bad input."""
import dataclasses

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.config import TINY_PRESET_PER_FAMILY
from workbench.dp import encode_job
from workbench.launch import launch
from workbench.norms import normalize_reference
from workbench.reference import rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower
from workbench.vocabulary import NORM_FREE_PLACEMENTS, PLACEMENT_TABLE, PLACEMENTS

FP32_TOL = 1e-5        # fold in fp32 measured ~1e-6 against float64 on the tiny presets


def small_cfg(preset, side=200):
    base = wb.VisionConfig.preset(preset)
    return dataclasses.replace(base, max_pixels=side * side, min_pixels=min(base.min_pixels, side * side))


def mixed_items(seed):
    """A real photo, fresh random images of odd sizes, and a short video: several items."""
    photos = wb.sample_images()
    rng = np.random.default_rng(seed)
    odd = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((61, 97), (113, 45))]
    return [photos["chelsea"].resize((131, 89)), *odd, wb.Video(wb.sample_video(4, size=(56, 84)))]


def budgets_for(batch):
    """Two budgets every item fits with padding: the smallest item packs alone or with others."""
    tokens = sorted(r // 4 for r in batch.item_rows)
    return sorted({max(4, tokens[0] + 2), tokens[-1] + 2})


def encoder(cfg, placement, seed, dtype=torch.float32, **kw):
    return wb.build_encoder(cfg, placement=placement, norm="eager", dtype=dtype, device="cpu", seed=seed, **kw)


def float64_reference(cfg, raw, seed):
    ref = encoder(cfg, "processor", seed, dtype=torch.float64)
    with torch.no_grad():
        return ref.visual(normalize_reference(raw.pixels, cfg), raw.grid_thw)


# ---- the vocabulary ---------------------------------------------------------------------------
def test_fold_and_device_follow_processor_in_the_placement_order():
    assert PLACEMENTS == ("processor", "fold", "device", "outer", "outer_graph", "tower", "runner", "none")
    fold, device = PLACEMENT_TABLE["fold"], PLACEMENT_TABLE["device"]
    assert fold.input_kind == fold.runner_input == "uint8" and "uint8" in fold.buffer_dtypes
    assert device.input_kind == "uint8" and device.runner_input == "normalized"
    assert device.buffer_dtypes == ("bfloat16", "float32")
    assert "fold" in NORM_FREE_PLACEMENTS and "device" not in NORM_FREE_PLACEMENTS
    assert device.who.startswith("the GPU preprocessor, before the encoder")


# ---- fold against the float64 reference ---------------------------------------------------------
@pytest.mark.parametrize("preset", TINY_PRESET_PER_FAMILY)
def test_fold_equals_the_float64_reference_on_every_tiny_preset(preset, seed):
    cfg = small_cfg(preset)
    raw = wb.preprocess(mixed_items(seed), cfg)
    assert raw.n_items == 4
    enc = encoder(cfg, "fold", seed)
    out = enc.encode(raw)
    ref = float64_reference(cfg, raw, seed)
    assert rel_err(out, ref) < FP32_TOL
    # the same weights without the fold are far off on raw pixels: the fold does the normalizing
    assert rel_err(encoder(cfg, "none", seed).encode(raw), ref) > 0.1


@pytest.mark.parametrize("preset", ["tiny-qwen2-vl", "tiny-qwen3-vl"])      # without and with a patch bias
def test_folded_weights_are_the_float64_fold_rounded_once(preset, seed):
    cfg = wb.VisionConfig.preset(preset)
    enc = encoder(cfg, "fold", seed, dtype=torch.bfloat16)
    pe = enc.visual.patch_embed
    pe.refresh()
    w = pe.proj.weight.double().reshape(cfg.width, -1)
    per = cfg.patch_dim // cfg.in_channels
    s = torch.tensor(cfg.norm_scale, dtype=torch.float64).repeat_interleave(per)
    t = torch.tensor(cfg.norm_shift, dtype=torch.float64).repeat_interleave(per)
    b = w @ t + (pe.proj.bias.double() if pe.proj.bias is not None else 0)
    assert (pe.proj.bias is None) == (preset == "tiny-qwen2-vl")
    assert pe.folded_weight.dtype == pe.folded_bias.dtype == torch.bfloat16
    assert torch.equal(pe.folded_weight, (w * s).to(torch.bfloat16))
    assert torch.equal(pe.folded_bias, b.to(torch.bfloat16))


def test_a_folded_tower_takes_no_input_norm():
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    with pytest.raises(ValueError, match="normalize twice"):
        build_tower(cfg, input_norm=wb.make_norm("eager", cfg), device_norm=True, fold_norm=True)
    with pytest.raises(ValueError, match="fold_norm must be True or False"):
        build_tower(cfg, fold_norm=1)


# ---- fold and device agree with tower on every path -----------------------------------------------
CELLS = [("fold", torch.uint8), ("fold", torch.bfloat16), ("device", torch.float32), ("device", torch.bfloat16)]


@pytest.mark.parametrize("preset", ["tiny-qwen2.5-vl", "tiny-glm4v", "tiny-exaone4.5", "tiny-pixtral", "tiny-kimi-k2.5"])
@pytest.mark.parametrize("placement, buffer_dtype", CELLS)
def test_fold_and_device_agree_with_tower_eager_and_under_the_graph_runner(preset, placement, buffer_dtype, seed):
    cfg = small_cfg(preset)
    raw = wb.preprocess(mixed_items(seed), cfg)
    tower = encoder(cfg, "tower", seed).encode(raw)
    enc = encoder(cfg, placement, seed)
    assert rel_err(enc.encode(raw), tower) < FP32_TOL
    runner = EncoderGraphRunner(enc, budgets=budgets_for(raw), buffer_dtype=buffer_dtype, max_items=4)
    assert runner.backend == "emulated"
    graph = enc.encode(raw, path="cudagraph", runner=runner)
    # a bf16 buffer rounds normalized floats (device), not raw 0..255 (fold)
    tol = 5e-2 if (placement, buffer_dtype) == ("device", torch.bfloat16) else FP32_TOL
    assert rel_err(graph, tower) < tol
    assert rel_err(runner.encode(raw), graph) == 0        # runner.encode is what the cudagraph path does
    st = runner.stats_frame()
    assert (~st.miss).sum() >= 2 and st.padded_rows.sum() > 0


def test_device_normalizes_before_the_runner_which_stages_floats(seed):
    cfg = small_cfg("tiny-qwen2-vl")
    raw = wb.preprocess(mixed_items(seed), cfg)
    enc = encoder(cfg, "device", seed)
    staged = enc.device_preprocess(raw)
    assert staged.pixels.dtype == torch.float32
    assert torch.allclose(staged.pixels.double(), normalize_reference(raw.pixels, cfg), atol=1e-5)
    runner = EncoderGraphRunner(enc, budgets=budgets_for(raw), buffer_dtype=torch.float32, max_items=4)
    seen = []
    stage = runner.stage
    runner.stage = lambda cap, pixels, pad_value=0.0: (seen.append(pixels.dtype), stage(cap, pixels, pad_value))
    enc.encode(raw, path="cudagraph", runner=runner)
    assert seen and set(seen) == {torch.float32}
    assert enc.runner_norm is None and enc.outer_norm is None and enc.visual.input_norm is None


@pytest.mark.parametrize("placement", ["fold", "device"])
def test_dp_two_gloo_ranks_agree_with_tower(placement):
    images = mixed_items(5)[:3] + [wb.sample_images()["coffee"].resize((90, 60))]
    spec = dict(preset="tiny-qwen3-vl", placement=placement, norm="eager", dtype=torch.float32, seed=3, images=images)
    results = launch(encode_job, world_size=2, backend="gloo", args=(spec,))
    tower = encoder("tiny-qwen3-vl", "tower", 3)
    ref = tower.encode(wb.preprocess(images, tower.cfg))
    for r in results:
        assert r.shape == ref.shape and rel_err(r, ref) < FP32_TOL


@pytest.mark.parametrize("placement", ["fold", "device"])
def test_nan_in_the_pool_and_padding_never_reaches_real_rows(placement, seed):
    cfg = small_cfg("tiny-qwen2-vl")
    raw = wb.preprocess(mixed_items(seed), cfg)
    enc = encoder(cfg, placement, seed, check_inputs=False)
    runner = EncoderGraphRunner(enc, budgets=budgets_for(raw), buffer_dtype=torch.bfloat16, max_items=4, policy="always")
    clean = runner.encode(raw)
    runner.poison_pool()
    poisoned = runner.encode(raw, pad_value=float("nan"))
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)


# ---- the folded weights follow the parameters -------------------------------------------------
def test_reloading_weights_after_capture_refreshes_the_folded_weights_in_place(seed, monkeypatch):
    cfg = small_cfg("tiny-qwen3-vl")
    raw = wb.preprocess(mixed_items(seed), cfg)
    enc = encoder(cfg, "fold", seed)
    runner = EncoderGraphRunner(enc, budgets=budgets_for(raw), buffer_dtype=torch.uint8, max_items=4,
                                exact_fit=False)
    before = runner.encode(raw)
    pe = enc.visual.patch_embed
    held = [(id(b), b.data_ptr()) for b in (pe.folded_weight, pe.folded_bias)]
    other = encoder(cfg, "tower", seed + 1)
    enc.visual.load_hf_state_dict(other.visual.state_dict())
    want = other.encode(raw)
    # an emulated replay runs no refresh in the forward, as a CUDA graph runs no Python: without
    # the runner's refresh its replays read the old folded weights
    with monkeypatch.context() as m:
        m.setattr(enc.visual, "refresh_derived", lambda: False)
        stale = runner.encode(raw)
    assert rel_err(stale, want) > 0.1
    after = runner.encode(raw)
    assert rel_err(after, want) < FP32_TOL and rel_err(before, want) > 0.1
    assert not runner.stats_frame().miss.any()        # every item replayed, none ran eagerly
    # the same buffer objects and memory the captured graphs read, written in place
    assert [(id(b), b.data_ptr()) for b in (pe.folded_weight, pe.folded_bias)] == held
    assert not enc.visual.refresh_derived()         # fresh now: the next forward does no fold work


def test_plain_parameter_writes_and_dtype_changes_refresh_the_fold(seed):
    cfg = small_cfg("tiny-qwen2-vl")
    raw = wb.preprocess(mixed_items(seed)[:2], cfg)
    enc = encoder(cfg, "fold", seed)
    enc.encode(raw)
    with torch.no_grad():
        enc.visual.patch_embed.proj.weight.mul_(0.5)
    tower = encoder(cfg, "tower", seed)
    with torch.no_grad():
        tower.visual.patch_embed.proj.weight.mul_(0.5)
    assert rel_err(enc.encode(raw), tower.encode(raw)) < FP32_TOL
    enc.visual.to(torch.float64)
    assert enc.visual.patch_embed.folded_weight.dtype == torch.float64
    processor = encoder(cfg, "processor", seed)
    processor.visual.load_hf_state_dict(tower.visual.state_dict())
    with torch.no_grad():
        got = enc.visual(raw.pixels, raw.grid_thw)
        want = processor.visual.to(torch.float64)(normalize_reference(raw.pixels, cfg), raw.grid_thw)
    assert rel_err(got, want) < 1e-12


def test_torch_load_state_dict_into_a_fold_encoder_refreshes_the_fold(seed):
    cfg = small_cfg("tiny-qwen2.5-vl")
    raw = wb.preprocess(mixed_items(seed)[:2], cfg)
    donor = encoder(cfg, "tower", seed + 7)
    enc = encoder(cfg, "fold", seed)
    enc.encode(raw)
    enc.visual.load_state_dict(donor.visual.state_dict())        # torch's own loader, strict
    assert rel_err(enc.encode(raw), donor.encode(raw)) < FP32_TOL


@pytest.mark.parametrize("preset", TINY_PRESET_PER_FAMILY)
def test_state_dict_keys_do_not_change_with_the_fold(preset):
    fold, tower = (encoder(preset, p, 0) for p in ("fold", "tower"))
    keys = set(fold.visual.state_dict())
    assert keys == set(tower.visual.state_dict())
    assert not any("folded" in k for k in keys)
    assert {n for n, _ in fold.visual.named_parameters()} == {n for n, _ in tower.visual.named_parameters()}


# ---- bad input ------------------------------------------------------------------------------------
def normalized_and_encoder(placement):
    """A CPU-normalized batch and a tiny encoder of ``placement``, which takes uint8."""
    cfg = small_cfg("tiny-qwen2-vl")
    return wb.preprocess(mixed_items(1)[:1], cfg, normalize=True), encoder(cfg, placement, 0)


def test_a_normalized_batch_into_fold_is_refused_naming_what_it_takes():
    normalized, enc = normalized_and_encoder("fold")
    with pytest.raises(ValueError, match=r"placement 'fold' takes raw uint8 pixels .*got torch\.float32.*folded"):
        enc.encode(normalized)
    runner = EncoderGraphRunner(enc, budgets=[64], buffer_dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"placement 'fold' takes raw uint8 pixels"):
        runner.encode(normalized)


def test_a_float_batch_into_device_is_refused_and_a_uint8_buffer_too():
    normalized, enc = normalized_and_encoder("device")
    with pytest.raises(ValueError, match=r"placement 'device' takes raw uint8 pixels .*GPU preprocessor"):
        enc.encode(normalized)
    with pytest.raises(ValueError, match=r"placement 'device' fills the graph buffer with normalized floats .*"
                                         r"uint8 buffer cannot hold; valid buffer dtypes for it: bfloat16, float32"):
        EncoderGraphRunner(enc, budgets=[64], buffer_dtype=torch.uint8)


def test_the_runner_of_device_takes_its_uint8_batch_or_the_normalized_one(seed):
    cfg = small_cfg("tiny-qwen2-vl")
    raw = wb.preprocess(mixed_items(seed)[:2], cfg)
    enc = encoder(cfg, "device", seed)
    runner = EncoderGraphRunner(enc, budgets=budgets_for(raw), buffer_dtype=torch.float32, max_items=4)
    direct, staged = runner.encode(raw), runner.encode(enc.device_preprocess(raw))
    assert torch.equal(direct, staged)
    # raw 0..255 floats handed to the runner as if normalized: the missing normalization named
    with pytest.raises(ValueError, match=r"device-normalized pixels.*raw 0\.\.255"):
        runner.encode(wb.PatchBatch(raw.pixels.float(), raw.grid_thw))


# ---- the studies' models of the two placements -------------------------------------------------------
def test_fp32_memory_models_fold_without_temporaries_and_device_outside_the_pool():
    from workbench.studies import fp32_memory
    from workbench.studies.fp32_memory import summary
    from workbench.results.tables import wide
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    t = fp32_memory.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], budgets=[64])
    w = wide(t)
    rows, d = 4 * 64, cfg.patch_dim
    fold = w[w.scope == "fold"].set_index("buffer_dtype")
    assert (fold.temp_bytes == 0).all() and fold.trace_matches.all()
    assert fold.loc["bfloat16", "model_bytes"] == 0 < fold.loc["uint8", "model_bytes"]
    assert fold.loc["uint8", "model_peak_bytes"] == rows * d * 2          # the bf16 copy of the buffer, nothing else
    device = w[w.scope == "device"].set_index("norm")
    assert (device.model_bytes == 0).all() and device.trace_matches.all()
    assert device.loc["eager", "temp_bytes"] == 8 * rows * d              # the eager norm's fp32 temporaries
    norm = w[(w.scope == "norm") & (w.buffer_dtype == "uint8")].set_index("norm")
    assert norm.loc["eager", "model_bytes"] > fold.loc["uint8", "model_bytes"]
    text = summary.findings(t)
    assert "Placement fold runs no norm" in text and "Placement device normalizes before the encoder" in text
    (key,) = summary.key_numbers(t).values()
    assert summary.FOLD_LABEL in set(key.norm)


def test_correctness_study_finds_fold_and_device_right_on_every_path():
    from workbench.studies import correctness
    from workbench.results.tables import wide
    t = correctness.run(device="cpu", progress=False, families=["tiny-qwen3-vl"], depth=1, norms=["eager"],
                        placements=["fold", "device"], buffer_dtypes=["uint8", "bfloat16"], budgets=[16, 64],
                        max_items=4, hazard=True)
    w = wide(t)
    emb = w[w.case == "embedding"]
    assert set(emb.placement) == {"fold", "device"}
    assert set(emb[emb.placement == "fold"].norm) == {"(unused)"}
    cells = set(zip(emb.placement, emb.path, emb.buffer_dtype))
    assert cells == {("fold", "eager", "-"), ("fold", "cudagraph", "uint8"), ("fold", "cudagraph", "bfloat16"),
                     ("fold", "dp", "-"), ("device", "eager", "-"), ("device", "cudagraph", "bfloat16"),
                     ("device", "dp", "-")}
    assert emb.ok.all(), emb[["placement", "path", "buffer_dtype", "rel_err"]]
    hz = w[w.case == "nan_padding"]
    assert {"tower", "fold", "device"} == set(hz.placement) and hz.ok.all()
