"""Qwen2-VL vision tower: LayerNorm pre-norm blocks, full attention everywhere, QuickGELU MLP.

Presets, checks and sizes: the family's spec, `workbench.families.qwen2_vl`.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import fused as fk
from ..config import VisionConfig
from .common import VisionTower
from .layers import PatchMerger, VisionBlock
from .metadata import TowerMetadata


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class Qwen2VLBlock(VisionBlock):
    def __init__(self, cfg: VisionConfig):
        mlp = nn.Module()
        mlp.fc1 = nn.Linear(cfg.width, cfg.mlp_hidden)
        mlp.act = QuickGELU()
        mlp.fc2 = nn.Linear(cfg.mlp_hidden, cfg.width)
        super().__init__(cfg, "layer", mlp)

    def mlp_out(self, h):
        return self.mlp.fc2(self.mlp.act(self.mlp.fc1(h)))

    def mlp_fused(self, h):
        return self.mlp.fc2(fk.quick_gelu(self.mlp.fc1(h)))


class Qwen2VisionTower(VisionTower):
    family = "qwen2-vl"

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.blocks = nn.ModuleList(Qwen2VLBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, nn.LayerNorm(cfg.width, eps=cfg.eps))

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, 1176] -> merged embeddings [n_rows/4, out_hidden], fixed shapes only."""
        return self.run_blocks(self.patch_embed(self.embed_input(pixels, meta)), meta)


TOWER = Qwen2VisionTower
