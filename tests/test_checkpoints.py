"""Real checkpoints from a local folder: tiny models saved by transformers' save_pretrained (one
sharded), their processor config beside them; the tower built from the folder equals the vision
model that saved it, and bad folders fail before any tensor is read."""
import json
import shutil

import pytest
import torch

import workbench as wb
from workbench.checkpoints import CheckpointError, load_vision_weights, read_vision_config, resolve_config
from workbench.reference import hf_embeddings, rel_err
from workbench.towers import build_tower

TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=64)
MROPE = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}


def _qwen2_vl():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor
    cfg = Qwen2VLConfig(text_config=dict(TEXT, rope_parameters=MROPE),
                        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2))
    return Qwen2VLForConditionalGeneration(cfg), Qwen2VLImageProcessor()


def _qwen2_5_vl(intermediate_size=48):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor
    cfg = Qwen2_5_VLConfig(text_config=dict(TEXT, rope_parameters=MROPE),
                           vision_config=dict(depth=2, hidden_size=32, intermediate_size=intermediate_size, num_heads=2,
                                              out_hidden_size=32, fullatt_block_indexes=[1]))
    return Qwen2_5_VLForConditionalGeneration(cfg), Qwen2VLImageProcessor()


def _qwen3_vl():
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration
    cfg = Qwen3VLConfig(text_config=dict(TEXT, head_dim=8, rope_parameters=dict(MROPE, mrope_interleaved=True)),
                        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                           out_hidden_size=32, num_position_embeddings=64,
                                           deepstack_visual_indexes=[0, 1]))
    proc = Qwen2VLImageProcessor(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                 size={"shortest_edge": 65536, "longest_edge": 1 << 20})
    return Qwen3VLForConditionalGeneration(cfg), proc


def _glm4v():
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration, Glm4vImageProcessor
    cfg = Glm4vConfig(text_config=TEXT, vision_config=dict(depth=2, hidden_size=32, num_heads=2, out_hidden_size=32,
                                                           intermediate_size=48, image_size=112))
    return Glm4vForConditionalGeneration(cfg), Glm4vImageProcessor(size={"shortest_edge": 12544,
                                                                         "longest_edge": 1 << 21})


GLM_VISION = dict(depth=2, hidden_size=32, num_heads=2, out_hidden_size=32, intermediate_size=48, image_size=112)


def _glm4v_moe():
    """GLM-4.5V's layout (`Glm4vMoeForConditionalGeneration`, model_type glm4v_moe): a MoE text model
    beside the GLM-4.1V vision tower."""
    from transformers import Glm4vImageProcessor, Glm4vMoeConfig, Glm4vMoeForConditionalGeneration
    text = dict(TEXT, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                first_k_dense_replace=0)
    cfg = Glm4vMoeConfig(text_config=text, vision_config=GLM_VISION)
    return Glm4vMoeForConditionalGeneration(cfg), Glm4vImageProcessor(size={"shortest_edge": 12544,
                                                                             "longest_edge": 1 << 21})


def _glm46v():
    """GLM-4.6V's layout (`Glm46VForConditionalGeneration`, model_type glm46v), its own processor class."""
    from transformers import Glm46VConfig, Glm46VForConditionalGeneration, Glm46VImageProcessor
    cfg = Glm46VConfig(text_config=TEXT, vision_config=GLM_VISION)
    return Glm46VForConditionalGeneration(cfg), Glm46VImageProcessor(size={"shortest_edge": 12544,
                                                                            "longest_edge": 1 << 21})


def _glm_ocr():
    """GLM-OCR (`GlmOcrForConditionalGeneration`, model_type glm_ocr) with the processor class its
    published preprocessor_config.json names (Glm46VImageProcessor)."""
    from transformers import Glm46VImageProcessor, GlmOcrConfig, GlmOcrForConditionalGeneration
    cfg = GlmOcrConfig(text_config=TEXT, vision_config=GLM_VISION)        # no position table: image_size unused
    return GlmOcrForConditionalGeneration(cfg), Glm46VImageProcessor(size={"shortest_edge": 12544,
                                                                            "longest_edge": 1 << 21})


