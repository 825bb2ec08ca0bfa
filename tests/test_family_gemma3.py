"""Gemma-3 (transformers' `SiglipVisionModel` then `Gemma3MultiModalProjector`, model_type gemma3): the tower
against transformers' modules with the same weights on real photos, several images at once (every image is one
fixed-size item: 16 x 16 patches pooled 4 x 4 at the tiny preset, 64 x 64 at 896 px); the merge-block rows with
merge size 4 (the average pool is a mean over 16 consecutive rows); graph safety (padded metadata, captured
buffers replaying any grid, the emulated graph runner with a NaN-poisoned pool on every correct placement, the
outer placement wrong under it); the fused kernels, bf16 against float64, the FLOP model and the parameter
count; model folders saved by transformers' save_pretrained in all three key layouts, and bad ones named before
any tensor is read; preprocessing bit for bit against Gemma3ImageProcessorPil (fixed 896 x 896 bilinear resize,
pan-and-scan crops included)."""
import dataclasses
import functools
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from family_pairs import matched_pair
from workbench.checkpoints import CheckpointError, load_vision_weights, read_vision_config, resolve_config
from workbench.families.gemma3 import pan_and_scan_crops, reference_class
from workbench.families.pixtral import image_rows, pixel_images
from workbench.floors import tower_flops
from workbench.reference import hf_embeddings, hf_vision_model, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower
from workbench.towers.common import budget_padding
from workbench.towers.metadata import merge_block_positions

from test_families import max_err

TINY, REAL = "tiny-gemma3", "gemma-3-27b"
FP32_TOL = 1e-5
# LayerNorm scales drawn around 1; Gemma's RMSNorm stores its scale as an offset from 1 (drawn around 0)
UNIT_WEIGHTS = ("layer_norm1.weight", "layer_norm2.weight", "post_layernorm.weight")


