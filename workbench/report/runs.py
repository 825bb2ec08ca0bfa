"""The run folders of a results folder and their study tables, read for the report.

Run folders may come from anyone: only regular files are read (`workbench.files.read_regular`). A
run whose meta.json is not a usable `RunMeta` is listed with the file and the field, its tables left
out; a table that cannot be read is named with the reason; every other run still shows.
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
# {run folder: {study: note}}: problems of committed runs found after they were measured (a run is
# a record and is never edited, so its view carries the note instead)
ERRATA_NAME = "errata.json"
READ_SUFFIXES = (".parquet", ".html", ".ipynb")     # what the report reads or copies from a run folder
NO_META = ("no meta.json: the report cannot say what ran there or on which device, so its tables are "
           "not used (a run folder gets one from the sweep or from save_table)")


class ReportError(RuntimeError):
    """The report could not be built where asked; the previous report and every run folder are as they were."""


@dataclass
class Run:
    """One run folder and what it holds; ``meta`` is empty where meta.json is unusable (``error`` says why)."""

    path: Path
    meta: RunMeta = field(default_factory=RunMeta)
    tables: dict[str, Path] = field(default_factory=dict)     # study name -> parquet file
    reference: bool = False
    error: str | None = None
    table_devices: list[str] = field(default_factory=list)     # `device` values of its read tables
    skipped: dict[str, str] = field(default_factory=dict)      # file -> why it was not read or copied

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def shard(self) -> dict | None:
        return self.meta.shard

    @property
    def logical_name(self) -> str:
        """The shard group for the shards of one sharded sweep (summarized as one run), else the folder name."""
        sh = self.shard
        return f"{sh['group']} ({sh['count']} shards)" if sh else self.name

    @property
    def device(self) -> str:
        """The device its tables name, or before they are read the host meta.json names."""
        return ", ".join(self.table_devices) or self.meta.device or "unknown device"

    @property
    def started(self) -> str:
        return self.meta.started_at or ""


def _skipped(path: Path, names: list[str]) -> dict[str, str]:
    """{name: what it is} of the files the report would read in ``path`` that are not regular files."""
    out = {}
    for n in (n for n in names if n == META_NAME or n.endswith(READ_SUFFIXES)):
        try:
            what = file_kind(path / n, follow=False)
        except OSError as e:
            what = f"cannot be read ({e.strerror or e})"
        if what:
            out[n] = what
    return out


def _load_run(path: Path, reference: bool) -> Run | None:
    """The run folder ``path``, or None for a file or a folder with neither a meta.json nor a table."""
    if path.is_symlink():
        why = "a symbolic link to a folder elsewhere: not followed, so none of it is read"
        return Run(path=path, reference=reference, error=why) if path.is_dir() else None
    if not path.is_dir():
        return None
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        return Run(path=path, reference=reference,
                   error=f"the folder cannot be listed ({e.strerror or e}), so none of it is read")
    if META_NAME not in names and not any(n.endswith(".parquet") for n in names):
        return None
    run = Run(path=path, reference=reference, skipped=_skipped(path, names))
    tables = {n[:-len(".parquet")]: path / n for n in names if n.endswith(".parquet") and n not in run.skipped}
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
    """Run folders under ``results_dir`` and its ``reference/``: local first, each group oldest first.
    A folder that cannot be used is listed too, with the reason in ``error``."""
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
            if child.name.startswith(".") or (not reference and child.name in (REPORT_DIRNAME, REFERENCE_DIRNAME)):
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


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _why(e: BaseException) -> str:
    """What went wrong reading a file, in one line (an OSError's own words, without its path)."""
    if isinstance(e, RecursionError):
        return "nested too deeply to parse"
    return _one_line(e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__)


def _problem_reason(exc: BaseException, path: Path) -> str:
    msg = str(exc) or type(exc).__name__
    if str(path) in msg:                          # TableError names the file: keep its name only
        return _one_line(msg.replace(str(path), path.name))
    return _one_line(f"{path.name}: {type(exc).__name__}: {msg}")


def run_table(run: Run, study_name: str):
    """One run's table of one study (`load_table`), with ``run``, ``reference`` and ``run_date`` columns
    and ``device`` from meta.json where the table has none. Raises what `load_table` raises."""
    from ..studies.tables import VALUE_COLUMNS, load_table

    df = load_table(run.tables[study_name])
    date = re.match(r"\d{4}-\d{2}-\d{2}", run.started.strip())
    added = {"run": run.logical_name, "reference": bool(run.reference), "run_date": date[0] if date else ""}
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


def _second_in_group(seen: dict[tuple[str, str], list], run: Run, study: str) -> str | None:
    """Why ``run``'s table of ``study`` is not used: a shard of its group already holds a cell of it
    (a study split by cell over the shards holds each once); None where it may be used."""
    cells = ((run.shard or {}).get("cells") or {}).get(study)
    mine = None if cells is None else {json.dumps(v, sort_keys=True) for v in cells}     # None: the whole study
    earlier = seen.setdefault((run.logical_name, study), [])
    for name, theirs in earlier:
        if name == run.name:
            return None
        if theirs is None or mine is None or theirs & mine:
            return (f"{run.logical_name} already has a {study} table from shard folder {name} with cells this "
                    "one ran too; a shard group holds each cell of a study once")
    earlier.append((run.name, mine))
    return None


def load_tables(runs: list[Run], study_names) -> tuple[dict[tuple[str, str], Any], list[TableProblem]]:
    """{(run name, study): DataFrame} of every run's table of each study, and those that could not be read."""
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
    """All runs' readable tables of one study, concatenated, or None. Without ``loaded`` (`load_tables`)
    they are read here and what could not be read is added to ``problems``."""
    import pandas as pd

    if loaded is None:
        loaded, found = load_tables(runs, [study_name])
        if problems is not None:
            problems += found
    frames = [loaded[(r.name, study_name)] for r in runs if (r.name, study_name) in loaded]
    return pd.concat(frames, ignore_index=True) if frames else None


def note_table_devices(runs: list[Run], loaded: Mapping[tuple[str, str], Any]) -> set[str]:
    """Set each run's ``table_devices`` from its loaded tables; returns every device seen (a run with no
    readable table counts by its meta.json device)."""
    devices: set[str] = set()
    for run in runs:
        run.table_devices = sorted({str(d) for (name, _), df in loaded.items() if name == run.name
                                    for d in df["device"].dropna().unique()})
        if run.table_devices:
            devices.update(run.table_devices)
        elif run.meta.device:
            devices.add(run.meta.device)
    return devices


def load_errata(results_dir: Path | str) -> tuple[dict[str, dict[str, str]], str | None]:
    """({run folder: {study: note}} from reference/errata.json, or {}; why the file was not used)."""
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