def _exaone4_5():
    """EXAONE-4.5 (`Exaone4_5_ForConditionalGeneration`): grouped key/value heads (4 query heads over 2),
    saved with the image processor transformers maps model_type exaone4_5 to (its PIL variant here)."""
    from transformers import Exaone4_5_Config, Exaone4_5_ForConditionalGeneration
    from transformers.models.auto.image_processing_auto import (IMAGE_PROCESSOR_MAPPING_NAMES,
                                                                get_image_processor_class_from_name)
    cfg = Exaone4_5_Config(text_config=dict(TEXT, model_type="exaone4"),
                           vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4,
                                              num_key_value_heads=2, out_hidden_size=32, fullatt_block_indexes=[1]))
    processor = get_image_processor_class_from_name(IMAGE_PROCESSOR_MAPPING_NAMES["exaone4_5"]["pil"])
    return Exaone4_5_ForConditionalGeneration(cfg), processor()


# checkpoint layout -> the model and processor that save it; the family each loads as
MODELS = {"qwen2-vl": _qwen2_vl, "qwen2.5-vl": _qwen2_5_vl, "qwen3-vl": _qwen3_vl, "glm4v": _glm4v,
          "glm4v_moe": _glm4v_moe, "glm46v": _glm46v, "glm_ocr": _glm_ocr,
          "exaone4.5": _exaone4_5}
FAMILY_OF = {"glm4v_moe": "glm4v", "glm46v": "glm4v", "glm_ocr": "glm-ocr"}


def save_model(family, folder, seed, **save_kw):
    """A tiny model of ``family`` with fresh random weights (norm scales around 1) saved into
    ``folder`` with its image processor's config; returns the model's vision tower."""
    torch.manual_seed(seed)
    model, processor = MODELS[family]()
    visual = model.model.visual
    with torch.no_grad():
        for name, p in visual.named_parameters():
            r = torch.randn_like(p)
            p.copy_(1 + 0.1 * r if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight"))
                    else 0.05 * r)
    model.save_pretrained(folder, **save_kw)
    processor.save_pretrained(folder)
    return visual.eval()



