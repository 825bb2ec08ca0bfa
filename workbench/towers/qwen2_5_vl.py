"""Qwen2.5-VL vision tower: RMSNorm, SwiGLU MLP, window attention with a few full-attention blocks.

Rows are permuted into window order in groups of one merge unit (4 rows) before the blocks, the
rotary table likewise, and the merged output is put back into item order after the merger.

Presets, checks and sizes: the family's spec, `workbench.families.qwen2_5_vl`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import VisionConfig
from .common import VisionTower
from .layers import GatedMLP, PatchMerger, RMSNorm, VisionBlock
from .metadata import TowerMetadata, pad_offsets

class Qwen25VLBlock(VisionBlock):
    def __init__(self, cfg: VisionConfig, gemm_align: int):
        super().__init__(cfg, "rms", GatedMLP(cfg.width, cfg.mlp_hidden, bias=True, gemm_align=gemm_align))

    def mlp_out(self, h):
        return self.mlp(h)

    def mlp_fused(self, h):
        return self.mlp.forward_fused(h)


def window_order(grid: list[tuple[int, int, int]], window: int) -> tuple[torch.Tensor, list[int]]:
    """Merge units of every frame regrouped window by window (windows row-major, units row-major
    inside each window; edge windows are partial). Returns the unit permutation and the merge-unit
    count of each non-empty window."""
    index, sizes, base = [], [], 0
    for t, h, w in grid:
        for _ in range(t):
            units = torch.arange(base, base + h * w).view(h, w)      # here h, w are in merged units
            for r0 in range(0, h, window):
                for c0 in range(0, w, window):
                    blk = units[r0:r0 + window, c0:c0 + window].reshape(-1)
                    index.append(blk)
                    sizes.append(blk.numel())
            base += h * w
    return torch.cat(index), sizes


class Qwen25VisionTower(VisionTower):
    family = "qwen2.5-vl"

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.blocks = nn.ModuleList(Qwen25VLBlock(cfg, self.gemm_align) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, RMSNorm(cfg.width, cfg.eps))
        self.full_blocks = frozenset(cfg.fullatt_blocks)

    def _prepare_family(self, meta, grid, n_window_segments, max_window_seqlen):
        m, unit = self.cfg.merge_size, self.cfg.merge_unit
        merged = [(t, h // m, w // m) for t, h, w in grid]
        index, sizes = window_order(merged, self.cfg.window_merged)
        n_units = meta.n_rows // unit
        # padding units stay where they are (identity), after every real unit
        index = torch.cat([index, torch.arange(index.numel(), n_units)])
        offsets = [0]
        for s in sizes:
            offsets.append(offsets[-1] + s * unit)
        order = (index[:, None] * unit + torch.arange(unit)).reshape(-1)  # row permutation
        meta.cos, meta.sin = meta.cos[order], meta.sin[order]
        meta.window_index = index
        meta.reverse_index = torch.argsort(index)
        meta.cu_window_seqlens = pad_offsets(offsets, n_window_segments)
        meta.max_window_seqlen = max(sizes) * unit if max_window_seqlen is None else int(max_window_seqlen)
        return meta

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, 1176] -> merged embeddings [n_rows/4, out_hidden] in item order."""
        x = self.patch_embed(self.embed_input(pixels, meta))              # [N, width]
        n, width = x.shape
        unit = self.cfg.merge_unit
        x = x.view(n // unit, unit, width)[meta.window_index].view(n, width)
        return self.run_blocks(x, meta)[meta.reverse_index]

    def block_attention(self, i, meta):
        """Full attention in `fullatt_blocks`, window attention (never dense: edge windows are
        smaller) elsewhere."""
        if i in self.full_blocks:
            return meta.cu_seqlens, meta.max_seqlen, meta.dense_seqlen
        return meta.cu_window_seqlens, meta.max_window_seqlen, None


TOWER = Qwen25VisionTower
