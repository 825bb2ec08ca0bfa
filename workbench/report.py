"""Build ``results/report/index.html`` from the run folders under ``results/``.

The report only reads: each run folder holds ``meta.json`` (see workbench.provenance) and one
``<study>.parquet`` tidy long table per study it ran (workbench.studies.tables). Runs committed
under ``results/reference/`` (measured on GPU hosts) are shown beside local ones, marked as
reference and labelled by device. For every registered study, the tables of all runs are read with
`load_table`, concatenated (with ``run``, ``reference`` and ``run_date`` columns added, and
``device`` from meta.json only where a table has none) and handed to the study's summarize
function, which saves figures and writes the finding. A table that cannot be read or breaks the
table format is left out and named, with the reason, in its study's section and in the Runs table;
it does not blank the study. Each study section also says, one line per device, for which of the
devices seen in any run the study has no data.

The page reads newest first: a key-findings block (the opening of each study's finding for the
newest run of every device, GPUs first), then per study one view per device: the newest run (the
newest per device and family where the table has a ``family`` column) summarized on its own and
shown, the older runs of that device summarized together and folded (``<details>``), with each
older run's verdicts against the newest ("unchanged", or the cells that changed), and the newest
run against the one before it (workbench.compare). CPU runs are smoke tests: folded wherever a GPU
run exists. Every figure gets a caption from its file name and run; every table shown gets a CSV
beside the page. Committed benchmarks (``results/reference/*.json``) are drawn by the benchmarks
that registered themselves (workbench.benchmarks); this module names none.

Everything the page links is inside the report folder, so it can be zipped and shared: figures,
CSVs, and copies of each run's meta.json and executed notebooks' HTML (``runs/<run>/``). The
notebook HTML is cleaned by an allow-list (`localize_html`, with nh3): no script, no event
attribute, no frame or plugin, no link that runs code, nothing loaded from outside the folder;
where nh3 is not installed no notebook HTML is copied, and the page says so. Nothing here runs a
model.

Run folders may come from anyone. The report reads and copies only regular files of a run folder
(`workbench.files.read_regular`): never through a symbolic link (which could point at
any file of the reader's), never a FIFO, socket or device (opening a FIFO blocks forever). A file
it would have read that is something else is named, with what it is, beside its run; a run folder
that is itself a link or cannot be listed is listed with the reason; a broken errata file is
named on the page. No file of a run folder stops the report.

Nothing is lost to a report. A run folder's meta.json is read with
`workbench.provenance.load_meta`, which checks every field the report reads: a run whose
meta.json is unreadable or breaks that schema is listed with the reason and its tables are left
out, like an unreadable table; every other run still shows. Every value that comes from a file
(meta.json fields, folder names, table values, findings, figure names) is HTML-escaped, and
links are percent-encoded. Reading needs no write access to the results folder.

The report only replaces a folder it wrote itself: every report it builds holds a marker file
(``.workbench-report.json``) listing the files it wrote, and `check_report_dir` refuses any other
non-empty folder (whatever it holds: a saved copy of a report's page is not a report folder), the
results folder, a run folder, a folder inside a run folder or holding run folders, and any folder
that holds the results folder. The report is built in a temporary folder next to the target and
swapped in at the end; a build that fails, a read-only folder and a full disk leave the previous
report and every run folder as they were (`ReportError` says why and where).
"""
from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import stat
import traceback
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .files import file_kind, read_regular
from .provenance import (META_NAME, MetaError, atomic_write_bytes, atomic_write_text, iso_utc, load_meta,
                         results_root)
from .runstate import open_failures, run_state

REPORT_DIRNAME = "report"
REFERENCE_DIRNAME = "reference"
# known problems of committed runs, found after they were measured: {run folder: {study: note}} in
# reference/errata.json; a run is a record and is never edited, so its view carries the note instead
ERRATA_NAME = "errata.json"
NO_STUDY_MESSAGE = (
    "no study exists yet: no module in workbench/studies/ registers one, "
    "so there is nothing to sweep or summarize"
)


@dataclass
class Run:
    """One run folder and what it holds."""

    path: Path
    meta: dict[str, Any] | None
    tables: dict[str, Path] = field(default_factory=dict)   # study name -> parquet file
    reference: bool = False
    error: str | None = None                                   # meta.json unreadable
    table_devices: list[str] = field(default_factory=list)     # `device` values of its read tables
    skipped: dict[str, str] = field(default_factory=dict)      # file -> why it was not read or copied

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def recorded(self) -> dict[str, Any]:
        """meta.json as a dict ({} where there is none). A Run made by `find_runs` holds a
        checked one (`load_meta`); the properties below also survive one that is not."""
        return self.meta if isinstance(self.meta, dict) else {}

    @property
    def shard(self) -> dict | None:
        """{index, count, group} for a shard of a sharded sweep (meta.json), else None."""
        params = self.recorded.get("params")
        sh = params.get("shard") if isinstance(params, dict) else None
        if not (isinstance(sh, dict) and isinstance(sh.get("group"), str) and sh["group"]):
            return None
        return sh if all(_is_int(sh.get(k)) for k in ("index", "count")) else None

    @property
    def logical_name(self) -> str:
        """What the studies call this run: the shard group for the shards of one sharded sweep
        (their tables are summarized as one run), else the folder name."""
        sh = self.shard
        return f"{sh['group']} ({sh['count']} shards)" if sh else self.name

    @property
    def device(self) -> str:
        """The device its tables were measured on (one name everywhere: the tables' own), or,
        before they are read, the host meta.json names ('2x NVIDIA H200' on a 2-GPU host)."""
        if self.table_devices:
            return ", ".join(self.table_devices)
        return str(self.recorded.get("device") or "unknown device")

    @property
    def git(self) -> str:
        g = self.recorded.get("git")
        g = g if isinstance(g, dict) else {}
        short = g.get("short") if isinstance(g.get("short"), str) else ""
        short = short or (g.get("sha") if isinstance(g.get("sha"), str) else "")[:7]
        if not short:
            return "no git"
        return short + ("+dirty" if g.get("dirty") is True else "")

    @property
    def started(self) -> str:
        return str(self.recorded.get("started_at") or "")

    @property
    def finished(self) -> bool:
        return bool(self.recorded.get("finished_at"))

    @property
    def duration_s(self) -> float | None:
        d = self.recorded.get("duration_s")
        return float(d) if _is_num(d) else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _listed(v: Any) -> list:
    return v if isinstance(v, list) else []


