"""Floors: the least time a piece of work can take on a device, from what it must move or compute.

`floor_us` (DRAM bytes at a copy ceiling) and `flop_floor_us` (FLOPs at a matmul or attention
rate), both against ceilings measured in the same run (workbench.ceilings); `tower_flops` counts
the FLOPs of one tower forward from its config. Pure functions, no device needed.
"""
from __future__ import annotations


def floor_us(n_bytes: float, gbs: float) -> float:
    """The time ``n_bytes`` of DRAM traffic take at ``gbs`` GB/s, in microseconds."""
    return n_bytes / (gbs * 1e3)


def flop_floor_us(flops: float, tflops: float) -> float:
    """The time ``flops`` take at ``tflops`` TFLOP/s, in microseconds."""
    return flops / (tflops * 1e6)


def tower_flops(cfg, seq_rows) -> dict:
    """FLOPs of one tower forward over sequences of ``seq_rows`` pixel rows each (one per image or
    video frame), counted from the config: dict(matmul, attention_full, attention_window, total).

    matmul: 2 x the multiply-adds of the matmuls that run per pixel row (patch embedding, every
    block's qkv, projection and MLP: fc1 + fc2, or gate + up + down for SwiGLU) and per merged
    token (the merger, Qwen3-VL's deepstack mergers, GLM-4.1V's downsample conv), as the family
    counts them (`Family.row_macs`, `Family.token_macs`); the learned position table's resampling
    (a few taps per row) is not a matmul and not counted.
    attention: QK^T and PV, 4 x s^2 x width per block and sequence of s rows, in the blocks with
    full attention; Qwen2.5-VL's window blocks attend within windows of (window_merged x
    merge_size)^2 rows, counted as whole windows (an upper bound at ragged image edges).
    """
    seq_rows = [int(s) for s in seq_rows]
    rows = sum(seq_rows)
    w, fam = cfg.width, cfg.spec
    matmul = 2 * (fam.row_macs(cfg) * rows + fam.token_macs(cfg) * rows // cfg.merge_unit)
    full_blocks = fam.full_attention_blocks(cfg)
    window_blocks = cfg.depth - full_blocks
    win = (cfg.window_merged * cfg.merge_size) ** 2
    full = full_blocks * sum(4 * s * s * w for s in seq_rows)
    window = window_blocks * sum(4 * min(s, win) * s * w for s in seq_rows)
    return dict(matmul=matmul, attention_full=full, attention_window=window, total=matmul + full + window)
