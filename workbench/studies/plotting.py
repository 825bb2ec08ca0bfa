"""Shared presentation helpers: every study saves its figures the same way, labels them alike,
and shows progress the same way."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

import pandas as pd

from .. import limits
from ..results import slug as run_slug


def slug(text: str) -> str:
    """`workbench.results.folder.slug` of a figure stem, run or device name; 'x' where nothing usable
    is left (a figure is never refused for its name)."""
    return run_slug(text, empty="x")


def save_figure(fig, out_dir: str | Path, stem: str) -> list[Path]:
    """Save ``fig`` as ``<stem>.png`` (shown in the report) and ``<stem>.svg`` in ``out_dir``,
    close it, and return both paths (PNG first)."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{slug(stem)}.png", out_dir / f"{slug(stem)}.svg"]
    fig.savefig(paths[0], dpi=110, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def run_label(g: pd.DataFrame) -> str:
    """'<device>, <dtype>, <date>[, reference run]' for the rows of one run: the caption every
    figure carries so that numbers from different machines are never read as one."""
    dev = ", ".join(sorted(map(str, g["device"].unique()))) if "device" in g else "unknown device"
    parts = [dev]
    if "dtype" in g:
        parts.append("/".join(sorted(map(str, g["dtype"].dropna().unique()))))
    if "run_date" in g:
        parts.append(", ".join(sorted(map(str, g["run_date"].dropna().unique()))))
    if "reference" in g and bool(g["reference"].any()):
        parts.append("reference run")
    return ", ".join(p for p in parts if p)


def groups_by_run(table: pd.DataFrame) -> Iterable[tuple[str, pd.DataFrame]]:
    """(run name, rows) per run, reference runs last; a table without a run column is one group."""
    if "run" not in table:
        yield "local", table
        return
    order = (table[["run", "reference"]].drop_duplicates().sort_values(["reference", "run"])
             if "reference" in table else table[["run"]].drop_duplicates().sort_values("run"))
    for run in order["run"]:
        yield run, table[table["run"] == run]


def preset_groups(table: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(family, preset, rows) per preset of ``table``, in family then preset order (family ''
    where the table has no family column)."""
    cols = ["family", "preset"] if "family" in table else ["preset"]
    out = []
    for key, rows in table.groupby(cols, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        out.append(("" if len(cols) == 1 else str(key[0]), str(key[-1]), rows))
    return out


def labelled_runs(table: pd.DataFrame, by_preset: bool = False) -> Iterable[tuple[str, pd.DataFrame]]:
    """(`source_label`, rows) per run of `groups_by_run`: each run's rows with the name a finding
    or a key-number table gives its source; ``by_preset``: per (run, preset), the preset named
    first (a study that measures each tower on its own)."""
    for run, g in groups_by_run(table):
        if not by_preset or "preset" not in g:
            yield source_label(g, run), g
            continue
        for _, preset, part in preset_groups(g):
            yield f"{preset} on {source_label(part, run)}", part


def figures_by_run(table: pd.DataFrame, out_dir: str | Path, plots,
                   suffix: str = "") -> tuple[list[Path], dict[str, str], dict[str, str]]:
    """Per run of ``table`` (`groups_by_run`), every ``(stem, plot[, caption])`` of ``plots`` in
    order: ``plot(rows)`` saved as ``<stem>[-<suffix>]_<run>`` (`save_figure`); a plot that gives
    None has nothing to show for that run. Returns the PNG paths (the ones the report shows),
    {PNG file name: caption} for the plots that have one (what the figure shows; the report adds
    the run and device) and {PNG file name: run}."""
    figs, captions, runs = [], {}, {}
    for run, g in groups_by_run(table):
        for stem, plot, *caption in plots:
            fig = plot(g)
            if fig is not None:
                png = save_figure(fig, out_dir, f"{stem}{'-' + suffix if suffix else ''}_{run}")[0]
                figs.append(png)
                runs[png.name] = run
                if caption:
                    captions[png.name] = caption[0]
    return figs, captions, runs


def _plain_number(v: float) -> str:
    """10, 2000, 50k, 1.5M: short enough that neighbouring log ticks never run together."""
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _log_locator():
    """A LogLocator that puts 1-2-5 ticks per decade where the axis has room for their labels,
    decades only where it does not, and thins decades on a short axis."""
    import math

    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    from matplotlib.ticker import LogLocator

    class ReadableLogLocator(LogLocator):
        def tick_values(self, vmin, vmax):
            axis = self.axis
            if axis is None or not (vmin > 0 and vmax > 0) or vmin == vmax:
                return super().tick_values(vmin, vmax)
            ax, fig = axis.axes, axis.axes.figure
            horizontal = axis is ax.xaxis
            length = (ax.bbox.width if horizontal else ax.bbox.height) / fig.dpi        # inches
            size = FontProperties(size=rcParams["xtick.labelsize" if horizontal else "ytick.labelsize"]
                                  ).get_size_in_points()
            # room one label needs along the axis: ~5 characters wide, or one line high
            need = (5 * 0.6 if horizontal else 1.6) * size / 72
            per_decade = length / max(abs(math.log10(vmax / vmin)), 1e-9)
            subs = (1.0, 2.0, 5.0) if per_decade * math.log10(2) >= need else (1.0,)   # 1 -> 2: the closest pair
            self.set_params(subs=subs, numticks=max(2, int(length / need)))
            return super().tick_values(vmin, vmax)

    return ReadableLogLocator(base=10)


def plain_log_ticks(axis) -> None:
    """Log-axis tick labels as plain numbers (10, 20, 50, 100, 50k), not 2x10^1, never so many
    that neighbours overlap (1-2-5 per decade only where there is room)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(_log_locator())
    axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _plain_number(v)))
    axis.set_minor_formatter(NullFormatter())


