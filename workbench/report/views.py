"""What the page shows, as data: one `StudySection` per study with one `View` per device (the
newest run, then the older runs, each summarized by the study on its own rows; figures with
captions; key-number tables as DataFrames with a CSV beside the page), the newest run against the
one before it (workbench.compare), and the committed benchmarks (workbench.benchmarks). Nothing
here renders HTML.
"""
from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import atomic_write_bytes, file_kind, read_regular
from ..runstate import slug
from .runs import Run, TableProblem, study_table

@dataclass
class View:
    """One summarize call in a study section: the newest run(s) of one device (``kind``
    "newest"; the newest run per device and family where the table has a ``family`` column), or
    that device's older runs ("older"). CPU views and older views are folded on the page."""

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
    figures: list[str] = field(default_factory=list)    # paths relative to the report folder, every view
    error: str | None = None
    svgs: dict[str, str] = field(default_factory=dict)  # figure -> its SVG, where one was saved
    table_problems: list[str] = field(default_factory=list)   # "run X: table unreadable: ..."
    missing_devices: list[str] = field(default_factory=list)  # devices seen elsewhere, not here
    tables: list[tuple[str, Any]] = field(default_factory=list)  # (caption, DataFrame) of key numbers, every view
    views: list[View] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    per_preset: bool = False        # its finding has a paragraph per tower (family): each is a key finding




def _regular(path: Path) -> bool:
    """Whether ``path`` is a regular file, not a link (`file_kind`)."""
    try:
        return file_kind(path, follow=False) is None
    except OSError:
        return False



