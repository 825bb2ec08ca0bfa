"""Nemotron-H Nano VL V2 (RADIO: transformers' `RadioModel`, then the pixel shuffle and the
`NemotronH_Omni_Reasoning_V3MultiModalProjector`, model_type nemotron_h_omni): the tower against transformers'
modules with the same weights on real photos of several sizes in one packed batch and on odd grids (the position
table resampled up, down and not at all); the prefix tokens before every image in an extended sequence that
padding and captured buffers keep fixed; placement outer (vLLM 0.34's cell: the outer model normalizes, no encoder
graphs) right eagerly and wrong on the graph path, where tower and outer_graph are right on both; a folder saved
by transformers' save_pretrained (the released layout, a fused qkv) loading through wb.build_encoder; the
processor's patch-grid rule against transformers' own function."""
import ast
import dataclasses
import functools
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from family_pairs import matched_pair
from workbench.checkpoints import CheckpointError, resolve_config
from workbench.families.nemotron_vl import MAX_PATCHES, MIN_PATCHES, PREFIX_TOKENS, patch_grid_size, reference_class
from workbench.reference import hf_embeddings, hf_vision_model, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower
from workbench.towers.common import budget_padding

from test_families import max_err

TINY, REAL = "tiny-nemotron-vl", "nemotron-nano-vl-v2"
FP32_TOL = 1e-5
# transformers' tensors the tower does not hold (the video projection, the summary's indices, identity LayerScales)
NOT_HELD = ("video_patch_projection", "summary_idxs", "lambda1")


