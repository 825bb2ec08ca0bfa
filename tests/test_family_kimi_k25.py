"""Kimi-K2.5 (transformers' `Kimi_K25VisionModel` + `Kimi_K25MultimodalProjection`, model_type kimi_k25):
the tower against transformers' vision model and projector with the same weights on real photos and
video chunks; graph safety (padded metadata, the emulated graph runner with a NaN-poisoned pool); the
processor's size rule and video chunks; model folders. Shared tests that list it: test_towers (its
norm, bf16 against float64), test_families (odd grids and chunks, captured metadata buffers, FLOPs,
fused kernels, parameter count), test_placements_fold_device (fold and device), test_runner (outer
wrong under graphs, none and double wrong), test_engine_cell (vLLM's cell)."""
import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.families.kimi_k25 import FRAMES, raster_order
from workbench.reference import hf_embeddings, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower
from workbench.towers.common import budget_padding

# transformers' model (here: vision model and projector) with fresh weights and ours loaded from it
from test_families import matched_towers, max_err
from test_family_glm_ocr import _edit

TINY = "tiny-kimi-k2.5"
FP32_TOL = 1e-5
HF = Path(__import__("transformers").__file__).parent / "models" / "kimi_k25"



# ---- faithful -----------------------------------------------------------------------------------

def test_tower_matches_transformers_on_photos_and_video_chunks(photos, seed):
    """Two photos and a 6-frame video (chunks of 4 and 2 frames, each pooled to one frame's tokens)."""
    cfg = dataclasses.replace(wb.VisionConfig.preset(TINY), max_pixels=256 * 256)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["chelsea"], photos["rocket"], wb.Video(wb.sample_video(6))], cfg, normalize=True)
    assert batch.grid_thw[:, 0].tolist() == [1, 1, 4, 2]
    tokens = cfg.item_tokens(batch.grid_thw)
    assert tokens[2] == tokens[3] == int(batch.grid_thw[2, 1:].prod()) // 4
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
        parts = [ours(item.pixels, item.grid_thw) for item in batch.split()]
    assert out.shape == ref.shape == (sum(tokens), cfg.out_hidden)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL
    firsts = np.cumsum([0] + tokens)
    for one, a, b in zip(parts, firsts[:-1], firsts[1:]):      # no cross-item attention or pooling leaks
        assert rel_err(one, out[a:b]) < 1e-6


@pytest.mark.slow
def test_the_published_width_at_reduced_depth_matches_transformers(photos, seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset("kimi-k2.5-1t").reduced(2), max_pixels=224 * 224)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["coffee"], wb.Video(wb.sample_video(4))], cfg, normalize=True)
    with torch.no_grad():
        out, ref = ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


def test_the_preset_is_transformers_defaults_and_bad_values_are_named():
    from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25Config, Kimi_K25VisionConfig
    cfg = wb.VisionConfig.preset("kimi-k2.5-1t")
    default, ours = Kimi_K25VisionConfig().to_dict(), cfg.to_hf().vision_config.to_dict()
    for key in ("patch_size", "pos_emb_height", "pos_emb_width", "pos_emb_time", "num_attention_heads",
                "num_hidden_layers", "hidden_size", "intermediate_size", "hidden_act", "rope_parameters"):
        assert ours[key] == default[key], key
    assert list(default["merge_kernel_size"]) == list(ours["merge_kernel_size"]) == [2, 2]
    top = Kimi_K25Config()
    assert (top.text_config.hidden_size, top.projection_hidden_size) == (cfg.out_hidden, cfg.width)
    assert cfg.patch_dim == 588 and cfg.embed_width == 7168
    assert cfg.spec.from_hf(ours) == {k: getattr(cfg, k) for k in cfg.spec.from_hf(ours)}
    with pytest.raises(ValueError, match=r"temporal_patch_size=2 must be 1"):
        dataclasses.replace(cfg, temporal_patch_size=2)
    with pytest.raises(ValueError, match=r"num_position_embeddings=60 must be a positive square"):
        dataclasses.replace(cfg, num_position_embeddings=60)
    with pytest.raises(ValueError, match=r"pos_emb_time=8: this tower supports only 4"):
        cfg.spec.from_hf({**ours, "pos_emb_time": 8})
    tower = build_tower(wb.VisionConfig.preset(TINY))
    with pytest.raises(ValueError, match=rf"has 5 frames; a kimi-k2.5 chunk holds at most {FRAMES}"):
        tower.prepare(torch.tensor([[5, 2, 2]]))