def value_ticks(axis, values) -> None:
    """Major ticks at exactly ``values`` (the measured sizes), labelled as plain numbers, no minor
    ticks: a log axis over a few sizes reads best this way."""
    from matplotlib.ticker import NullLocator

    ticks = sorted({float(v) for v in values})
    axis.set_ticks(ticks, [str(int(v)) if v == int(v) else f"{v:g}" for v in ticks])
    axis.set_minor_locator(NullLocator())


# ---- honest CPU figures ---------------------------------------------------------------------
# A CPU run is a smoke test of the wiring: its times are host times of tiny towers on a shared
# machine, its graph runner is emulated (the same buffers replayed eagerly), and it has no
# device floor worth drawing. Every figure that draws a CPU run's times says so on its axes.

CPU_STAMP = "CPU smoke test, not a measurement"
STAMP_GID = "cpu-stamp"


def cpu_device(name: object) -> bool:
    """True for a CPU device label ('cpu', 'cpu: <model>')."""
    return str(name).strip().lower().startswith("cpu")


def is_cpu(g: pd.DataFrame) -> bool:
    """True when every row of ``g`` ran on a CPU (an empty or device-less table is not)."""
    return "device" in g and len(g) > 0 and all(cpu_device(d) for d in g["device"].unique())


def graph_name(cpu: bool) -> str:
    """What the runner's replay is called in a figure: a CUDA graph only where it is one."""
    return "emulated graph runner" if cpu else "CUDA graph"


def stamp_cpu(*axes) -> None:
    """Write `CPU_STAMP` in red right above each of ``axes``' title: always in view, never over
    the data or the title. Call after the title is set."""
    for ax in axes:
        ax.annotate(CPU_STAMP, xy=(0.5, 1.0), xycoords=ax.title, xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9, fontweight="bold", color="#c62828", gid=STAMP_GID)


def panel_grid(n: int, most_cols: int, width: float):
    """A figure of ``n`` panels, at most ``most_cols`` a row, ``width`` inches each; the unused hidden."""
    import matplotlib.pyplot as plt

    ncols = min(most_cols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def legend_right(ax, handles=None, labels=None, **kw):
    """``ax``'s legend right of its axes, top-aligned: outside the data, whatever it holds."""
    args = () if handles is None else (handles, labels)
    kw = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, **kw}
    return ax.legend(*args, **kw)


def legend_under(ax, handles=None, labels=None, ncol: int = 2, **kw):
    """``ax``'s legend under its x-axis label (outside the axes, whatever their height)."""
    from matplotlib.transforms import offset_copy

    args = () if handles is None else (handles, labels)
    below = offset_copy(ax.transAxes, fig=ax.figure, y=-34, units="points")   # tick labels and x label
    kw = {"fontsize": 7, "loc": "upper center", "bbox_to_anchor": (0.5, 0.0), "bbox_transform": below,
          "ncol": ncol, "frameon": False, **kw}
    return ax.legend(*args, **kw)


def legend_below(fig, handles, labels, ncol: int = 4, **kw):
    """One legend for every panel of ``fig``, under the figure's bottom edge (outside every axes;
    `save_figure`'s tight bounding box keeps it). Call after ``fig.tight_layout()``."""
    kw = {"fontsize": 7, "frameon": False, **kw}
    return fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                      ncol=max(1, min(ncol, len(labels))), **kw)


