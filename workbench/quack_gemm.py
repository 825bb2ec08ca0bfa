"""quack's CuTe GEMM with the gated activation in its epilogue, for the SwiGLU MLPs (`towers.layers.GatedMLP`).

A tower built with ``gemm="quack"`` runs each gated MLP's gate/up projection and silu(gate) * up as one
kernel (quack-kernels' ``gemm_act``, activation ``swiglu``): the [rows, 2 x hidden] pre-activation is
neither written nor read back, and the product is computed in float32 before its one rounding. The
down projection stays on cuBLAS (``F.linear``). quack pairs the gate and up columns ([g0, u0, g1, u1,
...]): the MLP keeps its packed weight in that order (`GatedMLP.use_pairs`), so a load writes into it
and a captured graph sees the new weights, as with the usual [gate; up] halves.

quack's autotuner keys its choice by the operands' shapes, so a pack of a row count it has not seen
would tune again (seconds to tens of seconds, `results/reference/probe_quack-h200-20261204.json`);
the tower pins one configuration (`config`) instead, and `warm` compiles it at build time, outside any
timed call or graph capture. quack still records a launch plan per operand shapes and keys a pinned config by
its identity (so `config` builds it once): a new row count costs one host-side cold pass per MLP shape (the
blocks share one), which a replayed graph never pays; the quack probe in docs/probes.md timed
it. quack comes with FlashAttention-4 (an optional extra, never a CI
dependency: docs/gpu-hosts.md says how it reaches a GPU host without a registry); it runs on Hopper (compute
capability 9.x) in bf16 and fp16.
"""
from __future__ import annotations

import functools

import torch

from .vocabulary import GEMM_CHOICES
DTYPES = (torch.bfloat16, torch.float16)
# quack 0.6.5's SM90 default (tile 128 x 192, ping-pong, cluster 2 x 1): one of its search space's configs,
# valid for the gated epilogue (tile_n a multiple of 32)
CONFIG = dict(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1, is_dynamic_persistent=False,
              device_capacity=9)
_WARM: set = set()


def check_gemm(gemm) -> str:
    """``gemm`` if it names one of GEMM_CHOICES, else ValueError naming it and the valid ones."""
    if not isinstance(gemm, str) or gemm not in GEMM_CHOICES:
        raise ValueError(f"unknown MLP gemm {gemm!r}; valid: {GEMM_CHOICES} ('cublas': torch's matmuls and the "
                         "fused Triton activation; 'quack': quack-kernels' gemm_act with the SwiGLU in its "
                         "epilogue, CUDA compute capability 9.x, bf16/fp16; 'auto': quack where it runs, else "
                         "cublas)")
    return gemm


def _gemm_act():
    """quack's gemm_act, or None where quack-kernels is not installed."""
    try:
        from quack.gemm_interface import gemm_act
    except Exception:  # noqa: BLE001 - ImportError, or a broken install of its CuTe libraries
        return None
    return gemm_act


def quack_problem(device, dtype: torch.dtype) -> str | None:
    """Why quack's gated GEMM cannot run on ``device`` in ``dtype`` (None: it can)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"needs a CUDA device, got {device}"
    if dtype not in DTYPES:
        return f"needs bf16 or fp16, got {dtype}"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"is pinned to Hopper's configuration (compute capability 9.x), got {major}.{minor}"
    if _gemm_act() is None:
        return ("is not installed (quack-kernels, which FlashAttention-4 brings along; docs/gpu-hosts.md "
                "says how to bring it to a host without a registry: make wheels WHEEL_LIST=tools/fa4-wheels.txt)")
    return None


def resolve_gemm(gemm: str, device, dtype: torch.dtype) -> str:
    """``gemm`` ('cublas' or 'quack'; the tower settles 'auto' first) where the device and dtype can run it;
    'quack' where they cannot is a ValueError saying why."""
    if gemm == "quack":
        problem = quack_problem(device, dtype)
        if problem is not None:
            raise ValueError(f"MLP gemm 'quack' {problem}; use 'cublas'")
    return gemm


@functools.cache
def config():
    """The pinned configuration (`CONFIG`) as quack's GemmConfig (built once: every call passes the same one)."""
    from quack.gemm_config import GemmConfig
    return GemmConfig(**CONFIG)


def swiglu(h: torch.Tensor, pairs_weight: torch.Tensor, pairs_bias: torch.Tensor | None) -> torch.Tensor:
    """silu(h @ gate.T + b_g) * (h @ up.T + b_u) in one kernel: [rows, width] -> [rows, hidden]; the weight
    [2 x hidden, width] and bias [2 x hidden] hold gate and up rows paired (g0, u0, g1, u1, ...)."""
    _, out = _gemm_act()(h, pairs_weight.t(), bias=pairs_bias, activation="swiglu", store_preact=False,
                         config=config())
    return out


def warm(width: int, hidden: int, bias: bool, dtype: torch.dtype, device) -> None:
    """One call on a small input of the MLP's shape, so that the pinned kernel's JIT compile happens now
    (build time), once per process and shape, never inside a timed call or a graph capture."""
    device = torch.device(device)
    key = (width, hidden, bias, dtype, str(device))
    if key in _WARM or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return
    with torch.no_grad():
        w = torch.zeros(2 * hidden, width, dtype=dtype, device=device)
        swiglu(torch.zeros(256, width, dtype=dtype, device=device), w,
               torch.zeros(2 * hidden, dtype=dtype, device=device) if bias else None)
    _WARM.add(key)
