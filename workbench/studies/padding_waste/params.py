"""The padding_waste study's parameter declaration and vocabulary (torch-free: the command line
reads it without importing torch)."""
from __future__ import annotations

import math


from ...config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY
from ...checkpoints import resolve_config
from ...vocabulary import REAL_NORMS
from ...samples import (MIX_NAMES, check_image_folder, mix_distribution, with_folder)
from ..footprint import Footprint, itemsize, largest, tower_bytes
from ..params import Param, ParamSpec

# "vllm-0.34": that release's default grid (capped), replayed with its packing: the whole batch once or eagerly
BUDGET_SETS = ("pow2", "vllm-0.34", "geometric", "planner", "planner_time")


NORM_FILLS = (0.0, 0.5, 1.0)       # valid fractions at which the norm is timed per budget


def _positive_unique(values) -> None:
    if len(set(values)) != len(values):
        raise ValueError("must not repeat")


PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=TINY_PRESET_PER_FAMILY, gpu=REAL_PRESET_PER_FAMILY,
          choices=PRESET_NAMES, model_folders=True, help="tower the runner replays"),
    Param("depth", "int", cap="depth", cpu=None, optional=True, minimum=1, help="blocks of that tower (None: the preset's depth)"),
    Param("dtype", "str", cpu="float32", gpu="bfloat16", choices=("bfloat16", "float32"), help="tower dtype"),
    Param("mixes", "list[str]", cpu=["photos"], gpu=list(MIX_NAMES), choices=MIX_NAMES,
          help="image mixes (data/image_mixes.toml and the shipped photos)"),
    Param("image_folder", "str", cpu=None, optional=True, rule=check_image_folder,
          help="absolute path of a folder of your own images: one more mix of their sizes (None: none)"),
    Param("budget_sets", "list[str]", cpu=list(BUDGET_SETS), choices=BUDGET_SETS, help="budget sets compared"),
    Param("max_items", "list[int]", cap="items", cpu=[1, 4], gpu=[1, 16], minimum=1, rule=_positive_unique,
          help="sequences (images or frames) per replay (1: single items; more: packed batches)"),
    Param("n_items", "int", cap="items", cpu=5, gpu=16, minimum=1, help="items drawn from each mix for the runner"),
    Param("norm", "str", cpu="eager", gpu="triton_rows", choices=REAL_NORMS,
          help="norm whose time on padding is measured (tower placement)"),
    Param("reps", "int", cap="reps", cpu=2, gpu=5, minimum=1, help="timed repetitions per measurement"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
    renamed={"preset": "presets"},
)


METRICS = {
    # exact, from the mix's distribution (single items)
    "padded_frac_expected": "fraction", "padded_tokens_expected": "tokens", "miss_frac_expected": "fraction",
    "expected_replay_ms": "ms", "graphs": "count", "largest_budget": "tokens", "pool_model_bytes": "bytes",
    # out of sample (`budget_judge`): fitted on one traffic draw, judged on others and on the other mixes
    "padded_frac_judged": "fraction", "eager_frac_judged": "fraction", "rows_ratio": "x",
    # through the real runner on drawn items
    "padded_frac": "fraction", "padded_frac_replay_mean": "fraction", "padded_frac_replay_max": "fraction",
    "replays_per_image": "count", "misses": "count", "items": "count", "encode_ms_per_image": "ms",
    "norm_us_all": "us", "norm_us_valid": "us", "norm_us_padding": "us",
    "matmul_flops_padding": "FLOP", "attention_flops_padding": "FLOP", "flops_padding_frac": "fraction",
    "pool_bytes": "bytes", "pool_used_bytes": "bytes", "rel_err_vs_eager": "ratio",
    # per budget
    "replay_ms": "ms", "replay_p90_ms": "ms",
    "edge_replay_ms": "ms", "prev_full_replay_ms": "ms", "eager_ms": "ms",
    # per size of a mix: its share of the items; a folder's: its number of images
    "share": "fraction", "images": "count",
}


def footprint(p, device: str) -> Footprint:
    """The largest of the presets' cells (`preset_footprint`)."""
    return largest(preset_footprint(p, preset, device) for preset in p["presets"])


def preset_footprint(p, preset: str, device: str) -> Footprint:
    """The largest budget of the replay ladder (a power of two at or above the mixes' largest item)
    through the tower, and a batch of n_items of the largest items."""
    cfg = resolve_config(preset, p["depth"])
    largest = max(max(t for t, _ in mix_distribution(m, cfg)) for m in with_folder(p["mixes"], p["image_folder"]))
    budget = 1 << math.ceil(math.log2(max(largest, 1)))
    rows = max(budget, largest * p["n_items"]) * cfg.merge_unit
    return Footprint(tower_bytes(cfg, rows, largest * cfg.merge_unit, itemsize(p), device),
                     f"{preset}, budget {budget} tokens, {p['n_items']} items")
