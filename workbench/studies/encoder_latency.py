"""Encoder latency: eager vs CUDA-graph encode per model and token count, beside transformers' own
vision model with the same weights, and the FLOP floor.

Per (preset, merged tokens, images per call) cell, one batch of random uint8 pixels (``images``
images of ``tokens / images`` merged tokens each, grids [1, 2h, 2w] patches) is encoded three ways,
every call starting from pixels on the host, as a serving engine hands them over (in pinned memory
on CUDA, where engines batch multimodal inputs into pinned buffers; each path gets its input so):

- ``eager``        ``enc.encode(batch, path="eager")``: the outer model calls the tower (placement
                   ``tower``: the norm is the tower's first op);
- ``graph``        ``runner.encode(batch)`` with a runner whose only budget is exactly ``tokens``
                   (``max_items = images``, a uint8 input buffer as engines use today), so every
                   call is one full replay without padding; the
                   runner is captured once per cell, outside the timing. Its phases (plan,
                   metadata, staging, replay, copy_out; `workbench.runner.PHASES`) are timed in
                   separate calls with ``phases={}`` (the device synchronized around each phase),
                   so the p50/p90 of the graph path carry no phase synchronization;
- ``transformers`` transformers' own vision model (SDPA attention) with the same weights, same
                   dtype and device, fed the CPU-normalized float32 rows its processor produces.

Each time is the wall time of one call with the device synchronized before and after it
(`workbench.timing.cpu_time_us`), p50 and p90 over ``reps`` after ``warmup`` calls. Beside them:
the floor, the tower's FLOPs (matmul + full-attention + window-attention blocks, counted by
`workbench.floors.tower_flops`) at the matmul rate measured in the same run
(`workbench.ceilings.matmul_tflops`: bf16 on CUDA, fp32 on a CPU), and each time as a multiple of it.

Realistic batches (``mixes`` x ``mix_items``): ``n`` items drawn from a named image mix
(`workbench.samples.image_mix(mix, n, seed, resized=True, cfg=cfg)`, drawn at the sizes the preset's
own processor gives), encoded
by transformers, eager, and three runners over the same batch: ``graph_engine``, the engines'
budgets (`runner.engine_budgets`: doubling from 64 up to ``engine_max_budget``, which is
appended; their default items per replay) replaying every pack (policy ``always``);
``graph_planner``, `plan_budgets` for the mix's distribution with as many graphs, replaying every
pack; ``graph_auto``, the engines' budgets with policy ``auto`` (a pack replays only where its
graph is predicted faster than eager). Times are per image (p50 and p90 of the call / n); beside
them each runner's replays, padded rows, eager packs and misses, and every output checked against
eager before it is timed. ``image_folder`` (an absolute path) adds a mix of your own images: the
folder's images, drawn by size and resized (`workbench.samples.get_mix`), its rows named
``folder:<its name>`` with the folder's ``fingerprint``.

Every cell is checked once before it is timed: the graph output against the eager output (bit-equal
or within the dtype's tolerance) and ours against transformers (row-wise cosine). A path whose
check fails is not timed: a latency is never reported for a wrong result (the failed check stays in
the table as ``ok`` = False).
"""
from __future__ import annotations

import gc
import statistics
import time

import numpy as np
import pandas as pd
import torch

from ..ceilings import attention_tflops, matmul_tflops
from ..config import PRESET_NAMES, VisionConfig
from ..checkpoints import resolve_config
from ..dtypes import dtype_name
from ..encoder import build_encoder
from ..floors import flop_floor_us, tower_flops
from ..formatting import fmt_us
from ..kernel_profile import kernel_breakdown
from ..norms import REAL_NORMS
from ..preprocess import PatchBatch, normalize_rows
from ..reference import cos_min, hf_embeddings, hf_vision_model, rel_err
from ..budgets import Budgets
from ..planner import plan_budgets
from ..preprocess import preprocess
from ..runner import PHASES, EncoderGraphRunner, engine_budgets, engine_max_items
from ..samples import MIX_NAMES, check_image_folder, image_mix, mix_columns, with_folder
from ..timing import cpu_time_us
from ..towers.common import init_checkpoint_like
from . import Study, begin_run, register
from .correctness import TOLERANCE as CORRECT_TOL
from .footprint import Footprint, itemsize, largest, tower_bytes
from .params import Param, ParamSpec, ascending_unique
from .plotting import (graph_name, is_cpu, labelled_runs, legend_below, per_run, plain_log_ticks, run_label,
                       stamp_cpu, value_ticks)
from .plotting import progress as show_progress
from .tables import tidy, wide

REAL_PRESETS = tuple(n for n in PRESET_NAMES if not n.startswith("tiny-"))
TINY_PRESETS = tuple(n for n in PRESET_NAMES if n.startswith("tiny-"))
LATENCY_PATHS = ("eager", "graph", "transformers")
# graph vs eager: the same weights; the packing can change the attention kernel (dense cuDNN for
# one exact-fit image, flash varlen for a pack), so bf16 differs by a kernel choice accumulated over
# the blocks, as much as between two valid engines: judged at the correctness study's bf16 verdict
# tolerance (the kernel-choice cells of that study measure the spread per family); fp32 agrees to
# rounding
GRAPH_TOL = {torch.float32: 1e-5, torch.bfloat16: CORRECT_TOL[torch.bfloat16]}


def judge_graph(got: torch.Tensor, ref: torch.Tensor, dt) -> tuple[float, bool, bool]:
    """(relative error, bit-equal, ok) of a runner's output against eager's, at `GRAPH_TOL`
    (other dtypes: the bf16 one)."""
    err, equal = rel_err(got, ref), bool(torch.equal(got, ref))
    return err, equal, equal or err <= GRAPH_TOL.get(dt, GRAPH_TOL[torch.bfloat16])
# ours vs transformers, smallest row-wise cosine: fp32 agrees to ~1e-6 relative (cosine ~1 - 1e-12);
# in bf16 both sit ~1e-2 relative from the exact result, a cosine above 0.99 (a wrong normalization
# or weight gives far below 0.9)
COS_MIN = {torch.float32: 0.9999, torch.bfloat16: 0.99}


