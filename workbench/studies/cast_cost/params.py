"""The cast_cost study's parameter declaration and vocabulary (torch-free: the command line
reads it without importing torch)."""
from __future__ import annotations



from ...config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY
from ...checkpoints import resolve_config
from ...vocabulary import REAL_NORMS
from ..footprint import Footprint, largest, largest_budget
from ..params import Param, ParamSpec, ascending_unique, fractions

DESIGNS = ("bf16_buffer", "uint8_buffer", "uint8_valid", "runner", "fp32_buffer", "fold", "device")


LEGACY_NORM = "(cpu)"       # fp32_buffer: normalized on the CPU; its norm column is the tower's cast
FOLD_NORM = "(none)"        # fold: no norm anywhere; its norm column is the tower's uint8 cast
# the designs without a norm implementation (one cell each) and what their norm column holds
NO_NORM = {"fp32_buffer": LEGACY_NORM, "fold": FOLD_NORM}


PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=TINY_PRESET_PER_FAMILY, gpu=REAL_PRESET_PER_FAMILY,
          choices=PRESET_NAMES, model_folders=True,
          help="towers whose replay the staging is compared with (each its own cells)"),
    Param("depth", "int", cap="depth", cpu=None, optional=True, minimum=1,
          help="blocks of that tower (None: the preset's depth)"),
    Param("dtype", "str", cpu="bfloat16", choices=("bfloat16",), help="tower dtype (bf16, as served)"),
    Param("budgets", "list[int]", cap="budget_tokens", cpu=[16, 64], gpu=[256, 1024, 4096, 16384], minimum=1, rule=ascending_unique,
          help="graph budgets in merged tokens (4 pixel rows each)"),
    Param("fills", "list[float]", cpu=[0.25, 0.5, 0.75, 1.0], rule=fractions,
          help="valid rows / budget rows"),
    Param("designs", "list[str]", cpu=list(DESIGNS), choices=DESIGNS, help="staging designs"),
    Param("norms", "list[str]", cpu=["eager"], gpu=list(REAL_NORMS), choices=REAL_NORMS,
          help="norm implementations"),
    Param("reps", "int", cap="reps", cpu=5, gpu=30, minimum=1,
          help="most timed repetitions per measurement (until its median is known within 2%, from min_reps)"),
    Param("min_reps", "int", cap="reps", cpu=5, gpu=10, minimum=1,
          help="fewest timed repetitions per staging measurement, at most reps"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
    renamed={"preset": "presets"},
)


METRICS = {
    "copy_us": "us", "copy_p90_us": "us", "norm_us": "us", "norm_p90_us": "us",
    "staging_us": "us", "staging_p90_us": "us", "staging_reps_n": "count", "staging_ci_lo_us": "us",
    "staging_ci_hi_us": "us",
    "bytes": "bytes", "min_bytes": "bytes", "h2d_bytes": "bytes", "floor_us": "us", "ratio_to_floor": "x",
    "replay_us": "us", "share_of_replay": "fraction", "max_err_ulp": "ulp",
    "copy_gbs": "GB/s", "launch_us": "us", "matmul_tflops": "TFLOP/s", "replay_floor_us": "us",
}


def footprint(p, device: str) -> Footprint:
    """The largest budget: its source rows, their float64 reference, the eager norm's fp32
    temporaries, a bf16 buffer and output; and the tower replayed over the full budget."""
    return largest(largest_budget(resolve_config(preset, p["depth"]), p, 1 + 8 + 8 + 2 + 2, device, preset)
                   for preset in p["presets"])
