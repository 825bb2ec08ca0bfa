"""Qwen3.5 vision tower (transformers' `Qwen3_5VisionModel`): the Qwen3-VL tower without deepstack.

Same patch embedding (Conv3d with bias, patch 16), learned 48 x 48 position table resampled
bilinearly to each grid, LayerNorm / GELU(tanh) blocks with full attention per frame, and the same
merger (LayerNorm(width) -> 2x2 shuffle -> fc1 -> GELU -> fc2); transformers' Qwen3.5 tower builds
no deepstack mergers, so the output is the merged tokens alone, [N/4, out_hidden].

Presets, checks and sizes: the family's spec, `workbench.families.qwen3_5`.
"""
from __future__ import annotations

from .qwen3_vl import Qwen3VLVisionTower


class Qwen35VisionTower(Qwen3VLVisionTower):
    family = "qwen3.5"


TOWER = Qwen35VisionTower