def source_label(g: pd.DataFrame, run: str) -> str:
    """'<device>' for a table without runs, else '<device> (run <name>[, reference])': how a
    finding names the source of its numbers."""
    dev = ", ".join(sorted(map(str, g["device"].unique())))
    if "run" not in g:
        return dev
    ref = ", reference" if "reference" in g and bool(g["reference"].any()) else ""
    return f"{dev} (run {run}{ref})"


PROGRESS_ENV = limits.PROGRESS_ENV
# a file the sweep names per study: every bar of the study writes its count there, so the sweep can
# say on the console how far a study in a notebook (another process) has come
PROGRESS_FILE_ENV = "WORKBENCH_PROGRESS_FILE"
PROGRESS_KEYS = ("done", "total", "desc")      # what a progress file holds, and all it holds


def progress_file() -> str | None:
    """``$WORKBENCH_PROGRESS_FILE`` (None where unset or empty) where the count may go there. Each count replaces
    the file, so a path that exists must be an empty file or a progress file (a JSON object of PROGRESS_KEYS);
    anything else (a user's file, a link, a FIFO) is refused, a ValueError naming the variable and the path,
    and never written over. A folder, or a path under a missing folder, is taken: writing there fails and
    counts nothing (progress is a courtesy)."""
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return path
    if stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and (st.st_size == 0 or _is_progress(path))):
        return path
    kind = "a file that is not a progress file" if stat.S_ISREG(st.st_mode) else "not a regular file"
    raise ValueError(f"{PROGRESS_FILE_ENV}={path!r}: it exists and is {kind} (one holds a JSON object of "
                     f"{', '.join(PROGRESS_KEYS)}); the progress count replaces its file on every write, so it "
                     f"never writes over another: name a new file, or unset the variable")


def _is_progress(path: str) -> bool:
    import json

    from ..files import read_regular
    try:
        data = json.loads(read_regular(path, 64 << 10))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and sorted(data) == sorted(PROGRESS_KEYS)


class _CountingBar:
    """A bar that also writes {"done", "total", "desc"} to ``path`` (at most every half second,
    and at close); iteration and ``update``/``close`` pass through to ``bar``."""

    def __init__(self, bar, iterable, total, desc, path):
        self.bar, self.iterable, self.desc, self.path = bar, iterable, desc, path
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.n, self._written = 0, 0.0

    def _write(self, force: bool = False) -> None:
        import json
        import time

        now = time.monotonic()
        if not force and now - self._written < 0.5:
            return
        self._written = now
        tmp = f"{self.path}.{os.getpid()}.tmp"     # a new file of its own: never one that was there
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as fh:
                json.dump(dict(zip(PROGRESS_KEYS, (self.n, self.total, self.desc))), fh)
        except OSError:
            return    # progress is a courtesy: it never stops a study
        try:
            os.replace(tmp, self.path)
        except OSError:
            os.unlink(tmp)     # e.g. the path is a folder: no stray file beside it

    def __iter__(self):
        for item in self.bar:
            yield item
            self.n += 1
            self._write()
        self._write(force=True)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        self.n += n
        self._write()

    def close(self) -> None:
        self.bar.close()
        self._write(force=True)


def progress(iterable=None, *, total: int | None = None, desc: str = "", enabled: bool = True):
    """A tqdm progress bar for long study work. Off when ``enabled`` is False or
    ``$WORKBENCH_PROGRESS`` is off (0, false, no or off; the sweep sets it for notebooks it executes: papermill shows
    cell progress, and bar fragments would litter the executed notebook); a notebook widget where
    ipywidgets is installed, plain text otherwise (never tqdm's "IProgress not found" warning).
    With ``$WORKBENCH_PROGRESS_FILE`` set (the sweep, per study) the count also goes to that file,
    shown or not (`progress_file`: an existing file that is not a progress file is refused, never replaced)."""
    path = progress_file()
    bar = _bar(iterable, total=total, desc=desc, enabled=enabled)
    return _CountingBar(bar, iterable, total, desc, path) if path else bar


def _bar(iterable=None, *, total: int | None = None, desc: str = "", enabled: bool = True):
    from tqdm.std import tqdm as text_bar

    if not enabled or not limits.switch(PROGRESS_ENV, True):
        return text_bar(iterable, total=total, desc=desc, disable=True)
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm as bar
    except ImportError:
        bar = text_bar
    return bar(iterable, total=total, desc=desc)


def per_run(table: pd.DataFrame, paragraph, by_preset: bool = False) -> str:
    """A finding: ``paragraph(source label, rows of one run)`` for every run of ``table``
    (`labelled_runs`, per preset too with ``by_preset``), joined as paragraphs."""
    return "\n\n".join(paragraph(dev, g) for dev, g in labelled_runs(table, by_preset))
