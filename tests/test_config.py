import dataclasses

import pytest

import workbench as wb
from workbench.config import PRESETS


def test_binding_preset_names_exist():
    assert set(wb.PRESET_NAMES) == {"qwen2-vl-2b", "qwen2-vl-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b",
                                    "qwen2.5-vl-72b", "tiny-qwen2-vl", "tiny-qwen2.5-vl",
                                    "qwen3-vl-2b", "qwen3-vl-4b", "qwen3-vl-8b", "qwen3-vl-30b-a3b",
                                    "qwen3-vl-235b-a22b", "tiny-qwen3-vl", "qwen3.5-9b", "tiny-qwen3.5",
                                    "glm-4.1v-9b", "glm-4.5v", "tiny-glm4v", "glm-ocr-0.9b", "tiny-glm-ocr",
                                    "exaone4.5-33b", "tiny-exaone4.5", "mistral-small-3.1-24b", "tiny-pixtral",
                                    "kimi-k2.5-1t", "tiny-kimi-k2.5", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b",
                                    "tiny-gemma3", "gemma-4-e2b", "tiny-gemma4", "nemotron-nano-vl-v2",
                                    "tiny-nemotron-vl"}
    # real checkpoints first, then the tiny ones; the original presets keep their order
    names = list(wb.PRESET_NAMES)
    assert [n for n in names if n.startswith(("qwen2-", "qwen2.5-"))] == [
        "qwen2-vl-2b", "qwen2-vl-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen2.5-vl-72b"]
    tiny = [n.startswith("tiny-") for n in names]
    assert tiny == sorted(tiny)


@pytest.mark.parametrize("name, out", [("qwen2-vl-2b", 1536), ("qwen2-vl-7b", 3584), ("qwen2.5-vl-3b", 2048),
                                       ("qwen2.5-vl-7b", 3584), ("qwen2.5-vl-72b", 8192)])
def test_real_presets_have_the_checkpoint_sizes(name, out):
    cfg = wb.VisionConfig.preset(name)
    assert (cfg.depth, cfg.width, cfg.heads, cfg.head_dim, cfg.patch_dim, cfg.out_hidden) == (32, 1280, 16, 80,
                                                                                              1176, out)
    assert cfg.mlp_hidden == (5120 if cfg.family == "qwen2-vl" else 3420)
    if cfg.family == "qwen2.5-vl":
        assert cfg.fullatt_blocks == (7, 15, 23, 31) and cfg.window_merged == 4


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown preset 'qwen3'.*qwen2-vl-2b.*tiny-qwen2.5-vl"):
        wb.VisionConfig.preset("qwen3")


@pytest.mark.parametrize("change, match", [
    (dict(heads=5), "not divisible by heads"),
    (dict(width=72, heads=12), "divisible by 4"),
    (dict(family="llava"), "family='llava' is not one of"),
    (dict(depth=0), "depth=0 must be a positive integer"),
    (dict(window_size=100), "window_size=100"),
    (dict(depth=2), r"fullatt_blocks \[3\] are outside"),
    (dict(min_pixels=10**9), "exceeds max_pixels"),
])
def test_inconsistent_config_is_rejected_with_reason(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PRESETS["tiny-qwen2.5-vl"], **change)


