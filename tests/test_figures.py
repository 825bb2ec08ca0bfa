"""Every declared figure, drawn from small tables: a one-budget CPU run of each study (its run
function with the cheapest parameters) and the newest committed GPU reference run (whole, and cut to
one budget), plus the norm-bandwidth benchmark's figures. Each figure must

(a) show a one-point series: a Line2D with one point has a marker (a line alone draws nothing);
(b) keep every legend off the data: no data point, line or bar inside the axes lies under a legend;
    and no two tick labels of an axis overlap;
(c) for CPU rows: carry the "CPU smoke test" stamp where it draws times, call nothing a CUDA graph
    (the CPU runner is emulated) and draw no floor or ceiling (a CPU has no meaningful one).
"""
from __future__ import annotations

import importlib

import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from workbench.studies import discover, load_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference"
STUDIES = discover()
STAMP = "CPU smoke test"
# the figures that draw times (on a CPU: host times of tiny towers, a smoke test)
TIMING = {"cast_cost", "cast_cost_fill", "encoder_latency", "encoder_latency_phases", "encoder_latency_mixes",
          "padding_waste_replay", "norm_bw_pct", "norm_bw_p50"}

# two towers where a study draws a panel per tower; the cheapest CPU run of each study, one budget
# (or token count) each
TWO_PRESETS = ["tiny-qwen2-vl", "tiny-glm4v"]
CPU_PARAMS = {
    "cast_cost": dict(presets=TWO_PRESETS, budgets=[16], fills=[1.0], reps=1, depth=1),
    "fp32_memory": dict(presets=TWO_PRESETS, budgets=[16], depth=1),
    "padding_waste": dict(presets=TWO_PRESETS, reps=1, n_items=2, max_items=[1], depth=1,
                          budget_sets=["pow2", "planner"]),
    "encoder_latency": dict(presets=["tiny-qwen2-vl"], tokens=[16], images=[1], reps=1, warmup=0, depth=1,
                            mixes=["photos"], mix_items=[1]),
    "correctness": dict(families=["tiny-qwen2-vl"], depth=1, placements=["tower", "runner"],
                        norms=["eager", "identity"], paths=["eager", "cudagraph"],
                        buffer_dtypes=["uint8", "bfloat16"], budgets=[64], max_items=4, hazard=False,
                        max_pixels=56 * 56),
}
# the column that holds a study's budget, to cut a reference run down to one
BUDGET_COLUMN = {"cast_cost": "budget", "fp32_memory": "budget", "encoder_latency": "tokens"}
def declared(name: str):
    """The summary declaration (workbench.studies.Summarizer) of study ``name``'s folder."""
    return importlib.import_module(f"workbench.studies.{name}.summary").summarize


FIGURES = [(name, stem) for name in sorted(CPU_PARAMS) for stem, *_ in declared(name).figures]


@pytest.fixture(scope="module")
def cpu_tables() -> dict[str, pd.DataFrame]:
    out = {}
    for name, params in CPU_PARAMS.items():
        t = STUDIES[name].run(device="cpu", progress=False, **params)
        out[name] = _prepared(name, t.assign(run="cpu-run", reference=False))
    return out


def _prepared(name: str, table: pd.DataFrame) -> pd.DataFrame:
    prepare = declared(name).prepare
    return prepare(table) if prepare is not None else table


def _newest_reference(name: str) -> pd.DataFrame:
    run = sorted(REFERENCE.glob(f"*/{name}.parquet"))[-1]
    return _prepared(name, load_table(run).assign(run=run.parent.name, reference=True))


@pytest.fixture(scope="module")
def gpu_tables() -> dict[str, pd.DataFrame]:
    return {name: _newest_reference(name) for name in CPU_PARAMS}


def _one_budget(name: str, table: pd.DataFrame) -> pd.DataFrame:
    col = BUDGET_COLUMN.get(name)
    if col is None or col not in table:
        return table
    keep = table[col].isna() | (table[col] == table[col].dropna().min())
    if name == "encoder_latency":
        keep &= table["images"].isna() | (table["images"] == 1)
    return table[keep]