def randomize(model, seed):
    """Fresh checkpoint-like weights: norm scales around 1, LayerScales the identity (C-RADIO has none),
    everything else N(0, 0.05)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("lambda1"):
                p.fill_(1.0)
            else:
                p.copy_(1.0 + 0.1 * r if "norm" in name and name.endswith("weight") else 0.05 * r)
    return model


matched_towers = functools.partial(matched_pair, randomize=randomize)



# ---- faithful: transformers' RadioModel + the projector -------------------------------------------------------

def test_tower_matches_transformers_on_photos_of_several_sizes(photos, seed):
    """Three photos of three shapes packed as transformers packs them (image_grid_hw); each item alone equals
    its part of the batch (no attention across images, prefix tokens per image)."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, ours = matched_towers(cfg, seed)
    items = [photos["chelsea"], photos["rocket"].resize((300, 120)), photos["coffee"].resize((90, 200))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert len(set(map(tuple, batch.grid_thw[:, 1:].tolist()))) == 3
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
        parts = [ours(item.pixels, item.grid_thw) for item in batch.split()]
    assert out.shape == ref.shape == (batch.n_rows // 4, cfg.out_hidden)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL
    for one, sl in zip(parts, batch.item_slices):
        assert rel_err(one, out[sl.start // 4: sl.stop // 4]) < 1e-6


@pytest.mark.parametrize("grid", [[[1, 2, 2]], [[1, 2, 40], [1, 30, 2]], [[1, 16, 16]], [[1, 6, 4], [1, 4, 6]],
                                  [[1, 24, 10]]])
def test_odd_grids_match_transformers(grid, seed):
    """One merge block, extreme aspect ratios, a grid of the table's own side (no resampling), a grid larger than
    the table (resampled up) and several images of one area."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, ours = matched_towers(cfg, seed)
    grid = torch.tensor(grid)
    pixels = torch.rand(int(grid.prod(1).sum()), cfg.patch_dim, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out, ref = ours(pixels, grid), hf_embeddings(hf, pixels, grid)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


@pytest.mark.slow
def test_the_released_width_at_reduced_depth_matches_transformers(photos, seed):
    """RADIO-H's width (1280, 16 heads of 80), its 128 x 128 table, two blocks, a photo at the minimum
    1024 patches."""
    cfg = dataclasses.replace(wb.VisionConfig.preset(REAL).reduced(2), max_pixels=MIN_PATCHES * 256)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["coffee"]], cfg, normalize=True)
    with torch.no_grad():
        out, ref = ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)
    assert out.shape == (batch.n_rows // 4, 4096)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


def test_the_released_config_maps_both_ways():
    """nemotron-nano-vl-v2 as RadioConfig's and the Omni config's defaults; to_hf and from_hf_config read each
    other back; the parameter count is transformers' modules' (less the video projection and the identity
    LayerScales); the engine cell is outer without graphs."""
    from transformers import RadioConfig
    cfg = wb.VisionConfig.preset(REAL)
    assert (cfg.depth, cfg.width, cfg.heads, cfg.head_dim, cfg.mlp_hidden) == (32, 1280, 16, 80, 5120)
    assert (cfg.patch_size, cfg.merge_size, cfg.num_position_embeddings, cfg.merger_hidden, cfg.out_hidden) == \
        (16, 2, 128 * 128, 4096, 4096)
    assert (cfg.min_pixels, cfg.max_pixels) == (1024 * 256, 13312 * 256)
    hf = cfg.to_hf()
    vc, default = hf.vision_config, RadioConfig()
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "mlp_ratio", "patch_size", "max_img_size",
                "num_cls_tokens", "num_registers", "layer_norm_eps", "hidden_act", "qkv_bias", "norm_mean", "norm_std"):
        assert getattr(vc, key) == getattr(default, key), key
    assert tuple(vc.norm_mean) == cfg.image_mean and tuple(vc.norm_std) == cfg.image_std
    assert vc.num_cls_tokens + vc.num_registers == PREFIX_TOKENS
    assert (hf.projector_hidden_size, hf.downsample_ratio, hf.text_config.hidden_size) == (4096, 0.5, 4096)
    fields = cfg.spec.from_hf_config(hf.to_dict())
    assert fields == {k: getattr(cfg, k) for k in fields}
    for name in (REAL, TINY):
        c = wb.VisionConfig.preset(name)
        with torch.device("meta"):
            theirs = hf_vision_model(c).named_parameters()
            assert c.n_params == sum(p.numel() for n, p in theirs if not any(s in n for s in NOT_HELD))
    tiny = wb.VisionConfig.preset(TINY)
    assert tiny.n_params == sum(v.numel() for k, v in build_tower(tiny).state_dict().items()
                                if not k.startswith("input_norm."))
    spec = cfg.spec
    assert (spec.vllm_placement, spec.vllm_encoder_graphs, spec.study_presets) == ("outer", False, (None, None))


@pytest.mark.parametrize("change, match", [
    (dict(temporal_patch_size=2), r"temporal_patch_size=2: the nemotron-vl tower has no use for it"),
    (dict(num_position_embeddings=200), r"num_position_embeddings=200: .* must be a positive square"),
    (dict(merger_hidden=0), r"merger_hidden=0: the projector's hidden width"),
])
def test_a_config_the_tower_cannot_run_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(wb.VisionConfig.preset(TINY), **change)


def test_fused_kernels_are_refused_and_videos_too(photos):
    cfg = wb.VisionConfig.preset(TINY)
    with pytest.raises(ValueError, match=r"the nemotron-vl tower has no fused kernels"):
        build_tower(cfg, fused=True)
    assert build_tower(cfg, fused="auto").kernels.fused is False
    with pytest.raises(ValueError, match=r"takes images only: .*video_patch_projection"):
        wb.preprocess([wb.Video(wb.sample_video(2, size=(64, 64)))], cfg)


@pytest.mark.parametrize("placement", ["tower", "outer", "outer_graph", "fold", "device", "runner"])
def test_every_uint8_placement_matches_the_processor_normalized_reference_eagerly(placement, photos, seed):
    """The CLIP normalization on the device (wherever the placement puts it), against transformers fed the
    processor's normalized values."""
    cfg = wb.VisionConfig.preset(TINY)
    hf, _ = matched_towers(cfg, seed)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=None)
    enc.visual.load_hf_state_dict(hf.state_dict())
    items = [photos["grace_hopper"], photos["rocket"]]
    raw = wb.preprocess(items, cfg)
    ref = hf_embeddings(hf, wb.preprocess(items, cfg, normalize=True).pixels, raw.grid_thw)
    assert raw.pixels.dtype == torch.uint8 and rel_err(enc.encode(raw), ref) < FP32_TOL


def test_torch_state_dict_round_trip_speaks_transformers_names(seed):
    """state_dict() holds transformers' module names and shapes (q, k, v as views of the fused qkv, the patch
    projection flat); torch's load_state_dict takes them back; a missing tensor is named."""
    cfg = wb.VisionConfig.preset(TINY)
    a, b = (build_tower(cfg).init_random(s) for s in (seed, seed + 1))
    theirs = {k: tuple(v.shape) for k, v in hf_vision_model(cfg).state_dict().items()
              if not any(s in k for s in NOT_HELD)}
    assert {k: tuple(v.shape) for k, v in a.state_dict().items()} == theirs
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match=r"state dict does not fit: missing from the checkpoint: .*cls_register"):
        b.load_hf_state_dict({k: v for k, v in a.state_dict().items() if "cls_register" not in k})
    sd = dict(a.state_dict(), **{"vision_model.encoder.layer.0.layer_scale1.lambda1": torch.full((64,), 0.5)})
    with pytest.raises(ValueError, match=r"layer_scale1.lambda1 is not all ones"):
        b.load_hf_state_dict(sd)


# ---- graph-safe: host metadata, padding, the runner ---------------------------------------------------------

@pytest.mark.parametrize("backend", ["loop", "masked"])
def test_padded_metadata_gives_the_same_valid_tokens(backend, seed):
    """Rows padded with NaN, sequence slots beyond the frames each with a prefix of its own after the last
    sequence: the valid tokens are eager's."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, attn_backend=backend).init_random(seed).eval()
    grid = torch.tensor([[1, 6, 8], [1, 2, 2], [1, 4, 6]])
    n, pad = int(grid.prod(1).sum()), 24
    x = torch.rand(n, cfg.patch_dim)
    with torch.no_grad():
        ref = tower(x, grid)
        meta = tower.prepare(grid, **budget_padding(cfg, (n + pad) // 4, 8))
        p = PREFIX_TOKENS
        assert meta.ext_cu_seqlens.tolist()[:5] == [0, 48 + p, 52 + 2 * p, 76 + 3 * p, 76 + 3 * p]
        assert meta.ext_index.numel() == n + pad + 8 * p and not meta.pos_weight[n:].any()
        assert meta.ext_index[meta.patch_index].tolist() == list(range(n + pad))
        out = tower.forward_prepared(torch.cat([x, torch.full((pad, cfg.patch_dim), float("nan"))]), meta)
    assert ref.shape == (n // 4, cfg.out_hidden) and out.shape == ((n + pad) // 4, cfg.out_hidden)
    assert torch.isfinite(out[: n // 4]).all() and rel_err(out[: n // 4], ref) < 1e-6


def test_metadata_copied_into_captured_buffers_replays_any_grid(seed):
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg).init_random(seed).eval()
    budget = 120
    static = tower.prepare_capture(budget, 4)
    buf = torch.zeros(budget * 4, cfg.patch_dim)
    for grid in ([[1, 16, 30]], [[1, 2, 2], [1, 12, 14]], [[1, 30, 8], [1, 6, 2]]):
        grid = torch.tensor(grid)
        n = int(grid.prod(1).sum())
        x = torch.rand(n, cfg.patch_dim)
        static.copy_(tower.prepare(grid, **budget_padding(cfg, budget, 4)))
        buf.zero_()
        buf[:n] = x
        with torch.no_grad():
            assert rel_err(tower.forward_prepared(buf, static)[: n // 4], tower(x, grid)) < 1e-6


@pytest.fixture(scope="module")
def items():
    p = wb.sample_images()
    return [p["chelsea"], p["coffee"].resize((150, 100)), p["rocket"].resize((200, 60))]


@pytest.mark.parametrize("placement, buffer_dtype", [
    ("tower", torch.uint8), ("outer_graph", torch.uint8),
    *(pytest.param(p, d, marks=pytest.mark.slow) for p, d in (("fold", torch.uint8), ("processor", torch.float32),
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
    assert clean.shape == eager.shape == (batch.n_rows // 4, cfg.out_hidden) and rel_err(clean, eager) < 1e-6
    st = runner.stats_frame()
    assert (~st.miss).sum() >= 2 and st.padded_rows.sum() > 0
    runner.poison_pool()
    poisoned = runner.encode(batch, pad_value=float("nan") if buffer_dtype.is_floating_point else 255)
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)


def test_outer_placement_is_right_eagerly_and_wrong_under_cudagraph(items, seed):
    """vLLM 0.34's cell: the outer model normalizes before it calls the tower (outer), with no encoder graphs,
    so eager is right. The day the engine gains graphs, the graph path calls the tower without that norm: the
    emulated runner shows it wrong, where the norm in the tower (tower) or in the helper the graph forward calls
    too (outer_graph) stays right."""
    cfg = wb.VisionConfig.preset(TINY)
    raw = wb.preprocess(items[:2], cfg)
    encoders = {p: wb.build_encoder(cfg, placement=p, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
                for p in ("outer", "outer_graph", "tower")}
    ref = encoders["tower"].encode(raw)
    for placement, enc in encoders.items():
        assert rel_err(enc.encode(raw), ref) < 1e-6, placement
        runner = EncoderGraphRunner(enc, budgets=[64, 128], buffer_dtype=torch.uint8, max_items=2)
        err = rel_err(enc.encode(raw, path="cudagraph", runner=runner), ref)
        assert err > 0.1 if placement == "outer" else err < 1e-6, placement
    assert encoders["outer"].graph_norm is None and encoders["outer_graph"].graph_norm is not None
    assert cfg.spec.vllm_placement == "outer" and cfg.spec.vllm_encoder_graphs is False


# ---- model folders --------------------------------------------------------------------------------------------

FOLDER_CFG = dataclasses.replace(wb.VisionConfig.preset(TINY), name="folder", width=32, heads=2, mlp_hidden=128,
                                 merger_hidden=40, out_hidden=24, num_position_embeddings=64)


def save_nemotron(folder, seed):
    """A tiny NemotronH_Omni_Reasoning_V3 (vision 2 x 32 wide, a one-layer text model) with fresh weights saved
    into ``folder`` (save_pretrained writes the released layout), and a preprocessor_config.json as the image
    processor's (written by hand: its class needs torchvision); returns the model."""
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3
    torch.manual_seed(seed)
    model = randomize(NemotronH_Omni_Reasoning_V3(FOLDER_CFG.to_hf()), seed).eval()
    model.save_pretrained(folder)
    pp = dict(image_processor_type="NemotronH_Omni_Reasoning_V3ImageProcessor", patch_size=16, downsample_ratio=0.5,
              min_num_patches=16, max_num_patches=256, image_mean=list(FOLDER_CFG.image_mean),
              image_std=list(FOLDER_CFG.image_std), do_rescale=True, do_normalize=True, resample=3)
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(pp))
    return model


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("nemotron") / "m"
    return path, save_nemotron(path, seed=5)


@pytest.fixture
def saved(pristine, tmp_path):
    return Path(shutil.copytree(pristine[0], tmp_path / "m"))


def test_a_saved_folder_loads_through_build_encoder(pristine, photos):
    """save_pretrained writes vision_model.radio_model.model.* with a fused qkv, and mlp1.*: wb.build_encoder(
    folder) equals the model's own get_image_features, outer and tower alike."""
    from safetensors.torch import load_file
    names = load_file(str(pristine[0] / "model.safetensors"))
    assert "vision_model.radio_model.model.blocks.0.attn.qkv.weight" in names and "mlp1.1.weight" in names
    cfg = resolve_config(pristine[0])
    assert cfg.family == "nemotron-vl" and cfg.name == "m"
    keys = ("width", "heads", "mlp_hidden", "merger_hidden", "out_hidden", "num_position_embeddings", "min_pixels",
            "max_pixels", "image_mean", "image_std")
    assert {k: getattr(cfg, k) for k in keys} == {k: getattr(FOLDER_CFG, k) for k in keys}
    images = [photos["coffee"], photos["rocket"].resize((260, 90))]
    normalized = wb.preprocess(images, cfg, normalize=True)
    ref = hf_embeddings(_image_path(pristine[1]), normalized.pixels, normalized.grid_thw)
    for placement in ("outer", "tower"):
        enc = wb.build_encoder(pristine[0], placement=placement, norm="eager", dtype=torch.float32, device="cpu")
        assert rel_err(enc.encode(wb.preprocess(images, cfg)), ref) < FP32_TOL, placement


def _image_path(model):
    """The model's own modules under the reference's names (its get_image_features, as `hf_embeddings` calls it)."""
    ref = reference_class()(model.config)
    ref.vision_model, ref.multi_modal_projector = model.vision_model, model.multi_modal_projector
    return ref.eval()


def test_the_models_own_state_dict_loads_into_the_tower(pristine, photos):
    """The model loaded back by from_pretrained, its state dict (transformers' names, the language model beside)."""
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3
    model = NemotronH_Omni_Reasoning_V3.from_pretrained(pristine[0]).eval()
    cfg = resolve_config(pristine[0])
    tower = build_tower(cfg).eval().load_hf_state_dict(model.state_dict())
    batch = wb.preprocess([photos["chelsea"]], cfg, normalize=True)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
    assert rel_err(out, hf_embeddings(_image_path(model), batch.pixels, batch.grid_thw)) < FP32_TOL


def _edit(path, dotted, value):
    data = json.loads(path.read_text())
    *outer, key = dotted.split(".")
    d = data
    for k in outer:
        d = d[k]
    d[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, dotted, value, match", [
    ("config.json", "vision_config.use_swiglu_ffn", True, r"use_swiglu_ffn=true: this tower supports only false"),
    ("config.json", "vision_config.num_registers", 5, r"num_cls_tokens, num_registers = \(3, 5\)"),
    ("config.json", "vision_config.layerscale_value", 0.5, r"layerscale_value=0.5: this tower supports only 1"),
    ("config.json", "vision_config.hidden_act", "silu", r"hidden_act='silu': this tower supports only 'gelu'"),
    ("config.json", "downsample_ratio", 0.25, r"downsample_ratio=0.25: this tower supports only 0.5"),
    ("config.json", "text_config.num_nextn_predict_layers", 1, r"vision_final_layernorm"),
    ("preprocessor_config.json", "patch_size", 14, r"patch_size=14 disagrees with config\.json"),
])
def test_a_folder_the_tower_cannot_run_is_named_before_any_weights_are_read(saved, monkeypatch, file, dotted, value,
                                                                           match):
    import safetensors
    _edit(saved / file, dotted, value)
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **kw: pytest.fail("a tensor file was opened"))
    with pytest.raises(CheckpointError, match=match):
        resolve_config(saved)


