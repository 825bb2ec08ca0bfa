"""Padding waste: what fixed CUDA-graph budgets spend on padding rows, and a planner that spends less.

A graph runner replays the smallest captured budget that fits each pack of items; the rows between
the pack and the budget are padding. The engines capture powers of two from 64 and never measure
what that costs. For each image mix (data/image_mixes.toml) and budget set, this study measures:

- **padding**: padded fraction of rows, exactly from the mix's distribution for single items, and
  through the real runner (`EncoderGraphRunner`: CUDA graphs on a GPU, emulated on a CPU) on items
  drawn from the mix, single (``max_items=1``) and packed; replays per image and graph misses;
- **norm time on padding**: the tower placement normalizes every row of the budget; an
  ``n_valid``-aware norm (Triton norms skip padding tiles; the eager norm over the valid rows
  only, as placement ``runner`` does) does not. Both are measured per budget at 0, 50 and 100 %
  valid rows (graph replays on CUDA, host time on the CPU) and read per replay by linear
  interpolation in the valid fraction;
- **tower FLOPs on padding**, counted from the config (`workbench.floors.tower_flops`): the
  matmuls run over every row; attention costs nothing on padding rows with the kernels that
  leave rows past ``cu_seqlens[-1]`` out (``varlen``, ``loop``), and the whole square with the
  dense ``masked`` backend;
- **time**: the replay of each budget, full and partly filled (an item one token larger than
  the next smaller power of two), against the full smaller budget and against eager for that
  item; the expected replay time of each set (single items, from the replay table) and the
  measured `runner.encode` time per image on the drawn items;
- **pool**: the graph pool each set needs, modelled (`workbench.planner.graph_pool_bytes`) and,
  on CUDA, measured from the allocator's segments of the runner's pool: ``pool_bytes`` right
  after construction (every budget's general graph: what the model models), and
  ``pool_used_bytes`` once the runner is prepared for the drawn items, which also holds the
  exact-fit graphs they use (captured then here: `EncoderGraphRunner(exact_capture="first_use")`,
  `EncoderGraphRunner.prepare`).

Cost on a GPU: full attention makes a long item expensive (a 12 MP photo is one sequence of
more than ten thousand tokens on Qwen3-VL; its replay times on the H200 are in
results/reference/README.md), and every runner cell captures its set's budgets and encodes the
drawn items. So the runners here skip what a sweep of short-lived runners
does not need: the replay-table runner captures no exact-fit graphs (it replays the general
ones), the cells' runners warm up once per budget (the table's runner has already compiled every
kernel and warmed the capture stream) and capture exact-fit graphs only where a pack uses them,
and `EncoderGraphRunner.prepare` readies the drawn items (host metadata, those graphs), so the
timed encode is also the checked one instead of a second pass. ``n_items`` sets the rest of the
cost.

Your own images: ``image_folder`` (an absolute path) adds one more mix, ``folder:<its name>``: the
folder's images (sub-folders too) at their own sizes, each size weighted by its number of images
(`workbench.samples.get_mix`); the runner gets the real images, resized. Every row of that mix
carries the folder's ``fingerprint`` (image count and a hash of names and sizes), and the
``sizes`` rows (every mix's sizes, tokens and shares; for the folder its path and image counts)
draw the size distribution.

Budget sets: ``pow2`` (the engines' powers of two from 64 up to the largest item), ``geometric``
(a denser ladder, ratio sqrt 2), ``planner`` (`wb.plan_budgets`: the fewest expected padded tokens
with as many graphs as pow2) and ``planner_time`` (the same, minimizing expected replay time from
the replay table measured in this run).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ..config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY, VisionConfig
from ..checkpoints import resolve_config
from ..cuda_memory import pool_segment_bytes
from ..dtypes import dtype_name
from ..encoder import build_encoder
from ..floors import tower_flops
from ..formatting import fmt_us
from ..norms import REAL_NORMS, make_norm
from ..budgets import Budgets
from ..planner import expected_padding, geometric_budgets, graph_pool_bytes, plan_budgets, running_max
from ..preprocess import PatchBatch, preprocess
from ..runner import EncoderGraphRunner, default_budgets
from ..samples import (MIX_NAMES, check_image_folder, get_mix, image_mix, mix_columns, mix_distribution, mix_entries,
                       with_folder)
from ..timing import cpu_time_us, cuda_event_ms, time_us
from . import Study, begin_run, register
from .footprint import Footprint, itemsize, largest, tower_bytes
from .params import Param, ParamSpec
from .plotting import (graph_name, is_cpu, labelled_runs, legend_right, legend_under, per_run, plain_log_ticks,
                       run_label, stamp_cpu, value_ticks)
from .plotting import progress as show_progress
from .tables import tidy, wide

BUDGET_SETS = ("pow2", "geometric", "planner", "planner_time")
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


# ---- budget sets -------------------------------------------------------------------------------

def budget_sets(dist: dict[int, float], names, latency: dict[int, float] | None = None) -> dict[str, list[int]]:
    """{set name: ascending budgets} for a mix's token distribution (tokens -> probability)."""
    largest = max(dist)
    pow2 = default_budgets(largest)
    out = {}
    for name in names:
        if name == "pow2":
            out[name] = pow2
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


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Measure every (mix, budget set, max_items) cell; returns the tidy long table.

    params: see PARAMS (defaults: the device's profile)."""
    return begin_run(PARAMS, "padding_waste", device, params).per_preset(lambda s: _measure(s, progress))


def _measure(s, progress: bool) -> pd.DataFrame:
    """One preset's cells (``s.params["preset"]``)."""
    from ..reference import rel_err

    dev, p, dt, cfg, label = s.device, s.params, s.dtype, s.config(), s.label
    p["mixes"] = with_folder(p["mixes"], p["image_folder"])      # the folder's mix joins the named ones
    common = dict(study="padding_waste", preset=p["preset"], family=cfg.family, depth=cfg.depth,
                  dtype=dtype_name(dt), device=label)
    enc = build_encoder(cfg, placement="tower", norm=p["norm"], dtype=dt, device=dev, seed=p["seed"],
                        check_inputs=False)
    backend = enc.visual.kernels.backend
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
        for k in range(1, len(default_budgets(max(dist))) + 1):    # the planner's padding per graph count
            e = expected_padding(dist, plan_budgets(dist, max_graphs=k))
            rows.append(dict(common, **named, case="curve", budget_set="planner", max_graphs=k,
                             padded_frac_expected=e["padded_frac"], padded_tokens_expected=e["padded_tokens"]))
        items = image_mix(mix, p["n_items"], seed=p["seed"], resized=True, cfg=cfg)
        batch = preprocess(items, cfg)
        with torch.inference_mode():
            ref = enc.encode_eager(batch.to(dev)).float()
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
            for m in p["max_items"]:
                rb = list(Budgets.of(budgets).holding(m))
                with torch.inference_mode():
                    # the table's runner has compiled every kernel and warmed the capture stream
                    runner = EncoderGraphRunner(enc, rb, buffer_dtype=torch.uint8, max_items=m, policy="always",
                                                warmup=1, exact_capture="first_use")
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
                rows.append(dict(key, case="runner", max_items=m, budgets=",".join(map(str, rb)),
                                 padded_frac=padded_frac, padded_frac_replay_mean=float(per.mean()),
                                 padded_frac_replay_max=float(per.max()), replays_per_image=len(replays) / batch.n_items,
                                 misses=int(stats.miss.sum()), items=batch.n_items,
                                 encode_ms_per_image=timing["p50"] / batch.n_items,
                                 norm_us_all=norm_all, norm_us_valid=norm_valid, norm_us_padding=norm_all - norm_valid,
                                 matmul_flops_padding=mm_pad, attention_flops_padding=att_pad,
                                 flops_padding_frac=(mm_pad + att_pad) / total if total else float("nan"),
                                 pool_bytes=pool, pool_used_bytes=pool_used, pool_model_bytes=graph_pool_bytes(cfg, rb, dtype=dt, max_items=m, norm=p["norm"],
                                                                                    buffer_dtype=torch.uint8),
                                 rel_err_vs_eager=rel_err(out.float(), ref)))
                del runner, out
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                bar.update()
        del batch, ref
    bar.close()
    return tidy(pd.DataFrame(rows), METRICS)


# ---- presentation ---------------------------------------------------------------------------

SET_COLORS = {"pow2": "#9e9e9e", "geometric": "#90caf9", "planner": "#1565c0", "planner_time": "#2e7d32"}


def padding_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, device, preset, mix, budget set): graphs, expected padded fraction (single items),
    expected replay time, and the runner's measured padded fraction and time per image per max_items."""
    w = wide(table)
    exp = w[w.case == "expected"]
    run_rows = w[w.case == "runner"]
    keys = [c for c in ("run", "reference", "device", "preset", "mix", "budget_set") if c in w]
    out = exp[keys + ["graphs", "budgets", "padded_frac_expected", "expected_replay_ms"]].copy()
    for m, g in run_rows.groupby("max_items"):
        g = g.set_index(keys)
        out = out.join(g[["padded_frac", "encode_ms_per_image"]].rename(columns={
            "padded_frac": f"padded_frac (runner, max_items={int(m)})",
            "encode_ms_per_image": f"ms/image (runner, max_items={int(m)})"}), on=keys)
    order = {s: i for i, s in enumerate(BUDGET_SETS)}
    return out.sort_values(keys[:-1] + ["budget_set"], key=lambda s: s.map(order) if s.name == "budget_set" else s
                           ).reset_index(drop=True)


