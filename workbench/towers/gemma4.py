"""Gemma-4's vision tower: transformers' `Gemma4VisionModel` with its `Gemma4MultimodalEmbedder` (``embed_vision``),
as `Gemma4Model.get_image_features` runs them.

Forward, rows in merge-block order as everywhere here (merge_size = the pooling kernel, 3: each 3 x 3 block of
patches is 9 consecutive rows; temporal_patch_size 1: a row is one 16 x 16 patch, 768 values (C, ph, pw)):

    x = 2 * (pixels - 0.5)           the model's own map of the processor's [0, 1] to [-1, 1] (with placement
                                     fold, folded into the patch projection together with the normalization)
    x = x @ input_proj + table[0][col] + table[1][row]
                                     Linear without bias; one learned table per axis, gathered by each row's
                                     patch coordinates (host metadata: `pos_index`, clamped to the tables)
    x = blocks(x)                    x += post_attention_norm(attn(input_norm(x)));
                                     x += post_feedforward_norm(mlp(pre_feedforward_norm(x)));
                                     RMSNorms x * w in float32; q, k, v (one fused matmul) and o without biases;
                                     per-head RMSNorm of q and k (scaled) and v (unscaled), then the 2-D rotary
                                     on q and k (cos / sin: host metadata), attention scale 1; MLP
                                     down(gelu_tanh(gate(x)) * up(x)); each image attends to itself only
    y = mean of each block's 9 rows * sqrt(width)       transformers' pooler (the mean rounded to the tower
                                                        dtype, then scaled in float32)
    merged = rms(y) @ embedding_projection              `embed_vision`: an RMSNorm without scale, one Linear

Returns [N/9, out_hidden]: one soft token per 3 x 3 block, in each image's pooled raster order. The grid-
dependent tables are cu_seqlens, the position gather and the rotary's cos / sin: host metadata
(`VisionTower.prepare`), so the forward is graph-safe.

The rotary: head_dim split in halves, the first turned by the patch's column, the second by its row, each half
as rotate-half (pairs i, i + head_dim / 4) over head_dim / 4 frequencies 1 / theta^(2k / (head_dim / 2)), theta
100; so cos / sin [rows, head_dim] are (col angles, col angles, row angles, row angles). The attention backends
scale by 1 / sqrt(head_dim): q is multiplied by sqrt(head_dim) first (exact for the released head_dim 64).

Names: the state dict speaks the checkpoint's (`vision_tower.patch_embedder.input_proj`, `...position_embedding_
table`, `vision_tower.encoder.layers.N.self_attn.q_proj.linear` ..., `embed_vision.embedding_projection`),
translated both ways by state-dict hooks (`checkpoint_names.CheckpointNames`): the fused qkv as three views,
and the patch projection, kept here as [width, C, P, P] (our rows' column order), as the checkpoint's
[width, P*P*C] (a copy: `load_hf_state_dict` loads through torch's `load_state_dict`, which permutes it back).

No fused Triton kernels for these blocks (sandwich norms): the tower runs plain torch ops on every device.

Presets, checks and sizes: the family's spec, `workbench.families.gemma4`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import varlen_attention
from ..config import VisionConfig
from .checkpoint_names import CheckpointNames
from .common import VisionTower
from .layers import FoldedPatchEmbed
from .metadata import TowerMetadata, merge_block_positions

_LAYER = r"vision_tower.encoder.layers.\1."
# tower key -> checkpoint key, applied in order (first match)
CHECKPOINT_NAMES = (
    (r"^patch_embed\.proj\.", "vision_tower.patch_embedder.input_proj."),
    (r"^position_embedding_table$", "vision_tower.patch_embedder.position_embedding_table"),
    (r"^blocks\.(\d+)\.attn\.proj\.", _LAYER + "self_attn.o_proj.linear."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", _LAYER + "self_attn.qkv.linear."),
    (r"^blocks\.(\d+)\.attn\.", _LAYER + "self_attn."),
    (r"^blocks\.(\d+)\.mlp\.(\w+)\.", _LAYER + r"mlp.\2.linear."),
    (r"^blocks\.(\d+)\.", _LAYER),
)


def checkpoint_patch_order(w: torch.Tensor) -> torch.Tensor:
    """[width, C, P, P] -> the checkpoint's [width, P*P*C] (columns (ph, pw, C): the processor's patches)."""
    return w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)


def tower_patch_order(w: torch.Tensor, channels: int = 3) -> torch.Tensor:
    """The checkpoint's [width, P*P*C] -> [width, C, P, P] (our rows' (C, ph, pw) columns)."""
    p = math.isqrt(w.shape[1] // channels)
    return w.reshape(w.shape[0], p, p, channels).permute(0, 3, 1, 2)


NAMES = CheckpointNames(CHECKPOINT_NAMES, r"^(.*\.self_attn\.)qkv\.(linear\.weight)$",
                        layouts=((r".*patch_embedder\.input_proj\.weight$", checkpoint_patch_order,
                                  tower_patch_order),))


def no_rotary(cfg: VisionConfig, dtype=torch.float32) -> torch.Tensor:
    """The base class's rotary tables zero wide: `Gemma4VisionTower` lays out its own (`gemma4_cos_sin`)."""
    return torch.zeros(0, dtype=dtype)


