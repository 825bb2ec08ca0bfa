"""What the page shows, as data: one `StudySection` per study with one `View` per device and kind (the
newest run, the older runs), each summarized by the study on its own rows, with figures, captions and
key-number tables as DataFrames (a CSV beside each), and the newest run against the one before it
(workbench.compare). Nothing here renders HTML.
"""
from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..runstate import slug
from .output import _regular
from .runs import Run, TableProblem, study_table

COMPARE_ROWS = 12                    # flagged rows shown per comparison (all of them in its CSV)
DIFF_CELLS = 8                       # changed verdict cells named per older run


@dataclass
class View:
    """One summarize call: the newest run(s) of a device (``kind`` "newest": per family where the table
    has a ``family`` column), or its older runs ("older"). CPU and older views are folded on the page."""

    kind: str
    device: str
    runs: list[str]
    text: str = ""
    figures: list[str] = field(default_factory=list)    # paths relative to the report folder
    svgs: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)   # figure -> what it shows, which run
    groups: dict[str, str] = field(default_factory=dict)     # figure -> its group (a run, a tower of it)
    tables: list[tuple[str, Any, str]] = field(default_factory=list)   # (caption, DataFrame, CSV file)
    diffs: list[str] = field(default_factory=list)      # older views: verdicts against the newest
    error: str | None = None
    folded: bool = False
    errata: list[str] = field(default_factory=list)     # known problems of its runs (errata.json)

    @property
    def cpu(self) -> bool:
        return is_cpu(self.device)


@dataclass
class Comparison:
    """The newest run of a study on one device against the run before it (workbench.compare)."""

    device: str
    newer: str
    older: str
    line: str                       # what changed, in one line
    table: Any = None               # DataFrame of the flagged rows (at most COMPARE_ROWS)
    csv: str = ""                   # every compared value, relative to the report folder
    flagged: int = 0


@dataclass
class StudySection:
    name: str
    question: str
    runs: list[str]
    text: str = ""                  # the lead view's finding (newest GPU run, else newest CPU run)
    figures: list[str] = field(default_factory=list)    # every view's, relative to the report folder
    error: str | None = None
    table_problems: list[str] = field(default_factory=list)   # "run X: table unreadable: ..."
    missing_devices: list[str] = field(default_factory=list)  # devices seen elsewhere, not here
    views: list[View] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    per_preset: bool = False        # its finding has a paragraph per tower (family): each is a key finding


def is_cpu(device: str) -> bool:
    """Whether a table's device name is a CPU ('cpu: <model>'): a smoke test, not a measurement."""
    return str(device).strip().lower().startswith("cpu")


def _slug(text: str) -> str:
    return slug(text, empty="x")


def _runs_words(runs: list[str]) -> str:
    return f"run{'s' if len(runs) > 1 else ''} {', '.join(runs)}"


