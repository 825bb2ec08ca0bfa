"""How numbers and devices are written in every table, figure and printout: `fmt_us` (a duration),
`fmt_bytes` (a byte count), `device_label` (one name per device)."""
from __future__ import annotations

import torch

from .provenance import cpu_model


def fmt_us(us: float) -> str:
    """A duration given in microseconds, in the most readable unit: '59.3 us', '1.24 ms'."""
    if us != us:
        return "nan"
    if us < 1e3:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_bytes(n: float) -> str:
    """A byte count in binary units: '1.00 GiB', '9.19 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


def device_label(device) -> str:
    """One name for a device, used in every table and figure: 'NVIDIA H200', 'cpu: <model>'."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu: {cpu_model()}"