def randomize(model, seed):
    """Fresh checkpoint-like weights: LayerNorm scales around 1, everything else N(0, 0.05)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * r if name.endswith(UNIT_WEIGHTS) else 0.05 * r)
    return model


matched_towers = functools.partial(matched_pair, randomize=randomize)



# ---- faithful: transformers' SiglipVisionModel + Gemma3MultiModalProjector ----------------------------

def test_tower_matches_transformers_on_photos_several_images_and_video_frames(photos, seed):
    """Three photos and a 3-frame video (three images of one size to transformers): each resized to
    224 x 224, 16 tokens."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, ours = matched_towers(cfg, seed)
    items = [photos["chelsea"], photos["rocket"], photos["coffee"], wb.Video(wb.sample_video(3, size=(84, 140)))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert batch.grid_thw.tolist() == [[1, 16, 16]] * 3 + [[3, 16, 16]]
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
        parts = [ours(item.pixels, item.grid_thw) for item in batch.split()]
    assert out.shape == ref.shape == (batch.n_rows // 16, cfg.out_hidden) == (6 * 16, 48)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL
    for one, sl in zip(parts, batch.item_slices):       # no attention across items
        assert rel_err(one, out[sl.start // 16: sl.stop // 16]) < 1e-6


@pytest.mark.slow
def test_the_published_width_at_reduced_depth_matches_transformers(photos, seed):
    """SigLIP-So400m's width at 896 px (4096 patches, 256 tokens), two blocks."""
    cfg = wb.VisionConfig.preset(REAL).reduced(2)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["coffee"]], cfg, normalize=True)
    assert batch.grid_thw.tolist() == [[1, 64, 64]]
    with torch.no_grad():
        out, ref = ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)
    assert out.shape == (256, 5376)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


def test_rows_are_merge_blocks_of_sixteen_and_tokens_the_pooled_raster(seed):
    """merge_size 4: each 4 x 4 block of patches is 16 consecutive rows, blocks in raster order; the
    projector's pool over them equals AvgPool2d(4) over the patch grid, token t = block (t // 4, t % 4)."""
    cfg = wb.VisionConfig.preset(TINY)
    pos = merge_block_positions([(1, 16, 16)], cfg.merge_size)
    assert pos[:16].tolist() == [[r, c] for r in range(4) for c in range(4)]
    assert pos[16:32].tolist() == [[r, c] for r in range(4) for c in range(4, 8)]
    blocks = pos.view(16, 16, 2).div(4, rounding_mode="floor")
    assert (blocks == blocks[:, :1]).all() and blocks[:, 0].tolist() == [[t // 4, t % 4] for t in range(16)]
    image = torch.randn(3, 224, 224, dtype=torch.float64)
    rows, grid = image_rows(image, 14, 4)
    assert torch.equal(grid, torch.tensor([[1, 16, 16]])) and torch.equal(pixel_images(rows, grid, 14, 4)[0], image)
    x = torch.randn(256, 8, dtype=torch.float64)            # one feature row per patch, in merge-block order
    pooled = torch.nn.functional.avg_pool2d(_grid_of(x, pos).permute(2, 0, 1), 4).flatten(1).T   # [16 tokens, 8]
    assert torch.allclose(pooled, x.view(16, 16, 8).mean(1), atol=1e-12)


def _grid_of(x, pos):
    """[rows, c] in merge-block order -> [16, 16, c] laid out by each row's (row, col)."""
    out = torch.empty(16, 16, x.shape[1], dtype=x.dtype)
    out[pos[:, 0], pos[:, 1]] = x
    return out


def test_the_published_config_maps_both_ways():
    """gemma-3-4b / 12b / 27b share SigLIP-So400m at 896 (its config as the checkpoints carry it); to_hf and
    from_hf_config read each other back; the parameter count is that of transformers' modules."""
    for name, out in (("gemma-3-4b", 2560), ("gemma-3-12b", 3840), ("gemma-3-27b", 5376)):
        cfg = wb.VisionConfig.preset(name)
        assert (cfg.depth, cfg.width, cfg.heads, cfg.mlp_hidden, cfg.patch_size, cfg.out_hidden) == (27, 1152, 16, 4304,
                                                                                                   14, out)
        assert (cfg.num_position_embeddings, cfg.merge_size, cfg.eps, cfg.patch_dim) == (4096, 4, 1e-6, 588)
        assert cfg.min_pixels == cfg.max_pixels == 896 * 896 and cfg.image_mean == cfg.image_std == (0.5,) * 3
        hf = cfg.to_hf()
        vc = hf.vision_config
        assert (vc.image_size, vc.layer_norm_eps, vc.hidden_act, vc.vision_use_head) == (896, 1e-6, "gelu_pytorch_tanh",
                                                                                        False)
        assert (hf.mm_tokens_per_image, hf.text_config.hidden_size) == (256, out)
        fields = cfg.spec.from_hf_config(hf.to_dict())
        assert fields == {k: getattr(cfg, k) for k in fields}
        with torch.device("meta"):
            assert cfg.n_params == sum(p.numel() for p in hf_vision_model(cfg).parameters())
    assert 0.41e9 < wb.VisionConfig.preset("gemma-3-4b").n_params < 0.43e9     # SigLIP-So400m and the projector
    tiny = wb.VisionConfig.preset(TINY)
    assert tiny.n_params == sum(p.numel() for p in hf_vision_model(tiny).parameters())
    sd = build_tower(tiny).state_dict()
    assert tiny.n_params == sum(v.numel() for k, v in sd.items() if not k.startswith("input_norm."))
    assert cfg.spec.resample == "bilinear" and cfg.spec.vllm_placement == "tower" and cfg.spec.vllm_encoder_graphs
    assert cfg.spec.study_presets == (None, None)


@pytest.mark.parametrize("change, match", [
    (dict(temporal_patch_size=2), r"temporal_patch_size=2: the gemma3 tower has no use for it"),
    (dict(merge_size=3), r"merge_size=3: the projector pools the 16 x 16 patch grid .* it must divide 16"),
    (dict(min_pixels=112 * 112), r"min_pixels=12544, max_pixels=50176: the gemma3 processor resizes every image "
                                 r"to 224 x 224"),
    (dict(num_position_embeddings=60), r"num_position_embeddings=60 must be a positive square"),
    (dict(rope_theta=1e4 + 1), r"rope_theta=10001.0: the gemma3 tower has no use for it"),
])
def test_a_config_the_tower_cannot_run_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(wb.VisionConfig.preset(TINY), **change)


def test_the_flop_model_counts_the_matmuls_the_tower_runs():
    """floors.tower_flops against torch's count of one forward (SDPA's math path): the patch embedding, every
    block's qkv, out_proj, fc1, fc2 per row, the projection per token; the pool and the position gather are
    no matmuls."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, fused=False).init_random(0).eval()
    grid = torch.tensor([[1, 16, 16]])
    x = torch.randn(256, cfg.patch_dim)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        tower(x, grid)
    counts = counter.get_flop_counts()["Global"]
    matmul = sum(v for k, v in counts.items() if str(k).split(".")[1] in ("mm", "addmm"))
    attention = sum(v for k, v in counts.items() if str(k).split(".")[1] == "bmm")
    model = tower_flops(cfg, [256])
    assert (matmul, attention) == (model["matmul"], model["attention_full"])


def test_bf16_tower_is_close_to_float64(photos, seed):
    cfg = wb.VisionConfig.preset(TINY)
    t64 = build_tower(cfg).init_random(seed).double().eval()
    t16 = build_tower(cfg).init_random(seed).to(torch.bfloat16).eval()
    batch = wb.preprocess([photos["chelsea"], photos["rocket"]], cfg, normalize=True)
    with torch.no_grad():
        ref = t64(batch.pixels.double(), batch.grid_thw)
        out = t16(batch.pixels, batch.grid_thw)
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < 3e-2


def test_fused_kernels_match_the_plain_twin(seed):
    """The fused path (Triton, here under the interpreter): the blocks' LayerNorm residual sums, the
    GELU(tanh) MLP, the last sum in post_layernorm's kernel; no rotary to fuse."""
    cfg = wb.VisionConfig.preset(TINY)
    plain = build_tower(cfg, fused=False, attn_backend="masked").init_random(seed).eval()
    fused = build_tower(cfg, fused=True, attn_backend="masked").init_random(seed).eval()
    grid = torch.tensor([[1, 16, 16], [1, 8, 12]])
    x = torch.randn(int(grid.prod(1).sum()), cfg.patch_dim)
    with torch.no_grad():
        assert rel_err(fused(x, grid), plain(x, grid)) < 1e-5


def test_device_norm_in_tower_matches_the_processor_normalized_reference(photos, seed):
    """vLLM's placement: uint8 rows normalized by the tower's first op."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, _ = matched_towers(cfg, seed)
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=None)
    enc.visual.load_hf_state_dict(hf.state_dict())
    items = [photos["grace_hopper"], photos["rocket"]]
    raw = wb.preprocess(items, cfg)
    ref = hf_embeddings(hf, wb.preprocess(items, cfg, normalize=True).pixels, raw.grid_thw)
    assert raw.pixels.dtype == torch.uint8 and rel_err(enc.encode(raw), ref) < FP32_TOL


def test_torch_state_dict_round_trip_speaks_the_checkpoints_names(seed):
    """state_dict() holds transformers' names and shapes (q, k, v weights and biases as views of the fused
    qkv); torch's load_state_dict takes them back."""
    cfg = wb.VisionConfig.preset(TINY)
    a, b = (build_tower(cfg).init_random(s) for s in (seed, seed + 1))
    theirs = {k: tuple(v.shape) for k, v in hf_vision_model(cfg).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in a.state_dict().items()} == theirs
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


# ---- graph-safe: host metadata, padding, the runner ---------------------------------------------------

@pytest.mark.parametrize("backend", ["loop", "masked"])
def test_padded_metadata_gives_the_same_valid_tokens(backend, seed):
    """Rows padded with NaN, sequence slots with repeated tails, the position gather of padding rows:
    the items' tokens equal eager; no rotary (zero-width tables)."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, attn_backend=backend).init_random(seed).eval()
    grid = torch.tensor([[1, 16, 16], [2, 16, 16], [1, 8, 12]])
    n, pad = int(grid.prod(1).sum()), 64
    x = torch.randn(n, cfg.patch_dim)
    with torch.no_grad():
        ref = tower(x, grid)
        meta = tower.prepare(grid, **budget_padding(cfg, (n + pad) // 16, 8))
        assert meta.cu_seqlens.tolist()[:5] == [0, 256, 512, 768, 864] and meta.cos.shape == (n + pad, 0)
        assert meta.pos_index.shape == (n + pad, 1) and not meta.pos_index[n:].any()
        out = tower.forward_prepared(torch.cat([x, torch.full((pad, cfg.patch_dim), float("nan"))]), meta)
    assert ref.shape == (n // 16, cfg.out_hidden) and out.shape == ((n + pad) // 16, cfg.out_hidden)
    assert torch.isfinite(out[: n // 16]).all() and rel_err(out[: n // 16], ref) < 1e-6


def test_positions_are_the_tables_entries_at_each_patch(seed):
    """Each row adds the table entry of its (row, col): the native grid reads every entry once; a grid the
    processor never makes (the runner's capture grid) reads its coordinates clamped to the table."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg).init_random(seed)
    index = tower.prepare(torch.tensor([[1, 16, 16]])).pos_index[:, 0]
    pos = merge_block_positions([(1, 16, 16)], 4)
    assert torch.equal(index, pos[:, 0] * 16 + pos[:, 1]) and sorted(index.tolist()) == list(range(256))
    wide = tower.prepare(torch.tensor([[1, 4, 40]])).pos_index[:, 0]
    rows, cols = wide // 16, wide % 16
    assert int(rows.max()) == 3 and int(cols.max()) == 15 and int((cols == 15).sum()) == 4 * (40 - 15)


def test_metadata_copied_into_captured_buffers_replays_any_grid(seed):
    """What a graph runner does: metadata prepared once for the capture (a grid filling the budget, wider
    than the table), then each batch's copied into the same tensors; forward_prepared on those buffers equals
    eager."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, attn_backend="masked").init_random(seed).eval()
    budget, items = 64, 4
    static = tower.prepare_capture(budget, items)
    buffers = {k: v.data_ptr() for k, v in static.tensors().items()}
    pixels = torch.zeros(budget * cfg.merge_unit, cfg.patch_dim)
    for grid in ([[1, 16, 16], [1, 16, 16]], [[3, 16, 16]], [[1, 16, 16], [1, 4, 8]]):
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
        assert rel_err(out[: n // 16], ref) < 1e-6


@pytest.fixture(scope="module")
def items():
    """Five images (a 2-frame video among them: two images of one size), 16 tokens each at the tiny preset."""
    p = wb.sample_images()
    return [p["chelsea"], p["coffee"].resize((150, 100)), wb.Video(wb.sample_video(2, size=(56, 84))), p["rocket"]]


BUDGETS = [16, 24, 40]


@pytest.mark.parametrize("placement, buffer_dtype", [
    ("tower", torch.uint8),          # vLLM's placement for Gemma-3
    *(pytest.param(p, d, marks=pytest.mark.slow) for p, d in (("fold", torch.uint8), ("device", torch.float32),
                                                              ("processor", torch.float32), ("runner", torch.float32),
                                                              ("tower", torch.bfloat16)))])
def test_runner_replays_equal_eager_with_padding_several_items_and_a_poisoned_pool(placement, buffer_dtype, items,
                                                                                  seed):
    cfg = wb.VisionConfig.preset(TINY)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    batch = wb.preprocess(items, cfg, normalize=enc.input_kind == "normalized")
    assert [r // 16 for r in batch.item_rows] == [16, 16, 32, 16]
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=buffer_dtype, max_items=2)
    assert runner.backend == "emulated"
    eager = enc.encode(batch)
    clean = enc.encode(batch, path="cudagraph", runner=runner)
    assert clean.shape == eager.shape == (80, cfg.out_hidden) and rel_err(clean, eager) < 1e-8
    st = runner.stats_frame()
    assert (~st.miss).sum() >= 2 and st.padded_rows.sum() > 0
    runner.poison_pool()
    poisoned = runner.encode(batch, pad_value=float("nan") if buffer_dtype.is_floating_point else 255)
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)


def test_outer_placement_is_wrong_under_the_runner_and_tower_and_device_are_right(items, seed):
    cfg = wb.VisionConfig.preset(TINY)
    raw = wb.preprocess(items[:2], cfg)
    encoders = {p: wb.build_encoder(cfg, placement=p, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
                for p in ("outer", "tower", "device")}
    ref = encoders["tower"].encode(raw)
    for placement, enc in encoders.items():
        assert rel_err(enc.encode(raw), ref) < FP32_TOL
        runner = EncoderGraphRunner(enc, budgets=[24, 40], buffer_dtype=torch.float32, max_items=2)
        err = rel_err(enc.encode(raw, path="cudagraph", runner=runner), ref)
        assert err > 0.1 if placement == "outer" else err < 1e-6, placement


@pytest.mark.parametrize("placement", ["none", "double"])
def test_none_and_double_are_wrong_on_every_path(placement, items, seed):
    cfg = wb.VisionConfig.preset(TINY)
    ref = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed,
                           check_inputs=False)
    want = ref.encode(wb.preprocess(items, cfg))
    batch = wb.preprocess(items, cfg, normalize=enc.input_kind == "normalized")     # double: normalized twice
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=torch.float32, max_items=2)
    assert rel_err(enc.encode(batch), want) > 0.1
    assert rel_err(enc.encode(batch, path="cudagraph", runner=runner), want) > 0.1


def test_data_parallel_over_two_gloo_ranks_equals_eager(items):
    from workbench.dp import encode_job
    from workbench.launch import launch
    spec = dict(preset=TINY, placement="tower", norm="eager", dtype=torch.float32, seed=3, images=items)
    results = launch(encode_job, world_size=2, backend="gloo", args=(spec,))
    enc = wb.build_encoder(TINY, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=3)
    ref = enc.encode(wb.preprocess(items, enc.cfg))
    assert ref.shape == (80, 48) and all(r.shape == ref.shape and rel_err(r, ref) < 1e-6 for r in results)


# ---- model folders ----------------------------------------------------------------------------------

def save_gemma3(folder, seed):
    """A tiny Gemma3ForConditionalGeneration (SigLIP 2 x 32 wide at 224 px, 16 tokens an image) with fresh
    weights and its Gemma3ImageProcessorPil saved into ``folder``; returns transformers' image path of it
    (SiglipGemma3Vision sharing the model's modules)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    config = Gemma3Config(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=2, patch_size=14, image_size=224, vision_use_head=False),
        text_config=dict(model_type="gemma3_text", hidden_size=40, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=300),
        mm_tokens_per_image=16, boi_token_index=297, eoi_token_index=298, image_token_index=299)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    ref = reference_class()(config)
    ref.vision_tower, ref.multi_modal_projector = model.model.vision_tower, model.model.multi_modal_projector
    randomize(ref, seed)
    model.save_pretrained(folder)
    Gemma3ImageProcessorPil(size={"height": 224, "width": 224}).save_pretrained(folder)
    return ref.eval()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3") / "m"
    return path, save_gemma3(path, seed=5)


@pytest.fixture
def saved(pristine, tmp_path):
    return Path(shutil.copytree(pristine[0], tmp_path / "m"))


@pytest.mark.parametrize("layout", ["saved", "model.", "published"])
def test_a_saved_folder_loads_in_every_key_layout(layout, pristine, saved, photos):
    """save_pretrained (transformers 5) writes vision_tower.* / multi_modal_projector.*; the model's state dict
    in memory says model.vision_tower.* / model.multi_modal_projector.*; the published checkpoints (transformers
    4.50) vision_tower.vision_model.*: a folder in any of them loads, and its language model is never read."""
    from safetensors.torch import load_file, save_file
    sd = load_file(str(saved / "model.safetensors"))
    assert "vision_tower.encoder.layers.0.self_attn.q_proj.bias" in sd
    assert "multi_modal_projector.mm_input_projection_weight" in sd
    rename = {"saved": lambda k: k,
              "model.": lambda k: "model." + k if k.startswith(("vision_tower.", "multi_modal_projector.")) else k,
              "published": lambda k: k.replace("vision_tower.", "vision_tower.vision_model.", 1)}[layout]
    if layout != "saved":
        save_file({rename(k): v for k, v in sd.items()}, str(saved / "model.safetensors"))
    cfg = resolve_config(saved)
    assert cfg.family == "gemma3" and cfg.name == "m"
    assert (cfg.width, cfg.mlp_hidden, cfg.out_hidden, cfg.depth, cfg.heads) == (32, 48, 40, 2, 2)
    assert (cfg.num_position_embeddings, cfg.merge_size, cfg.min_pixels, cfg.max_pixels) == (256, 4, 224 ** 2, 224 ** 2)
    assert cfg.image_mean == cfg.image_std == (0.5,) * 3 and cfg.eps == 1e-6
    tower = load_vision_weights(build_tower(cfg).eval(), saved)
    batch = wb.preprocess([photos["coffee"], photos["rocket"]], cfg, normalize=True)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
    assert rel_err(out, hf_embeddings(pristine[1], batch.pixels, batch.grid_thw)) < FP32_TOL
    enc = wb.build_encoder(saved, placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    assert rel_err(enc.encode(wb.preprocess([photos["coffee"], photos["rocket"]], cfg)), out) < FP32_TOL


def test_the_models_own_state_dict_loads_into_the_tower(pristine, photos):
    """Gemma3ForConditionalGeneration's state dict (model.vision_tower.*, the language model beside it)."""
    from transformers import Gemma3ForConditionalGeneration
    model = Gemma3ForConditionalGeneration.from_pretrained(pristine[0]).eval()
    cfg = resolve_config(pristine[0])
    tower = build_tower(cfg).eval().load_hf_state_dict(model.state_dict())
    batch = wb.preprocess([photos["chelsea"]], cfg, normalize=True)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
        ref = model.model.get_image_features(pixel_values=pixel_images(batch.pixels, batch.grid_thw, 14, 4)[0][None])
    assert rel_err(out, ref.pooler_output[0]) < FP32_TOL


def test_the_folders_processor_cuts_the_rows_wb_preprocess_cuts(saved, photos):
    """The folder's own image processor (AutoImageProcessor) gives our rows' pixels, normalized with the
    folder's constants."""
    from transformers import AutoImageProcessor
    cfg = resolve_config(saved)
    processor = AutoImageProcessor.from_pretrained(saved)
    for name in ("chelsea", "rocket"):
        ours = wb.preprocess([photos[name]], cfg, normalize=True)
        theirs = processor(images=[photos[name]], return_tensors="pt")["pixel_values"][0]
        image = pixel_images(ours.pixels, ours.grid_thw, cfg.patch_size, cfg.merge_size)[0]
        assert image.shape == theirs.shape == (3, 224, 224) and float((image - theirs).abs().max()) < 1e-6, name


def _edit(path, dotted, value):
    data = json.loads(path.read_text())
    *outer, key = dotted.split(".")
    d = data
    for k in outer:
        d = d[k]
    d[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, dotted, value, match", [
    ("config.json", "model_type", "gemma3x", r"model_type 'gemma3x' is not a known family; known families .*"
                                             r"kimi-k2\.5 \(kimi_k25\), gemma3 \(gemma3\)"),
    ("config.json", "vision_config.hidden_act", "gelu", r"hidden_act='gelu': this tower supports only "
                                                        r"'gelu_pytorch_tanh'"),
    ("config.json", "vision_config.vision_use_head", True, r"vision_use_head=True: this tower supports only False"),
    ("config.json", "vision_config.image_size", 230, r"image_size=230 is not a multiple of patch_size=14"),
    ("config.json", "mm_tokens_per_image", 15, r"mm_tokens_per_image=15: .* a square whose side divides 16"),
    ("config.json", "mm_tokens_per_image", 9, r"mm_tokens_per_image=9: .* a square whose side divides 16"),
    ("config.json", "vision_config.layer_norm_eps", "1e-6", r"vision_config\.layer_norm_eps = \"1e-6\" must be a "
                                                            r"finite number > 0"),
    ("preprocessor_config.json", "size", {"height": 448, "width": 448},
     r"preprocessor_config\.json: size=.*the gemma3 tower takes 224 x 224 images"),
    ("preprocessor_config.json", "image_mean", [0.5, 0.5], r"image_mean=\[0\.5, 0\.5\] must hold 3 numbers"),
])
def test_a_folder_the_tower_cannot_run_is_named_before_any_weights_are_read(saved, monkeypatch, file, dotted, value,
                                                                           match):
    import safetensors
    _edit(saved / file, dotted, value)
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **kw: pytest.fail("a tensor file was opened"))
    with pytest.raises(CheckpointError, match=match):
        resolve_config(saved)


def test_a_coarser_pool_reads_as_a_larger_merge(saved):
    """mm_tokens_per_image 4: the 16 x 16 patches pooled 8 x 8 (merge_size 8, 64 rows a token)."""
    _edit(saved / "config.json", "mm_tokens_per_image", 4)
    cfg = read_vision_config(saved)
    assert (cfg.merge_size, cfg.merge_unit) == (8, 64)


# ---- preprocessing: Gemma3ImageProcessorPil ---------------------------------------------------------------

def _processor(raw, size=896):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    return Gemma3ImageProcessorPil(size={"height": size, "width": size},
                                   **(dict(do_rescale=False, do_normalize=False) if raw else {}))


def _their_images(proc, x, **kw):
    if not hasattr(x, "mode"):
        kw["input_data_format"] = "channels_last"
    return proc(images=[x], return_tensors="pt", **kw)


def test_pil_rows_equal_the_gemma3_pil_processor_bit_for_bit(photos):
    """The checkpoints' processor (size 896 x 896, resample 2 = bilinear, mean = std = 0.5, 1/255; the class's
    own defaults but for the size): every image resized to 896 x 896 whatever its shape, larger or smaller,
    photos, RGBA and grey ones, arrays and PIL images alike."""
    cfg = wb.VisionConfig.preset(REAL)
    proc = _processor(raw=True)
    assert tuple(proc.image_mean) == cfg.image_mean and tuple(proc.image_std) == cfg.image_std
    assert proc.rescale_factor == cfg.rescale_factor and proc.resample == 2
    rng = np.random.default_rng(7)
    odd = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((61, 97), (20, 30), (900, 45), (1700, 2400))]
    for x in [photos["rocket"], photos["chelsea"], photos["coffee"].convert("RGBA"), photos["coffee"].convert("L"),
              *odd]:
        ours = wb.preprocess(x, cfg)
        theirs = _their_images(proc, x)["pixel_values"]
        assert ours.grid_thw.tolist() == [[1, 64, 64]] and theirs.shape == (1, 3, 896, 896)
        assert torch.equal(pixel_images(ours.pixels, ours.grid_thw, 14, 4)[0], theirs[0])
        rows, grid = image_rows(theirs[0], 14, 4)           # the GPU host's tool compares so
        assert torch.equal(grid, ours.grid_thw) and torch.equal(rows, ours.pixels)
    for x in (photos["rocket"], odd[0]):
        normalized = wb.preprocess(x, cfg, normalize=True)
        ref = _their_images(_processor(raw=False), x)["pixel_values"][0]
        assert torch.equal(pixel_images(normalized.pixels, normalized.grid_thw, 14, 4)[0], ref)


def test_pan_and_scan_crops_are_the_processors(photos):
    """Gemma-3's pan-and-scan (do_pan_and_scan, Gemma3Processor's settings 256 / 4 / 1.2): the image, then its
    crops, each resized to 896 x 896 as an item of its own, bit for bit; none for an image near square."""
    cfg = wb.VisionConfig.preset(REAL)
    proc = _processor(raw=True)
    kw = dict(do_pan_and_scan=True, pan_and_scan_min_crop_size=256, pan_and_scan_max_num_crops=4,
              pan_and_scan_min_ratio_to_activate=1.2)
    rng = np.random.default_rng(3)
    noise = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((300, 1000), (1001, 299), (200, 900))]
    inputs = [noise[0], noise[1], photos["rocket"], photos["chelsea"], noise[2]]
    crops = []
    for x in inputs:
        theirs = _their_images(proc, x, **kw)
        ours = wb.preprocess(x, cfg, pan_and_scan=True)
        crops.append(int(theirs["num_crops"][0]))
        assert ours.n_items == 1 + crops[-1] and ours.grid_thw.tolist() == [[1, 64, 64]] * ours.n_items
        assert torch.equal(torch.stack(pixel_images(ours.pixels, ours.grid_thw, 14, 4)), theirs["pixel_values"])
    assert crops == [3, 3, 2, 0, 0]          # the 200 x 900 image: crops of 225 < 256 px, none
    tv = wb.preprocess(inputs[0], cfg, pan_and_scan=True, backend="torchvision")
    assert tv.grid_thw.tolist() == [[1, 64, 64]] * 4
    with pytest.raises(ValueError, match=r"pan_and_scan=True: the pixtral processor cuts no crops"):
        wb.preprocess(inputs[0], "tiny-pixtral", pan_and_scan=True)


