"""The one door for a device name: 'auto' (or None) -> CUDA where there is one, else the CPU."""
from __future__ import annotations

import torch


def resolve_device(device) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else must be a valid, present device."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"invalid device {device!r}; valid: 'auto', 'cpu', 'cuda', 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but this torch has no CUDA device; use 'cpu' or 'auto'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; valid: 'auto', 'cpu', 'cuda', 'cuda:N'")
    return dev
