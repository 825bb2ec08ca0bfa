"""The fp32_memory study's figures, key numbers and findings, from its tables (never runs a model)."""
from __future__ import annotations

from .. import Summarizer


import numpy as np
import pandas as pd

from ...formatting import fmt_bytes
from ..plotting import (labelled_runs, legend_below, legend_under, per_run, plain_log_ticks, run_label,
                       value_ticks)
from ...results.tables import wide

# ---- presentation ---------------------------------------------------------------------------

def comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Norm-scope cells: modelled vs measured pool bytes (MiB) per implementation and budget."""
    w = wide(table)
    w = w[w.scope == "norm"]
    cols = ["device", "preset", "buffer_dtype", "budget", "budget_rows", "norm", "model_bytes", "pool_bytes", "model_error",
            "temp_bytes", "peak_bytes", "model_peak_bytes", "trace_matches"]
    return w[[c for c in cols if c in w]].sort_values([c for c in ("device", "preset", "buffer_dtype", "budget", "norm") if c in w]).reset_index(
        drop=True)


BUDGET_AXIS = "graph budget (merged tokens; 1 token = 4 pixel rows)"


def _positive(values) -> np.ndarray:
    """``values`` with zeros (and negatives) as NaN: what a log axis can draw."""
    v = np.asarray(values, dtype=float)
    return np.where(v > 0, v, np.nan)


def plot_pool(g: pd.DataFrame):
    """Pool bytes of the norm captured alone vs the budget in merged tokens, one panel per buffer
    dtype: the model as lines with markers (implementations with the same model share one line
    and one label), CUDA measurements as open circles, fp32 temporaries dotted; log-log axes. A
    model that is 0 B at every budget cannot be drawn on a log axis: the legend says so."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    w = wide(g)
    w = w[w.scope == "norm"]
    if w.empty:
        return None
    bufs = sorted(w.buffer_dtype.unique())
    measured = "pool_bytes" in w and w.pool_bytes.notna().any()
    fig, axes = plt.subplots(1, len(bufs), figsize=(6.4 * len(bufs), 5.4), squeeze=False)
    for ax, buf in zip(axes[0], bufs):
        d = w[w.buffer_dtype == buf]
        groups: dict[tuple, list[str]] = {}
        for norm, c in d.groupby("norm", sort=False):
            groups.setdefault(tuple(c.sort_values("budget").model_bytes), []).append(norm)
        notes = []
        for k, (series, norms) in enumerate(groups.items()):
            c = d[d.norm == norms[0]].sort_values("budget")
            name, color = " = ".join(norms), f"C{k}"
            if not any(v > 0 for v in series):
                notes.append(f"{name}: 0 B at every budget (nothing to draw on a log axis)")
                continue
            ax.plot(c.budget, _positive(series) / 2**20, color=color, marker="o", ms=4, label=name)
            if (c.temp_bytes > 0).any():
                ax.plot(c.budget, _positive(c.temp_bytes) / 2**20, color=color, ls=":", lw=1.2, marker=".")
            if measured:
                for norm in norms:
                    m = d[d.norm == norm].sort_values("budget")
                    ax.scatter(m.budget, _positive(m.pool_bytes) / 2**20, facecolors="none", edgecolors=color, s=60)
        ax.set_xscale("log")
        ax.set_yscale("log")
        value_ticks(ax.xaxis, d.budget)
        plain_log_ticks(ax.yaxis)
        ax.set_xlabel(BUDGET_AXIS)
        ax.set_ylabel("graph-pool bytes of the norm (MiB, log)")
        ax.set_title(f"{buf} buffer -> bf16", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="grey", ls=":", marker="."))
        labels.append("fp32 temporaries alone")
        if measured:
            handles.append(Line2D([], [], marker="o", mfc="none", mec="grey", ls=""))
            labels.append("measured (CUDA graph pool)")
        for note in notes:
            handles.append(Line2D([], [], ls=""))
            labels.append(note)
        legend_under(ax, handles, labels)
    fig.suptitle(f"fp32 memory: pool bytes of the normalization captured alone, lines = model "
                 f"({run_label(g)})", fontsize=10)
    fig.tight_layout()
    return fig


# the scopes whose norm runs outside the graph (placements runner and device): a transient peak
OUTSIDE_SCOPES = ("runner", "device")
# placement fold's rows in the tables: no norm, the graph's cast of its buffer only
FOLD_LABEL = "fold: cast only"


