"""The encoder_latency study's figures, key numbers and findings, from its tables (never runs a model)."""
from __future__ import annotations

from .. import Summarizer


import numpy as np
import pandas as pd

from ...formatting import fmt_us
from ...runner import PHASES
from ..plotting import (graph_name, is_cpu, labelled_runs, legend_below, per_run, plain_log_ticks, run_label,
                       stamp_cpu, value_ticks)
from ...results.tables import wide
from .params import KERNEL_CATS, LATENCY_PATHS, MIX_PATHS, PHASE_METRICS

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


def _images(n) -> str:
    n = int(n)
    return f"{n} image" + ("s" if n > 1 else "")


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
    path's speedup over eager and over transformers, each path as a multiple of the floor, and
    where the graph path's time goes (share outside the replay, uncached host metadata, kernels);
    and, where the run has them, its realistic batches (`mix_table`)."""
    out = {}
    for dev, g in labelled_runs(table):
        w = wide(exact_cells(g))
        if len(w):
            out[dev] = _exact_numbers(w)
        mixes = mix_table(g)
        if len(mixes):
            mixes = mixes.drop(columns=[c for c in ("run", "device") if c in mixes])
            out[f"{dev}, realistic batches"] = mixes.rename_axis(columns=None)
    return out


def _kernel_columns(t: pd.DataFrame, w: pd.DataFrame, idx: list) -> None:
    """The attention and MLP GEMM the tower resolved to, first in ``t`` (runs from before a column was
    recorded: without it)."""
    for pos, col in enumerate(c for c in ("attention", "gemm") if c in w):
        t.insert(pos, col, w.groupby(idx)[col].first())


def _exact_numbers(w: pd.DataFrame) -> pd.DataFrame:
    idx = ["preset", "tokens", "images"]
    p50 = w.pivot_table(index=idx, columns="path", values="p50_ms", aggfunc="first")
    t = pd.DataFrame(index=p50.index)
    for path, name in (("eager", "eager ms"), ("graph", "graph ms"), ("transformers", "transformers ms")):
        t[name] = p50[path] if path in p50 else np.nan
    _kernel_columns(t, w, idx)
    t["floor ms"] = w.groupby(idx).floor_ms.first()
    if "practical_floor_ms" in w:
        t["practical floor ms"] = w.groupby(idx).practical_floor_ms.first()
    t["graph speedup over eager (x)"] = t["eager ms"] / t["graph ms"]
    t["graph speedup over transformers (x)"] = t["transformers ms"] / t["graph ms"]
    t["graph x floor"] = t["graph ms"] / t["floor ms"]
    t["eager x floor"] = t["eager ms"] / t["floor ms"]
    if "practical floor ms" in t:
        t["graph x practical floor"] = t["graph ms"] / t["practical floor ms"]
    gr = w[w.path == "graph"].set_index(idx)
    if "replay_ms" in gr:
        t["graph replay ms"] = gr.replay_ms
        host = gr[["plan_ms", "metadata_ms", "staging_ms", "copy_out_ms"]].sum(axis=1, min_count=4)
        t["outside replay %"] = 100 * host / gr.phases_ms
    if "prepare_uncached_ms" in gr:
        t["uncached metadata ms"] = gr.prepare_uncached_ms
    kcols = [f"kernel_{c}_ms" for c in KERNEL_CATS]
    if set(kcols) <= set(gr):
        device_ms = gr[kcols].sum(axis=1, min_count=len(kcols))
        for c in ("matmul", "attention"):
            t[f"{c} % of device time"] = 100 * gr[f"kernel_{c}_ms"] / device_ms
        t["kernels per forward"] = gr.kernels_per_call
    return t.reset_index()


def findings(table: pd.DataFrame) -> str:
    """The finding per device: the checks, where graphs win, against transformers and the floor,
    and on realistic batches; every other number is in `key_numbers`."""
    return per_run(table, lambda dev, g: " ".join(_exact_finding(dev, exact_cells(g)) + _mix_finding(mix_cells(g))))


def _exact_finding(dev: str, g: pd.DataFrame) -> list[str]:
    w = wide(g)
    if w.empty:
        return [f"On {dev}: realistic batches only."]
    cpu = is_cpu(w)
    gr, tr = w[w.path == "graph"], w[w.path == "transformers"]
    count = lambda col, d: int(d[col].fillna(False).astype(bool).sum()) if col in d else 0  # noqa: E731
    lines = [f"On {dev}: graph output equals eager in {count('ok', gr)}/{len(gr)} cells ({count('bit_equal', gr)} "
             "bit-equal)" + (f"; ours agrees with transformers in {count('ok', tr)}/{len(tr)}." if len(tr) else ".")]
    if count("ok", gr) < len(gr) or count("ok", tr) < len(tr):
        lines.append("A path that failed its check is not timed.")
    timed = gr[gr.p50_ms.notna()] if "p50_ms" in gr else gr.iloc[0:0]
    if len(timed):
        best = timed.loc[timed.speedup.idxmax()]
        lines.append(f"{'Emulated' if cpu else 'CUDA'} graphs beat eager in {int((timed.speedup > 1).sum())}/"
                     f"{len(timed)} cells (best {best.speedup:.2f}x, {best.preset} at {int(best.tokens)} tokens).")
        vs = timed.speedup_vs_transformers.dropna() if "speedup_vs_transformers" in timed else []
        if len(vs):
            lines.append(f"The graph path is faster than transformers in {int((vs > 1).sum())}/{len(vs)} cells.")
        if not cpu and "x_practical_floor" in timed and timed.x_practical_floor.notna().any():
            big = timed[timed.tokens >= min(1024, timed.tokens.max())]
            lines.append(f"From {int(big.tokens.min())} tokens it runs at {big.x_practical_floor.min():.2f}-"
                         f"{big.x_practical_floor.max():.2f}x the practical floor.")
        elif not cpu:
            big = timed[timed.tokens == timed.tokens.max()].x_floor
            lines.append(f"At {int(timed.tokens.max())} tokens it runs at {big.min():.1f}-{big.max():.1f}x the FLOP "
                         "floor.")
    if cpu:
        lines.append("CPU run: graphs emulated (replayed eagerly), host times, a smoke test.")
    return lines


MIX_STYLE = {"transformers": ("C2", "transformers (SDPA)"), "eager": ("C0", "eager (ours)"),
             "graph_engine": ("C3", "graph, engine policy"), "graph_planner": ("C1", "graph, planner budgets"),
             "graph_auto": ("C4", "graph, policy auto")}


# policy auto against the best of eager, the engine policy's replay and the planner's budgets
BEST3 = "auto / best of eager, engine graph, planner"


def mix_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per realistic batch (device, preset, mix, items): each strategy's per-image p50,
    the fastest strategy, and policy auto against the faster of eager and the engines' graphs
    and against transformers (ratios > 1: auto is slower), and auto's first call of the batch
    shape (the whole batch, where it measures its plans)."""
    w = wide(mix_cells(table))
    if w.empty:
        return pd.DataFrame()
    idx = [c for c in ("run", "device", "preset", "mix", "images") if c in w]
    t = w.pivot_table(index=idx, columns="path", values="image_p50_ms", aggfunc="first")
    t = t[[p for p in MIX_PATHS if p in t]]
    out = t.copy()
    out["fastest"] = t.idxmin(axis=1)
    _kernel_columns(out, w, idx)
    if {"graph_auto", "eager", "graph_engine"} <= set(t):
        out["auto / best of eager, engine graph"] = t["graph_auto"] / t[["eager", "graph_engine"]].min(axis=1)
        out["engine graph / eager"] = t["graph_engine"] / t["eager"]
        if "graph_planner" in t:       # the planner's budgets too: what auto is judged against
            out[BEST3] = t["graph_auto"] / t[["eager", "graph_engine", "graph_planner"]].min(axis=1)
    if {"graph_auto", "transformers"} <= set(t):
        out["auto / transformers"] = t["graph_auto"] / t["transformers"]
    a = w[w.path == "graph_auto"].set_index(idx)
    if "first_ms" in w:       # the batch shape's first call, and the calls its race took before the timed ones
        out["auto first call (ms)"] = a["first_ms"].groupby(level=idx).first()
        if "graph_auto" in t:      # against its steady-state call of the same batch (p50 per image x items)
            steady = t["graph_auto"] * t.index.get_level_values("images")
            out["auto first / steady call"] = out["auto first call (ms)"] / steady
    if "explore_calls" in w:
        out["auto race calls"] = a["explore_calls"].groupby(level=idx).first()
    # batches of new shapes: the median batch's time per image, and the whole stream's where both were kept
    median = _fresh_column(w)
    for tag, col in {"fresh": median, "fresh stream": "fresh_image_ms"}.items():
        if col not in w or (tag == "fresh stream" and median == col):
            continue
        f = w.pivot_table(index=idx, columns="path", values=col, aggfunc="first")
        if {"graph_auto", "eager", "graph_engine"} <= set(f):
            out[f"{tag}: auto / best of eager, engine graph"] = f["graph_auto"] / f[["eager", "graph_engine"]].min(axis=1)
        if {"graph_auto", "transformers"} <= set(f):
            out[f"{tag}: auto / transformers"] = f["graph_auto"] / f["transformers"]
    if "p50_ci_lo_ms" in w:   # how well auto's median is known: its 95% interval's larger half, and the calls
        half = np.maximum(a.p50_ms - a.p50_ci_lo_ms, a.p50_ci_hi_ms - a.p50_ms) / a.p50_ms * 100
        out["auto p50 95% interval (±%)"] = half.groupby(level=idx).first()
        out["auto timed calls"] = a.reps_n.groupby(level=idx).first()
    return out.reset_index()


