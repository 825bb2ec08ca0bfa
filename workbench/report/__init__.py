"""Build ``results/report/index.html`` from the run folders under ``results/`` and ``results/reference/``:
`runs` collects them, `views` summarizes them, `html` renders the page, `output` writes the report's folder."""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import atomic_write_text
from ..limits import cpu_count
from ..procs import ParentWatch, die_with_parent
from ..provenance import results_root
# the names below that this module does not use are the package's public ones (and view_body, for tests)
from .answers import answers_html
from .html import NO_STUDY_MESSAGE, REPORT_TITLE, newest_first, view_body, render_html
from ..notebook_path import NO_SANITIZER, localize_html, nh3_missing
from .output import (REPORT_MARKER, RUNS_DIRNAME, UnsafeOutDir, build_token, check_report_dir, copy_linked, swap_in,
                     write_failure, write_marker)
from ..results import ERRATA_NAME, REPORT_DIRNAME, ReportError, Run, find_runs, load_errata, load_tables, study_table
from .views import BenchmarkSection, Csvs, StudySection, View, benchmark_sections, key_findings, summarize

SUMMARY_PROCESSES = 8    # at most: studies summarized side by side
RUN_COLUMNS = ["run", "reference", "device", "git", "started_utc", "duration_s", "status", "failed", "tables",
               "unreadable_tables", "skipped_files"]


@dataclass
class ReportResult:
    index: Path
    runs: list[Run]
    sections: list[StudySection]
    no_study: bool
    table_problems: list[str] = field(default_factory=list)   # "<study>: run X: table unreadable: ..."
    benchmarks: list[BenchmarkSection] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:        # failed summaries (the CLI exits non-zero); not unreadable tables
        return [f"{s.name}: {s.error.splitlines()[-1]}" for s in self.sections if s.error]


def _build_into(tmp: Path, runs: list[Run], studies: Mapping[str, Any], results_dir: Path,
                benchmarks: Mapping[str, Any] | None, log) -> ReportResult:
    """The whole report, written into the empty folder ``tmp``: its marker first, and last listing every file."""
    import pandas as pd

    write_marker(tmp, results_dir, final=False)
    loaded, problems = load_tables(runs, studies, required={n: getattr(s, "columns", ()) for n, s in studies.items()})
    devices: set[str] = set()       # every device seen; a run with no readable table counts by its meta.json
    for run in runs:
        run.table_devices = sorted({str(d) for (name, _), df in loaded.items() if name == run.name
                                    for d in df["device"].dropna().unique()})
        devices.update(run.table_devices or ([run.meta.device] if run.meta.device else []))
    csvs = Csvs(tmp)
    errata, why = load_errata(results_dir)
    notes = [why] if why else []
    if nh3_missing() and any(r.tables for r in runs):
        notes.append(NO_SANITIZER)
    for note in notes:
        log(f"report: {note}")

    def summarize_one(study) -> tuple[StudySection, set[str]]:      # on a copy of the CSV names used so far
        mine = Csvs(tmp, set(csvs.used))
        return summarize(study, runs, tmp, loaded, [p for p in problems if p.study == study.name], devices, mine,
                         errata), mine.used

    ordered = sorted(studies.values(), key=lambda s: (getattr(s, "order", math.inf), s.name))
    sections = _summaries(ordered, summarize_one, csvs, log)
    bench = benchmark_sections(results_dir, tmp, benchmarks)
    by_run: dict[str, list[str]] = {}
    for p in problems:
        by_run.setdefault(p.run, []).append(f"{p.study}: {p.reason}")
    links = copy_linked(tmp, runs)
    rows = [(r.name, r.reference, r.device, r.meta.git_label, r.started, r.meta.duration_s,
             r.error or ("finished" if r.meta.finished_at else "unfinished"),
             "; ".join(r.meta.open_failures()) if not r.error else "", ", ".join(r.tables),
             "; ".join(by_run.get(r.name) or []), "; ".join(f"{n}: {why}" for n, why in r.skipped.items()))
            for r in newest_first(runs)]
    runs_csv = csvs.write(pd.DataFrame(rows, columns=RUN_COLUMNS), "runs")
    answers = answers_html(results_dir, csvs, bool(studies))
    page = render_html(runs, sections, not studies, results_dir, bench, by_run, links, runs_csv, notes, answers)
    atomic_write_text(tmp / "index.html", page)
    write_marker(tmp, results_dir, final=True)
    return ReportResult(index=Path(), runs=runs, sections=sections, no_study=not studies,
                        table_problems=[f"{p.study}: {p.line}" for p in problems], benchmarks=bench)


