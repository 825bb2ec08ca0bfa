import dataclasses

import pytest

import workbench as wb
from workbench.config import PRESETS


def test_binding_preset_names_exist():
    assert set(wb.PRESET_NAMES) == {"qwen2-vl-2b", "qwen2-vl-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b",
                                    "qwen2.5-vl-72b", "tiny-qwen2-vl", "tiny-qwen2.5-vl"}


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
    assert hf.depth == cfg.depth and hf.num_heads == cfg.heads
    if cfg.family == "qwen2-vl":
        assert type(hf).__name__ == "Qwen2VLVisionConfig"
        assert (hf.embed_dim, hf.hidden_size, hf.mlp_ratio * hf.embed_dim) == (cfg.width, cfg.out_hidden,
                                                                                cfg.mlp_hidden)
    else:
        assert type(hf).__name__ == "Qwen2_5_VLVisionConfig"
        assert (hf.hidden_size, hf.out_hidden_size, hf.intermediate_size) == (cfg.width, cfg.out_hidden,
                                                                               cfg.mlp_hidden)
        assert list(hf.fullatt_block_indexes) == list(cfg.fullatt_blocks)


def test_reduced_keeps_full_attention_blocks_for_qwen25():
    cfg = wb.VisionConfig.preset("qwen2.5-vl-7b").reduced(16)
    assert cfg.depth == 16 and cfg.fullatt_blocks == (7, 15)
    assert wb.VisionConfig.preset("qwen2.5-vl-7b").reduced(2).fullatt_blocks == (1,)


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
