"""Pixtral (Mistral3's image path: transformers' `PixtralVisionModel` then `Mistral3MultiModalProjector`,
model_type mistral3): the tower against transformers' modules with the same weights on real photos,
several images at once (Mistral3 takes no video: a video's frames are images of one size);
Pixtral's rotary frequency layout; graph safety (the emulated graph runner with a NaN-poisoned
pool, the outer placement's failure under it; odd grids, captured metadata buffers, the FLOP model,
the fused kernels and the parameter count in tests/test_families.py, padded metadata, bf16 and the
tower's own norm in tests/test_towers.py); model folders saved by transformers' save_pretrained in
both key layouts, and bad ones named before any tensor is read; preprocessing bit for bit against
PixtralImageProcessorPil as PixtralProcessor calls it (patch size 14 x spatial merge 2)."""
import dataclasses
import functools
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from family_pairs import matched_pair
from workbench.checkpoints import CheckpointError, load_vision_weights, read_vision_config, resolve_config
from workbench.families.pixtral import image_rows, pixel_images, reference_class
from workbench.reference import hf_embeddings, hf_vision_model, rel_err
from workbench.runner import EncoderGraphRunner
from workbench.towers import build_tower

from test_families import max_err
from test_family_glm_ocr import BUDGETS, _edit, replays_equal_eager_from_a_poisoned_pool

TINY, REAL = "tiny-pixtral", "mistral-small-3.1-24b"
FP32_TOL = 1e-5
UNIT_WEIGHTS = ("norm.weight", "ln_pre.weight")     # RMSNorm scales: drawn around 1