def _bar_note(v: float) -> str:
    """A tower bar's label: n/a (not measured), 0, or its MiB."""
    return "n/a" if pd.isna(v) else ("0" if v == 0 else f"{v / 2**20:.0f}")


def plot_tower(g: pd.DataFrame):
    """What each norm adds to the pool of the captured tower (and the runner's transient peak),
    every bar labelled with its MiB ("0" where the norm adds nothing, "n/a" where not measured);
    negative bars (the pool with the norm came out smaller) hatched and explained below."""
    import matplotlib.pyplot as plt

    w = wide(g)
    t = w[w.scope.isin(["tower", *OUTSIDE_SCOPES]) & w.get("peak_bytes", pd.Series(index=w.index)).notna()]
    if t.empty:
        return None
    t = t.assign(cell=t.scope + " / " + t.buffer_dtype)
    budgets = sorted(t.budget.unique())
    fig, axes = plt.subplots(1, len(budgets), figsize=(5.4 * len(budgets), 4.4), squeeze=False)
    negative = False
    for ax, budget in zip(axes[0], budgets):
        d = t[t.budget == budget]
        cells = sorted(d.cell.unique())
        norms = list(dict.fromkeys(d.norm))
        width = 0.8 / len(cells)
        for k, cell in enumerate(cells):
            c = d[d.cell == cell].set_index("norm").reindex(norms)
            outside = cell.split(" / ")[0] in OUTSIDE_SCOPES
            metric = c.peak_bytes if outside else c.pool_bytes
            values = metric.to_numpy(dtype=float)
            bars = ax.bar(np.arange(len(norms)) + k * width, np.nan_to_num(values) / 2**20, width,
                          color=f"C{k}", label=f"{cell}: " + ("transient peak (outside the pool)"
                                                              if outside else "pool bytes added"))
            for bar, v in zip(bars, values):
                if v < 0:
                    bar.set_hatch("///")
                    negative = True
            ax.bar_label(bars, [_bar_note(v) for v in values], fontsize=6, padding=1)
        ax.set_xticks(np.arange(len(norms)) + 0.4 - width / 2, norms, rotation=20, fontsize=8)
        ax.set_ylabel("MiB (norm minus no norm)")
        ax.set_title(f"budget {budget} merged tokens ({budget * 4} pixel rows)", fontsize=9)
        ax.axhline(0, color="k", lw=0.6)
        ax.margins(y=0.12)
    fig.suptitle(f"What the norm adds to the captured tower ({run_label(g)})", fontsize=10)
    fig.tight_layout()
    note = ("bar labels in MiB; 0: the norm adds nothing (its temporaries reuse memory the tower frees); "
            "n/a: not measured")
    if negative:
        note += ("; hatched below 0: the tower's pool with the norm came out smaller than without it "
                 "(allocator segment rounding), i.e. nothing measurable added")
    legend_below(fig, *axes[0][0].get_legend_handles_labels(), ncol=3, title=note, title_fontsize=7)
    return fig


def findings(table: pd.DataFrame) -> str:
    """The finding per device: what the eager and the fused norms park in the pool at the largest
    budget, the model's checks, and what the norm adds inside the tower (numbers: `key_numbers`)."""
    return per_run(wide(table), _run_finding, by_preset=True)


def _run_finding(dev: str, g: pd.DataFrame) -> str:
    n = g[g.scope == "norm"]
    big = n.budget.max()
    top = n[n.budget == big]
    fused = top[top.norm.str.startswith("triton")]
    eager = top[top.norm == "eager"]
    lines = [f"On {dev}: at {big} tokens the eager norm parks {fmt_bytes(eager.model_bytes.max())} in the pool "
             "(model)" + (f", a fused kernel at most {fmt_bytes(fused.model_bytes.max())}." if len(fused) else "."),
             f"Their fp32 temporaries: eager {fmt_bytes(eager.temp_bytes.max())}"
             + (f", fused kernels {fmt_bytes(fused.temp_bytes.max())}." if len(fused) else ".")]
    if "trace_matches" in n:
        lines.append(f"Modelled allocation trace equals the counted one in {int(n.trace_matches.fillna(False).sum())}/"
                     f"{len(n)} cells.")
    if "pool_bytes" not in n or n.pool_bytes.isna().all():
        lines += _placement_lines(g, big)
        lines.append("No CUDA measurement on this device: graph-pool bytes exist only on a GPU.")
        return " ".join(lines)
    err = n.model_error.abs().replace(np.inf, np.nan).fillna(np.inf)
    lines.append(f"Allocator model within 5% of the measured pool in {int((err <= 0.05).sum())}/{len(n)} cells.")
    lines += _placement_lines(g, big)
    tower = g[(g.scope == "tower") & (g.budget == big)]
    adds = {"eager": tower[tower.norm == "eager"].pool_bytes.max(),
            "fused": tower[tower.norm.str.startswith("triton")].pool_bytes.max()}
    if any(pd.notna(v) for v in adds.values()):
        lines.append(f"Inside the captured tower at {big} tokens the norm adds at most "
                     + ", ".join(f"{fmt_bytes(v)} ({k})" for k, v in adds.items() if pd.notna(v)) + ".")
    return " ".join(lines)