def plot_padding(g: pd.DataFrame):
    """Per mix, each budget set's padded fraction: bars for single items (exact, from the mix's
    distribution), markers for the real runner on drawn items (single and packed)."""
    import matplotlib.pyplot as plt

    w = wide(g)
    exp = w[w.case == "expected"]
    runs = w[w.case == "runner"]
    mixes = list(dict.fromkeys(exp.mix))
    sets = [s for s in BUDGET_SETS if s in set(exp.budget_set)]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(mixes) * len(sets) / 2), 4.6))
    width = 0.8 / max(1, len(sets))
    markers = ["o", "^", "s", "D"]
    for j, s in enumerate(sets):
        xs = np.arange(len(mixes)) + (j - (len(sets) - 1) / 2) * width
        vals = [exp[(exp.mix == m) & (exp.budget_set == s)].padded_frac_expected.mean() * 100 for m in mixes]
        graphs = [exp[(exp.mix == m) & (exp.budget_set == s)].graphs.mean() for m in mixes]
        ax.bar(xs, vals, width * 0.95, color=SET_COLORS.get(s), label=f"{s} (single items, exact)")
        for x, v, n in zip(xs, vals, graphs):
            ax.text(x, v + 0.5, f"{v:.0f}%\n{int(n)}g", ha="center", va="bottom", fontsize=6)
        for k, (m_items, rg) in enumerate(runs[runs.budget_set == s].groupby("max_items")):
            ys = [rg[rg.mix == m].padded_frac.mean() * 100 for m in mixes]
            ax.scatter(xs, ys, marker=markers[k % len(markers)], color="k", s=14, zorder=3,
                       label=f"runner, max_items={int(m_items)}" if j == 0 else None)
    ax.set_xticks(np.arange(len(mixes)), mixes, fontsize=8)
    ax.set_ylabel("padded rows (% of replayed rows)")
    ax.set_title(f"Padding per budget set and image mix (g = graphs) ({run_label(g)})", fontsize=10)
    legend_right(ax)
    ax.set_ylim(0, max(10.0, ax.get_ylim()[1] * 1.15))
    return fig


