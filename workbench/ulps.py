"""Distances between low-precision results in units in the last place: `bf16_ulps` (bit-pattern
distance of two bf16 tensors) and `spacing_ulps` (error in units of a dtype's spacing at the
reference value)."""
from __future__ import annotations

import torch


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in bf16 units in the last place (both bf16; +0 and -0 are the same point): the sign-
    magnitude bit patterns are mapped onto one ordered integer line and subtracted."""
    def ordered(t):
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        mag = bits & 0x7FFF
        return torch.where(bits < 0, -mag, mag)
    return (ordered(a) - ordered(b)).abs()


def spacing_ulps(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, floor: float = 2 ** -4) -> torch.Tensor:
    """|got - want| in units of ``dtype``'s spacing at |want| (bf16 or fp16), the spacing taken no
    finer than at ``floor``: a result near zero that is a difference of O(1) terms (a norm's
    x - mean, plus a bias) carries the rounding error of those terms, not of the tiny result."""
    bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]        # explicit mantissa bits
    got, want = got.float(), want.float()
    spacing = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(floor))) - bits)
    return (got - want).abs() / spacing
