"""The memory a study's largest cell needs, estimated before a sweep starts, so a cell that cannot
fit the device it will run on is refused with a message instead of dying half way (the kernel's
OOM killer leaves no message at all).

The estimate is an upper-bound model, not a measurement: the tower's weights (counted exactly on
the meta device), its live activations at the cell's row count (a few full-width tensors and the
MLP's hidden tensors), the score matrices where attention materializes them (fp32 on CUDA), and
the pixel rows in each dtype a study keeps at once. A cell is refused when
its estimate exceeds `HEADROOM` of what the device has (CPU: MemAvailable now; CUDA: the smallest
visible GPU's total memory, from NVML, without initializing CUDA).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from .params import ParamError

HEADROOM = 0.9           # of the device's memory a cell may plan to use


@dataclass(frozen=True)
class Footprint:
    """Estimated peak bytes of a study's largest cell, and what that cell is."""

    bytes: int
    cell: str


def cell_costs(cells: str | None, params, reference_tokens: int = 1024) -> dict:
    """{value of a study's cell parameter ``cells``: what one cell costs}: the tower FLOPs of a preset's or model
    folder's config at ``reference_tokens`` merged tokens (at the ``depth`` parameter), 1 where none resolves; {}
    for a study of one cell. The sweep shares a recorded time among cells by these weights."""
    if not cells:
        return {}
    from ..checkpoints import resolve_config
    from ..floors import tower_flops
    out = {}
    for v in params.get(cells) or []:
        try:        # resolve_config takes a preset or a model folder, and refuses anything else
            out[v] = float(tower_flops(resolve_config(v, params.get("depth")), [reference_tokens])["total"])
        except (ValueError, TypeError, KeyError):
            out[v] = 1.0
    return out


@functools.lru_cache(maxsize=64)
def tower_params(cfg) -> int:
    """Parameters of the tower of ``cfg`` as allocated (built on the meta device: no memory, any
    size). The MLP's GEMM-alignment padding (towers.common.GEMM_ALIGN) lives in buffers, not
    parameters, so this equals ``cfg.n_params``, the checkpoint's count."""
    import torch

    from ..towers import build_tower

    with torch.device("meta"):
        tower = build_tower(cfg)
    return sum(p.numel() for p in tower.parameters())


def tower_bytes(cfg, rows: int, longest: int, itemsize: int, device: str) -> int:
    """Weights plus the peak of one forward over ``rows`` patch rows whose longest attention
    sequence has ``longest`` rows, in a dtype of ``itemsize`` bytes on ``device``."""
    weights = tower_params(cfg) * itemsize
    activations = rows * (8 * cfg.width + 3 * cfg.mlp_hidden) * itemsize
    # fp32 on CUDA attends through a dense masked SDPA (the flash kernels take fp16/bf16 only):
    # an [N, N] mask and the scores and probabilities of every head; the CPU runs a flash kernel
    # per sequence and CUDA's half-precision kernels keep the scores in registers
    masked = device == "cuda" and itemsize >= 4
    scores = (2 * cfg.heads * 4 + 1) * rows * rows if masked else 0
    return weights + activations + scores


def rows_bytes(cfg, rows: int, bytes_per_element: float) -> int:
    """Pixel rows held at once, ``bytes_per_element`` summed over every copy kept."""
    return int(rows * cfg.patch_dim * bytes_per_element)


def largest_budget(cfg, p, pixel_bytes: float, device: str, preset: str) -> Footprint:
    """The largest of ``p["budgets"]``: its pixel rows (``pixel_bytes`` per element, summed over
    every copy kept) and the bf16 tower over all of them as one sequence."""
    budget = max(p["budgets"])
    rows = budget * cfg.merge_unit
    need = rows_bytes(cfg, rows, pixel_bytes) + tower_bytes(cfg, rows, rows, 2, device)
    return Footprint(need, f"budget {budget} tokens, {preset}")


def largest(footprints) -> Footprint:
    """The largest of several cells' footprints (the first of equals)."""
    return max(footprints, key=lambda f: f.bytes)


def itemsize(p) -> int:
    """Bytes of an element of the tower dtype ``p["dtype"]`` (a dtype name)."""
    from ..dtypes import resolve_dtype

    return resolve_dtype(p["dtype"]).itemsize


def available_bytes(device: str) -> tuple[int | None, str]:
    """(bytes, where the number comes from) for ``device`` ('cpu' or 'cuda'); None when unknown."""
    if device == "cpu":
        try:
            with open("/proc/meminfo", encoding="utf-8") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024, "MemAvailable of this host"
        except (OSError, ValueError, IndexError):
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free memory of this host"
        except (ValueError, OSError, AttributeError):
            return None, "unknown"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            sizes = [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                     for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
        return (min(sizes), "memory of the smallest GPU of this host") if sizes else (None, "unknown")
    except Exception:  # noqa: BLE001 - no NVML here: the device will say so itself
        return None, "unknown"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def check_fits(study: str, footprint: Footprint, device: str) -> None:
    """ParamError when ``footprint`` exceeds HEADROOM of ``device``'s memory (nothing when the
    device's memory is unknown)."""
    have, source = available_bytes(device)
    if have is None or footprint.bytes <= HEADROOM * have:
        return
    raise ParamError(f"study {study!r}: its largest cell ({footprint.cell}) needs about {_gb(footprint.bytes)} "
                     f"(an estimate: workbench.studies.footprint), more than {HEADROOM:.0%} of the "
                     f"{_gb(have)} this device has ({source}); lower that cell's sizes")
