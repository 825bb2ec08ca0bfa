"""GLM-OCR family spec (transformers' `GlmOcrVisionModel`, model_type glm_ocr; the tower is
`workbench.towers.glm_ocr`): presets, checks, sizes and the transformers mapping.

GLM-OCR's tower is built from GLM-4.1V's parts (transformers derives it in modular_glm_ocr.py), but
its math differs, so it is a family of its own rather than a glm4v checkpoint layout:

| | GLM-4.1V (`glm4v`) | GLM-OCR |
|---|---|---|
| after the patch embed | RMSNorm, then a learned position table resampled bicubically | nothing: rotary only |
| qkv / proj bias | no | yes (attention_bias true) |
| q / k | as projected | RMSNorm per head (head_dim wide, rms_norm_eps) before the rotary |
| block MLP width | out_hidden_size | intermediate_size, with biases |
| merger SwiGLU width | intermediate_size | out_hidden_size * in_channels |

The rotary (axial 2-D, theta 10000), the RMSNorm blocks, the post-norm, the 2x2 downsample conv
and the merger's proj -> LayerNorm -> GELU -> SwiGLU are GLM-4.1V's.

Preset (vision_config of zai-org/GLM-OCR's config.json, as re-published unchanged in copies of that
repository, e.g. textagent/GLM-OCR-ONNX and richtext/GLM-OCR; transformers 5.24's
GlmOcrVisionConfig defaults are the same numbers):

| preset | depth | width | heads | block MLP | out | merger | source |
|---|---|---|---|---|---|---|---|
| glm-ocr-0.9b | 24 | 1024 | 16 | 4096 | 1536 | 4608 (= 1536 x 3) | [a] |

[a] vision_config: depth 24, hidden_size 1024, num_heads 16, attention_bias true, intermediate_size
    4096, hidden_act silu, image_size 336 (no position table reads it), patch_size 14,
    out_hidden_size 1536, rms_norm_eps 1e-5, spatial_merge_size 2, temporal_patch_size 2; no
    rope_parameters (theta 10000). The merger width is not in the config: transformers builds it
    out_hidden_size * in_channels wide (vLLM 0.33 takes text_config.intermediate_size, also 4608).
Processor: its preprocessor_config.json (as duplicated from zai-org/GLM-OCR in MurphyA/GLM-OCR) names
Glm46VImageProcessor (transformers 5.24 maps no processor to glm_ocr), whose code is
Glm4vImageProcessor's, with GLM-4.1V's constants (size {shortest_edge 12544, longest_edge 9633792},
CLIP mean / std, patch 14, merge 2, temporal 2): the glm4v family's `GLM_PROCESSOR`, so GLM's
smart_resize bounds both temporal copies together here too.
"""
from __future__ import annotations

from .base import check_unused, expect, get, hf_common, need
from .glm4v import GLM_PROCESSOR, Glm4vFamily


class GlmOcrFamily(Glm4vFamily):
    """GLM-4.1V's spec where GLM-OCR agrees with it (the processor's frame bounds, transformers'
    per-frame video call); its own presets, checks, sizes and transformers mapping."""

    name = "glm-ocr"
    hf_class = ("transformers.models.glm_ocr.modeling_glm_ocr", "GlmOcrVisionModel")
    hf_class_aliases = ()
    model_types = ("glm_ocr",)
    study_presets = ("tiny-glm-ocr", "glm-ocr-0.9b")
    vllm_encoder_graphs = True      # inherited from GLM-4.1V's model class (the audit of vLLM 0.33 and 0.34)
    presets = (
        dict(name="glm-ocr-0.9b", depth=24, width=1024, heads=16, mlp_hidden=4096, out_hidden=1536,
             merger_hidden=1536 * 3, **GLM_PROCESSOR),
        # tiny: head_dim 16 (the q/k norms and the 2-D rotary), the processor bounded to ~1 megapixel
        dict(name="tiny-glm-ocr", depth=2, width=64, heads=4, mlp_hidden=96, out_hidden=48, merger_hidden=48 * 3,
             **{**GLM_PROCESSOR, "max_pixels": 1 << 20}),
    )

    def hf_model_class(self) -> type:
        from transformers.models.glm_ocr.modeling_glm_ocr import GlmOcrVisionModel
        return GlmOcrVisionModel

    def validate(self, cfg) -> list[str]:
        problems = check_unused(cfg, num_position_embeddings=0, deepstack_indexes=())
        want = cfg.out_hidden * cfg.in_channels
        if cfg.merger_hidden != want:
            problems.append(f"merger_hidden={cfg.merger_hidden} must equal out_hidden * in_channels = {want} "
                            f"(transformers' GlmOcrVisionModel builds its merger's SwiGLU that wide)")
        return problems

    def n_params(self, cfg) -> int:
        w, o, c, h, d = cfg.width, cfg.out_hidden, cfg.merger_hidden, cfg.mlp_hidden, cfg.head_dim
        block = 2 * w + 4 * w * w + 4 * w + 2 * d + 3 * w * h + 2 * h + w   # norms, qkv + proj, q/k norms, MLP
        downsample = o * w * cfg.merge_unit + o
        merger = o * o + 2 * o + 3 * o * c                                  # proj, LayerNorm, SwiGLU
        return w * cfg.patch_dim + w + cfg.depth * block + w + downsample + merger

    # row_macs / token_macs: GLM-4.1V's (the same matmuls; the q/k norms multiply no matrix)

    def to_hf(self, cfg):
        from transformers.models.glm_ocr.configuration_glm_ocr import GlmOcrVisionConfig
        return GlmOcrVisionConfig(
            depth=cfg.depth, hidden_size=cfg.width, hidden_act="silu", attention_bias=True, num_heads=cfg.heads,
            in_channels=cfg.in_channels, patch_size=cfg.patch_size, rms_norm_eps=cfg.eps,
            spatial_merge_size=cfg.merge_size, temporal_patch_size=cfg.temporal_patch_size,
            out_hidden_size=cfg.out_hidden, intermediate_size=cfg.mlp_hidden,
            rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta})

    def from_hf(self, vc: dict) -> dict:
        expect(vc, "hidden_act", "silu", "silu")
        expect(vc, "attention_bias", True, True)
        common = hf_common(vc)
        out = need(vc, "out_hidden_size")
        return dict(common, width=need(vc, "hidden_size"), mlp_hidden=need(vc, "intermediate_size"), out_hidden=out,
                    merger_hidden=out * common["in_channels"], eps=get(vc, "rms_norm_eps", 1e-5))


FAMILY = GlmOcrFamily()