def plot_replay(g: pd.DataFrame):
    """Replay time per budget (full), and for each power-of-two step an item one token larger than
    the smaller budget: its replay in the larger budget vs the smaller budget full vs eager. A CPU
    run (emulated replays, host times) is stamped as a smoke test."""
    import matplotlib.pyplot as plt

    w = wide(g)
    rep = w[w.case == "replay"].sort_values("budget")
    edge = w[w.case == "edge"].sort_values("budget")
    cpu = is_cpu(w)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.plot(rep.budget, rep.replay_ms, "-o", color="#1565c0", ms=3, label=f"{graph_name(cpu)} replay, budget full")
    if not edge.empty:
        ax.scatter(edge.valid_tokens, edge.edge_replay_ms, marker="^", color="#c62828", zorder=3,
                   label="item of (smaller power of two + 1) tokens, replayed in the next budget")
        ax.scatter(edge.valid_tokens, edge.eager_ms, marker="x", color="k", zorder=3, label="the same item, eager")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    value_ticks(ax.xaxis, [b for b in rep.budget.astype(int) if b & (b - 1) == 0])    # the powers of two
    ax.set_xlabel("merged tokens (budget, or item size; log)")
    ax.set_ylabel("ms (p50, log)")
    ax.set_title(f"What padding to the next budget costs ({run_label(g)})", fontsize=10)
    legend_right(ax)
    if cpu:
        stamp_cpu(ax)
    return fig


