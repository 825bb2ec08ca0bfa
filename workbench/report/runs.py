"""The run folders of a results folder and their study tables. Only regular files are read; a run whose
meta.json is unusable is listed with the file and the field, its tables left out; every other run still shows."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import file_kind, read_regular
from ..provenance import REFERENCE_DIRNAME, results_root
from ..runmeta import META_NAME, MetaError, RunMeta
from ..runstate import lists_run

REPORT_DIRNAME = "report"
ERRATA_NAME = "errata.json"     # {run folder: {study: note}}: problems of committed runs found after they ran
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

    name = property(lambda self: self.path.name)
    shard = property(lambda self: self.meta.shard)
    started = property(lambda self: self.meta.started_at or "")

    @property
    def logical_name(self) -> str:
        """The shard group for the shards of one sharded sweep (summarized as one run), else the folder name."""
        sh = self.shard
        return f"{sh['group']} ({sh['count']} shards)" if sh else self.name

    @property
    def device(self) -> str:
        """The device its tables name, or before they are read the host meta.json names."""
        return ", ".join(self.table_devices) or self.meta.device or "unknown device"


def _kind(path: Path) -> str | None:
    """None for a regular file (not followed), else what it is or why it cannot be read."""
    try:
        return file_kind(path, follow=False)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"


def _load_run(path: Path, reference: bool) -> Run | None:
    """The run folder ``path``, or None for a file or a folder with neither a meta.json nor a table."""
    run = Run(path=path, reference=reference)
    if path.is_symlink():
        run.error = "a symbolic link to a folder elsewhere: not followed, so none of it is read"
        return run if path.is_dir() else None
    if not path.is_dir():
        return None
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        run.error = f"the folder cannot be listed ({e.strerror or e}), so none of it is read"
        return run
    if not lists_run(names):
        return None
    run.skipped = {n: what for n in names if n == META_NAME or n.endswith(READ_SUFFIXES)   # not regular files
                   if (what := _kind(path / n))}
    tables = {n[:-len(".parquet")]: path / n for n in names if n.endswith(".parquet") and n not in run.skipped}
    if META_NAME not in names:
        run.error = NO_META
        return run
    try:
        run.meta, run.tables = RunMeta.from_json(path / META_NAME), tables
    except MetaError as e:
        run.error = _one_line(e.line, 600)
        if tables:
            run.error += f"; its tables ({', '.join(tables)}) are left out until it is fixed"
    return run


def find_runs(results_dir: Path | str | None = None) -> list[Run]:
    """Run folders under ``results_dir`` and its ``reference/`` (local first, oldest first), unusable ones too."""
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
    return sorted(runs, key=lambda r: (r.reference, r.started, r.name))


@dataclass
class TableProblem:
    """One run's table of one study that could not be read or breaks the table format."""
    run: str
    study: str
    reason: str

    @property
    def line(self) -> str:
        return f"run {self.run}: table unreadable: {self.reason}"


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _why(e: BaseException) -> str:
    """What went wrong reading a file, in one line (an OSError's own words, without its path)."""
    if isinstance(e, RecursionError):
        return "nested too deeply to parse"
    return _one_line(e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__)


def run_table(run: Run, study_name: str):
    """One run's table of one study (`load_table`: ``device`` among its columns) with ``run``, ``reference`` and
    ``run_date`` added before its value columns."""
    from ..studies.tables import load_table

    df = load_table(run.tables[study_name])
    date = re.match(r"\d{4}-\d{2}-\d{2}", run.started.strip())
    for col, value in (("run", run.logical_name), ("reference", bool(run.reference)),
                       ("run_date", date[0] if date else "")):
        if col in df.columns:
            df[col] = value
        else:
            df.insert(df.columns.get_loc("metric"), col, value)
    return df


def _second_in_group(seen: dict[tuple[str, str], list], run: Run, study: str) -> str | None:
    """Why ``run``'s table of ``study`` is not used: a shard of its group already holds a cell of it."""
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
        for study, path in ((s, p) for s, p in run.tables.items() if s in names):
            reason = _second_in_group(seen, run, study)
            if not reason:
                try:
                    loaded[(run.name, study)] = run_table(run, study)
                    continue
                except Exception as e:  # noqa: BLE001 - one bad file must not blank the report
                    msg = str(e) or type(e).__name__       # TableError names the file: keep its name only
                    reason = _one_line(msg.replace(str(path), path.name) if str(path) in msg
                                       else f"{path.name}: {type(e).__name__}: {msg}")
            problems.append(TableProblem(run=run.name, study=study, reason=reason))
    return loaded, problems


def study_table(study_name: str, runs: list[Run], loaded: Mapping[tuple[str, str], Any] | None = None):
    """All runs' readable tables of one study (read here without ``loaded``), concatenated, or None."""
    import pandas as pd

    loaded = load_tables(runs, [study_name])[0] if loaded is None else loaded
    frames = [loaded[(r.name, study_name)] for r in runs if (r.name, study_name) in loaded]
    return pd.concat(frames, ignore_index=True) if frames else None


def load_errata(results_dir: Path | str) -> tuple[dict[str, dict[str, str]], str | None]:
    """({run folder: {study: note}} from reference/errata.json, or {}; why the file was not used)."""
    path = Path(results_dir) / REFERENCE_DIRNAME / ERRATA_NAME
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
        if not (isinstance(data, dict) and all(isinstance(v, dict) and all(isinstance(n, str) for n in v.values())
                                               for v in data.values())):     # JSON keys are strings
            raise ValueError("expected {run folder: {study: note}} with strings")
    except (FileNotFoundError, NotADirectoryError):
        return {}, None
    except (OSError, ValueError, RecursionError) as e:
        return {}, f"{REFERENCE_DIRNAME}/{ERRATA_NAME}: not used, so no known problem of a run is shown ({_why(e)})"
    return data, None
