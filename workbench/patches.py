"""The flat patch rows of a batch (`PatchBatch`), the patchify that lays them out, the CPU
normalization of uint8 rows (bit-identical to transformers'), and the processor's normalization
in float64 that the device norms are judged against (`normalize_reference`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from . import limits


@dataclass
class PatchBatch:
    """Flat patch rows of one or more items plus their [t, h, w] patch grids.

    pixels:   [N, patch_dim] (uint8 normally; float32 when normalized on the CPU)
    grid_thw: int64 [k, 3], one row per item, positive entries, sum(t*h*w) == N
    """

    pixels: torch.Tensor
    grid_thw: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.pixels, torch.Tensor) or not isinstance(self.grid_thw, torch.Tensor):
            raise TypeError(f"PatchBatch needs torch tensors, got pixels={type(self.pixels).__name__}, "
                            f"grid_thw={type(self.grid_thw).__name__}")
        if self.pixels.dim() != 2:
            raise ValueError(f"pixels must be 2-D [N, patch_dim], got shape {tuple(self.pixels.shape)}")
        g = self.grid_thw
        if g.dtype != torch.int64 or g.dim() != 2 or g.shape[1] != 3 or g.shape[0] < 1:
            raise ValueError(f"grid_thw must be int64 [k, 3] with k >= 1, got dtype {g.dtype} "
                             f"shape {tuple(g.shape)}")
        if bool((g <= 0).any()):
            raise ValueError(f"grid_thw entries must be positive, got {g.tolist()}")
        total = int(g.prod(dim=1).sum())
        if total != self.pixels.shape[0]:
            raise ValueError(f"grid_thw {g.tolist()} adds up to {total} rows (sum of t*h*w) but pixels "
                             f"has {self.pixels.shape[0]} rows")

    @property
    def n_items(self) -> int:
        return self.grid_thw.shape[0]

    @property
    def n_rows(self) -> int:
        return self.pixels.shape[0]

    def n_merged_tokens(self, merge_unit: int = 4) -> int:
        """Tokens after the merger fuses `merge_unit` rows (merge_size**2) into one."""
        merge_unit = limits.integer(merge_unit, "merge_unit")
        if self.n_rows % merge_unit:
            raise ValueError(f"{self.n_rows} rows are not a multiple of merge_unit={merge_unit}")
        return self.n_rows // merge_unit

    @property
    def item_rows(self) -> list[int]:
        """Rows of each item (t*h*w), in order."""
        return [int(v) for v in self.grid_thw.prod(dim=1).tolist()]

    @property
    def item_slices(self) -> list[slice]:
        """Row slice of each item in `pixels`."""
        out, start = [], 0
        for n in self.item_rows:
            out.append(slice(start, start + n))
            start += n
        return out

    def place_tokens(self, out: torch.Tensor, indices: Sequence[int], packed: torch.Tensor,
                     merge_unit: int = 4, tokens: Sequence[int] | None = None) -> None:
        """Scatter `packed` (the merged tokens of items `indices`, concatenated in that order)
        into `out` (every item's tokens, in item order) at each item's token rows. tokens: the
        merged tokens of every item of the batch (`VisionConfig.item_tokens`); None: rows /
        merge_unit each ([N / merge_unit, ...] in all)."""
        tokens = [r // merge_unit for r in self.item_rows] if tokens is None else list(tokens)
        firsts = np.cumsum([0] + tokens).tolist()
        start = 0
        for i in indices:
            first, k = firsts[i], tokens[i]
            out[first: first + k] = packed[start: start + k]
            start += k

    def to(self, device: Any) -> "PatchBatch":
        """Both tensors on `device` (a no-op copy-free view when already there)."""
        return PatchBatch(self.pixels.to(device), self.grid_thw.to(device))

    def select(self, indices: Sequence[int], copy: bool = True) -> "PatchBatch":
        """A new batch of the items `indices` (repeats allowed, negative indices count from the
        end), in that order; rows are copied. With ``copy=False``, a run of consecutive items in
        ascending order is a view of this batch's rows instead (no host copy: a 4096-token image
        is 19 MB), which keeps pinned memory pinned; other selections are still copied."""
        idx = [int(i) for i in (indices.tolist() if isinstance(indices, torch.Tensor) else indices)]
        if not idx:
            raise ValueError("select() needs at least one index (a PatchBatch holds at least one item)")
        k = self.n_items
        bad = [i for i in idx if not -k <= i < k]
        if bad:
            raise ValueError(f"item indices {bad} are out of range for a batch of {k} items")
        idx = [i % k for i in idx]
        slices = self.item_slices
        if not copy and idx == list(range(idx[0], idx[0] + len(idx))):
            return PatchBatch(self.pixels[slices[idx[0]].start:slices[idx[-1]].stop], self.grid_thw[idx])
        pixels = torch.cat([self.pixels[slices[i]] for i in idx], dim=0)  # always a fresh tensor
        return PatchBatch(pixels, self.grid_thw[idx].clone())

    def split(self) -> list["PatchBatch"]:
        """One single-item batch per item (rows copied)."""
        return [self.select([i]) for i in range(self.n_items)]

    @classmethod
    def cat(cls, batches: Sequence["PatchBatch"]) -> "PatchBatch":
        """Items of all `batches`, in order."""
        batches = list(batches)
        if not batches:
            raise ValueError("PatchBatch.cat needs at least one batch")
        dims = {b.pixels.shape[1] for b in batches}
        dtypes = {b.pixels.dtype for b in batches}
        if len(dims) > 1 or len(dtypes) > 1:
            raise ValueError(f"cannot cat batches with different patch_dim {sorted(dims)} or "
                             f"dtypes {sorted(map(str, dtypes))}")
        return cls(torch.cat([b.pixels for b in batches], dim=0),
                   torch.cat([b.grid_thw for b in batches], dim=0))


def patchify_array(frames: np.ndarray, p: int, m: int, tp: int, out: np.ndarray) -> None:
    """[F, H, W, C] uint8 (F a multiple of tp, or 1 for a still image) -> its rows
    out [F/tp * gh * gw, C*tp*p*p] (written in place: the batch's rows are allocated once)."""
    f, h, w, c = frames.shape
    gh, gw = h // p, w // p
    gt = max(1, f // tp)
    # out viewed as (t, block_row, block_col, inner_row, inner_col, C, T, ph, pw)
    dst = out.reshape(gt, gh // m, gw // m, m, m, c, tp, p, p)
    if f == 1:  # a still image: both temporal copies are the frame itself
        x = frames.reshape(1, gh // m, m, p, gw // m, m, p, c).transpose(0, 1, 4, 2, 5, 7, 3, 6)
        dst[...] = x[:, :, :, :, :, :, None]
    else:
        dst[...] = frames.reshape(gt, tp, gh // m, m, p, gw // m, m, p, c).transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)


def _normalize_lut(cfg) -> np.ndarray:
    """[C, 256] float32: the transformers value of every uint8 level per channel: rescale in float64
    and cast to float32 (as its `rescale` does), then (x - mean) / std in float32."""
    levels = (np.arange(256, dtype=np.float64) * cfg.rescale_factor).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None]
    std = np.asarray(cfg.image_std, dtype=np.float32)[:, None]
    return (levels[None, :] - mean) / std


def normalize_rows(pixels: torch.Tensor, cfg) -> torch.Tensor:
    """uint8 [N, patch_dim] rows -> float32 rows normalized exactly as transformers' CPU processor
    (bit-identical: every output is a per-channel lookup of the uint8 level)."""
    if pixels.dtype != torch.uint8:
        raise ValueError(f"normalize_rows takes uint8 rows, got {pixels.dtype}")
    lut = torch.from_numpy(_normalize_lut(cfg))
    per = cfg.temporal_patch_size * cfg.patch_size ** 2
    channel = torch.arange(pixels.shape[1]) // per  # channel of column j is j // (T*P*P)
    return lut[channel[None, :], pixels.cpu().long()]


def normalize_reference(pixels: torch.Tensor, cfg,
                        dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The processor's normalization ``(x * rescale - mean[c]) / std[c]`` computed in `dtype`.

    pixels: [N, patch_dim] of any real dtype holding raw values; returns [N, patch_dim] of
    `dtype` on the pixels' device. For tests and correctness studies (float64 by default, so it
    is exact to ~1e-16 and the fp32/bf16 kernels can be judged against it).
    """
    d = cfg.patch_dim
    if pixels.dim() != 2 or pixels.shape[1] != d:
        raise ValueError(f"pixels must be 2-D [N, {d}], got shape {tuple(pixels.shape)}")
    per_channel = d // cfg.in_channels
    mean = torch.tensor(cfg.image_mean, dtype=dtype, device=pixels.device).repeat_interleave(per_channel)
    std = torch.tensor(cfg.image_std, dtype=dtype, device=pixels.device).repeat_interleave(per_channel)
    return (pixels.to(dtype) * cfg.rescale_factor - mean) / std