@pytest.mark.parametrize("name", wb.PRESET_NAMES)
def test_to_hf_matches_the_config(name):
    cfg = wb.VisionConfig.preset(name)
    hf = cfg.to_hf()
    if cfg.family == "pixtral":        # Mistral3's config: the Pixtral vision config and the projector's fields
        assert type(hf).__name__ == "Mistral3Config" and type(hf.vision_config).__name__ == "PixtralVisionConfig"
        vc = hf.vision_config
        assert (vc.num_hidden_layers, vc.num_attention_heads, vc.hidden_size, vc.intermediate_size) == (
            cfg.depth, cfg.heads, cfg.width, cfg.mlp_hidden)
        assert (vc.patch_size, hf.spatial_merge_size, vc.hidden_act) == (cfg.patch_size, cfg.merge_size, "silu")
        assert (hf.text_config.hidden_size, hf.text_config.rms_norm_eps) == (cfg.out_hidden, cfg.eps)
        assert hf.vision_feature_layer == -1 and hf.multimodal_projector_bias is False
        return
    if cfg.family == "gemma3":         # Gemma3Config: the SigLIP vision config and the projector's fields
        vc = hf.vision_config
        assert (type(hf).__name__, type(vc).__name__) == ("Gemma3Config", "SiglipVisionConfig")
        assert (vc.num_hidden_layers, vc.num_attention_heads, vc.hidden_size, vc.intermediate_size) == (
            cfg.depth, cfg.heads, cfg.width, cfg.mlp_hidden)
        assert (vc.image_size // vc.patch_size) ** 2 == cfg.num_position_embeddings and vc.patch_size == cfg.patch_size
        assert (vc.hidden_act, vc.layer_norm_eps, vc.vision_use_head) == ("gelu_pytorch_tanh", cfg.eps, False)
        assert hf.mm_tokens_per_image * cfg.merge_unit == cfg.num_position_embeddings
        assert hf.text_config.hidden_size == cfg.out_hidden
        return
    if cfg.family == "gemma4":         # Gemma4Config: the Gemma-4 vision config and the embedder's width
        vc = hf.vision_config
        assert (type(hf).__name__, type(vc).__name__) == ("Gemma4Config", "Gemma4VisionConfig")
        assert (vc.num_hidden_layers, vc.num_attention_heads, vc.hidden_size, vc.intermediate_size) == (
            cfg.depth, cfg.heads, cfg.width, cfg.mlp_hidden)
        assert (vc.patch_size, vc.pooling_kernel_size, vc.position_embedding_size, vc.head_dim) == (
            cfg.patch_size, cfg.merge_size, cfg.num_position_embeddings, cfg.head_dim)
        assert (vc.rms_norm_eps, vc.rope_parameters["rope_theta"]) == (cfg.eps, cfg.rope_theta)
        assert hf.text_config.hidden_size == cfg.out_hidden
        return
    if cfg.family == "nemotron-vl":    # the Omni config: the RADIO vision config and the projector's fields
        vc = hf.vision_config
        assert (type(hf).__name__, type(vc).__name__) == ("NemotronH_Omni_Reasoning_V3_Config", "RadioConfig")
        assert (vc.num_hidden_layers, vc.num_attention_heads, vc.hidden_size) == (cfg.depth, cfg.heads, cfg.width)
        assert int(vc.hidden_size * vc.mlp_ratio) == cfg.mlp_hidden and vc.patch_size == cfg.patch_size
        assert (vc.max_img_size // vc.patch_size) ** 2 == cfg.num_position_embeddings and vc.layer_norm_eps == cfg.eps
        assert (hf.downsample_ratio, hf.projector_hidden_size) == (1 / cfg.merge_size, cfg.merger_hidden)
        assert hf.text_config.hidden_size == cfg.out_hidden
        return
    if cfg.family == "kimi-k2.5":      # the model's config (vision config and projector), other names
        vc = hf.vision_config
        assert (vc.num_hidden_layers, vc.num_attention_heads, vc.patch_size) == (cfg.depth, cfg.heads, cfg.patch_size)
        assert list(vc.merge_kernel_size) == [cfg.merge_size] * 2 and cfg.temporal_patch_size == 1
    else:
        assert hf.depth == cfg.depth and hf.num_heads == cfg.heads
        assert (hf.patch_size, hf.spatial_merge_size, hf.temporal_patch_size) == (cfg.patch_size, cfg.merge_size,
                                                                                  cfg.temporal_patch_size)
    if cfg.family == "qwen2-vl":
        assert type(hf).__name__ == "Qwen2VLVisionConfig"
        assert (hf.embed_dim, hf.hidden_size, hf.mlp_ratio * hf.embed_dim) == (cfg.width, cfg.out_hidden,
                                                                                cfg.mlp_hidden)
    elif cfg.family == "qwen2.5-vl":
        assert type(hf).__name__ == "Qwen2_5_VLVisionConfig"
        assert (hf.hidden_size, hf.out_hidden_size, hf.intermediate_size) == (cfg.width, cfg.out_hidden,
                                                                               cfg.mlp_hidden)
        assert list(hf.fullatt_block_indexes) == list(cfg.fullatt_blocks)
    elif cfg.family in ("qwen3-vl", "qwen3.5"):
        assert type(hf).__name__ == {"qwen3-vl": "Qwen3VLVisionConfig", "qwen3.5": "Qwen3_5VisionConfig"}[cfg.family]
        assert (hf.hidden_size, hf.out_hidden_size, hf.intermediate_size) == (cfg.width, cfg.out_hidden,
                                                                               cfg.mlp_hidden)
        assert hf.num_position_embeddings == cfg.num_position_embeddings and hf.hidden_act == "gelu_pytorch_tanh"
        assert list(getattr(hf, "deepstack_visual_indexes", [])) == list(cfg.deepstack_indexes)
    elif cfg.family == "exaone4.5":
        assert type(hf).__name__ == "Exaone4_5_VisionConfig"
        assert (hf.hidden_size, hf.out_hidden_size, hf.intermediate_size) == (cfg.width, cfg.out_hidden,
                                                                               cfg.mlp_hidden)
        assert hf.num_key_value_heads == cfg.n_kv_heads and cfg.heads % hf.num_key_value_heads == 0
        assert list(hf.fullatt_block_indexes) == list(cfg.fullatt_blocks) and hf.window_size == cfg.window_size
    elif cfg.family == "kimi-k2.5":
        vc = hf.vision_config
        assert (type(hf).__name__, type(vc).__name__) == ("Kimi_K25Config", "Kimi_K25VisionConfig")
        assert (vc.hidden_size, hf.text_config.hidden_size, vc.intermediate_size) == (cfg.width, cfg.out_hidden,
                                                                                     cfg.mlp_hidden)
        assert vc.pos_emb_height * vc.pos_emb_width == cfg.num_position_embeddings and vc.hidden_act == "gelu_pytorch_tanh"
        assert hf.projection_hidden_size == cfg.width and hf.projection_layer_norm_eps == cfg.eps
    elif cfg.family == "glm-ocr":
        assert type(hf).__name__ == "GlmOcrVisionConfig"
        assert (hf.hidden_size, hf.out_hidden_size, hf.intermediate_size) == (cfg.width, cfg.out_hidden,
                                                                               cfg.mlp_hidden)
        assert hf.out_hidden_size * hf.in_channels == cfg.merger_hidden
        assert hf.rms_norm_eps == cfg.eps and hf.attention_bias is True
    else:
        assert type(hf).__name__ == "Glm4vVisionConfig"
        assert (hf.hidden_size, hf.out_hidden_size, hf.intermediate_size) == (cfg.width, cfg.out_hidden,
                                                                               cfg.merger_hidden)
        assert (hf.image_size // hf.patch_size) ** 2 == cfg.num_position_embeddings
        assert hf.rms_norm_eps == cfg.eps and hf.attention_bias is False


@pytest.mark.parametrize("name, out, deepstack", [
    ("qwen3-vl-2b", 2048, (5, 11, 17)), ("qwen3-vl-4b", 2560, (5, 11, 17)), ("qwen3-vl-8b", 4096, (8, 16, 24)),
    ("qwen3-vl-30b-a3b", 2048, (8, 16, 24)), ("qwen3-vl-235b-a22b", 4096, (8, 16, 24)), ("qwen3.5-9b", 4096, ()),
])
def test_qwen3_presets_have_the_published_sizes(name, out, deepstack):
    cfg = wb.VisionConfig.preset(name)
    tower = (24, 1024, 4096) if deepstack[:1] == (5,) else (27, 1152, 4304)
    assert (cfg.depth, cfg.width, cfg.mlp_hidden) == tower and cfg.heads == 16
    assert (cfg.out_hidden, cfg.deepstack_indexes) == (out, deepstack)
    assert cfg.embed_width == out * (1 + len(deepstack))
    assert (cfg.patch_size, cfg.patch_dim, cfg.num_position_embeddings) == (16, 1536, 2304)
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5) and cfg.rescale_factor == 1 / 255
    assert (cfg.min_pixels, cfg.max_pixels) == (65536, 16777216)


@pytest.mark.parametrize("name, merger", [("glm-4.1v-9b", 13696), ("glm-4.5v", 10944)])
def test_glm_presets_have_the_published_sizes(name, merger):
    cfg = wb.VisionConfig.preset(name)
    assert (cfg.depth, cfg.width, cfg.heads, cfg.head_dim, cfg.out_hidden, cfg.mlp_hidden) == (24, 1536, 12, 128,
                                                                                               4096, 4096)
    assert (cfg.merger_hidden, cfg.num_position_embeddings, cfg.patch_size, cfg.eps) == (merger, 576, 14, 1e-5)
    assert cfg.embed_width == 4096 and cfg.image_mean == wb.VisionConfig.preset("qwen2-vl-7b").image_mean
    # the processor's bounds cover both temporal copies of a frame: per frame they are halved
    assert (2 * cfg.min_pixels, 2 * cfg.max_pixels) == (12544, 9633792)


def test_reduced_keeps_full_attention_blocks_for_qwen25():
    cfg = wb.VisionConfig.preset("qwen2.5-vl-7b").reduced(16)
    assert cfg.depth == 16 and cfg.fullatt_blocks == (7, 15)
    assert wb.VisionConfig.preset("qwen2.5-vl-7b").reduced(2).fullatt_blocks == (1,)


def test_reduced_spreads_the_deepstack_layers():
    cfg = wb.VisionConfig.preset("qwen3-vl-8b")
    assert cfg.reduced(16).deepstack_indexes == (4, 9, 14)
    assert cfg.reduced(4).deepstack_indexes == (1, 2, 3) and cfg.reduced(4).embed_width == 4 * 4096
    # two layers landing on one block merge: the output narrows with them
    assert cfg.reduced(2).deepstack_indexes == (0, 1) and cfg.reduced(2).embed_width == 3 * 4096
    assert wb.VisionConfig.preset("glm-4.1v-9b").reduced(3).depth == 3


@pytest.mark.parametrize("preset, change, match", [
    ("tiny-qwen3-vl", dict(deepstack_indexes=(2, 1)), r"deepstack_indexes=\(2, 1\) must be increasing block indices"),
    ("tiny-qwen3-vl", dict(deepstack_indexes=(1, 4)), r"in 0\.\.3 \(depth=4\)"),
    ("tiny-qwen3-vl", dict(deepstack_indexes=[1.5]), r"deepstack_indexes=\(1\.5,\) must be a tuple"),
    ("tiny-qwen3-vl", dict(num_position_embeddings=250), r"num_position_embeddings=250 must be a positive square"),
    ("tiny-qwen3-vl", dict(num_position_embeddings=0), r"num_position_embeddings=0 must be a positive square"),
    ("tiny-qwen3-vl", dict(merger_hidden=8), r"merger_hidden=8: the qwen3-vl tower has no use for it"),
    ("tiny-qwen3.5", dict(deepstack_indexes=(0,)), r"deepstack_indexes=\(0,\): the qwen3.5 tower has no use"),
    ("tiny-glm4v", dict(merger_hidden=0), r"merger_hidden=0 must be a positive integer"),
    ("tiny-glm4v", dict(mlp_hidden=64), r"mlp_hidden=64 must equal out_hidden=48"),
    ("tiny-qwen2-vl", dict(num_position_embeddings=64), r"num_position_embeddings=64: the qwen2-vl tower has no"),
    ("tiny-qwen2.5-vl", dict(deepstack_indexes=(1,)), r"deepstack_indexes=\(1,\): the qwen2.5-vl tower"),
    ("tiny-glm4v", dict(num_position_embeddings=-4), r"num_position_embeddings=-4 must be a non-negative integer"),
])
def test_family_specific_fields_are_checked(preset, change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PRESETS[preset], **change)


def test_unknown_family_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"family='llava' is not one of \('qwen2-vl', 'qwen2.5-vl', 'exaone4.5', "
                                         r"'qwen3-vl', 'qwen3.5', 'glm4v', 'glm-ocr', 'pixtral', 'kimi-k2.5', "
                                         r"'gemma3', 'gemma4', 'nemotron-vl'\)"):
        wb.VisionConfig("x", family="llava")


def test_config_module_imports_no_torch():
    """The family registry (towers, torch) loads on first use, not when workbench.config is imported."""
    import subprocess
    import sys
    code = "import sys, workbench.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_normalization_constants():
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    for c in range(3):
        assert cfg.norm_scale[c] == pytest.approx(1 / 255 / cfg.image_std[c])
        assert cfg.norm_shift[c] == pytest.approx(-cfg.image_mean[c] / cfg.image_std[c])


# Values that pass the old checks but make `encode` return non-finite embeddings without a word:
# each must be rejected with the bad value and what was expected.
_NAN, _INF = float("nan"), float("inf")


@pytest.mark.parametrize("change, match", [
    (dict(eps=-1), r"eps=-1 must be a finite number > 0"),
    (dict(eps=0), r"eps=0 must be a finite number > 0"),
    (dict(eps=_NAN), r"eps=nan must be a finite number > 0"),
    (dict(eps=_INF), r"eps=inf must be a finite number > 0"),
    (dict(eps="1e-6"), r"eps='1e-6' must be a finite number > 0"),
    (dict(rope_theta=0), r"rope_theta=0 must be a finite number > 0"),
    (dict(rope_theta=-10000.0), r"rope_theta=-10000\.0 must be a finite number > 0"),
    (dict(rope_theta=_INF), r"rope_theta=inf must be a finite number > 0"),
    (dict(rescale_factor=_NAN), r"rescale_factor=nan must be a finite number > 0"),
    (dict(rescale_factor=_INF), r"rescale_factor=inf must be a finite number > 0"),
    (dict(rescale_factor=0), r"rescale_factor=0 must be a finite number > 0"),
    (dict(rescale_factor=-1 / 255), r"rescale_factor=-0\.0039\d* must be a finite number > 0"),
    (dict(image_std=(0.5, _NAN, 0.5)), r"image_std=\(0\.5, nan, 0\.5\).*finite numbers > 0.*\[1\]"),
    (dict(image_std=(0.5, 0.5, _INF)), r"image_std=.*inf.*finite numbers > 0.*\[2\]"),
    (dict(image_std=(0.0, 0.5, 0.5)), r"image_std=\(0\.0, 0\.5, 0\.5\).*finite numbers > 0.*\[0\]"),
    (dict(image_std=(0.5, -0.5, 0.5)), r"image_std=.*-0\.5.*finite numbers > 0.*\[1\]"),
    (dict(image_mean=(_NAN, 0.5, 0.5)), r"image_mean=\(nan, 0\.5, 0\.5\).*finite numbers.*\[0\]"),
    (dict(image_mean=(0.5, -_INF, 0.5)), r"image_mean=.*-inf.*finite numbers.*\[1\]"),
    (dict(image_mean=(0.5, 0.5)), r"image_mean/image_std need 3 values \(in_channels\), got 2/3"),
    (dict(image_std=(0.5,) * 4), r"image_mean/image_std need 3 values \(in_channels\), got 3/4"),
    (dict(image_mean=0.5), r"image_mean=0\.5 must be a tuple of 3 numbers"),
])
def test_non_finite_or_non_positive_numbers_are_rejected(change, match):
    for preset in ("tiny-qwen2-vl", "tiny-qwen2.5-vl"):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(PRESETS[preset], **change)  # replace re-runs __post_init__
    with pytest.raises(ValueError, match=match):
        wb.VisionConfig("direct", family="qwen2-vl", **change)


def test_all_number_problems_are_reported_together():
    with pytest.raises(ValueError) as e:
        dataclasses.replace(PRESETS["tiny-qwen2-vl"], eps=-1, rope_theta=0, rescale_factor=_NAN)
    assert all(s in str(e.value) for s in ("eps=-1", "rope_theta=0", "rescale_factor=nan"))


def test_valid_number_edge_cases_are_accepted():
    cfg = dataclasses.replace(PRESETS["tiny-qwen2-vl"], eps=1, rope_theta=100, rescale_factor=1,
                              image_mean=(0, -1.5, 2), image_std=(1, 2, 3))
    assert cfg.eps == 1 and cfg.norm_shift == (0.0, 0.75, -2 / 3)
