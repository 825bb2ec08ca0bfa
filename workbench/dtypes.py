"""Dtype names: the one place that maps torch dtypes to the names tables, parameters and messages
use ("bfloat16", "uint8", ...) and back."""
from __future__ import annotations

from typing import Iterable

import torch

NAMES: dict[torch.dtype, str] = {torch.uint8: "uint8", torch.float16: "float16", torch.bfloat16: "bfloat16",
                                 torch.float32: "float32", torch.float64: "float64"}
ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
           "fp64": "float64", "double": "float64", "u8": "uint8"}
BY_NAME = {name: dt for dt, name in NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16 (the name tables and figures carry)."""
    return NAMES.get(dtype, str(dtype).replace("torch.", ""))


def names(dtypes: Iterable[torch.dtype]) -> str:
    """'bfloat16, float32' for a list of dtypes, for error messages."""
    return ", ".join(dtype_name(d) for d in dtypes)


def resolve_dtype(dtype, allowed: Iterable[torch.dtype] | None = None, what: str = "dtype") -> torch.dtype:
    """A torch dtype from a dtype, a name ('bfloat16', 'torch.bfloat16') or an alias ('bf16');
    ValueError naming the value and the valid choices when it is none of ``allowed``."""
    allowed = tuple(allowed) if allowed is not None else tuple(NAMES)
    found = None
    if isinstance(dtype, torch.dtype):
        found = dtype
    elif isinstance(dtype, str):
        key = dtype.strip().replace("torch.", "")
        found = BY_NAME.get(ALIASES.get(key, key))
    if found is None or found not in allowed:
        raise ValueError(f"unsupported {what} {dtype!r}; valid: {names(allowed)} (names, torch dtypes, or "
                         f"aliases such as bf16/fp32)")
    return found