def randomize(model, seed):
    """Fresh checkpoint-like weights: norm scales around 1, everything else N(0, 0.05)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * r if name.endswith(UNIT_WEIGHTS) else 0.05 * r)
    return model


matched_towers = functools.partial(matched_pair, randomize=randomize)



# ---- faithful: transformers' PixtralVisionModel + Mistral3MultiModalProjector --------------------------

@pytest.mark.parametrize("box", [256, pytest.param(None, marks=pytest.mark.slow)])
def test_tower_matches_transformers_on_photos_several_images_and_video_frames(box, photos, seed):
    """Photos within a 256 px box (the tiny preset's own 1024 px box in the slow run), a batch of
    three images and a 3-frame video (three images of one size to transformers)."""
    cfg = wb.VisionConfig.preset(TINY)
    cfg = cfg if box is None else dataclasses.replace(cfg, max_pixels=box * box)
    hf, ours = matched_towers(cfg, seed)
    items = [photos["chelsea"], photos["rocket"], wb.Video(wb.sample_video(3, size=(84, 140)))]
    batch = wb.preprocess(items, cfg, normalize=True)
    assert batch.grid_thw[:, 0].tolist() == [1, 1, 3]
    ref = hf_embeddings(hf, batch.pixels, batch.grid_thw)
    with torch.no_grad():
        out = ours(batch.pixels, batch.grid_thw)
        parts = [ours(item.pixels, item.grid_thw) for item in batch.split()]
    assert out.shape == ref.shape == (batch.n_rows // 4, cfg.out_hidden)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL
    for one, sl in zip(parts, batch.item_slices):       # no attention across items
        assert rel_err(one, out[sl.start // 4: sl.stop // 4]) < 1e-6


@pytest.mark.slow
def test_the_published_width_at_reduced_depth_matches_transformers(photos, seed):
    cfg = dataclasses.replace(wb.VisionConfig.preset(REAL).reduced(2), max_pixels=224 * 224)
    hf, ours = matched_towers(cfg, seed)
    batch = wb.preprocess([photos["coffee"], photos["rocket"]], cfg, normalize=True)
    with torch.no_grad():
        out, ref = ours(batch.pixels, batch.grid_thw), hf_embeddings(hf, batch.pixels, batch.grid_thw)
    assert rel_err(out, ref) < FP32_TOL and max_err(out, ref) < FP32_TOL


def test_rotary_tables_are_pixtrals_interleaved_frequencies(seed):
    """Our cos/sin per row equal transformers' PixtralVisionRotaryEmbedding at that row's (row, col);
    the column half differs from the Qwen layout (its frequencies are the odd ones)."""
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding
    cfg = wb.VisionConfig.preset(REAL)
    tower = build_tower(dataclasses.replace(cfg, depth=1), device_norm=False)
    grid = torch.tensor([[1, 6, 10]])
    meta = tower.prepare(grid)
    pos = wb.towers.metadata.merge_block_positions([(1, 6, 10)], cfg.merge_size)
    rope = PixtralVisionRotaryEmbedding(cfg.to_hf().vision_config)
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), pos)
    assert torch.equal(meta.cos, cos) and torch.equal(meta.sin, sin)
    qwen_cos, _ = wb.towers.metadata.rotary_cos_sin(pos, cfg, torch.float32)
    quarter = cfg.head_dim // 4
    assert torch.equal(qwen_cos[:, :quarter], cos[:, :quarter]) and not torch.equal(qwen_cos, cos)


def test_the_published_config_maps_both_ways():
    """The preset is Mistral-Small-3.1's config (transformers' Mistral3Config defaults hold the same
    sizes, but hidden_act gelu where the checkpoint has silu); from_hf_config reads it back."""
    from transformers import Mistral3Config
    cfg = wb.VisionConfig.preset(REAL)
    default = Mistral3Config()
    vd = default.vision_config
    assert (vd.hidden_size, vd.intermediate_size, vd.num_hidden_layers, vd.num_attention_heads, vd.patch_size,
            vd.image_size) == (cfg.width, cfg.mlp_hidden, cfg.depth, cfg.heads, cfg.patch_size, cfg.longest_edge)
    assert (default.text_config.hidden_size, default.text_config.rms_norm_eps) == (cfg.out_hidden, cfg.eps)
    assert (default.spatial_merge_size, default.vision_feature_layer, default.projector_hidden_act) == (2, -1, "gelu")
    assert vd.hidden_act == "gelu" and cfg.to_hf().vision_config.hidden_act == "silu"
    fields = cfg.spec.from_hf_config(cfg.to_hf().to_dict())
    assert fields == {k: getattr(cfg, k) for k in fields}
    assert (cfg.patch_dim, cfg.temporal_patch_size, cfg.min_pixels, cfg.max_pixels) == (588, 1, 784, 1540 ** 2)
    assert 0.38e9 < cfg.n_params < 0.45e9        # Pixtral's ~0.4B encoder plus the projector
    with torch.device("meta"):
        assert cfg.n_params == sum(p.numel() for p in hf_vision_model(cfg).parameters())


@pytest.mark.parametrize("change, match", [
    (dict(temporal_patch_size=2), r"temporal_patch_size=2: the pixtral tower has no use for it"),
    (dict(longest_edge=0), r"longest_edge=0: the pixtral processor bounds each side"),
    (dict(min_pixels=3136), r"min_pixels=3136: the pixtral processor enlarges nothing; leave it at 784"),
    (dict(eps=1e-6), r"eps=1e-06: the pixtral tower has no use for it \(leave it at 1e-05\)"),
])
def test_a_config_the_tower_cannot_run_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(wb.VisionConfig.preset(TINY), **change)
    with pytest.raises(ValueError, match=r"longest_edge=448: the qwen2-vl processor bounds the area"):
        dataclasses.replace(wb.VisionConfig.preset("tiny-qwen2-vl"), longest_edge=448)


# ---- graph-safe: host metadata, padding, the runner ---------------------------------------------

@pytest.fixture(scope="module")
def items():
    """Merged tokens in a 200 px box (no resize: sides already multiples of 28): 8, 12, 12 (a
    2-frame video), 4, and the rocket photo's 40, larger than every budget (it runs eager); packed
    smallest first they fill budgets 24 and 16, with padding."""
    p = wb.sample_images()
    return [p["chelsea"].resize((112, 56)), p["coffee"].resize((84, 112)), wb.Video(wb.sample_video(2, size=(56, 84))),
            p["astronaut"].resize((56, 56)), p["rocket"]]




def small_cfg():
    return dataclasses.replace(wb.VisionConfig.preset(TINY), max_pixels=200 * 200)


@pytest.mark.parametrize("placement, buffer_dtype", [
    ("device", torch.float32),      # vLLM's placement for Mistral3
    ("tower", torch.uint8), ("fold", torch.uint8), ("processor", torch.float32), ("runner", torch.float32),
    ("tower", torch.bfloat16)])
def test_runner_replays_equal_eager_with_padding_several_items_and_a_poisoned_pool(placement, buffer_dtype, items,
                                                                                  seed):
    cfg = small_cfg()
    assert [r // 4 for r in wb.preprocess(items, cfg).item_rows] == [8, 12, 12, 4, 40]
    st = replays_equal_eager_from_a_poisoned_pool(cfg, placement, buffer_dtype, items, seed)
    assert st.miss.sum() == 1 and set(st.budget[~st.miss]) == {16, 24} and st.padded_rows.sum() > 0


def test_outer_placement_is_wrong_under_the_runner_and_device_and_tower_are_right(items, seed):
    cfg = small_cfg()
    raw = wb.preprocess(items[:2], cfg)
    encoders = {p: wb.build_encoder(cfg, placement=p, norm="eager", dtype=torch.float32, device="cpu", seed=seed)
                for p in ("outer", "tower", "device")}
    ref = encoders["tower"].encode(raw)
    for placement, enc in encoders.items():
        assert rel_err(enc.encode(raw), ref) < FP32_TOL
        runner = EncoderGraphRunner(enc, budgets=BUDGETS, buffer_dtype=torch.float32, max_items=4)
        err = rel_err(enc.encode(raw, path="cudagraph", runner=runner), ref)
        assert err > 0.1 if placement == "outer" else err < 1e-6, placement


def test_torch_state_dict_round_trip_speaks_the_checkpoints_names(seed):
    """state_dict() holds transformers' names and shapes (q, k, v as views of the fused qkv);
    torch's load_state_dict takes them back."""
    cfg = wb.VisionConfig.preset(TINY)
    a, b = (build_tower(cfg).init_random(s) for s in (seed, seed + 1))
    theirs = {k: tuple(v.shape) for k, v in hf_vision_model(cfg).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in a.state_dict().items()} == theirs
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