def _placement_lines(g: pd.DataFrame, big: int) -> list[str]:
    """Placements fold and device at the largest budget (model): what reaches the pool, what is
    transient."""
    out = []
    fold = g[(g.scope == "fold") & (g.budget == big)]
    if len(fold):
        out.append(f"Placement fold runs no norm: its graph casts the buffer, at most "
                   f"{fmt_bytes(fold.model_bytes.max())} in the pool (model), fp32 temporaries "
                   f"{fmt_bytes(fold.temp_bytes.max())}.")
    dev = g[(g.scope == "device") & (g.budget == big)]
    if len(dev):
        out.append(f"Placement device normalizes before the encoder: nothing in the pool, transient fp32 "
                   f"temporaries up to {fmt_bytes(dev.temp_bytes.max())} outside it (model).")
    return out


def key_numbers(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per device: pool MiB of the norm captured alone, modelled and (CUDA) measured, per
    implementation and buffer dtype (rows) and budget (columns), with the fp32 temporaries, what
    the norm adds inside the captured tower and the runner placement's transient peak (CUDA)."""
    out = {}
    w = wide(table)
    for dev, g in labelled_runs(w, by_preset=True):
        parts = {}
        for budget, b in g.groupby("budget"):
            b = b.assign(norm=b.norm.where(b.scope != "fold", FOLD_LABEL),
                         scope=b.scope.replace("fold", "norm"))       # fold's cast beside the norms
            scope = {s: b[b.scope == s].set_index(["norm", "buffer_dtype"]) for s in ("norm", "tower", *OUTSIDE_SCOPES)}
            n = scope["norm"]
            parts[f"{budget} tok: model MiB"] = n.model_bytes / 2**20
            if "pool_bytes" in n and n.pool_bytes.notna().any():
                parts[f"{budget} tok: measured MiB"] = n.pool_bytes / 2**20
                parts[f"{budget} tok: error %"] = 100 * n.model_error
            parts[f"{budget} tok: fp32 temp MiB"] = n.temp_bytes / 2**20
            if "pool_bytes" in scope["tower"] and scope["tower"].pool_bytes.notna().any():
                parts[f"{budget} tok: in tower MiB"] = scope["tower"].pool_bytes / 2**20
            for name in OUTSIDE_SCOPES:
                if "peak_bytes" in scope[name] and scope[name].peak_bytes.notna().any():
                    parts[f"{budget} tok: {name} peak MiB"] = scope[name].peak_bytes / 2**20
        t = pd.DataFrame(parts).reset_index().rename(columns={"buffer_dtype": "buffer"})
        out[dev] = t
    return out


# (stem, plot, caption): a new figure is one function above and one line here
FIGURES = (("fp32_memory_pool", plot_pool, "Graph-pool bytes of the norm captured alone against the budget in "
              "merged tokens: the allocator model as lines, CUDA measurements as circles, fp32 temporaries dotted"),
             ("fp32_memory_tower", plot_tower, "What each norm adds to the pool of the captured tower, and the "
              "runner placement's transient peak, each bar labelled in MiB (CUDA runs only)"))

summarize = Summarizer(findings=findings, figures=FIGURES, key_numbers=key_numbers, key_caption="Graph-pool bytes of the norm captured alone on {device} (model: allocation trace through the "
                "caching-allocator model; error = measured / model - 1)", per_preset=True)
