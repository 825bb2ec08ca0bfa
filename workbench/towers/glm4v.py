"""GLM-4.1V vision tower (transformers' `Glm4vVisionModel`; GLM-4.5V's `Glm4vMoeVisionModel` is
the same tower): patch 14, a post-conv RMSNorm, a learned position table resampled bicubically to
each grid, RMSNorm / SwiGLU blocks, then a post-norm, a 2x2 downsample conv and a SwiGLU merger.

Forward, rows in merge-block order as everywhere here:

    x = post_conv_layernorm(patch_embed(pixels))        Conv3d with bias, then RMSNorm
    x = x + position table resampled to the frame's grid (bicubic, 4 x 4 taps, pixel centres,
        edges clamped: what transformers' `grid_sample(bicubic, border)` call computes)
    x = blocks(x)            RMSNorm pre-norm, qkv and proj without bias, full attention per frame,
                             2-D rotary; MLP: SwiGLU (no bias) whose width is out_hidden
                             (transformers' Glm4v blocks take it from out_hidden_size)
    y = downsample(post_layernorm(x))      Conv2d(width -> out_hidden, kernel = stride = 2) over
                                           each 2x2 merge block == one matmul per merged token
    merged = merger(y)       proj (no bias) -> LayerNorm -> GELU -> SwiGLU of merger_hidden
                             (transformers' intermediate_size)

The tower returns the merged tokens, [N/4, out_hidden]. Video: transformers' Glm4vModel feeds a
video of t frames as t grids (1, h, w) (its embeddings index the grid per frame); frames attend
separately, so a (t, h, w) grid here equals those t frames there.

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

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from .common import (GatedMLP, RMSNorm, TowerMetadata, VisionBlock, VisionTower, add_norm,
                     interpolated_positions)
from .family import Family, check_position_table, check_unused, expect, get, hf_common, need

# transformers' Glm4vVisionPatchMerger builds its LayerNorm with torch's default eps
MERGER_LN_EPS = 1e-5
# the GLM-V processor's size bounds (total pixels of a frame's two temporal copies), per frame
GLM_PROCESSOR = dict(patch_size=14, eps=1e-5, min_pixels=12544 // 2, max_pixels=9633792 // 2)
GLM_TOWER = dict(depth=24, width=1536, heads=12, mlp_hidden=4096, out_hidden=4096, num_position_embeddings=576,
                 **GLM_PROCESSOR)


class Glm4vBlock(VisionBlock):
    def __init__(self, cfg: VisionConfig, gemm_align: int):
        super().__init__(cfg, "rms", GatedMLP(cfg.width, cfg.mlp_hidden, bias=False, gemm_align=gemm_align),
                         qkv_bias=False, proj_bias=False)

    def mlp_out(self, h):
        return self.mlp(h)

    def mlp_fused(self, h):
        return self.mlp.forward_fused(h)


class MergeConv(nn.Module):
    """Conv2d(width -> out, kernel = stride = merge) over each merge block: one matmul per merged
    token. The checkpoint-shaped weight [out, width, m, m] is a view of a [out, m, m, width]
    buffer, which read flat is the matmul weight for the block's m*m consecutive rows (merge-block
    order); repacked after every `_apply` like `GatedMLP`."""

    def __init__(self, width: int, out: int, merge: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out, width, merge, merge))
        self.bias = nn.Parameter(torch.empty(out))
        self._pack()

    def _pack(self) -> None:
        with torch.no_grad():
            packed = self.weight.permute(0, 2, 3, 1).contiguous()            # [out, m, m, width]
        self.weight.data = packed.permute(0, 3, 1, 2)
        self.flat_weight = packed.view(packed.shape[0], -1)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._pack()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # [N, width] -> [N/4, out]
        return F.linear(x.view(-1, self.flat_weight.shape[1]), self.flat_weight, self.bias)


class Glm4vMerger(GatedMLP):
    """proj -> LayerNorm -> GELU -> SwiGLU (gate_proj / up_proj / down_proj, no bias)."""

    def __init__(self, dim: int, hidden: int, gemm_align: int):
        super().__init__(dim, hidden, bias=False, gemm_align=gemm_align)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.post_projection_norm = nn.LayerNorm(dim, eps=MERGER_LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.gelu(self.post_projection_norm(self.proj(x))))

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        _, y = add_norm(self.proj(x), None, self.post_projection_norm)
        return super().forward_fused(F.gelu(y))


class Glm4vVisionTower(VisionTower):
    family = "glm4v"
    patch_bias = True
    position_resampling = "bicubic"

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.embeddings = nn.Module()
        self.embeddings.position_embedding = nn.Embedding(cfg.num_position_embeddings, cfg.width)
        self.post_conv_layernorm = RMSNorm(cfg.width, cfg.eps)
        self.blocks = nn.ModuleList(Glm4vBlock(cfg, self.gemm_align) for _ in range(cfg.depth))
        self.post_layernorm = RMSNorm(cfg.width, cfg.eps)
        self.downsample = MergeConv(cfg.width, cfg.out_hidden, cfg.merge_size)
        self.merger = Glm4vMerger(cfg.out_hidden, cfg.merger_hidden, self.gemm_align)
        self.table_side = math.isqrt(cfg.num_position_embeddings)

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, patch_dim] -> merged embeddings [n_rows/4, out_hidden], fixed shapes only."""
        x = self.post_conv_layernorm(self.patch_embed(self.embed_input(pixels, meta)))
        x = x + interpolated_positions(self.embeddings.position_embedding.weight, meta, x.dtype)
        return self.run_blocks(x, meta)

    def head(self, x):
        return self.merger(self.downsample(self.post_layernorm(x)))

    def head_fused(self, x, delta):
        _, y = add_norm(x, delta, self.post_layernorm)
        return self.merger.forward_fused(self.downsample(y))


class Glm4vFamily(Family):
    name = "glm4v"
    tower = Glm4vVisionTower
    hf_class = ("transformers.models.glm4v.modeling_glm4v", "Glm4vVisionModel")
    hf_class_aliases = ("Glm4vMoeVisionModel",)         # GLM-4.5V's checkpoints (glm4v_moe)
    model_types = ("glm4v", "glm4v_moe", "glm46v")
    study_presets = ("tiny-glm4v", "glm-4.1v-9b")
    presets = (
        dict(name="glm-4.1v-9b", merger_hidden=13696, **GLM_TOWER),
        dict(name="glm-4.5v", merger_hidden=10944, **GLM_TOWER),
        # tiny: an 8 x 8 position table, the processor bounded to ~1 megapixel per frame
        dict(name="tiny-glm4v", depth=2, width=64, heads=4, mlp_hidden=48, out_hidden=48, merger_hidden=96,
             num_position_embeddings=64, **{**GLM_PROCESSOR, "max_pixels": 1 << 20}),
    )

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
        frames = torch.repeat_interleave(grid_thw[:, 1:], grid_thw[:, 0], dim=0)
        frames = torch.cat([torch.ones_like(frames[:, :1]), frames], dim=1)
        return super().hf_embeddings(model, pixels, frames)


FAMILY = Glm4vFamily()