def _mapped(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


NO_META = ("no meta.json: the report cannot say what ran there or on which device, so its tables are "
           "not used (a run folder gets one from the sweep or from save_table)")
READ_SUFFIXES = (".parquet", ".html", ".ipynb")     # what the report reads or copies from a run folder


def _skipped(path: Path, names: list[str]) -> dict[str, str]:
    """{name: what it is} of the files the report would read in the run folder ``path`` that are
    not regular files (links, folders, FIFOs...): none of them is read or copied."""
    out = {}
    for n in names:
        if n == META_NAME or n.endswith(READ_SUFFIXES):
            try:
                what = file_kind(path / n, follow=False)
            except OSError as e:
                what = f"cannot be read ({e.strerror or e})"
            if what:
                out[n] = what
    return out


def _load_run(path: Path, reference: bool) -> Run | None:
    """The run folder ``path`` (None where it is none: a file, a folder with neither a meta.json
    nor a table). Its meta.json is read and checked with `load_meta`; a run whose meta.json is
    missing, not a regular file, unreadable or breaks the schema keeps ``meta`` None and says why
    in ``error``, and its tables are left out (named in that reason): without a usable meta.json
    the report cannot say what ran there or merge a shard. A folder that is a link or cannot be
    listed is a run with only an ``error``. Only regular files are read (``skipped``: the rest)."""
    if path.is_symlink():
        return Run(path=path, meta=None, reference=reference, error="a symbolic link to a folder elsewhere: "
                   "not followed, so none of it is read") if path.is_dir() else None
    if not path.is_dir():
        return None
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        return Run(path=path, meta=None, reference=reference,
                   error=f"the folder cannot be listed ({e.strerror or e}), so none of it is read")
    if META_NAME not in names and not any(n.endswith(".parquet") for n in names):
        return None
    skipped = _skipped(path, names)
    tables = {n[:-len(".parquet")]: path / n for n in names if n.endswith(".parquet") and n not in skipped}
    run = Run(path=path, meta=None, reference=reference, skipped=skipped)
    if META_NAME not in names:
        run.error = NO_META
        return run
    try:
        run.meta, run.tables = load_meta(path), tables
    except MetaError as e:
        run.error = _one_line(e.line, 600)
        if tables:
            run.error += f"; its tables ({', '.join(tables)}) are left out until it is fixed"
    return run


def find_runs(results_dir: Path | str | None = None) -> list[Run]:
    """Run folders directly under ``results_dir`` and under ``results_dir/reference/``; local runs
    first, each group oldest first. A folder without a meta.json (or with an unreadable one, or
    that cannot be listed) is listed too, with the reason in ``error``, so the report never skips
    one silently."""
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    runs: list[Run] = []
    for base, reference in ((results_dir, False), (results_dir / REFERENCE_DIRNAME, True)):
        if not base.is_dir():
            continue
        try:
            children = sorted(base.iterdir())
        except OSError as e:
            raise ReportError(f"cannot list the results folder {base}: {e.strerror or e}") from e
        for child in children:
            if child.name.startswith(".") or (not reference and child.name in (REPORT_DIRNAME,
                                                                               REFERENCE_DIRNAME)):
                continue
            run = _load_run(child, reference)
            if run is not None:
                runs.append(run)
    runs.sort(key=lambda r: (r.reference, r.started, r.name))
    return runs


@dataclass
class TableProblem:
    """One run's table of one study that could not be read or breaks the table format."""

    run: str
    study: str
    reason: str

    @property
    def line(self) -> str:
        return f"run {self.run}: table unreadable: {self.reason}"

    def __str__(self) -> str:
        return f"{self.study}: {self.line}"


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
    tables: list[tuple[str, str, str]] = field(default_factory=list)   # (caption, HTML, CSV file)
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
    table: str = ""                 # HTML of the flagged rows (at most COMPARE_ROWS)
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
    tables: list[tuple[str, str]] = field(default_factory=list)  # (caption, HTML) of key numbers, every view
    views: list[View] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    per_preset: bool = False        # its finding has a paragraph per tower (family): each is a key finding


@dataclass
class BenchmarkSection:
    """A registered benchmark (workbench.benchmarks) and its committed result files, drawn;
    each panel's ``figures`` are paths relative to the report folder."""

    name: str
    title: str
    panels: list[Any] = field(default_factory=list)     # workbench.benchmarks.BenchmarkPanel
    note: str = ""                  # one line when there is nothing to show
    svgs: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)