def _figures_in(paths, base: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """Figure files (absolute or relative to ``base``) as paths relative to ``root``; of a PNG/SVG pair
    the PNG shown and its SVG linked. ValueError for a figure that is not a regular file in ``root``."""
    rels: list[str] = []
    for fig in map(Path, paths):
        fig = fig if fig.is_absolute() else base / fig
        fig = fig.parent.resolve() / fig.name            # its folder's real place; the file itself not followed
        if not _regular(fig) or root not in fig.parents:
            raise ValueError(f"figure {fig} is missing, outside the report folder or not a regular file "
                             "(a link, a folder...): not shown")
        rel = fig.relative_to(root).as_posix()
        if rel not in rels:
            rels.append(rel)
    stems = [Path(r).with_suffix("").as_posix() for r in rels if not r.lower().endswith(".svg")]
    shown = [r for r in rels if not (r.lower().endswith(".svg") and Path(r).with_suffix("").as_posix() in stems)]
    svgs = {r: Path(r).with_suffix(".svg").as_posix() for r in shown
            if not r.lower().endswith(".svg") and _regular(root / Path(r).with_suffix(".svg"))}
    return shown, svgs


def _starts(runs: list[Run]) -> dict[str, str]:
    """logical run name -> its (latest) start time."""
    out: dict[str, str] = {}
    for r in runs:
        out[r.logical_name] = max(out.get(r.logical_name, ""), r.started)
    return out


def newest_mask(table, starts: Mapping[str, str]):
    """The rows of the newest run of each device (and family: a later run of one family does not
    hide the other's newest numbers), as a boolean Series."""
    import pandas as pd

    mask = pd.Series(False, index=table.index)
    keys = ["device"] + (["family"] if "family" in table.columns else [])
    for _, g in table.groupby(keys, dropna=False, sort=False):
        run = max(g["run"].astype(str).unique(), key=lambda r: (starts.get(r, ""), r))
        mask[g.index[g["run"].astype(str) == run]] = True
    return mask


def _device_order(table, starts: Mapping[str, str]) -> list[str]:
    """GPUs first, then CPUs, each by its newest run, newest first."""
    newest = {str(dev): max(starts.get(str(r), "") for r in g["run"].unique())
              for dev, g in table.groupby("device", dropna=True, sort=False)}
    return sorted(sorted(newest, key=lambda d: (newest[d], d), reverse=True), key=is_cpu)


def _runs_newest_first(g, starts: Mapping[str, str]) -> list[str]:
    return sorted(map(str, g["run"].unique()), key=lambda r: (starts.get(r, ""), r), reverse=True)


def _verdict_diffs(study: str, older, newest, starts: Mapping[str, str]) -> list[str]:
    """One line per older run: its verdicts against the newest run's, "unchanged" or the cells that changed."""
    from ..compare import compare_tables, verdict_changes

    if "unit" not in older.columns or not (older["unit"] == "bool").any():
        return []
    ref = ", ".join(_runs_newest_first(newest, starts))
    lines = []
    for run in _runs_newest_first(older, starts):
        rows = older[older["run"].astype(str) == run]
        cmp = compare_tables(rows[rows["unit"] == "bool"], newest[newest["unit"] == "bool"], study=study)
        changed = verdict_changes(cmp) if len(cmp) else []
        if not len(cmp):
            lines.append(f"{run}: no verdict in common with {ref}")
        elif not changed:
            lines.append(f"{run}: unchanged ({len(cmp)} verdicts shared with {ref})")
        else:
            more = len(changed) - DIFF_CELLS
            more_words = f"; and {more} more (in the comparison CSV)" if more > 0 else ""
            lines.append(f"{run}: {len(changed)} of {len(cmp)} verdicts differ from {ref}: "
                         + "; ".join(changed[:DIFF_CELLS]) + more_words)
    return lines


class Csvs:
    """CSV files written beside the page, one per table shown, each name used once."""

    def __init__(self, root: Path):
        self.root, self.used = root, set()

    def write(self, df, *parts: str) -> str:
        base = "-".join(_slug(str(p))[:48] for p in parts if str(p)) or "table"
        name, i = f"{base}.csv", 2
        while name in self.used:
            name, i = f"{base}-{i}.csv", i + 1
        self.used.add(name)
        df.to_csv(self.root / name, index=False)
        return name


def _figure_runs(fig: str, study: str, runs: list[str]) -> tuple[str, str | None]:
    """(what the figure shows, the run it belongs to) from its file name ``<stem>_<run>``."""
    stem = Path(fig).stem
    run = next((r for r in sorted(runs, key=len, reverse=True) if stem.endswith("_" + _slug(r))), None)
    if run is not None:
        stem = stem[: -len(_slug(run)) - 1]
    if stem.startswith(study):
        stem = stem[len(study):]
    return " ".join(stem.replace("_", " ").replace("-", " ").split()), run


def _caption(fig: str, study: str, view_runs: list[str], by_run: Mapping[str, Run], device: str,
             shows: str | None = None) -> str:
    """What a figure shows (the Summary's words, else its file name's) and its device, run, start time."""
    what, run = _figure_runs(fig, study, view_runs)
    title = shows.rstrip(". ") if shows else f"{study}{': ' + what if what else ''}"
    if run is None:
        return f"{title}, {device}, from run{'s' if len(view_runs) > 1 else ''} {', '.join(view_runs)}."
    r = by_run.get(run)
    when = f", started {r.started[:16].replace('T', ' ')} UTC" if r is not None and r.started else ""
    ref = ", reference run" if r is not None and r.reference else ""
    cpu = " CPU smoke test: timings here are not measurements." if is_cpu(device) else ""
    return f"{title}, {device}, run {run}{when}{ref}.{cpu}"


def _summarize_view(study: Any, view: View, rows, fig_dir: Path, out_dir: Path,
                    by_run: Mapping[str, Run], csvs: Csvs) -> None:
    from ..studies import Summary

    fig_dir.mkdir(parents=True, exist_ok=True)
    result = study.summarize(rows.reset_index(drop=True), fig_dir)
    if isinstance(result, str):
        result = Summary(text=result)
    view.text = result.text
    view.tables = [(caption, df, csvs.write(df, study.name, view.device, view.kind, caption))
                   for caption, df in getattr(result, "tables", [])]
    view.figures, view.svgs = _figures_in(result.figures, fig_dir, out_dir)
    own = getattr(result, "captions", None) or {}       # {file name: what it shows}
    view.captions = {f: _caption(f, study.name, view.runs, by_run, view.device, own.get(Path(f).name))
                     for f in view.figures}
    groups = getattr(result, "groups", None) or {}
    view.groups = {f: groups[Path(f).name] for f in view.figures if Path(f).name in groups}


def _comparison(study: str, device: str, g, starts: Mapping[str, str], csvs: Csvs) -> Comparison | None:
    """The newest run on ``device`` against the newest earlier run that shares a value with it (runs
    of other towers share none); None where there is no such run."""
    from ..compare import compare_tables, summary_line

    order = _runs_newest_first(g, starts)
    newer = order[0]
    for older in order[1:]:
        cmp = compare_tables(g[g["run"].astype(str) == older], g[g["run"].astype(str) == newer], study=study)
        if len(cmp):
            break
    else:
        return None
    cmp = cmp.rename(columns={"a": older, "b": newer})
    flagged = cmp[cmp["flag"] != ""]
    c = Comparison(device=device, newer=newer, older=older, line=f"{newer} against {older}: {summary_line(cmp)}.",
                   flagged=len(flagged), csv=csvs.write(cmp, "compare", study, device))
    if len(flagged):
        show = flagged.drop(columns=["study"]).head(COMPARE_ROWS)
        c.table = show[[col for col in show.columns if not show[col].astype(str).isin(["", "-"]).all()]]
    return c


def summarize(study: Any, runs: list[Run], out_dir: Path, loaded: Mapping[tuple[str, str], Any],
              problems: list[TableProblem], devices: set[str], csvs: Csvs,
              errata: Mapping[str, Mapping[str, str]]) -> StudySection:
    """A study's section: per device a view of the newest run(s) and one of the older runs, each
    summarized on its own rows, with the older runs' verdict diffs and the newest-against-previous."""
    holders = list(dict.fromkeys(r.logical_name for r in runs if study.name in r.tables))
    section = StudySection(name=study.name, question=getattr(study, "question", ""), runs=[],
                           per_preset=bool(getattr(study, "per_preset", False)),
                           missing_devices=sorted(devices))
    if not holders:
        section.text = "No run holds a table for this study yet (make sweep)."
        return section
    try:
        problems = list(problems)
        table = study_table(study.name, runs, problems=problems, loaded=loaded)
        section.table_problems = [p.line for p in problems]
        if table is None:
            section.text = "No table of this study could be read."
            return section
        section.runs = [name for name in holders if name in set(table["run"].astype(str))]
        section.missing_devices = sorted(devices - {str(d) for d in table["device"].dropna().unique()})
        starts = _starts(runs)
        by_run = {r.logical_name: r for r in runs}
        newest = newest_mask(table, starts)
        order = _device_order(table, starts)
        any_gpu = any(not is_cpu(d) for d in order)
        for dev in order:
            on_dev = table["device"].astype(str) == dev
            for kind, rows in (("newest", table[on_dev & newest]), ("older", table[on_dev & ~newest])):
                if not len(rows):
                    continue
                view = View(kind=kind, device=dev, runs=_runs_newest_first(rows, starts),
                            folded=kind == "older" or (is_cpu(dev) and any_gpu))
                view.errata = [f"{run}: {errata[run][study.name]}" for run in view.runs
                               if study.name in errata.get(run, {})]
                if kind == "older":
                    view.diffs = _verdict_diffs(study.name, rows, table[on_dev & newest], starts)
                fig_dir = out_dir / study.name / f"{_slug(dev)}-{kind}"
                try:
                    _summarize_view(study, view, rows, fig_dir, out_dir, by_run, csvs)
                except Exception:  # noqa: BLE001 - one view failing leaves the others
                    view.error = traceback.format_exc()
                section.views.append(view)
            cmp = _comparison(study.name, dev, table[on_dev], starts, csvs)
            if cmp is not None:
                section.comparisons.append(cmp)
        section.error = next((v.error for v in section.views if v.error), None)
        section.text = next((v.text for v in section.views if not v.error), "")
        section.figures = [f for v in section.views for f in v.figures]
    except Exception:  # noqa: BLE001 - one broken study must not hide the others
        section.error = traceback.format_exc()
    return section


def study_rank(study: Any) -> tuple[float, str]:
    """Sections in the order the studies declare (`Study.order`), then by name."""
    return (getattr(study, "order", math.inf), study.name)
