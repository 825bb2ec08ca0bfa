"""The run folders of a results folder and their study tables, read for the report.

Run folders may come from anyone. Only regular files are read (`workbench.files.read_regular`):
never through a symbolic link, never a FIFO, socket or device. A run whose meta.json cannot be
read as a `RunMeta` is listed with the file and the field, and its tables are left out; a table
that cannot be read is named with the reason; every other run still shows.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import file_kind, read_regular
from ..provenance import results_root
from ..runmeta import META_NAME, MetaError, RunMeta, load

REPORT_DIRNAME = "report"


REFERENCE_DIRNAME = "reference"


# known problems of committed runs, found after they were measured: {run folder: {study: note}} in
# reference/errata.json; a run is a record and is never edited, so its view carries the note instead
ERRATA_NAME = "errata.json"


class ReportError(RuntimeError):
    """The report could not be built where asked. The message names the folder and says what to
    do; the previous report there (if any) and every run folder are as they were."""



@dataclass
class Run:
    """One run folder and what it holds."""

    path: Path
    meta: RunMeta | None                                       # None: meta.json missing or unusable
    tables: dict[str, Path] = field(default_factory=dict)     # study name -> parquet file
    reference: bool = False
    error: str | None = None                                   # why meta.json is not used
    table_devices: list[str] = field(default_factory=list)     # `device` values of its read tables
    skipped: dict[str, str] = field(default_factory=dict)      # file -> why it was not read or copied

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def recorded(self) -> RunMeta:
        """Its RunMeta (an empty one where there is none)."""
        return self.meta if self.meta is not None else RunMeta()

    @property
    def shard(self) -> dict | None:
        """{index, count, group, cells} for a shard of a sharded sweep, else None."""
        return self.recorded.shard

    @property
    def logical_name(self) -> str:
        """What the studies call this run: the shard group for the shards of one sharded sweep
        (their tables are summarized as one run), else the folder name."""
        sh = self.shard
        return f"{sh['group']} ({sh['count']} shards)" if sh else self.name

    @property
    def device(self) -> str:
        """The device its tables were measured on (the tables' own name), or, before they are
        read, the host meta.json names ('2x NVIDIA H200' on a 2-GPU host)."""
        return ", ".join(self.table_devices) or self.recorded.device or "unknown device"

    @property
    def git(self) -> str:
        return self.recorded.git_label

    @property
    def started(self) -> str:
        return self.recorded.started_at or ""

    @property
    def finished(self) -> bool:
        return bool(self.recorded.finished_at)

    @property
    def duration_s(self) -> float | None:
        d = self.recorded.duration_s
        return None if d is None else float(d)


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
        run.meta, run.tables = load(path), tables
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



_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})")


def _run_date(run: Run) -> str:
    m = _DATE.match(run.started.strip())
    return m.group(1) if m else ""



def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."



def _why(e: BaseException) -> str:
    """One line: what went wrong reading a file (an OSError's own words, without its path)."""
    if isinstance(e, RecursionError):
        return "nested too deeply to parse"
    return _one_line(e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__)



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
    from ..studies.tables import VALUE_COLUMNS, load_table

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
    added); None when there is none. ``loaded``: from `load_tables`; without it the tables are
    read here and what could not be read is added to ``problems``."""
    import pandas as pd

    if loaded is None:
        loaded, found = load_tables(runs, [study_name])
        if problems is not None:
            problems += found
    frames = [loaded[(r.name, study_name)] for r in runs if (r.name, study_name) in loaded]
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
        elif run.recorded.device:
            devices.add(run.recorded.device)
    return devices



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
