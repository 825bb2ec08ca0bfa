"""The padding_waste study's measurement: ``run(device, progress, **params)`` -> one tidy table."""
from __future__ import annotations


import numpy as np
import pandas as pd
import torch

from ...cuda_memory import pool_segment_bytes
from ...dtypes import dtype_name
from ...encoder import build_encoder
from ...floors import tower_flops
from ...norms import make_norm
from ...budgets import Budgets
from ...planner import expected_padding, geometric_budgets, graph_pool_bytes, plan_budgets, running_max
from ...preprocess import PatchBatch, preprocess
from ... import engines
from ...budget_judge import out_of_sample
from ...runner import EncoderGraphRunner, default_budgets
from ...samples import (get_mix, image_mix, mix_columns, mix_distribution, mix_entries,
                       with_folder)
from ...timing import cpu_time_us, cuda_event_ms, time_us
from .. import begin_run
from ..plotting import progress as show_progress
from ...results.tables import tidy
from .params import BUDGET_SETS, METRICS, NORM_FILLS, PARAMS


# ---- budget sets -------------------------------------------------------------------------------

ENGINE_RANGE = 16384     # an engine set's model budget range (vLLM: the scheduler's token budget), before its cap
ENGINE_SETS = tuple(s for s in BUDGET_SETS if s in engines.ENGINES)

def budget_sets(dist: dict[int, float], names, latency: dict[int, float] | None = None) -> dict[str, list[int]]:
    """{set name: ascending budgets} for a mix's token distribution (tokens -> probability)."""
    largest = max(dist)
    pow2 = default_budgets(largest)
    out = {}
    for name in names:
        if name == "pow2":
            out[name] = pow2
        elif name in engines.ENGINES:     # over the model's whole range, as the engine captures it (then its cap)
            out[name] = engines.get(name).budgets(max(largest, ENGINE_RANGE))
        elif name == "geometric":
            out[name] = geometric_budgets(largest)
        elif name == "planner":
            out[name] = plan_budgets(dist, max_graphs=len(pow2))
        elif name == "planner_time":
            if latency is None:
                raise ValueError("budget set 'planner_time' needs the replay-time table")
            out[name] = plan_budgets(dist, max_graphs=len(pow2), latency=running_max(latency))
        else:
            raise ValueError(f"unknown budget set {name!r}; valid: {BUDGET_SETS}")
    return out


# ---- measurements ------------------------------------------------------------------------------

def _wall_ms(fn, reps: int, warmup: int = 1) -> dict:
    """`timing.cpu_time_us` (host wall time, the device synchronized around each call) in ms."""
    t = cpu_time_us(fn, reps=reps, warmup=warmup)
    return dict(p50=t["p50_us"] / 1e3, p90=t["p90_us"] / 1e3)


def _item_batch(cfg, tokens: int, gen: torch.Generator) -> PatchBatch:
    """One image of exactly ``tokens`` merged tokens (grid 1 x 2 x 2*tokens patches), random pixels."""
    m = cfg.merge_size
    grid = torch.tensor([[1, m, m * tokens]])
    rows = cfg.merge_unit * tokens
    return PatchBatch(torch.randint(0, 256, (rows, cfg.patch_dim), dtype=torch.uint8, generator=gen), grid)


def _stage(runner, budget: int, item: PatchBatch) -> None:
    """Load ``item`` into budget ``budget``'s static buffers, as `runner.encode` does before a replay."""
    cap = runner.graphs[budget]
    cap.meta.copy_(runner.budget_metadata(item.grid_thw, budget, "cpu"))
    runner.stage(cap, item.pixels.to(runner.device))


def _replay_ms(runner, budget: int, reps: int) -> dict:
    cap = runner.graphs[budget]
    dev = runner.device
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            times = cuda_event_ms(lambda: runner.replay(cap), reps, warmup=1, sync_each=True)
        return dict(p50=float(np.median(times)), p90=float(np.quantile(times, 0.9)))
    return _wall_ms(lambda: runner.replay(cap), reps, warmup=1)


