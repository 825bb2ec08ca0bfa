"""The contention study's parameter declaration and vocabulary (torch-free: the command line reads it
without importing torch)."""
from __future__ import annotations

from ... import limits
from ...checkpoints import resolve_config
from ...config import PRESET_NAMES, REAL_PRESET_PER_FAMILY
from ...contention_model import PLACEMENTS
from ...interference import BESIDE, check_duty
from ...samples import MIX_NAMES, mix_distribution
from ..footprint import Footprint, itemsize, largest, tower_bytes
from ..params import Param, ParamSpec, ascending_unique

# the mixes whose items are still images (a video clip arrives as a video stream, not as image files)
IMAGE_MIXES = tuple(m for m in MIX_NAMES if m != "video_clips")
# how a request of each mix arrives: photos as JPEG (what cameras and phones write), screens and pages as PNG
PNG_MIXES = ("screenshots", "documents", "charts")
ENCODE_PATHS = ("eager", "cudagraph")
DECODERS = ("host", "nvjpeg")
# the gpu profile's tower: the decision set keeps to one (the newest Qwen tower, engines' most served family) so
# that the default profile stays short; gpu-full measures every family
DECISION_PRESETS = ("qwen3-vl-8b",)
SLO_FACTOR = 4.0       # slo_ms=None: this many times the encoder's batch time alone (its slowest call)


def mix_format(mix: str) -> str:
    """The file format a request of ``mix`` arrives in."""
    return "png" if mix in PNG_MIXES else "jpeg"


def _duty_cycles(values) -> None:
    for v in values:
        check_duty(v)
    ascending_unique(values)


def _qualities(values) -> None:
    bad = [v for v in values if not 1 <= v <= 100]
    if bad:
        raise ValueError(f"JPEG quality {bad[0]!r} is outside 1..100; valid: integers 1..100 (cameras write 85..95)")
    ascending_unique(values)


def _loads(values) -> None:
    for v in values:
        if not 0 < v <= 4:
            raise ValueError(f"arrival rate {v!r} is not positive (or above 4); valid: 0 < rate <= 4, in multiples "
                             "of the encoder's own highest rate alone")
    ascending_unique(values)


def _slo(value) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"slo_ms {value!r} is not a positive time; valid: a number of ms > 0, or None")


PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=["tiny-qwen2.5-vl"], gpu=list(DECISION_PRESETS),
          gpu_full=REAL_PRESET_PER_FAMILY, choices=PRESET_NAMES, model_folders=True,
          help="towers whose encoder shares the device with the preprocessor (each its own cells; gpu: one "
               "tower, gpu-full: every family)"),
    Param("depth", "int", cap="depth", cpu=2, gpu=None, optional=True, minimum=1,
          help="blocks of that tower (None: the preset's depth)"),
    Param("dtype", "str", cpu="float32", gpu="bfloat16", choices=("bfloat16", "float32"),
          help="tower dtype (bf16 as served; the CPU profile runs fp32)"),
    Param("mixes", "list[str]", cpu=["photos", "screenshots"], gpu=["photos", "screenshots"],
          gpu_full=["photos", "phone_photos", "screenshots", "documents"], choices=IMAGE_MIXES,
          help="image mixes the requests come from (JPEG photos, PNG screenshots, documents and charts)"),
    Param("n_items", "int", cap="items", cpu=2, gpu=4, gpu_full=8, minimum=1,
          help="images drawn from each mix: one encoder batch and one preprocessor call"),
    Param("max_side", "int", cap="budget_tokens", cpu=192, gpu=None, optional=True, minimum=16,
          help="each drawn image scaled down to this long side before encoding (None: as drawn)"),
    Param("jpeg_qualities", "list[int]", cpu=[85, 95], minimum=1, rule=_qualities,
          help="JPEG qualities of the photo mixes (the first one feeds the interference cells)"),
    Param("threads", "list[int]", cap="threads", cpu=[1, 2], gpu=[1, 4, 8], minimum=1, rule=ascending_unique,
          help="host decode threads, and host workers of the CPU placements (at most the cores here)"),
    Param("norm", "str", cpu="eager", gpu="triton_rows", choices=("eager", "triton_channel", "triton_flat",
                                                                  "triton_rows"),
          help="the encoder's device norm (the tower normalizes its uint8 rows)"),
    Param("paths", "list[str]", cpu=["eager"], gpu=["eager", "cudagraph"], choices=ENCODE_PATHS,
          help="how the encoder runs (cudagraph: the planner's budgets for the mix, policy auto)"),
    Param("duty_cycles", "list[float]", cpu=[0.5, 1.0], gpu=[0.5, 1.0], gpu_full=[0.25, 0.5, 0.75, 1.0],
          rule=_duty_cycles, help="fractions of time the preprocessor beside the encoder is busy, each in (0, 1]"),
    Param("beside", "list[str]", cpu=list(BESIDE), choices=BESIDE,
          help="where the preprocessor runs: a thread and CUDA stream of the encoder's process, or another process"),
    Param("placements", "list[str]", cpu=list(PLACEMENTS), choices=PLACEMENTS,
          help="the serving placements composed (epd_second_gpu is modelled)"),
    Param("loads", "list[float]", cpu=[0.25, 0.5, 0.75, 1.0, 1.25], gpu=[0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5],
          rule=_loads, help="arrival rates, in multiples of the encoder's highest rate alone (batches of n_items)"),
    Param("slo_ms", "float", cpu=None, optional=True, rule=_slo,
          help="the p99 time-to-embedding target in ms (None: 4 times the encoder's batch time alone)"),
    Param("sim_requests", "int", cap="sim_requests", cpu=2000, gpu=10000, gpu_full=50000, minimum=100,
          help="requests the serving model simulates per rate"),
    Param("reps", "int", cap="reps", cpu=3, gpu=20, minimum=1,
          help="timed calls of each side alone, and fewest of the encoder beside the preprocessor"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
)


def check_cores(threads) -> None:
    """Refuse thread counts above the cores of the machine that runs the study (checked when the run
    starts, there)."""
    limits.within_cores(max(threads), "threads")


# the metric names other readers rely on (binding): every table of the study has each of them
BINDING_METRICS = ("decode_ms", "encoder_ms_alone", "encoder_ms_contended", "preprocess_ms_alone",
                   "preprocess_ms_contended", "images_per_s_at_slo")
METRICS = {"decode_ms": "ms", "encoded_bytes": "bytes", "decoded_bytes": "bytes", "available": "bool",
           "source_max_abs_diff": "levels", "source_mean_abs_diff": "levels", "max_abs_diff": "levels",
           "mean_abs_diff": "levels", "link_ms": "ms",
           "encoder_ms_alone": "ms", "encoder_ms_contended": "ms", "preprocess_ms_alone": "ms",
           "preprocess_ms_contended": "ms", "encoder_slowdown": "x", "preprocess_slowdown": "x",
           "duty_measured": "fraction", "gpu_util": "fraction", "gpu_mem_bytes": "bytes",
           "host_ms": "ms", "slo_ms": "ms", "p99_ms": "ms", "stable": "bool", "images_per_s_at_slo": "images/s",
           "max_images_per_s_at_slo": "images/s", "wins_from_rate": "images/s", "wins_to_rate": "images/s",
           "crossing_rate": "images/s", "host_cores": "cores", "gpu_share": "fraction"}


def footprint(p, device: str) -> Footprint:
    """The largest mix item through the tower as one sequence, n_items at once."""
    def one(preset):
        cfg = resolve_config(preset, p["depth"])
        tokens = max(max(t for t, _ in mix_distribution(m, cfg)) for m in p["mixes"])
        rows = tokens * cfg.merge_unit
        return Footprint(tower_bytes(cfg, rows * p["n_items"], rows, itemsize(p), device),
                         f"{preset}, {p['n_items']} items of up to {tokens} tokens")
    return largest(one(preset) for preset in p["presets"])
