"""The encoder_latency study's measurement: ``run(device, progress, **params)`` -> one tidy table."""
from __future__ import annotations

import gc
import statistics
import time

import numpy as np
import pandas as pd
import torch

from ...ceilings import attention_tflops, matmul_tflops
from ...config import VisionConfig
from ...checkpoints import resolve_config
from ...dtypes import dtype_name
from ...encoder import build_encoder
from ...floors import flop_floor_us, tower_flops
from ...kernel_profile import kernel_breakdown
from ...preprocess import PatchBatch, normalize_rows
from ...reference import cos_min, errors_in_place, hf_embeddings, hf_vision_model, rel_err
from ...budgets import Budgets
from ...planner import plan_budgets
from ...preprocess import preprocess
from ... import engines, limits
from ...runner import PHASES, EncoderGraphRunner
from ...samples import image_mix, mix_columns, with_folder
from ...timing import cpu_time_us, frozen_heap
from ...towers.weights import init_checkpoint_like
from .. import begin_run
from ..correctness.measure import TOLERANCE as CORRECT_TOL
from ..plotting import progress as show_progress
from ...results.tables import tidy
from .params import KERNEL_CATS, LATENCY_PATHS, METRICS, PARAMS

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
    return err, equal, _graph_ok(equal, err, dt)


def _graph_ok(equal: bool, err: float, dt) -> bool:
    return equal or err <= GRAPH_TOL.get(dt, GRAPH_TOL[torch.bfloat16])


# ours vs transformers, smallest row-wise cosine: fp32 agrees to ~1e-6 relative (cosine ~1 - 1e-12);
# in bf16 both sit ~1e-2 relative from the exact result, a cosine above 0.99 (a wrong normalization
# or weight gives far below 0.9)
COS_MIN = {torch.float32: 0.9999, torch.bfloat16: 0.99}


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


def _fresh_seed(seed: int, k: int) -> int:
    """The seed of fresh batch ``k``: the ones after the run's, wrapped within the seed cap (a run at the
    cap itself would otherwise draw its fresh batches with a seed no generator takes)."""
    return (seed + 1 + k) % (limits.current().seed + 1)


def build_models(cfg: VisionConfig, norm: str, dtype: torch.dtype, dev: torch.device, seed: int, reference: bool,
                 fused="auto", gemm: str = "cublas"):
    """Our encoder (placement tower) and, with ``reference``, transformers' vision model holding the
    same weights; both created directly on ``dev`` (no host-side init of ~0.7e9 parameters)."""
    with torch.device(dev):
        enc = build_encoder(cfg, placement="tower", norm=norm, dtype=dtype, device=dev, seed=None, fused=fused,
                            gemm=gemm)
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


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _release(dev: torch.device) -> None:
    """Give a cell's freed device memory back before the next cell (CUDA only: on a CPU a forced collection
    frees nothing the next cell needs and costs a large share of the study's time)."""
    if dev.type == "cuda":
        gc.collect()
        _sync(dev)
        torch.cuda.empty_cache()


def _agrees(cos: float, dt: torch.dtype) -> bool:
    """Whether ours and transformers' outputs agree: a finite row-wise cosine at least the dtype's COS_MIN."""
    return bool(np.isfinite(cos) and cos >= COS_MIN.get(dt, 0.99))


def _agrees_in_place(got: torch.Tensor, ref: torch.Tensor, dt, transformers: bool) -> bool:
    """`judge_graph`'s verdict (or, for transformers' output, `_agrees`'), computed on the outputs' device."""
    if transformers:
        return _agrees(errors_in_place(got, ref)[1], dt)
    return bool(torch.equal(got, ref)) or _graph_ok(False, errors_in_place(got, ref)[0], dt)


def _pinned(batch: PatchBatch, dev: torch.device) -> PatchBatch:
    """``batch`` in pinned host memory on CUDA, as engines batch multimodal inputs; as it is elsewhere."""
    return PatchBatch(batch.pixels.pin_memory(), batch.grid_thw) if dev.type == "cuda" else batch


def _median_phases(samples: list[dict]) -> dict:
    out = {f"{k}_ms": statistics.median(s.get(k, 0.0) for s in samples) * 1e3 for k in PHASES}
    out["phases_ms"] = statistics.median(sum(s.values()) for s in samples) * 1e3
    return out


