"""Gemma-4 (transformers' `Gemma4VisionModel` then `Gemma4MultimodalEmbedder`, model_type gemma4): the tower against
transformers' modules with the same weights on real photos of several sizes in one padded batch, odd grids and
video frames; merge-block rows of 9 (the 3 x 3 pool a mean over 9 consecutive rows); the checkpoint's (ph, pw, C)
patch projection behind the tower's (C, ph, pw) rows; graph safety (padded metadata, captured buffers replaying
any grid, the emulated runner with a NaN-poisoned pool); placement outer_graph (vLLM 0.34's Gemma-4 cell: the
outer model's norm inside the graph forward) right on the eager and graph paths where plain outer is wrong under
graphs; a folder saved by transformers' save_pretrained loading through wb.build_encoder; preprocessing bit for bit
against Gemma4ImageProcessorPil (the aspect-preserving resize, rescale only)."""
import dataclasses
import functools
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from family_pairs import matched_pair
from workbench.checkpoints import CheckpointError, resolve_config
from workbench.families.gemma4 import (SUPPORTED_SOFT_TOKENS, aspect_preserving_size, hf_patches, reference_class,
                                       soft_token_pixels)
from workbench.floors import tower_flops
from workbench.reference import hf_embeddings, hf_vision_model, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower
from workbench.towers.common import budget_padding
from workbench.towers.metadata import merge_block_positions

from test_families import max_err

TINY, REAL = "tiny-gemma4", "gemma-4-e2b"
FP32_TOL = 1e-5