class NormTimes:
    """The norm's time over a budget's rows, all rows (tower placement) vs n_valid-aware, measured
    at NORM_FILLS and interpolated linearly in the valid fraction."""

    def __init__(self, name: str, cfg, dt, dev, reps: int):
        self.mod = make_norm(name, cfg, check_values=False).to(dev)
        self.name, self.cfg, self.dt, self.dev, self.reps = name, cfg, dt, dev, reps
        self.cache: dict[int, tuple[float, np.ndarray]] = {}

    def _measure(self, budget: int):
        rows = budget * self.cfg.merge_unit
        x = torch.randint(0, 256, (rows, self.cfg.patch_dim), dtype=torch.uint8, device=self.dev)
        y = torch.empty(rows, self.cfg.patch_dim, dtype=self.dt, device=self.dev)
        with torch.inference_mode():
            t_all = time_us(lambda: self.mod(x, self.dt, out=y), self.dev, reps=self.reps)["p50_us"]
            valid = []
            for f in NORM_FILLS:
                n = int(round(f * rows))
                if self.name.startswith("triton"):      # reads n_valid on the device, skips padding tiles
                    nv = torch.tensor(n, dtype=torch.int32, device=self.dev)
                    t = time_us(lambda nv=nv: self.mod(x, self.dt, out=y, n_valid=nv), self.dev, reps=self.reps)
                elif n == 0:
                    valid.append(0.0)
                    continue
                else:                                   # the eager norm over the valid rows only
                    t = time_us(lambda n=n: self.mod(x[:n], self.dt, out=y[:n]), self.dev, reps=self.reps)
                valid.append(t["p50_us"])
        return t_all, np.array(valid)

    def __call__(self, budget: int, valid_rows: int) -> tuple[float, float]:
        if budget not in self.cache:
            self.cache[budget] = self._measure(budget)
        t_all, valid = self.cache[budget]
        frac = valid_rows / (budget * self.cfg.merge_unit)
        return t_all, float(np.interp(frac, NORM_FILLS, valid))


def attention_padding_flops(cfg, backend: str, budget_rows: int, seqs: list[int]) -> int:
    """Attention FLOPs a replay spends on padding: none for kernels that skip rows past
    cu_seqlens[-1] (varlen, loop); the dense square minus the valid blocks for 'masked'."""
    if backend != "masked":
        return 0
    full = tower_flops(cfg, [budget_rows])
    valid = tower_flops(cfg, seqs) if seqs else dict(attention_full=0, attention_window=0)
    return int(full["attention_full"] + full["attention_window"] - valid["attention_full"] - valid["attention_window"])


def _pool_bytes(runner) -> float:
    if runner.backend != "cuda" or runner.pool is None:
        return float("nan")
    torch.cuda.synchronize(runner.device)
    got = pool_segment_bytes(runner.pool)
    return float("nan") if got is None else float(got)


def size_rows(common: dict, mix: str, cfg) -> list[dict]:
    """The sizes of ``mix`` (case 'sizes'): per entry its frames, height, width, merged tokens for
    ``cfg`` and share of the items; for a folder mix also its number of images and the folder."""
    entries = mix_entries(mix, cfg)
    total = sum(e["weight"] for e in entries)
    folder = get_mix(mix).folder
    return [dict(common, case="sizes", frames=e["frames"], height=e["height"], width=e["width"], tokens=e["tokens"],
                 share=e["weight"] / total, **({"folder": folder, "images": e["weight"]} if folder else {}))
            for e in entries]


