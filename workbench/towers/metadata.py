"""Host-side metadata of a tower's forward: `TowerMetadata`, the grid checks, the rotary and
learned-position tables, and the fixed padding a graph runner's budget prepares with."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import VisionConfig


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
    # Kimi-K2.5's frames: row r adds row frame_index[r] of its temporal table (0: none), and its
    # pooled output row s is sum_f pool_weight[s, f] * x[pool_index[s, f]] (each frame's row of the
    # merged token, weight 1/t; rows past the pooled ones weigh 0)
    frame_index: torch.Tensor | None = None         # int64 [n_rows]
    pool_index: torch.Tensor | None = None          # int64 [n_rows, frames]
    pool_weight: torch.Tensor | None = None         # fp32 (fp64 for an fp64 tower) [n_rows, frames]
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


def rotary_cos_sin(pos: torch.Tensor, cfg: VisionConfig, dtype: torch.dtype,
                   inv_freq=rotary_inv_freq, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N, head_dim]: angles (h-freqs | w-freqs) repeated twice for rotate-half.

    inv_freq(cfg, math_dtype): the inverse frequencies, [head_dim/4] shared by the h and w halves
    (the default), or [2, head_dim/4] with the h half's row first (Pixtral's interleaved layout).
    interleaved: the half is (w_0, h_0, w_1, h_1, ...) instead (Kimi-K2.5's layout)."""
    math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv = inv_freq(cfg, math_dtype)
    ang = pos.to(math_dtype)[:, :, None] * inv                      # [N, 2 (h, w), head_dim/4]
    ang = ang.flip(1).transpose(1, 2).flatten(1) if interleaved else ang.flatten(1)   # [N, head_dim/2]
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


def budget_padding(cfg: VisionConfig, budget: int, max_items: int) -> dict:
    """`VisionTower.prepare`'s padding arguments for a graph runner's budget of ``budget`` merged
    tokens holding up to ``max_items`` sequences: the fixed shapes every replay of it copies into."""
    rows = budget * cfg.merge_unit
    return dict(n_rows=rows, n_segments=max_items, max_seqlen=rows,
                n_window_segments=max_windows(cfg, budget, max_items),
                max_window_seqlen=min(rows, cfg.window_merged ** 2 * cfg.merge_unit))


def sequence_rows(grid, joint_frames: bool = False) -> list[int]:
    """The attention sequences of a grid ((t, h, w) rows, a list or a tensor), in rows: one per
    frame, h * w patches each; with ``joint_frames``, one per item, t * h * w (Kimi-K2.5's frames
    of a chunk attend to each other)."""
    grid = grid.tolist() if isinstance(grid, torch.Tensor) else grid
    if joint_frames:
        return [t * h * w for t, h, w in grid]
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
    accumulated in the weights' precision (fp32, fp64 for an fp64 tower) as transformers does."""
    return weighted_rows(table, meta.pos_index, meta.pos_weight, dtype)


def weighted_rows(table: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[n, width] in ``dtype``: out[r] = sum_k weight[r, k] * table[index[r, k]], accumulated in
    the weights' precision (index, weight: [n, taps]).

    One gather and one multiply-add per tap over [n, width]: fixed shapes, plain indexing
    (graph-capturable, deterministic), and no [rows, taps, width] intermediate (16 taps for GLM)."""
    table = table.to(weight.dtype)
    out = torch.zeros(index.shape[0], table.shape[1], dtype=weight.dtype, device=table.device)
    for k in range(index.shape[1]):
        out.addcmul_(F.embedding(index[:, k], table), weight[:, k, None])
    return out.to(dtype)
