"""Kimi-K2.5 vision tower (transformers' `Kimi_K25VisionModel`) with the model's projector
(`Kimi_K25MultimodalProjection`, the merger of this family): patch 14 embedded frame by frame, a
learned position table resampled bicubically plus a sinusoidal frame table, LayerNorm blocks with
separate q / k / v projections and a GELU(tanh) MLP, the frames of a video chunk pooled, then the
projector to the language model's width.

Forward, rows in merge-block order as everywhere here (one frame's patch per row, 588 columns):

    x = patch_embed(pixels)              Conv2d 14 x 14 with bias == one matmul per row
    x = x + position table resampled to the frame's grid (bicubic, 4 x 4 taps, pixel centres, edges
        clamped: transformers' `embedding_bag` over its interpolation taps)
          + row f+1 of the frame table for frame f of a chunk of t > 1 frames (row 0, zeros, for t = 1)
    x = blocks(x)            LayerNorm (eps 1e-5) pre-norm; q_proj, k_proj, v_proj and proj with bias;
                             2-D rotary with the angles as (w, h) pairs; full attention over each
                             item: a chunk's frames attend jointly (`joint_frames`)
    x = final_layernorm(x)
    y = the chunk's frames averaged row by row (weights 1/t; an image is its own average)
    merged = mm_projector(y)  pre_norm (LayerNorm over width, eps 1e-5) -> 2x2 shuffle -> in_proj
                              -> GELU -> out_proj (to out_hidden, the text model's width)

Output: the tower's forward gives one merged token per merge block of ONE frame of each item
(`VisionConfig.item_tokens`): [tokens, out_hidden], tokens = sum h w / 4 (an image's h w / 4, a
chunk of t frames the same). `forward_prepared` keeps fixed shapes: [n_rows / 4, out_hidden], the
items' tokens first, in item order, then rows nobody reads (the shape a graph budget holds).

Graph safety: every grid-dependent table is host metadata (`prepare`): rotary cos/sin, cu_seqlens
(one sequence per item), the position taps, each row's frame-table row (`frame_index`) and the
pooling gather (`pool_index`, `pool_weight`: for output row s, the FRAMES rows averaged into it,
unused taps weighing 0). Padding rows read frame row 0 and are pooled into no valid row.

Presets, checks, sizes and the processor's resize rule: the family's spec, `workbench.families.kimi_k25`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from ..families.base import layout_keys
from ..families.kimi_k25 import FRAMES
from .common import VisionTower
from .layers import VisionAttention, add_norm
from .metadata import TowerMetadata, interpolated_positions, weighted_rows
from .qwen3_vl import Qwen3VLBlock


def frame_table(width: int, frames: int = FRAMES) -> torch.Tensor:
    """[frames + 1, width] float64: a zero row (single frames), then frame f's sinusoid
    (sin(f / 10000^(2k / width)) for the first half, cos for the second)."""
    inv = 1.0 / 10000 ** (torch.arange(0, width, 2, dtype=torch.float64) / width)
    ang = torch.arange(frames, dtype=torch.float64)[:, None] * inv
    return torch.cat([torch.zeros(1, width, dtype=torch.float64), torch.cat([ang.sin(), ang.cos()], dim=1)])


class KimiAttention(VisionAttention):
    """Attention with separate q_proj / k_proj / v_proj (with bias) and proj, as the checkpoint."""

    def __init__(self, cfg: VisionConfig):
        nn.Module.__init__(self)
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.proj = (nn.Linear(cfg.width, cfg.width) for _ in range(4))

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        return qkv.view(x.shape[0], 3, self.heads, self.head_dim)


class KimiBlock(Qwen3VLBlock):
    """Qwen3-VL's LayerNorm block with a GELU(tanh) MLP, under Kimi's names (mlp.fc1 / mlp.fc2),
    with separate q / k / v projections."""

    mlp_names = ("fc1", "fc2")

    def __init__(self, cfg: VisionConfig):
        super().__init__(cfg)
        self.attn = KimiAttention(cfg)


class KimiProjector(nn.Module):
    """pre_norm (LayerNorm over width) -> 2x2 shuffle -> in_proj -> GELU -> out_proj."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.merged = cfg.width * cfg.merge_unit
        self.pre_norm = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.in_proj = nn.Linear(self.merged, self.merged)
        self.out_proj = nn.Linear(self.merged, cfg.out_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # [N, width] -> [N/4, out_hidden]
        return self.out_proj(F.gelu(self.in_proj(self.pre_norm(x).view(-1, self.merged))))


def pooling(grid, n_rows: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 [n_rows, FRAMES], ``dtype`` [n_rows, FRAMES]): output row s averages rows
    index[s, :t] with weight 1/t (its item's t frames at the same patch); the items' h w rows
    each, in item order, then rows of weight 0."""
    index = torch.zeros(n_rows, FRAMES, dtype=torch.int64)
    weight = torch.zeros(n_rows, FRAMES, dtype=dtype)
    row = out = 0
    for t, h, w in grid:
        frame = h * w
        index[out:out + frame] = row + torch.arange(frame)[:, None] + frame * torch.arange(FRAMES).clamp(max=t - 1)
        weight[out:out + frame, :t] = 1.0 / t
        row, out = row + t * frame, out + frame
    return index, weight


def frame_rows(grid, n_rows: int) -> torch.Tensor:
    """int64 [n_rows]: each row's frame-table row: 0 for an image (t = 1) and padding, f + 1 for
    frame f of a chunk."""
    out = torch.zeros(n_rows, dtype=torch.int64)
    row = 0
    for t, h, w in grid:
        if t > 1:
            out[row:row + t * h * w] = torch.arange(1, t + 1).repeat_interleave(h * w)
        row += t * h * w
    return out


class KimiK25VisionTower(VisionTower):
    family = "kimi-k2.5"
    patch_bias = True
    patch_conv2d = True
    rotary_interleaved = True
    joint_frames = True
    position_resampling = "bicubic"

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.table_side = math.isqrt(cfg.num_position_embeddings)
        self.patch_embed.pos_emb = nn.Module()
        self.patch_embed.pos_emb.position_embeddings = nn.Parameter(
            torch.empty(self.table_side, self.table_side, cfg.width))
        self.patch_embed.pos_emb.register_buffer("time_table", frame_table(cfg.width), persistent=False)
        self.layers = nn.ModuleList(KimiBlock(cfg) for _ in range(cfg.depth))
        self.final_layernorm = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.mm_projector = KimiProjector(cfg)

    @property
    def blocks(self) -> nn.ModuleList:
        """The blocks under the checkpoint's name, `layers`."""
        return self.layers

    def _prepare_family(self, meta, grid, n_window_segments, max_window_seqlen) -> TowerMetadata:
        meta = super()._prepare_family(meta, grid, n_window_segments, max_window_seqlen)
        too_long = [(i, t) for i, (t, _, _) in enumerate(grid) if t > FRAMES]
        if too_long:
            raise ValueError(f"grid_thw item {too_long[0][0]} has {too_long[0][1]} frames; a {self.family} chunk holds at "
                             f"most {FRAMES} (its frame table's rows): cut the video into chunks (wb.preprocess does)")
        meta.frame_index = frame_rows(grid, meta.n_rows)
        meta.pool_index, meta.pool_weight = pooling(grid, meta.n_rows, meta.pos_weight.dtype)
        return meta

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, 588] -> [n_rows/4, out_hidden], the items' merged tokens first; fixed shapes."""
        x = self.patch_embed(self.embed_input(pixels, meta))
        pos = self.patch_embed.pos_emb
        table = pos.position_embeddings.flatten(0, 1)
        frames = pos.time_table.to(meta.pos_weight.dtype)[meta.frame_index]
        x = x + (interpolated_positions(table, meta, meta.pos_weight.dtype) + frames).to(x.dtype)
        x = self.run_blocks(x, meta)              # final_layernorm(x): `head`
        return self.mm_projector(weighted_rows(x, meta.pool_index, meta.pool_weight, x.dtype))

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> "KimiK25VisionTower":
        """Also under the model's names (`Family.checkpoint_layouts`: vision_tower.* and mm_projector.*,
        with or without model.)."""
        if not any(k.startswith(("vision_tower.", "model.vision_tower.")) for k in sd):
            return super().load_hf_state_dict(sd)           # the tower's own names
        keys = layout_keys(sd, self.cfg.spec.checkpoint_layouts)
        return super().load_hf_state_dict({k: sd[ck] for k, ck in keys.items()})

    def head(self, x):
        return self.final_layernorm(x)

    def head_fused(self, x, delta):
        return add_norm(x, delta, self.final_layernorm)[1]


TOWER = KimiK25VisionTower
