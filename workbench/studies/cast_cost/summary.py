"""The cast_cost study's figures, key numbers and findings, from its tables (never runs a model)."""
from __future__ import annotations

from .. import Summarizer


import numpy as np
import pandas as pd

from ...formatting import fmt_us
from ..plotting import (is_cpu, labelled_runs, legend_below, legend_right, per_run, plain_log_ticks, run_label,
                       stamp_cpu)
from ...results.tables import wide
from .params import DESIGNS, FOLD_NORM, LEGACY_NORM, NO_NORM

# ---- presentation ---------------------------------------------------------------------------

def cell_name(design: str, norm: str) -> str:
    return design if norm in NO_NORM.values() else f"{design} / {norm}"


def table_at(table: pd.DataFrame, fill: float = 0.75) -> pd.DataFrame:
    """One row per (device, budget, design, norm) at ``fill``: the closing table of the study."""
    w = wide(table)
    w = w[np.isclose(w.fill, fill)]
    cols = ["run", "reference", "device", "family", "preset", "budget", "design", "norm", "staging_us", "staging_p90_us", "copy_us", "norm_us", "bytes",
            "floor_us", "ratio_to_floor", "share_of_replay", "replay_us", "replay_floor_us", "max_err_ulp"]
    cols = [c for c in cols if c in w]
    return w[cols].sort_values([c for c in ("run", "device", "budget", "staging_us") if c in cols]).reset_index(
        drop=True)


def _at_fill(w: pd.DataFrame, fill: float) -> tuple[pd.DataFrame, float]:
    """The rows of ``w`` at the measured fill closest to ``fill``, and that fill."""
    fills = np.sort(w.fill.unique())
    at = float(fills[np.argmin(np.abs(fills - fill))])
    return w[np.isclose(w.fill, at)], at


def plot_staging(g: pd.DataFrame, fill: float = 0.75):
    """Per budget: each design's staging time (copy + norm) at ``fill`` (or the closest fill
    measured), log time axis. On a GPU with its byte floor and its multiple of it beside each bar
    and p90 whiskers; a CPU run (host times, a smoke test) is stamped and has neither floor nor
    whiskers (a shared host's p90 is scheduling noise, up to 100x its p50)."""
    import matplotlib.pyplot as plt

    w = wide(g)
    if w.empty:
        return None
    w, fill = _at_fill(w, fill)
    cpu = is_cpu(w)
    budgets = sorted(w.budget.unique())
    n_cells = w.groupby("budget").size().max()
    ncols = min(2, len(budgets))
    nrows = -(-len(budgets) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.2 * ncols, (1.6 + 0.36 * n_cells) * nrows), squeeze=False)
    for ax in axes.flat[len(budgets):]:
        ax.set_visible(False)
    for ax, budget in zip(axes.flat, budgets):
        d = w[w.budget == budget].sort_values("staging_us")
        names = [cell_name(a, b) for a, b in zip(d.design, d.norm)]
        y = np.arange(len(d))
        ax.barh(y, d.staging_us, color="#90caf9",
                label="copy + norm (p50 host time)" if cpu else "copy + norm, one graph (p50)")
        if not cpu:
            ax.scatter(d.floor_us, y, marker="|", s=300, color="k", label="byte floor (bytes / copy ceiling)",
                       zorder=3)
            ax.errorbar(d.staging_us, y, xerr=[np.zeros(len(d)), (d.staging_p90_us - d.staging_us).clip(lower=0)],
                        fmt="none", ecolor="#1565c0", capsize=2, label="p90")
        for yi, (t, r) in enumerate(zip(d.staging_us, d.ratio_to_floor)):
            ax.text(t * 1.08, yi, fmt_us(t) if cpu else f"{fmt_us(t)} ({r:.1f}x floor)", va="center", fontsize=7)
        ax.set_yticks(y, names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        ax.set_xlabel("input staging per replay (us, log)")
        tower = fmt_us(d.replay_us.iloc[0])
        ax.set_title(f"budget {budget} tokens ({budget * 4} rows), {fill:.0%} valid\n"
                     + (f"tower forward {tower} (host)" if cpu else f"tower replay {tower}"), fontsize=9)
        ax.set_xlim(right=ax.get_xlim()[1] * 6)
        if cpu:
            stamp_cpu(ax)
    fig.suptitle(f"Cast cost: staging the graph input ({run_label(g)})", fontsize=11)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels())
    return fig