def _timed(fn, reps: int, warmup: int, min_reps: int | None) -> dict:
    """``fn`` timed until its median is known (`cpu_time_us`, between ``min_reps`` and ``reps`` calls):
    p50 and p90, the calls it took and the median's 95% interval, in ms."""
    t = cpu_time_us(fn, reps=reps, warmup=warmup, min_reps=min_reps)
    return dict(p50_ms=t["p50_us"] / 1e3, p90_ms=t["p90_us"] / 1e3, reps_n=t["reps"],
                p50_ci_lo_ms=t["ci_lo_us"] / 1e3, p50_ci_hi_ms=t["ci_hi_us"] / 1e3)


def measure_cell(enc, hf, cfg: VisionConfig, batch: PatchBatch, tokens: int, images: int, reps: int,
                 warmup: int, breakdown: bool = False, min_reps: int | None = None) -> dict[str, dict]:
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
        eager_ok = _agrees(c, dt)
        out["transformers"] = dict(rel_err=rel_err(ref_out, hf_out), cos_min=c, ok=eager_ok)
        out["eager"]["ok"] = eager_ok
    graph_ok = graph_ok and eager_ok
    out["graph"]["ok"] = graph_ok
    del ref_out, graph_out, hf_out

    # ---- the timings, only of checked paths
    with torch.inference_mode():
        if eager_ok:
            out["eager"].update(_timed(eager, reps, warmup, min_reps))
            if hf is not None:
                out["transformers"].update(_timed(reference, reps, warmup, min_reps))
        if graph_ok:
            out["graph"].update(_timed(graph, reps, warmup, min_reps))
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
                warmup: int, min_reps: int | None = None) -> dict[str, dict]:
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
                _sync(dev)
                t0 = time.perf_counter()
                got = call()             # the shape's first call (policy auto measures its plans in it)
                _sync(dev)
                m["first_ms"] = (time.perf_counter() - t0) * 1e3
                st = runner.stats_frame()
                packs = st[~st.miss]
                m.update(replays=int((~packs.eager).sum()), eager_packs=int(packs.eager.sum()),
                         misses=int(st.miss.sum()), padded_rows=int(st.padded_rows.sum()),
                         valid_rows=int(st.valid_rows.sum()), budgets_n=len(runner.budgets),
                         largest_budget=int(runner.budgets[-1]))
                err, equal, ok = judge_graph(got, ref, dt)
                m.update(rel_err=err, bit_equal=equal, ok=ok)
                if runners[name][1] is None:     # policy auto: its race for this batch run out before timing
                    m["explore_calls"] = runner.settle(batch)
            elif name == "transformers":
                hf_out = call()
                c = cos_min(ref, hf_out)
                m.update(cos_min=c, rel_err=rel_err(ref, hf_out), ok=_agrees(c, dt))
                del hf_out
            else:
                m["ok"] = True
            if m["ok"]:
                m.update(_timed(call, reps, warmup, min_reps))
                m.update(image_p50_ms=m["p50_ms"] / n, image_p90_ms=m["p90_ms"] / n)
            out[name] = m
    return out


