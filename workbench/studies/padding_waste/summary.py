"""The padding_waste study's figures, key numbers and findings, from its tables (never runs a model)."""
from __future__ import annotations

from .. import Summarizer


import numpy as np
import pandas as pd

from ..plotting import (graph_name, is_cpu, labelled_runs, legend_right, legend_under, per_run, plain_log_ticks,
                       run_label, stamp_cpu, value_ticks)
from ...results.tables import wide
from .params import BUDGET_SETS

# ---- presentation ---------------------------------------------------------------------------

SET_COLORS = {"pow2": "#9e9e9e", "vllm-0.34": "#ef6c00", "geometric": "#90caf9", "planner": "#1565c0",
              "planner_time": "#2e7d32"}


def padding_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, device, preset, mix, budget set): graphs, expected padded fraction (single items),
    expected replay time, and per max_items the runner's measured padded fraction, time per image,
    share of the tower's FLOPs spent on padding and graph misses."""
    w = wide(table)
    exp = w[w.case == "expected"]
    run_rows = w[w.case == "runner"]
    keys = [c for c in ("run", "reference", "device", "preset", "mix", "budget_set") if c in w]
    out = exp[keys + ["graphs", "budgets", "padded_frac_expected", "expected_replay_ms"]].copy()
    for m, g in run_rows.groupby("max_items"):
        g = g.set_index(keys)
        cols = {"padded_frac": "padded_frac", "encode_ms_per_image": "ms/image",
                "flops_padding_frac": "flops_padding_frac", "misses": "misses"}
        cols = {c: f"{name} (runner, max_items={int(m)})" for c, name in cols.items() if c in g}
        out = out.join(g[list(cols)].rename(columns=cols), on=keys)
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
    """The finding per device: padding of powers of two against the planner, the runner's worst
    cell and check, and what one token over a power of two costs (numbers: `key_numbers`)."""
    return per_run(wide(table), _run_finding, by_preset=True)


def _run_finding(dev: str, g: pd.DataFrame) -> str:
    exp = g[g.case == "expected"].pivot_table(index="mix", columns="budget_set", values="padded_frac_expected")
    lines = [f"On {dev}:"]
    if {"pow2", "planner"} <= set(exp):
        lines.append(f"single items pad {_span(exp.pow2)} of replayed rows with powers of two, {_span(exp.planner)} "
                     f"with the planner's budgets ({len(exp)} mixes).")
    if "vllm-0.34" in exp:
        miss = g[g.case == "expected"].pivot_table(index="mix", columns="budget_set", values="miss_frac_expected")
        lines.append(f"vLLM 0.34's grid pads {_span(exp['vllm-0.34'])} of replayed rows and runs "
                     f"{_span(miss['vllm-0.34'])} of single items eagerly above its cap.")
    lines += _out_of_sample_finding(g)
    runs = g[g.case == "runner"]
    if runs.padded_frac.notna().any():
        r = runs.loc[runs.padded_frac.idxmax()]
        bad = int((runs.rel_err_vs_eager > 0.05).sum())
        lines += [f"Worst runner cell: {r.mix} / {r.budget_set} at max_items={int(r.max_items)}, "
                  f"{r.padded_frac:.0%} of replayed rows padding.",
                  f"Runner output vs eager: max rel_err {runs.rel_err_vs_eager.max():.2g}"
                  + (f", {bad} cells above 0.05." if bad else ".")]
    edge = g[g.case == "edge"]
    if len(edge):
        r = edge.loc[(edge.edge_replay_ms / edge.prev_full_replay_ms).idxmax()]
        lines += [f"One token over a power of two replays at up to {r.edge_replay_ms / r.prev_full_replay_ms:.2f}x "
                  f"the smaller full budget ({int(r.valid_tokens)} tokens).",
                  f"That padded replay is slower than eager at {int((edge.edge_replay_ms > edge.eager_ms).sum())}/"
                  f"{len(edge)} steps."]
    if is_cpu(g):
        lines.append("CPU run: replays emulated, host times of a tiny tower; padding fractions and FLOPs are exact.")
    return " ".join(lines)


def _out_of_sample_finding(g: pd.DataFrame) -> list[str]:
    """The planner fitted on one draw against the engine's grid on held-out draws, per mix range."""
    o = g[g.case == "out_of_sample"] if "judged_set" in g else g.iloc[:0]
    if o.empty:
        return []
    t = o.pivot_table(index=["mix", "judged_set"], columns="sample", values="padded_frac_judged")
    planner, grid = (t.xs(s, level="judged_set") for s in ("planner, equal graphs", "engine default"))
    return [f"Out of sample the planner's budgets (as many graphs as {o.engine.iloc[0]}'s grid) pad "
            f"{_span(planner['fitted draw'])} on the draw they were fitted to, {_span(planner['held-out draws'])} on "
            f"held-out draws and {_span(planner['other mixes'])} on the other mixes; the grid "
            f"{_span(grid['held-out draws'].dropna())} on held-out draws."]


def _span(fracs: pd.Series) -> str:
    """'17-42%', or '0%' where every value rounds alike."""
    lo, hi = f"{fracs.min():.0%}", f"{fracs.max():.0%}"
    return lo if lo == hi else f"{lo[:-1]}-{hi}"


def key_numbers(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per run: padding_table with fractions in percent, one table per device (and tower)."""
    out = {}
    for dev, g in labelled_runs(table, by_preset=True):
        t = padding_table(g).dropna(axis=1, how="all")
        t = t.drop(columns=[c for c in ("run", "reference", "device", "preset", "budgets") if c in t])
        for c in t.columns:
            if c.startswith(("padded_frac", "flops_padding_frac")):
                t[c] = (t[c] * 100).round(1)
        names = {"padded_frac_expected": "padded % (single items, exact)",
                 "expected_replay_ms": "ms/image (single items, from the replay table)"}
        out[dev] = t.rename(columns=lambda c: names.get(c, c.replace("flops_padding_frac", "padding FLOPs %")
                                                        .replace("padded_frac", "padded %")))
    return out


# (stem, plot, caption): a new figure is one function above and one line here
FIGURES = (("padding_waste", plot_padding, "Padded fraction of replayed rows per mix and budget set: bars for "
              "single items (exact), markers for the runner on drawn items"),
             ("padding_waste_replay", plot_replay, "Replay time per budget, and an item one token over each power of "
              "two replayed in the next budget against the smaller full budget and eager (a CPU run's replays are "
              "emulated: a stamped smoke test)"),
             # runs before the curve existed lack it
             ("padding_waste_curve", lambda g: plot_curve(g) if "case" in g and (g["case"] == "curve").any() else None,
              "The planner's expected padded fraction against the number of graphs it may use, with the powers of "
              "two and the geometric ladder"),
             ("padding_waste_sizes", plot_sizes, "Each mix's items by merged tokens per item and, for a folder of "
              "your own images, their pixel sizes"))

summarize = Summarizer(findings=findings, figures=FIGURES, key_numbers=key_numbers, key_caption="Padding per mix and budget set on {device} (single items: exact from the mix's distribution; "
                "runner: measured on drawn items)", per_preset=True)
