"""The newer families' towers (Qwen3-VL, Qwen3.5, GLM-4.1V) against transformers' own vision
models with identical weights, their graph-safe metadata, and the family registry."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import workbench as wb
from workbench.floors import tower_flops
from workbench.reference import hf_embeddings, hf_vision_model, rel_err
from workbench.families import FAMILIES
from workbench.towers import TOWERS, build_tower
from workbench.towers.common import budget_padding, position_taps

NEW_PRESETS = ["tiny-qwen3-vl", "tiny-qwen3.5", "tiny-glm4v"]


def matched_towers(cfg, seed, **kw):
    """transformers' tower with fresh random weights, and ours loaded from its state dict (fp32)."""
    hf = hf_vision_model(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * r if name.endswith("norm.weight") or name.endswith(("norm1.weight", "norm2.weight"))
                    else 0.05 * r)
    ours = build_tower(cfg, **kw).eval()
    ours.load_hf_state_dict(hf.state_dict())
    return hf, ours


def max_err(out, ref):
    """Largest absolute difference relative to the reference's largest magnitude (float64)."""
    out, ref = out.double(), ref.double()
    return float((out - ref).abs().max() / ref.abs().max())



@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_tower_matches_transformers_on_photos_a_mixed_batch_and_video(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset)
    hf, ours = matched_towers(cfg, seed)
    items = [photos["chelsea"], photos["coffee"], photos["astronaut"], wb.Video(wb.sample_video(4))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert batch.grid_thw[:, 0].tolist() == [1, 1, 1, 2]
    # GLM: transformers' Glm4vVisionModel (5.24) raises IndexError on a (t > 1, h, w) grid (its
    # embeddings index the grid once per frame); a batch of several images works. hf_embeddings
    # feeds a video as its frames, (1, h, w) each, as Glm4vModel.get_video_features does.
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
    assert out.shape == ref.shape == (batch.n_rows // 4, cfg.embed_width)
    assert rel_err(out, ref) < 1e-5
    # item by item equals the batch (no cross-item attention or position leaks)
    with torch.no_grad():
        for item, sl in zip(batch.split(), batch.item_slices):
            one = ours(item.pixels, item.grid_thw)
            assert rel_err(one, out[sl.start // 4: sl.stop // 4]) < 1e-5


@pytest.mark.parametrize("preset", NEW_PRESETS + ["tiny-pixtral", "tiny-glm-ocr", "tiny-kimi-k2.5"])
@pytest.mark.parametrize("grid", [[[1, 6, 10]], [[1, 2, 34], [1, 30, 4]], [[3, 10, 6]],
                                  [[4, 4, 8], [1, 20, 18], [2, 2, 2]]])
def test_odd_non_square_grids_match_transformers(preset, grid, seed):
    """Merged grids of odd sides (3 x 5), extreme aspect ratios, grids larger and smaller than the
    position tables (the tiny ones are 16 x 16 and 8 x 8), a 3-frame video, and items of 2 to 4
    frames beside images (Kimi-K2.5: chunks that attend as one sequence and pool to one frame)."""
    cfg = wb.VisionConfig.preset(preset)
    hf, ours = matched_towers(cfg, seed)
    grid = torch.tensor(grid)
    pixels = torch.randn(int(grid.prod(1).sum()), cfg.patch_dim, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out, ref = ours(pixels, grid), hf_embeddings(hf, pixels, grid)
    assert rel_err(out, ref) < 1e-5 and max_err(out, ref) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["qwen3-vl-2b", "qwen3-vl-8b", "glm-4.1v-9b"])
def test_real_width_reduced_depth_matches_transformers(preset, photos, seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset(preset).reduced(2), min_pixels=4096, max_pixels=224 * 224)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["coffee"], photos["rocket"]], cfg, normalize=True)
    with torch.no_grad():
        assert rel_err(ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)) < 1e-5


def test_deepstack_features_follow_the_merged_tokens_in_block_order(photos, seed):
    cfg = wb.VisionConfig.preset("tiny-qwen3-vl")
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["chelsea"]], cfg, normalize=True)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
        ref = hf(batch.pixels, batch.grid_thw)
    k = cfg.out_hidden
    assert out.shape[1] == k * (1 + len(cfg.deepstack_indexes)) == cfg.embed_width
    assert rel_err(out[:, :k], ref.pooler_output) < 1e-5
    for j, feature in enumerate(ref.deepstack_features):
        assert rel_err(out[:, (j + 1) * k:(j + 2) * k], feature) < 1e-5


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_device_norm_in_tower_matches_processor_normalized_reference(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset)
    hf, _ = matched_towers(cfg, seed)
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=None)
    enc.visual.load_hf_state_dict(hf.state_dict())
    items = [photos["rocket"], photos["coffee"]]
    raw = wb.preprocess(items, cfg)
    ref = hf_embeddings(hf, wb.preprocess(items, cfg, normalize=True).pixels, raw.grid_thw)
    assert raw.pixels.dtype == torch.uint8
    assert rel_err(enc.encode(raw), ref) < 1e-5


