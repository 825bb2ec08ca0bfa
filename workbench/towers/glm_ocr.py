"""GLM-OCR vision tower (transformers' `GlmOcrVisionModel`): GLM-4.1V's tower without its
post-conv norm and position table, with biased attention whose q and k are RMS-normalized per head.

Forward, rows in merge-block order as everywhere here:

    x = patch_embed(pixels)                  Conv3d with bias; nothing added (no position table)
    x = blocks(x)            RMSNorm pre-norm; qkv and proj with bias; q and k each through an
                             RMSNorm over head_dim (weights q_norm / k_norm, eps rms_norm_eps)
                             before the 2-D rotary; full attention per frame; MLP: SwiGLU with
                             biases, mlp_hidden (transformers' intermediate_size) wide
    y = downsample(post_layernorm(x))        as GLM-4.1V: Conv2d 2x2 == one matmul per merged token
    merged = merger(y)       proj -> LayerNorm -> GELU -> SwiGLU of merger_hidden
                             (= out_hidden * in_channels, no bias)

Returns [N/4, out_hidden]. The only grid-dependent tables are the rotary's cos/sin and cu_seqlens:
host metadata (`VisionTower.prepare`), so the forward is graph-safe. Video: frames attend
separately, so a (t, h, w) grid here equals the t grids (1, h, w) transformers' GlmOcrModel feeds.

Presets, checks and sizes: the family's spec, `workbench.families.glm_ocr`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import VisionConfig
from .common import VisionTower
from .glm4v import Glm4vMerger, Glm4vVisionTower, MergeConv
from .layers import GatedMLP, RMSNorm, VisionAttention, VisionBlock
from .metadata import TowerMetadata


class QKNormAttention(VisionAttention):
    """Attention with bias whose q and k are RMS-normalized per head before the rotary."""

    def __init__(self, cfg: VisionConfig):
        super().__init__(cfg, qkv_bias=True, proj_bias=True)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.eps)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        qkv = super().project_qkv(x)                                      # [N, 3, H, D]
        return torch.stack((self.q_norm(qkv[:, 0]), self.k_norm(qkv[:, 1]), qkv[:, 2]), dim=1)


class GlmOcrBlock(VisionBlock):
    def __init__(self, cfg: VisionConfig, gemm_align: int):
        super().__init__(cfg, "rms", GatedMLP(cfg.width, cfg.mlp_hidden, bias=True, gemm_align=gemm_align))
        self.attn = QKNormAttention(cfg)

    def mlp_out(self, h):
        return self.mlp(h)

    def mlp_fused(self, h):
        return self.mlp.forward_fused(h)


class GlmOcrVisionTower(VisionTower):
    family = "glm-ocr"
    patch_bias = True

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.blocks = nn.ModuleList(GlmOcrBlock(cfg, self.gemm_align) for _ in range(cfg.depth))
        self.post_layernorm = RMSNorm(cfg.width, cfg.eps)
        self.downsample = MergeConv(cfg.width, cfg.out_hidden, cfg.merge_size)
        self.merger = Glm4vMerger(cfg.out_hidden, cfg.merger_hidden, self.gemm_align)

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, patch_dim] -> merged embeddings [n_rows/4, out_hidden], fixed shapes only."""
        return self.run_blocks(self.patch_embed(self.embed_input(pixels, meta)), meta)

    # GLM-4.1V's head: post-norm, downsample conv, merger (the fused variant adds the last residual
    # in the post-norm's kernel)
    head = Glm4vVisionTower.head
    head_fused = Glm4vVisionTower.head_fused


TOWER = GlmOcrVisionTower