def measure_fresh(enc, hf, cfg: VisionConfig, batches: list[PatchBatch], runners: dict,
                  skip=()) -> dict[str, dict]:
    """Each strategy on a stream of batches of shapes it has not seen (what a server meets): every batch once, each
    call timed with the device synchronized around it. Per strategy: ``fresh_image_ms``, the whole stream's time
    per image, and ``fresh_p50_image_ms``, the median over the batches of a batch's time per image (a host hiccup
    in one call moves the sum, not the median). The strategies take turns first (batch k starts at the k-th), so
    none always meets a batch cold. Every output is checked against the eager one of its batch, as `measure_mix`
    checks: a strategy wrong on any batch, or in ``skip`` (wrong in the cell's own check), gets no time. Policy
    auto keeps what it learned before and along the stream; the host metadata the tower and a runner cache is
    dropped before each call, so no strategy gains from another's call on the same batch."""
    dev, dt = enc.device, enc.dtype
    calls = {"eager": lambda k: enc.encode(batches[k], path="eager")}
    if hf is not None:      # its input normalized on the host beforehand, as measure_mix times it
        hf_in = [(_pinned(PatchBatch(normalize_rows(b.pixels, cfg), b.grid_thw), dev).pixels, b.grid_thw.to(dev))
                 for b in batches]
        calls["transformers"] = lambda k: hf_embeddings(hf, hf_in[k][0].to(dev, non_blocking=True), hf_in[k][1])
    for name, (runner, policy) in runners.items():
        calls[name] = (lambda k, r=runner, pol=policy: r.encode(batches[k], policy=pol))
    calls = {name: call for name, call in calls.items() if name == "eager" or name not in skip}
    names = list(calls)
    seconds, right = {name: [] for name in names}, dict.fromkeys(names, True)
    with torch.inference_mode():
        for k in range(len(batches)):
            outs = {}
            for name in names[k % len(names):] + names[:k % len(names)]:
                enc.visual.forget_metadata()             # no strategy prepares a shape for the next one:
                if name in runners:                      # each pays its host metadata, as on a new shape
                    runners[name][0].forget_metadata()
                _sync(dev)
                t0 = time.perf_counter()
                outs[name] = calls[name](k)
                _sync(dev)
                seconds[name].append(time.perf_counter() - t0)
            ref = outs.pop("eager")                      # checked where the outputs are: only the verdict is kept
            for name, out in outs.items():
                right[name] = right[name] and _agrees_in_place(out, ref, dt, name == "transformers")
            del outs, ref
    images = sum(b.n_items for b in batches)
    return {name: dict(fresh_image_ms=sum(took) * 1e3 / images,
                       fresh_p50_image_ms=statistics.median(s / b.n_items for s, b in zip(took, batches)) * 1e3,
                       fresh_batches=len(batches)) for name, took in seconds.items() if right[name]}