def _draw(name: str, stem: str, table: pd.DataFrame):
    plot = {s: p for s, p, *_ in declared(name).figures}[stem]
    fig = plot(table)
    if fig is not None:
        fig.canvas.draw()
    return fig


# ---- what is on a figure ----------------------------------------------------------------------

def _drawn(line) -> bool:
    return line.get_linestyle() not in ("None", "", " ") or line.get_marker() not in (None, "None", "", " ")


def _has_marker(line) -> bool:
    return line.get_marker() not in (None, "None", "", " ")


def _finite_points(line) -> np.ndarray:
    xy = np.asarray(line.get_xydata(), dtype=float).reshape(-1, 2)
    return xy[np.isfinite(xy).all(axis=1)]


def _inside(ax, pts: np.ndarray) -> np.ndarray:
    """The display points of ``pts`` (display coordinates) that lie inside ``ax``."""
    box = ax.get_window_extent()
    if len(pts) == 0:
        return pts
    ok = (pts[:, 0] >= box.x0 - 0.5) & (pts[:, 0] <= box.x1 + 0.5) & (pts[:, 1] >= box.y0 - 0.5) & (
        pts[:, 1] <= box.y1 + 0.5)
    return pts[ok]


def _line_points(line) -> np.ndarray:
    """Display points along ``line``: its vertices, and where it is drawn as a line, 20 points per
    segment between them."""
    pts = line.get_transform().transform(_finite_points(line))
    if line.get_linestyle() in ("None", "", " ") or len(pts) < 2:
        return pts
    t = np.linspace(0, 1, 21)[:, None]
    return np.concatenate([a + t * (b - a) for a, b in zip(pts[:-1], pts[1:])])


def _data_points(ax) -> np.ndarray:
    """Display coordinates of the data drawn inside ``ax``: lines (sampled) and scatter points."""
    parts = [_line_points(ln) for ln in ax.get_lines() if ln.get_visible() and _drawn(ln)]
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible() and len(coll.get_offsets()):
            offsets = np.ma.filled(np.ma.masked_invalid(np.asarray(coll.get_offsets(), dtype=float)), np.nan)
            offsets = offsets[np.isfinite(offsets).all(axis=1)]
            parts.append(coll.get_offset_transform().transform(offsets))
    parts = [p for p in parts if len(p)]
    return _inside(ax, np.concatenate(parts)) if parts else np.empty((0, 2))


def _bars(ax) -> list:
    """Window extents of the bars with ink inside ``ax``."""
    box = ax.get_window_extent()
    out = []
    for p in ax.patches:
        if isinstance(p, Rectangle) and p.get_visible() and p.get_width() != 0 and p.get_height() != 0:
            e = p.get_window_extent()
            if e.width > 0.5 and e.height > 0.5 and e.overlaps(box):
                out.append(e)
    return out


