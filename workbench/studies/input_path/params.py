"""The input_path study's parameter declaration and vocabulary (torch-free: the command line
reads it without importing torch)."""
from __future__ import annotations

from ... import limits
from ...checkpoints import resolve_config
from ...config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY
from ...samples import MIX_NAMES, check_image_folder, mix_distribution, with_folder
from ...vocabulary import PLACEMENTS, REAL_NORMS
from ..footprint import Footprint, itemsize, largest, tower_bytes
from ..params import Param, ParamSpec, ascending_unique

# the placements whose whole input path the study follows (outer and none give wrong embeddings
# under graphs or everywhere: the correctness study's subject, not a design to time)
INPUT_PLACEMENTS = tuple(p for p in ("processor", "fold", "device", "tower", "runner") if p in PLACEMENTS)
HOST_BACKENDS = ("pil", "torchvision")
ENCODE_PATHS = ("eager", "cudagraph")

# what crosses the host-to-device link for one image
PAYLOADS = ("fp32_rows", "bf16_rows", "uint8_rows", "uint8_frame", "resized_image", "decoded_image")
# the payload each placement ships: the processor's float32 rows, uint8 rows, or the decoded image
PLACEMENT_PAYLOAD = {"processor": "fp32_rows", "fold": "uint8_rows", "device": "decoded_image",
                     "tower": "uint8_rows", "runner": "uint8_rows", "outer": "uint8_rows", "none": "uint8_rows"}
# payloads a placement cannot take, and why (the bad-input door of `check_payload`)
_REFUSED = {"fold": {"fp32_rows": "normalized floats into a fold tower would be normalized twice",
                     "bf16_rows": "normalized floats into a fold tower would be normalized twice"},
            "processor": {p: "the processor placement ships the CPU-normalized float32 rows"
                          for p in PAYLOADS if p != "fp32_rows"}}

def check_payload(placement: str, payload: str) -> str:
    """``payload`` if placement ``placement`` can take it, else ValueError naming both and the
    payloads it takes."""
    if payload not in PAYLOADS:
        raise ValueError(f"unknown payload {payload!r}; valid: {', '.join(PAYLOADS)}")
    why = _REFUSED.get(placement, {}).get(payload)
    if why:
        ok = [p for p in PAYLOADS if p not in _REFUSED.get(placement, {})]
        raise ValueError(f"placement {placement!r} cannot take payload {payload!r} ({why}); valid: {', '.join(ok)}")
    return payload


def _rates(values) -> None:
    for v in values:
        if not 0 < v < 1.5:
            raise ValueError(f"load {v!r} is not a fraction of the highest sustainable rate in (0, 1.5)")
    ascending_unique(values)


def check_cores(threads) -> None:
    """Refuse thread counts above the cores of the machine that runs the study: a value given (``--set``) where it
    is given (the declaration's ``host_rule``), the profile's defaults when the run starts (a sweep resolves a GPU
    host's defaults on any machine, for its predictions)."""
    limits.within_cores(max(threads), "threads")


PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=TINY_PRESET_PER_FAMILY, gpu=REAL_PRESET_PER_FAMILY,
          choices=PRESET_NAMES, model_folders=True, help="towers at the end of the path (each its own cells)"),
    Param("depth", "int", cap="depth", cpu=None, optional=True, minimum=1,
          help="blocks of that tower (None: the preset's depth)"),
    Param("dtype", "str", cpu="float32", gpu="bfloat16", choices=("bfloat16", "float32"),
          help="tower dtype (bf16 as served; the CPU profile runs fp32, much faster there)"),
    Param("mixes", "list[str]", cpu=["thumbnails"], gpu=["photos", "screenshots"],
          gpu_full=["photos", "phone_photos", "screenshots"], choices=MIX_NAMES,
          help="image mixes whose images travel the path (full size, as a request brings them)"),
    Param("image_folder", "str", cpu=None, optional=True, rule=check_image_folder,
          help="absolute path of a folder of your own images: one more mix (None: none)"),
    Param("n_items", "int", cap="items", cpu=2, gpu=4, gpu_full=8, minimum=1, help="images drawn from each mix"),
    Param("max_side", "int", cap="budget_tokens", cpu=256, gpu=None, optional=True, minimum=16,
          help="each drawn image scaled down to this long side in pixels (None: as drawn; the CPU profile's smoke test)"),
    Param("placements", "list[str]", cpu=list(INPUT_PLACEMENTS), choices=INPUT_PLACEMENTS,
          help="where the normalization lives"),
    Param("backends", "list[str]", cpu=list(HOST_BACKENDS), choices=HOST_BACKENDS,
          help="host preprocessing backends timed (the device placement's host part is its decode)"),
    Param("threads", "list[int]", cap="threads", cpu=[1, 2], gpu=[1, 4, 8], minimum=1, rule=ascending_unique,
          host_rule=check_cores, help="host threads per preprocessing call (at most the cores this process may use)"),
    Param("norm", "str", cpu="eager", gpu="triton_rows", choices=REAL_NORMS,
          help="the device norm of the placements that normalize on the device"),
    Param("paths", "list[str]", cpu=["eager", "cudagraph"], choices=ENCODE_PATHS,
          help="how the tower runs (cudagraph: the planner's budgets for the mix, policy auto)"),
    Param("workers", "list[int]", cap="workers", cpu=[1, 2], gpu=[1, 4, 16], minimum=1, rule=ascending_unique,
          help="host processor workers of the serving model (one thread each)"),
    Param("loads", "list[float]", cpu=[0.25, 0.5, 0.75, 0.9], gpu=[0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95],
          rule=_rates, help="arrival rates of the serving model as fractions of its highest sustainable rate"),
    Param("sim_requests", "int", cap="sim_requests", cpu=20000, gpu=100000, minimum=100,
          help="requests the serving model simulates per rate"),
    Param("reps", "int", cap="reps", cpu=2, gpu=20, minimum=1,
          help="most timed repetitions per measurement (the encoder's: until its median is known within 2%)"),
    Param("min_reps", "int", cap="reps", cpu=2, gpu=6, minimum=1,
          help="fewest timed repetitions of an encoder call, at most reps (6 and more give a 95% interval of the median)"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
)


METRICS = {"host_ms": "ms", "h2d_bytes": "bytes", "h2d_ms": "ms", "device_ms": "ms", "encoder_ms": "ms",
           "total_ms": "ms", "p50_ms": "ms", "p99_ms": "ms", "max_images_per_s": "images/s",
           "utilization_gpu": "fraction", "utilization_host": "fraction", "utilization_link": "fraction",
           "stable": "bool", "batch_ms": "ms", "tokens_per_image": "tokens", "timed_reps": "count",
           "ci_rel": "fraction"}


def footprint(p, device: str) -> Footprint:
    """The largest mix item through the tower as one sequence, max items at once."""
    def one(preset):
        cfg = resolve_config(preset, p["depth"])
        tokens = max(max(t for t, _ in mix_distribution(m, cfg)) for m in with_folder(p["mixes"], p["image_folder"]))
        rows = tokens * cfg.merge_unit
        return Footprint(tower_bytes(cfg, rows * p["n_items"], rows, itemsize(p), device),
                         f"{preset}, {p['n_items']} items of up to {tokens} tokens")
    return largest(one(preset) for preset in p["presets"])
