"""The correctness study's figures, key numbers and findings, from its tables (never runs a model)."""
from __future__ import annotations

from .. import Summarizer


import numpy as np
import pandas as pd

from ...encoder import STUDY_PLACEMENTS
from ...results.tables import wide
from ..plotting import is_cpu, legend_right
from .params import PATH_COLUMNS
from ...engines import NEWEST as NEWEST_VLLM

# ---- presentation ---------------------------------------------------------------------------
def path_column(df: pd.DataFrame) -> pd.Series:
    return np.where(df.path == "cudagraph", "cudagraph[" + df.buffer_dtype.astype(str) + "]", df.path)


def path_label(column: str, cpu: bool) -> str:
    """A path column as a figure names it: on a CPU the graph runner is emulated, not a CUDA graph."""
    return column.replace("cudagraph", "emulated graph") if cpu else column


# `identity` is itself the bug it models (a forgotten normalization: cast only), so the matrix of
# placements is drawn over the real implementations and identity gets its own.
FORGETFUL_NORMS = ("identity",)


def _select_norms(df: pd.DataFrame, norms) -> pd.DataFrame:
    df = _cells_wide(df)
    d = df[(df.case == "embedding") & df.rel_err.notna()].copy()
    if norms is None:
        return d[~d.norm.isin(FORGETFUL_NORMS)]
    return d[d.norm.isin(list(norms) + ["(unused)"])]


def matrix(df: pd.DataFrame, norms=None) -> pd.DataFrame:
    """placement x path table per family: 'ok' / 'WRONG' (all norms agree) or 'mixed', worst rel_err.

    norms: the implementations to aggregate over (default: all but identity)."""
    d = _select_norms(df, norms)
    d["column"] = path_column(d)

    def cell(g):
        verdict = "ok" if g.ok.all() else ("WRONG" if (~g.ok).all() else "mixed")
        return f"{verdict} ({g.rel_err.max():.1e})"

    m = d.groupby(["family", "placement", "column"]).apply(cell, include_groups=False).unstack("column")
    cols = [c for c in PATH_COLUMNS if c in m.columns]
    order = [p for p in STUDY_PLACEMENTS if p in m.index.get_level_values("placement")]
    return m[cols].reindex(pd.MultiIndex.from_product([sorted(d.family.unique()), order]))


def engine_cell(family: str) -> tuple[str, bool] | None:
    """The newest vLLM's own cell of ``family``: (the placement it normalizes in, whether it captures encoder
    graphs), from the family's spec; None for a family the workbench does not know."""
    from ...families import FAMILIES

    spec = FAMILIES.get(family)
    return None if spec is None else (spec.vllm_placement, spec.vllm_encoder_graphs)


def _engine_columns(columns, graphs: bool) -> list[str]:
    """The paths the engine runs: eager, and its graph runner's buffers where it captures the encoder."""
    return [c for c in columns if c == "eager" or (graphs and c.startswith("cudagraph"))]


def engine_verdicts(g: pd.DataFrame) -> list[str]:
    """Per family of ``g`` (wide cells with a ``column``): the newest vLLM's own cells, right or where wrong."""
    out = []
    for fam, f in g.groupby("family"):
        cell = engine_cell(fam)
        if cell is None:
            continue
        cells = f[(f.placement == cell[0]) & f.column.isin(_engine_columns(set(f.column), cell[1]))]
        paths = "eager and encoder graphs" if cell[1] else "eager"
        verdict = "not measured" if cells.empty else ("right" if cells.ok.all() else
                                                      "WRONG on " + ", ".join(sorted(set(cells[~cells.ok].column))))
        out.append(f"{fam} ({cell[0]}, {paths}): {verdict}")
    return out


def style_matrix(m: pd.DataFrame):
    """The matrix as a coloured pandas Styler (green right, red wrong, amber mixed)."""
    def colour(v):
        if not isinstance(v, str):
            return ""
        if v.startswith("ok"):
            return "background-color: #c8e6c9"
        return "background-color: #ffcdd2" if v.startswith("WRONG") else "background-color: #ffe0b2"
    return m.style.map(colour)


