"""The correctness study's parameter declaration and vocabulary (torch-free: the command line
reads it without importing torch)."""
from __future__ import annotations

from ...config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY
from ...checkpoints import resolve_config
from ...vocabulary import BUFFER_DTYPES as BUFFER_NAMES, NORM_NAMES as NORMS, PATHS, STUDY_PLACEMENTS
from ...samples import SAMPLE_NAMES
from ..footprint import Footprint, itemsize, largest, tower_bytes
from ..params import Param, ParamSpec, ascending_unique

PATH_COLUMNS = ["eager", "cudagraph[bfloat16]", "cudagraph[uint8]", "cudagraph[float32]", "dp"]


PARAMS = ParamSpec(
    Param("families", "list[str]", cpu=TINY_PRESET_PER_FAMILY, gpu=REAL_PRESET_PER_FAMILY,
          choices=PRESET_NAMES, model_folders=True, help="presets (one tower each)"),
    Param("depth", "int", cap="depth", cpu=None, gpu=4, optional=True, minimum=1,
          help="blocks per tower, real width kept (None: the preset's depth)"),
    Param("dtype", "str", cpu="float32", gpu="bfloat16", choices=("float32", "bfloat16", "float16"),
          help="tower dtype"),
    Param("placements", "list[str]", cpu=list(STUDY_PLACEMENTS), choices=STUDY_PLACEMENTS,
          help="where normalization lives"),
    Param("norms", "list[str]", cpu=list(NORMS), choices=NORMS, help="norm implementations"),
    Param("paths", "list[str]", cpu=list(PATHS), choices=PATHS, help="execution paths"),
    Param("buffer_dtypes", "list[str]", cpu=list(BUFFER_NAMES), choices=BUFFER_NAMES,
          help="graph input buffer dtypes (cudagraph path)"),
    Param("max_pixels", "int", cap="frame_pixels", cpu=112 * 112, gpu=448 * 448, minimum=56 * 56, help="processor cap on image size"),
    Param("budgets", "list[int]", cap="budget_tokens", cpu=[16, 64], gpu=[64, 128, 256, 512, 1024], minimum=1,
          rule=ascending_unique, help="graph budgets in merged tokens"),
    Param("max_items", "int", cap="items", cpu=8, minimum=1, help="most sequences one replay holds"),
    Param("dp_world_size", "int", cap="world_size", cpu=2, minimum=1, help="ranks of the dp path"),
    Param("hazard", "bool", cpu=True, help="also poison pool and padding with NaN"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
    check=lambda p: _check_budgets_cover(p),
)


METRICS = {"rel_err": "relative", "cos_min": "cosine", "ok": "bool", "replays": "count", "misses": "count",
           "padded_rows": "rows", "rows_changed": "rows", "ranks_agree": "bool", "rel_err_ref": "relative",
           "bit_equal": "bool"}


def _check_budgets_cover(p: dict) -> None:
    small = [b for b in p["budgets"] if b < p["max_items"]]
    if small:
        raise ValueError(f"budgets {small} are smaller than max_items={p['max_items']}: a budget must hold one "
                         f"merged token per item; raise them or lower max_items")


def footprint(p, device: str) -> Footprint:
    """Every family's tower over the study's items (the photos and the video, each capped at
    max_pixels), twice for the float64 reference, and once per dp rank on a CPU."""
    items = len(SAMPLE_NAMES) + 1                        # the photos and a short video
    ranks = p["dp_world_size"] if device == "cpu" and "dp" in p["paths"] else 1

    def cell(name: str) -> Footprint:
        cfg = resolve_config(name, p["depth"])
        per_item = p["max_pixels"] // cfg.patch_size ** 2 * 2    # patch rows of one capped item, two frame pairs
        rows = max(per_item * items, max(p["budgets"]) * cfg.merge_unit)
        one = tower_bytes(cfg, rows, per_item, itemsize(p), device) + tower_bytes(cfg, rows, per_item, 8, device)
        return Footprint(one * ranks, f"{name}, {items} items of up to {p['max_pixels']:,} pixels")
    return largest(cell(name) for name in p["families"])
