"""Vision-encoder input-normalization workbench (Qwen2-VL / Qwen2.5-VL).

The public names below are imported on first use (``wb.build_encoder`` loads torch then), so
``python -m workbench --help`` and the light modules (provenance, report) start instantly. On a
machine without CUDA, Triton kernels can only run in Triton's interpreter: the modules that hold
kernels (workbench.norms, workbench.fused, workbench.ceilings) set TRITON_INTERPRET=1 there before importing Triton,
unless the variable is already set.
"""
from __future__ import annotations

import importlib
import sys
import types

# public name -> the submodule that defines it
_EXPORTS = {
    "VisionConfig": "config", "PRESET_NAMES": "config",
    "load_vision_weights": "checkpoints", "resolve_config": "checkpoints",
    "DTYPES": "encoder", "PATHS": "vocabulary", "PLACEMENTS": "vocabulary", "STUDY_PLACEMENTS": "vocabulary",
    "PREPROCESS_BACKENDS": "vocabulary",
    "VisionEncoder": "encoder", "build_encoder": "encoder",
    "NORMS": "norms", "make_norm": "norms",
    "PatchBatch": "preprocess", "Video": "preprocess", "preprocess": "preprocess", "load_image": "preprocess",
    "EncoderGraphRunner": "runner", "ENGINES": "engines",
    "image_mix": "samples", "random_images": "samples", "sample_images": "samples", "sample_video": "samples",
    "mix_distribution": "samples", "mix_tokens": "samples", "mix_sizes": "samples",
    "plan_budgets": "planner", "expected_padding": "planner", "geometric_budgets": "planner",
}

from . import limits  # noqa: E402  (light: the caps on every size, `wb.limits.raised(...)`)

__all__ = [*_EXPORTS, "limits"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    if module in ("encoder", "runner"):
        _wire_default_runner()
    globals()[name] = value          # later lookups skip this function
    return value


def _wire_default_runner() -> None:
    """Give the encoder the builder of its default graph runner (`enc.encode(batch,
    path="cudagraph")` without runner=). The runner sits above the encoder, which therefore never
    imports it; the package sees both, so the wiring lives here."""
    from .encoder import VisionEncoder
    from .runner_defaults import default_runner

    VisionEncoder.default_runner_factory = staticmethod(default_runner)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """`wb.preprocess` is the function, although a submodule of the same name exists: importing
    a submodule sets it as an attribute of the package, which would shadow the function (an
    eager ``from .preprocess import preprocess`` used to overwrite it back). The class-level
    property wins over that attribute; its setter takes the import system's assignment."""

    @property
    def preprocess(self):
        from .preprocess import preprocess
        return preprocess

    @preprocess.setter
    def preprocess(self, module) -> None:
        pass


sys.modules[__name__].__class__ = _Package


def cpu_share(processes: int) -> int:
    """CPU threads each of ``processes`` side-by-side processes gets: this process's usable cores
    (its affinity mask where the OS has one) split evenly, at least one. Left alone, torch in every
    process starts one thread per core and they oversubscribe the host."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, processes))