def _figures_in(paths, base: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """Figure files (absolute or relative to ``base``) as paths relative to ``root`` (files saved
    outside it are copied into ``base``), the PNG of a PNG/SVG pair shown and its SVG linked.
    Only regular files are shown or copied: ValueError for a figure that is a link, missing or
    anything else."""
    rels: list[str] = []
    for fig in map(Path, paths):
        fig = fig if fig.is_absolute() else base / fig
        fig = fig.parent.resolve() / fig.name            # its folder's real place; the file itself not followed
        if not _regular(fig):
            raise ValueError(f"figure {fig} is missing or not a regular file (a link, a folder...): not shown")
        if root not in fig.parents:                      # saved elsewhere: copy it (and its SVG) in
            atomic_write_bytes(base / fig.name, read_regular(fig))
            svg = fig.with_suffix(".svg")
            if fig.suffix.lower() != ".svg" and _regular(svg) and not (base / svg.name).exists():
                atomic_write_bytes(base / svg.name, read_regular(svg))
            fig = base / fig.name
        rel = fig.relative_to(root).as_posix()
        if rel not in rels:
            rels.append(rel)
    shown = [r for r in rels if not (r.lower().endswith(".svg")
                                     and any(o != r and Path(o).with_suffix("").as_posix()
                                             == Path(r).with_suffix("").as_posix() for o in rels))]
    svgs = {}
    for r in shown:
        svg = Path(r).with_suffix(".svg")
        if not r.lower().endswith(".svg") and _regular(root / svg):
            svgs[r] = svg.as_posix()
    return shown, svgs



COMPARE_ROWS = 12                    # flagged rows shown per comparison (all of them in its CSV)


DIFF_CELLS = 8                       # changed verdict cells named per older run


def is_cpu(device: str) -> bool:
    """Whether a table's device name is a CPU ('cpu: <model>'): a smoke test, not a measurement."""
    return str(device).strip().lower().startswith("cpu")



def _starts(runs: list[Run]) -> dict[str, str]:
    """logical run name -> its (latest) start time."""
    out: dict[str, str] = {}
    for r in runs:
        out[r.logical_name] = max(out.get(r.logical_name, ""), r.started)
    return out



def newest_mask(table, starts: Mapping[str, str]):
    """A boolean Series over ``table``: the rows of the newest run of each device (and each
    family, where the table has a ``family`` column: a later run that measured one family does not
    hide the other's newest numbers)."""
    import pandas as pd

    mask = pd.Series(False, index=table.index)
    keys = ["device"] + (["family"] if "family" in table.columns else [])
    for _, g in table.groupby(keys, dropna=False, sort=False):
        run = max(g["run"].astype(str).unique(), key=lambda r: (starts.get(r, ""), r))
        mask[g.index[g["run"].astype(str) == run]] = True
    return mask



def _device_order(table, starts: Mapping[str, str]) -> list[str]:
    """Devices of a study table: GPUs first, each group by its newest run, newest first."""
    newest = {}
    for dev, g in table.groupby("device", dropna=True, sort=False):
        newest[str(dev)] = max(starts.get(str(r), "") for r in g["run"].unique())
    ordered = sorted(newest, key=lambda d: (newest[d], d), reverse=True)
    return sorted(ordered, key=is_cpu)                       # stable: newest first within each group



def _runs_newest_first(g, starts: Mapping[str, str]) -> list[str]:
    return sorted(map(str, g["run"].unique()), key=lambda r: (starts.get(r, ""), r), reverse=True)



def _verdict_diffs(study: str, older, newest, starts: Mapping[str, str]) -> list[str]:
    """One line per older run of a device: its verdicts against the newest run's, "unchanged"
    or the cells that changed (workbench.compare)."""
    from ..compare import compare_tables, verdict_changes

    if "unit" not in older.columns or not (older["unit"] == "bool").any():
        return []
    ref = ", ".join(_runs_newest_first(newest, starts))
    lines = []
    for run in _runs_newest_first(older, starts):
        rows = older[older["run"].astype(str) == run]
        cmp = compare_tables(rows[rows["unit"] == "bool"], newest[newest["unit"] == "bool"], study=study)
        if not len(cmp):
            lines.append(f"{run}: no verdict in common with {ref}")
            continue
        changed = verdict_changes(cmp)
        if not changed:
            lines.append(f"{run}: unchanged ({len(cmp)} verdicts shared with {ref})")
            continue
        more = f"; and {len(changed) - DIFF_CELLS} more (in the comparison CSV)" if len(changed) > DIFF_CELLS else ""
        lines.append(f"{run}: {len(changed)} of {len(cmp)} verdicts differ from {ref}: "
                     + "; ".join(changed[:DIFF_CELLS]) + more)
    return lines



class _Csvs:
    """CSV files written beside the page, one per table shown, named once each."""

    def __init__(self, root: Path):
        self.root, self.used = root, set()

    def write(self, df, *parts: str) -> str:
        base = "-".join(slug(str(p), empty="x")[:48] for p in parts if str(p)) or "table"
        name, i = f"{base}.csv", 2
        while name in self.used:
            name, i = f"{base}-{i}.csv", i + 1
        self.used.add(name)
        df.to_csv(self.root / name, index=False)
        return name



def _figure_runs(fig: str, study: str, runs: list[str]) -> tuple[str, str | None]:
    """(what the figure shows, the run it belongs to) from its file name ``<stem>_<run>``: the
    stem without the study's name, words for underscores; no run where the name holds none."""
    stem = Path(fig).stem
    run = next((r for r in sorted(runs, key=len, reverse=True)
                if stem.endswith("_" + slug(r, empty="x"))), None)
    if run is not None:
        stem = stem[: -len(slug(run, empty="x")) - 1]
    if stem.startswith(study):
        stem = stem[len(study):]
    what = " ".join(stem.replace("_", " ").replace("-", " ").split())
    return what, run



def _caption(fig: str, study: str, view_runs: list[str], by_run: Mapping[str, "Run"], device: str,
             shows: str | None = None) -> str:
    """What a figure shows (the study's words where its Summary gives them, else its file name's)
    and which run it belongs to: device, run, start time, reference; CPU figures say they are not
    measurements."""
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
                    by_run: Mapping[str, "Run"], csvs: _Csvs) -> None:
    from ..studies import Summary

    fig_dir.mkdir(parents=True, exist_ok=True)
    result = study.summarize(rows.reset_index(drop=True), fig_dir)
    if isinstance(result, str):
        result = Summary(text=result)
    view.text = result.text
    for caption, df in getattr(result, "tables", []):
        csv = csvs.write(df, study.name, view.device, view.kind, caption)
        view.tables.append((caption, df, csv))
    view.figures, view.svgs = _figures_in(result.figures, fig_dir, out_dir)
    # a Summary may say what each figure shows ({file name: words}); the run and device are added here
    own = getattr(result, "captions", None) or {}
    view.captions = {f: _caption(f, study.name, view.runs, by_run, view.device, own.get(Path(f).name))
                     for f in view.figures}
    groups = getattr(result, "groups", None) or {}
    view.groups = {f: groups[Path(f).name] for f in view.figures if Path(f).name in groups}



