"""Build ``results/report/index.html`` from the run folders under ``results/``.

The report only reads: each run folder holds ``meta.json`` (workbench.runmeta) and one
``<study>.parquet`` tidy table per study it ran. Runs committed under ``results/reference/``
(measured on GPU hosts) are shown beside local ones, marked as reference and labelled by device.
For every registered study, the readable tables of all runs are concatenated and handed to the
study's summarize, one view per device (`views`); the page reads newest first, older runs and CPU
smoke tests folded; everything it links is inside its folder (`linked`). The steps:
`runs` (collect), `views` (summarize, as DataFrames), `html` (render at the end), `output` (the
folder rule: the report writes only its own folder, built beside it and renamed into place).
Nothing here runs a model.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import atomic_write_text
from ..provenance import results_root
from .benchmarks import BenchmarkSection, benchmark_sections, key_findings
from .html import NO_STUDY_MESSAGE, _newest_first, _view_body, render_html
from .linked import NO_SANITIZER, RUNS_DIRNAME, _copy_linked, _nh3_missing, localize_html
from .output import (REPORT_MARKER, REPORT_TITLE, UnsafeOutDir, _FolderLock, _swap_in, _token, _walk_files,
                     _write_failure, _write_marker, check_report_dir)
from .runs import (ERRATA_NAME, REFERENCE_DIRNAME, REPORT_DIRNAME, ReportError, Run, TableProblem, find_runs,
                   known_devices, load_errata, load_tables, note_table_devices, run_table, study_table)
from .views import Comparison, StudySection, View, _Csvs, _study_rank, _summarize, is_cpu, newest_mask

__all__ = ["BenchmarkSection", "Comparison", "ERRATA_NAME", "NO_SANITIZER", "NO_STUDY_MESSAGE", "REFERENCE_DIRNAME",
           "REPORT_DIRNAME", "REPORT_MARKER", "REPORT_TITLE", "RUNS_DIRNAME", "ReportError", "ReportResult", "Run",
           "StudySection", "TableProblem", "UnsafeOutDir", "View", "build_report", "check_report_dir", "find_runs",
           "is_cpu", "key_findings", "load_tables", "localize_html", "newest_mask", "run_table", "study_table",
           "_FolderLock", "_view_body"]

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



def _runs_frame(runs: list[Run], table_problems: Mapping[str, list[str]]):
    import pandas as pd

    rows = []
    for r in _newest_first(runs):
        rows.append({"run": r.name, "reference": r.reference, "device": r.device, "git": r.git,
                     "started_utc": r.started, "duration_s": r.duration_s,
                     "status": r.error or ("finished" if r.finished else "unfinished"),
                     "failed": "; ".join(r.recorded.open_failures()) if not r.error else "",
                     "tables": ", ".join(r.tables),
                     "unreadable_tables": "; ".join(table_problems.get(r.name) or []),
                     "skipped_files": "; ".join(f"{n}: {why}" for n, why in r.skipped.items())})
    return pd.DataFrame(rows, columns=["run", "reference", "device", "git", "started_utc", "duration_s",
                                       "status", "failed", "tables", "unreadable_tables", "skipped_files"])



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
        sections.append(_summarize(s, runs, tmp, loaded=loaded, problems=[p for p in problems if p.study == s.name],
                                   devices=devices, csvs=csvs, errata=errata))
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
        from ..studies import discover

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