def _divisible(p: dict) -> None:
    bad = [(t, i) for t in p["tokens"] for i in p["images"] if t % i]
    if bad:
        raise ValueError(f"every tokens value must split evenly over every images value (each image holds "
                         f"tokens / images merged tokens); not divisible: {bad}")


# The GPU profile times every real preset at four token counts, each path 1 (check) + warmup + reps
# calls: minutes on one GPU (each reference run's meta.json records its study_seconds); the
# table's build_s and capture_s say what building and capturing took.
PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=list(TINY_PRESETS), gpu=list(REAL_PRESETS),
          choices=PRESET_NAMES, model_folders=True, help="towers to time"),
    Param("depth", "int", cap="depth", cpu=None, optional=True, minimum=1, help="blocks per tower (None: the preset's depth)"),
    Param("tokens", "list[int]", cap="budget_tokens", cpu=[64, 256], gpu=[64, 256, 1024, 4096], minimum=1, rule=ascending_unique,
          help="merged tokens per call (4 pixel rows each); the graph budget is exactly this"),
    Param("images", "list[int]", cap="items", cpu=[1, 4], minimum=1, rule=ascending_unique,
          help="images per call, tokens / images merged tokens each"),
    Param("dtype", "str", cpu="float32", gpu="bfloat16", choices=("float32", "bfloat16"), help="tower dtype"),
    Param("norm", "str", cpu="eager", gpu="triton_rows", choices=REAL_NORMS,
          help="the tower's input norm (placement tower)"),
    Param("fused", "str", cpu="auto", choices=("auto", "off"),
          help="the towers' fused Triton block kernels: auto (on CUDA for bf16/fp16) or off (plain torch ops)"),
    Param("breakdown", "bool", cpu=False, gpu=True, help="profile one tower forward per cell: device time by kernel category"),
    Param("reference", "bool", cpu=True, help="also time transformers' vision model with the same weights"),
    Param("reps", "int", cap="reps", cpu=5, gpu=10, minimum=1, help="timed calls per path and cell"),
    Param("warmup", "int", cap="reps", cpu=1, gpu=2, minimum=0, help="untimed calls before them (after the check call)"),
    Param("mixes", "list[str]", cpu=["photos"], gpu=["screenshots", "documents", "phone_photos", "charts", "video_clips"],
          choices=MIX_NAMES, empty_ok=True, help="image mixes for the realistic-batch cells ([] for none)"),
    Param("image_folder", "str", cpu=None, optional=True, rule=check_image_folder,
          help="absolute path of a folder of your own images: one more mix for those cells (None: none)"),
    Param("mix_items", "list[int]", cap="items", cpu=[2], gpu=[1, 4], minimum=1, rule=ascending_unique,
          help="items per realistic batch, drawn from each mix"),
    Param("engine_max_budget", "int", cap="budget_tokens", cpu=512, gpu=16384, minimum=64,
          help="the largest budget of the engines' rule (realistic-batch cells)"),
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
    "matmul_tflops": "TFLOP/s", "build_s": "s", "capture_s": "s",
    "practical_floor_ms": "ms", "x_practical_floor": "x", "attn_tflops_full": "TFLOP/s",
    "attn_tflops_window": "TFLOP/s", "kernels_per_call": "count", "fused": "bool", "exact_fit": "bool",
    "prepare_uncached_ms": "ms", **{f"kernel_{c}_ms": "ms" for c in KERNEL_CATS},
    # realistic-batch cells (case "mix"), per image
    "image_p50_ms": "ms", "image_p90_ms": "ms", "replays": "count", "padded_rows": "count", "misses": "count",
    "eager_packs": "count", "valid_rows": "count", "budgets_n": "count", "largest_budget": "tokens",
    "runner_s": "s",
}
MIX_PATHS = ("transformers", "eager", "graph_engine", "graph_planner", "graph_auto")
PHASE_METRICS = tuple(f"{p}_ms" for p in PHASES)