def randomize(model, seed):
    """Fresh checkpoint-like weights: norm scales around 1, everything else N(0, 0.05)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * r if name.endswith("norm.weight") else 0.05 * r)
    return model


matched_towers = functools.partial(matched_pair, randomize=randomize)



# ---- faithful: transformers' Gemma4VisionModel + Gemma4MultimodalEmbedder ------------------------------------

def test_tower_matches_transformers_on_photos_of_several_sizes_and_video_frames(photos, seed):
    """Three photos of three shapes and a 2-frame video: transformers gets them as one batch padded with
    position -1, as its processor pads."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, ours = matched_towers(cfg, seed)
    items = [photos["chelsea"], photos["rocket"].resize((300, 120)), photos["coffee"].resize((90, 200)),
             wb.Video(wb.sample_video(2, size=(70, 70)))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert len(set(map(tuple, batch.grid_thw[:, 1:].tolist()))) == 4 and batch.grid_thw[3, 0] == 2
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
        parts = [ours(item.pixels, item.grid_thw) for item in batch.split()]
    assert out.shape == ref.shape == (batch.n_rows // 9, cfg.out_hidden)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL
    for one, sl in zip(parts, batch.item_slices):       # no attention across items
        assert rel_err(one, out[sl.start // 9: sl.stop // 9]) < 1e-6


@pytest.mark.parametrize("grid", [[[1, 3, 3]], [[1, 6, 21], [1, 30, 3]], [[2, 9, 6]], [[1, 3, 300]]])
def test_odd_grids_match_transformers(grid, seed):
    """One pooled block, extreme aspect ratios, frames; a row of 300 patches reads past the tiny tables' 256
    entries, which transformers does not clamp: the tables are widened to 512 for it."""
    cfg = wb.VisionConfig.preset(TINY)
    if max(max(g[1:]) for g in grid) > cfg.num_position_embeddings:
        cfg = dataclasses.replace(cfg, num_position_embeddings=512)
    hf, ours = matched_towers(cfg, seed)
    grid = torch.tensor(grid)
    pixels = torch.rand(int(grid.prod(1).sum()), cfg.patch_dim, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out, ref = ours(pixels, grid), hf_embeddings(hf, pixels, grid)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


@pytest.mark.slow
def test_the_released_width_at_reduced_depth_matches_transformers(photos, seed):
    """E2B's width (768, 12 heads of 64), two blocks, a photo at 70 soft tokens."""
    cfg = dataclasses.replace(wb.VisionConfig.preset(REAL).reduced(2), max_pixels=soft_token_pixels(70))
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["coffee"]], cfg, normalize=True)
    with torch.no_grad():
        out, ref = ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)
    assert out.shape == (batch.n_rows // 9, 1536)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


def test_rows_are_merge_blocks_of_nine_and_patches_the_checkpoints_order(seed):
    """merge_size 3: each 3 x 3 block is 9 consecutive rows, tokens in the pooled raster order; the state dict's
    input_proj is transformers' (ph, pw, C) layout of the tower's [width, C, P, P] weight."""
    pos = merge_block_positions([(1, 6, 9)], 3)
    assert pos[:9].tolist() == [[r, c] for r in range(3) for c in range(3)]
    assert pos[9:18].tolist() == [[r, c] for r in range(3) for c in range(3, 6)]
    cfg = wb.VisionConfig.preset(TINY)
    hf, ours = matched_towers(cfg, seed)
    w = ours.patch_embed.proj.weight
    assert w.shape == (64, 3, 16, 16)
    theirs = hf.state_dict()["vision_tower.patch_embedder.input_proj.weight"]
    assert torch.equal(w.permute(0, 2, 3, 1).reshape(64, -1), theirs)
    row = torch.rand(1, cfg.patch_dim)                     # one patch as our row and as transformers' patch
    (patch,), _ = hf_patches(row.repeat(9, 1), torch.tensor([[1, 3, 3]]), 16, 3)
    assert torch.allclose(row @ w.reshape(64, -1).T, patch[:1] @ theirs.T, atol=1e-6)


def test_the_released_config_maps_both_ways():
    """gemma-4-e2b as transformers' Gemma4VisionConfig defaults; to_hf and from_hf_config read each other back;
    the parameter count is that of transformers' modules; the engine cell is outer_graph with graphs."""
    cfg = wb.VisionConfig.preset(REAL)
    assert (cfg.depth, cfg.width, cfg.heads, cfg.head_dim, cfg.mlp_hidden, cfg.out_hidden) == (16, 768, 12, 64, 3072,
                                                                                                1536)
    assert (cfg.patch_size, cfg.merge_size, cfg.num_position_embeddings, cfg.rope_theta, cfg.patch_dim) == \
        (16, 3, 10240, 100.0, 768)
    assert cfg.image_mean == (0.0,) * 3 and cfg.image_std == (1.0,) * 3 and cfg.max_pixels == 280 * 9 * 256
    hf = cfg.to_hf()
    vc = hf.vision_config
    from transformers import Gemma4VisionConfig
    default = Gemma4VisionConfig()
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                "patch_size", "pooling_kernel_size", "position_embedding_size", "rms_norm_eps"):
        assert getattr(vc, key) == getattr(default, key), key
    assert hf.text_config.hidden_size == 1536
    fields = cfg.spec.from_hf_config(hf.to_dict())
    assert fields == {k: getattr(cfg, k) for k in fields}
    for name in (REAL, TINY):
        c = wb.VisionConfig.preset(name)
        with torch.device("meta"):
            assert c.n_params == sum(p.numel() for p in hf_vision_model(c).parameters())
    tiny = wb.VisionConfig.preset(TINY)
    assert tiny.n_params == sum(v.numel() for k, v in build_tower(tiny).state_dict().items()
                                if not k.startswith("input_norm."))
    spec = cfg.spec
    assert (spec.vllm_placement, spec.vllm_encoder_graphs, spec.study_presets) == ("outer_graph", True, (None, None))


@pytest.mark.parametrize("change, match", [
    (dict(temporal_patch_size=2), r"temporal_patch_size=2: the gemma4 tower has no use for it"),
    (dict(min_pixels=32 * 32), r"min_pixels=1024: .* one pooled block .* it must be 2304"),
    (dict(num_position_embeddings=0), r"num_position_embeddings=0: the gemma4 tower has a learned position table"),
    (dict(kv_heads=2), r"kv_heads=2: the gemma4 tower has one key/value head per query head"),
])
def test_a_config_the_tower_cannot_run_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(wb.VisionConfig.preset(TINY), **change)


def test_the_flop_model_counts_the_matmuls_the_tower_runs():
    """floors.tower_flops against torch's count of one forward: the patch projection, every block's q, k, v,
    o, gate, up and down per row, the embedder's projection per token; the pool is no matmul."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, attn_backend="loop").init_random(0).eval()
    grid = torch.tensor([[1, 6, 9]])
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        tower(torch.rand(54, cfg.patch_dim), grid)
    counts = counter.get_flop_counts()["Global"]
    matmul = sum(v for k, v in counts.items() if str(k).split(".")[1] in ("mm", "addmm"))
    attention = sum(v for k, v in counts.items() if str(k).split(".")[1] == "bmm")
    model = tower_flops(cfg, [54])
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


def test_fused_kernels_are_refused_and_auto_runs_plain_ops():
    cfg = wb.VisionConfig.preset(TINY)
    with pytest.raises(ValueError, match=r"the gemma4 tower has no fused kernels"):
        build_tower(cfg, fused=True)
    assert build_tower(cfg, fused="auto").kernels.fused is False


@pytest.mark.parametrize("placement", ["tower", "outer", "outer_graph", "fold", "device", "runner"])
def test_every_uint8_placement_matches_the_processor_normalized_reference_eagerly(placement, photos, seed):
    """The device norm x / 255 (mean 0, std 1), then the model's own 2 * (x - 0.5); fold folds both."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, _ = matched_towers(cfg, seed)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=None)
    enc.visual.load_hf_state_dict(hf.state_dict())
    items = [photos["grace_hopper"], photos["rocket"]]
    raw = wb.preprocess(items, cfg)
    ref = hf_embeddings(hf, wb.preprocess(items, cfg, normalize=True).pixels, raw.grid_thw)
    assert raw.pixels.dtype == torch.uint8 and rel_err(enc.encode(raw), ref) < FP32_TOL


def test_torch_state_dict_round_trip_speaks_the_checkpoints_names(seed):
    """state_dict() holds transformers' names and shapes (q, k, v as views of the fused qkv, the patch projection
    in the checkpoint's order); torch's load_state_dict takes them back."""
    cfg = wb.VisionConfig.preset(TINY)
    a, b = (build_tower(cfg).init_random(s) for s in (seed, seed + 1))
    theirs = {k: tuple(v.shape) for k, v in hf_vision_model(cfg).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in a.state_dict().items()} == theirs
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match=r"state dict does not fit: missing from the checkpoint: .*input_proj"):
        b.load_hf_state_dict({k: v for k, v in a.state_dict().items() if "input_proj" not in k})


# ---- graph-safe: host metadata, padding, the runner ---------------------------------------------------------

@pytest.mark.parametrize("backend", ["loop", "masked"])
def test_padded_metadata_gives_the_same_valid_tokens(backend, seed):
    """Rows padded with NaN, sequence slots with repeated tails, padding rows at position 0 and angle 0."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, attn_backend=backend).init_random(seed).eval()
    grid = torch.tensor([[1, 6, 9], [2, 3, 3], [1, 9, 3]])
    n, pad = int(grid.prod(1).sum()), 36
    x = torch.rand(n, cfg.patch_dim)
    with torch.no_grad():
        ref = tower(x, grid)
        meta = tower.prepare(grid, **budget_padding(cfg, (n + pad) // 9, 8))
        assert meta.cu_seqlens.tolist()[:6] == [0, 54, 63, 72, 99, 99] and meta.cos.shape == (n + pad, 16)
        assert not meta.pos_index[n:].any() and (meta.cos[n:] == 1).all() and not meta.sin[n:].any()
        out = tower.forward_prepared(torch.cat([x, torch.full((pad, cfg.patch_dim), float("nan"))]), meta)
    assert ref.shape == (n // 9, cfg.out_hidden) and out.shape == ((n + pad) // 9, cfg.out_hidden)
    assert torch.isfinite(out[: n // 9]).all() and rel_err(out[: n // 9], ref) < 1e-6


def test_metadata_copied_into_captured_buffers_replays_any_grid(seed):
    """Metadata prepared once for a capture (a grid filling the budget, wider than the tables: clamped), then each
    batch's copied into the same tensors; forward_prepared on those buffers equals eager."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg).init_random(seed).eval()
    budget = 120
    static = tower.prepare_capture(budget, 4)
    assert int(static.pos_index[:, 0].max()) == cfg.num_position_embeddings - 1   # 360 columns, table of 256
    buf = torch.zeros(budget * 9, cfg.patch_dim)
    for grid in ([[1, 18, 30]], [[1, 3, 3], [2, 9, 12]], [[1, 30, 18], [1, 6, 3]]):
        grid = torch.tensor(grid)
        n = int(grid.prod(1).sum())
        x = torch.rand(n, cfg.patch_dim)
        static.copy_(tower.prepare(grid, **budget_padding(cfg, budget, 4)))
        buf.zero_()
        buf[:n] = x
        with torch.no_grad():
            assert rel_err(tower.forward_prepared(buf, static)[: n // 9], tower(x, grid)) < 1e-6


@pytest.fixture(scope="module")
def items():
    """Four items of four sizes at the tiny preset, a 2-frame video among them."""
    p = wb.sample_images()
    return [p["chelsea"], p["coffee"].resize((150, 100)), wb.Video(wb.sample_video(2, size=(56, 84))),
            p["rocket"].resize((200, 60))]


@pytest.mark.parametrize("placement, buffer_dtype", [
    ("outer_graph", torch.uint8),        # vLLM 0.34's placement for Gemma-4
    ("tower", torch.uint8),
    *(pytest.param(p, d, marks=pytest.mark.slow) for p, d in (("fold", torch.uint8), ("outer_graph", torch.bfloat16),
                                                              ("processor", torch.float32),
                                                              ("runner", torch.float32)))])
def test_runner_replays_equal_eager_with_padding_several_items_and_a_poisoned_pool(placement, buffer_dtype, items,
                                                                                  seed):
    cfg = wb.VisionConfig.preset(TINY)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    batch = wb.preprocess(items, cfg, normalize=enc.input_kind == "normalized")
    runner = EncoderGraphRunner(enc, budgets=[40, 80, 160], buffer_dtype=buffer_dtype, max_items=2)
    assert runner.backend == "emulated"
    eager = enc.encode(batch)
    clean = enc.encode(batch, path="cudagraph", runner=runner)
    assert clean.shape == eager.shape == (batch.n_rows // 9, cfg.out_hidden) and rel_err(clean, eager) < 1e-6
    st = runner.stats_frame()
    assert (~st.miss).sum() >= 2 and st.padded_rows.sum() > 0
    runner.poison_pool()
    poisoned = runner.encode(batch, pad_value=float("nan") if buffer_dtype.is_floating_point else 255)
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)


@pytest.mark.parametrize("preset", [TINY, "tiny-qwen2-vl"])
def test_outer_graph_is_right_under_the_runner_where_outer_is_wrong(preset, items, seed):
    """The outer model's norm inside the helper its graph forward calls (outer_graph) reaches the graph path; the
    norm before the tower call on the eager path only (outer) does not: eager equal for both, graphs not."""
    cfg = wb.VisionConfig.preset(preset)
    raw = wb.preprocess(items[:2], cfg)
    encoders = {p: wb.build_encoder(cfg, placement=p, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
                for p in ("outer", "outer_graph", "tower")}
    ref = encoders["tower"].encode(raw)
    for placement, enc in encoders.items():
        assert rel_err(enc.encode(raw), ref) < 1e-6, placement
        runner = EncoderGraphRunner(enc, budgets=[64, 128], buffer_dtype=torch.uint8, max_items=2)
        err = rel_err(enc.encode(raw, path="cudagraph", runner=runner), ref)
        assert err > 0.1 if placement == "outer" else err < 1e-6, placement
    assert encoders["outer_graph"].graph_norm is encoders["outer_graph"].outer_norm is not None
    assert encoders["outer"].graph_norm is None


@pytest.mark.slow
def test_the_correctness_study_judges_vllms_gemma4_cell_right_and_outer_wrong_under_graphs():
    """The study's cells of tiny-gemma4: outer_graph (vLLM 0.34's own cell, framed) right on eager and the graph
    runner, outer wrong only under it."""
    from workbench.studies.correctness import run, summary
    table = run(device="cpu", progress=False, families=[TINY], norms=["eager"], paths=["eager", "cudagraph"],
                placements=["outer", "outer_graph", "tower"], buffer_dtypes=["uint8"], hazard=False)
    ok = table[table.metric == "ok"].groupby(["placement", "path"]).value.min()
    assert ok.to_dict() == {("outer", "cudagraph"): 0.0, ("outer", "eager"): 1.0, ("outer_graph", "cudagraph"): 1.0,
                            ("outer_graph", "eager"): 1.0, ("tower", "cudagraph"): 1.0, ("tower", "eager"): 1.0}
    text = summary.findings(table)
    assert "gemma4 (outer_graph, eager and encoder graphs): right" in text
    assert "right on every path: outer_graph, tower" in text


# ---- model folders --------------------------------------------------------------------------------------------

FOLDER_CFG = dataclasses.replace(wb.VisionConfig.preset(TINY), name="folder", width=32, heads=2, mlp_hidden=48,
                                 out_hidden=40, num_position_embeddings=128)


def save_gemma4(folder, seed):
    """A tiny Gemma4ForConditionalGeneration (vision 2 x 32 wide, a one-layer text model) with fresh weights and its
    Gemma4ImageProcessorPil (70 soft tokens) saved into ``folder``; returns transformers' image path of it
    (Gemma4VisionEmbedder sharing the model's modules)."""
    from transformers import Gemma4ForConditionalGeneration
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    config = FOLDER_CFG.to_hf()
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config).eval()
    ref = reference_class()(config)
    ref.vision_tower, ref.embed_vision = model.model.vision_tower, model.model.embed_vision
    randomize(ref, seed)
    model.save_pretrained(folder)
    Gemma4ImageProcessorPil(max_soft_tokens=70).save_pretrained(folder)
    return ref.eval()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4") / "m"
    return path, save_gemma4(path, seed=5)


@pytest.fixture
def saved(pristine, tmp_path):
    return Path(shutil.copytree(pristine[0], tmp_path / "m"))


def test_a_saved_folder_loads_through_build_encoder(pristine, photos):
    """save_pretrained writes model.vision_tower.* / model.embed_vision.* beside the language model; the folder's
    processor says do_normalize false (mean 0, std 1) and 70 soft tokens: wb.build_encoder(folder) equals
    transformers' image path, outer_graph and tower alike."""
    from safetensors.torch import load_file
    assert "model.vision_tower.patch_embedder.input_proj.weight" in load_file(str(pristine[0] / "model.safetensors"))
    cfg = resolve_config(pristine[0])
    assert cfg.family == "gemma4" and cfg.name == "m"
    assert {k: getattr(cfg, k) for k in ("width", "heads", "mlp_hidden", "out_hidden", "num_position_embeddings",
                                         "merge_size", "max_pixels", "image_mean", "image_std")} == \
        {k: getattr(FOLDER_CFG, k) for k in ("width", "heads", "mlp_hidden", "out_hidden", "num_position_embeddings",
                                             "merge_size", "max_pixels", "image_mean", "image_std")}
    images = [photos["coffee"], photos["rocket"].resize((260, 90))]
    ref = hf_embeddings(pristine[1], wb.preprocess(images, cfg, normalize=True).pixels,
                        wb.preprocess(images, cfg).grid_thw)
    for placement in ("outer_graph", "tower"):
        enc = wb.build_encoder(pristine[0], placement=placement, norm="eager", dtype=torch.float32, device="cpu")
        assert rel_err(enc.encode(wb.preprocess(images, cfg)), ref) < FP32_TOL, placement


def test_the_models_own_state_dict_loads_into_the_tower(pristine, photos):
    """Gemma4ForConditionalGeneration's state dict (model.vision_tower.*, the language model beside it), against
    the model's own get_image_features."""
    from transformers import Gemma4ForConditionalGeneration
    model = Gemma4ForConditionalGeneration.from_pretrained(pristine[0]).eval()
    cfg = resolve_config(pristine[0])
    tower = build_tower(cfg).eval().load_hf_state_dict(model.state_dict())
    batch = wb.preprocess([photos["chelsea"]], cfg, normalize=True)
    (patches,), (xy,) = hf_patches(batch.pixels, batch.grid_thw, 16, 3)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
        ref = model.model.get_image_features(pixel_values=patches[None], image_position_ids=xy[None])
    assert rel_err(out, ref.pooler_output[0]) < FP32_TOL


def test_the_folders_processor_cuts_the_rows_wb_preprocess_cuts(saved, photos):
    from transformers import AutoImageProcessor
    cfg = resolve_config(saved)
    processor = AutoImageProcessor.from_pretrained(saved, backend="pil")
    for name in ("chelsea", "rocket"):
        ours = wb.preprocess([photos[name]], cfg, normalize=True)
        theirs = processor(images=[photos[name]], return_tensors="pt")
        (patches,), (xy,) = hf_patches(ours.pixels, ours.grid_thw, 16, 3)
        n = patches.shape[0]
        assert n == 9 * int(theirs["num_soft_tokens_per_image"][0]) <= 630, name
        assert torch.equal(theirs["pixel_values"][0, :n], patches)
        assert torch.equal(theirs["image_position_ids"][0, :n], xy)


def _edit(path, dotted, value):
    import json
    data = json.loads(path.read_text())
    *outer, key = dotted.split(".")
    d = data
    for k in outer:
        d = d[k]
    d[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, dotted, value, match", [
    ("config.json", "vision_config.use_clipped_linears", True, r"use_clipped_linears=true: this tower supports only"),
    ("config.json", "vision_config.standardize", True, r"standardize=true: this tower supports only false"),
    ("config.json", "vision_config.num_key_value_heads", 1, r"num_key_value_heads=1: .* one key/value head per"),
    ("config.json", "vision_config.hidden_activation", "gelu", r"hidden_activation='gelu': this tower supports only"),
    ("config.json", "vision_config.head_dim", 8, r"head_dim=8: the gemma4 tower takes hidden_size / num_attention"),
    ("preprocessor_config.json", "pooling_kernel_size", 2, r"pooling_kernel_size=2 disagrees with config\.json"),
    ("preprocessor_config.json", "do_rescale", False, r"do_rescale false"),
])
def test_a_folder_the_tower_cannot_run_is_named_before_any_weights_are_read(saved, monkeypatch, file, dotted, value,
                                                                           match):
    import safetensors
    _edit(saved / file, dotted, value)
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **kw: pytest.fail("a tensor file was opened"))
    with pytest.raises(CheckpointError, match=match):
        resolve_config(saved)


# ---- preprocessing: Gemma4ImageProcessorPil ----------------------------------------------------------------------

def _their_patches(proc, x):
    kw = {} if hasattr(x, "mode") else dict(input_data_format="channels_last")
    return proc(images=[x], return_tensors="pt", **kw)


def test_pil_rows_equal_the_gemma4_pil_processor_bit_for_bit(photos):
    """The class's defaults (280 soft tokens, bicubic, 1/255, no normalization): every shipped photo, RGBA and grey
    ones, and random arrays of odd, tiny, huge and extreme shapes; our uint8 rows are its patches times 255, our
    normalized rows its float32 values, the positions and the padding its own."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    cfg = wb.VisionConfig.preset(REAL)
    proc = Gemma4ImageProcessorPil()
    assert (proc.do_normalize, tuple(proc.image_mean), tuple(proc.image_std), proc.rescale_factor, proc.resample) == \
        (False, cfg.image_mean, cfg.image_std, cfg.rescale_factor, 3)
    rng = np.random.default_rng(7)
    odd = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
           for h, w in ((61, 97), (20, 30), (900, 45), (1700, 2400), (48, 4000), (5000, 40), (672, 960))]
    for x in [*photos.values(), photos["coffee"].convert("RGBA"), photos["coffee"].convert("L"), *odd]:
        theirs = _their_patches(proc, x)
        ours, normalized = wb.preprocess(x, cfg), wb.preprocess(x, cfg, normalize=True)
        (rows,), (xy,) = hf_patches(ours.pixels, ours.grid_thw, 16, 3)
        (floats,), _ = hf_patches(normalized.pixels, normalized.grid_thw, 16, 3)
        n, pv, pos = rows.shape[0], theirs["pixel_values"][0], theirs["image_position_ids"][0]
        assert n == 9 * int(theirs["num_soft_tokens_per_image"][0]) <= 2520 and pv.shape == (2520, 768)
        assert torch.equal(pv[:n], floats) and torch.equal((pv[:n] * 255).round().to(torch.uint8), rows)
        assert torch.equal(pos[:n], xy) and (pos[n:] == -1).all() and not pv[n:].any()


def test_the_resize_rule_equals_transformers_on_random_sizes():
    """`aspect_preserving_size` against transformers' get_aspect_ratio_preserving_size for every supported soft
    token count, sizes from 1 px to very wide, errors included."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size
    rng = np.random.default_rng(11)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 5000, (80, 2))] + [(1, 1), (10, 3000), (3000, 10), (48, 48),
                                                                                (1, 100000)]
    for tokens in SUPPORTED_SOFT_TOKENS:
        for h, w in sizes:
            def call(f):
                try:
                    return f(height=h, width=w, patch_size=16, max_patches=tokens * 9, pooling_kernel_size=3)
                except ValueError:
                    return "refused"
            theirs = call(get_aspect_ratio_preserving_size)
            ours = call(lambda height, width, patch_size, max_patches, pooling_kernel_size:
                        aspect_preserving_size(height, width, patch_size, max_patches, pooling_kernel_size))
            assert ours == theirs, (tokens, h, w)