def _comparison(study: str, device: str, g, starts: Mapping[str, str], csvs: _Csvs) -> Comparison | None:
    """The newest run of ``study`` on ``device`` against the newest earlier run that shares a
    value with it (runs of other towers share none: a comparison with them says nothing); None
    with one run or where no earlier run shares a value."""
    from ..compare import compare_tables, summary_line

    order = _runs_newest_first(g, starts)
    if len(order) < 2:
        return None
    newer = order[0]
    for older in order[1:]:
        cmp = compare_tables(g[g["run"].astype(str) == older], g[g["run"].astype(str) == newer], study=study)
        if len(cmp):
            break
    else:
        return None
    cmp = cmp.rename(columns={"a": older, "b": newer})
    c = Comparison(device=device, newer=newer, older=older,
                   line=f"{newer} against {older}: {summary_line(cmp)}.")
    flagged = cmp[cmp["flag"] != ""]
    c.flagged = len(flagged)
    c.csv = csvs.write(cmp, "compare", study, device)
    if len(flagged):
        show = flagged.drop(columns=["study"]).head(COMPARE_ROWS)
        show = show[[col for col in show.columns if not (show[col].astype(str).isin(["", "-"])).all()]]
        c.table = show
    return c



def _summarize(study: Any, runs: list[Run], out_dir: Path,
               loaded: Mapping[tuple[str, str], Any] | None = None, problems: list[TableProblem] | None = None,
               devices: set[str] | None = None, csvs: _Csvs | None = None,
               errata: Mapping[str, Mapping[str, str]] | None = None) -> StudySection:
    """A study's section: one view of the newest run(s) per device and one of its older runs,
    each summarized by the study on its own rows; verdict diffs of the older runs; the newest
    run against the one before it per device."""
    holders = list(dict.fromkeys(r.logical_name for r in runs if study.name in r.tables))
    section = StudySection(name=study.name, question=getattr(study, "question", ""), runs=[],
                           per_preset=bool(getattr(study, "per_preset", False)))
    devices = set(devices or ())
    errata = errata or {}
    if not holders:
        section.text = "No run holds a table for this study yet (make sweep)."
        section.missing_devices = sorted(devices)
        return section
    out_dir = out_dir.resolve()
    csvs = csvs or _Csvs(out_dir)
    try:
        problems = list(problems or [])     # this study's tables that could not be used
        table = study_table(study.name, runs, problems=problems, loaded=loaded)
        section.table_problems = [p.line for p in problems]
        if table is None:
            section.text = "No table of this study could be read."
            section.missing_devices = sorted(devices)
            return section
        present = set(table["run"].astype(str))
        section.runs = [name for name in holders if name in present]
        section.missing_devices = sorted(devices - {str(d) for d in table["device"].dropna().unique()})
        starts = _starts(runs)
        by_run = {r.logical_name: r for r in runs}
        newest = newest_mask(table, starts)
        order = _device_order(table, starts)
        any_gpu = any(not is_cpu(d) for d in order)
        for dev in order:
            on_dev = table["device"].astype(str) == dev
            slug_dev = _slug(dev)
            for kind, rows in (("newest", table[on_dev & newest]), ("older", table[on_dev & ~newest])):
                if not len(rows):
                    continue
                view = View(kind=kind, device=dev, runs=_runs_newest_first(rows, starts),
                            folded=kind == "older" or (is_cpu(dev) and any_gpu))
                view.errata = [f"{run}: {errata[run][study.name]}" for run in view.runs
                               if study.name in errata.get(run, {})]
                if kind == "older":
                    view.diffs = _verdict_diffs(study.name, rows, table[on_dev & newest], starts)
                try:
                    _summarize_view(study, view, rows, out_dir / study.name / f"{slug_dev}-{kind}", out_dir,
                                    by_run, csvs)
                except Exception:  # noqa: BLE001 - one view failing leaves the others
                    view.error = traceback.format_exc()
                section.views.append(view)
            cmp = _comparison(study.name, dev, table[on_dev], starts, csvs)
            if cmp is not None:
                section.comparisons.append(cmp)
        failed = [v.error for v in section.views if v.error]
        if failed:
            section.error = failed[0]
        lead = next((v for v in section.views if not v.error), None)
        section.text = lead.text if lead else ""
        for v in section.views:
            section.figures += v.figures
            section.svgs.update(v.svgs)
            section.tables += [(c, t) for c, t, _ in v.tables]
    except Exception:  # noqa: BLE001 - one broken study must not hide the others
        section.error = traceback.format_exc()
    return section



def _slug(text: str) -> str:
    return slug(text, empty="x")



def _study_rank(study: Any) -> tuple[float, str]:
    """Sections in the order the studies declare (`Study.order`), then by name."""
    return (getattr(study, "order", math.inf), study.name)



def _runs_words(runs: list[str]) -> str:
    return f"run{'s' if len(runs) > 1 else ''} {', '.join(runs)}"
