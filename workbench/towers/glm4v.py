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

Presets, checks and sizes: the family's spec, `workbench.families.glm4v`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from .common import VisionTower
from .layers import GatedMLP, RMSNorm, VisionBlock, add_norm
from .metadata import TowerMetadata, interpolated_positions

# transformers' Glm4vVisionPatchMerger builds its LayerNorm with torch's default eps
MERGER_LN_EPS = 1e-5


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


TOWER = Glm4vVisionTower
