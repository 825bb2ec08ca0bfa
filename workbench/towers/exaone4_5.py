"""EXAONE-4.5 vision tower (transformers' `Exaone4_5_VisionModel`): the Qwen2.5-VL tower whose
attention has grouped key/value heads.

The fused qkv projection gives [N, heads + 2 * kv_heads, head_dim]: the query heads, then the
key heads, then the value heads; query head h reads key/value head h // (heads / kv_heads).
Everything else (window order, rotary, RMSNorm blocks, SwiGLU MLP, merger) is Qwen2.5-VL's.

Grouped attention and the kernels: right after the projection, one gather (a fixed head index,
a non-persistent buffer) lays the heads out as [N, 3, heads, head_dim] with every key/value head
repeated for the query heads it serves. From there the attention is the ungrouped one, so every
backend of `workbench.attention` (fa4, varlen, masked, loop) and the fused rotary kernel of
`workbench.fused` (which rotates the [N, 3, H, D] layout in place) run unchanged: rotating a
repeated key head gives the repeat of the rotated head, bit for bit. The gather is graph-safe
(its index never changes) and costs one [N, 3 * width] copy per block (the attention then
reads heads / kv_heads times the key/value bytes a natively grouped kernel would: the price of
running every backend unchanged).

Presets, checks and sizes: the family's spec, `workbench.families.exaone4_5`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import VisionConfig
from .common import VisionTower
from .layers import GatedMLP, PatchMerger, RMSNorm, VisionAttention
from .qwen2_5_vl import Qwen25VisionTower, Qwen25VLBlock


def grouped_head_index(heads: int, kv_heads: int) -> torch.Tensor:
    """Index into the projection's heads [q_0..q_{H-1}, k_0..k_{G-1}, v_0..v_{G-1}] that gives
    [q, k repeated, v repeated] (3 * H entries): query head h pairs with key/value head
    h // (H / G)."""
    group = heads // kv_heads
    kv = torch.arange(heads) // group
    return torch.cat([torch.arange(heads), heads + kv, heads + kv_heads + kv])


class GroupedVisionAttention(VisionAttention):
    """`VisionAttention` with kv_heads key/value heads: checkpoint names `qkv` (with bias) and
    `proj`, qkv.weight [(heads + 2 * kv_heads) * head_dim, width]."""

    def __init__(self, cfg: VisionConfig):
        nn.Module.__init__(self)
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.width, (cfg.heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=True)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=True)
        self.register_buffer("head_index", grouped_head_index(cfg.heads, cfg.n_kv_heads), persistent=False)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        heads = self.qkv(x).view(x.shape[0], -1, self.head_dim)          # [N, H + 2G, D]
        return heads.index_select(1, self.head_index).view(x.shape[0], 3, self.heads, self.head_dim)


class Exaone45Block(Qwen25VLBlock):
    def __init__(self, cfg: VisionConfig, gemm_align: int):
        # the base block's parts in its order, with the grouped attention built instead of (not
        # after) an ungrouped one: no [3 * width, width] projection allocated only to be dropped
        nn.Module.__init__(self)
        self.norm1, self.norm2 = RMSNorm(cfg.width, cfg.eps), RMSNorm(cfg.width, cfg.eps)
        self.attn = GroupedVisionAttention(cfg)
        self.mlp = GatedMLP(cfg.width, cfg.mlp_hidden, bias=True, gemm_align=gemm_align)


class Exaone45VisionTower(Qwen25VisionTower):
    family = "exaone4.5"

    def __init__(self, cfg: VisionConfig, **kw):
        # Qwen2.5-VL's parts with this family's blocks (built once: the real tower has 1.3e9 weights)
        VisionTower.__init__(self, cfg, **kw)
        self.blocks = nn.ModuleList(Exaone45Block(cfg, self.gemm_align) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, RMSNorm(cfg.width, cfg.eps))
        self.full_blocks = frozenset(cfg.fullatt_blocks)


TOWER = Exaone45VisionTower
