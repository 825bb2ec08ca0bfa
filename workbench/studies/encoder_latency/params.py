"""The encoder_latency study's parameter declaration and vocabulary (torch-free: the command line
reads it without importing torch)."""
from __future__ import annotations



import dataclasses

from ...engines import ENGINES, NEWEST, SMALLEST_BUDGET, with_cap
from ...config import ANSWER_PRESETS, PRESET_NAMES, PRESETS, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY
from ...checkpoints import resolve_config
from ...vocabulary import REAL_NORMS
from ...vocabulary import GEMM_CHOICES, PHASES
from ...samples import MIX_NAMES, check_image_folder, with_folder
from ..footprint import Footprint, itemsize, largest, tower_bytes
from ..params import Param, ParamSpec, ascending_unique

# the families the defaults time: those with a studies preset (`Family.study_presets`); a family with none
# (Gemma-3, until its placements are in the correctness matrix) is timed only when named (--set presets=...)
STUDIED = frozenset(PRESETS[n].family for n in TINY_PRESET_PER_FAMILY + REAL_PRESET_PER_FAMILY)
REAL_PRESETS = tuple(n for n in PRESET_NAMES if not n.startswith("tiny-") and PRESETS[n].family in STUDIED)
# what a merger-only difference changes: presets that differ in nothing else run the same blocks
MERGER_FIELDS = ("name", "out_hidden", "merger_hidden", "checkpoint")


def tower_key(name: str) -> tuple:
    """A preset's tower less its merger's widths: equal for qwen2.5-vl-3b / 7b / 72b, qwen3-vl-8b / 30b-a3b /
    235b-a22b, glm-4.1v-9b / glm-4.5v."""
    cfg = PRESETS[name]
    return tuple(getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in MERGER_FIELDS)


def distinct_towers() -> tuple[str, ...]:
    """One real preset per distinct tower (`tower_key`), the studies' preset of its family where it is one of
    them, in preset order: what the GPU profile times (the others: ``--set presets=...``)."""
    chosen: dict[tuple, str] = {}
    for name in REAL_PRESETS:
        key = tower_key(name)
        if key not in chosen or name in REAL_PRESET_PER_FAMILY:
            chosen[key] = name
    return tuple(n for n in REAL_PRESETS if n in chosen.values())


TINY_PRESETS = tuple(n for n in PRESET_NAMES if n.startswith("tiny-") and PRESETS[n].family in STUDIED)


LATENCY_PATHS = ("eager", "graph", "transformers")


def _divisible(p: dict) -> None:
    bad = [(t, i) for t in p["tokens"] for i in p["images"] if t % i]
    if bad:
        raise ValueError(f"every tokens value must split evenly over every images value (each image holds "
                         f"tokens / images merged tokens); not divisible: {bad}")
    with_cap(p["engine"], p["engine_cap"])     # a cap the release has no option for, or below its smallest budget


# The GPU profile times every distinct real tower (10 of the 17 real presets: the others differ from one
# of them in their merger's widths only) at four token counts, each path 1 (check) + warmup + reps
# calls, and the realistic batches: minutes per tower on one GPU (each reference run's meta.json
# records its study_seconds); the table's build_s, capture_s and cell_s say where they went.
PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=list(TINY_PRESETS),
          gpu=[n for n in ANSWER_PRESETS if PRESETS[n].family in STUDIED],
          gpu_full=list(distinct_towers()), choices=PRESET_NAMES, model_folders=True,
          help="towers to time (gpu default: the answer table's preset of each family; gpu-full: one preset per "
               "distinct tower; presets that differ only in the merger's widths time alike but for the merger)"),
    Param("depth", "int", cap="depth", cpu=None, optional=True, minimum=1, help="blocks per tower (None: the preset's depth)"),
    Param("tokens", "list[int]", cap="budget_tokens", cpu=[64, 256], gpu=[256, 4096], gpu_full=[64, 256, 1024, 4096],
          minimum=1, rule=ascending_unique,
          help="merged tokens per call (4 pixel rows each); the graph budget is exactly this"),
    Param("images", "list[int]", cap="items", cpu=[1, 4], gpu=[1], gpu_full=[1, 4], minimum=1, rule=ascending_unique,
          help="images per call, tokens / images merged tokens each"),
    Param("dtype", "str", cpu="float32", gpu="bfloat16", choices=("float32", "bfloat16"), help="tower dtype"),
    Param("norm", "str", cpu="eager", gpu="triton_rows", choices=REAL_NORMS,
          help="the tower's input norm (placement tower)"),
    Param("fused", "str", cpu="auto", choices=("auto", "off"),
          help="the towers' fused Triton block kernels: auto (on CUDA for bf16/fp16) or off (plain torch ops)"),
    Param("gemm", "str", cpu="cublas", gpu="auto", choices=GEMM_CHOICES,
          help="the SwiGLU MLPs' gate/up kernel: cublas, quack (quack-kernels' gated GEMM, Hopper, with fused "
               "kernels; towers without SwiGLU MLPs refuse it) or auto (quack where it runs, else cublas; the GPU "
               "profile's default, on the measurements README.md's quack paragraph cites)"),
    Param("breakdown", "bool", cpu=False, gpu=False, gpu_full=True, help="profile one tower forward per cell: device time by kernel category"),
    Param("reference", "bool", cpu=True, help="also time transformers' vision model with the same weights"),
    Param("reps", "int", cap="reps", cpu=5, gpu=10, minimum=1,
          help="most timed calls per path and cell (until the median is known within 2%, from min_reps)"),
    Param("min_reps", "int", cap="reps", cpu=5, gpu=6, minimum=1,
          help="fewest timed calls per path and cell, at most reps (6 and more give a 95% interval of the median)"),
    Param("warmup", "int", cap="reps", cpu=1, gpu=1, gpu_full=2, minimum=0,
          help="untimed calls before them (after the check call)"),
    Param("mixes", "list[str]", cpu=["photos"], gpu=["screenshots", "documents", "phone_photos", "charts", "video_clips"],
          choices=MIX_NAMES, empty_ok=True, help="image mixes for the realistic-batch cells ([] for none)"),
    Param("image_folder", "str", cpu=None, optional=True, rule=check_image_folder,
          help="absolute path of a folder of your own images: one more mix for those cells (None: none)"),
    Param("mix_items", "list[int]", cap="items", cpu=[2], gpu=[4], gpu_full=[1, 4], minimum=1, rule=ascending_unique,
          help="items per realistic batch, drawn from each mix"),
    Param("fresh", "int", cap="reps", cpu=1, gpu=2, gpu_full=6, minimum=0,
          help="batches of shapes no call has seen, per mix and item count, each strategy timed once on each "
               "(what a server meets; the verdict reads the median batch; 0 for none)"),
    Param("engine_max_budget", "int", cap="budget_tokens", cpu=512, gpu=16384, minimum=64,
          help="the model's largest budget under the engine's rule, before the release's own cap "
               "(vLLM: the scheduler's token budget; realistic-batch cells)"),
    Param("engine", "str", cpu=NEWEST, choices=tuple(ENGINES),
          help="the engine policy the graph_engine and graph_auto cells reproduce (workbench.engines)"),
    Param("engine_cap", "int", cap="budget_tokens", cpu=None, optional=True, minimum=SMALLEST_BUDGET,
          help="the largest auto-generated budget (vLLM 0.34: encoder_cudagraph_max_token_budget; None: the "
               "release's own, 5120 for 0.34; refused for releases without such an option)"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
    check=_divisible,
)