# ---- model folders ----------------------------------------------------------------------------------

def save_mistral3(folder, seed, longest_edge=448):
    """A tiny Mistral3ForConditionalGeneration with fresh weights and its PixtralImageProcessorPil
    saved into ``folder``; returns transformers' image path of it (PixtralMistral3Vision sharing the
    model's modules)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
    config = Mistral3Config(
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=2, patch_size=14, image_size=longest_edge, hidden_act="silu"),
        text_config=dict(model_type="mistral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=64, rms_norm_eps=1e-5))
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(config).eval()
    ref = reference_class()(config)
    ref.vision_tower, ref.multi_modal_projector = model.model.vision_tower, model.model.multi_modal_projector
    randomize(ref, seed)
    model.save_pretrained(folder)
    PixtralImageProcessorPil(patch_size=14, size={"longest_edge": longest_edge}).save_pretrained(folder)
    return ref.eval()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("mistral3") / "m"
    return path, save_mistral3(path, seed=5)


@pytest.fixture
def saved(pristine, tmp_path):
    return Path(shutil.copytree(pristine[0], tmp_path / "m"))


@pytest.mark.parametrize("layout", ["saved", "model."])
def test_a_saved_folder_loads_in_both_key_layouts(layout, pristine, saved, photos):
    """save_pretrained writes the published checkpoints' layout (vision_tower.* / multi_modal_projector.*,
    transformers reverting its load-time renaming); the model's own state dict in transformers 5
    says model.vision_tower.* / model.multi_modal_projector.*: a folder in either loads."""
    from safetensors.torch import load_file, save_file
    sd = load_file(str(saved / "model.safetensors"))
    assert any(k.startswith("vision_tower.transformer.layers.0.attention.q_proj") for k in sd)
    if layout == "model.":
        save_file({("model." + k if k.startswith(("vision_tower.", "multi_modal_projector.")) else k): v
                   for k, v in sd.items()}, str(saved / "model.safetensors"))
    cfg = resolve_config(saved)
    assert cfg.family == "pixtral" and cfg.name == "m"
    assert (cfg.width, cfg.mlp_hidden, cfg.out_hidden, cfg.depth, cfg.heads) == (32, 48, 32, 2, 2)
    assert (cfg.longest_edge, cfg.max_pixels, cfg.min_pixels, cfg.patch_size) == (448, 448 ** 2, 784, 14)
    tower = load_vision_weights(build_tower(cfg).eval(), saved)
    batch = wb.preprocess([photos["coffee"], photos["rocket"]], cfg, normalize=True)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
    assert rel_err(out, hf_embeddings(pristine[1], batch.pixels, batch.grid_thw)) < FP32_TOL


def test_the_folders_processor_cuts_the_rows_wb_preprocess_cuts(saved, photos):
    """The folder's own image processor, called as PixtralProcessor calls it (patch size times the
    spatial merge), gives our rows' pixels and sizes, normalized with the folder's constants."""
    from transformers import AutoImageProcessor
    cfg = resolve_config(saved)
    processor = AutoImageProcessor.from_pretrained(saved)
    for name in ("chelsea", "rocket"):
        ours = wb.preprocess([photos[name]], cfg, normalize=True)
        theirs = processor(images=[photos[name]], patch_size=cfg.patch_size * cfg.merge_size, return_tensors="pt")
        image = pixel_images(ours.pixels, ours.grid_thw, cfg.patch_size, cfg.merge_size)[0]
        assert list(image.shape[1:]) == theirs["image_sizes"][0].tolist(), name
        assert float((image - theirs["pixel_values"][0]).abs().max()) < 1e-6, name


@pytest.mark.parametrize("file, dotted, value, match", [
    ("config.json", "model_type", "pixtral_v2", r"model_type 'pixtral_v2' is not a known family; known families .*"
                                                r"pixtral \(mistral3\)"),
    ("config.json", "vision_config.hidden_act", "gelu", r"vision_config\.hidden_act=\"gelu\": this tower supports "
                                                        r"only \"silu\""),
    ("config.json", "vision_feature_layer", -2, r"vision_feature_layer=-2: this tower supports only -1"),
    ("config.json", "multimodal_projector_bias", True, r"multimodal_projector_bias=true: this tower supports only false"),
    ("config.json", "text_config.rms_norm_eps", 1e-6, r"text_config\.rms_norm_eps \(the projector's RMSNorm\)=1e-06"),
    ("preprocessor_config.json", "patch_size", {"height": 16, "width": 16},
     r"preprocessor_config\.json: patch_size=16 disagrees with config\.json's vision_config \(patch_size=14\)"),
    ("preprocessor_config.json", "size", {"shortest_edge": 56, "longest_edge": 99},
     r"longest_edge|size"),
    ("preprocessor_config.json", "size", {"height": 448, "width": 448}, r"no size\.longest_edge"),
])
def test_a_folder_the_tower_cannot_run_is_named_before_any_weights_are_read(saved, monkeypatch, file, dotted, value,
                                                                           match):
    import safetensors
    _edit(saved / file, dotted, value)
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **kw: pytest.fail("a tensor file was opened"))
    if match == r"longest_edge|size":        # a box of 99 px is a valid (small) bound: the folder reads
        assert read_vision_config(saved).longest_edge == 99
        return
    with pytest.raises(CheckpointError, match=match):
        resolve_config(saved)


def test_qwen_tensors_under_a_mistral3_config_are_refused_naming_the_layout(saved, tmp_path):
    from test_checkpoints import save_model
    other = tmp_path / "qwen"
    save_model("qwen2-vl", other, seed=1)
    (saved / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"no vision tensors \(no key starts with model\.vision_tower\. or "
                                              r"model\.multi_modal_projector\. or vision_tower\. or "
                                              r"multi_modal_projector\.\)"):
        resolve_config(saved)


# ---- preprocessing: PixtralImageProcessorPil as PixtralProcessor calls it ----------------------------

def _processor(cfg, raw):
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
    return PixtralImageProcessorPil(patch_size=cfg.patch_size, size={"longest_edge": cfg.longest_edge},
                                    **(dict(do_rescale=False, do_normalize=False) if raw else {}))


def test_pil_rows_equal_the_pixtral_pil_processor_bit_for_bit(photos):
    """The published preprocessor_config.json's constants (CLIP mean / std, 1/255, bicubic) are the
    processor's defaults; images larger than the 1540 px box shrink, small ones are only rounded up."""
    cfg = wb.VisionConfig.preset(REAL)
    proc = _processor(cfg, raw=True)
    assert tuple(proc.image_mean) == cfg.image_mean and tuple(proc.image_std) == cfg.image_std
    assert proc.rescale_factor == cfg.rescale_factor and proc.resample == 3
    rng = np.random.default_rng(7)
    odd = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((61, 97), (20, 30), (700, 45), (1700, 240))]
    for x in [photos["rocket"], photos["chelsea"], *odd]:
        ours = wb.preprocess(x, cfg)
        theirs = proc(images=[x], patch_size=28, return_tensors="pt", input_data_format="channels_last")
        image = pixel_images(ours.pixels, ours.grid_thw, 14, 2)[0]
        assert list(image.shape[1:]) == theirs["image_sizes"][0].tolist()
        assert torch.equal(image.float(), theirs["pixel_values"][0])
        rows, grid = image_rows(theirs["pixel_values"][0], 14, 2)       # the GPU host's tool compares so
        assert torch.equal(grid, ours.grid_thw) and torch.equal(rows, ours.pixels.float())
    assert wb.preprocess(odd[3], cfg).grid_thw.tolist() == [[1, 110, 16]]       # 1700 x 240 -> 1540 x 217 -> 224
    normalized = wb.preprocess(photos["rocket"], cfg, normalize=True)
    ref = _processor(cfg, raw=False)(images=[photos["rocket"]], patch_size=28, return_tensors="pt")["pixel_values"][0]
    assert float((pixel_images(normalized.pixels, normalized.grid_thw, 14, 2)[0] - ref).abs().max()) < 1e-6


def test_max_pixels_caps_the_box_side_and_mixes_count_the_same_tokens():
    """The studies' max_pixels cap binds the box at its square root; the mixes' token counts follow
    the same rule as wb.preprocess."""
    from workbench.samples import mix_tokens
    cfg = dataclasses.replace(wb.VisionConfig.preset(REAL), max_pixels=112 * 112)
    batch = wb.preprocess(np.zeros((400, 300, 3), np.uint8), cfg)
    assert batch.grid_thw.tolist() == [[1, 8, 6]]            # 112 x 84: inside the 112 px box
    tokens = mix_tokens("photos", 6, seed=3, cfg=cfg)
    assert max(tokens) <= (112 // 28) ** 2 and min(tokens) >= 1
