"""EXAONE-4.5's tower (Qwen2.5-VL with grouped key/value heads) against transformers'
`Exaone4_5_VisionModel` with the same weights, its processor against the one transformers maps
model_type exaone4_5 to, its checkpoint folders, its refusals, and its graph-runner replays.

The family-parametrized suites cover it too: tests/test_towers.py (photos, a video, padded
metadata, bf16), tests/test_runner.py (placements x paths), tests/test_placements_fold_device.py
(fold, device), tests/test_checkpoints.py and tests/test_checkpoint_folders.py (saved folders)."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.checkpoints import CheckpointError, load_vision_weights, read_vision_config, resolve_config
from workbench.floors import tower_flops
from workbench.preprocess import preprocess
from workbench.reference import hf_embeddings, hf_vision_model, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower
from workbench.towers.exaone4_5 import grouped_head_index

from test_checkpoints import save_model

TINY = "tiny-exaone4.5"


def matched(cfg, seed, dtype=torch.float32, **kw):
    """transformers' tower with checkpoint-like random weights, and ours loaded from its state dict."""
    hf = hf_vision_model(cfg, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(1.0 + 0.1 * r if name.endswith(("norm1.weight", "norm2.weight", "ln_q.weight")) else 0.05 * r)
    ours = build_tower(cfg, **kw).to(dtype).eval()
    ours.load_hf_state_dict(hf.state_dict())
    return hf, ours



# ---- the grouped heads ------------------------------------------------------------------------
@pytest.mark.parametrize("heads, kv", [(4, 2), (32, 8), (6, 1), (4, 4)])
def test_head_gather_pairs_each_query_head_with_transformers_kv_head(heads, kv):
    """Our gather of [q | k | v] heads equals transformers' split of the projection followed by
    its repeat_kv (each key/value head repeated for heads / kv consecutive query heads)."""
    from transformers.models.exaone4_5.modeling_exaone4_5 import repeat_kv
    d, n = 8, 5
    proj = torch.randn(n, heads + 2 * kv, d, dtype=torch.float64)
    ours = proj.index_select(1, grouped_head_index(heads, kv)).view(n, 3, heads, d)
    q, k, v = proj.split([heads, kv, kv], dim=1)

    def repeated(t):        # [n, kv, d] -> [n, heads, d], through transformers' [batch, heads, seq, d] layout
        return repeat_kv(t.transpose(0, 1)[None], heads // kv)[0].transpose(0, 1)
    assert torch.equal(ours[:, 0], q) and torch.equal(ours[:, 1], repeated(k)) and torch.equal(ours[:, 2], repeated(v))


# ---- faithful: the tower against transformers ----------------------------------------------------
@pytest.mark.slow      # the fast suite: three photos and a video in tests/test_towers.py
def test_tower_matches_transformers_on_every_photo_and_a_video(photos, seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset(TINY), max_pixels=168 * 168)
    hf, ours = matched(cfg, seed)
    items = list(photos.values()) + [wb.Video(wb.sample_video(6, size=(70, 98)))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert batch.grid_thw[-1, 0] == 3
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    err = (out - ref).abs().max().item()
    print(f"{cfg.name} fp32 vs transformers: max abs {err:.2e}, rel {rel_err(out, ref):.2e}, "
          f"ref max {ref.abs().max().item():.2f}")
    assert out.shape == ref.shape == (batch.n_rows // 4, cfg.out_hidden)
    assert rel_err(out, ref) < 1e-5 and err < 1e-5 * max(1.0, ref.abs().max().item())


# kv_heads 1: multi-query; 2: grouped (the preset); 4: one key/value head per query head
@pytest.mark.parametrize("kv_heads, grid", [(1, [[1, 6, 10]]), (2, [[1, 2, 34], [1, 30, 4]]), (2, [[3, 10, 6]]),
                                            (4, [[1, 14, 6], [1, 4, 4]])])
def test_odd_grids_and_any_grouping_match_transformers(kv_heads, grid, seed):
    """Merged grids of odd sides and extreme aspect ratios (partial windows at every edge),
    videos of 3 frame pairs, and every grouping of 4 query heads."""
    cfg = dataclasses.replace(wb.VisionConfig.preset(TINY), kv_heads=kv_heads)
    hf, ours = matched(cfg, seed)
    grid = torch.tensor(grid)
    x = torch.randn(int(grid.prod(1).sum()), cfg.patch_dim, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = ours(x, grid)
    ref = hf_embeddings(hf, x, grid)
    assert ours.blocks[0].attn.qkv.weight.shape == (cfg.head_dim * (cfg.heads + 2 * kv_heads), cfg.width)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("backend", ["masked", pytest.param("loop", marks=pytest.mark.slow)])
def test_fused_kernels_on_grouped_heads_match_transformers_in_float64(backend, seed):
    """The fused rotary (Triton, here under the interpreter) rotates the gathered [N, 3, H, D]
    heads; with the fused norms and SwiGLU it gives transformers' function (fp32 vs float64)."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, plain = matched(cfg, seed, dtype=torch.float64)
    fused = build_tower(cfg, fused=True, attn_backend=backend).eval()
    fused.load_hf_state_dict(plain.state_dict())
    assert fused.kernels.fused and fused.kernels.backend == backend
    grid = torch.tensor([[1, 4, 6], [1, 2, 4]])          # a partial window, two items: few Triton programs
    x = torch.randn(int(grid.prod(1).sum()), cfg.patch_dim, dtype=torch.float64)
    with torch.no_grad():
        ref = hf_embeddings(hf, x, grid)
        assert rel_err(fused(x.float(), grid), ref) < 1e-5
        # transformers rotates q and k in float32 whatever the model's dtype: a float64 tower
        # agrees with it to float32 rounding, no closer
        assert rel_err(plain(x, grid), ref) < 1e-6


def test_flop_count_is_the_grouped_projection(seed):
    """tower_flops' matmuls against torch's count of one forward: the qkv projection is
    width x (heads + 2 kv_heads) x head_dim, not 3 x width^2."""
    from torch.utils.flop_counter import FlopCounterMode
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, fused=False).init_random(seed).eval()
    grid = torch.tensor([[1, 8, 12]])
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        tower(torch.randn(96, cfg.patch_dim), grid)
    counts = counter.get_flop_counts()["Global"]
    matmul = sum(v for k, v in counts.items() if str(k).split(".")[1] in ("mm", "addmm"))
    assert matmul == tower_flops(cfg, [96])["matmul"]


def test_the_published_preset_has_the_checkpoints_tensor_shapes():
    """exaone4.5-33b against transformers' model of its config, both built on the meta device
    (no memory): the same names and shapes, 1.29e9 parameters (the model card: a 1.2B encoder)."""
    cfg = wb.VisionConfig.preset("exaone4.5-33b")
    with torch.device("meta"):
        hf = cfg.spec.hf_model_class()(cfg.to_hf())
        ours = build_tower(cfg)
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    assert ours.state_mismatch(theirs) is None
    assert theirs["blocks.0.attn.qkv.weight"] == (3072, 2048)          # 32 query + 2 x 8 key/value heads of 64
    assert cfg.n_params == sum(p.numel() for p in hf.parameters()) == 1_286_482_944
    assert (cfg.head_dim, cfg.heads // cfg.n_kv_heads, cfg.window_merged) == (64, 4, 4)


@pytest.mark.slow
def test_real_width_reduced_depth_matches_transformers(photos, seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset("exaone4.5-33b").reduced(2), max_pixels=224 * 224)
    hf, ours = matched(cfg, seed)
    batch = wb.preprocess([photos["coffee"], photos["rocket"]], cfg, normalize=True)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    print(f"{cfg.name} fp32 vs transformers: max abs {(out - ref).abs().max().item():.2e}, "
          f"rel {rel_err(out, ref):.2e}, ref max {ref.abs().max().item():.1f}")
    assert rel_err(out, ref) < 1e-5


# ---- the processor ------------------------------------------------------------------------------
def _model_processor(cfg, backend="pil", **kw):
    """The image processor transformers 5.24 gives model_type exaone4_5, with cfg's settings."""
    from transformers.models.auto.image_processing_auto import (IMAGE_PROCESSOR_MAPPING_NAMES,
                                                                get_image_processor_class_from_name)
    cls = get_image_processor_class_from_name(IMAGE_PROCESSOR_MAPPING_NAMES["exaone4_5"][backend])
    return cls(size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels}, patch_size=cfg.patch_size,
               temporal_patch_size=cfg.temporal_patch_size, merge_size=cfg.merge_size, image_mean=cfg.image_mean,
               image_std=cfg.image_std, **kw)


def test_preset_processor_constants_are_its_processors_defaults():
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    assert IMAGE_PROCESSOR_MAPPING_NAMES["exaone4_5"] == {"torchvision": "Qwen2VLImageProcessor",
                                                          "pil": "Qwen2VLImageProcessorPil"}
    default = Qwen2VLImageProcessorPil()
    for name in ("exaone4.5-33b", TINY):
        cfg = wb.VisionConfig.preset(name)
        assert (cfg.min_pixels, cfg.max_pixels) == (default.size.shortest_edge, default.size.longest_edge)
        assert (cfg.image_mean, cfg.image_std, cfg.rescale_factor) == (tuple(default.image_mean),
                                                                       tuple(default.image_std), default.rescale_factor)
        assert (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size) == (default.patch_size, default.merge_size,
                                                                             default.temporal_patch_size)


def test_pil_backend_is_bit_exact_with_the_models_processor(photos):
    cfg = wb.VisionConfig.preset("exaone4.5-33b")
    rng = np.random.default_rng(7)
    items = list(photos.values()) + [rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                                     for h, w in ((23, 611), (97, 61), (5, 40))]
    raw = preprocess(items, cfg)
    theirs = _model_processor(cfg, do_rescale=False, do_normalize=False)(
        images=items, return_tensors="pt", input_data_format="channels_last")
    assert torch.equal(raw.grid_thw, theirs["image_grid_thw"])
    assert torch.equal(raw.pixels.float(), theirs["pixel_values"])
    normalized = preprocess(items[:3], cfg, normalize=True)
    ref = _model_processor(cfg)(images=items[:3], return_tensors="pt")["pixel_values"]
    assert torch.equal(normalized.pixels, ref)


def test_torchvision_backend_rows_are_the_recorded_rows_of_its_processor():
    """transformers' torchvision processor for exaone4_5 is Qwen2VLImageProcessor with the settings
    of qwen2.5-vl-7b (checked above and here): its rows recorded on a host with torchvision
    (tests/data/torchvision_rows.json, under qwen2.5-vl) are this family's rows."""
    import hashlib
    from backend_inputs import backend_inputs
    record = json.loads((Path(__file__).parent / "data" / "torchvision_rows.json").read_text())
    cfg, qwen = wb.VisionConfig.preset("exaone4.5-33b"), wb.VisionConfig.preset("qwen2.5-vl-7b")
    fields = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std", "rescale_factor",
              "min_pixels", "max_pixels")
    assert all(getattr(cfg, f) == getattr(qwen, f) for f in fields)
    inputs = backend_inputs()
    for name in ("photo_chelsea", "photo_coffee", "noise_0", "noise_1", "tiny_20x30", "palette_pil"):
        batch = preprocess(inputs[name], cfg, backend="torchvision")
        rec = record["rows"][f"qwen2.5-vl/{name}"]
        assert batch.grid_thw.tolist() == rec["grid"], name
        assert hashlib.sha256(batch.pixels.contiguous().numpy().tobytes()).hexdigest() == rec["sha256"], name


# ---- checkpoint folders and bad input -------------------------------------------------------------
def test_both_vision_key_layouts_load(photos, tmp_path, seed):
    """transformers 5 saves model.visual.*; the older layout (visual.*, what vLLM's loader also
    maps) loads the same tensors."""
    from safetensors.torch import load_file, save_file
    visual = save_model("exaone4.5", tmp_path, seed)
    cfg = resolve_config(tmp_path)
    assert cfg.family == "exaone4.5" and (cfg.heads, cfg.kv_heads) == (4, 2)
    batch = wb.preprocess([photos["coffee"].resize((150, 100)), wb.Video(wb.sample_video(2, size=(56, 84)))], cfg,
                          normalize=True)
    ref = hf_embeddings(visual, batch.pixels, batch.grid_thw)
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert any(k.startswith("model.visual.blocks.0.attn.qkv") for k in sd)
    for layout in ("model.visual.", "visual."):
        save_file({k.replace("model.visual.", layout, 1): v for k, v in sd.items()},
                  str(tmp_path / "model.safetensors"))
        tower = load_vision_weights(build_tower(resolve_config(tmp_path)).eval(), tmp_path)
        with torch.no_grad():
            assert rel_err(tower(batch.pixels, batch.grid_thw), ref) < 1e-5, layout


def _edit(path, dotted, value):
    data = json.loads(path.read_text())
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is None:
        node.pop(last)
    else:
        node[last] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, key, value, match", [
    ("config.json", "model_type", "exaone4", r"model_type 'exaone4' is not a known family; known families .*"
                                             r"exaone4\.5 \(exaone4_5\)"),
    ("config.json", "vision_config.num_key_value_heads", 3,
     r"kv_heads=3: heads=4 is not a multiple of it"),
    ("config.json", "vision_config.num_key_value_heads", "2",
     r"vision_config\.num_key_value_heads = \"2\" must be a positive integer"),
    ("config.json", "vision_config.hidden_act", "gelu", r"vision_config hidden_act='gelu': this tower supports only"),
    ("preprocessor_config.json", "patch_size", 16, r"preprocessor_config\.json: patch_size=16 disagrees with "
                                                   r"config\.json's vision_config \(patch_size=14\)"),
    ("preprocessor_config.json", "temporal_patch_size", 1, r"temporal_patch_size=1 disagrees"),
    ("preprocessor_config.json", "image_std", [0.5, 0.5], r"image_std=\[0\.5, 0\.5\] must hold 3 numbers"),
])
def test_a_folder_that_does_not_fit_is_refused_before_any_weights(file, key, value, match, tmp_path, seed,
                                                                  monkeypatch):
    save_model("exaone4.5", tmp_path, seed)
    _edit(tmp_path / file, key, value)
    import safetensors
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("weights read"))
    with pytest.raises(CheckpointError, match=match):
        read_vision_config(tmp_path)