def plot_fill(g: pd.DataFrame, budget: int | None = None):
    """Staging time vs fill level at one budget (default: the largest), one line per cell: which
    designs pay for padding and which only for valid rows (a CPU run stamped as a smoke test)."""
    import matplotlib.pyplot as plt

    w = wide(g)
    if w.empty:
        return None
    budget = budget or int(w.budget.max())
    d = w[w.budget == budget]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    styles = {"eager": ("-", "o"), "triton_channel": (":", "s"), "triton_flat": ("-.", "^"),
              "triton_rows": ("--", "D"), LEGACY_NORM: ("-", "x"), FOLD_NORM: ("-", "P")}
    colors = {design: f"C{i}" for i, design in enumerate(DESIGNS)}
    for (design, norm), c in d.groupby(["design", "norm"], sort=False):
        c = c.sort_values("fill")
        ls, marker = styles.get(norm, ("-", "o"))
        ax.plot(c.fill * 100, c.staging_us, ls=ls, marker=marker, color=colors.get(design, "k"), ms=4,
                label=cell_name(design, norm))
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("valid rows (% of the budget)")
    ax.set_ylabel("input staging per replay (us, log)")
    ax.set_title(f"Staging vs fill, budget {budget} tokens ({run_label(g)})", fontsize=10)
    legend_right(ax, ncol=2, title="colour: design, line: norm", title_fontsize=7)
    if is_cpu(d):
        stamp_cpu(ax)
    return fig


def key_numbers(table: pd.DataFrame, fill: float = 0.75) -> dict[str, pd.DataFrame]:
    """Per device, the designs (rows, cheapest first at the largest budget) x budgets: staging
    p50 in us, its ratio to the byte floor, and the bytes moved (MiB), at ``fill``; a last row
    gives the tower's own replay at each budget and its ratio to its FLOP floor."""
    out = {}
    for dev, g in labelled_runs(table_at(table, fill), by_preset=True):
        g = g.assign(cell=[cell_name(a, b) for a, b in zip(g.design, g.norm)])
        parts = {}
        for budget, b in g.groupby("budget"):
            b = b.set_index("cell")
            tower = b.iloc[0]
            b = pd.concat([b, pd.DataFrame({"staging_us": [tower.replay_us], "bytes": [np.nan],
                                            "ratio_to_floor": [tower.replay_us / tower.get("replay_floor_us", np.nan)]},
                                           index=[TOWER_ROW])])
            parts[f"{budget} tok: us"] = b.staging_us
            if not is_cpu(g):     # a CPU has no byte floor to compare with
                parts[f"{budget} tok: x floor"] = b.ratio_to_floor
            parts[f"{budget} tok: MiB"] = b["bytes"] / 2**20
        t = pd.DataFrame(parts)
        last = [c for c in t.columns if c.endswith(": us")][-1]
        out[dev] = t.sort_values(last).reset_index(names="design / norm")
    return out


TOWER_ROW = "tower replay (x its FLOP floor)"


def findings(table: pd.DataFrame, fill: float = 0.75) -> str:
    """The finding per device: the check, the cheapest correct design and what today's engine
    design costs over it (every other number is in `key_numbers`)."""
    return per_run(wide(table), lambda dev, g: _run_finding(dev, g, fill), by_preset=True)


def _run_finding(dev: str, g: pd.DataFrame, fill: float) -> str:
    at = g[np.isclose(g.fill, fill)]
    at = at if len(at) else g[g.fill == g.fill.max()]
    ok = at[at.max_err_ulp <= 1]
    lines = [f"On {dev}: {len(ok)}/{len(at)} design outputs within 1 bf16 ulp of float64."]
    if len(ok):
        top = ok[ok.budget == ok.budget.max()].sort_values("staging_us")
        best = top.iloc[0]
        name = cell_name(best.design, best.norm)
        firsts = ok.sort_values("staging_us").groupby("budget").head(1)
        firsts = [cell_name(r.design, r.norm) for r in firsts.itertuples()]
        lines += [f"Cheapest correct staging at {int(best.budget)} tokens, {best.fill:.0%} valid: {name}, "
                  f"{fmt_us(best.staging_us)} ({best.share_of_replay * 100:.2g}% of the replay).",
                  f"It is the cheapest at {firsts.count(name)}/{len(firsts)} budgets."]
        engine = top[top.design == "uint8_buffer"]
        if len(engine):
            lines.append(f"The engines' uint8 buffer costs +{fmt_us(engine.staging_us.iloc[0] - best.staging_us)} "
                         "per replay over it.")
    if is_cpu(g):
        lines.append("CPU run: host times on cache-resident data, a smoke test.")
    elif "launch_us" in g:
        lines.append(f"Launch floor (one tiny kernel replayed alone): {fmt_us(g.launch_us.iloc[0])}.")
    return " ".join(lines)


# (stem, plot, caption): a new figure is one function above and one line here
FIGURES = (("cast_cost", plot_staging, "Staging time per replay of each input design (copy + norm) per budget, "
              "beside its byte floor (GPU runs; a CPU run is a stamped smoke test without floors)"),
             ("cast_cost_fill", plot_fill, "Staging time against the share of valid rows at one budget: which designs "
              "pay for padding"))

summarize = Summarizer(findings=findings, figures=FIGURES, key_numbers=key_numbers, key_caption="Staging per replay at 75% valid rows on {device} (copy + norm in one graph, p50; x floor = time / "
                "(bytes moved / copy ceiling); the tower replay row: its time / FLOP floor)", per_preset=True)