_JOBS: tuple = ()        # what the forked processes of _summaries read: (studies, the function summarizing one)


def _summarize_one(i: int) -> tuple[StudySection, set[str]]:
    return _JOBS[1](_JOBS[0][i])


def _summarize_in_child(i: int, send, watch_args: tuple) -> None:
    """A forked process's whole life: die with the report, summarize study ``i``, hand the result back."""
    import os
    die_with_parent(*watch_args)
    try:
        send.send(_summarize_one(i))
    finally:
        send.close()
        os._exit(0)             # no atexit handler of the parent's runs twice


def _summaries(ordered: list, summarize_one, csvs: Csvs, log) -> list[StudySection]:
    """Each study's section, the studies summarized side by side in forked processes (drawing every run's figures
    is most of a report's time) where there are several cores, else one after the other here. A study's CSV
    names start with its own name, so the processes' names never meet: each one's are merged into ``csvs``."""
    global _JOBS
    import multiprocessing

    workers = min(len(ordered), cpu_count(), SUMMARY_PROCESSES)
    sections: list[StudySection | None] = [None] * len(ordered)
    _JOBS = (ordered, summarize_one)
    try:
        if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            # forked, not spawned: a spawned process imports the caller's script again (a script without a main
            # guard would run twice). One process per study, so a process that dies (a signal, memory) costs only
            # its own study, done in the loop below; each dies with this process (die_with_parent), so a report
            # killed outright leaves none behind.
            with ParentWatch() as watch:
                for i, result in _forked(workers, len(ordered), watch.args()):
                    sections[i], used = result
                    csvs.used.update(used)
                    log(f"report: {ordered[i].name} ({i + 1}/{len(ordered)})")
        for i in (i for i, sec in enumerate(sections) if sec is None):
            log(f"report: {ordered[i].name} ({i + 1}/{len(ordered)})")
            sections[i], used = _summarize_one(i)
            csvs.used.update(used)
    finally:
        _JOBS = ()
    return sections


def _forked(workers: int, n: int, watch_args: tuple):
    """(i, result) of each study summarized in a forked process of its own, at most ``workers`` at a time; a study
    whose process died yields nothing."""
    import multiprocessing
    from multiprocessing.connection import wait

    fork = multiprocessing.get_context("fork")
    pending, running = list(range(n)), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                i = pending.pop(0)
                recv, send = fork.Pipe(duplex=False)
                proc = fork.Process(target=_summarize_in_child, args=(i, send, watch_args), daemon=True)
                proc.start()
                send.close()
                running[recv] = (i, proc)
            for recv in wait(list(running)):
                i, proc = running.pop(recv)
                try:
                    result = recv.recv()
                except (EOFError, OSError):      # the process died before it handed anything back
                    result = None
                recv.close()
                proc.join()
                if result is not None:
                    yield i, result
    finally:
        for recv, (_, proc) in running.items():  # an error here: none of them outlives it
            proc.kill()
            proc.join()
            recv.close()


def build_report(results_dir: Path | str | None = None, out_dir: Path | str | None = None,
                 studies: Mapping[str, Any] | None = None,
                 benchmarks: Mapping[str, Any] | None = None, log=None) -> ReportResult:
    """Write ``<out_dir>/index.html`` (default ``<results_dir>/report``, replaced as a whole: UnsafeOutDir before
    any work where `check_report_dir` refuses it; ReportError, all left as it was, for a later failure)."""
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out_dir = Path(out_dir) if out_dir is not None else results_dir / REPORT_DIRNAME
    check_report_dir(out_dir, results_dir)
    if studies is None:
        from ..studies import discover

        studies = discover()
    runs = find_runs(results_dir)
    out = out_dir.resolve()
    tmp = out.with_name(f".{out.name}.building-{build_token()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        try:
            result = _build_into(tmp, runs, studies, results_dir, benchmarks, log or (lambda line: None))
            swap_in(tmp, out_dir, results_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)     # gone already where the swap worked
    except OSError as e:
        raise ReportError(write_failure(out_dir, e)) from e
    result.index = out_dir / "index.html"
    return result
