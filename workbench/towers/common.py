"""Pieces shared by the vision-tower families.

The forward is split the way serving engines split it: `prepare(grid_thw)` runs on the host and
builds every data-dependent tensor (rotary cos/sin, cu_seqlens, window index, the gather indices
and weights that resample a learned position table to each grid) as a `TowerMetadata`; `forward_prepared(pixels, meta)` only does fixed-shape device work, so a CUDA
graph can capture it and replay it after new metadata is copied into the same buffers.

Module and parameter names follow the checkpoints (`patch_embed.proj`, `blocks.N.norm1`,
`attn.qkv`, `merger.ln_q`, `merger.mlp.0`), so a transformers state dict loads unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import fused as fk
from ..fused import apply_rotary
from ..attention import check_backend, resolve_backend, varlen_attention
from ..config import VisionConfig

FUSED_CHOICES = ("auto", True, False)


@dataclass
class TowerMetadata:
    """Host-prepared, data-dependent inputs of `forward_prepared` (all on the tower's device).

    Row counts include padding: `n_rows` is what the pixel tensor holds, `n_valid_rows` how many
    leading rows are real. Rows past `cu_seqlens[-1]` belong to no sequence.
    """

    cos: torch.Tensor                      # [n_rows, head_dim] rotary, in the order the blocks see rows
    sin: torch.Tensor                      # [n_rows, head_dim]
    cu_seqlens: torch.Tensor               # int32 [S+1] full attention, one sequence per frame
    max_seqlen: int
    n_rows: int
    n_valid_rows: int
    n_valid: torch.Tensor                  # 0-d int32 = n_valid_rows, on the device (graph-safe norms)
    cu_window_seqlens: torch.Tensor | None = None   # int32 [W+1] (Qwen2.5-VL window attention)
    max_window_seqlen: int | None = None
    window_index: torch.Tensor | None = None        # int64 [n_rows/4]: merge units in window order
    reverse_index: torch.Tensor | None = None       # int64 [n_rows/4]: inverse permutation
    # learned position table resampled to each grid (Qwen3-VL, GLM-4.1V): row r's embedding is
    # sum_k pos_weight[r, k] * table[pos_index[r, k]]; padding rows have weight 0
    pos_index: torch.Tensor | None = None           # int64 [n_rows, taps]
    pos_weight: torch.Tensor | None = None          # fp32 (fp64 for an fp64 tower) [n_rows, taps]
    # rows per sequence when every full-attention sequence has that many rows and no row is padding
    # (one image, or frames of one size): full attention may then run as one dense batched kernel
    # (see attention.DENSE_MIN_ROWS); None: sequences of several lengths, or padding rows
    dense_seqlen: int | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)}

    def to(self, device) -> "TowerMetadata":
        return dataclasses.replace(self, **{k: v.to(device, non_blocking=True) for k, v in self.tensors().items()})

    def copy_(self, src: "TowerMetadata") -> "TowerMetadata":
        """Copy `src`'s tensors into this metadata's tensors in place (static graph buffers).

        Shapes must match (a runner prepares `src` padded to the same budget); host-side ints
        (`max_seqlen`, ...) are not copied: they were fixed when the graph was captured."""
        for name, dst in self.tensors().items():
            s = getattr(src, name)
            if s is None or s.shape != dst.shape:
                raise ValueError(f"metadata field {name!r}: shape {None if s is None else tuple(s.shape)} does "
                                 f"not fit the static buffer {tuple(dst.shape)}; prepare it with the same padding")
            dst.copy_(s, non_blocking=True)
        self.n_valid_rows = src.n_valid_rows
        return self


@dataclass(frozen=True)
class Kernels:
    """What a tower's forward runs, resolved once (`VisionTower.resolve_kernels`): the concrete
    attention backend (one of attention.ATTN_BACKENDS but 'auto') and whether the fused Triton
    block kernels run."""

    backend: str
    fused: bool


def check_fused(fused):
    """``fused`` if it is one of FUSED_CHOICES ('auto', True, False), else ValueError naming it."""
    if not (isinstance(fused, bool) or (isinstance(fused, str) and fused == "auto")):   # 1 is not True here
        raise ValueError(f"fused must be one of {FUSED_CHOICES} ('auto': the fused Triton kernels on CUDA "
                         f"for bf16/fp16 towers, plain torch ops elsewhere), got {fused!r}")
    return fused


def check_grid(grid_thw: torch.Tensor, cfg: VisionConfig) -> list[tuple[int, int, int]]:
    """Validate grid_thw ([k, 3] integer, positive, h and w divisible by merge_size); return it as ints."""
    if not isinstance(grid_thw, torch.Tensor) or grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
        raise ValueError(f"grid_thw must be an integer tensor [k, 3] of (t, h, w), got "
                         f"{getattr(grid_thw, 'shape', type(grid_thw))}")
    if grid_thw.dtype.is_floating_point or grid_thw.dtype == torch.bool:
        raise ValueError(f"grid_thw must hold integers, got dtype {grid_thw.dtype}")
    grid = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
    m = cfg.merge_size
    for i, (t, h, w) in enumerate(grid):
        if t < 1 or h < 1 or w < 1:
            raise ValueError(f"grid_thw[{i}] = {(t, h, w)} has a non-positive entry")
        if h % m or w % m:
            raise ValueError(f"grid_thw[{i}] = {(t, h, w)}: h and w must be multiples of merge_size={m} "
                             f"(the merger groups {m}x{m} patches)")
    return grid


def rotary_inv_freq(cfg: VisionConfig, dtype=torch.float32) -> torch.Tensor:
    """head_dim/4 inverse frequencies, shared by the h and w halves of the 2-D rotary."""
    half = cfg.head_dim // 2
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, half, 2, dtype=dtype) / half))


def merge_block_positions(grid: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """(h, w) patch coordinates of every row, rows in merge-block-major order; int64 [N, 2]."""
    out = []
    for t, h, w in grid:
        hh = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
        ww = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
        # (block_row, block_col, inner_row, inner_col)
        pos = torch.stack([hh.permute(0, 2, 1, 3).reshape(-1), ww.permute(0, 2, 1, 3).reshape(-1)], dim=-1)
        out.append(pos.repeat(t, 1))
    return torch.cat(out)


def rotary_cos_sin(pos: torch.Tensor, cfg: VisionConfig, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N, head_dim]: angles (h-freqs | w-freqs) repeated twice for rotate-half."""
    math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv = rotary_inv_freq(cfg, math_dtype)
    ang = (pos.to(math_dtype)[:, :, None] * inv).flatten(1)         # [N, head_dim/2] = (h..., w...)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def max_windows(cfg: VisionConfig, tokens: int, sequences: int) -> int:
    """The most attention windows ``sequences`` frames of ``tokens`` merged tokens in all can have
    (Qwen2.5-VL windows of k x k merged tokens, k = window_merged): a frame of h x w tokens has
    ceil(h/k) ceil(w/k) <= (h+k-1)(w+k-1)/k^2 <= hw/k + (k-1)/k windows (h + w <= hw + 1), so all of
    them at most tokens/k + sequences (k-1)/k. A graph runner sizes its window slots with it: every
    slot is a block of the attention kernel's grid, empty ones included, so a slot per token would
    make every large budget's replay pay for blocks that do nothing."""
    k = cfg.window_merged
    return max(1, min(tokens, (tokens + sequences * (k - 1)) // k))


def remember(cache: dict, key, size: int, make):
    """``cache[key]``, made by ``make()`` when missing; the cache keeps the ``size`` most recently
    used entries (dicts keep insertion order: a hit moves to the end, the front is evicted)."""
    value = cache.pop(key, None)
    if value is None:
        value = make()
        while len(cache) >= size:
            cache.pop(next(iter(cache)))
    cache[key] = value
    return value


# norm scales: drawn around 1, as trained checkpoints hold them (every other parameter around 0);
# "norm.weight" ends the names of the newer families' merger, deepstack and post-conv norms
_UNIT_WEIGHTS = ("norm1.weight", "norm2.weight", "ln_q.weight", "norm.weight")


@torch.no_grad()
def init_checkpoint_like(module: nn.Module, seed: int, std: float = 0.02, on_device: bool = False) -> None:
    """Checkpoint-like random weights for a tower, ours or transformers' (same parameter names):
    norm weights 1 + N(0, 0.1), everything else N(0, std); the input norm's constants untouched.

    on_device=False draws every value in fp32 on the host and copies it in (rounded into the
    parameter's dtype): the same weights on every device, what `build_encoder` gives. on_device=True
    draws in place with a generator on the parameters' device, in their dtype: other values for the
    same seed, but a real tower's ~0.7e9 parameters are drawn where they live, not one by one on
    the host (what the latency study needs before every preset)."""
    params = [(n, p) for n, p in module.named_parameters() if not n.startswith("input_norm.")]
    if on_device:
        gen = torch.Generator(device=params[0][1].device).manual_seed(seed)
        for name, p in params:
            if name.endswith(_UNIT_WEIGHTS):
                p.normal_(1.0, 0.1, generator=gen)
            else:
                p.normal_(0.0, std, generator=gen)
        return
    gen = torch.Generator().manual_seed(seed)
    for name, p in params:
        r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        p.copy_(1.0 + 0.1 * r if name.endswith(_UNIT_WEIGHTS) else std * r)


def budget_padding(cfg: VisionConfig, budget: int, max_items: int) -> dict:
    """`VisionTower.prepare`'s padding arguments for a graph runner's budget of ``budget`` merged
    tokens holding up to ``max_items`` sequences: the fixed shapes every replay of it copies into."""
    rows = budget * cfg.merge_unit
    return dict(n_rows=rows, n_segments=max_items, max_seqlen=rows,
                n_window_segments=max_windows(cfg, budget, max_items),
                max_window_seqlen=min(rows, cfg.window_merged ** 2 * cfg.merge_unit))


def sequence_rows(grid) -> list[int]:
    """The attention sequences of a grid ((t, h, w) rows, a list or a tensor), in rows: one per
    frame, h * w patches each."""
    grid = grid.tolist() if isinstance(grid, torch.Tensor) else grid
    return [h * w for t, h, w in grid for _ in range(t)]


def filling_grid(cfg: VisionConfig, budget: int) -> torch.Tensor:
    """A one-frame grid of exactly ``budget`` merged tokens (one merge block high): the shape a
    runner captures a budget with."""
    rows = budget * cfg.merge_unit
    return torch.tensor([[1, cfg.merge_size, rows // cfg.merge_size]])


def pad_offsets(offsets: list[int], n_segments: int | None) -> torch.Tensor:
    """int32 cumulative offsets, padded to n_segments+1 entries by repeating the last offset."""
    if n_segments is not None:
        if len(offsets) - 1 > n_segments:
            raise ValueError(f"{len(offsets) - 1} sequences do not fit the {n_segments} segment slots")
        offsets = offsets + [offsets[-1]] * (n_segments + 1 - len(offsets))
    return torch.tensor(offsets, dtype=torch.int32)


def position_taps(grid: list[tuple[int, int, int]], merge: int, side: int, mode: str, n_rows: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices and weights that resample a learned ``side`` x ``side`` position table to
    every row's frame (rows in merge-block order, as the tower sees them), padded to ``n_rows``
    rows of weight 0: (int64 [n_rows, taps], ``dtype`` [n_rows, taps]).

    mode 'bilinear': 2 x 2 taps, corners aligned (grid position i of n maps to i (side-1)/(n-1)),
    what Qwen3-VL's tower interpolates with. mode 'bicubic': 4 x 4 taps of the cubic convolution
    kernel (a = -0.75) at pixel centres (i of n maps to (i + 1/2) side / n - 1/2), taps past the
    edge clamped to it, what GLM-4.1V's `grid_sample(bicubic, border)` computes. The coordinates
    are computed in float64 and rounded once to ``dtype``."""
    pos = merge_block_positions(grid, merge).to(torch.float64)                  # [n_valid, 2] (h, w)
    size = torch.tensor([(h, w) for t, h, w in grid], dtype=torch.float64).view(-1, 2)
    size = size.repeat_interleave(torch.tensor([t * h * w for t, h, w in grid]), dim=0)   # each row's frame
    if mode == "bilinear":
        src = pos * (side - 1) / (size - 1).clamp_min(1)
        offsets = torch.arange(0, 2)
    elif mode == "bicubic":
        src = (pos + 0.5) * side / size - 0.5
        offsets = torch.arange(-1, 3)
    else:
        raise ValueError(f"unknown interpolation mode {mode!r}; valid: 'bilinear', 'bicubic'")
    base = src.floor()
    taps = (base.long()[..., None] + offsets).clamp(0, side - 1)               # [n, 2 axes, k]
    d = (src[..., None] - base[..., None] - offsets).abs()
    if mode == "bilinear":
        wts = (1 - d).clamp_min(0)
    else:
        a = -0.75
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        wts = torch.where(d <= 1, near, far)
    k = offsets.numel()
    index = (taps[:, 0, :, None] * side + taps[:, 1, None, :]).reshape(-1, k * k)
    weight = (wts[:, 0, :, None] * wts[:, 1, None, :]).reshape(-1, k * k)
    out_i = torch.zeros(n_rows, k * k, dtype=torch.int64)
    out_w = torch.zeros(n_rows, k * k, dtype=dtype)
    out_i[: index.shape[0]], out_w[: index.shape[0]] = index, weight.to(dtype)
    return out_i, out_w


def interpolated_positions(table: torch.Tensor, meta: "TowerMetadata", dtype: torch.dtype) -> torch.Tensor:
    """[n_rows, width] in ``dtype``: each row's weighted sum of table rows (`position_taps`),
    accumulated in the weights' precision (fp32, fp64 for an fp64 tower) as transformers does.

    One gather and one multiply-add per tap over [n_rows, width]: fixed shapes, plain indexing
    (graph-capturable, deterministic), and no [rows, taps, width] intermediate (16 taps for GLM)."""
    index, weight = meta.pos_index, meta.pos_weight
    table = table.to(weight.dtype)
    out = torch.zeros(index.shape[0], table.shape[1], dtype=weight.dtype, device=table.device)
    for k in range(index.shape[1]):
        out.addcmul_(F.embedding(index[:, k], table), weight[:, k, None])
    return out.to(dtype)


# ---- GEMM alignment of the SwiGLU MLPs ---------------------------------------------------------
#
# cuBLAS runs a GEMM whose inner or output width is not a multiple of 8 elements on slow, narrowly
# aligned kernels: Qwen2.5-VL's MLP width 3420 ran far slower than the same GEMM zero-padded to
# 3456, while widths that are multiples of 8 but not of 64 (Qwen3-VL's 4304) already ran fast
# (results/reference/README.md, `GEMM_ALIGN`, has the measurements). So a hidden width that is not
# a multiple of GEMM_FAST_MULTIPLE is padded to a multiple of `gemm_align`; any other is left alone.
GEMM_FAST_MULTIPLE = 8
# The default pads on every device: a tower is built on the host and moved afterwards (its device
# is not known when it is built), the padding is exact, and one layout everywhere keeps the CPU
# tests on the layout the GPU runs. gemm_align=1 turns the padding off.
GEMM_ALIGN = 64
GEMM_ALIGN_CHOICES = tuple(1 << i for i in range(9))        # 1, 2, 4, ..., 256


def check_gemm_align(gemm_align) -> int:
    """``gemm_align`` if it is one of GEMM_ALIGN_CHOICES (a power of two from 1 to 256), else a
    ValueError naming it and the choices."""
    if isinstance(gemm_align, bool) or not isinstance(gemm_align, int) or gemm_align not in GEMM_ALIGN_CHOICES:
        raise ValueError(f"gemm_align must be a power of two from 1 to 256, one of {GEMM_ALIGN_CHOICES} (the "
                         f"MLP hidden width is padded to a multiple of it where it is not a multiple of "
                         f"{GEMM_FAST_MULTIPLE}; 1: no padding), got {gemm_align!r}")
    return gemm_align


def padded_width(hidden: int, gemm_align: int) -> int:
    """The hidden width an MLP multiplies with: ``hidden`` rounded up to a multiple of
    ``gemm_align`` where it is not a multiple of GEMM_FAST_MULTIPLE, else ``hidden`` itself."""
    if hidden % GEMM_FAST_MULTIPLE == 0:
        return hidden
    return -(-hidden // gemm_align) * gemm_align


class GatedMLP(nn.Module):
    """down(silu(gate(h)) * up(h)), checkpoint names gate_proj / up_proj / down_proj (Qwen2.5-VL
    blocks with biases, GLM-4.1V blocks and merger without).

    The hidden width is padded to Hp = `padded_width(hidden, gemm_align)`: gate_proj and up_proj
    share one [2*Hp, width] buffer (gate rows, zeros, up rows, zeros; the same for the biases) and
    down_proj one [width, Hp] buffer with zero columns past hidden. The checkpoint-shaped
    parameters are views into them, so `state_dict()` holds the checkpoint's names and shapes, and
    a load (`load_state_dict`, `VisionTower.load_hf_state_dict`) writes only the real rows: the
    padding is never written and stays zero, and captured graphs see the new weights. Both
    forwards multiply with the padded buffers: a padded hidden unit is silu(0) * 0 = 0 and meets
    a zero column of down_proj, so the output is the unpadded one (up to the matmuls' rounding).
    Inference only: the matmuls read the buffers, so autograd does not reach the parameters.
    Redone after every `_apply` (.to, .cuda, dtype casts), which replaces the parameters with
    fresh tensors, and after a load that replaced them (``assign=True``).

    The FLOP, byte and parameter models (`Family.row_macs` / `n_params`, `workbench.floors`) count
    the real hidden width: a floor is the work the checkpoint asks for, and the padding is work
    added only to reach a faster kernel. (The graph-pool model traces the forward itself, so it
    sees the padded activations, which are what the pool really holds.)"""

    def __init__(self, width: int, hidden: int, bias: bool, gemm_align: int = GEMM_ALIGN):
        super().__init__()
        self.gemm_align = gemm_align          # checked by the tower (`check_gemm_align`)
        self.gate_proj = nn.Linear(width, hidden, bias=bias)
        self.up_proj = nn.Linear(width, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, width, bias=bias)
        self._pack()
        self.register_load_state_dict_post_hook(GatedMLP._repack_if_replaced)

    def _pack(self) -> None:
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        hid, width = g.weight.shape
        hp = padded_width(hid, self.gemm_align)
        kw = dict(dtype=g.weight.dtype, device=g.weight.device)
        with torch.no_grad():
            gu_w = torch.zeros(2 * hp, width, **kw)
            down_w = torch.zeros(d.weight.shape[0], hp, **kw)
            gu_w[:hid], gu_w[hp:hp + hid] = g.weight, u.weight
            down_w[:, :hid] = d.weight
            gu_b = None
            if g.bias is not None:
                gu_b = torch.zeros(2 * hp, **kw)
                gu_b[:hid], gu_b[hp:hp + hid] = g.bias, u.bias
        g.weight.data, u.weight.data = gu_w[:hid], gu_w[hp:hp + hid]
        if gu_b is not None:
            g.bias.data, u.bias.data = gu_b[:hid], gu_b[hp:hp + hid]
        d.weight.data = down_w[:, :hid]
        self.gate_up_weight, self.gate_up_bias, self.down_weight = gu_w, gu_b, down_w

    def _views(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = [(self.gate_proj.weight, self.gate_up_weight), (self.up_proj.weight, self.gate_up_weight),
                 (self.down_proj.weight, self.down_weight)]
        if self.gate_up_bias is not None:
            pairs += [(self.gate_proj.bias, self.gate_up_bias), (self.up_proj.bias, self.gate_up_bias)]
        return pairs

    @staticmethod
    def _repack_if_replaced(module: "GatedMLP", incompatible_keys) -> None:
        # a plain load copies into the views; an assigning one (assign=True: a tower built on the
        # meta device, then given real tensors) replaces the parameters, and the padded buffers
        # would keep the old values. Repacked only then: a repack allocates new buffers, which a
        # captured graph would not see.
        if any(p.device != buf.device or p.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
               for p, buf in module._views()):
            module._pack()

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._pack()
        return out

    @property
    def padded_hidden(self) -> int:
        """Hp, the hidden width the matmuls run with (the real one is gate_proj.out_features)."""
        return self.down_weight.shape[1]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # gate and up as two matmuls, as transformers computes them, over the padded halves
        hp, w, b = self.padded_hidden, self.gate_up_weight, self.gate_up_bias
        gate = F.linear(h, w[:hp], None if b is None else b[:hp])
        up = F.linear(h, w[hp:], None if b is None else b[hp:])
        return F.linear(F.silu(gate) * up, self.down_weight, self.down_proj.bias)

    def forward_fused(self, h: torch.Tensor) -> torch.Tensor:
        gu = F.linear(h, self.gate_up_weight, self.gate_up_bias)
        return F.linear(fk.silu_mul(gu), self.down_weight, self.down_proj.bias)


class PatchEmbed(nn.Module):
    """Conv3d with stride = kernel over (C, T, P, P) == one matmul per row (Qwen2/2.5-VL without
    bias, Qwen3-VL and GLM-4.1V with one).

    The weight keeps the checkpoint's Conv3d shape [width, C, T, P, P]."""

    def __init__(self, cfg: VisionConfig, bias: bool = False):
        super().__init__()
        self.proj = nn.Module()
        self.proj.weight = nn.Parameter(torch.empty(cfg.width, cfg.in_channels, cfg.temporal_patch_size,
                                                    cfg.patch_size, cfg.patch_size))
        self.proj.bias = nn.Parameter(torch.empty(cfg.width)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, patch_dim] tower dtype
        w = self.proj.weight
        if self.proj.bias is None:
            return x @ w.view(w.shape[0], -1).t()
        return F.linear(x, w.view(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig, qkv_bias: bool = True, proj_bias: bool = True):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=qkv_bias)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=proj_bias)

    def forward(self, x, cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen=None, fused=False):
        n = x.shape[0]                                                    # x: [N, width]
        qkv = self.qkv(x).view(n, 3, self.heads, self.head_dim)
        if fused:  # q and k rotated in place, one kernel
            q, k, v = fk.rotary_(qkv, cos, sin).unbind(1)
        else:
            q, k, v = qkv.unbind(1)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = varlen_attention(q, k, v, cu_seqlens, max_seqlen, backend, dense_seqlen=dense_seqlen)
        return self.proj(o.reshape(n, -1))


class RMSNorm(nn.Module):
    """Qwen2.5-VL RMSNorm: statistics in fp32, scale applied after casting back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype != torch.float64 else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class PatchMerger(nn.Module):
    """Normalize, group each merge block (4 consecutive rows) into one row, 2-layer MLP with GELU."""

    def __init__(self, cfg: VisionConfig, norm: nn.Module):
        super().__init__()
        self.merged = cfg.width * cfg.merge_unit
        self.ln_q = norm
        self.mlp = nn.Sequential(nn.Linear(self.merged, self.merged), nn.GELU(),
                                 nn.Linear(self.merged, cfg.out_hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, width] -> [N/4, out_hidden]
        return self.mlp(self.ln_q(x).view(-1, self.merged))

    def forward_fused(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """The last block's residual sum and ln_q in one kernel, then the MLP."""
        _, y = add_norm(x, delta, self.ln_q)
        return self.mlp(y.view(-1, self.merged))


class VisionBlock(nn.Module):
    """A pre-norm block: x + attn(norm1(x)), then + mlp(norm2(x)). A family gives the norm kind
    ('layer' or 'rms'), its MLP module and attention options, and runs its MLP twice: `mlp_out(h)`
    in plain torch ops, `mlp_fused(h)` with the fused kernels."""

    def __init__(self, cfg: VisionConfig, norm_kind: str, mlp: nn.Module, **attn_kw):
        super().__init__()
        self.norm1, self.norm2 = (nn.LayerNorm(cfg.width, eps=cfg.eps) if norm_kind == "layer"
                                  else RMSNorm(cfg.width, cfg.eps) for _ in range(2))
        self.attn = VisionAttention(cfg, **attn_kw)
        self.mlp = mlp

    def mlp_out(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mlp_fused(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x, cu_seqlens, max_seqlen, dense_seqlen, cos, sin, backend):
        x = x + self.attn(self.norm1(x), cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen)
        return x + self.mlp_out(self.norm2(x))

    def forward_fused(self, x, delta, cu_seqlens, max_seqlen, dense_seqlen, cos, sin, backend):
        """(x + delta + attention, MLP output): the caller adds the MLP output in its next norm."""
        x, h = add_norm(x, delta, self.norm1)
        a = self.attn(h, cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen, fused=True)
        x, h = add_norm(x, a, self.norm2)
        return x, self.mlp_fused(h)


def add_norm(x: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, norm(x + delta)) in one fused kernel, for a LayerNorm or an RMSNorm module."""
    if isinstance(norm, nn.LayerNorm):
        return fk.add_norm(x, delta, norm.weight, norm.bias, norm.eps, "layer")
    if isinstance(norm, RMSNorm):
        return fk.add_norm(x, delta, norm.weight, None, norm.eps, "rms")
    raise TypeError(f"no fused kernel for {type(norm).__name__}")


class VisionTower(nn.Module):
    """Base class of every family: input embedding, metadata preparation, weight loading.

    `input_norm` is the device normalization module when normalization is the tower's first op
    (placement `tower`); `device_norm=True` declares that the tower is built for device
    normalization, and then a missing norm module is an error rather than a silent identity.
    `gemm_align` (one of GEMM_ALIGN_CHOICES, default GEMM_ALIGN on every device): the SwiGLU MLPs'
    hidden width is padded to a multiple of it where it is not a multiple of 8 (`padded_width`;
    1: no padding), invisibly to `state_dict()` and to loading (`GatedMLP`).
    """

    family: str = ""
    patch_bias: bool = False          # the patch embedding's Conv3d has a bias (Qwen3-VL, GLM-4.1V)

    def __init__(self, cfg: VisionConfig, input_norm: nn.Module | None = None, device_norm: bool = False,
                 attn_backend: str = "auto", fused="auto", gemm_align: int = GEMM_ALIGN):
        super().__init__()
        if cfg.family != self.family:
            raise ValueError(f"{type(self).__name__} builds family {self.family!r}, config {cfg.name!r} "
                             f"is {cfg.family!r}")
        if device_norm and input_norm is None:
            raise ValueError("this tower is built for device normalization (device_norm=True) but no norm "
                             "module was given; pass input_norm=wb.make_norm(name, cfg) with name in "
                             "wb.NORMS (an implicit identity would silently skip normalization)")
        self.cfg = cfg
        self.device_norm = device_norm
        self.input_norm = input_norm
        self.attn_backend = check_backend(attn_backend)
        self.fused = check_fused(fused)
        self.gemm_align = check_gemm_align(gemm_align)     # the families build their MLPs with it
        self.patch_embed = PatchEmbed(cfg, bias=self.patch_bias)

    # ---- properties ------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embed.proj.weight.device

    # ---- host side -------------------------------------------------------------------------
    def prepare(self, grid_thw: torch.Tensor, n_rows: int | None = None, n_segments: int | None = None,
                max_seqlen: int | None = None, n_window_segments: int | None = None,
                max_window_seqlen: int | None = None, device=None) -> TowerMetadata:
        """Build the metadata for `grid_thw` on the host and move it to `device` (default: the tower's).

        Padding arguments (for a graph runner's fixed budgets): `n_rows` total rows including
        padding (a multiple of 4), `n_segments` / `n_window_segments` the number of sequence slots
        (tails repeat the last offset), `max_seqlen` / `max_window_seqlen` the bound fixed at
        capture. Padding rows get rotary angle 0 and belong to no sequence.
        """
        cfg = self.cfg
        grid = check_grid(grid_thw, cfg)
        n_valid = sum(t * h * w for t, h, w in grid)
        n_rows = n_valid if n_rows is None else int(n_rows)
        if n_rows < n_valid or n_rows % cfg.merge_unit:
            raise ValueError(f"n_rows={n_rows} must be a multiple of {cfg.merge_unit} and >= the {n_valid} "
                             "rows of grid_thw")
        pos = torch.zeros(n_rows, 2, dtype=torch.int64)
        pos[:n_valid] = merge_block_positions(grid, cfg.merge_size)
        cos, sin = rotary_cos_sin(pos, cfg, self.dtype)
        frame_rows = sequence_rows(grid)
        offsets = [0]
        for r in frame_rows:
            offsets.append(offsets[-1] + r)
        uniform = (n_rows == n_valid and len(set(frame_rows)) == 1
                   and (n_segments is None or n_segments == len(frame_rows)))
        meta = TowerMetadata(cos=cos, sin=sin, cu_seqlens=pad_offsets(offsets, n_segments),
                             max_seqlen=max(frame_rows) if max_seqlen is None else int(max_seqlen),
                             n_rows=n_rows, n_valid_rows=n_valid,
                             n_valid=torch.tensor(n_valid, dtype=torch.int32),
                             dense_seqlen=frame_rows[0] if uniform else None)
        meta = self._prepare_family(meta, grid, n_window_segments, max_window_seqlen)
        return meta.to(self.device if device is None else device)

    # towers with a learned position table resampled to each grid: 'bilinear' or 'bicubic' taps
    # (`position_taps`), host metadata like the rotary tables; None: no table
    position_resampling: str | None = None

    def _prepare_family(self, meta, grid, n_window_segments, max_window_seqlen) -> TowerMetadata:
        if self.position_resampling is not None:
            dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
            meta.pos_index, meta.pos_weight = position_taps(grid, self.cfg.merge_size, self.table_side,
                                                            self.position_resampling, meta.n_rows, dtype)
        return meta

    def prepare_capture(self, budget: int, max_items: int, device=None) -> TowerMetadata:
        """The static metadata a graph runner captures a budget's general graph with: a grid filling
        the budget, its padding (`budget_padding`), and no dense attention, since that graph must
        also serve padded and packed replays."""
        padding = budget_padding(self.cfg, budget, max_items)
        meta = self.prepare(filling_grid(self.cfg, budget), **padding, device=device)
        return dataclasses.replace(meta, dense_seqlen=None)

    # metadata of the most recent grids `prepare_cached` keeps, per tower (device tensors: a
    # 4096-token image's rotary tables are 10 MiB)
    META_CACHE_SIZE = 16

    def prepare_cached(self, grid_thw: torch.Tensor, **kw) -> TowerMetadata:
        """`prepare` remembered per (grid, padding arguments, device): a repeated image shape costs
        no host work. The result is shared between calls: read it, never write into it."""
        # the tower's device and dtype need no place in the key: `_apply` empties the cache
        key = (tuple(check_grid(grid_thw, self.cfg)), tuple(sorted(kw.items())))
        return remember(self.__dict__.setdefault("_meta_cache", {}), key, self.META_CACHE_SIZE,
                        lambda: self.prepare(grid_thw, **kw))

    def _apply(self, fn, recurse=True):
        self.__dict__.pop("_kernels", None)      # resolved again for the new device or dtype
        self.__dict__.pop("_meta_cache", None)   # device or dtype changes: drop cached tables
        return super()._apply(fn, recurse)

    # ---- device side -----------------------------------------------------------------------
    def embed_input(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """First op: normalize on the device (placement `tower`) or cast what arrives."""
        if self.input_norm is not None:
            return self.input_norm(pixels, self.dtype, n_valid=meta.n_valid)
        # no device norm: the tower trusts its input, as engines' towers do (a uint8 batch is
        # then cast raw, which is exactly the silent failure the studies expose)
        return pixels.to(self.dtype)

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        raise NotImplementedError

    def block_attention(self, i: int, meta: TowerMetadata) -> tuple[torch.Tensor, int, int | None]:
        """(cu_seqlens, max_seqlen, dense_seqlen) block i attends with: full attention by default."""
        return meta.cu_seqlens, meta.max_seqlen, meta.dense_seqlen

    def run_blocks(self, x: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """Every block, then the head (`head`: the merger): [N, width] -> [N/4, embed_width] in the
        rows' order. Blocks listed in `taps` (Qwen3-VL's deepstack layers) hand their output to
        `tap(i, x)`, whose [N/4, out_hidden] features follow the head's output along the hidden
        axis, in block order.

        Fused (`kernels`): each block's residual sums ride in the next norm's kernel (the last one
        in the head's, or in a tap's), and the rotary and MLP activations are one kernel each."""
        backend, fused = self.kernels.backend, self.kernels.fused
        taps = self.taps
        features = []
        if not fused:
            for i, blk in enumerate(self.blocks):
                x = blk(x, *self.block_attention(i, meta), meta.cos, meta.sin, backend)
                if i in taps:
                    features.append(self.tap(i, x))
            out = self.head(x)
        else:
            delta = None
            for i, blk in enumerate(self.blocks):
                x, delta = blk.forward_fused(x, delta, *self.block_attention(i, meta), meta.cos, meta.sin, backend)
                if i in taps:
                    x, feature = self.tap_fused(i, x, delta)
                    features.append(feature)
                    delta = None
            out = self.head_fused(x, delta)
        return torch.cat([out, *features], dim=-1) if features else out

    # blocks whose output feeds an extra merger (none but in Qwen3-VL)
    taps: frozenset = frozenset()

    def tap(self, i: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def tap_fused(self, i: int, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, the tap's features) with the residual sum in the tap's first kernel."""
        raise NotImplementedError

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output [N, width] -> merged tokens [N/4, out_hidden]."""
        return self.merger(x)

    def head_fused(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """`head` of x + delta, the residual sum in the head's first kernel."""
        return self.merger.forward_fused(x, delta)

    def resolve_kernels(self, device=None, dtype: torch.dtype | None = None) -> "Kernels":
        """The concrete attention backend and fused choice for ``device`` and ``dtype`` (default:
        the tower's own), from what the tower was built with (``attn_backend``, ``fused``); an
        explicit choice the device or dtype cannot run is a ValueError here. Resolved once: the
        forward uses the result until the tower moves or changes dtype. A target other than the
        tower's own (a CUDA tower modelled on the meta device) is kept likewise."""
        device = self.device if device is None else torch.device(device)
        dtype = self.dtype if dtype is None else dtype
        backend = resolve_backend(self.attn_backend, device, dtype)
        if self.fused == "auto":
            fused = device.type == "cuda" and dtype in fk.FUSED_DTYPES and fk.available(device)
        elif self.fused and dtype == torch.float64:
            raise ValueError("the fused kernels compute in float32; a float64 tower needs fused=False (or 'auto')")
        else:
            fused = bool(self.fused)
        kernels = Kernels(backend, fused)
        self.__dict__["_kernels"] = kernels
        return kernels

    @property
    def kernels(self) -> "Kernels":
        """The kernels the forward runs (`resolve_kernels`, for the tower's device and dtype unless
        resolved for another target)."""
        kernels = self.__dict__.get("_kernels")
        return kernels if kernels is not None else self.resolve_kernels()

    def forward(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """pixels [N, patch_dim] (uint8 for a device-normalizing tower, else float) -> merged
        [N/4, embed_width] (see `run_blocks` for what follows the merged tokens in Qwen3-VL)."""
        if pixels.dim() != 2 or pixels.shape[1] != self.cfg.patch_dim:
            raise ValueError(f"pixels must be [N, {self.cfg.patch_dim}], got {tuple(pixels.shape)}")
        meta = self.prepare_cached(grid_thw)
        if pixels.shape[0] != meta.n_rows:
            raise ValueError(f"pixels have {pixels.shape[0]} rows but grid_thw adds up to {meta.n_rows}")
        return self.forward_prepared(pixels.to(self.device), meta)

    # ---- weights ---------------------------------------------------------------------------
    def state_mismatch(self, shapes: dict[str, tuple], missing: str = "missing from the checkpoint",
                       name=lambda k: k) -> str | None:
        """What keeps checkpoint tensors of ``shapes`` (tower key -> shape) from loading into this
        tower: missing, unexpected and mis-shaped keys (``name`` gives a key as the checkpoint
        spells it), or None when they fit."""
        own = {k: tuple(v.shape) for k, v in self.state_dict().items() if not k.startswith("input_norm.")}
        absent = sorted(set(own) - set(shapes))
        unexpected = sorted(set(shapes) - set(own))
        wrong = sorted(f"{name(k)}: checkpoint {shapes[k]} vs tower {own[k]}"
                       for k in set(own) & set(shapes) if tuple(shapes[k]) != own[k])
        if not (absent or unexpected or wrong):
            return None

        def show(xs):
            return ", ".join(xs[:12]) + (f" (+{len(xs) - 12} more)" if len(xs) > 12 else "")
        parts = [f"{missing}: {show(absent)}"] if absent else []
        if unexpected:
            parts.append(f"not in the {self.cfg.family} tower {self.cfg.name!r}: {show(unexpected)}")
        if wrong:
            parts.append(f"shape mismatch: {show(wrong)}")
        return "; ".join(parts)

    def init_random(self, seed: int = 0, std: float = 0.02) -> "VisionTower":
        """Checkpoint-like random weights drawn on the host (`init_checkpoint_like`); returns the tower."""
        init_checkpoint_like(self, seed, std)
        return self

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> "VisionTower":
        """Load a transformers vision-model state dict (keys may carry a `...visual.` prefix).

        Raises ValueError naming every missing, unexpected or mis-shaped key."""
        prefixes = {k[: k.index("visual.") + len("visual.")] for k in sd if "visual." in k}
        if len(prefixes) == 1 and all(k.startswith(next(iter(prefixes))) for k in sd):
            p = next(iter(prefixes))
            sd = {k[len(p):]: v for k, v in sd.items()}
        sd = {k: v for k, v in sd.items() if not k.endswith("inv_freq")}
        own = {k: v for k, v in self.state_dict().items() if not k.startswith("input_norm.")}
        problem = self.state_mismatch({k: tuple(v.shape) for k, v in sd.items()})
        if problem:
            raise ValueError("state dict does not fit: " + problem)
        with torch.no_grad():
            for k, v in own.items():
                v.copy_(sd[k])
        return self