def _mix_runners(enc, cfg: VisionConfig, mix: str, engine) -> dict:
    """The planner's runner for ``mix`` beside the shared engine-budget runner (``engine``, built
    with policy auto once per preset: its 'always' calls are the engines' behaviour)."""
    eb = engine.budgets
    planned = plan_budgets(mix, max_graphs=len(eb), cfg=cfg)
    items = engines.get(engines.NEWEST).max_items(planned)
    planner = EncoderGraphRunner(enc, budgets=list(Budgets.of(planned).holding(items)), buffer_dtype=torch.uint8,
                                 max_items=items, policy="always")
    return {"graph_engine": (engine, "always"), "graph_planner": (planner, "always"), "graph_auto": (engine, None)}


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Time every (preset, tokens, images) cell on the three paths; returns the tidy long table.

    params: see PARAMS (defaults: the device's profile)."""
    s = begin_run(PARAMS, "encoder_latency", device, params)
    dev, p, dt, label = s.device, s.params, s.dtype, s.label
    p["mixes"] = with_folder(p["mixes"], p["image_folder"])      # the folder's mix joins the named ones
    t0 = time.perf_counter()
    tflops = matmul_tflops(dev)
    rates_s = time.perf_counter() - t0       # where a run's seconds go: this, build_s, runner_s, cell_s, fresh_s
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
                               fused=False if p["fused"] == "off" else "auto", gemm=p["gemm"])
        fused_on, attention, gemm = enc.visual.kernels.fused, enc.visual.kernels.backend, enc.visual.kernels.gemm
        mlp_quack = gemm == "quack"
        _release(dev)
        build_s = time.perf_counter() - t0
        bar.update()
        for tokens, images in cells:
            t_cell = time.perf_counter()
            batch = latency_batch(cfg, tokens, images, gen)
            if dev.type == "cuda":   # engines batch multimodal inputs into pinned host memory
                batch = PatchBatch(batch.pixels.pin_memory(), batch.grid_thw)
            per = tokens // images
            flops = tower_flops(cfg, [per * cfg.merge_unit] * images)
            floor_ms = flop_floor_us(flops["total"], tflops) / 1e3
            t0 = time.perf_counter()
            rates = practical_rates(cfg, per * cfg.merge_unit, images, dev, dt)
            ceiling_s = time.perf_counter() - t0
            practical_ms = (flop_floor_us(flops["matmul"], tflops) + flop_floor_us(flops["attention_full"], rates[0])
                            + (flop_floor_us(flops["attention_window"], rates[1]) if rates[1] else 0.0)) / 1e3
            res = measure_cell(enc, hf, cfg, batch, tokens, images, p["reps"], p["warmup"], p["breakdown"],
                               p["min_reps"])
            eager_p50 = res["eager"].get("p50_ms", float("nan"))
            hf_p50 = res.get("transformers", {}).get("p50_ms", float("nan"))
            common = dict(study="encoder_latency", case="exact", preset=preset, family=cfg.family, depth=cfg.depth,
                          dtype=dtype_name(dt), norm=p["norm"], attention=attention, gemm=gemm, device=label, tokens=tokens,
                          images=images,
                          tokens_per_image=per, grid="x".join(map(str, grid_for(per, cfg))))
            for path in LATENCY_PATHS:
                if path not in res:
                    continue
                m = dict(res[path])
                p50 = m.get("p50_ms", float("nan"))
                m.update(practical_floor_ms=practical_ms, x_practical_floor=p50 / practical_ms,
                         attn_tflops_full=rates[0], **({"attn_tflops_window": rates[1]} if rates[1] else {}))
                if path != "transformers":
                    m.update(fused=fused_on, mlp_quack=mlp_quack)
                m.update(floor_ms=floor_ms, x_floor=p50 / floor_ms, speedup=eager_p50 / p50,
                         speedup_vs_transformers=hf_p50 / p50, flops_matmul=flops["matmul"],
                         flops_attention_full=flops["attention_full"],
                         flops_attention_window=flops["attention_window"], matmul_tflops=tflops)
                if path == "eager":
                    m.update(build_s=build_s, rates_s=rates_s, ceiling_s=ceiling_s, cell_s=time.perf_counter() - t_cell)
                rows.append({**common, "path": path, **m})
            bar.update()
        if p["mixes"]:
            t0 = time.perf_counter()
            policy = engines.with_cap(p["engine"], p["engine_cap"])
            eb = policy.budgets(p["engine_max_budget"])
            engine = EncoderGraphRunner(enc, budgets=eb, buffer_dtype=torch.uint8, engine=policy,
                                        max_items=policy.max_items(eb, p["engine_max_budget"]))
            engine_s = time.perf_counter() - t0
            for mix in p["mixes"]:
                t0 = time.perf_counter()
                runners = _mix_runners(enc, cfg, mix, engine)     # captured once per mix, for every item count
                planner_s = time.perf_counter() - t0
                for n in p["mix_items"]:
                    t_cell = time.perf_counter()
                    batch = _pinned(preprocess(image_mix(mix, n, seed=p["seed"], resized=True, cfg=cfg), cfg), dev)
                    with frozen_heap():  # the collector off the models' heap, as engines run (timing.frozen_heap)
                        res = measure_mix(enc, hf, cfg, batch, runners, p["reps"], p["warmup"], p["min_reps"])
                        t_fresh = time.perf_counter()
                        if p["fresh"]:   # the same mix and item count, drawn anew: shapes no call has seen
                            fresh = [_pinned(preprocess(image_mix(mix, n, seed=_fresh_seed(p["seed"], k),
                                                                  resized=True, cfg=cfg), cfg), dev)
                                     for k in range(p["fresh"])]
                            wrong = {path for path, m in res.items() if not m.get("ok", True)}
                            for path, m in measure_fresh(enc, hf, cfg, fresh, runners, skip=wrong).items():
                                res.setdefault(path, {}).update(m)
                    res["eager"].update(cell_s=time.perf_counter() - t_cell, fresh_s=time.perf_counter() - t_fresh)
                    common = dict(study="encoder_latency", case="mix", preset=preset, family=cfg.family,
                                  depth=cfg.depth, dtype=dtype_name(dt), norm=p["norm"], attention=attention,
                                  gemm=gemm, device=label, **mix_columns(mix), images=n, tokens=batch.n_rows // cfg.merge_unit,
                                  engine=policy.name)
                    for path, m in res.items():
                        if path in ("graph_engine", "graph_auto"):
                            m["runner_s"] = engine_s
                        elif path == "graph_planner":
                            m["runner_s"] = planner_s
                        rows.append({**common, "path": path, **m})
                    bar.update()
                runners = None
                _release(dev)
            engine = None
        del enc, hf
        _release(dev)
    bar.close()
    return tidy(pd.DataFrame(rows), METRICS)
