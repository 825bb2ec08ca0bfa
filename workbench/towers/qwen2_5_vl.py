"""Qwen2.5-VL vision tower: RMSNorm, SwiGLU MLP, window attention with a few full-attention blocks.

Rows are permuted into window order in groups of one merge unit (4 rows) before the blocks, the
rotary table likewise, and the merged output is put back into item order after the merger.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from .. import fused as fk
from .common import PatchMerger, RMSNorm, TowerMetadata, VisionAttention, VisionBlock, VisionTower, pad_offsets

# the SwiGLU hidden width is padded to a multiple of this in the fused gate|up weight: 3420 (the
# 7B/72B towers) is not a multiple of 8, and cuBLAS then falls back to slow 2-element-aligned
# kernels (results/reference/README.md has what that cost)
MLP_ALIGN = 64


class Qwen25VLBlock(VisionBlock):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.width, cfg.eps)
        self.norm2 = RMSNorm(cfg.width, cfg.eps)
        self.attn = VisionAttention(cfg)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(cfg.width, cfg.mlp_hidden)
        self.mlp.up_proj = nn.Linear(cfg.width, cfg.mlp_hidden)
        self.mlp.down_proj = nn.Linear(cfg.mlp_hidden, cfg.width)
        self._pack_mlp()

    def _pack_mlp(self) -> None:
        """Give gate_proj and up_proj one [2*Hp, width] weight and bias (gate rows, zeros, up rows,
        zeros; Hp = mlp_hidden rounded up to MLP_ALIGN) and down_proj a [width, Hp] weight with zero
        columns past mlp_hidden; the checkpoint-shaped parameters become views into them.

        One matmul then computes gate and up with aligned shapes, and the padded lanes contribute
        exact zeros (silu(0) * 0 = 0, times zero weights). Loading weights writes through the views,
        so captured graphs see new weights. Redone after every `_apply` (.to, .cuda, dtype casts),
        which replaces the parameters with fresh tensors."""
        g, u, d = self.mlp.gate_proj, self.mlp.up_proj, self.mlp.down_proj
        hid, width = g.weight.shape
        hp = -(-hid // MLP_ALIGN) * MLP_ALIGN
        kw = dict(dtype=g.weight.dtype, device=g.weight.device)
        with torch.no_grad():
            gu_w, gu_b = torch.zeros(2 * hp, width, **kw), torch.zeros(2 * hp, **kw)
            down_w = torch.zeros(d.weight.shape[0], hp, **kw)
            gu_w[:hid], gu_w[hp:hp + hid] = g.weight, u.weight
            gu_b[:hid], gu_b[hp:hp + hid] = g.bias, u.bias
            down_w[:, :hid] = d.weight
        g.weight.data, u.weight.data = gu_w[:hid], gu_w[hp:hp + hid]
        g.bias.data, u.bias.data = gu_b[:hid], gu_b[hp:hp + hid]
        d.weight.data = down_w[:, :hid]
        self.mlp.gate_up_weight, self.mlp.gate_up_bias, self.mlp.down_weight = gu_w, gu_b, down_w

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._pack_mlp()
        return out

    def mlp_out(self, h):
        return self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))

    def mlp_fused(self, h):
        gu = F.linear(h, self.mlp.gate_up_weight, self.mlp.gate_up_bias)
        return F.linear(fk.silu_mul(gu), self.mlp.down_weight, self.mlp.down_proj.bias)


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
        self.blocks = nn.ModuleList(Qwen25VLBlock(cfg) for _ in range(cfg.depth))
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