@pytest.mark.parametrize("family", list(MODELS))
def test_a_saved_checkpoint_gives_the_embeddings_of_the_model_that_saved_it(family, photos, tmp_path, seed):
    shard = dict(max_shard_size="100KB") if family == "qwen3-vl" else {}
    visual = save_model(family, tmp_path, seed, **shard)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
    cfg = resolve_config(tmp_path)
    assert cfg.family == FAMILY_OF.get(family, family) and cfg.name == tmp_path.name
    tower = load_vision_weights(build_tower(cfg).eval(), tmp_path)
    batch = wb.preprocess([photos["chelsea"], photos["rocket"], wb.Video(wb.sample_video(2))], cfg, normalize=True)
    with torch.no_grad():
        out = tower(batch.pixels, batch.grid_thw)
    ref = hf_embeddings(visual, batch.pixels, batch.grid_thw)
    assert out.shape == ref.shape == (batch.n_rows // 4, cfg.embed_width)
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("family", list(MODELS))
def test_the_folders_processor_constants_reach_preprocess(family, photos, tmp_path, seed):
    """wb.preprocess with the folder's config cuts the same grid as the folder's own processor and
    normalizes with its constants (not a preset's)."""
    from transformers import AutoImageProcessor
    save_model(family, tmp_path, seed)
    cfg = resolve_config(tmp_path)
    pp = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert cfg.image_mean == tuple(pp["image_mean"]) and cfg.image_std == tuple(pp["image_std"])
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    for name in ("chelsea", "rocket", "coffee"):
        ours = wb.preprocess([photos[name]], cfg, normalize=True)
        theirs = processor(images=[photos[name]], return_tensors="pt")
        assert ours.grid_thw.tolist() == theirs["image_grid_thw"].tolist(), name
        # resampling differs in the last bit between PIL paths; the normalization must not
        assert (ours.pixels - theirs["pixel_values"]).abs().mean() < 0.05


@pytest.mark.parametrize("family", ["qwen2-vl", "glm4v"])
def test_both_vision_key_layouts_load(family, tmp_path, seed, photos):
    """transformers writes `visual.*` for some families (Qwen2-VL checkpoints keep their original
    layout) and `model.visual.*` for others: the folder is rewritten in the other layout."""
    from safetensors.torch import load_file, save_file
    visual = save_model(family, tmp_path, seed)
    sd = load_file(str(tmp_path / "model.safetensors"))
    if any(k.startswith("model.visual.") for k in sd):
        sd = {k.replace("model.visual.", "visual.", 1): v for k, v in sd.items()}
    else:
        assert any(k.startswith("visual.") for k in sd)
        sd = {("model." + k if k.startswith("visual.") else k): v for k, v in sd.items()}
    save_file(sd, str(tmp_path / "model.safetensors"))
    cfg = resolve_config(tmp_path)
    tower = load_vision_weights(build_tower(cfg).eval(), tmp_path)
    batch = wb.preprocess([photos["coffee"]], cfg, normalize=True)
    with torch.no_grad():
        assert rel_err(tower(batch.pixels, batch.grid_thw), hf_embeddings(visual, batch.pixels, batch.grid_thw)) < 1e-5


class TensorReads:
    """Records the tensors read from safetensors files (`safe_open(...).get_tensor`) in ``keys``."""

    def __init__(self, monkeypatch):
        import safetensors
        self.keys: list[str] = []
        real, reads = safetensors.safe_open, self

        class Recording:
            def __init__(self, *a, **kw):
                self.f = real(*a, **kw)

            def __enter__(self):
                self.inner = self.f.__enter__()
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

            def keys(self):
                return self.inner.keys()

            def get_slice(self, k):
                return self.inner.get_slice(k)

            def get_tensor(self, k):
                reads.keys.append(k)
                return self.inner.get_tensor(k)

        monkeypatch.setattr(safetensors, "safe_open", Recording)


def test_only_vision_tensors_are_read(tmp_path, seed, monkeypatch):
    save_model("qwen3-vl", tmp_path, seed, max_shard_size="100KB")
    read = TensorReads(monkeypatch).keys
    cfg = resolve_config(tmp_path)
    load_vision_weights(build_tower(cfg), tmp_path)
    assert read and all(k.startswith("model.visual.") for k in read)
    assert len(read) == len([k for k in build_tower(cfg).state_dict() if not k.startswith("input_norm.")])


# ---- bad folders: a clear error before any weights are read, nothing half-built -------------------

@pytest.fixture
def saved(tmp_path, seed):
    save_model("glm4v", tmp_path / "m", seed)
    return tmp_path / "m"


def _edit(path, **changes):
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data))


def test_a_missing_folder_or_config_is_named(saved, tmp_path):
    with pytest.raises(CheckpointError, match=r"nowhere: not a folder"):
        read_vision_config(tmp_path / "nowhere")
    (saved / "config.json").unlink()
    with pytest.raises(CheckpointError, match=rf"{saved}: no config\.json"):
        resolve_config(saved)


def test_a_missing_preprocessor_config_is_named(saved):
    (saved / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no preprocessor_config\.json"):
        read_vision_config(saved)


def test_an_unknown_family_lists_the_known_ones(saved):
    _edit(saved / "config.json", model_type="llava")
    with pytest.raises(CheckpointError, match=r"model_type 'llava' is not a known family; known families .*"
                                              r"qwen2-vl \(qwen2_vl\).*qwen3-vl \(qwen3_vl, qwen3_vl_moe\).*glm4v"):
        read_vision_config(saved)


@pytest.mark.parametrize("change, match", [
    (dict(patch_size=16), r"patch_size=16 disagrees with config\.json's vision_config \(patch_size=14\)"),
    (dict(merge_size=4), r"merge_size=4 disagrees"),
    (dict(image_mean=[0.5, 0.5]), r"image_mean=\[0\.5, 0\.5\] must hold 3 numbers"),
    (dict(image_std=[0.5, 0.0, 0.5]), r"image_std=.*finite numbers > 0"),
    (dict(image_std=None), r"no 'image_std'"),
    (dict(size=None), r"no pixel bounds"),
])
def test_a_processor_that_disagrees_with_the_vision_config_is_refused(saved, change, match):
    _edit(saved / "preprocessor_config.json", **change)
    with pytest.raises(CheckpointError, match=match):
        read_vision_config(saved)


def test_a_vision_config_the_tower_cannot_run_is_refused(saved):
    config = json.loads((saved / "config.json").read_text())
    config["vision_config"]["hidden_act"] = "gelu"
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: vision_config hidden_act='gelu': this tower supports "
                                              r"only 'silu'"):
        read_vision_config(saved)
    del config["vision_config"]["depth"]
    config["vision_config"]["hidden_act"] = "silu"
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"vision_config has no 'depth'"):
        read_vision_config(saved)