@pytest.mark.parametrize("preset", NEW_PRESETS)
@pytest.mark.parametrize("backend", ["loop", "masked"])
def test_padded_metadata_gives_the_same_valid_rows(preset, backend, seed):
    """The graph-runner seam: rows padded to a budget with NaN, sequence slots padded with repeated
    tails, the position gather padded with weight-0 rows: the valid rows are those of eager."""
    cfg = wb.VisionConfig.preset(preset)
    tower = build_tower(cfg, attn_backend=backend).init_random(seed).eval()
    grid = torch.tensor([[1, 8, 12], [2, 16, 8], [1, 4, 4]])
    n = int(grid.prod(1).sum())
    x = torch.randn(n, cfg.patch_dim)
    pad = 64
    with torch.no_grad():
        ref = tower(x, grid)
        xp = torch.cat([x, torch.full((pad, cfg.patch_dim), float("nan"))])
        meta = tower.prepare(grid, **budget_padding(cfg, (n + pad) // 4, 8))
        assert meta.cu_seqlens.shape == (9,) and meta.cu_seqlens[-1] == n
        assert meta.pos_index.shape[0] == meta.pos_weight.shape[0] == n + pad
        assert not meta.pos_weight[n:].any()
        out = tower.forward_prepared(xp, meta)
    assert out.shape == ((n + pad) // 4, cfg.embed_width)
    assert torch.isfinite(out[: n // 4]).all()
    assert rel_err(out[: n // 4], ref) < 1e-6


@pytest.mark.parametrize("preset", NEW_PRESETS + ["tiny-glm-ocr", "tiny-pixtral", "tiny-kimi-k2.5"])
def test_metadata_copied_into_captured_buffers_replays_any_grid(preset, seed):
    """What a graph runner does: metadata prepared once for the capture (a grid filling the budget),
    then each batch's metadata copied into the same tensors; forward_prepared on those buffers
    equals eager for grids the capture never saw."""
    cfg = wb.VisionConfig.preset(preset)
    tower = build_tower(cfg, attn_backend="masked").init_random(seed).eval()
    budget, items = 160, 4
    static = tower.prepare_capture(budget, items)
    buffers = {k: v.data_ptr() for k, v in static.tensors().items()}
    pixels = torch.zeros(budget * cfg.merge_unit, cfg.patch_dim)
    for grid in ([[1, 10, 14], [1, 4, 6]], [[2, 8, 8], [1, 6, 20], [1, 2, 2]]):
        grid = torch.tensor(grid)
        n = int(grid.prod(1).sum())
        x = torch.randn(n, cfg.patch_dim)
        static.copy_(tower.prepare(grid, **budget_padding(cfg, budget, items)))
        assert {k: v.data_ptr() for k, v in static.tensors().items()} == buffers
        pixels.zero_()
        pixels[:n] = x
        with torch.no_grad():
            out = tower.forward_prepared(pixels, static)
            ref = tower(x, grid)
        assert rel_err(out[: sum(cfg.item_tokens(grid))], ref) < 1e-6      # Kimi-K2.5 pools a video's frames


@pytest.mark.parametrize("preset", NEW_PRESETS + [pytest.param("tiny-glm-ocr", marks=pytest.mark.slow), "tiny-pixtral",
                                                  pytest.param("tiny-kimi-k2.5", marks=pytest.mark.slow)])
def test_fused_kernels_match_the_plain_twin(preset, seed):
    """The fused path (Triton, here under the interpreter) on the new blocks: LayerNorm / RMSNorm
    residual sums, the rotary (GLM-OCR's on normalized q and k, Pixtral's frequencies), SwiGLU (biased
    in GLM-OCR), the deepstack taps, GLM's post-norm and Mistral3's projector norm."""
    cfg = wb.VisionConfig.preset(preset)
    plain = build_tower(cfg, fused=False, attn_backend="masked").init_random(seed).eval()
    fused = build_tower(cfg, fused=True, attn_backend="masked").init_random(seed).eval()
    grid = torch.tensor([[1, 6, 10], [1, 4, 4]])
    x = torch.randn(int(grid.prod(1).sum()), cfg.patch_dim)
    with torch.no_grad():
        assert rel_err(fused(x, grid), plain(x, grid)) < 1e-5


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_bf16_tower_is_close_to_float64(preset, photos, seed):
    cfg = wb.VisionConfig.preset(preset)
    t64 = build_tower(cfg).init_random(seed).double().eval()
    t16 = build_tower(cfg).init_random(seed).to(torch.bfloat16).eval()
    batch = wb.preprocess([photos["chelsea"]], cfg, normalize=True)
    with torch.no_grad():
        ref = t64(batch.pixels.double(), batch.grid_thw)
        out = t16(batch.pixels, batch.grid_thw)
    assert out.dtype == torch.bfloat16 and t64.prepare(batch.grid_thw).pos_weight.dtype == torch.float64
    assert rel_err(out, ref) < 3e-2


@pytest.mark.parametrize("h, w, side", [(6, 10, 16), (34, 2, 16), (40, 64, 48), (4, 4, 48)])
def test_bilinear_taps_equal_transformers_helper(h, w, side):
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights
    grid = torch.tensor([[2, h, w]])
    idx, wts = position_taps([(2, h, w)], 2, side, "bilinear", 2 * h * w, torch.float32)
    ref_i, ref_w = get_vision_interpolation_indices_and_weights(grid, side, mode="bilinear", align_corners=True,
                                                                spatial_merge_size=2)
    table = torch.randn(side * side, 8, dtype=torch.float64)
    ours = (table[idx] * wts.double()[..., None]).sum(1)
    theirs = (table[ref_i] * ref_w.double()[..., None]).sum(1)
    # transformers computes the source coordinate in fp32, these taps in fp64 (rounded once)
    assert rel_err(ours, theirs) < 1e-5


@pytest.mark.parametrize("h, w, side", [(6, 10, 8), (34, 2, 24), (60, 44, 24), (2, 2, 24)])
def test_bicubic_taps_equal_grid_sample(h, w, side):
    """GLM-4.1V's resampling: grid_sample(bicubic, border, align_corners=False) at pixel centres."""
    idx, wts = position_taps([(1, h, w)], 2, side, "bicubic", h * w, torch.float64)
    table = torch.randn(side * side, 8, dtype=torch.float64)
    ours = (table[idx] * wts[..., None]).sum(1)
    rows = torch.arange(h).view(h // 2, 2, 1, 1).expand(h // 2, 2, w // 2, 2).permute(0, 2, 1, 3).reshape(-1)
    cols = torch.arange(w).view(1, 1, w // 2, 2).expand(h // 2, 2, w // 2, 2).permute(0, 2, 1, 3).reshape(-1)
    rows, cols = rows.double(), cols.double()
    g = torch.stack([(cols + 0.5) / w * 2 - 1, (rows + 0.5) / h * 2 - 1], -1).view(1, -1, 1, 2)
    img = table.view(side, side, -1).permute(2, 0, 1)[None]
    ref = F.grid_sample(img, g, mode="bicubic", align_corners=False, padding_mode="border")[0, :, :, 0].T
    assert rel_err(ours, ref) < 1e-12


@pytest.mark.parametrize("preset", NEW_PRESETS + ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-exaone4.5",
                                                 "tiny-pixtral", "tiny-kimi-k2.5"])
def test_n_params_equals_transformers_parameter_count(preset):
    cfg = wb.VisionConfig.preset(preset)
    assert cfg.n_params == sum(p.numel() for p in hf_vision_model(cfg).parameters())
    sd = build_tower(cfg).state_dict()
    assert cfg.n_params == sum(v.numel() for k, v in sd.items() if not k.startswith("input_norm."))


@pytest.mark.parametrize("preset", NEW_PRESETS + ["tiny-qwen2-vl", "tiny-glm-ocr", "tiny-pixtral", "tiny-kimi-k2.5"])
def test_tower_flops_count_the_matmuls_the_tower_runs(preset):
    """floors.tower_flops against torch's own count of one forward: its matmul FLOPs are every mm /
    addmm (the position gather is an embedding_bag, not counted), its attention FLOPs the bmm of
    the one-frame dense attention (SDPA's math path, whose bmm the counter sees: it has no formula
    for the CPU's fused kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    cfg = wb.VisionConfig.preset(preset)
    tower = build_tower(cfg, fused=False).init_random(0).eval()
    grid = torch.tensor([[1, 8, 12]])
    x = torch.randn(96, cfg.patch_dim)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        tower(x, grid)
    counts = counter.get_flop_counts()["Global"]
    matmul = sum(v for k, v in counts.items() if str(k).split(".")[1] in ("mm", "addmm"))
    attention = sum(v for k, v in counts.items() if str(k).split(".")[1] == "bmm")
    model = tower_flops(cfg, [96])
    assert (matmul, attention) == (model["matmul"], model["attention_full"])


def test_loading_another_familys_state_dict_names_the_keys():
    q3 = build_tower(wb.VisionConfig.preset("tiny-qwen3-vl"))
    glm = build_tower(wb.VisionConfig.preset("tiny-glm4v"))
    with pytest.raises(ValueError, match=r"missing from the checkpoint: .*downsample\.bias"):
        glm.load_hf_state_dict(q3.state_dict())
    wide = build_tower(dataclasses.replace(wb.VisionConfig.preset("tiny-glm4v"), merger_hidden=128))
    with pytest.raises(ValueError, match=r"merger\.gate_proj\.weight: checkpoint \(128, 48\) vs tower \(96, 48\)"):
        glm.load_hf_state_dict(wide.state_dict())


def test_glm_downsample_weight_is_a_view_loads_and_casts_write_through(seed):
    cfg = wb.VisionConfig.preset("tiny-glm4v")
    tower = build_tower(cfg).init_random(seed)
    sd = {k: torch.randn_like(v) for k, v in tower.state_dict().items()}
    tower.load_hf_state_dict(sd)
    conv = tower.downsample
    assert conv.weight.shape == (48, 64, 2, 2)
    assert torch.equal(conv.flat_weight, sd["downsample.weight"].permute(0, 2, 3, 1).reshape(48, -1))
    tower.to(torch.float64)
    assert conv.flat_weight.dtype == torch.float64 and conv.weight.data_ptr() == conv.flat_weight.data_ptr()
    x = torch.randn(8, 64, dtype=torch.float64)
    ref = F.conv2d(x.view(2, 2, 2, 64).permute(0, 3, 1, 2), conv.weight, conv.bias, stride=2).view(2, 48)
    assert rel_err(conv(x), ref) < 1e-12


def test_every_family_registers_a_tower_presets_and_its_transformers_class():
    assert list(TOWERS) == list(FAMILIES)
    for name, fam in FAMILIES.items():
        assert fam.name == name and TOWERS[name].family == name
        assert any(p["name"].startswith("tiny-") for p in fam.presets)
        assert fam.hf_model_class().__name__ == fam.hf_class[1]
        for p in fam.presets:
            assert wb.VisionConfig.preset(p["name"]).family == name