@pytest.mark.parametrize("backend", wb.PREPROCESS_BACKENDS)
def test_every_backend_gives_the_processors_sizes(backend, photos):
    """Every backend sizes images by the aspect-preserving rule (bicubic: torch's antialiased kernel for
    torchvision and cuda, close to PIL's), video frames at 70 soft tokens."""
    cfg = wb.VisionConfig.preset(REAL)
    batch = wb.preprocess([photos["rocket"], np.zeros((30, 500, 3), np.uint8), wb.Video(wb.sample_video(2))], cfg,
                          backend=backend)
    want = [(1, *(s // 16 for s in aspect_preserving_size(h, w, 16, 2520, 3))) for h, w in ((427, 640), (30, 500))]
    video = wb.sample_video(2)
    vh, vw = video.shape[1:3] if hasattr(video, "shape") else np.asarray(video[0]).shape[:2]
    want.append((2, *(s // 16 for s in aspect_preserving_size(vh, vw, 16, 630, 3))))
    assert [tuple(g) for g in batch.grid_thw.tolist()] == want
    assert math.prod(want[2][1:]) <= 630
    pil = wb.preprocess([photos["rocket"]], cfg)
    diff = (batch.select([0]).pixels.cpu().int() - pil.pixels.int()).abs()
    # the cuda backend resizes in float32 (on the CPU here): bicubic's overshoot rounds a few levels apart
    assert int(diff.max()) <= {"pil": 0, "torchvision": 8}.get(backend, 16) and float((diff > 1).float().mean()) < 0.05


def test_torchvision_rows_equal_gemma4s_processor(photos):
    """On a host with torchvision (the GPU host): the torchvision backend's rows equal transformers' torchvision
    Gemma4ImageProcessor's on the CPU (uint8 resize with antialiasing, then rescale), and the cuda backend's the
    processor's run on the GPU (``device="cuda"``)."""
    pytest.importorskip("torchvision")
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    cfg = wb.VisionConfig.preset(REAL)
    proc = Gemma4ImageProcessor()
    rng = np.random.default_rng(7)
    backends = {"torchvision": "cpu", **({"cuda": "cuda"} if torch.cuda.is_available() else {})}
    for x in [photos["rocket"], photos["chelsea"], rng.integers(0, 256, (61, 97, 3), dtype=np.uint8),
              rng.integers(0, 256, (300, 1000, 3), dtype=np.uint8)]:
        for backend, device in backends.items():
            kw = {} if hasattr(x, "mode") else dict(input_data_format="channels_last")
            theirs = proc(images=[x], return_tensors="pt", device=device, **kw)
            ours = wb.preprocess(x, cfg, backend=backend)
            (rows,), (xy,) = hf_patches(ours.pixels.cpu(), ours.grid_thw, 16, 3)
            n = rows.shape[0]
            got = (theirs["pixel_values"][0, :n].cpu() * 255).round().to(torch.uint8)
            assert torch.equal(got, rows) and torch.equal(theirs["image_position_ids"][0, :n].cpu(), xy), backend