# ---- preprocessing: NemotronH_Omni_Reasoning_V3ImageProcessor -------------------------------------------------

def _transformers_grid_rule():
    """transformers' get_patch_grid_size and get_num_patches_budget, read from its installed source: the module
    imports torchvision at its top, which the CPU environment does not have; these two functions use only math."""
    import transformers.models.nemotron_h_omni as package
    source = (Path(package.__file__).parent / "image_processing_nemotron_h_omni.py").read_text()
    wanted = {"get_patch_grid_size", "get_num_patches_budget"}
    tree = ast.parse(source)
    module = ast.Module(body=[n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted],
                        type_ignores=[])
    scope = {"math": math}
    exec(compile(module, "image_processing_nemotron_h_omni.py", "exec"), scope)
    assert wanted <= set(scope)
    return scope["get_patch_grid_size"], scope["get_num_patches_budget"]


def _outcome(rule, h, w, lo, hi):
    try:
        return rule(h, w, 16, 2, lo, hi)
    except (ValueError, ZeroDivisionError):      # transformers divides by zero where a side shrinks to nothing
        return "refused"


def test_the_grid_rule_equals_transformers_on_random_sizes():
    """`patch_grid_size` against transformers' function, at the processor's defaults and the tiny preset's
    bounds, sizes from 1 px to very wide; with the defaults, the per-call budget is max_num_patches for any
    number of images; an image too narrow for the rule is refused by both."""
    theirs, budget = _transformers_grid_rule()
    rng = np.random.default_rng(11)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 6000, (300, 2))] + [
        (1, 1), (16, 16), (48, 16), (10, 3000), (3000, 10), (512, 512), (1, 100000), (1840, 1840), (1856, 1856)]
    for lo, hi in ((MIN_PATCHES, MAX_PATCHES), (16, 256)):
        for h, w in sizes:
            assert _outcome(patch_grid_size, h, w, lo, hi) == _outcome(theirs, h, w, lo, hi), (lo, hi, h, w)
    assert {budget(n, 2, MIN_PATCHES, MAX_PATCHES, 16384) for n in (1, 2, 8, 64)} == {MAX_PATCHES}


