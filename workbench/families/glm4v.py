"""GLM-4.1V family spec (transformers' `Glm4vVisionModel`, GLM-4.5V's `Glm4vMoeVisionModel`; the tower
is `workbench.towers.glm4v`): presets, checks, sizes and the transformers mapping.

Presets (vision_config of the published config.json; processor: rescale 1/255, CLIP mean / std,
size {shortest_edge 12544, longest_edge 9633792} in the GLM-V family's preprocessor_config.json;
GLM's smart_resize applies these bounds to both temporal copies of a frame (t = 2), so the
per-frame min/max pixels here are half of them, 6272 / 4816896):

| preset | depth | width | heads | out (= block MLP) | merger | table | source |
|---|---|---|---|---|---|---|---|
| glm-4.1v-9b | 24 | 1536 | 12 | 4096 | 13696 | 576 (336/14 squared) | [a] |
| glm-4.5v | 24 | 1536 | 12 | 4096 | 10944 | 576 | [b] |

All: patch 14, temporal patch 2, merge 2, rms_norm_eps 1e-5, attention_bias false, silu.
[a] zai-org/GLM-4.1V-9B-Thinking: transformers' Glm4vVisionConfig defaults, which its docstring
    gives as that checkpoint's, and the vision_config a public repository's glm4v config test
    quotes (depth 24, hidden 1536, intermediate 13696, 12 heads, patch 14, out 4096).
[b] zai-org/GLM-4.5V config.json as transformers 5.7 printed it in a public model report
    (vision_config: intermediate_size 10944, out_hidden_size 4096, image_size 336), whose weight
    listing also confirms the parameter names and shapes used here.
GLM-4.6V: its config.json was not found in the sources searched; no preset. A GLM-4.6V folder
(model_type glm46v: transformers' Glm46VForConditionalGeneration, whose vision config is a
Glm4vVisionConfig) loads as this family, as does a GLM-4.5V one (glm4v_moe); tests/test_checkpoints.py
saves both layouts and checks their embeddings against the transformers model that saved them.
"""
from __future__ import annotations

import math

from .base import Family, check_position_table, check_unused, expect, get, hf_common, need

# the GLM-V processor's size bounds (total pixels of a frame's two temporal copies), per frame
GLM_PROCESSOR = dict(patch_size=14, eps=1e-5, min_pixels=12544 // 2, max_pixels=9633792 // 2)
GLM_TOWER = dict(depth=24, width=1536, heads=12, mlp_hidden=4096, out_hidden=4096, num_position_embeddings=576,
                 **GLM_PROCESSOR)


class Glm4vFamily(Family):
    name = "glm4v"
    hf_class = ("transformers.models.glm4v.modeling_glm4v", "Glm4vVisionModel")
    hf_class_aliases = ("Glm4vMoeVisionModel",)         # GLM-4.5V's checkpoints (glm4v_moe)
    model_types = ("glm4v", "glm4v_moe", "glm46v")
    study_presets = ("tiny-glm4v", "glm-4.1v-9b")
    vllm_encoder_graphs = True
    presets = (
        dict(name="glm-4.1v-9b", merger_hidden=13696, **GLM_TOWER),
        dict(name="glm-4.5v", merger_hidden=10944, **GLM_TOWER),
        # tiny: an 8 x 8 position table, the processor bounded to ~1 megapixel per frame
        dict(name="tiny-glm4v", depth=2, width=64, heads=4, mlp_hidden=48, out_hidden=48, merger_hidden=96,
             num_position_embeddings=64, **{**GLM_PROCESSOR, "max_pixels": 1 << 20}),
    )

    def hf_model_class(self) -> type:
        from transformers.models.glm4v.modeling_glm4v import Glm4vVisionModel
        return Glm4vVisionModel
    def validate(self, cfg) -> list[str]:
        problems = check_position_table(cfg) + check_unused(cfg, deepstack_indexes=())
        if cfg.merger_hidden <= 0:
            problems.append(f"merger_hidden={cfg.merger_hidden} must be a positive integer (the merger's "
                            f"SwiGLU width, transformers' intermediate_size)")
        if cfg.mlp_hidden != cfg.out_hidden:
            problems.append(f"mlp_hidden={cfg.mlp_hidden} must equal out_hidden={cfg.out_hidden} (transformers' "
                            f"Glm4v blocks take their SwiGLU width from out_hidden_size)")
        return problems

    def n_params(self, cfg) -> int:
        w, o, c, h = cfg.width, cfg.out_hidden, cfg.merger_hidden, cfg.mlp_hidden
        block = 2 * w + 4 * w * w + 3 * w * h                      # two RMSNorms, qkv + proj, SwiGLU
        downsample = o * w * cfg.merge_unit + o
        merger = o * o + 2 * o + 3 * o * c                          # proj, LayerNorm, SwiGLU
        return (w * cfg.patch_dim + w + w + cfg.num_position_embeddings * w + cfg.depth * block + w
                + downsample + merger)

    def row_macs(self, cfg) -> int:
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (4 * w * w + 3 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        o = cfg.out_hidden
        return cfg.width * cfg.merge_unit * o + o * o + 3 * o * cfg.merger_hidden

    def to_hf(self, cfg):
        from transformers.models.glm4v.configuration_glm4v import Glm4vVisionConfig
        return Glm4vVisionConfig(
            depth=cfg.depth, hidden_size=cfg.width, hidden_act="silu", attention_bias=False, num_heads=cfg.heads,
            in_channels=cfg.in_channels, image_size=math.isqrt(cfg.num_position_embeddings) * cfg.patch_size,
            patch_size=cfg.patch_size, rms_norm_eps=cfg.eps, spatial_merge_size=cfg.merge_size,
            temporal_patch_size=cfg.temporal_patch_size, out_hidden_size=cfg.out_hidden,
            intermediate_size=cfg.merger_hidden,
            rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta})

    def from_hf(self, vc: dict) -> dict:
        expect(vc, "hidden_act", "silu", "silu")
        expect(vc, "attention_bias", False, False)
        common = hf_common(vc)
        side = need(vc, "image_size") // common["patch_size"]
        out = need(vc, "out_hidden_size")
        return dict(common, width=need(vc, "hidden_size"), mlp_hidden=out, out_hidden=out,
                    merger_hidden=need(vc, "intermediate_size"), num_position_embeddings=side * side,
                    eps=get(vc, "rms_norm_eps", 1e-5))

    def frame_pixels(self, shortest_edge, longest_edge, temporal_patch_size):
        """GLM's smart_resize bounds the pixels of a frame's temporal_patch_size copies together."""
        return shortest_edge // temporal_patch_size, longest_edge // temporal_patch_size

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers' Glm4vVisionModel indexes the grid once per frame (a (t, h, w) row with
        t > 1 raises IndexError in its embeddings), so a video goes in as t grids (1, h, w), as
        Glm4vModel.get_video_features passes it."""
        import torch

        frames = torch.repeat_interleave(grid_thw[:, 1:], grid_thw[:, 0], dim=0)
        frames = torch.cat([torch.ones_like(frames[:, :1]), frames], dim=1)
        return super().hf_embeddings(model, pixels, frames)


FAMILY = Glm4vFamily()
