"""The run folders of a results folder, their study tables, and the queries every command asks of them. Only
regular files are read; a run whose meta.json is unusable is listed with the file and the field, its tables left
out; a table that breaks the format or lacks a column its study's readers need is listed and left out; every other
run still shows."""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import file_kind, read_regular
from ..provenance import REFERENCE_DIRNAME, results_folder
from .meta import META_NAME, MetaError, RunMeta
from .folder import lists_run

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


def file_problem(path: Path) -> str | None:
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
                   if (what := file_problem(path / n))}
    tables = {n[:-len(".parquet")]: path / n for n in names if n.endswith(".parquet") and n not in run.skipped}
    if META_NAME not in names:
        run.error = NO_META
        return run
    try:
        run.meta, run.tables = RunMeta.from_json(path / META_NAME), tables
    except MetaError as e:
        run.error = one_line(e.line, 600)
        if tables:
            run.error += f"; its tables ({', '.join(tables)}) are left out until it is fixed"
    return run


def find_runs(results_dir: Path | str | None = None) -> list[Run]:
    """Run folders under ``results_dir`` and its ``reference/`` (local first, oldest first), unusable ones too."""
    results_dir = results_folder(results_dir, "results_dir")
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


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def why_unreadable(e: BaseException) -> str:
    """What went wrong reading a file, in one line (an OSError's own words, without its path)."""
    if isinstance(e, RecursionError):
        return "nested too deeply to parse"
    return one_line(e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__)


def run_table(run: Run, study_name: str):
    """One run's table of one study (`load_table`: ``device`` among its columns) with ``run``, ``reference`` and
    ``run_date`` added before its value columns."""
    from .tables import load_table

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


def missing_columns(table, required) -> str | None:
    """Why ``table`` cannot be used by code that reads the parameter columns ``required``: the ones it lacks."""
    lacks = [c for c in required or () if c not in table.columns]
    if lacks:
        return (f"it lacks the column(s) {lacks} that this study's summaries read (a table of another format or "
                "another tool), so it is left out")
    return None


