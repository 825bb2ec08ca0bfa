"""The vision towers against transformers' implementation with identical weights."""
import dataclasses

import numpy as np

import pytest
import torch

import workbench as wb
from workbench.reference import cos_min, hf_embeddings, hf_vision_model, rel_err
from workbench.towers import build_tower

FAMILY_PRESETS = ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-exaone4.5", "tiny-glm-ocr", "tiny-pixtral",
                  "tiny-kimi-k2.5"]


def matched_towers(cfg, seed, dtype=torch.float32):
    """transformers' tower with fresh random weights, and ours loaded from its state dict."""
    hf = hf_vision_model(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            r = torch.randn(p.shape, generator=g)
            is_norm_w = name.endswith("weight") and ("norm" in name or "ln_q" in name)
            p.copy_(1.0 + 0.1 * r if is_norm_w else 0.05 * r)
    ours = build_tower(cfg).eval()
    ours.load_hf_state_dict(hf.state_dict())
    return hf.to(dtype), ours.to(dtype)


@pytest.fixture(scope="module")
def photos():
    return wb.sample_images()


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_tower_matches_transformers_on_real_photos_mixed_batch_and_video(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset)
    hf, ours = matched_towers(cfg, seed)
    items = [photos["chelsea"], photos["coffee"], photos["astronaut"], wb.Video(wb.sample_video(4))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert batch.grid_thw[:, 0].tolist() == [1, 1, 1, 4 // cfg.temporal_patch_size]
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    out = ours(batch.pixels, batch.grid_thw)
    tokens = cfg.item_tokens(batch.grid_thw)             # rows / 4, but one frame's for Kimi-K2.5's video chunk
    assert out.shape == ref.shape == (sum(tokens), cfg.out_hidden)
    assert rel_err(out, ref) < 1e-5
    # item by item equals the batch (no cross-item attention leaks)
    for item, a, k in zip(batch.split(), np.cumsum([0] + tokens), tokens):
        one = ours(item.pixels, item.grid_thw)
        assert rel_err(one, out[a:a + k]) < 1e-5


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_single_nonsquare_photo_matches_transformers(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess(photos["rocket"], cfg, normalize=True)
    h, w = batch.grid_thw[0, 1:].tolist()
    assert h != w
    assert rel_err(ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)) < 1e-5


@pytest.mark.parametrize("preset", ["qwen2-vl-2b", "qwen2.5-vl-3b"])
def test_real_width_reduced_depth_matches_transformers(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset).reduced(2)
    hf, ours = matched_towers(cfg, seed)
    small = dataclasses.replace(cfg, max_pixels=224 * 224)
    batch = wb.preprocess([photos["coffee"], photos["chelsea"]], small, normalize=True)
    assert rel_err(ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)) < 1e-5


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_device_norm_in_tower_matches_processor_normalized_reference(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset)
    hf, ours = matched_towers(cfg, seed)
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=None)
    enc.visual.load_hf_state_dict(hf.state_dict())
    items = [photos["grace_hopper"], photos["rocket"]]
    raw = wb.preprocess(items, cfg)
    ref = hf_embeddings(hf, wb.preprocess(items, cfg, normalize=True).pixels, raw.grid_thw)
    assert raw.pixels.dtype == torch.uint8
    out = enc.encode(raw)
    assert rel_err(out, ref) < 1e-5
    assert cos_min(out, ref) > 0.99999


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
@pytest.mark.parametrize("backend", ["loop", "masked"])
def test_padded_metadata_gives_the_same_valid_rows(preset, backend, seed):
    """The graph-runner seam: rows padded to a budget, sequence slots padded with repeated tails."""
    cfg = wb.VisionConfig.preset(preset)
    tower = build_tower(cfg, attn_backend=backend).init_random(seed).eval()
    grid = torch.tensor([[1, 8, 12], [2, 16, 8], [1, 4, 4]])
    n = int(grid.prod(1).sum())
    x = torch.randn(n, cfg.patch_dim)
    with torch.no_grad():
        ref = tower(x, grid)
        pad = 64
        xp = torch.cat([x, torch.full((pad, cfg.patch_dim), float("nan"))])
        meta = tower.prepare(grid, n_rows=n + pad, n_segments=8, max_seqlen=n + pad,
                             n_window_segments=(n + pad) // 4, max_window_seqlen=n + pad)
        assert meta.cu_seqlens.shape == (9,) and meta.cu_seqlens[-1] == n
        out = tower.forward_prepared(xp, meta)
    k = sum(cfg.item_tokens(grid))
    assert out.shape == ((n + pad) // 4, cfg.out_hidden) and ref.shape[0] == k
    assert torch.isfinite(out[:k]).all()
    assert rel_err(out[:k], ref) < 1e-6


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_bf16_tower_is_close_to_float64(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset)
    t64 = build_tower(cfg).init_random(seed).double().eval()
    t16 = build_tower(cfg).init_random(seed).to(torch.bfloat16).eval()
    batch = wb.preprocess([photos["chelsea"]], cfg, normalize=True)
    with torch.no_grad():
        ref = t64(batch.pixels.double(), batch.grid_thw)
        out = t16(batch.pixels, batch.grid_thw)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < 3e-2


def test_loading_a_mismatched_state_dict_names_the_keys():
    q2 = build_tower(wb.VisionConfig.preset("tiny-qwen2-vl"))
    q25 = build_tower(wb.VisionConfig.preset("tiny-qwen2.5-vl"))
    with pytest.raises(ValueError, match=r"missing from the checkpoint: .*mlp\.(down|gate|up)_proj"):
        q25.load_hf_state_dict(q2.state_dict())
    wide = build_tower(dataclasses.replace(wb.VisionConfig.preset("tiny-qwen2-vl"), out_hidden=64))
    with pytest.raises(ValueError, match=r"shape mismatch: .*merger\.mlp\.2\.weight: checkpoint \(64, 256\) vs tower \(48, 256\)"):
        q2.load_hf_state_dict(wide.state_dict())
    # a full-model prefix is stripped
    sd = {f"model.visual.{k}": v for k, v in q2.state_dict().items()}
    build_tower(wb.VisionConfig.preset("tiny-qwen2-vl")).load_hf_state_dict(sd)


def test_device_normalizing_tower_without_norm_module_is_an_error():
    with pytest.raises(ValueError, match="no norm module"):
        build_tower(wb.VisionConfig.preset("tiny-qwen2-vl"), device_norm=True)


@pytest.mark.parametrize("grid, match", [
    ([[1, 5, 4]], "multiples of merge_size"),
    ([[0, 4, 4]], "non-positive"),
    ([[1.0, 4.0, 4.0]], "integers"),
])
def test_bad_grid_is_rejected(grid, match):
    tower = build_tower(wb.VisionConfig.preset("tiny-qwen2-vl"))
    with pytest.raises(ValueError, match=match):
        tower.prepare(torch.tensor(grid))


def test_pixels_not_matching_grid_is_rejected():
    tower = build_tower(wb.VisionConfig.preset("tiny-qwen2-vl"))
    with pytest.raises(ValueError, match="rows"):
        tower(torch.zeros(12, 1176), torch.tensor([[1, 4, 4]]))