def grid_for(tokens: int, cfg: VisionConfig) -> list[int]:
    """A [1, h, w] patch grid of ``tokens`` merged tokens, as square as the count allows."""
    side = max(d for d in range(1, int(tokens ** 0.5) + 1) if tokens % d == 0)
    return [1, cfg.merge_size * side, cfg.merge_size * (tokens // side)]


def latency_batch(cfg: VisionConfig, tokens: int, images: int, gen: torch.Generator) -> PatchBatch:
    """``images`` images of ``tokens / images`` merged tokens each, random uint8 pixels (host)."""
    grid = torch.tensor([grid_for(tokens // images, cfg)] * images, dtype=torch.int64)
    rows = int(grid.prod(dim=1).sum())
    pixels = torch.randint(0, 256, (rows, cfg.patch_dim), dtype=torch.uint8, generator=gen)
    return PatchBatch(pixels, grid)


def build_models(cfg: VisionConfig, norm: str, dtype: torch.dtype, dev: torch.device, seed: int, reference: bool,
                 fused="auto"):
    """Our encoder (placement tower) and, with ``reference``, transformers' vision model holding the
    same weights; both created directly on ``dev`` (no host-side init of ~0.7e9 parameters)."""
    with torch.device(dev):
        enc = build_encoder(cfg, placement="tower", norm=norm, dtype=dtype, device=dev, seed=None, fused=fused)
        hf = hf_vision_model(cfg, attn_implementation="sdpa", dtype=dtype) if reference else None
    if hf is not None:
        init_checkpoint_like(hf, seed, on_device=True)
        enc.visual.load_hf_state_dict(hf.state_dict())    # refuses a missing or mis-shaped key
    else:
        init_checkpoint_like(enc.visual, seed, on_device=True)
    return enc.eval(), hf


def practical_rates(cfg: VisionConfig, seq_rows: int, n_seqs: int, dev: torch.device,
                    dtype: torch.dtype) -> tuple[float, float | None]:
    """(full, window) attention TFLOP/s of the fastest kernel for the cell's shapes, measured now
    (`workbench.ceilings.attention_tflops`): ``n_seqs`` sequences of ``seq_rows`` rows, and for
    Qwen2.5-VL the same rows as whole windows of (window_merged x merge_size)^2 rows, as
    `tower_flops` counts them (None for Qwen2-VL)."""
    full = attention_tflops(seq_rows, n_seqs, cfg.heads, cfg.head_dim, dev, dtype)[0]
    if cfg.spec.full_attention_blocks(cfg) == cfg.depth:      # no window attention in this family
        return full, None
    win = cfg.window_merged ** 2 * cfg.merge_unit
    n_win = -(-seq_rows // win) * n_seqs
    return full, attention_tflops(win, n_win, cfg.heads, cfg.head_dim, dev, dtype)[0]


def _release(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def _median_phases(samples: list[dict]) -> dict:
    out = {f"{k}_ms": statistics.median(s.get(k, 0.0) for s in samples) * 1e3 for k in PHASES}
    out["phases_ms"] = statistics.median(sum(s.values()) for s in samples) * 1e3
    return out


def measure_cell(enc, hf, cfg: VisionConfig, batch: PatchBatch, tokens: int, images: int, reps: int,
                 warmup: int, breakdown: bool = False) -> dict[str, dict]:
    """Check, then time, the three paths on one batch; returns metrics per path (name -> dict)."""
    dev, dt = enc.device, enc.dtype
    t0 = time.perf_counter()
    runner = EncoderGraphRunner(enc, budgets=[tokens], buffer_dtype=torch.uint8, max_items=images, policy="always")
    _release(dev)
    capture_s = time.perf_counter() - t0
    hf_pixels = normalize_rows(batch.pixels, cfg) if hf is not None else None   # what its processor gives
    if hf_pixels is not None and dev.type == "cuda":
        hf_pixels = hf_pixels.pin_memory()     # handed over pinned, as our paths' uint8 rows are
    grid_dev = batch.grid_thw.to(dev)

    def eager():
        return enc.encode(batch, path="eager")

    def graph(phases=None):
        return runner.encode(batch, phases=phases)

    def reference():
        return hf_embeddings(hf, hf_pixels.to(dev, non_blocking=True), grid_dev)

    # ---- the check, once per cell, before any timing
    with torch.inference_mode():
        ref_out = eager()
        graph_out = graph()
        hf_out = reference() if hf is not None else None
    st = runner.stats_frame()
    if not ((st.budget == tokens).all() and (st.padded_rows == 0).all() and not st.miss.any() and len(st) == 1):
        raise RuntimeError(f"the runner did not make one full replay of budget {tokens}: {st.to_dict('list')}")
    exact_fit = bool(st.exact.all())
    g_err, bit_equal, graph_ok = judge_graph(graph_out, ref_out, dt)
    out = {"eager": {}, "graph": dict(rel_err=g_err, cos_min=cos_min(graph_out, ref_out), bit_equal=bit_equal,
                                      capture_s=capture_s, exact_fit=exact_fit)}
    eager_ok = True
    if hf_out is not None:
        c = cos_min(ref_out, hf_out)
        eager_ok = bool(np.isfinite(c) and c >= COS_MIN.get(dt, 0.99))
        out["transformers"] = dict(rel_err=rel_err(ref_out, hf_out), cos_min=c, ok=eager_ok)
        out["eager"]["ok"] = eager_ok
    graph_ok = graph_ok and eager_ok
    out["graph"]["ok"] = graph_ok
    del ref_out, graph_out, hf_out

    # ---- the timings, only of checked paths
    with torch.inference_mode():
        if eager_ok:
            t = cpu_time_us(eager, reps=reps, warmup=warmup)
            out["eager"].update(p50_ms=t["p50_us"] / 1e3, p90_ms=t["p90_us"] / 1e3)
            if hf is not None:
                t = cpu_time_us(reference, reps=reps, warmup=warmup)
                out["transformers"].update(p50_ms=t["p50_us"] / 1e3, p90_ms=t["p90_us"] / 1e3)
        if graph_ok:
            t = cpu_time_us(graph, reps=reps, warmup=warmup)
            out["graph"].update(p50_ms=t["p50_us"] / 1e3, p90_ms=t["p90_us"] / 1e3)
            samples = []
            for _ in range(min(reps, max(3, reps // 2))):
                phases: dict = {}
                graph(phases)
                samples.append(phases)
            out["graph"].update(_median_phases(samples))
            # what the metadata phase would cost for a shape seen for the first time: the runner caches
            # the host-prepared metadata per (grid, budget), so the timed calls above reuse it
            t = cpu_time_us(lambda: enc.visual.prepare(batch.grid_thw), reps=max(3, reps // 2), warmup=1)
            out["graph"]["prepare_uncached_ms"] = t["p50_us"] / 1e3
    if breakdown and graph_ok:
        meta = enc.visual.prepare_cached(batch.grid_thw)      # the eager path's, already made
        pixels = batch.pixels.to(dev)
        with torch.inference_mode():
            k = kernel_breakdown(lambda: enc.visual.forward_prepared(pixels, meta), dev)
        out["graph"]["kernels_per_call"] = k.pop("kernels")
        out["graph"].update({f"kernel_{c}_ms": k.get(c, 0.0) for c in KERNEL_CATS})
        del meta, pixels
    runner = None     # drop the graphs and their pool before the next cell (the closures above are done)
    _release(dev)
    return out


def measure_mix(enc, hf, cfg: VisionConfig, batch: PatchBatch, runners: dict, reps: int,
                warmup: int) -> dict[str, dict]:
    """Check, then time, eager, transformers and every runner of ``runners`` (strategy ->
    (runner, policy)) on one realistic batch; metrics per strategy, times per image."""
    dev, dt, n = enc.device, enc.dtype, batch.n_items
    hf_pixels = normalize_rows(batch.pixels, cfg) if hf is not None else None
    if hf_pixels is not None and dev.type == "cuda":
        hf_pixels = hf_pixels.pin_memory()
    grid_dev = batch.grid_thw.to(dev)
    calls = {"eager": lambda: enc.encode(batch, path="eager")}
    if hf is not None:
        calls["transformers"] = lambda: hf_embeddings(hf, hf_pixels.to(dev, non_blocking=True), grid_dev)
    for name, (runner, policy) in runners.items():
        calls[name] = (lambda r=runner, pol=policy: r.encode(batch, policy=pol))
    out: dict[str, dict] = {}
    with torch.inference_mode():
        ref = calls["eager"]()
        for name, call in calls.items():
            m: dict = {}
            if name in runners:
                runner = runners[name][0]
                runner.reset_stats()
                got = call()
                st = runner.stats_frame()
                packs = st[~st.miss]
                m.update(replays=int((~packs.eager).sum()), eager_packs=int(packs.eager.sum()),
                         misses=int(st.miss.sum()), padded_rows=int(st.padded_rows.sum()),
                         valid_rows=int(st.valid_rows.sum()), budgets_n=len(runner.budgets),
                         largest_budget=int(runner.budgets[-1]))
                err, equal, ok = judge_graph(got, ref, dt)
                m.update(rel_err=err, bit_equal=equal, ok=ok)
            elif name == "transformers":
                hf_out = call()
                c = cos_min(ref, hf_out)
                m.update(cos_min=c, rel_err=rel_err(ref, hf_out), ok=bool(np.isfinite(c) and c >= COS_MIN.get(dt, 0.99)))
                del hf_out
            else:
                m["ok"] = True
            if m["ok"]:
                t = cpu_time_us(call, reps=reps, warmup=warmup)
                m.update(p50_ms=t["p50_us"] / 1e3, p90_ms=t["p90_us"] / 1e3,
                         image_p50_ms=t["p50_us"] / 1e3 / n, image_p90_ms=t["p90_us"] / 1e3 / n)
            out[name] = m
    return out


def _mix_runners(enc, cfg: VisionConfig, mix: str, engine) -> dict:
    """The planner's runner for ``mix`` beside the shared engine-budget runner (``engine``, built
    with policy auto once per preset: its 'always' calls are the engines' behaviour)."""
    eb = engine.budgets
    planned = plan_budgets(mix, max_graphs=len(eb), cfg=cfg)
    items = engine_max_items(planned)
    planner = EncoderGraphRunner(enc, budgets=list(Budgets.of(planned).holding(items)), buffer_dtype=torch.uint8,
                                 max_items=items, policy="always")
    return {"graph_engine": (engine, "always"), "graph_planner": (planner, "always"), "graph_auto": (engine, None)}


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Time every (preset, tokens, images) cell on the three paths; returns the tidy long table.

    params: see PARAMS (defaults: the device's profile)."""
    s = begin_run(PARAMS, "encoder_latency", device, params)
    dev, p, dt, label = s.device, s.params, s.dtype, s.label
    p["mixes"] = with_folder(p["mixes"], p["image_folder"])      # the folder's mix joins the named ones
    tflops = matmul_tflops(dev)
    gen = torch.Generator().manual_seed(p["seed"])
    rows: list[dict] = []
    cells = [(t, i) for t in p["tokens"] for i in p["images"]]
    mix_cells = len(p["mixes"]) * len(p["mix_items"])
    bar = show_progress(total=len(p["presets"]) * (len(cells) + 1 + mix_cells), desc="encoder_latency",
                        enabled=progress)
    for preset in p["presets"]:
        cfg = resolve_config(preset, p["depth"])
        torch.manual_seed(p["seed"])
        t0 = time.perf_counter()
        enc, hf = build_models(cfg, p["norm"], dt, dev, p["seed"], p["reference"],
                               fused=False if p["fused"] == "off" else "auto")
        fused_on = enc.visual.kernels.fused
        _release(dev)
        build_s = time.perf_counter() - t0
        bar.update()
        for tokens, images in cells:
            batch = latency_batch(cfg, tokens, images, gen)
            if dev.type == "cuda":   # engines batch multimodal inputs into pinned host memory
                batch = PatchBatch(batch.pixels.pin_memory(), batch.grid_thw)
            per = tokens // images
            flops = tower_flops(cfg, [per * cfg.merge_unit] * images)
            floor_ms = flop_floor_us(flops["total"], tflops) / 1e3
            rates = practical_rates(cfg, per * cfg.merge_unit, images, dev, dt)
            practical_ms = (flop_floor_us(flops["matmul"], tflops) + flop_floor_us(flops["attention_full"], rates[0])
                            + (flop_floor_us(flops["attention_window"], rates[1]) if rates[1] else 0.0)) / 1e3
            res = measure_cell(enc, hf, cfg, batch, tokens, images, p["reps"], p["warmup"], p["breakdown"])
            eager_p50 = res["eager"].get("p50_ms", float("nan"))
            hf_p50 = res.get("transformers", {}).get("p50_ms", float("nan"))
            common = dict(study="encoder_latency", case="exact", preset=preset, family=cfg.family, depth=cfg.depth,
                          dtype=dtype_name(dt), norm=p["norm"], device=label, tokens=tokens, images=images,
                          tokens_per_image=per, grid="x".join(map(str, grid_for(per, cfg))))
            for path in LATENCY_PATHS:
                if path not in res:
                    continue
                m = dict(res[path])
                p50 = m.get("p50_ms", float("nan"))
                m.update(practical_floor_ms=practical_ms, x_practical_floor=p50 / practical_ms,
                         attn_tflops_full=rates[0], **({"attn_tflops_window": rates[1]} if rates[1] else {}))
                if path != "transformers":
                    m["fused"] = fused_on
                m.update(floor_ms=floor_ms, x_floor=p50 / floor_ms, speedup=eager_p50 / p50,
                         speedup_vs_transformers=hf_p50 / p50, flops_matmul=flops["matmul"],
                         flops_attention_full=flops["attention_full"],
                         flops_attention_window=flops["attention_window"], matmul_tflops=tflops)
                if path == "eager":
                    m["build_s"] = build_s
                rows.append({**common, "path": path, **m})
            bar.update()
        if p["mixes"]:
            t0 = time.perf_counter()
            eb = engine_budgets(p["engine_max_budget"])
            engine = EncoderGraphRunner(enc, budgets=eb, buffer_dtype=torch.uint8, max_items=engine_max_items(eb))
            engine_s = time.perf_counter() - t0
            for mix in p["mixes"]:
                for n in p["mix_items"]:
                    batch = preprocess(image_mix(mix, n, seed=p["seed"], resized=True, cfg=cfg), cfg)
                    if dev.type == "cuda":
                        batch = PatchBatch(batch.pixels.pin_memory(), batch.grid_thw)
                    t0 = time.perf_counter()
                    runners = _mix_runners(enc, cfg, mix, engine)
                    planner_s = time.perf_counter() - t0
                    res = measure_mix(enc, hf, cfg, batch, runners, p["reps"], p["warmup"])
                    runners = None
                    common = dict(study="encoder_latency", case="mix", preset=preset, family=cfg.family,
                                  depth=cfg.depth, dtype=dtype_name(dt), norm=p["norm"], device=label,
                                  **mix_columns(mix), images=n, tokens=batch.n_rows // cfg.merge_unit)
                    for path, m in res.items():
                        if path in ("graph_engine", "graph_auto"):
                            m["runner_s"] = engine_s
                        elif path == "graph_planner":
                            m["runner_s"] = planner_s
                        rows.append({**common, "path": path, **m})
                    _release(dev)
                    bar.update()
            engine = None
        del enc, hf
        _release(dev)
    bar.close()
    return tidy(pd.DataFrame(rows), METRICS)


# ---- presentation ---------------------------------------------------------------------------

PATH_STYLE = {"eager": ("C0", "o", "eager (ours)"), "graph": ("C3", "s", "{graph} (ours)"),
              "transformers": ("C2", "^", "transformers (SDPA)")}
PHASE_COLORS = {"plan": "#b0bec5", "metadata": "#ffb74d", "staging": "#4fc3f7", "replay": "#1565c0",
                "copy_out": "#81c784"}


def exact_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the exact-fit cells (case 'exact'; runs made before the realistic batches have
    no case column and only those)."""
    return table if "case" not in table else table[table["case"].isna() | (table["case"] == "exact")]


def mix_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the realistic-batch cells (case 'mix')."""
    return table.iloc[0:0] if "case" not in table else table[table["case"] == "mix"]


def latency_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, preset, tokens, images, path): the closing table of the study."""
    w = wide(exact_cells(table))
    cols = ["run", "reference", "device", "preset", "tokens", "images", "path", "p50_ms", "p90_ms", "floor_ms",
            "x_floor", "speedup", "speedup_vs_transformers", *PHASE_METRICS, "rel_err", "cos_min", "bit_equal", "ok"]
    cols = [c for c in cols if c in w]
    order = {p: i for i, p in enumerate(LATENCY_PATHS)}
    w = w.assign(_o=w.path.map(order))
    keys = [c for c in ("run", "device", "preset", "tokens", "images", "_o") if c in w]
    return w.sort_values(keys)[cols].reset_index(drop=True)


def _panels(n: int, width: float = 5.2, height: float = 4.0):
    import matplotlib.pyplot as plt

    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def plot_latency(g: pd.DataFrame):
    """Per preset, p50 ms per encode call vs merged tokens (log-log): eager, graph, transformers and,
    on a GPU, the FLOP and practical floors; solid lines one image per call, dashed the packed
    batch of several images. A CPU run (host times, emulated graphs) is stamped and has no floor."""
    w = wide(exact_cells(g))
    presets = list(dict.fromkeys(w.preset))
    fig, axes = _panels(len(presets))
    imgs = sorted(w.images.unique())
    cpu = is_cpu(w)
    styles = ["-", "--", ":", "-."]
    for ax, preset in zip(axes.flat, presets):
        d = w[w.preset == preset]
        for k, n_img in enumerate(imgs):
            ls = styles[k % len(styles)]
            di = d[d.images == n_img]
            for path, (color, marker, name) in PATH_STYLE.items():
                c = di[di.path == path].sort_values("tokens")
                if "p50_ms" not in c or c.p50_ms.isna().all():
                    continue
                ax.plot(c.tokens, c.p50_ms, ls=ls, marker=marker, color=color, ms=4,
                        label=f"{name.format(graph=graph_name(cpu))}, {_images(n_img)}")
            if cpu:
                continue
            fl = di.drop_duplicates("tokens").sort_values("tokens")
            ax.plot(fl.tokens, fl.floor_ms, ls=ls, marker="_", ms=10, color="k", lw=1, alpha=0.6,
                    label=f"FLOP floor, {_images(n_img)}")
            if "practical_floor_ms" in fl and fl.practical_floor_ms.notna().any():
                ax.plot(fl.tokens, fl.practical_floor_ms, ls=ls, marker="_", ms=14, color="0.45", lw=2, alpha=0.5,
                        label=f"practical floor, {_images(n_img)}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        value_ticks(ax.xaxis, d.tokens)      # the measured token counts, plainly
        plain_log_ticks(ax.yaxis)
        ax.set_xlabel("merged tokens per call (log)")
        ax.set_ylabel("p50 per encode call (ms, log)")
        ax.set_title(preset, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        if cpu:
            stamp_cpu(ax)
    what = ("eager vs the emulated graph runner vs transformers (CPU: no floors)" if cpu else
            "eager vs CUDA graph vs transformers, and the FLOP and practical floors")
    fig.suptitle(f"Encoder latency: {what} ({run_label(g)})", fontsize=11)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels())
    return fig


def _share_bars(w: pd.DataFrame, parts: dict, colors: dict, note, xlabel: str, title: str, cpu: bool = False):
    """Stacked horizontal bars, one per (preset, tokens) cell of ``w``, as shares of the parts'
    sum: ``parts`` maps a legend label to its column, ``note(row, total)`` writes the text right of
    each bar; one panel per images value; ``cpu``: stamped as a smoke test."""
    imgs = sorted(w.images.unique())
    n_bars = max((len(w[w.images == i]) for i in imgs), default=1)
    fig, axes = _panels(max(1, len(imgs)), width=7.0, height=1.6 + 0.32 * n_bars)
    for ax, n_img in zip(axes.flat, imgs):
        d = w[w.images == n_img].sort_values(["preset", "tokens"])
        y = np.arange(len(d))
        total = d[list(parts.values())].sum(axis=1).to_numpy()
        left = np.zeros(len(d))
        for label, col in parts.items():
            share = d[col].to_numpy() / total
            ax.barh(y, share, left=left, color=colors[label], label=label)
            left += share
        for yi, (row, tot) in enumerate(zip(d.itertuples(), total)):
            ax.text(1.01, yi, note(row, tot), va="center", fontsize=7)
        ax.set_yticks(y, [f"{a}, {t} tok" for a, t in zip(d.preset, d.tokens)], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 1.7)      # room for the note right of each bar
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0", "25%", "50%", "75%", "100%"])
        ax.set_xlabel(xlabel)
        ax.set_title(f"{_images(n_img)} per call", fontsize=9)
        if cpu:
            stamp_cpu(ax)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels(), ncol=8)
    return fig


def plot_phases(g: pd.DataFrame):
    """The graph path split into its phases (median per phase, calls with the device synchronized
    around each phase): each bar is one (preset, tokens) cell, stacked as shares of the phases'
    sum, labelled "phases <sum of the phase medians>, call p50 <p50 of whole calls without the
    phase syncs>"; one panel per images value. A CPU run is stamped (emulated graphs, host times)."""
    w = wide(exact_cells(g))
    w = w[(w.path == "graph")]
    if "replay_ms" in w:
        w = w[w.replay_ms.notna()]
    cpu = is_cpu(g)
    return _share_bars(w, dict(zip(PHASES, PHASE_METRICS)), PHASE_COLORS,
                       lambda r, tot: f"phases {fmt_us(tot * 1e3)}, call p50 {fmt_us(r.p50_ms * 1e3)}",
                       "share of the graph path (each phase's median, a sync around each phase)",
                       f"Where the {graph_name(cpu)} path's time goes ({run_label(g)})\n"
                       "right of each bar: the phases' medians summed, and the p50 of whole calls without the syncs",
                       cpu=cpu)


KERNEL_COLORS = {"matmul": "#1565c0", "attention": "#c62828", "norm": "#f9a825", "rotary": "#6a1b9a",
                 "activation": "#2e7d32", "input_norm": "#00838f", "copy": "#8d6e63", "elementwise": "#9e9e9e"}


def plot_kernels(g: pd.DataFrame):
    """Device time of one tower forward by kernel category (profiled: the kernels a graph replay
    runs), one bar per (preset, tokens) cell, as shares, labelled with the total and the kernel
    count; one panel per images value."""
    w = wide(exact_cells(g))
    w = w[(w.path == "graph")]
    parts = {c: f"kernel_{c}_ms" for c in KERNEL_CATS if f"kernel_{c}_ms" in w}
    w = w[w[list(parts.values())].notna().all(axis=1)] if parts else w.iloc[0:0]
    return _share_bars(w, parts, KERNEL_COLORS,
                       lambda r, tot: f"{fmt_us(tot * 1e3)}, {int(r.kernels_per_call)} kernels",
                       "share of the tower's device time (one forward, profiled)",
                       f"Where the tower's device time goes, by kernel ({run_label(g)})")


def key_numbers(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per device: preset x tokens x images, the p50 of each path and the floor in ms, the graph
    path's speedup over eager and over transformers, and each path as a multiple of the floor."""
    out = {}
    for dev, g in labelled_runs(exact_cells(table)):
        w = wide(g)
        idx = ["preset", "tokens", "images"]
        p50 = w.pivot_table(index=idx, columns="path", values="p50_ms", aggfunc="first")
        t = pd.DataFrame(index=p50.index)
        for path, name in (("eager", "eager ms"), ("graph", "graph ms"), ("transformers", "transformers ms")):
            t[name] = p50[path] if path in p50 else np.nan
        t["floor ms"] = w.groupby(idx).floor_ms.first()
        if "practical_floor_ms" in w:
            t["practical floor ms"] = w.groupby(idx).practical_floor_ms.first()
        t["graph speedup over eager (x)"] = t["eager ms"] / t["graph ms"]
        t["graph speedup over transformers (x)"] = t["transformers ms"] / t["graph ms"]
        t["graph x floor"] = t["graph ms"] / t["floor ms"]
        t["eager x floor"] = t["eager ms"] / t["floor ms"]
        if "practical floor ms" in t:
            t["graph x practical floor"] = t["graph ms"] / t["practical floor ms"]
        if "replay_ms" in w:
            t["graph replay ms"] = w[w.path == "graph"].set_index(idx).replay_ms
        out[dev] = t.reset_index()
    return out


def _images(n) -> str:
    n = int(n)
    return f"{n} image" + ("s" if n > 1 else "")


def _cell(r) -> str:
    return f"{r.preset} at {int(r.tokens)} tokens x {_images(r.images)}"


def findings(table: pd.DataFrame) -> str:
    """The finding per device: checks, where graphs win and by how much, where they lose, how the
    graph path compares with transformers and with the floor, and where its time goes."""
    return per_run(table, lambda dev, g: _run_finding(dev, g))


def _run_finding(dev: str, g: pd.DataFrame) -> str:
    text = _exact_finding(dev, exact_cells(g))
    mixed = mix_cells(g)
    return text + (" " + _mix_finding(mixed) if len(mixed) else "")


def _exact_finding(dev: str, g: pd.DataFrame) -> str:
    w = wide(g)
    gr = w[w.path == "graph"]
    tr = w[w.path == "transformers"]
    n_cells = len(gr)
    ok_graph = int(gr.ok.fillna(False).astype(bool).sum()) if "ok" in gr else 0
    bit = int(gr.bit_equal.fillna(False).astype(bool).sum()) if "bit_equal" in gr else 0
    text = (f"On {dev} ({', '.join(sorted(map(str, w.dtype.unique())))}; matmul rate "
            f"{w.matmul_tflops.iloc[0]:.3g} TFLOP/s measured in the run): the graph output equals eager in "
            f"{ok_graph}/{n_cells} cells ({bit} bit-equal, worst rel_err {gr.rel_err.max():.1e})")
    if len(tr):
        agree = int(tr.ok.fillna(False).astype(bool).sum())
        text += (f"; ours agrees with transformers in {agree}/{len(tr)} cells (smallest row cosine "
                 f"{tr.cos_min.min():.6f})")
    text += ". Only checked paths are timed."
    timed = gr[gr.p50_ms.notna()] if "p50_ms" in gr else gr.iloc[0:0]
    if len(timed):
        win = timed[timed.speedup > 1].sort_values("speedup", ascending=False)
        lose = timed[timed.speedup <= 1].sort_values("speedup")
        if len(win):
            best = win.iloc[0]
            text += (f" CUDA graphs win in {len(win)}/{len(timed)} cells, most at {_cell(best)}: "
                     f"{best.speedup:.2f}x over eager ({fmt_us(best.p50_ms * 1e3)} vs "
                     f"{fmt_us(best.p50_ms * best.speedup * 1e3)}); median gain {win.speedup.median():.2f}x.")
        if len(lose):
            text += (f" They lose or tie in {len(lose)} cell(s): " + "; ".join(
                f"{_cell(r)} ({r.speedup:.2f}x)" for r in lose.head(4).itertuples()) + ".")
        else:
            text += " They lose in no cell."
        by_tok = timed.groupby("tokens").speedup.median()
        text += " Median graph speedup by tokens: " + ", ".join(
            f"{int(t)}: {s:.2f}x" for t, s in by_tok.items()) + "."
        vs = (timed.speedup_vs_transformers.dropna() if "speedup_vs_transformers" in timed
              else pd.Series(dtype=float))
        if len(vs):
            text += (f" Against transformers' own tower the graph path is {vs.min():.2f}-{vs.max():.2f}x "
                     f"(faster in {int((vs > 1).sum())}/{len(vs)} cells).")
        big = timed[timed.tokens == timed.tokens.max()]
        small = timed[timed.tokens == timed.tokens.min()]
        text += (f" The graph path runs at {big.x_floor.min():.1f}-{big.x_floor.max():.1f}x the FLOP floor at "
                 f"{int(big.tokens.iloc[0])} tokens and {small.x_floor.min():.0f}-{small.x_floor.max():.0f}x at "
                 f"{int(small.tokens.iloc[0])}, where launches and host work, not FLOPs, set the time.")
        if "x_practical_floor" in timed and timed.x_practical_floor.notna().any():
            pf = timed[timed.tokens >= 1024] if (timed.tokens >= 1024).any() else big
            within = int((pf.x_practical_floor <= 1.25).sum())
            text += (f" Against the practical floor (matmul FLOPs at the matmul rate plus attention FLOPs at the "
                     f"fastest attention kernel's rate for the cell's shapes, both measured in the run) the graph "
                     f"path runs at {pf.x_practical_floor.min():.2f}-{pf.x_practical_floor.max():.2f}x from "
                     f"{int(pf.tokens.min())} tokens ({within}/{len(pf)} cells within 1.25x).")
        kcols = [f"kernel_{c}_ms" for c in KERNEL_CATS]
        if all(c in timed for c in kcols) and timed[kcols].notna().all(axis=1).any():
            kb = timed[timed[kcols].notna().all(axis=1)]
            for label, cell in (("smallest", kb[kb.tokens == kb.tokens.min()]),
                                ("largest", kb[kb.tokens == kb.tokens.max()])):
                sh = (cell[kcols].sum() / cell[kcols].sum().sum()).sort_values(ascending=False)
                text += (f" At the {label} token count ({int(cell.tokens.iloc[0])}) the tower's device time is "
                         + ", ".join(f"{v:.0%} {k[len('kernel_'):-len('_ms')]}" for k, v in sh.head(3).items())
                         + f" ({int(cell.kernels_per_call.median())} kernels per forward).")
        if "replay_ms" in timed and timed.replay_ms.notna().any():
            ph = timed[timed.replay_ms.notna()]
            host = ph[["plan_ms", "metadata_ms", "staging_ms", "copy_out_ms"]].sum(axis=1) / ph.phases_ms
            r = ph.loc[host.idxmax()]
            if "prepare_uncached_ms" in r and pd.notna(r.prepare_uncached_ms):
                text += (f" Host metadata for a shape seen for the first time takes "
                         f"{fmt_us(ph.prepare_uncached_ms.min() * 1e3)}-{fmt_us(ph.prepare_uncached_ms.max() * 1e3)}"
                         f" (prepared uncached); the runner caches it per grid and budget, so a repeated shape "
                         f"costs only the copy ({fmt_us(ph.metadata_ms.min() * 1e3)}-"
                         f"{fmt_us(ph.metadata_ms.max() * 1e3)}).")
            text += (f" Outside the replay (plan, metadata, staging, copy-out) the graph path spends "
                     f"{host.min():.0%}-{host.max():.0%} of its phase-timed calls, most at {_cell(r)} "
                     f"(metadata {fmt_us(r.metadata_ms * 1e3)}, staging {fmt_us(r.staging_ms * 1e3)}).")
    if str(dev).startswith("cpu"):
        text += (" On a CPU the graph backend is emulated (the same static buffers and call path, replayed "
                 "eagerly): the differences are the runner's host overhead, not CUDA-graph gains.")
    return text


MIX_STYLE = {"transformers": ("C2", "transformers (SDPA)"), "eager": ("C0", "eager (ours)"),
             "graph_engine": ("C3", "graph, engines' budgets"), "graph_planner": ("C1", "graph, planner budgets"),
             "graph_auto": ("C4", "graph, policy auto")}


def mix_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per realistic batch (device, preset, mix, items): each strategy's per-image p50,
    the fastest strategy, and policy auto against the faster of eager and the engines' graphs
    and against transformers (ratios > 1: auto is slower)."""
    w = wide(mix_cells(table))
    if w.empty:
        return pd.DataFrame()
    idx = [c for c in ("run", "device", "preset", "mix", "images") if c in w]
    t = w.pivot_table(index=idx, columns="path", values="image_p50_ms", aggfunc="first")
    t = t[[p for p in MIX_PATHS if p in t]]
    out = t.copy()
    out["fastest"] = t.idxmin(axis=1)
    if {"graph_auto", "eager", "graph_engine"} <= set(t):
        out["auto / best of eager, engine graph"] = t["graph_auto"] / t[["eager", "graph_engine"]].min(axis=1)
        out["engine graph / eager"] = t["graph_engine"] / t["eager"]
    if {"graph_auto", "transformers"} <= set(t):
        out["auto / transformers"] = t["graph_auto"] / t["transformers"]
    return out.reset_index()


# the spread of per-image times above which the realistic-batch figure uses a log axis
LOG_SPREAD = 20.0


def plot_mixes(g: pd.DataFrame):
    """Per preset, per-image p50 (ms) of every strategy on each realistic batch (mix x items);
    None when the run has no realistic-batch cells."""
    w = wide(mix_cells(g))
    if w.empty or "image_p50_ms" not in w:
        return None
    presets = list(dict.fromkeys(w.preset))
    cells = w[["mix", "images"]].drop_duplicates().sort_values(["mix", "images"])
    fig, axes = _panels(len(presets), width=6.0, height=1.8 + 0.55 * len(cells))
    cpu = is_cpu(w)
    paths = [p for p in MIX_PATHS if p in set(w.path)]
    h = 0.8 / max(1, len(paths))
    # items of a few hundred tokens beside 12 MP photos (over 100x apart on Qwen3-VL): a log axis
    # keeps the short bars readable; one scale for every panel, so they compare
    times = w.image_p50_ms.dropna()
    times = times[times > 0]
    log = len(times) > 1 and times.max() / times.min() > LOG_SPREAD
    for ax, preset in zip(axes.flat, presets):
        d = w[w.preset == preset]
        for k, path in enumerate(paths):
            color, name = MIX_STYLE[path]
            name = f"{name} (emulated)" if cpu and path.startswith("graph") else name
            vals = [d[(d.mix == c.mix) & (d.images == c.images) & (d.path == path)].image_p50_ms
                    for c in cells.itertuples()]
            vals = [float(v.iloc[0]) if len(v) else np.nan for v in vals]
            ax.barh(np.arange(len(cells)) + k * h, vals, height=h, color=color, label=name)
        ax.set_yticks(np.arange(len(cells)) + h * (len(paths) - 1) / 2,
                      [f"{c.mix} x{int(c.images)}" for c in cells.itertuples()], fontsize=8)
        ax.invert_yaxis()
        if log:
            ax.set_xscale("log")
            ax.set_xlim(times.min() / 1.5, times.max() * 1.3)      # the same range in every panel
            plain_log_ticks(ax.xaxis)
        ax.set_xlabel("p50 per image (ms" + (", log)" if log else ")"))
        ax.set_title(preset, fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        if cpu:
            stamp_cpu(ax)
    fig.suptitle(f"Realistic batches: per-image time of each strategy ({run_label(g)})", fontsize=11)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels(), ncol=3)
    return fig


def _mix_finding(g: pd.DataFrame) -> str:
    t = mix_table(g)
    if t.empty or "auto / best of eager, engine graph" not in t:
        return ""
    ratio = t["auto / best of eager, engine graph"].dropna()
    lose = t[t["engine graph / eager"] > 1]
    text = (f"Realistic batches ({len(t)} cells, items drawn from {', '.join(sorted(t.mix.unique()))}): the engines' "
            f"budgets replay slower than eager in {len(lose)}/{len(t)} cells"
            + (f", by up to {lose['engine graph / eager'].max():.2f}x ({lose.sort_values('engine graph / eager').iloc[-1].mix})"
               if len(lose) else "")
            + f"; policy auto is within 5% of the faster of eager and the engines' graphs in "
              f"{int((ratio <= 1.05).sum())}/{len(ratio)} cells (worst {ratio.max():.2f}x)")
    if "auto / transformers" in t:
        vs = t["auto / transformers"].dropna()
        text += f" and faster than transformers in {int((vs < 1).sum())}/{len(vs)} (worst {vs.max():.2f}x of its time)"
    wins = t.fastest.value_counts()
    return text + ". Fastest per cell: " + ", ".join(f"{k} {v}" for k, v in wins.items()) + "."


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

STUDY = register(Study(
    name="encoder_latency",
    order=5,
    notebook="notebooks/encoder_latency.ipynb",
    run=run,
    cells="presets",
    findings=findings,
    figures=(("encoder_latency", plot_latency, "p50 per encode call against merged tokens: eager, the graph runner "
              "(a CUDA graph on a GPU, emulated on a CPU) and transformers, with the FLOP and practical floors on a "
              "GPU (a CPU run is a stamped smoke test without floors)"),
             ("encoder_latency_phases", lambda g: plot_phases(g) if (g.metric == "replay_ms").any() else None,
              "Where the graph path's time goes: plan, metadata, staging, replay and copy-out (each phase's "
              "median with a sync around it; beside each bar their sum and the p50 of whole calls)"),
             ("encoder_latency_kernels", lambda g: plot_kernels(g) if (g.metric == "kernel_matmul_ms").any() else None,
              "The tower's device time by kernel category (one forward, profiled)"),
             ("encoder_latency_mixes", plot_mixes, "Realistic batches: per-image time of transformers, eager, the "
              "engines' budgets, planner budgets and policy auto")),
    key_numbers=key_numbers,
    key_caption="Encoder latency on {device}: p50 per encode call (ms) of each path, the FLOP floor and the practical "
                "floor, the graph path's speedup, and times as multiples of the floors",
    params=PARAMS,
    footprint=footprint,
    question="eager vs graph latency per model and token count, beside transformers' own vision model "
             "with the same weights, against the FLOP and practical floors, and where the time goes by kernel",
))