# ---- graph-safe -----------------------------------------------------------------------------------

def test_padded_metadata_gives_the_same_valid_tokens(seed):
    """Rows padded with NaN, sequence slots with repeated tails, position taps, frame rows and the
    pooling gather with weight 0: the items' tokens come first and equal eager."""
    cfg = wb.VisionConfig.preset(TINY)
    tower = build_tower(cfg, attn_backend="loop").init_random(seed).eval()
    grid = torch.tensor([[1, 8, 12], [3, 4, 8], [1, 4, 4]])
    n, pad = int(grid.prod(1).sum()), 64
    k = sum(cfg.item_tokens(grid))
    x = torch.randn(n, cfg.patch_dim)
    with torch.no_grad():
        ref = tower(x, grid)
        meta = tower.prepare(grid, **budget_padding(cfg, (n + pad) // 4, 8))
        assert meta.cu_seqlens.tolist()[:4] == [0, 96, 192, 208]      # a chunk's frames: one sequence
        assert not meta.pool_weight[4 * k:].any() and not meta.frame_index[n:].any()
        out = tower.forward_prepared(torch.cat([x, torch.full((pad, cfg.patch_dim), float("nan"))]), meta)
    assert ref.shape == (k, cfg.out_hidden) and out.shape == ((n + pad) // 4, cfg.out_hidden)
    assert torch.isfinite(out[:k]).all() and rel_err(out[:k], ref) < 1e-6


@pytest.fixture(scope="module")
def items():
    """At max_pixels 200 x 200: photos that pack into the budgets below with padding, a 4-frame
    chunk, and one photo larger than every budget (it runs eager)."""
    p = wb.sample_images()
    return [p["chelsea"].resize((120, 84)), p["coffee"].resize((150, 100)), wb.Video(wb.sample_video(4, size=(56, 84))),
            p["astronaut"].resize((50, 50)), p["rocket"]]


BUDGETS = [8, 16, 24, 32]


@pytest.mark.parametrize("placement, buffer_dtype", [
    ("tower", torch.uint8),
    *(pytest.param(p, d, marks=pytest.mark.slow) for p, d in (("fold", torch.uint8), ("device", torch.float32),
                                                              ("processor", torch.float32), ("runner", torch.float32),
                                                              ("tower", torch.bfloat16)))])
def test_runner_replays_equal_eager_with_padding_several_items_and_a_poisoned_pool(placement, buffer_dtype, items,
                                                                                  seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset(TINY), max_pixels=200 * 200)
    enc = wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    batch = wb.preprocess(items, cfg, normalize=enc.input_kind == "normalized")
    runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=buffer_dtype, max_items=4)
    eager = enc.encode(batch)
    clean = enc.encode(batch, path="cudagraph", runner=runner)
    assert clean.shape == eager.shape == (sum(cfg.item_tokens(batch.grid_thw)), cfg.out_hidden)
    assert rel_err(clean, eager) < 1e-8
    st = runner.stats_frame()
    assert st.miss.sum() == 1 and (~st.miss).sum() >= 2 and st.padded_rows.sum() > 0
    runner.poison_pool()
    poisoned = runner.encode(batch, pad_value=float("nan") if buffer_dtype.is_floating_point else 255)
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)


# ---- preprocessing: Kimi_K25ImageProcessor / Kimi_K25VideoProcessor ------------------------------

def _their_navit_resize():
    """transformers' navit_resize, read from its module's source (the module imports torchvision,
    which this machine cannot load)."""
    tree = ast.parse((HF / "image_processing_kimi_k25.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "navit_resize")
    ns = {"math": math}
    exec(compile(ast.Module([fn], []), "navit_resize", "exec"), ns)
    return ns["navit_resize"]


def test_sizes_are_navit_resizes_for_images_and_video_frames():
    navit = _their_navit_resize()
    cfg = wb.VisionConfig.preset("kimi-k2.5-1t")
    rng = np.random.default_rng(3)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 20000, (3000, 2))] + [(1, 1), (13, 9000), (7200, 30)]
    for h, w in sizes:
        assert cfg.spec.resize(cfg, "image", h, w) == navit(h, w, 14, 2, 16384, 512), (h, w)
        assert cfg.spec.resize(cfg, "video", h, w) == navit(h, w, 14, 2, 4096, 512), (h, w)


@pytest.mark.parametrize("backend", wb.PREPROCESS_BACKENDS)
def test_rows_are_padded_with_zeros_and_videos_cut_into_chunks(backend, photos):
    cfg = wb.VisionConfig.preset(TINY)
    frames = wb.sample_video(9, size=(61, 97))
    batch = wb.preprocess([np.asarray(photos["rocket"]), wb.Video(frames)], cfg, backend=backend)
    (rh, rw), (ph, pw) = cfg.spec.resize(cfg, "video", 61, 97)
    assert (rh, rw, ph, pw) == (61, 97, 84, 112)
    assert batch.grid_thw[1:].tolist() == [[4, 6, 8], [4, 6, 8], [1, 6, 8]]
    chunk = batch.select([3]).pixels                          # the last chunk: frame 8 alone
    alone = wb.preprocess(frames[8], cfg, backend=backend)
    assert torch.equal(chunk, alone.pixels.to(chunk.device))
    # patches wholly in the padding (the last row of patches, below row 61 + the 23 padded rows) are zeros
    img = chunk[raster_order(torch.tensor([[1, 6, 8]]), 2)].view(6, 8, 3, 14, 14)
    assert not img[5].any() and img[:4].any()


def test_torchvision_rows_equal_kimis_processor(photos):
    """On a host with torchvision and transformers' Kimi-K2.5 processors (the GPU host): the
    torchvision backend's rows, reordered to raster order, equal the processor's on the CPU, and the
    cuda backend's the processor's run on the GPU (``device="cuda"``: the GPU's antialiased resize
    differs from the CPU's by a level in places, measured on the H200, for every family)."""
    pytest.importorskip("torchvision")
    processors = pytest.importorskip("transformers.models.kimi_k25.image_processing_kimi_k25")
    cfg = wb.VisionConfig.preset("kimi-k2.5-1t")
    raw = processors.Kimi_K25ImageProcessor(do_rescale=False, do_normalize=False)
    rng = np.random.default_rng(7)
    inputs = [photos["rocket"], photos["chelsea"], *(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                                                     for h, w in ((61, 97), (20, 30), (7000, 45), (3000, 4100)))]
    backends = {"torchvision": "cpu", **({"cuda": "cuda"} if torch.cuda.is_available() else {})}
    for x in inputs:
        for backend, device in backends.items():
            theirs = raw(images=[x], return_tensors="pt", device=device)
            ours = wb.preprocess(x, cfg, backend=backend)
            assert torch.equal(ours.grid_thw.cpu(), theirs["image_grid_thw"].cpu())
            rows = ours.pixels.cpu()[raster_order(ours.grid_thw, 2)].float()
            assert torch.equal(rows, theirs["pixel_values"].cpu().reshape(rows.shape)), backend


# ---- model folders --------------------------------------------------------------------------------

PROCESSOR = dict(image_processor_type="Kimi_K25ImageProcessor", patch_size=14, merge_size=2, max_patches=16384,
                 size={"max_height": 512, "max_width": 512}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                 do_rescale=True, do_normalize=True, rescale_factor=1 / 255)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A tiny Kimi_K25ForConditionalGeneration (a one-layer DeepSeek-V3 text model) saved by
    save_pretrained, which writes Moonshot's layout (fused wqkv with interleaved rotary rows, norm0 /
    norm1, fc0 / fc1, wo, mm_projector.proj.0 / 2), and the preprocessor_config.json of its image
    processor (written by hand: the processor needs torchvision to be built); returns the folder and
    the model."""
    import json
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration
    cfg = wb.VisionConfig.preset(TINY)
    text = dict(model_type="deepseek_v3", hidden_size=cfg.out_hidden, intermediate_size=64, moe_intermediate_size=16,
                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=2,
                n_shared_experts=1, num_experts_per_tok=1, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, vocab_size=64, n_group=1, topk_group=1)
    torch.manual_seed(5)
    model = Kimi_K25ForConditionalGeneration(Kimi_K25Config(vision_config=cfg.to_hf().vision_config.to_dict(),
                                                            text_config=text, projection_hidden_size=cfg.width)).eval()
    with torch.no_grad():
        for name, p in [*model.model.vision_tower.named_parameters(), *model.model.mm_projector.named_parameters()]:
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name and name.endswith("weight") else 0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("kimi") / "m"
    model.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return path, model


@pytest.fixture
def saved(pristine, tmp_path):
    import shutil
    return Path(shutil.copytree(pristine[0], tmp_path / "m"))


def _model_embeddings(model, batch):
    with torch.no_grad():
        rows = batch.pixels[raster_order(batch.grid_thw, 2)].view(-1, 3, 14, 14)
        return torch.cat(model.model.get_image_features(rows, batch.grid_thw).pooler_output)


def test_a_folder_saved_by_transformers_gives_the_models_embeddings(pristine, photos):
    from safetensors import safe_open
    path, model = pristine
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert "vision_tower.encoder.blocks.0.wqkv.weight" in set(f.keys())
    from workbench.checkpoints import load_vision_weights, resolve_config
    cfg = resolve_config(path)
    assert (cfg.family, cfg.width, cfg.out_hidden, cfg.max_pixels) == ("kimi-k2.5", 64, 48, 16384 * 196)
    tower = load_vision_weights(build_tower(cfg).eval(), path)
    batch = wb.preprocess([photos["chelsea"], wb.Video(wb.sample_video(3))], cfg, normalize=True)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
    assert rel_err(out, _model_embeddings(model, batch)) < FP32_TOL


def test_a_folder_in_transformers_5s_own_names_loads_the_same(pristine, saved, photos):
    """The names Kimi_K25ForConditionalGeneration holds in memory (model.vision_tower.*,
    model.mm_projector.*: q/k/v split, rotary rows already permuted) load too."""
    from safetensors.torch import save_file
    from workbench.checkpoints import load_vision_weights, resolve_config
    model = pristine[1]
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if "vision_tower" in k or "mm_projector" in k}
    save_file(sd, str(saved / "model.safetensors"), metadata={"format": "pt"})
    cfg = resolve_config(saved)
    tower = load_vision_weights(build_tower(cfg).eval(), saved)
    batch = wb.preprocess([photos["coffee"]], cfg, normalize=True)
    with torch.no_grad():
        assert rel_err(tower(batch.pixels, batch.grid_thw), _model_embeddings(model, batch)) < FP32_TOL


@pytest.mark.parametrize("file, dotted, value, match", [
    ("config.json", "model_type", "kimi_k3", r"model_type 'kimi_k3' is not a known family; known families .*"
                                             r"glm-ocr \(glm_ocr\), pixtral \(mistral3\), kimi-k2\.5 \(kimi_k25\)"),
    ("config.json", "vision_config.pos_emb_time", 8, r"vision_config pos_emb_time=8: this tower supports only 4"),
    ("config.json", "vision_config.hidden_act", "gelu", r"hidden_act='gelu': this tower supports only 'gelu_pytorch_tanh'"),
    ("preprocessor_config.json", "patch_size", 16, r"preprocessor_config\.json: patch_size=16 disagrees with "
                                                   r"config\.json's vision_config \(patch_size=14\)"),
    ("preprocessor_config.json", "size", {"max_height": 256, "max_width": 256},
     r"preprocessor_config\.json: size=.*supports only max_height = max_width = 512"),
])
def test_a_bad_folder_is_named_before_any_weights_are_read(saved, monkeypatch, file, dotted, value, match):
    import safetensors
    from workbench.checkpoints import CheckpointError, resolve_config
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **kw: pytest.fail("a tensor file was opened"))
    _edit(saved / file, dotted, value)
    with pytest.raises(CheckpointError, match=match):
        resolve_config(saved)