def test_pan_and_scan_boxes_equal_transformers_on_random_sizes():
    """Our boxes against the crops transformers' pan_and_scan cuts (read back from a marked image)."""
    proc = _processor(raw=True)
    rng = np.random.default_rng(11)
    sizes = [(int(h), int(w)) for h, w in rng.integers(100, 3000, (60, 2))] + [(256, 600), (512, 1023), (600, 257)]
    for h, w in sizes:
        image = np.arange(h * w, dtype=np.int64).reshape(1, h, w)
        got = proc.pan_and_scan(image, 256, 4, 1.2)
        theirs = [(int(c[0, 0, 0]) // w, int(c[0, 0, 0]) % w, int(c[0, -1, -1]) // w + 1, int(c[0, -1, -1]) % w + 1)
                  for c in got]
        assert pan_and_scan_crops(h, w) == theirs, (h, w)


@pytest.mark.parametrize("backend", wb.PREPROCESS_BACKENDS)
def test_every_backend_gives_fixed_size_items(backend, photos):
    """Every backend resizes every image to the preset's fixed size (bilinear: torch's antialiased kernel for
    torchvision and cuda, close to PIL's)."""
    cfg = wb.VisionConfig.preset(TINY)
    batch = wb.preprocess([photos["rocket"], np.zeros((30, 500, 3), np.uint8), wb.Video(wb.sample_video(2))], cfg,
                          backend=backend)
    assert batch.grid_thw.tolist() == [[1, 16, 16], [1, 16, 16], [2, 16, 16]]
    pil = wb.preprocess([photos["rocket"]], cfg)
    diff = (batch.select([0]).pixels.cpu().int() - pil.pixels.int()).abs()
    assert int(diff.max()) <= (0 if backend == "pil" else 8) and float((diff > 1).float().mean()) < 0.05


def test_torchvision_rows_equal_gemma3s_processor(photos):
    """On a host with torchvision (the GPU host): the torchvision backend's rows equal transformers'
    torchvision Gemma3ImageProcessor's on the CPU, pan-and-scan's crops included, and the cuda backend's the
    processor's run on the GPU (``device="cuda"``)."""
    pytest.importorskip("torchvision")
    import transformers
    # the torchvision class: Gemma3ImageProcessorFast before transformers renamed it Gemma3ImageProcessor
    processor = getattr(transformers, "Gemma3ImageProcessorFast", None) or transformers.Gemma3ImageProcessor
    cfg = wb.VisionConfig.preset(REAL)
    raw = processor(size={"height": 896, "width": 896}, do_rescale=False, do_normalize=False)
    rng = np.random.default_rng(7)
    backends = {"torchvision": "cpu", **({"cuda": "cuda"} if torch.cuda.is_available() else {})}
    for x in [photos["rocket"], photos["chelsea"], rng.integers(0, 256, (61, 97, 3), dtype=np.uint8),
              rng.integers(0, 256, (300, 1000, 3), dtype=np.uint8)]:
        for (backend, device), pas in itertools.product(backends.items(), (False, True)):
            theirs = _their_images(raw, x, do_pan_and_scan=pas, pan_and_scan_min_crop_size=256, device=device,
                                   pan_and_scan_max_num_crops=4, pan_and_scan_min_ratio_to_activate=1.2)
            ours = wb.preprocess(x, cfg, backend=backend, pan_and_scan=pas)
            images = torch.stack(pixel_images(ours.pixels.cpu(), ours.grid_thw, 14, 4))
            assert torch.equal(images, theirs["pixel_values"].cpu().to(images.dtype)), (backend, pas)