@pytest.mark.parametrize("edit, match", [
    ("drop", r"vision tensors missing from the checkpoint: blocks\.0\.attn\.qkv\.weight"),
    ("reshape", r"shape mismatch: model\.visual\.merger\.proj\.weight \(in model\.safetensors\): checkpoint "
                r"\(32, 16\) vs tower \(32, 32\)"),
])
def test_a_missing_or_misshaped_tensor_is_named_and_nothing_is_loaded(saved, edit, match):
    from safetensors.torch import load_file, save_file
    cfg = read_vision_config(saved)
    sd = load_file(str(saved / "model.safetensors"))
    if edit == "drop":
        del sd["model.visual.blocks.0.attn.qkv.weight"]
    else:
        sd["model.visual.merger.proj.weight"] = sd["model.visual.merger.proj.weight"][:, :16].contiguous()
    save_file(sd, str(saved / "model.safetensors"))
    tower = build_tower(cfg).init_random(1)
    before = {k: v.clone() for k, v in tower.state_dict().items()}
    with pytest.raises(CheckpointError, match=match):
        load_vision_weights(tower, saved)
    assert all(torch.equal(before[k], v) for k, v in tower.state_dict().items())


def test_missing_weights_or_shards_are_named(saved, tmp_path, seed):
    (saved / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors or model\.safetensors\.index\.json"):
        load_vision_weights(build_tower(read_vision_config(saved)), saved)
    sharded = tmp_path / "sharded"
    save_model("qwen3-vl", sharded, seed, max_shard_size="100KB")
    shard = sorted(sharded.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"shard\(s\) {shard.name} named in model\.safetensors\.index\.json "
                                              r"are missing"):
        load_vision_weights(build_tower(read_vision_config(sharded)), sharded)


def test_a_folder_without_vision_tensors_is_refused(saved):
    from safetensors.torch import load_file, save_file
    sd = load_file(str(saved / "model.safetensors"))
    save_file({k: v for k, v in sd.items() if "visual" not in k}, str(saved / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no vision tensors \(no key starts with model\.visual\. or visual\.\)"):
        load_vision_weights(build_tower(read_vision_config(saved)), saved)


def test_the_folder_config_is_a_plain_config(saved):
    cfg = read_vision_config(saved, name="glm-tiny")
    assert cfg.name == "glm-tiny" and cfg.family == "glm4v"
    assert (cfg.width, cfg.out_hidden, cfg.mlp_hidden, cfg.merger_hidden, cfg.num_position_embeddings) == (32, 32, 32,
                                                                                                           48, 64)
    # GLM's processor bounds cover a frame's two temporal copies
    assert (cfg.min_pixels, cfg.max_pixels) == (12544 // 2, (1 << 21) // 2)
    shutil.rmtree(saved)


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3-vl"])
def test_build_encoder_from_a_folder_loads_its_config_constants_and_weights(family, photos, tmp_path, seed):
    """wb.build_encoder(folder): the folder's config and processor constants, its vision tensors
    instead of random ones, and the device norm (placement tower) on raw pixels gives the
    embeddings of the model that saved it."""
    visual = save_model(family, tmp_path, seed)
    enc = wb.build_encoder(str(tmp_path), placement="tower", norm="eager", dtype=torch.float32, device="cpu")
    assert enc.cfg == resolve_config(tmp_path)
    raw = wb.preprocess([photos["coffee"], photos["rocket"]], enc.cfg)
    normalized = wb.preprocess([photos["coffee"], photos["rocket"]], enc.cfg, normalize=True)
    out = enc.encode(raw)
    ref = hf_embeddings(visual, normalized.pixels, normalized.grid_thw)
    assert rel_err(out, ref) < 1e-5
    # a preset's architecture with the folder's weights: the same tensors, named by weights=
    again = wb.build_encoder(enc.cfg, placement="processor", norm="eager", dtype=torch.float32, device="cpu",
                             weights=tmp_path)
    assert rel_err(again.encode(normalized), ref) < 1e-5
