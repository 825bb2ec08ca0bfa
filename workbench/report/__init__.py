"""Build ``results/report/index.html`` from the run folders under ``results/`` (local runs and the
committed ``reference/`` runs, labelled by device). The steps: `runs` (collect), `views` (each study's
summarize, one view per device, as DataFrames), `html` (render at the end), `linked` (copies of what
the page links), `output` (the report writes only its own folder, built beside it and renamed into
place). Nothing here runs a model.
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
from .linked import NO_SANITIZER, RUNS_DIRNAME, copy_linked, localize_html, nh3_missing
from .output import (REPORT_MARKER, REPORT_TITLE, UnsafeOutDir, _token, check_report_dir, swap_in,
                     write_failure, write_marker)
from .runs import (ERRATA_NAME, REFERENCE_DIRNAME, REPORT_DIRNAME, ReportError, Run, TableProblem, find_runs,
                   load_errata, load_tables, note_table_devices, run_table, study_table)
from .views import Comparison, Csvs, StudySection, View, is_cpu, newest_mask, study_rank, summarize

__all__ = ["BenchmarkSection", "Comparison", "ERRATA_NAME", "NO_SANITIZER", "NO_STUDY_MESSAGE", "REFERENCE_DIRNAME",
           "REPORT_DIRNAME", "REPORT_MARKER", "REPORT_TITLE", "RUNS_DIRNAME", "ReportError", "ReportResult", "Run",
           "StudySection", "TableProblem", "UnsafeOutDir", "View", "build_report", "check_report_dir", "find_runs",
           "is_cpu", "key_findings", "load_tables", "localize_html", "newest_mask", "run_table", "study_table",
           "_view_body"]


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
        """Failed summaries (the CLI exits non-zero for these); unreadable tables are not counted."""
        return [f"{s.name}: {s.error.splitlines()[-1]}" for s in self.sections if s.error]

    def benchmark(self, name: str) -> BenchmarkSection:
        (b,) = [b for b in self.benchmarks if b.name == name]
        return b


def _runs_frame(runs: list[Run], table_problems: Mapping[str, list[str]]):
    import pandas as pd

    rows = [{"run": r.name, "reference": r.reference, "device": r.device, "git": r.meta.git_label,
             "started_utc": r.started, "duration_s": r.meta.duration_s,
             "status": r.error or ("finished" if r.meta.finished_at else "unfinished"),
             "failed": "; ".join(r.meta.open_failures()) if not r.error else "",
             "tables": ", ".join(r.tables),
             "unreadable_tables": "; ".join(table_problems.get(r.name) or []),
             "skipped_files": "; ".join(f"{n}: {why}" for n, why in r.skipped.items())}
            for r in _newest_first(runs)]
    return pd.DataFrame(rows, columns=["run", "reference", "device", "git", "started_utc", "duration_s",
                                       "status", "failed", "tables", "unreadable_tables", "skipped_files"])


def _build_into(tmp: Path, runs: list[Run], studies: Mapping[str, Any], results_dir: Path,
                benchmarks: Mapping[str, Any] | None, log) -> tuple[list[StudySection], list[BenchmarkSection],
                                                                   list[TableProblem]]:
    """The whole report, written into the empty folder ``tmp``; its marker is written first (the
    folder is the report's, for a later cleanup) and again last, listing every file."""
    write_marker(tmp, results_dir, final=False)
    loaded, problems = load_tables(runs, studies)
    devices = note_table_devices(runs, loaded)
    csvs = Csvs(tmp)
    errata, why = load_errata(results_dir)
    notes = [why] if why else []
    if nh3_missing() and any(r.tables for r in runs):
        notes.append(NO_SANITIZER)
    for note in notes:
        log(f"report: {note}")
    sections = []
    ordered = sorted(studies.values(), key=study_rank)
    for i, s in enumerate(ordered, 1):
        log(f"report: {s.name} ({i}/{len(ordered)})")
        sections.append(summarize(s, runs, tmp, loaded, [p for p in problems if p.study == s.name],
                                  devices, csvs, errata))
    bench = benchmark_sections(results_dir, tmp, benchmarks)
    by_run: dict[str, list[str]] = {}
    for p in problems:
        by_run.setdefault(p.run, []).append(f"{p.study}: {p.reason}")
    links = copy_linked(tmp, runs)
    runs_csv = csvs.write(_runs_frame(runs, by_run), "runs")
    page = render_html(runs, sections, not studies, results_dir, bench, by_run, links, runs_csv, notes)
    atomic_write_text(tmp / "index.html", page)
    write_marker(tmp, results_dir, final=True)
    return sections, bench, problems


def build_report(results_dir: Path | str | None = None, out_dir: Path | str | None = None,
                 studies: Mapping[str, Any] | None = None,
                 benchmarks: Mapping[str, Any] | None = None, log=None) -> ReportResult:
    """Write ``<out_dir>/index.html`` (default ``<results_dir>/report``) and return what it shows.

    ``studies`` and ``benchmarks`` default to the registries. ``out_dir`` is replaced as a whole, so
    it must pass `check_report_dir` (UnsafeOutDir before any work otherwise); a failure at any later
    step (ReportError) leaves the previous report and every run folder as they were. ``log``: called
    with a line as each study's section starts.
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
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        try:
            sections, bench, problems = _build_into(tmp, runs, studies, results_dir, benchmarks,
                                                    log or (lambda line: None))
            swap_in(tmp, out_dir, results_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)     # gone already where the swap worked
    except OSError as e:
        raise ReportError(write_failure(out_dir, e)) from e
    return ReportResult(index=out_dir / "index.html", runs=runs, sections=sections, no_study=not studies,
                        table_problems=[str(p) for p in problems], benchmarks=bench)