def _runner_cell(enc, cfg, backend: str, batch: PatchBatch, ref, rb: list[int], m: int, p: dict, dt,
                 norm_times, engine: str | None = None) -> dict:
    """One runner over budgets ``rb`` holding ``m`` items on the mix's drawn ``batch``: its row's measurements
    (padding through the real runner, the norm's time and the tower's FLOPs on it, time, pool, error against
    ``ref``, the eager output)."""
    from ...reference import rel_err

    with torch.inference_mode():
        # the table's runner has compiled every kernel and warmed the capture stream
        runner = EncoderGraphRunner(enc, rb, buffer_dtype=torch.uint8, max_items=m, policy="always",
                                    warmup=1, exact_capture="first_use", engine=engine)
        pool = _pool_bytes(runner)
        runner.prepare(batch)            # host metadata and exact-fit graphs: the next call is warm
        pool_used = _pool_bytes(runner)
        outs = []

        def call(r=runner, b=batch):
            r.reset_stats()
            outs.clear()                 # one output alive at a time
            outs.append(r.encode(b))
        # the timed calls are the checked ones (the last one's output and stats)
        timing = _wall_ms(call, max(1, p["reps"] // 3), warmup=0)
        out, stats = outs[-1], runner.stats_frame()
        del outs
    replays = stats[~stats.miss]
    budget_rows = (replays.valid_rows + replays.padded_rows)
    padded_frac = float(replays.padded_rows.sum() / budget_rows.sum()) if len(replays) else float("nan")
    per = (replays.padded_rows / budget_rows) if len(replays) else pd.Series([np.nan])
    norm_all = norm_valid = mm_pad = att_pad = total = 0.0
    for r in replays.itertuples():
        a, v = norm_times(int(r.budget), int(r.valid_rows))
        norm_all, norm_valid = norm_all + a, norm_valid + v
        brows = int(r.budget) * cfg.merge_unit
        full = tower_flops(cfg, [brows])
        mm_pad += full["matmul"] - tower_flops(cfg, [int(r.valid_rows)])["matmul"]
        att_pad += attention_padding_flops(cfg, backend, brows, [int(r.valid_rows)])
        total += full["total"]
    row = dict(case="runner", max_items=m, budgets=",".join(map(str, rb)),
               padded_frac=padded_frac, padded_frac_replay_mean=float(per.mean()),
               padded_frac_replay_max=float(per.max()), replays_per_image=len(replays) / batch.n_items,
               misses=int(stats.miss.sum()), items=batch.n_items, encode_ms_per_image=timing["p50"] / batch.n_items,
               norm_us_all=norm_all, norm_us_valid=norm_valid, norm_us_padding=norm_all - norm_valid,
               matmul_flops_padding=mm_pad, attention_flops_padding=att_pad,
               flops_padding_frac=(mm_pad + att_pad) / total if total else float("nan"),
               pool_bytes=pool, pool_used_bytes=pool_used,
               pool_model_bytes=graph_pool_bytes(cfg, rb, dtype=dt, max_items=m, norm=p["norm"],
                                                 buffer_dtype=torch.uint8),
               rel_err_vs_eager=rel_err(out.float(), ref))
    del runner, out
    if enc.device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Measure every (mix, budget set, max_items) cell; returns the tidy long table.

    params: see PARAMS (defaults: the device's profile)."""
    return begin_run(PARAMS, "padding_waste", device, params).per_preset(lambda s: _measure(s, progress))


def _measure(s, progress: bool) -> pd.DataFrame:
    """One preset's cells (``s.params["preset"]``)."""
    dev, p, dt, cfg, label = s.device, s.params, s.dtype, s.config(), s.label
    p["mixes"] = with_folder(p["mixes"], p["image_folder"])      # the folder's mix joins the named ones
    common = dict(study="padding_waste", preset=p["preset"], family=cfg.family, depth=cfg.depth,
                  dtype=dtype_name(dt), device=label)
    enc = build_encoder(cfg, placement="tower", norm=p["norm"], dtype=dt, device=dev, seed=p["seed"],
                        check_inputs=False)
    backend = common["attention"] = enc.visual.kernels.backend
    gen = torch.Generator().manual_seed(p["seed"])
    dists = {mix: dict(mix_distribution(mix, cfg)) for mix in p["mixes"]}
    largest = max(max(d) for d in dists.values())
    table_budgets = sorted(set(default_budgets(largest)) | set(geometric_budgets(largest)))
    n_cells = len(p["mixes"]) * len(p["budget_sets"]) * len(p["max_items"])
    bar = show_progress(total=len(table_budgets) + n_cells, desc=f"padding_waste {p['preset']}", enabled=progress)
    rows: list[dict] = []

    # 1. the replay table: every budget of the pow2 and geometric ladders, full; and the edge cases
    lat: dict[int, float] = {}
    with torch.inference_mode():
        # the table replays general graphs only (the edge cases are padded): no exact-fit variants
        ladder = EncoderGraphRunner(enc, table_budgets, buffer_dtype=torch.uint8, max_items=1, policy="always",
                                    exact_fit=False)
        for b in table_budgets:
            _stage(ladder, b, _item_batch(cfg, b, gen))
            t = _replay_ms(ladder, b, p["reps"])
            lat[b] = t["p50"]
            rows.append(dict(common, case="replay", budget=b, replay_ms=t["p50"], replay_p90_ms=t["p90"]))
            bar.update()
        pow2 = default_budgets(largest)
        for prev, b in zip(pow2, pow2[1:]):
            item = _item_batch(cfg, prev + 1, gen)
            _stage(ladder, b, item)
            edge = _replay_ms(ladder, b, p["reps"])
            item = item.to(dev)
            eager = _wall_ms(lambda item=item: enc.encode_eager(item), p["reps"])
            rows.append(dict(common, case="edge", budget=b, prev_budget=prev, valid_tokens=prev + 1,
                             edge_replay_ms=edge["p50"], prev_full_replay_ms=lat[prev], eager_ms=eager["p50"]))
        del ladder
    norm_times = NormTimes(p["norm"], cfg, dt, dev, p["reps"])

    # 2. per mix: the exact expectation per set, then the real runner on drawn items
    for mix in p["mixes"]:
        dist = dists[mix]
        named = mix_columns(mix)
        rows += size_rows(dict(common, **named), mix, cfg)
        sets = budget_sets(dist, p["budget_sets"], latency=lat)
        # out of sample: the planner fitted on one draw of a traffic around the mix, judged on others, beside the
        # newest engine's grid (`budget_judge`): the exact expectation above is the planner's own sizes
        for r in out_of_sample(mix, cfg, ENGINE_SETS[0], ENGINE_RANGE).to_dict("records"):
            rows.append(dict(common, **named, case="out_of_sample", judged_set=r["set"], sample=r["sample"],
                             engine=ENGINE_SETS[0], graphs=r["budgets_n"], largest_budget=r["largest_budget"],
                             padded_frac_judged=r["padded_frac"], eager_frac_judged=r["eager_frac"],
                             rows_ratio=r["rows_ratio"]))
        for k in range(1, len(default_budgets(max(dist))) + 1):    # the planner's padding per graph count
            e = expected_padding(dist, plan_budgets(dist, max_graphs=k))
            rows.append(dict(common, **named, case="curve", budget_set="planner", max_graphs=k,
                             padded_frac_expected=e["padded_frac"], padded_tokens_expected=e["padded_tokens"]))
        items = image_mix(mix, p["n_items"], seed=p["seed"], resized=True, cfg=cfg)
        batch = preprocess(items, cfg)
        with torch.inference_mode():
            ref = enc.encode_eager(batch.to(dev)).float()
        cells: dict[tuple, list[tuple[int, dict]]] = {}   # (runner budgets, max_items) -> [(its row's slot, key)]
        for set_name, budgets in sets.items():
            # expected replay time: the replay table (its running maximum, as the planner reads it)
            # interpolated at each item's budget
            e = expected_padding(dist, budgets, latency=running_max(lat))
            key = dict(common, **named, budget_set=set_name, budgets=",".join(map(str, budgets)))
            rows.append(dict(key, case="expected", padded_frac_expected=e["padded_frac"],
                             padded_tokens_expected=e["padded_tokens"], miss_frac_expected=e["miss_frac"],
                             expected_replay_ms=e["expected_time"], graphs=len(budgets), largest_budget=budgets[-1],
                             pool_model_bytes=graph_pool_bytes(cfg, budgets, dtype=dt, max_items=1, norm=p["norm"],
                                                               buffer_dtype=torch.uint8)))
            engine = set_name if set_name in engines.ENGINES else None      # its packing, not only its grid
            # an engine's set replays with its own items per replay (more items than that: one eager forward)
            for m in [engines.get(engine).max_items(budgets, ENGINE_RANGE)] if engine else p["max_items"]:
                cells.setdefault((tuple(Budgets.of(budgets).holding(m)), m, engine), []).append((len(rows), key))
                rows.append({})          # the runner's row, in this place once it has run
        # one runner per distinct (budgets, max_items, packing) of the mix, built and measured once for every set
        # that gives it (the planner's two sets often agree); one alive at a time
        for (rb, m, engine), slots in cells.items():
            measured = _runner_cell(enc, cfg, backend, batch, ref, list(rb), m, p, dt, norm_times, engine)
            for slot, key in slots:
                rows[slot] = dict(key, **measured)
                bar.update()
        del batch, ref
    bar.close()
    return tidy(pd.DataFrame(rows), METRICS)