def load_tables(runs: list[Run], study_names,
                required: Mapping[str, Any] | None = None) -> tuple[dict[tuple[str, str], Any], list[TableProblem]]:
    """{(run name, study): DataFrame} of every run's table of each study, and those that could not be read or lack
    a column of ``required`` ({study: parameter columns its readers need})."""
    loaded: dict[tuple[str, str], Any] = {}
    problems: list[TableProblem] = []
    names = set(study_names)
    required = required or {}
    seen: dict[tuple[str, str], list] = {}     # (logical run, study) -> [(shard folder, its cells)]
    for run in runs:
        for study, path in ((s, p) for s, p in run.tables.items() if s in names):
            reason = _second_in_group(seen, run, study)
            if not reason:
                try:
                    table = run_table(run, study)
                    reason = missing_columns(table, required.get(study))
                    if reason is None:
                        loaded[(run.name, study)] = table
                        continue
                    reason = f"{path.name}: {reason}"
                except Exception as e:  # noqa: BLE001 - one bad file must not blank the report
                    msg = str(e) or type(e).__name__       # TableError names the file: keep its name only
                    reason = one_line(msg.replace(str(path), path.name) if str(path) in msg
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
        return {}, (f"{REFERENCE_DIRNAME}/{ERRATA_NAME}: not used, so no known problem of a run is shown "
                    f"({why_unreadable(e)})")
    return data, None


# ---- queries: what the sweep, advise, compare and audit ask of the run folders ----------------------------------

def run_folders(results: Path | str) -> list[Path]:
    """The folders under ``results`` and its reference/ that hold a regular meta.json (no link followed), newest
    first by their UTC-stamped name."""
    found = []
    for root in (Path(results), Path(results) / REFERENCE_DIRNAME):
        if root.is_dir():
            found += [p for p in root.iterdir() if not p.name.startswith(".") and p.is_dir() and not p.is_symlink()
                      and file_problem(p / META_NAME) is None]
    return sorted(found, key=lambda p: p.name, reverse=True)


def table_file(run: Path | str, study: str) -> Path | None:
    """``<run>/<study>.parquet`` where it is a regular file (not a link), else None."""
    path = Path(run) / f"{study}.parquet"
    return path if file_problem(path) is None else None


@functools.lru_cache(maxsize=64)
def _cached_table(path: str, stamp: tuple):
    """A run's table, read once per (file, modification stamp): every family's advice looks through the same runs.
    Callers filter it into new frames and never modify it."""
    from .tables import load_table
    return load_table(Path(path))


def read_table(run: Path | str, study: str):
    """A run's table of ``study`` (checked, cached while the file is unchanged); None where it has none or it
    cannot be read."""
    from .tables import TableError
    path = table_file(run, study)
    if path is None:
        return None
    try:
        st = path.stat()
        return _cached_table(str(path), (st.st_mtime_ns, st.st_size))
    except (OSError, ValueError, TableError):
        return None


def newest_rows(results: Path | str, study: str, column: str, value: str, where=None, required=()):
    """(table rows of ``column == value`` (and ``where(rows)``, a mask), run folder) of the newest run of ``study``
    that has them, a GPU run before any CPU run; (None, None) where none has. A table that cannot be read, or lacks
    ``column`` or one of the ``required`` columns, is passed over."""
    from ..provenance import is_cpu
    cpu = None
    for run in run_folders(results):
        table = read_table(run, study)
        if table is None or column not in table.columns or missing_columns(table, required):
            continue
        rows = table[table[column] == value]
        if where is not None and len(rows):
            rows = rows[where(rows)]
        if not len(rows):
            continue
        cpu_rows = rows["device"].map(is_cpu)
        if not cpu_rows.all():
            return rows[~cpu_rows], run
        cpu = cpu or (rows, run)
    return cpu or (None, None)


def timings(folders: list[Path | str], profile: str | tuple[str, ...], exclude: Path | None = None):
    """(study, seconds, params) of every study timed by the runs of ``profile`` (or of any of several) in
    ``folders``, the newest run (by name: UTC time first) first; a run whose meta.json is unusable counts nothing."""
    profiles = (profile,) if isinstance(profile, str) else tuple(profile)
    metas = (m for f in folders for m in Path(f).glob(f"*/{META_NAME}") if m.parent != exclude)
    for m in sorted(metas, key=lambda m: m.parent.name, reverse=True):
        try:
            meta = RunMeta.from_json(m)
        except MetaError:
            continue
        if (meta.params or {}).get("profile") in profiles:
            for name, sec in (meta.study_seconds or {}).items():
                yield name, float(sec), dict(meta.plan.get(name) or {})


def newest_timings(found) -> dict[str, tuple[float, dict]]:
    """{study: (seconds, params)} of the first (newest) of ``found`` (`timings`) for each study."""
    known: dict[str, tuple[float, dict]] = {}
    for name, sec, params in found:
        known.setdefault(name, (sec, params))
    return known


def run_of_commit(results: Path | str, name: str, sha: str, wanted) -> Path | None:
    """The newest run ``*-<short sha>-<name>`` of the clean commit ``sha`` for which ``wanted(folder, meta)``."""
    from .folder import RunFolder
    for run in sorted(Path(results).glob(f"*-{sha[:7]}-{name}"), reverse=True):
        try:
            meta = RunFolder(run).meta()
        except MetaError:
            continue
        if (meta.git or {}).get("sha") == sha and not (meta.git or {}).get("dirty") and wanted(run, meta):
            return run
    return None


class RunNotFound(LookupError):
    """No run folder where one was named; the message says what was tried."""


def has_tables(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and any(p.glob("*.parquet"))


def started_at(run: Path) -> str:
    """A run's recorded start ('' where its meta.json is missing or unusable)."""
    try:
        return str(RunMeta.from_json(run / META_NAME).started_at or "")
    except MetaError:
        return ""


def resolve_run(spec: str | Path, results: str | Path | None = None, latest: str = "latest") -> Path:
    """The run folder ``spec`` names: a folder, a folder name under ``results`` or its reference/, or ``latest``
    (the last started); RunNotFound listing what was tried otherwise, ValueError for an empty ``spec`` or ``results``
    (Path("") is the current folder, never what "" meant)."""
    results = results_folder(results)
    text = str(spec)
    if not text.strip():
        raise ValueError(f"run {text!r} is empty; give a run folder, a run name under {results} or its reference/, "
                         f"or '{latest}'")
    if text == latest:
        runs = [c for base in (results, results / REFERENCE_DIRNAME) if base.is_dir() for c in sorted(base.iterdir())
                if not c.name.startswith(".") and c.name not in (REPORT_DIRNAME, REFERENCE_DIRNAME) and has_tables(c)]
        if not runs:
            raise RunNotFound(f"'{latest}': no run folder with a table under {results}")
        return max(runs, key=lambda p: (started_at(p), p.name))
    tried = [Path(text), results / text, results / REFERENCE_DIRNAME / text]
    for p in tried:
        if has_tables(p):
            return p
    raise RunNotFound(f"no run folder with tables named {text!r}: tried {', '.join(map(str, tried))} "
                      f"(give a folder, a run name under {results} or its reference/, or '{latest}')")


AUDITS_DIR = "audits"


def saved_audits(results: Path | str) -> list[Path]:
    """The saved audits, oldest first: the committed ones under reference/audits by the release they read (a clone
    gives every file the same time), then the user's own under ``<results>/audits`` by file time. Links are left
    out."""
    def saved(folder: Path) -> list[Path]:
        return [p for p in folder.glob("*.json") if file_problem(p) is None] if folder.is_dir() else []

    def release(p: Path) -> tuple:      # vllm-0.34.0.json -> (0, 34, 0)
        return tuple(int(x) for x in re.findall(r"\d+", p.stem.rpartition("-")[2])) or (-1,)
    mine, ref = Path(results) / AUDITS_DIR, Path(results) / REFERENCE_DIRNAME / AUDITS_DIR
    return sorted(saved(ref), key=release) + sorted(saved(mine), key=lambda p: p.stat().st_mtime)


def reference_files(results: Path | str, pattern: str = "*.json") -> list[Path]:
    """The files of reference/ matching ``pattern``, by name (what the report's benchmark sections draw)."""
    ref = Path(results) / REFERENCE_DIRNAME
    return sorted(ref.glob(pattern)) if ref.is_dir() else []


# ---- writing ---------------------------------------------------------------------------------------------------

def save_table(study_name: str, table: Any, run_dir: str | Path | None = None,
               params: Mapping[str, Any] | None = None, results_root: str | Path | None = None,
               started=None) -> Path:
    """Check ``table`` against the study table format and write ``<run_dir>/<study_name>.parquet`` atomically;
    returns its path. Every run folder ends up with its provenance:

    - ``run_dir=None`` (a notebook run interactively): a new run folder under ``results_root`` (default:
      `workbench.provenance.results_root()`) with its own meta.json (mode ``interactive``);
    - a ``run_dir`` without meta.json (papermill started by hand with ``-p run_dir ...``): a meta.json is written
      there (mode ``notebook``); a later study saved into the same folder adds its parameters to it;
    - a ``run_dir`` whose meta.json another process wrote (the sweep's): left alone.

    ``params`` are recorded as the study's parameters, ``started`` (a datetime) as the run's start where this
    call writes its meta.json. An existing table is never replaced."""
    from ..provenance import iso_utc
    from .folder import RunFolder, check_study_name, run_in_use
    from .tables import check_table

    check_study_name(study_name)        # a path in the name would write outside the run folder
    table = check_table(table, name=f"{study_name} table")
    if isinstance(run_dir, str) and not run_dir.strip():
        raise ValueError(f"run_dir={run_dir!r} is empty; give a run folder, or None for a new one")
    if run_dir is None:
        root = results_folder(results_root, "results_root")
        run, mode = RunFolder.create(root, name=f"{study_name}-interactive"), "interactive"
    else:
        run, mode = RunFolder(Path(run_dir)), "notebook"
        # read before anything is written: an unusable record refuses the folder, a finished one is evidence
        meta = run.meta() if (run.path / META_NAME).exists() else None
        if meta is not None and meta.finished_at and (meta.params or {}).get("mode") != "notebook" \
                and not run_in_use(run.path):
            raise FileExistsError(f"{run.path} is a finished run (finished at {meta.finished_at}, mode "
                                  f"{(meta.params or {}).get('mode')!r}); a finished run's folder is a record and "
                                  f"takes no new table: save into a new run folder (run_dir=None), or finish the "
                                  f"run with python -m workbench sweep --resume {run.path.name} --resume-finished")
        run.path.mkdir(parents=True, exist_ok=True)
    path = run.write_table(study_name, table)
    recorded = {study_name: dict(params or {})}
    if not (run.path / META_NAME).exists():
        meta = RunMeta.collect({"studies": recorded, "mode": mode})
        if started is not None:
            meta.started_at = iso_utc(started)
        meta.finish().write(run.path)
    else:
        meta = run.meta()
        if (meta.params or {}).get("mode") == "notebook":     # ours: add this study
            meta.params.setdefault("studies", {}).update(recorded)
            meta.finish().write(run.path, overwrite=True)
    return path