# the spread of per-image times above which the realistic-batch figure uses a log axis
LOG_SPREAD = 20.0


def _per_cell(d: pd.DataFrame, cells: pd.DataFrame, path: str, column: str) -> list[float]:
    """``column`` of ``path`` in each (mix, images) cell of ``d``, in the order of ``cells``; nan where missing."""
    got = [d[(d.mix == c.mix) & (d.images == c.images) & (d.path == path)][column] for c in cells.itertuples()]
    return [float(v.iloc[0]) if len(v) else np.nan for v in got]


# the tick's legend, by the column it shows (`_fresh_column`)
FRESH_TICK = {"fresh_p50_image_ms": "new shapes: median batch, per image", "fresh_image_ms": "new shapes, per image"}


def _fresh_column(w: pd.DataFrame) -> str:
    """The stream of new shapes' column the verdicts and the figure read: the median batch's, or in runs made
    before it was kept, the whole stream's."""
    return "fresh_p50_image_ms" if "fresh_p50_image_ms" in w else "fresh_image_ms"


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
    col = _fresh_column(w)
    fresh = col in w and w[col].notna().any()
    times = pd.concat([w.image_p50_ms, w[col] if fresh else w.image_p50_ms.iloc[:0]]).dropna()
    times = times[times > 0]
    log = len(times) > 1 and times.max() / times.min() > LOG_SPREAD
    for ax, preset in zip(axes.flat, presets):
        d = w[w.preset == preset]
        for k, path in enumerate(paths):
            color, name = MIX_STYLE[path]
            name = f"{name} (emulated)" if cpu and path.startswith("graph") else name
            ax.barh(np.arange(len(cells)) + k * h, _per_cell(d, cells, path, "image_p50_ms"), height=h, color=color,
                    label=name)
            if fresh:        # the same strategy on batches of shapes no call had seen: a black tick on its bar
                ax.plot(_per_cell(d, cells, path, col), np.arange(len(cells)) + k * h, "|",
                        color="black", markersize=7, mew=1.5, label=FRESH_TICK[col] if k == 0 else None)
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
    handles, labels = axes.flat[0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] in FRESH_TICK.values())     # the tick last
    legend_below(fig, [handles[i] for i in order], [labels[i] for i in order], ncol=3)
    return fig