def _legends(fig) -> list:
    return [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def _labels(fig) -> list[str]:
    """The labels of every data artist and legend entry."""
    labels = [a.get_label() for ax in fig.axes for a in [*ax.get_lines(), *ax.collections, *ax.patches]]
    labels += [t.get_text() for leg in _legends(fig) for t in leg.get_texts()]
    return [lab for lab in labels if lab and not lab.startswith("_")]


def check_one_point_series_visible(fig) -> None:
    """(a): a mark is drawn, and no line with one point lacks a marker."""
    marks = 0
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for line in ax.get_lines():
            pts = _finite_points(line)
            if len(pts):
                inside = _inside(ax, line.get_transform().transform(pts))
                assert len(np.unique(pts, axis=0)) > 1 or _has_marker(line), \
                    f"one-point line {line.get_label()!r} has no marker: nothing is drawn"
                marks += bool(len(inside)) and _has_marker(line)
        marks += len(_data_points(ax)) + len(_bars(ax)) + len(ax.images)
    assert marks > 0, "the figure draws no mark"


def check_legends_off_the_data(fig) -> None:
    """(b): no legend covers a data point, line or bar inside an axes."""
    renderer = fig.canvas.get_renderer()
    for leg in _legends(fig):
        box = leg.get_window_extent(renderer).padded(-1)
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            pts = _data_points(ax)
            hit = pts[(pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1)]
            assert not len(hit), f"a legend covers {len(hit)} data point(s) of {ax.get_title()!r}"
            covered = [b for b in _bars(ax) if b.overlaps(box)]
            assert not covered, f"a legend covers {len(covered)} bar(s) of {ax.get_title()!r}"


def check_tick_labels_apart(fig) -> None:
    """No two tick labels of one axis overlap (no '50000100000200000')."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            shown = [t.get_window_extent(renderer) for t, loc in zip(axis.get_majorticklabels(),
                                                                    axis.get_majorticklocs())
                     if t.get_visible() and t.get_text() and lo <= loc <= hi]
            key = (lambda b: b.x0) if axis is ax.xaxis else (lambda b: b.y0)
            shown.sort(key=key)
            for a, b in zip(shown, shown[1:]):
                assert not a.padded(-0.5).overlaps(b.padded(-0.5)), \
                    f"tick labels overlap on {ax.get_title()!r}: {[t.get_text() for t in axis.get_majorticklabels()]}"


def check_cpu_honest(fig, stem: str) -> None:
    """(c): stamped where it draws times, no CUDA graph, no floor or ceiling."""
    texts = _texts(fig)
    stamped = any(STAMP in t for t in texts)
    assert stamped == (stem in TIMING), f"{stem}: stamp {'missing' if not stamped else 'on a figure without times'}"
    assert not [t for t in texts if re.search(r"cuda ?graph", t, re.I)], "a CPU figure names a CUDA graph"
    floors = [lab for lab in _labels(fig) if re.search(r"floor|ceiling", lab, re.I)]
    floors += [t for t in texts if re.search(r"x floor", t)]
    assert not floors, f"a CPU figure draws floors: {floors}"


# ---- the studies' figures ---------------------------------------------------------------------

@pytest.mark.parametrize("name,stem", FIGURES)
def test_a_cpu_run_of_one_budget_draws_honest_visible_figures(name, stem, cpu_tables):
    fig = _draw(name, stem, cpu_tables[name])
    if fig is None:           # GPU-only figures (tower pool, kernels) have nothing to show for a CPU run
        assert stem in {"fp32_memory_tower", "encoder_latency_kernels"}
        return
    try:
        check_one_point_series_visible(fig)
        check_legends_off_the_data(fig)
        check_tick_labels_apart(fig)
        check_cpu_honest(fig, stem)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("cut", ["whole", "one budget"])
@pytest.mark.parametrize("name,stem", FIGURES)
def test_a_gpu_reference_run_draws_visible_figures_with_free_legends(name, stem, cut, gpu_tables):
    table = gpu_tables[name] if cut == "whole" else _one_budget(name, gpu_tables[name])
    fig = _draw(name, stem, table)
    if fig is None:
        return
    try:
        check_one_point_series_visible(fig)
        check_legends_off_the_data(fig)
        check_tick_labels_apart(fig)
        assert not any(STAMP in t for t in _texts(fig)), "a GPU run stamped as a CPU smoke test"
    finally:
        plt.close(fig)


def test_the_identity_control_is_drawn_apart_in_the_rel_err_figure(cpu_tables):
    """In the CPU table the real norm is right in every cell and identity wrong in every cell: the
    path series must hold only right points, the control series only wrong ones."""
    fig = _draw("correctness", "correctness_rel_err", cpu_tables["correctness"])
    series = {c.get_label(): np.asarray(c.get_offsets())[:, 1] for c in fig.axes[0].collections
              if isinstance(c, PathCollection)}
    plt.close(fig)
    control = series.pop("identity (no norm: control)")
    assert series and (control > 0.5).all()
    assert all((y < 1e-2).all() for y in series.values()), {k: y.max() for k, y in series.items()}


def test_phase_labels_say_what_each_number_is(cpu_tables):
    fig = _draw("encoder_latency", "encoder_latency_phases", cpu_tables["encoder_latency"])
    notes = [t for t in _texts(fig) if " ms" in t or " us" in t]
    plt.close(fig)
    assert notes and all(re.search(r"phases .+, call p50 ", t) for t in notes), notes


def test_the_pool_figure_reads_in_merged_tokens(cpu_tables):
    fig = _draw("fp32_memory", "fp32_memory_pool", cpu_tables["fp32_memory"])
    xlabels = {ax.get_xlabel() for ax in fig.axes if ax.get_visible()}
    texts = _texts(fig)
    plt.close(fig)
    assert all("merged tokens" in x for x in xlabels), xlabels
    # the bfloat16 -> bf16 identity is a no-op cast: 0 B, which a log axis cannot draw; the legend says so
    assert any(t.startswith("identity: 0 B") for t in texts)


def test_every_tower_bar_is_labelled_and_a_negative_one_explained():
    """The first reference run's tower pools hold zeros and negative differences (-10 MiB)."""
    run = REFERENCE / "20261130T074611Z-2fedbe0-h200" / "fp32_memory.parquet"
    fig = _draw("fp32_memory", "fp32_memory_tower", _prepared("fp32_memory", load_table(run).assign(
        run=run.parent.name, reference=True)))
    try:
        notes = set()
        for ax in fig.axes:
            bars = [p for p in ax.patches if isinstance(p, Rectangle)]
            assert len(ax.texts) >= len(bars), "a bar without its label"
            notes |= {t.get_text() for t in ax.texts}
        assert {"0", "-10"} <= notes
        assert any("below 0" in t for t in _texts(fig))
    finally:
        plt.close(fig)


@pytest.mark.parametrize("lo,hi,inches", [(4096, 65536, 5), (50000, 300000, 2.5), (3000, 700000, 3),
                                          (1, 1e6, 4), (20, 2000, 6), (0.5, 3, 4)])
def test_log_tick_labels_never_run_together(lo, hi, inches):
    from workbench.studies.plotting import plain_log_ticks

    fig, ax = plt.subplots(figsize=(inches, 2.5))
    ax.plot([lo, hi], [lo, hi], "o-")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    fig.canvas.draw()
    try:
        check_tick_labels_apart(fig)
        assert all(len([t for t in axis.get_majorticklabels() if t.get_text()]) >= 2 for axis in (ax.xaxis, ax.yaxis))
    finally:
        plt.close(fig)


# ---- the norm-bandwidth benchmark ---------------------------------------------------------------

def _bandwidth_figures(monkeypatch, tmp_path, device: str, one_size: bool) -> dict:
    """The benchmark's figures from the committed H200 file (on ``device``, optionally one row
    count only), kept open: {stem suffix: Figure}."""
    from workbench.benchmarks.norm_bandwidth import summary as nb
    from workbench.studies import plotting

    doc = json.loads((REFERENCE / "norm_bw-h200-20261130.json").read_text())
    recs = nb.records(doc)
    if one_size:
        recs = [r for r in recs if r["n_rows"] == min(x["n_rows"] for x in recs)]
    kept = {}

    def keep(fig, out_dir, stem):
        fig.canvas.draw()
        kept["norm_bw_" + stem.rsplit("_", 1)[-1]] = fig
        return [Path(out_dir) / f"{stem}.png"]
    monkeypatch.setattr(plotting, "save_figure", keep)
    nb.figures(recs, device, "2026-11-30", doc.get("sm_copy_gbs"), tmp_path, "norm_bw")
    return kept


@pytest.mark.parametrize("device", ["NVIDIA H200", "cpu: test host"])
@pytest.mark.parametrize("one_size", [False, True])
def test_the_bandwidth_figures(monkeypatch, tmp_path, device, one_size):
    figs = _bandwidth_figures(monkeypatch, tmp_path, device, one_size)
    assert set(figs) == {"norm_bw_pct", "norm_bw_p50"}
    try:
        for stem, fig in figs.items():
            check_one_point_series_visible(fig)
            check_legends_off_the_data(fig)
            check_tick_labels_apart(fig)
            if device.startswith("cpu"):
                check_cpu_honest(fig, stem)
    finally:
        for fig in figs.values():
            plt.close(fig)
