"""The fp32_memory study's parameter declaration and vocabulary (torch-free: the command line
reads it without importing torch)."""
from __future__ import annotations

from ...checkpoints import resolve_config
from ...config import VisionConfig



from ...config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY
from ...vocabulary import NORM_NAMES as NORMS
from ..footprint import Footprint, largest, largest_budget
from ..params import Param, ParamSpec, ascending_unique

BUFFERS = ("uint8", "bfloat16")   # the graph buffers a tower norm reads


PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=TINY_PRESET_PER_FAMILY, gpu=REAL_PRESET_PER_FAMILY,
          choices=PRESET_NAMES, model_folders=True, help="tower for the tower-scope cells (CUDA only)"),
    Param("depth", "int", cap="depth", cpu=2, minimum=1, help="blocks of the captured tower"),
    Param("norms", "list[str]", cpu=list(NORMS), choices=NORMS, help="norm implementations"),
    Param("budgets", "list[int]", cap="budget_tokens", cpu=[1024, 4096, 16384], minimum=1, rule=ascending_unique,
          help="graph budgets in merged tokens (4 pixel rows each; modelled on meta, any size)"),
    Param("buffer_dtypes", "list[str]", cpu=list(BUFFERS), choices=tuple(BUFFERS), help="graph buffer dtypes"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
    renamed={"preset": "presets"},
)


METRICS = {"model_bytes": "bytes", "model_peak_bytes": "bytes", "temp_bytes": "bytes",
           "counted_peak_bytes": "bytes", "trace_matches": "bool", "pool_bytes": "bytes", "peak_bytes": "bytes",
           "model_error": "fraction"}


def footprint(p, device: str) -> Footprint:
    """The norm scope is modelled on the meta device (no memory); on CUDA the tower scope captures
    the tower over the largest budget, with the eager norm's fp32 temporaries."""
    if device != "cuda":
        return Footprint(0, "norm scope on the meta device")
    return largest(largest_budget(captured_config(p, preset), p, 1 + 4 + 8 + 2, device, preset)
                   for preset in p["presets"])


def captured_config(p: dict, preset: str | None = None) -> VisionConfig:
    """The config of the captured tower: ``preset`` (None: p["preset"]) at p["depth"] blocks.
    Unlike the other studies (`resolve_config(name, depth)`), depth is required here and the
    preset's own depth keeps the preset itself, not a renamed '@depthN' copy (same blocks either
    way; only the name differs)."""
    preset = preset or p["preset"]
    base = resolve_config(preset)
    return base if p["depth"] == base.depth else resolve_config(preset, p["depth"])