@dataclass
class ReportResult:
    index: Path
    runs: list[Run]
    sections: list[StudySection]
    no_study: bool
    table_problems: list[str] = field(default_factory=list)   # "<study>: run X: table unreadable: ..."
    benchmarks: list[BenchmarkSection] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Failed summaries (the CLI exits non-zero for these). Unreadable tables are in
        ``table_problems`` and benchmark files in ``benchmarks``; neither is counted here."""
        return [f"{s.name}: {s.error.splitlines()[-1]}" for s in self.sections if s.error]

    def benchmark(self, name: str) -> BenchmarkSection:
        (b,) = [b for b in self.benchmarks if b.name == name]
        return b


# --------------------------------------------------------------------------- tables

_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})")


def _run_date(run: Run) -> str:
    m = _DATE.match(run.started.strip())
    return m.group(1) if m else ""


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _problem_reason(exc: BaseException, path: Path) -> str:
    """One line: what is wrong with the table at ``path`` (its folder left out; the run is named
    beside it)."""
    msg = str(exc) or type(exc).__name__
    if str(path) in msg:                          # TableError names the file: keep its name only
        msg = msg.replace(str(path), path.name)
    else:
        msg = f"{path.name}: {type(exc).__name__}: {msg}"
    return _one_line(msg)


def run_table(run: Run, study_name: str):
    """One run's table of one study, read and checked with `load_table`, with ``run``,
    ``reference`` and ``run_date`` columns added and ``device`` from meta.json where the table has
    none (a table's own device column is kept). Raises what `load_table` raises."""
    from .studies.tables import VALUE_COLUMNS, load_table

    df = load_table(run.tables[study_name])
    added = {"run": run.logical_name, "reference": bool(run.reference), "run_date": _run_date(run)}
    if "device" not in df.columns:
        added["device"] = run.device
    at = min((df.columns.get_loc(c) for c in VALUE_COLUMNS if c in df.columns), default=len(df.columns))
    for col, value in added.items():
        if col in df.columns:
            df[col] = value
        else:
            df.insert(at, col, value)
            at += 1
    return df


def _shard_cells(run: Run, study: str) -> set | None:
    """The cells of ``study`` that ``run`` (a shard) ran, as recorded; None: the whole study."""
    cells = (run.shard or {}).get("cells")
    values = cells.get(study) if isinstance(cells, dict) else None
    return {json.dumps(v, sort_keys=True) for v in values} if isinstance(values, list) else None


def _second_in_group(seen: dict[tuple[str, str], list], run: Run, study: str) -> str | None:
    """None for a table of ``study`` that ``run``'s logical run may hold (noted in ``seen``): the
    first, or a later shard's whose recorded cells none of the earlier ones ran (a study split by
    cell over the shards); for a shard that holds some of it again, why that table is not used."""
    mine = _shard_cells(run, study)
    earlier = seen.setdefault((run.logical_name, study), [])
    for name, cells in earlier:
        if name == run.name:
            return None
        if cells is None or mine is None or cells & mine:
            return (f"{run.logical_name} already has a {study} table from shard folder {name} with cells this "
                    "one ran too; a shard group holds each cell of a study once")
    earlier.append((run.name, mine))
    return None


def load_tables(runs: list[Run], study_names) -> tuple[dict[tuple[str, str], Any], list[TableProblem]]:
    """Every run's table of each study in ``study_names``: {(run name, study): DataFrame}, and
    the tables that could not be read (any exception: a truncated parquet, a broken schema)."""
    loaded: dict[tuple[str, str], Any] = {}
    problems: list[TableProblem] = []
    names = set(study_names)
    seen: dict[tuple[str, str], list] = {}     # (logical run, study) -> [(shard folder, its cells)]
    for run in runs:
        for study, path in run.tables.items():
            if study not in names:
                continue
            again = _second_in_group(seen, run, study)
            if again:
                problems.append(TableProblem(run=run.name, study=study, reason=again))
                continue
            try:
                loaded[(run.name, study)] = run_table(run, study)
            except Exception as e:  # noqa: BLE001 - one bad file must not blank the report
                problems.append(TableProblem(run=run.name, study=study, reason=_problem_reason(e, path)))
    return loaded, problems


def study_table(study_name: str, runs: list[Run], problems: list[TableProblem] | None = None,
                loaded: Mapping[tuple[str, str], Any] | None = None):
    """All runs' readable tables for one study, concatenated (see `run_table` for the columns
    added); None when there is none. A table that cannot be read is skipped and, where
    ``problems`` is given, recorded there. ``loaded`` (from `load_tables`) avoids reading twice."""
    import pandas as pd

    frames = []
    seen: dict[tuple[str, str], list] = {}
    for run in runs:
        path = run.tables.get(study_name)
        if path is None:
            continue
        again = _second_in_group(seen, run, study_name)
        if again:                       # two shards of one run measured this study: keep the first
            if problems is not None:
                problems.append(TableProblem(run=run.name, study=study_name, reason=again))
            continue
        if loaded is not None and (run.name, study_name) in loaded:
            frames.append(loaded[(run.name, study_name)])
            continue
        try:
            frames.append(run_table(run, study_name))
        except Exception as e:  # noqa: BLE001 - skip it, say why
            if problems is not None:
                problems.append(TableProblem(run=run.name, study=study_name,
                                             reason=_problem_reason(e, path)))
    return pd.concat(frames, ignore_index=True) if frames else None


def note_table_devices(runs: list[Run], loaded: Mapping[tuple[str, str], Any]) -> None:
    """Set each run's ``table_devices``: the ``device`` values of its loaded tables."""
    for run in runs:
        run.table_devices = sorted({str(d) for (name, _), df in loaded.items() if name == run.name
                                    for d in df["device"].dropna().unique()})


def known_devices(runs: list[Run]) -> set[str]:
    """The devices seen anywhere: each run's ``device`` (its tables' devices once
    `note_table_devices` ran; the meta.json device of a run with no readable table)."""
    devices: set[str] = set()
    for run in runs:
        if run.table_devices:
            devices.update(run.table_devices)
        elif run.recorded.get("device"):
            devices.add(str(run.recorded["device"]))
    return devices


# --------------------------------------------------------------------------- figures


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


# --------------------------------------------------------------------------- studies

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
    from .compare import compare_tables, verdict_changes

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
        from .provenance import slug

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
    from .provenance import slug

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
    from .studies import Summary

    fig_dir.mkdir(parents=True, exist_ok=True)
    result = study.summarize(rows.reset_index(drop=True), fig_dir)
    if isinstance(result, str):
        result = Summary(text=result)
    view.text = result.text
    for caption, df in getattr(result, "tables", []):
        csv = csvs.write(df, study.name, view.device, view.kind, caption)
        view.tables.append((caption, _table_html(df), csv))
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
    from .compare import compare_tables, summary_line

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
        c.table = _table_html(show)
    return c


def load_errata(results_dir: Path | str) -> tuple[dict[str, dict[str, str]], str | None]:
    """({run folder: {study: note}} from reference/errata.json, or {}; why the file was not used,
    where it exists and cannot be read as that: not a regular file, not JSON, nested too deeply)."""
    path = Path(results_dir) / REFERENCE_DIRNAME / ERRATA_NAME
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
        if not (isinstance(data, dict) and all(isinstance(v, dict) and all(
                isinstance(k, str) and isinstance(n, str) for k, n in v.items()) for v in data.values())):
            raise ValueError("expected {run folder: {study: note}} with strings")
    except (FileNotFoundError, NotADirectoryError):
        return {}, None
    except (OSError, ValueError, RecursionError) as e:
        return {}, (f"{REFERENCE_DIRNAME}/{ERRATA_NAME}: not used, so no known problem of a run is shown "
                    f"({_why(e)})")
    return data, None


def _why(e: BaseException) -> str:
    """One line: what went wrong reading a file (an OSError's own words, without its path)."""
    if isinstance(e, RecursionError):
        return "nested too deeply to parse"
    return _one_line(e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__)


def _summarize(study: Any, runs: list[Run], out_dir: Path,
               loaded: Mapping[tuple[str, str], Any] | None = None,
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
        problems: list[TableProblem] = []
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
            section.tables += [(c, h) for c, h, _ in v.tables]
    except Exception:  # noqa: BLE001 - one broken study must not hide the others
        section.error = traceback.format_exc()
    return section


def _slug(text: str) -> str:
    from .provenance import slug

    return slug(text, empty="x")


# --------------------------------------------------------------------------- benchmarks


def benchmark_sections(results_dir: Path | str, out_dir: Path,
                       benchmarks: Mapping[str, Any] | None = None) -> list[BenchmarkSection]:
    """Every registered benchmark (`workbench.benchmarks.discover`) with its committed result
    files: each ``<results_dir>/reference/*.json`` whose object has ``"benchmark": <name>`` is
    drawn by that benchmark's summarize into ``<out_dir>/<name>/``; a file named like the
    benchmark's ``files`` that is not JSON shows its error there."""
    import fnmatch

    from .benchmarks import BenchmarkPanel, discover

    benchmarks = discover() if benchmarks is None else benchmarks
    ref = Path(results_dir) / REFERENCE_DIRNAME
    files = sorted(ref.glob("*.json")) if ref.is_dir() else []
    out_dir = Path(out_dir).resolve()
    sections = []
    for bench in sorted(benchmarks.values(), key=lambda b: (b.order, b.name)):
        sec = BenchmarkSection(name=bench.name, title=bench.title)
        for path in files:
            try:
                doc = json.loads(read_regular(path).decode("utf-8"))
            except (OSError, ValueError, RecursionError) as e:   # cannot tell what it holds: say so
                if fnmatch.fnmatch(path.name, bench.files):
                    sec.panels.append(BenchmarkPanel(
                        source=path.name, error=_one_line(f"{path.name}: unreadable JSON ({_why(e)})")))
                continue
            if not isinstance(doc, dict) or doc.get("benchmark") != bench.name:
                continue
            fig_dir = out_dir / _slug(bench.name)
            panel = bench.summarize(path, doc, fig_dir)
            try:
                panel.figures, svgs = _figures_in(panel.figures, fig_dir, out_dir)
            except (OSError, ValueError) as e:
                panel.figures, svgs, panel.error = [], {}, _one_line(f"{path.name}: {_why(e)}")
            sec.svgs.update(svgs)
            own = getattr(panel, "captions", None) or {}
            for f in panel.figures:
                what = own.get(Path(f).name) or f"{bench.title}: {_figure_runs(f, _slug(Path(path).stem), [])[0]}"
                sec.captions[f] = (f"{what}; {panel.device or 'unknown device'}, {panel.date}, from "
                                   f"{REFERENCE_DIRNAME}/{panel.source}.")
            sec.panels.append(panel)
        if not sec.panels:
            sec.note = bench.missing
        sections.append(sec)
    return sections


# --------------------------------------------------------------------------- build


def _study_rank(study: Any) -> tuple[float, str]:
    """Sections in the order the studies declare (`Study.order`), then by name."""
    return (getattr(study, "order", math.inf), study.name)


# --------------------------------------------------------------------------- the report folder

REPORT_MARKER = ".workbench-report.json"      # in every report folder the report builds
REPORT_TITLE = "Workbench report"             # the <title> of index.html
_LEFTOVER = r"\.{name}\.(?:building|old)-\d+-[0-9a-f]{{8}}"
_SHOW_AT_MOST = 5


class ReportError(RuntimeError):
    """The report could not be built where asked. The message names the folder and says what to
    do; the previous report there (if any) and every run folder are as they were."""


class UnsafeOutDir(ReportError, ValueError):
    """A folder the report will not write into: replacing it could lose something the report did
    not write (see `check_report_dir`)."""


def _token() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _looks_like_run(d: Path) -> bool:
    try:
        return (d / META_NAME).is_file() or any(d.glob("*.parquet"))
    except OSError:
        return False


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOW_AT_MOST])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _SHOW_AT_MOST else "")