def plot_curve(g: pd.DataFrame):
    """Per mix: the planner's expected padded fraction (single items) against the number of graphs
    it may use, with the powers of two and the geometric ladder at their own graph counts."""
    import matplotlib.pyplot as plt

    w = wide(g)
    curve = w[w.case == "curve"]
    exp = w[w.case == "expected"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, (mix, c) in enumerate(curve.groupby("mix", sort=True)):
        c = c.sort_values("max_graphs")
        color = f"C{i}"
        ax.plot(c.max_graphs, c.padded_frac_expected * 100, "-o", ms=3, color=color, label=f"{mix}: planner")
        for set_name, marker in (("pow2", "s"), ("geometric", "^")):
            e = exp[(exp.mix == mix) & (exp.budget_set == set_name)]
            if not e.empty:
                ax.scatter(e.graphs, e.padded_frac_expected * 100, marker=marker, color=color, s=40,
                           edgecolor="k", zorder=3)
    ax.scatter([], [], marker="s", color="w", edgecolor="k", label="powers of two from 64")
    ax.scatter([], [], marker="^", color="w", edgecolor="k", label="geometric ladder (sqrt 2)")
    ax.set_xlabel("graphs captured (budgets)")
    ax.set_ylabel("padded rows, single items (% of replayed rows)")
    ax.set_title(f"Padding vs number of graphs ({run_label(g)})", fontsize=10)
    legend_right(ax)
    ax.grid(alpha=0.3)
    return fig


def plot_sizes(g: pd.DataFrame):
    """Per mix, the share of items by merged tokens per item (after the resize, for the run's first
    preset); beside it, for a folder mix, its images' own sizes (area by count). None for runs
    without 'sizes' rows."""
    import matplotlib.pyplot as plt

    w = wide(g)
    s = w[w.case == "sizes"] if "case" in w else w.iloc[0:0]
    if s.empty:
        return None
    preset = s.preset.iloc[0]
    s = s[s.preset == preset]
    mixes = list(dict.fromkeys(s.mix))
    folders = [m for m in mixes if "folder" in s and s[s.mix == m].folder.notna().any()]
    fig, axes = plt.subplots(1, 2 if folders else 1, figsize=(12.5 if folders else 7.5, 4.6), squeeze=False)
    ax = axes[0][0]
    for i, mix in enumerate(mixes):          # the distribution itself: share of items per token count
        m = s[s.mix == mix].groupby("tokens").share.sum().sort_index()
        ax.plot(m.index, m.values * 100, "o-", ms=4, lw=1.2, color=f"C{i}", label=mix)
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_xlabel(f"merged tokens per item ({preset}, after the processor's resize)")
    ax.set_ylabel("% of the mix's items")
    legend_right(ax, fontsize=7)
    for mix in folders:
        m = s[s.mix == mix]
        axes[0][1].scatter(m.width, m.height, s=15 + 150 * m.images / m.images.max(), alpha=0.6,
                           color=f"C{mixes.index(mix)}",
                           label=f"{m.folder.iloc[0]}: {int(m.images.sum())} images (fingerprint {m.fingerprint.iloc[0]})")
    if folders:
        axes[0][1].set_xlabel("width (pixels, as shown)")
        axes[0][1].set_ylabel("height (pixels)")
        axes[0][1].set_title("your images' sizes (area: number of images)", fontsize=9)
        legend_under(axes[0][1], ncol=1)
    fig.suptitle(f"Item sizes per image mix ({run_label(g)})", fontsize=10)
    return fig


def findings(table: pd.DataFrame) -> str:
    w = wide(table)
    return per_run(w, lambda dev, g: _run_finding(dev, g), by_preset=True)


def _run_finding(dev: str, g: pd.DataFrame) -> str:
    exp = g[g.case == "expected"]
    text = f"On {dev}: "
    cmp = []
    for mix, e in exp.groupby("mix", sort=False):
        s = e.set_index("budget_set")
        if "pow2" in s.index and "planner" in s.index:
            a, b = s.loc["pow2"], s.loc["planner"]
            cmp.append(f"{mix} {a.padded_frac_expected:.0%} -> {b.padded_frac_expected:.0%}")
    if cmp:
        text += ("padded fraction of single-item replays, powers of two -> the planner with the same number "
                 "of graphs: " + "; ".join(cmp) + ".")
    runs = g[g.case == "runner"]
    if not runs.empty:
        worst = runs.sort_values("padded_frac", ascending=False).iloc[0]
        text += (f" Through the runner on drawn items the worst cell is {worst.mix} / {worst.budget_set} at "
                 f"max_items={int(worst.max_items)}: {worst.padded_frac:.0%} of replayed rows are padding, "
                 f"{fmt_us(worst.norm_us_padding)} of norm time and {worst.flops_padding_frac:.0%} of the tower's "
                 "FLOPs spent on them.")
        miss = runs[runs.misses > 0]
        if not miss.empty:
            r = miss.sort_values("misses", ascending=False).iloc[0]
            text += (f" {int(r.misses)} of {int(r['items'])} items of {r.mix} ran eagerly (graph misses) at "
                     f"max_items={int(r.max_items)}: a video's frames each count as one sequence.")
        bad = runs[runs.rel_err_vs_eager > 0.05]
        text += (f" Runner output vs eager: max rel_err {runs.rel_err_vs_eager.max():.2g}"
                 + (f" ({len(bad)} cells above 0.05!)." if len(bad) else "."))
    edge = g[g.case == "edge"]
    if not edge.empty:
        slow = edge[edge.edge_replay_ms > edge.eager_ms]
        r = edge.assign(x=edge.edge_replay_ms / edge.prev_full_replay_ms).sort_values("x").iloc[-1]
        text += (f" An item one token over a power of two replays in the next budget at up to "
                 f"{r.x:.2f}x the smaller full budget ({int(r.valid_tokens)} tokens: {r.edge_replay_ms:.3g} ms vs "
                 f"{r.prev_full_replay_ms:.3g} ms)")
        text += (f"; at {len(slow)} of {len(edge)} steps that padded replay is slower than eager."
                 if len(slow) else "; eager is slower at every step.")
    if str(dev).startswith("cpu"):
        text += (" CPU: the runner is emulated (replays run eagerly), so times are host times of a tiny tower; "
                 "padding fractions and FLOPs are exact.")
    return text


def key_numbers(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per run: padding_table with fractions in percent, one table per device."""
    out = {}
    for dev, g in labelled_runs(table, by_preset=True):
        t = padding_table(g).dropna(axis=1, how="all")
        t = t.drop(columns=[c for c in ("run", "reference", "device", "preset", "budgets") if c in t])
        for c in t.columns:
            if c.startswith("padded_frac"):
                t[c] = (t[c] * 100).round(1)
        names = {"padded_frac_expected": "padded % (single items, exact)",
                 "expected_replay_ms": "ms/image (single items, from the replay table)"}
        out[dev] = t.rename(columns=lambda c: names.get(c, c.replace("padded_frac", "padded %")))
    return out


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

STUDY = register(Study(
    name="padding_waste",
    order=3,
    notebook="notebooks/padding_waste.ipynb",
    run=run,
    cells="presets",
    per_preset=True,
    findings=findings,
    figures=(("padding_waste", plot_padding, "Padded fraction of replayed rows per mix and budget set: bars for "
              "single items (exact), markers for the runner on drawn items"),
             ("padding_waste_replay", plot_replay, "Replay time per budget, and an item one token over each power of "
              "two replayed in the next budget against the smaller full budget and eager (a CPU run's replays are "
              "emulated: a stamped smoke test)"),
             # runs before the curve existed lack it
             ("padding_waste_curve", lambda g: plot_curve(g) if "case" in g and (g["case"] == "curve").any() else None,
              "The planner's expected padded fraction against the number of graphs it may use, with the powers of "
              "two and the geometric ladder"),
             ("padding_waste_sizes", plot_sizes, "Each mix's items by merged tokens per item and, for a folder of "
              "your own images, their pixel sizes")),
    key_numbers=key_numbers,
    key_caption="Padding per mix and budget set on {device} (single items: exact from the mix's distribution; "
                "runner: measured on drawn items)",
    params=PARAMS,
    footprint=footprint,
    question="for a budget set and an image mix, padded rows, norm and tower work spent on them",
))