def _mix_finding(g: pd.DataFrame) -> list[str]:
    t = mix_table(g)
    if t.empty or "auto / best of eager, engine graph" not in t:
        return []
    ratio = t["auto / best of eager, engine graph"].dropna()
    # the engine policy the graph_engine cells reproduced (runs before policies were named: powers of two)
    named = sorted(g["engine"].dropna().unique()) if "engine" in g else []
    who = f"{', '.join(named)}'s graphs" if named else "The engines' powers-of-two budgets"
    out = [f"{who[0].upper()}{who[1:]} are slower than eager in {int((t['engine graph / eager'] > 1).sum())}/{len(t)} "
           "realistic batches.",
           f"Policy auto stays within 5% of the faster of eager and the engines' graphs in "
           f"{int((ratio <= 1.05).sum())}/{len(ratio)}."]
    best3 = t.get(BEST3, pd.Series(dtype=float)).dropna()
    if len(best3):
        out.append(f"Against the best of eager, the engine's graphs and the planner's budgets: within 5% in "
                   f"{int((best3 <= 1.05).sum())}/{len(best3)} (worst {best3.max():.2f}x).")
    fresh = t.get("fresh: auto / best of eager, engine graph", pd.Series(dtype=float)).dropna()
    stream = t.get("fresh stream: auto / best of eager, engine graph", pd.Series(dtype=float)).dropna()
    if len(fresh):      # the whole stream's sum beside the median batch: a race's calls on a few batches show there
        whole = f" (the whole stream: {int((stream <= 1.05).sum())}/{len(stream)})" if len(stream) else ""
        out.append(f"On batches of new shapes (the median batch) it stays within 5% in "
                   f"{int((fresh <= 1.05).sum())}/{len(fresh)}{whole}.")
    return out


# (stem, plot, caption): a new figure is one function above and one line here
FIGURES = (("encoder_latency", plot_latency, "p50 per encode call against merged tokens: eager, the graph runner "
              "(a CUDA graph on a GPU, emulated on a CPU) and transformers, with the FLOP and practical floors on a "
              "GPU (a CPU run is a stamped smoke test without floors)"),
             ("encoder_latency_phases", lambda g: plot_phases(g) if (g.metric == "replay_ms").any() else None,
              "Where the graph path's time goes: plan, metadata, staging, replay and copy-out (each phase's "
              "median with a sync around it; beside each bar their sum and the p50 of whole calls)"),
             ("encoder_latency_kernels", lambda g: plot_kernels(g) if (g.metric == "kernel_matmul_ms").any() else None,
              "The tower's device time by kernel category (one forward, profiled)"),
             ("encoder_latency_mixes", plot_mixes, "Realistic batches: per-image time of transformers, eager, the "
              "engine policy's graphs (the engine column names it), planner budgets and policy auto (bars: one batch repeated; black ticks, where "
              "measured: a stream of batches of new shapes)"))

summarize = Summarizer(findings=findings, figures=FIGURES, key_numbers=key_numbers, key_caption="Encoder latency on {device} (single calls: p50 per encode call in ms of each path, the FLOP "
                "and practical floors, the graph path's speedup, times as multiples of the floors, where the graph "
                "path's time goes; realistic batches: p50 per image in ms of each strategy, ratios > 1: the first is "
                "slower)")