def test_a_folder_without_kv_heads_gets_transformers_default(tmp_path, seed):
    save_model("exaone4.5", tmp_path, seed)
    _edit(tmp_path / "config.json", "vision_config.num_key_value_heads", None)
    # transformers' default (8) does not divide the 4 heads of this tiny model: named, not guessed
    with pytest.raises(CheckpointError, match=r"kv_heads=8: heads=4 is not a multiple of it"):
        read_vision_config(tmp_path)


@pytest.mark.parametrize("preset, change, match", [
    (TINY, dict(kv_heads=3), r"kv_heads=3: heads=4 is not a multiple of it"),
    (TINY, dict(kv_heads=-1), r"kv_heads=-1 must be a non-negative integer"),
    ("tiny-qwen2.5-vl", dict(kv_heads=2), r"kv_heads=2: the qwen2.5-vl tower has one key/value head per query head"),
    (TINY, dict(fullatt_blocks=(1, 4)), r"fullatt_blocks \[4\] are outside 0\.\.3"),
])
def test_bad_configs_are_refused_naming_the_field(preset, change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(wb.VisionConfig.preset(preset), **change)


def test_reduced_depth_keeps_the_grouping_and_the_full_attention_spacing():
    cfg = wb.VisionConfig.preset("exaone4.5-33b")
    assert cfg.reduced(14).fullatt_blocks == (6, 13) and cfg.reduced(14).kv_heads == 8
    assert cfg.reduced(2).fullatt_blocks == (1,)


# ---- graph-safe: emulated replays with padding, several items, a NaN-poisoned pool ------------------
def _items(seed):
    rng = np.random.default_rng(seed)
    p = wb.sample_images()
    return [p["chelsea"].resize((131, 89)), rng.integers(0, 256, (61, 97, 3), dtype=np.uint8),
            wb.Video(wb.sample_video(4, size=(56, 84))), p["coffee"].resize((150, 100))]


# every placement that normalizes on the device, each attention backend that runs on a CPU (the
# placements x paths matrix is tests/test_runner.py's, parametrized over this family too)
@pytest.mark.parametrize("placement, buffer_dtype, backend", [
    ("tower", torch.bfloat16, "loop"), ("fold", torch.bfloat16, "masked"), ("device", torch.float32, "loop"),
    ("runner", torch.float32, "masked")])
def test_poisoned_pool_and_nan_padding_never_reach_real_rows(placement, buffer_dtype, backend, seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset(TINY), max_pixels=200 * 200)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed,
                           attn_backend=backend)
    raw = wb.preprocess(_items(seed), cfg)
    tokens = sorted(r // 4 for r in raw.item_rows)
    runner = EncoderGraphRunner(enc, budgets=[tokens[1] + 4, sum(tokens) + 4], buffer_dtype=buffer_dtype,
                                max_items=4, policy="always")
    eager = enc.encode(raw)
    clean = runner.encode(raw)
    assert rel_err(clean, eager) < 1e-6
    runner.poison_pool()
    poisoned = runner.encode(raw, pad_value=float("nan"))
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)
    st = runner.stats_frame()
    assert not st.miss.any() and st.padded_rows.sum() > 0