# `kernel_profile.KERNEL_CATEGORIES` plus its fallback, in the order the breakdown figure stacks them
KERNEL_CATS = ("matmul", "attention", "norm", "rotary", "activation", "input_norm", "copy", "elementwise")


METRICS = {
    "p50_ms": "ms", "p90_ms": "ms", "speedup": "x", "speedup_vs_transformers": "x", "x_floor": "x",
    "floor_ms": "ms", "plan_ms": "ms", "metadata_ms": "ms", "staging_ms": "ms", "replay_ms": "ms",
    "copy_out_ms": "ms", "phases_ms": "ms", "rel_err": "relative", "cos_min": "cosine", "bit_equal": "bool",
    "ok": "bool", "flops_matmul": "FLOP", "flops_attention_full": "FLOP", "flops_attention_window": "FLOP",
    "matmul_tflops": "TFLOP/s", "build_s": "s", "capture_s": "s", "rates_s": "s", "ceiling_s": "s", "cell_s": "s", "fresh_s": "s",
    "practical_floor_ms": "ms", "x_practical_floor": "x", "attn_tflops_full": "TFLOP/s",
    "attn_tflops_window": "TFLOP/s", "kernels_per_call": "count", "fused": "bool", "mlp_quack": "bool", "exact_fit": "bool",
    "prepare_uncached_ms": "ms", **{f"kernel_{c}_ms": "ms" for c in KERNEL_CATS},
    # realistic-batch cells (case "mix"), per image
    "image_p50_ms": "ms", "image_p90_ms": "ms", "replays": "count", "padded_rows": "count", "misses": "count",
    "eager_packs": "count", "valid_rows": "count", "budgets_n": "count", "largest_budget": "tokens",
    "runner_s": "s", "first_ms": "ms", "explore_calls": "count", "fresh_image_ms": "ms", "fresh_p50_image_ms": "ms", "fresh_batches": "count", "reps_n": "count", "p50_ci_lo_ms": "ms", "p50_ci_hi_ms": "ms",
}


MIX_PATHS = ("transformers", "eager", "graph_engine", "graph_planner", "graph_auto")


PHASE_METRICS = tuple(f"{p}_ms" for p in PHASES)


def footprint(p, device: str) -> Footprint:
    """The largest cell of the largest preset: its rows through our tower, and through
    transformers' with the same weights when the reference is timed; with realistic batches, the
    engines' largest budget replayed."""
    tokens = max(max(p["tokens"]), p["engine_max_budget"] if with_folder(p["mixes"], p["image_folder"]) else 0)

    def cell(name: str) -> Footprint:
        cfg = resolve_config(name, p["depth"])
        rows = tokens * cfg.merge_unit
        longest = rows // min(p["images"])
        one = tower_bytes(cfg, rows, longest, itemsize(p), device) * (2 if p["reference"] else 1)
        return Footprint(one, f"{name}, {tokens} tokens")
    return largest(cell(name) for name in p["presets"])