def _walk_files(root: Path) -> tuple[dict[str, int], list[str]]:
    """{relative path: size} of the regular files under ``root``, and what else is there (links,
    special files, folders that cannot be read), relative to ``root``."""
    files: dict[str, int] = {}
    other: list[str] = []

    def unreadable(e: OSError) -> None:
        other.append(os.path.relpath(e.filename, root) if e.filename else str(e))

    for here, dirs, names in os.walk(root, onerror=unreadable, followlinks=False):
        rel_here = Path(os.path.relpath(here, root))
        for d in list(dirs):
            if os.path.islink(os.path.join(here, d)):
                other.append((rel_here / d).as_posix())
                dirs.remove(d)
        for n in names:
            full = os.path.join(here, n)
            rel = (rel_here / n).as_posix()
            try:
                st = os.lstat(full)
            except OSError:
                other.append(rel)
                continue
            if stat.S_ISREG(st.st_mode):
                files[rel] = st.st_size
            else:
                other.append(rel)
    return files, other


def _read_marker(folder: Path) -> dict | None:
    try:
        doc = json.loads(read_regular(folder / REPORT_MARKER).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _foreign_in_report(folder: Path) -> list[str] | None:
    """What in the report folder ``folder`` the report did not write: every file its marker does
    not list with that size, and anything that is not a plain file. None when ``folder`` holds
    no marker: it is no report folder, whatever else it holds."""
    if not _regular(folder / REPORT_MARKER):
        return None
    files, other = _walk_files(folder)
    marker = _read_marker(folder)
    written = marker.get("files") if marker else None
    if not isinstance(written, dict):
        return [f"{REPORT_MARKER} (unreadable, or it lists no files)"]
    files.pop(REPORT_MARKER, None)
    return other + [rel for rel, size in files.items() if written.get(rel) != size]


def check_report_dir(out_dir: Path | str, results_dir: Path | str | None = None) -> str:
    """Whether the report may be written to ``out_dir`` (replacing it as a whole): returns
    ``"new"`` (it does not exist), ``"empty"`` or ``"report"`` (a report folder: its marker,
    and only the files the marker lists). Raises UnsafeOutDir, naming the folder, saying why and
    what to do, for anything else: the results folder itself, a folder that holds it, a run
    folder, a folder inside a run folder or holding run folders, a file, a non-empty folder
    without the marker (a saved copy of a report's page beside other files included), or a
    report folder holding anything the report did not write.
    """
    out_dir = Path(out_dir)
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out, results = out_dir.resolve(), results_dir.resolve()
    todo = ("Pass --out with a new or empty folder, or with a folder the report wrote "
            f"(one with {REPORT_MARKER} in it).")

    def refuse(why: str) -> UnsafeOutDir:
        return UnsafeOutDir(f"refusing to write the report into {out_dir}: {why}. {todo}")

    if out == results:
        raise refuse("it is the results folder itself; the report replaces its whole folder, which "
                     "would delete every run folder in it")
    if out in results.parents:
        raise refuse(f"it holds the results folder {results_dir}; the report replaces its whole "
                     "folder, which would delete every run folder in it")
    if out.is_dir() and _looks_like_run(out):
        raise refuse("it is a run folder (it holds a meta.json or tables), not a report folder")
    if results in out.parents:
        for above in out.parents:
            if above == results:
                break
            if _looks_like_run(above):
                raise refuse(f"it is inside the run folder {above}; a run folder holds results only")
    if not out.exists():
        if out_dir.is_symlink():
            raise refuse("it is a link to a folder that does not exist")
        return "new"
    if not out.is_dir():
        raise refuse("it is a file, not a folder")
    try:
        entries = sorted(out.iterdir())
    except OSError as e:
        raise refuse(f"it cannot be listed ({e.strerror or e})") from e
    if not entries:
        return "empty"
    runs = [c.name for c in entries if c.is_dir() and not c.is_symlink() and _looks_like_run(c)]
    ref = out / REFERENCE_DIRNAME
    if ref.is_dir() and not ref.is_symlink():
        try:
            runs += [f"{REFERENCE_DIRNAME}/{c.name}" for c in sorted(ref.iterdir())
                     if c.is_dir() and _looks_like_run(c)]
        except OSError:
            pass
    if runs:
        raise refuse(f"it holds run folders ({_some(runs)}); the report replaces its whole folder, "
                     "which would delete them")
    foreign = _foreign_in_report(out)
    if foreign is None:
        raise refuse(f"it is not empty ({_some([e.name for e in entries])}) and holds no {REPORT_MARKER}, "
                     "so it is not a folder the report wrote, and the report replaces its whole "
                     "folder")
    if foreign:
        raise refuse(f"it is a report folder, but holds files the report did not write or that "
                     f"changed since ({_some(foreign)}), which replacing it would delete; move them "
                     "out first")
    return "report"


def _write_marker(folder: Path, results_dir: Path, files: dict[str, int] | None) -> None:
    doc = {"written_by": "python -m workbench report (workbench.report.build_report)",
           "built_at": iso_utc(timespec="seconds"),
           "results": str(results_dir),
           "note": ("The report replaces this whole folder each time it is built, after checking "
                    "that it holds only the files listed here; keep nothing else in it."),
           "files": files}
    atomic_write_text(folder / REPORT_MARKER, json.dumps(doc, indent=1) + "\n")


class _FolderLock:
    """An exclusive flock on a folder (its own descriptor), held while the block runs; a folder
    that cannot be opened is not locked (the lock only orders concurrent builds)."""

    def __init__(self, folder: Path, wait: bool = True):
        self.folder, self.wait, self.fd, self.held = folder, wait, None, False

    def __enter__(self) -> "_FolderLock":
        import fcntl

        try:
            self.fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            self.held = True
        except OSError:
            pass
        return self

    def __exit__(self, *exc) -> bool:
        if self.fd is not None:
            os.close(self.fd)                # closing drops the flock
            self.fd = None
        return False


def _remove_leftovers(out: Path) -> None:
    """Folders that builds into ``out`` killed mid-way left beside it (``.<name>.building-*``,
    ``.<name>.old-*``), where no build holds them and they are the report's own (its marker).
    Anything else is left alone."""
    pattern = re.compile(_LEFTOVER.format(name=re.escape(out.name)))
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return
    for d in siblings:
        if not pattern.fullmatch(d.name) or d.is_symlink() or not d.is_dir():
            continue
        with _FolderLock(d, wait=False) as lock:
            # a build writes its marker only once it holds its folder's lock
            if lock.held and _regular(d / REPORT_MARKER):
                shutil.rmtree(d, ignore_errors=True)


def _swap_in(tmp: Path, out_dir: Path, results_dir: Path) -> None:
    """Replace ``out_dir`` with the finished report in ``tmp``: checked again right before, the old
    folder moved aside, the new one moved in, the old one removed. If moving the new one in fails,
    the old one is moved back."""
    out = out_dir.resolve()
    with _FolderLock(out.parent):            # one build at a time swaps into this folder
        check_report_dir(out_dir, results_dir)
        backup = None
        if out.exists():
            backup = out.with_name(f".{out.name}.old-{_token()}")
            os.rename(out, backup)
        try:
            os.rename(tmp, out)
        except BaseException as e:
            if backup is not None:
                try:
                    os.rename(backup, out)
                except OSError as e2:
                    raise ReportError(
                        f"cannot write the report to {out_dir}: {e}; and the previous report could not "
                        f"be moved back ({e2.strerror or e2}): it is at {backup}") from e
            raise
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
        _remove_leftovers(out)


def _write_failure(out_dir: Path, e: OSError) -> str:
    import errno

    why = e.strerror or str(e) or type(e).__name__
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        hint = "free some disk space, or pass --out DIR on another disk"
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "the folder is not writable: pass --out DIR to write the report somewhere writable"
    else:
        hint = "pass --out DIR to write the report elsewhere"
    return (f"cannot write the report to {out_dir}: {why}{where}; {hint}. The previous report there "
            f"(if any) and every run folder are unchanged.")


def _build_into(tmp: Path, runs: list[Run], studies: Mapping[str, Any], results_dir: Path,
                out_dir: Path, benchmarks: Mapping[str, Any] | None = None, log=None
                ) -> tuple[list[StudySection], list[BenchmarkSection], list[TableProblem]]:
    """The whole report, written into the empty folder ``tmp``: figures, a CSV beside every
    table, copies of what the page links (run records, executed notebooks), its marker written
    last, listing every file. Nothing on the page points outside the folder."""
    _write_marker(tmp, results_dir, files=None)     # ours from the start, for the cleanup
    loaded, problems = load_tables(runs, studies)
    note_table_devices(runs, loaded)
    devices = known_devices(runs)
    csvs = _Csvs(tmp.resolve())
    errata, why = load_errata(results_dir)
    notes = [why] if why else []
    if _nh3_missing() and any(r.tables for r in runs):
        notes.append(NO_SANITIZER)
    for note in notes if log is not None else []:
        log(f"report: {note}")
    sections = []
    ordered = sorted(studies.values(), key=_study_rank)
    for i, s in enumerate(ordered, 1):
        if log is not None:
            log(f"report: {s.name} ({i}/{len(ordered)})")
        sections.append(_summarize(s, runs, tmp, loaded=loaded, devices=devices, csvs=csvs, errata=errata))
    bench = benchmark_sections(results_dir, tmp, benchmarks)
    by_run: dict[str, list[str]] = {}
    for p in problems:
        by_run.setdefault(p.run, []).append(f"{p.study}: {p.reason}")
    links = _copy_linked(tmp, runs)
    runs_csv = csvs.write(_runs_frame(runs, by_run), "runs")
    page = render_html(runs, sections, no_study=not studies, results_dir=results_dir,
                       out_dir=out_dir, benchmarks=bench, table_problems=by_run, links=links,
                       runs_csv=runs_csv, notes=notes)
    atomic_write_text(tmp / "index.html", page)
    files, _ = _walk_files(tmp)
    files.pop(REPORT_MARKER, None)
    _write_marker(tmp, results_dir, files=files)
    return sections, bench, problems


def build_report(results_dir: Path | str | None = None, out_dir: Path | str | None = None,
                 studies: Mapping[str, Any] | None = None,
                 benchmarks: Mapping[str, Any] | None = None, log=None) -> ReportResult:
    """Write ``<out_dir>/index.html`` (default ``<results_dir>/report``) and return what it shows.

    ``studies`` defaults to the registry (``workbench.studies.discover()``), ``benchmarks`` to
    ``workbench.benchmarks.discover()``. ``out_dir`` is replaced as a whole, so it must be new,
    empty, or a folder the report wrote (`check_report_dir`; UnsafeOutDir otherwise, before
    anything is read or written). The report is built in a temporary folder beside it and
    swapped in at the end: a failure at any step (ReportError for a folder that cannot be
    written, a full disk) leaves the previous report and every run folder as they were. Only
    reads the results folder. ``log``: called with a line as each study's section starts (the
    command line prints them).
    """
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out_dir = Path(out_dir) if out_dir is not None else results_dir / REPORT_DIRNAME
    check_report_dir(out_dir, results_dir)
    if studies is None:
        from .studies import discover

        studies = discover()
    runs = find_runs(results_dir)

    out = out_dir.resolve()
    tmp = out.with_name(f".{out.name}.building-{_token()}")
    made = False
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        made = True
        with _FolderLock(tmp, wait=False):        # another build's cleanup leaves it alone
            sections, bench, problems = _build_into(tmp, runs, studies, results_dir, out_dir, benchmarks, log)
            _swap_in(tmp, out_dir, results_dir)
        made = False
    except OSError as e:
        raise ReportError(_write_failure(out_dir, e)) from e
    finally:
        if made:
            shutil.rmtree(tmp, ignore_errors=True)
    return ReportResult(index=out_dir / "index.html", runs=runs, sections=sections,
                        no_study=not studies, table_problems=[str(p) for p in problems],
                        benchmarks=bench)


# --------------------------------------------------------------------------- what the page links, copied in

RUNS_DIRNAME = "runs"                # <report>/runs/<run folder>/: copies of what the page links
LOCALIZED_NOTE = ("<!-- copied into the workbench report and cleaned by an allow-list (nh3): no script, "
                  "event attribute, frame, plugin or form, no link that runs code, nothing loaded from "
                  "outside the report folder (math shows as TeX source) -->\n")
# the page's own rule, for a browser: nothing runs, nothing loads from elsewhere
_CSP = ("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data: 'self'; font-src data:; form-action 'none'; base-uri 'none'\">\n")
NO_SANITIZER = ("executed notebooks' HTML is not copied into the report: the HTML sanitizer nh3 is not "
                "installed (pip install nh3), and a notebook's HTML is never copied unsanitized")
# what nbconvert's export of an executed notebook is made of: text, code, tables, images
_TAGS = {"a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del", "details",
         "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img",
         "kbd", "li", "main", "ol", "p", "pre", "s", "samp", "small", "span", "strong", "style", "sub",
         "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "title", "tr", "u", "ul", "var"}
_ATTRIBUTES = {"*": {"class", "id", "title"}, "a": {"href"}, "img": {"src", "alt", "width", "height"},
               "td": {"colspan", "rowspan"}, "th": {"colspan", "rowspan"}, "ol": {"start"}}
_DROPPED_WITH_CONTENT = {"script", "svg", "math", "iframe", "object", "noscript", "template"}
_IMAGE_DATA = tuple(f"data:image/{t}{sep}" for t in ("png", "jpeg", "gif", "svg+xml") for sep in ";,")
_CSS_ESCAPE = re.compile(r"\\([0-9a-fA-F]{1,6})\s?|\\(.)", re.S)
_CSS_LOADS = re.compile(r"@import|(?:image-set|image|cross-fade|element|src)\(|url\(\s*(?!['\"]?\s*data:)", re.I)


def _relative(url: str) -> bool:
    """Whether ``url`` (spaces removed, lower case) is a path inside the folder: no scheme, no
    host, not from the root (``//host`` and ``\\\\host`` reach other machines)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return not (parts.scheme or parts.netloc or url.startswith(("/", "\\")))


def _attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's last word on an allowed attribute: an image only from an embedded PNG, JPEG, GIF or
    SVG or a path in the folder, a link only to http(s) or a path in the folder."""
    if name not in ("href", "src"):
        return value
    url = "".join(value.split()).lower()
    if name == "src":
        return value if url.startswith(_IMAGE_DATA) or _relative(url) else None
    return value if url.startswith(("http://", "https://")) or _relative(url) else None


def _loads_nothing(css: str) -> bool:
    """Whether a stylesheet loads nothing (no @import, no url() but data:), read with its escapes
    undone (``\\75 rl(`` is ``url(``)."""
    plain = _CSS_ESCAPE.sub(lambda m: chr(min(int(m[1], 16), 0x10FFFF)) if m[1] else m[2], css)
    return not _CSS_LOADS.search(plain)


def localize_html(text: str) -> str:
    """An executed notebook's HTML export, cleaned by an allow-list (nh3) so that it runs nothing
    and loads nothing from outside the report folder: the tags and attributes of text, code,
    tables and images (`_TAGS`, `_ATTRIBUTES`); images embedded or in the folder, links to http(s)
    or the folder (`_attribute`); ``<style>`` blocks kept where they load nothing; scripts
    (nbconvert's templates load require.js and MathJax from CDNs), inline SVG and MathML, frames
    and plugins dropped with their content. ImportError where nh3 is not installed."""
    import nh3

    clean = nh3.clean(text, tags=_TAGS, clean_content_tags=_DROPPED_WITH_CONTENT, attributes=_ATTRIBUTES,
                      attribute_filter=_attribute, url_schemes={"http", "https", "data"})
    clean = re.sub(r"<style>(.*?)</style>", lambda m: m[0] if _loads_nothing(m[1]) else "", clean, flags=re.S)
    return '<!doctype html>\n<meta charset="utf-8">\n' + _CSP + LOCALIZED_NOTE + clean


def _nh3_missing() -> bool:
    """Whether the sanitizer `localize_html` needs cannot be imported (then no notebook is copied)."""
    try:
        import nh3  # noqa: F401
    except ImportError:
        return True
    return False


def _copy_linked(root: Path, runs: list[Run]) -> dict[tuple[str, str], str]:
    """Copies of each run's meta.json and executed notebooks' HTML (cleaned: `localize_html`;
    none where nh3 is missing) under ``runs/<run folder>/``: {(run folder name, "meta.json" |
    study): path relative to ``root``}. Only regular files of the run folder are read; one that
    cannot be read is added to the run's ``skipped``."""
    links: dict[tuple[str, str], str] = {}
    notebooks = not _nh3_missing()
    for r in (r for r in runs if not r.path.is_symlink()):       # a link to a folder elsewhere: none of it
        names = [META_NAME] + ([f"{study}.html" for study in r.tables] if notebooks else [])
        for name in (n for n in names if n not in r.skipped):
            try:
                text = read_regular(r.path / name).decode("utf-8", errors="replace")
            except FileNotFoundError:
                continue
            except OSError as e:
                r.skipped[name] = _why(e)
                continue
            target = root / RUNS_DIRNAME / r.name / name
            atomic_write_text(target, text if name == META_NAME else localize_html(text))
            links[(r.name, "meta.json" if name == META_NAME else name[:-len(".html")])] = (
                target.relative_to(root).as_posix())
    return links


def _runs_frame(runs: list[Run], table_problems: Mapping[str, list[str]]):
    import pandas as pd

    rows = []
    for r in _newest_first(runs):
        rows.append({"run": r.name, "reference": r.reference, "device": r.device, "git": r.git,
                     "started_utc": r.started, "duration_s": r.duration_s,
                     "status": r.error or ("finished" if r.finished else "unfinished"),
                     "failed": "; ".join(open_failures(r.recorded)) if not r.error else "",
                     "tables": ", ".join(r.tables),
                     "unreadable_tables": "; ".join(table_problems.get(r.name) or []),
                     "skipped_files": "; ".join(f"{n}: {why}" for n, why in r.skipped.items())})
    return pd.DataFrame(rows, columns=["run", "reference", "device", "git", "started_utc", "duration_s",
                                       "status", "failed", "tables", "unreadable_tables", "skipped_files"])


def _newest_first(runs: list[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.started, r.name), reverse=True)


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 80rem; padding: 0 1rem;
       color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
h3 { font-size: 1rem; margin: 1.2rem 0 0.4rem; }
table { border-collapse: collapse; font-size: 0.9rem; width: 100%; }
th, td { text-align: left; padding: 0.3rem 0.6rem; border-bottom: 1px solid #eee; vertical-align: top; }
th { background: #f5f5f7; }
.notice { background: #fff8e1; border: 1px solid #f0c36d; padding: 0.8rem 1rem; border-radius: 4px; }
.keys { background: #f5f9ff; border: 1px solid #c9dcf5; padding: 0.4rem 1rem 0.6rem; border-radius: 4px; }
.keys li { margin: 0.25rem 0; }
.ref { background: #e8f0fe; border-radius: 3px; padding: 0 0.3rem; font-size: 0.8rem; }
.cpu { background: #fff3e0; border-radius: 3px; padding: 0 0.3rem; font-size: 0.8rem; }
.muted { color: #6e6e73; font-size: 0.85rem; }
.errata { background: #fdecea; border-left: 3px solid #c62828; padding: 0.3rem 0.6rem; }
.problem { color: #a50e0e; font-size: 0.85rem; }
figcaption { font-size: 0.8rem; color: #3a3a3c; }
pre.error { background: #fdecea; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
.figs { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 0.6rem 1rem; }
figure { margin: 0.4rem 0; } figure img { max-width: 100%; max-height: 360px; border: 1px solid #eee; }
code { background: #f5f5f7; padding: 0 0.2rem; }
.tablebox { overflow-x: auto; margin: 0.6rem 0; } .caption { font-weight: 600; }
table.data { font-size: 0.8rem; width: auto; } table.data td { text-align: right; white-space: nowrap; }
details { margin: 0.5rem 0; } details > summary { cursor: pointer; }
details.fold { border-left: 3px solid #ddd; padding-left: 0.8rem; }
ul.diffs { font-size: 0.85rem; margin: 0.3rem 0; }
.toc { font-size: 0.9rem; }
"""
TABLE_OPEN_ROWS = 8                  # a key-number table with more rows than this starts folded


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _href(rel: str) -> str:
    """A relative link for an attribute: percent-encoded (a folder name holding ``:``, ``#``,
    ``?`` or markup stays a path, never a scheme or a fragment), then HTML-escaped."""
    return _e(urllib.parse.quote(rel, safe="/"))


def _link(rel: str | None, text: str) -> str:
    return f'<a href="{_href(rel)}">{_e(text)}</a>' if rel else _e(text)


def _unfinished(r: Run) -> str:
    from .provenance import run_in_use

    if run_in_use(r.path):
        return "in progress"
    odd = [n for n in r.skipped if n.endswith(".ipynb")]
    if odd:             # the stages are read from its notebooks; these are not files to read
        return f"interrupted (its stages are not read: {_e(', '.join(odd))}: not a regular file)"
    left = run_state(r.path, r.recorded).describe_left()
    return (f"interrupted (left: {_e(left)}): finish it with <code>python -m workbench sweep --resume "
            f"{_e(r.name)}</code> (make report resumes it when the code is the same)")


def _runs_table(runs: list[Run], table_problems: Mapping[str, list[str]] | None = None,
                links: Mapping[tuple[str, str], str] | None = None, csv: str = "") -> str:
    """Every run folder, newest first, folded (its CSV beside it); what could not be used, what
    failed and what a run warned about stay visible below."""
    if not runs:
        return "<p>No run folder found yet (a run folder holds a <code>meta.json</code>).</p>"
    table_problems = table_problems or {}
    links = links or {}
    rows = []
    for r in _newest_first(runs):
        # the run's meta.json (provenance, parameters), copied into the report folder
        name = _link(links.get((r.name, "meta.json")), r.name)
        if r.reference:
            name += ' <span class="ref">reference</span>'
        if r.error:
            status = f"<span class='problem'>{_e(r.error)}</span>"
        else:
            status = "finished" if r.finished else _unfinished(r)
            if r.shard:
                status += (f", shard {_e(r.shard['index'])}/{_e(r.shard['count'])} "
                           f"of {_e(r.shard['group'])}")
            placement = _mapped(r.recorded.get("placement"))
            if placement:
                status += ", " + _e("; ".join(f"{k} on GPU {_mapped(v).get('gpu')} ({_mapped(v).get('seconds')} s)"
                                              for k, v in placement.items()))
            resumed = [_mapped(x) for x in _listed(r.recorded.get("resumed"))]
            if resumed:
                parts = "; ".join(f"{', '.join(map(str, _listed(x.get('studies'))))} at {x.get('at') or '?'}"
                                  for x in resumed)
                status += f", resumed ({_e(parts)})"
            failures = open_failures(r.recorded)
            if failures:
                status = (f"<span class='problem'>{status}, {len(failures)} failed</span> (reasons below; re-run "
                          f"them with <code>python -m workbench sweep --resume {_e(r.name)}</code>)")
        if r.skipped:
            status += (f", <span class='problem'>{len(r.skipped)} file{'s' if len(r.skipped) > 1 else ''} "
                       "not read (below)</span>")
        bad = table_problems.get(r.name) or []
        if bad:
            status += (f", <span class='problem' title='{_e('; '.join(bad))}'>{len(bad)} "
                       f"table{'s' if len(bad) > 1 else ''} unreadable</span>")
        dur = f"{r.duration_s:.1f} s" if r.duration_s is not None else ""
        tables = ", ".join(_link(links.get((r.name, t)), t) for t in r.tables) or '<span class="muted">none</span>'
        rows.append(
            f"<tr><td>{name}</td><td>{_e(r.device)}</td><td><code>{_e(r.git)}</code></td>"
            f"<td>{_e(r.started)}</td><td>{dur}</td><td>{status}</td><td>{tables}</td></tr>")
    problems = [f"<li>{_e(r.name)}: {_e(r.error)}</li>" for r in runs if r.error]
    problems += [f"<li>{_e(r.name)}: {_e(n)}: {_e(why)}; not read or copied</li>"
                 for r in runs for n, why in r.skipped.items()]
    problems += [f"<li>{_e(name)}: {_e(line)}</li>" for name, lines in table_problems.items() for line in lines]
    listing = ("<p class='problem'>Run folders and tables the report could not use:</p><ul class='problem'>"
               + "".join(problems) + "</ul>") if problems else ""
    failed = [f"<li>{_e(r.name)}: {_e(f)}</li>" for r in runs if not r.error for f in open_failures(r.recorded)]
    if failed:   # the reason on the page, not only in a tooltip
        listing += "<p class='problem'>Studies that failed in a run:</p><ul class='problem'>" + "".join(failed) + "</ul>"
    warned = [f"<li>{_e(r.name)}: {_e(w)}</li>" for r in runs
              for w in [*_listed(r.recorded.get("warnings")),
                        *(w for x in _listed(r.recorded.get("resumed")) for w in _listed(_mapped(x).get("warnings")))]]
    if warned:
        listing += "<p>Warnings a run recorded:</p><ul>" + "".join(warned) + "</ul>"
    n_ref = sum(r.reference for r in runs)
    summary = (f"{len(runs)} run folder{'s' if len(runs) != 1 else ''} ({n_ref} reference), newest first: "
               "device, commit, status, tables (each run's name opens its meta.json)")
    csv_link = f' · <a href="{_href(csv)}">CSV</a>' if csv else ""
    return (f'<details class="fold"><summary>{_e(summary)}{csv_link}</summary>'
            "<table><thead><tr><th>run</th><th>device</th><th>git</th><th>started (UTC)</th>"
            "<th>duration</th><th>status</th><th>tables</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></details>" + listing)


def _paragraphs(text: str) -> str:
    parts = [p.strip() for p in text.split("\n\n") if p.strip()]
    return "".join(f"<p>{_e(p)}</p>" for p in parts)


def _table_html(df) -> str:
    """A small DataFrame as an HTML table: three significant digits, n/a for missing values."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        return v
    return df.to_html(index=False, border=0, classes="data", na_rep="n/a", formatters={
        c: fmt for c in df.columns if df[c].dtype.kind == "f"}, escape=True)


def _figure_html(src: str, alt: str, caption: str = "", svg: str | None = None) -> str:
    """A figure: the PNG (a link to itself at full size), its caption (what it shows, which run)
    and its SVG where one was saved."""
    bits = [_e(caption)] if caption else []
    if svg:
        bits.append(f'<a href="{_href(svg)}">SVG</a>')
    cap = f"<figcaption>{' · '.join(bits)}</figcaption>" if bits else ""
    return f'<figure><a href="{_href(src)}"><img src="{_href(src)}" alt="{_e(alt)}"></a>{cap}</figure>'


def _figures_html(figs: list[str], svgs: Mapping[str, str], captions: Mapping[str, str], alt: str) -> str:
    if not figs:
        return ""
    return ('<div class="figs">' + "".join(_figure_html(f, alt, captions.get(f, ""), svgs.get(f)) for f in figs)
            + "</div>")


def _tables_html(tables: list[tuple[str, str, str]]) -> str:
    out = []
    for caption, table, csv in tables:
        head = f'<span class="caption">{_e(caption)}</span> · <a href="{_href(csv)}">CSV</a>'
        if table.count("<tr") - 1 > TABLE_OPEN_ROWS or len(tables) > 1:
            out.append(f'<details class="tablebox"><summary>{head}</summary>{table}</details>')
        else:
            out.append(f'<div class="tablebox"><p>{head}</p>{table}</div>')
    if len(tables) > 1:     # one per tower or run: one fold holding each table's own fold
        return (f'<details class="tablebox"><summary><span class="caption">Key numbers: {len(tables)} tables '
                f"(one per tower or run), each with its CSV</span></summary>{''.join(out)}</details>")
    return "".join(out)


CPU_NOTE = ("CPU smoke test: its verdicts, memory models and planner padding hold on any machine; its "
            "timings are not measurements")


def _view_body(name: str, v: View) -> str:
    out = []
    if v.error:
        out.append(f'<p>The summary failed:</p><pre class="error">{_e(v.error)}</pre>')
    for note in v.errata:
        out.append(f'<p class="errata"><b>Known problem</b> (found after the run; reference/{ERRATA_NAME}): '
                   f"{_e(note)}</p>")
    out.append(_paragraphs(v.text))
    out.append(_tables_html(v.tables))
    out.append(_grouped_figures_html(v, f"{name} figure"))
    return "".join(out)


def _grouped_figures_html(v: View, alt: str) -> str:
    """The view's figures; where they fall in several groups (runs, towers of a run), the first
    group's shown and each other group folded under its name (the findings above cover them all)."""
    order: dict[str, list[str]] = {}
    for f in v.figures:
        order.setdefault(v.groups.get(f, ""), []).append(f)
    groups = list(order.items())
    if len(groups) < 2:
        return _figures_html(v.figures, v.svgs, v.captions, alt)
    (_, first), rest = groups[0], groups[1:]
    out = [_figures_html(first, v.svgs, v.captions, alt)]
    for label, figs in rest:
        out.append(f'<details class="fold"><summary>Figures of {_e(label or "the other runs")} ({len(figs)})'
                   f"</summary>{_figures_html(figs, v.svgs, v.captions, alt)}</details>")
    return "".join(out)


def _runs_words(runs: list[str]) -> str:
    return f"run{'s' if len(runs) > 1 else ''} {', '.join(runs)}"


def _view_html(name: str, v: View) -> str:
    if v.kind == "older":
        diffs = ("<ul class='diffs'>" + "".join(f"<li>{_e(d)}</li>" for d in v.diffs) + "</ul>") if v.diffs else ""
        what = "verdicts above; their findings and figures" if v.diffs else "their findings and figures"
        return (f"<p class='muted'>Older runs on {_e(v.device)} ({len(v.runs)}), against the newest:</p>{diffs}"
                if v.diffs else "") + (
            f'<details class="fold"><summary>Older runs on {_e(v.device)}: {len(v.runs)} '
            f"({_e(what)})</summary><p class='muted'>{_e(_runs_words(v.runs))}</p>{_view_body(name, v)}</details>")
    head = f"{_e(v.device)}: newest {_e(_runs_words(v.runs))}"
    if v.folded:
        return (f'<details class="fold"><summary><span class="cpu">CPU</span> {head}. {_e(CPU_NOTE)}.</summary>'
                f"{_view_body(name, v)}</details>")
    note = f"<p class='muted'>{_e(CPU_NOTE)}.</p>" if v.cpu else ""
    return f"<h3>{head}</h3>{note}{_view_body(name, v)}"


def _comparison_html(c: Comparison) -> str:
    csv = f' · <a href="{_href(c.csv)}">CSV of every value</a>' if c.csv else ""
    out = f"<p class='muted'>Compared on {_e(c.device)}: {_e(c.line)}{csv}</p>"
    if c.table:
        out += (f'<details class="fold"><summary>The {c.flagged} flagged value{"s" if c.flagged != 1 else ""}'
                f'{" (first " + str(COMPARE_ROWS) + ")" if c.flagged > COMPARE_ROWS else ""}</summary>'
                f'<div class="tablebox">{c.table}</div></details>')
    return out


def _section_html(s: StudySection) -> str:
    out = [f'<h2 id="{_e(s.name)}">{_e(s.name)}</h2>']
    if s.question:
        out.append(f"<p><em>{_e(s.question)}</em></p>")
    if s.error and not any(v.error for v in s.views):
        out.append(f'<p>The summary failed:</p><pre class="error">{_e(s.error)}</pre>')
    if not s.views:
        out.append(_paragraphs(s.text))
    for v in s.views:
        out.append(_view_html(s.name, v))
    for c in s.comparisons:
        out.append(_comparison_html(c))
    for line in s.table_problems:
        out.append(f'<p class="problem">{_e(line)}</p>')
    for dev in s.missing_devices:
        out.append(f'<p class="muted">No {_e(s.name)} data for {_e(dev)}.</p>')
    if s.runs:
        out.append(f'<p class="muted">From runs: {_e(", ".join(s.runs))}</p>')
    return "\n".join(out)


def _benchmark_html(b: BenchmarkSection) -> str:
    out = [f'<h2 id="{_e(b.name)}">{_e(b.title)}</h2>']
    if b.note:
        out.append(f'<p class="muted">{_e(b.note)}</p>')
    many = len(b.panels) > 1
    for p in b.panels:
        if many:
            out.append(f"<h3>{_e(p.device or p.source)}{', ' + _e(p.date) if p.date else ''}</h3>")
        if p.error:
            out.append(f'<p class="problem">{_e(p.error)}</p>')
        out.append(_paragraphs(p.text))
        out.append(_figures_html(p.figures, b.svgs, b.captions, f"{b.title}, {p.device}"))
        if not p.error:
            out.append(f'<p class="muted">From <code>{_e(REFERENCE_DIRNAME)}/{_e(p.source)}</code>.</p>')
    return "\n".join(out)


KEY_FINDING_CHARS = 300              # a key finding: the finding's opening sentences, about this long


def _first_paragraph(text: str) -> str:
    """The finding's first paragraph, cut after the sentence that passes KEY_FINDING_CHARS (the
    whole finding is in its section)."""
    first = next((p.strip() for p in text.split("\n\n") if p.strip()), "")
    if len(first) <= KEY_FINDING_CHARS:
        return first
    ends = [m.end() for m in re.finditer(r"[.:;] (?=[A-Z(])", first)]
    cut = next((e for e in ends if e >= KEY_FINDING_CHARS * 3 // 4), None)
    if cut is None or cut > 2 * KEY_FINDING_CHARS:
        cut = first.rfind(" ", 0, KEY_FINDING_CHARS) + 1 or KEY_FINDING_CHARS
    return first[:cut].rstrip(" ;:") + " …"


def key_findings(sections: list[StudySection], benchmarks: list[BenchmarkSection] = ()) -> dict[str, list[tuple[str, str, str]]]:
    """{device: [(section anchor, source, first paragraph of its newest finding)]}, GPUs first
    (each in the order its sections come), CPUs after."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for s in sections:
        for v in s.views:
            if v.kind != "newest" or v.error:
                continue
            # one paragraph per tower where the study measures each on its own (one per family)
            paragraphs = [p for p in v.text.split("\n\n") if p.strip()] if s.per_preset else [v.text]
            # a tower's paragraph names its own run: no list of the view's runs before it
            source = "" if s.per_preset else _runs_words(v.runs)
            for p in paragraphs:
                if _first_paragraph(p):
                    out.setdefault(v.device, []).append((s.name, source, _first_paragraph(p)))
    for b in benchmarks:
        for p in b.panels:
            if not p.error and _first_paragraph(p.text):
                out.setdefault(p.device, []).append((b.name, f"{REFERENCE_DIRNAME}/{p.source}",
                                                     _first_paragraph(p.text)))
    return dict(sorted(out.items(), key=lambda kv: is_cpu(kv[0])))


def _key_findings_html(keys: Mapping[str, list[tuple[str, str, str]]]) -> str:
    if not keys:
        return ""
    out = ['<div class="keys" id="key-findings"><h2>Key findings: the newest run per device</h2>']
    gpu = any(not is_cpu(d) for d in keys)
    for dev, items in keys.items():
        lis = "".join(f'<li><a href="#{_href(anchor)}">{_e(anchor)}</a>'
                      + (f' <span class="muted">({_e(src)})</span>' if src else "") + f": {_e(text)}</li>"
                      for anchor, src, text in items)
        if is_cpu(dev) and gpu:
            out.append(f'<details><summary><span class="cpu">CPU</span> {_e(dev)}: {_e(CPU_NOTE)}.</summary>'
                       f"<ul>{lis}</ul></details>")
        else:
            out.append(f"<h3>{_e(dev)}</h3><ul>{lis}</ul>")
    out.append("</div>")
    return "".join(out)


def render_html(runs: list[Run], sections: list[StudySection], no_study: bool,
                results_dir: Path, out_dir: Path, benchmarks: list[BenchmarkSection] | None = None,
                table_problems: Mapping[str, list[str]] | None = None,
                links: Mapping[tuple[str, str], str] | None = None, runs_csv: str = "",
                notes: list[str] | None = None) -> str:
    """The page. ``notes``: what the whole page lacks and why (a broken errata file), shown first."""
    now = iso_utc(timespec="seconds")
    benchmarks = list(benchmarks or [])
    body = [
        "<h1>Vision-encoder input-normalization workbench: report</h1>",
        f'<p class="muted">Built {_e(now)} from <code>{_e(results_dir)}</code>: '
        f"{len(runs)} run folder(s), {sum(r.reference for r in runs)} of them reference runs. "
        "Newest run per device first; older runs and CPU smoke tests are folded. This folder holds "
        "everything the page links, so it can be zipped and shared.</p>",
        *(f'<p class="problem">{_e(n)}</p>' for n in notes or []),
    ]
    if no_study:
        body.append(f'<p class="notice"><strong>{_e(NO_STUDY_MESSAGE[0].upper() + NO_STUDY_MESSAGE[1:])}.</strong> '
                    "Study modules register themselves in <code>workbench/studies/</code>; "
                    "once one exists, <code>make report</code> runs it and summarizes it here.</p>")
    toc = ['<a href="#key-findings">key findings</a>'] if sections or benchmarks else []
    toc += [f'<a href="#{_href(s.name)}">{_e(s.name)}</a>' for s in sections]
    toc += [f'<a href="#{_href(b.name)}">{_e(b.name.replace("_", " "))}</a>' for b in benchmarks]
    toc.append('<a href="#runs">runs</a>')
    body.append(f'<p class="toc">Sections: {" · ".join(toc)}</p>')
    body.append(_key_findings_html(key_findings(sections, benchmarks)))
    for s in sections:
        body.append(_section_html(s))
    for b in benchmarks:
        body.append(_benchmark_html(b))
    body.append('<h2 id="runs">Runs</h2>')
    body.append(_runs_table(runs, table_problems, links, runs_csv))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{REPORT_TITLE}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