def plot_matrix(df: pd.DataFrame, title: str | None = None, norms=None):
    """Placement x path grid per family: green = right for every norm, red = wrong for every norm,
    amber = depends on the norm; each cell shows the worst rel_err vs the float64 reference.

    norms: the implementations to aggregate over (default: all but identity)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    d = _select_norms(df, norms)
    d["column"] = path_column(d)
    fams = sorted(d.family.unique())
    fig, axes = plt.subplots(1, len(fams), figsize=(6.2 * len(fams), 4.6), squeeze=False)
    cmap = ListedColormap(["#ef9a9a", "#ffe082", "#a5d6a7"])  # wrong, mixed, right
    for ax, fam in zip(axes[0], fams):
        g = d[d.family == fam]
        worst = g.groupby(["placement", "column"]).rel_err.max().unstack("column")
        frac = g.groupby(["placement", "column"]).ok.mean().astype("float64").unstack("column")
        cols = [c for c in PATH_COLUMNS if c in worst.columns]
        rows = [p for p in STUDY_PLACEMENTS if p in worst.index]
        worst, frac = worst.reindex(index=rows, columns=cols), frac.reindex(index=rows, columns=cols)
        code = np.where(frac.isna(), np.nan, np.where(frac == 1, 2, np.where(frac == 0, 0, 1)))
        ax.imshow(np.ma.masked_invalid(code.astype(float)), cmap=cmap, vmin=0, vmax=2, aspect="auto")
        for i in range(len(rows)):
            for j in range(len(cols)):
                v = worst.iat[i, j]
                if pd.isna(v) or np.isnan(code[i, j]):
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=8, color="grey")
                    continue
                mark = {2: "ok", 0: "WRONG", 1: "mixed"}[int(code[i, j])]
                ax.text(j, i, f"{mark}\n{v:.1e}", ha="center", va="center", fontsize=8)
        cell = engine_cell(fam)
        if cell is not None and cell[0] in rows:       # the newest vLLM's own cells, framed
            from matplotlib.patches import Rectangle
            for j in (cols.index(c) for c in _engine_columns(cols, cell[1])):
                ax.add_patch(Rectangle((j - 0.5, rows.index(cell[0]) - 0.5), 1, 1, fill=False, lw=2.5, ec="black"))
        # the path names of the tables, the buffer dtype on a line of its own (never overlapping)
        ax.set_xticks(range(len(cols)), [path_label(c, is_cpu(g)).replace("[", "\n[") for c in cols])
        ax.set_yticks(range(len(rows)), rows)
        devs = ", ".join(sorted(g.device.unique()))
        vllm = "" if cell is None else f"; {NEWEST_VLLM}: {cell[0]}{', encoder graphs' if cell[1] else ', eager'}"
        ax.set_title(f"{fam} ({g.dtype.iloc[0]}, {devs}{vllm})", fontsize=10)
    shown = ", ".join(sorted(set(d.norm) - {"(unused)"}))
    fig.suptitle(title or "Correctness: placement x path")
    fig.text(0.5, -0.04, f"cell text: worst rel_err vs float64 eager over the norm implementations {shown}; "
             "n/a: a uint8 buffer cannot hold normalized input; framed: the newest vLLM's own cells (where it "
             "normalizes, on the paths it runs)", ha="center", fontsize=8)
    fig.tight_layout()
    return fig


CONTROL_LABEL = "identity (no norm: control)"


def plot_rel_err(df: pd.DataFrame):
    """rel_err of every cell on a log scale, grouped by placement, one marker per path, with the
    tolerance line. The identity implementation (no normalization: a control, wrong wherever the
    device norm is relied on) is drawn apart as grey crosses, never mixed with the real norms."""
    import matplotlib.pyplot as plt

    df = _cells_wide(df)
    d = df[(df.case == "embedding") & df.rel_err.notna()].copy()
    d["column"] = path_column(d)
    cpu = is_cpu(d)
    control = d.norm.isin(FORGETFUL_NORMS)
    fig, ax = plt.subplots(figsize=(9, 4))
    places = [p for p in STUDY_PLACEMENTS if p in set(d.placement)]
    markers = dict(zip(PATH_COLUMNS, "osD^v"))
    series = [(col, g, markers.get(col, "o"), None, path_label(col, cpu)) for col, g in d[~control].groupby("column")]
    if control.any():
        series.append((None, d[control], "x", "0.35", CONTROL_LABEL))
    for k, (_, g, marker, color, label) in enumerate(series):
        x = [places.index(p) + 0.1 * (k - (len(series) - 1) / 2) for p in g.placement]
        ax.scatter(x, g.rel_err.clip(lower=1e-9), marker=marker, color=color, label=label, alpha=0.7)
    for tol in sorted(d.tolerance.unique()):
        ax.axhline(tol, color="k", ls="--", lw=0.8)
        ax.text(len(places) - 0.5, tol, f" tol {tol:g}", va="bottom", ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(places)), places)
    ax.set_ylabel("rel_err vs float64 reference")
    legend_right(ax, fontsize=8)
    ax.set_title(f"Every cell's relative error (all families and norms; {', '.join(sorted(d.device.unique()))})")
    return fig


def findings(df: pd.DataFrame) -> str:
    """The finding per (device, tower dtype): which placements are right on every path and which
    are wrong where, the error margin, the bf16 buffer, the identity control, kernel choice and
    the NaN hazard check; one sentence each."""
    df = _cells_wide(df)
    d = _select_norms(df, None).assign(column=lambda x: path_column(x))
    parts = []
    for (dev, dtype), g in d.groupby(["device", "dtype"]):
        own = df[(df.device == dev) & (df.dtype == dtype)]
        right = sorted(set(g.placement) - set(g[~g.ok].placement), key=STUDY_PLACEMENTS.index)
        lines = [f"On {dev} ({dtype} towers): right on every path: {', '.join(right) or 'none'}.",
                 f"Wrong: {'; '.join(_wrong(g)) or 'none'}.",
                 f"Right cells stay below {g[g.ok].rel_err.max():.1e} relative error, wrong ones start at "
                 f"{g[~g.ok].rel_err.min():.2f}." if (~g.ok).any() else
                 f"Every cell below {g.rel_err.max():.1e} relative error."]
        engine = engine_verdicts(g)
        if engine:
            lines.append(f"{NEWEST_VLLM}'s own cells (framed in the matrix): {'; '.join(engine)}.")
        buf = g[(g.path == "cudagraph") & g.ok & g.placement.isin(["processor", "runner", "device"])]
        buf = buf.groupby("buffer_dtype").rel_err.max()
        if dtype != "bfloat16" and {"bfloat16", "float32"} <= set(buf.index):
            lines.append(f"A bfloat16 graph buffer holding normalized floats: rel_err {buf['bfloat16']:.1e} "
                         f"(float32 buffer {buf['float32']:.1e}).")
        ident = own[(own.case == "embedding") & own.norm.isin(FORGETFUL_NORMS)]
        if len(ident):
            places = sorted(set(ident[ident.ok].placement), key=STUDY_PLACEMENTS.index)
            lines.append(f"Identity control (cast only, no norm): right only for "
                         f"{', '.join(places) or 'no placement'}.")
        kc = own[own.case == "kernel_choice"]
        if len(kc):
            lines.append(f"Same item alone vs in the mixed batch: {int(kc.bit_equal.astype(bool).sum())}/{len(kc)} "
                         f"bit-equal (largest rel_err {kc.rel_err.max():.1e}, tolerance {g.tolerance.min():.0e}).")
        hz = own[own.case == "nan_padding"]
        if len(hz):
            leaks = hz[~hz.ok.astype(bool)]
            lines.append(f"NaN hazard: no real row changed in {len(hz)} poisoned runs." if leaks.empty else
                         f"NaN hazard: real rows changed in {len(leaks)}/{len(hz)} runs "
                         f"({', '.join(leaks.placement + ' / ' + leaks.norm)}).")
        lines += _stale_finding(own)
        parts.append(" ".join(lines))
    return "\n\n".join(parts)


def _stale_finding(own: pd.DataFrame) -> list[str]:
    """The shared-buffer check: per padding logic, the cells where a stale row reached a real one."""
    if "padding" not in own:        # a run from before the check
        return []
    st = own[own.case == "stale_rows"]
    out = []
    for padding, g in st.groupby("padding"):
        bad = g[~g.ok.astype(bool)]
        out.append(f"Stale rows in {g.engine.iloc[0]}'s shared buffers, padding written as {padding}: "
                   + (f"no real row changed in {len(g)} runs." if bad.empty else
                      f"real rows changed in {len(bad)}/{len(g)} runs ({', '.join(bad.placement + ' / ' + bad.norm)})."))
    return out


def _wrong(g: pd.DataFrame) -> list[str]:
    """'<placement> on every path' / '<placement> on <paths>' for each placement with a wrong cell."""
    out = []
    for p in [p for p in STUDY_PLACEMENTS if p in set(g[~g.ok].placement)]:
        bad = [c for c in PATH_COLUMNS if c in set(g[(g.placement == p) & ~g.ok].column)]
        out.append(f"{p} on {'every path' if set(bad) == set(g[g.placement == p].column) else ', '.join(bad)}")
    return out


def _run_title(what: str, g: pd.DataFrame) -> str:
    from ..plotting import run_label

    name = str(g["run"].iloc[0]) if "run" in g else "local"
    return f"{what}, run {name} ({run_label(g)})"


def matrix_figure(g: pd.DataFrame):
    """One run's placement x path matrix (devices are never pooled in one plot)."""
    return plot_matrix(g, title=_run_title("Correctness matrix", g))


def rel_err_figure(g: pd.DataFrame):
    fig = plot_rel_err(g)
    fig.axes[0].set_title(_run_title("Every cell's relative error", g), fontsize=10)
    return fig


def _cells_wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (wide) from the long table; a wide frame passes through."""
    return wide(df) if "metric" in df.columns else df


# (stem, plot, caption): a new figure is one function above and one line here
FIGURES = (("correctness_matrix", matrix_figure, "Placement x path verdicts per family (green right for every "
              "norm, red wrong for every norm, amber norm-dependent), worst relative error in each cell"),
             ("correctness_rel_err", rel_err_figure, "Relative error of every cell against the float64 reference, "
              "by placement, with the tolerance; the identity norm (no normalization, a control expected to be wrong "
              "where the device norm is relied on) as grey crosses"))

summarize = Summarizer(findings=findings, figures=FIGURES, prepare=_cells_wide)