def gemma4_cos_sin(xy: torch.Tensor, cfg: VisionConfig, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [N, head_dim] of rows at patch coordinates ``xy`` [N, 2] (column, row): the angles of the column,
    twice, then of the row, twice, over head_dim / 4 frequencies (float32 as transformers computes them; float64
    for a float64 tower)."""
    math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, 2, dtype=math_dtype) / half))
    ang = xy.to(math_dtype)[:, :, None] * inv                      # [N, 2 (col, row), head_dim / 4]
    ang = torch.cat([ang[:, 0], ang[:, 0], ang[:, 1], ang[:, 1]], dim=-1)
    return ang.cos(), ang.sin()


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] turned by cos / sin [N, D]: rotate-half within each half of the head."""
    x0, x1, x2, x3 = x.chunk(4, dim=-1)
    turned = torch.cat([-x1, x0, -x3, x2], dim=-1)
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + turned * sin


class Gemma4RMSNorm(nn.Module):
    """transformers' Gemma4RMSNorm: x * (mean(x^2) + eps)^-0.5 in float32 (float64 in a float64 tower), times the
    weight (no offset from one) where it has one, cast back."""

    def __init__(self, dim: int, eps: float, scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype != torch.float64 else x
        y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            y = y * self.weight.to(y.dtype)
        return y.to(x.dtype)


class Gemma4Attention(nn.Module):
    """q, k, v in one fused matmul and o (`proj`), no biases; per-head RMSNorms of q, k (scaled) and v (not); the
    2-D rotary on q and k; attention scale 1."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=False)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=False)
        self.q_norm = Gemma4RMSNorm(cfg.head_dim, cfg.eps)
        self.k_norm = Gemma4RMSNorm(cfg.head_dim, cfg.eps)
        self.v_norm = Gemma4RMSNorm(cfg.head_dim, cfg.eps, scale=False)

    def forward(self, x, cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen=None):
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, self.head_dim).unbind(1)
        # the backends divide by sqrt(head_dim); the model's scale is 1
        q = rotate_halves(self.q_norm(q), cos, sin) * math.sqrt(self.head_dim)
        k = rotate_halves(self.k_norm(k), cos, sin)
        o = varlen_attention(q, k, self.v_norm(v), cu_seqlens, max_seqlen, backend, dense_seqlen=dense_seqlen)
        return self.proj(o.reshape(n, -1))


class Gemma4MLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), no biases."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.width, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.width, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Gemma4Block(nn.Module):
    """A sandwich-norm block: each of attention and MLP between a norm before and a norm after, then added."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm, self.pre_feedforward_layernorm, \
            self.post_feedforward_layernorm = (Gemma4RMSNorm(cfg.width, cfg.eps) for _ in range(4))
        self.attn = Gemma4Attention(cfg)
        self.mlp = Gemma4MLP(cfg)

    def forward(self, x, cu_seqlens, max_seqlen, dense_seqlen, cos, sin, backend):
        a = self.attn(self.input_layernorm(x), cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen)
        x = x + self.post_attention_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma4Embedder(nn.Module):
    """transformers' pooler and Gemma4MultimodalEmbedder on merge-block rows: each block's rows averaged (rounded
    to the tower dtype), times sqrt(width) in float32, then an RMSNorm without scale and
    ``embedding_projection``."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.unit, self.root = cfg.merge_unit, cfg.width ** 0.5
        self.embedding_pre_projection_norm = Gemma4RMSNorm(cfg.width, cfg.eps, scale=False)
        self.embedding_projection = nn.Linear(cfg.width, cfg.out_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # [N, width] -> [N/unit, out_hidden]
        wide = x.float() if x.dtype != torch.float64 else x
        pooled = wide.view(-1, self.unit, x.shape[-1]).mean(1).to(x.dtype)
        scaled = (pooled.float() if x.dtype != torch.float64 else pooled) * self.root
        return self.embedding_projection(self.embedding_pre_projection_norm(scaled.to(x.dtype)))


class Gemma4FoldedPatchEmbed(FoldedPatchEmbed):
    """Placement fold: the normalization x * s + t and the model's own 2 * (y - 0.5) folded as one affine,
    x * 2s + (2t - 1), into the patch projection."""

    def _column_constants(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        s, t = super()._column_constants(device)
        return 2 * s, 2 * t - 1


class Gemma4VisionTower(VisionTower):
    family = "gemma4"
    patch_conv2d = True
    rotary_inv_freq = staticmethod(no_rotary)

    def __init__(self, cfg: VisionConfig, **kw):
        if kw.get("fused") is True:
            raise ValueError("the gemma4 tower has no fused kernels (its sandwich-norm blocks run plain torch ops); "
                             "use fused='auto' or False")
        super().__init__(cfg, **kw)
        self.fused = False
        if self.fold_norm:
            self.patch_embed = Gemma4FoldedPatchEmbed(cfg, conv2d=True)
        self.position_embedding_table = nn.Parameter(torch.empty(2, cfg.num_position_embeddings, cfg.width))
        self.blocks = nn.ModuleList(Gemma4Block(cfg) for _ in range(cfg.depth))
        self.embed_vision = Gemma4Embedder(cfg)
        NAMES.install(self)

    def _prepare_family(self, meta, grid, n_window_segments, max_window_seqlen) -> TowerMetadata:
        """Each row's (column, row) for the position tables (clamped to them; padding rows read entry 0) and
        for the rotary (padding rows angle 0)."""
        pos = merge_block_positions(grid, self.cfg.merge_size)
        xy = torch.zeros(meta.n_rows, 2, dtype=torch.int64)
        xy[:pos.shape[0]] = pos.flip(1)
        meta.pos_index = xy.clamp(max=self.cfg.num_position_embeddings - 1)
        meta.cos, meta.sin = gemma4_cos_sin(xy, self.cfg, self.dtype)
        return meta

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, patch_dim] -> soft tokens [n_rows/9, out_hidden], fixed shapes only."""
        x = self.embed_input(pixels, meta)
        if not self.fold_norm:
            x = 2 * (x - 0.5)
        x = self.patch_embed(x)
        table = self.position_embedding_table
        x = x + (F.embedding(meta.pos_index[:, 0], table[0]) + F.embedding(meta.pos_index[:, 1], table[1])).to(x.dtype)
        return self.run_blocks(x, meta)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed_vision(x)

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> "Gemma4VisionTower":
        """Also under the model's names (`Family.checkpoint_layouts`: model.vision_tower.* / model.embed_vision.*);
        other tensors (the language model's, the audio tower's) are left out. Loaded through torch's
        load_state_dict, whose hooks put the patch projection back in the tower's order."""
        keys = self.cfg.spec.checkpoint_keys(self.cfg, list(sd))
        sd = {k: sd[ck] for k, (ck, _, _) in keys.items()} if keys else dict(sd)
        sd = {k: v for k, v in sd.items() if not k.endswith("inv_freq")}
        problem = self.state_mismatch({k: tuple(v.shape) for k, v in sd.items()})
        if problem:
            raise ValueError("state dict does not fit: " + problem)
        with torch.no_grad():
            self.load_state_dict(sd, strict=False)
        return self


TOWER = Gemma4VisionTower
