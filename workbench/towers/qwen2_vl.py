"""Qwen2-VL vision tower: LayerNorm pre-norm blocks, full attention everywhere, QuickGELU MLP."""
from __future__ import annotations

import torch
from torch import nn

from .. import fused as fk
from ..config import VisionConfig
from .common import PatchMerger, TowerMetadata, VisionAttention, VisionTower, add_norm


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class Qwen2VLBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.norm2 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.attn = VisionAttention(cfg)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(cfg.width, cfg.mlp_hidden)
        self.mlp.act = QuickGELU()
        self.mlp.fc2 = nn.Linear(cfg.mlp_hidden, cfg.width)

    def forward(self, x, cu_seqlens, max_seqlen, dense_seqlen, cos, sin, backend):
        x = x + self.attn(self.norm1(x), cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen)
        return x + self.mlp.fc2(self.mlp.act(self.mlp.fc1(self.norm2(x))))

    def forward_fused(self, x, delta, cu_seqlens, max_seqlen, dense_seqlen, cos, sin, backend):
        """(x + delta + attention, MLP output): the caller adds the MLP output in its next norm."""
        x, h = add_norm(x, delta, self.norm1)
        a = self.attn(h, cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen, fused=True)
        x, h = add_norm(x, a, self.norm2)
        return x, self.mlp.fc2(fk.quick_gelu(self.mlp.fc1(h)))


class Qwen2VisionTower(VisionTower):
    family = "qwen2-vl"

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.blocks = nn.ModuleList(Qwen2VLBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, nn.LayerNorm(cfg.width, eps=cfg.eps))

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, 1176] -> merged embeddings [n_rows/4, out_hidden], fixed shapes only."""
        return self.run_blocks(self.patch_embed(self.embed_input(pixels, meta)), meta)