@pytest.mark.parametrize("backend", wb.PREPROCESS_BACKENDS)
def test_every_backend_gives_the_processors_sizes(backend, photos):
    """Every backend sizes images by the patch-grid rule; an image already at its grid's size is not resized
    (its uint8 rows are its pixels); the other backends' bicubic stays near PIL's."""
    cfg = wb.VisionConfig.preset(REAL)
    exact = np.random.default_rng(3).integers(0, 256, (64 * 16, 40 * 16, 3), dtype=np.uint8)
    batch = wb.preprocess([photos["rocket"], np.zeros((30, 500, 3), np.uint8), exact], cfg, backend=backend)
    want = [(1, *patch_grid_size(h, w, 16, 2, MIN_PATCHES, MAX_PATCHES)) for h, w in ((427, 640), (30, 500),
                                                                                      (1024, 640))]
    assert [tuple(g) for g in batch.grid_thw.tolist()] == want and want[2] == (1, 64, 40)
    from workbench.families.pixtral import pixel_images
    (image,) = pixel_images(batch.select([2]).pixels.cpu(), batch.grid_thw[2:], 16, 2)
    assert torch.equal(image, torch.from_numpy(exact).permute(2, 0, 1))
    pil = wb.preprocess([photos["rocket"]], cfg)
    diff = (batch.select([0]).pixels.cpu().int() - pil.pixels.int()).abs()
    assert int(diff.max()) <= {"pil": 0, "torchvision": 8}.get(backend, 16) and float((diff > 1).float().mean()) < 0.05


