"""The Triton plumbing the kernel modules share (workbench.norms, workbench.fused,
workbench.ceilings): Triton imported after TRITON_INTERPRET has its default (the interpreter on a
machine without CUDA), kernels jitted on first use, and whether they run interpreted.

Kernels are plain functions passed to ``triton.jit`` lazily, on the first call: ``triton.jit``
reads TRITON_INTERPRET when it wraps a function, so setting it any time before that first call (at
the top of a test module, before or after importing the kernel modules) runs the kernels in
Triton's CPU interpreter; after the first call the choice is fixed for the process.
"""
from __future__ import annotations

import os

import torch

# before Triton is imported: its interpreter on a machine where torch sees no CUDA device (unless
# TRITON_INTERPRET is set already)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency; the plain-torch paths still work
    triton = None
    tl = None


def jitted(table: dict, name: str, kernels, missing: str):
    """Kernel ``name`` from ``table``, which the first call fills with every kernel of ``kernels()``
    (name -> (plain function, triton.jit options)) wrapped by triton.jit, so TRITON_INTERPRET is
    honoured then, and with ``interpreted``. ``missing``: the error without Triton."""
    if triton is None:
        raise RuntimeError(missing)
    if not table:
        table["interpreted"] = interpreting()
        for key, (fn, options) in kernels().items():
            table[key] = triton.jit(fn, **options)
    return table[name]


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET, as Triton reads it)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