def test_torchvision_processor_rows(photos):
    """On a host with torchvision: transformers' processor (float32 bicubic, antialiased, overshoot kept, then
    CLIP-normalized) gives our grids, and our normalized rows where no resize happens; resized images differ
    only by the uint8 rounding of our resize."""
    pytest.importorskip("torchvision")
    from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3ImageProcessor)
    cfg = wb.VisionConfig.preset(REAL)
    proc = NemotronH_Omni_Reasoning_V3ImageProcessor()
    exact = np.random.default_rng(3).integers(0, 256, (64 * 16, 40 * 16, 3), dtype=np.uint8)
    for x, tol in ((exact, 1e-6), (photos["rocket"], 0.1)):
        kw = {} if hasattr(x, "mode") else dict(input_data_format="channels_last")
        theirs = proc(images=[x], return_tensors="pt", **kw)
        ours = wb.preprocess(x, cfg, normalize=True)
        assert theirs["image_grid_hw"].tolist() == ours.grid_thw[:, 1:].tolist()
        assert rel_err(hf_raster(ours), theirs["pixel_values"]) < tol


def hf_raster(batch):
    """Our rows as the processor's patches: raster order, (C, ph, pw) columns."""
    from workbench.families.pixtral import pixel_images
    out = []
    for image in pixel_images(batch.pixels, batch.grid_thw, 16, 2):
        c, hh, ww = image.shape
        out.append(image.reshape(c, hh // 16, 16, ww // 16, 16).permute(1, 3, 0, 2, 4).reshape(-1, c * 256))
    return torch.cat(out)
