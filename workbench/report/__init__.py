"""Build ``results/report/index.html`` from the run folders under ``results/`` and ``results/reference/``:
`runs` collects them, `views` summarizes them, `html` renders the page, `output` writes the report's folder, and
`cache` keeps what was drawn (each view's figures, each study's comparisons, the answers) in
``results/.cache/report/``, reused while what it was drawn from is unchanged, so that a build draws only what
changed; what is left is drawn side by side in forked processes, the largest first."""
from __future__ import annotations

import math
import os
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..files import atomic_write_text
from ..limits import cpu_count
from ..procs import ParentWatch, die_with_parent
from ..progress import time_left
from ..provenance import results_folder
# the names below that this module does not use are the package's public ones (and view_body, for tests)
from .answers import answers_html
from .html import NO_STUDY_MESSAGE, REPORT_TITLE, newest_first, view_body, render_html
from ..notebook_path import NO_SANITIZER, localize_html, nh3_missing
from .output import (REPORT_MARKER, RUNS_DIRNAME, UnsafeOutDir, build_token, check_report_dir, copy_linked, swap_in,
                     write_failure, write_marker)
from ..results import ERRATA_NAME, REPORT_DIRNAME, ReportError, Run, find_runs, load_errata, load_tables, study_table
from .cache import DrawCache, frame_digest, results_digest
from .views import (BenchmarkSection, Csvs, Drawn, SectionPlan, StudySection, View, benchmark_sections, draw_view,
                    finish_section, key_findings, plan_section, section_extras, summarize)

SUMMARY_PROCESSES = 8    # at most: drawings made side by side
READ_NOTICE = 40         # tables: from this many on, the report says it is reading them
TICK_S = 15              # seconds: while drawing, a progress line at least this often
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


@dataclass
class _Job:
    """One piece of the report drawn in a process of its own where there are several cores: a view's drawing, a
    study's comparisons, the answers. ``store`` keeps its value in the cache (in that process)."""
    label: str
    cost: int                        # a rough weight for the order (largest first) and the time left
    run: Callable[[], Any]
    store: Callable[[Any], str | None] | None = None
    key: str | None = None           # its cache entry, where it has one
    study: str | None = None         # the section it belongs to (None: the answers)
    slot: int = -1                   # that section's index
    view: int | None = None          # the view it draws (None: the section's comparisons)


def _view_cost(rows) -> int:
    """Roughly what drawing a view takes: a figure set per run (and preset)."""
    groups = [c for c in ("run", "preset") if c in rows.columns]
    return 1 + 4 * (len(rows[groups].drop_duplicates()) if groups else 1)


def _section_jobs(plan: SectionPlan, cache: DrawCache, drawn: list, extras: list, slot: int) -> list[_Job]:
    """The jobs of a section, its cached parts filled into ``drawn`` / ``extras[slot]`` at once. A study is cached
    only where its summary is a module of this package (in the cache's code digest)."""
    from ..studies import part_module

    study = plan.study
    fn = getattr(study, "summarize", None)
    module = part_module(fn)
    module = module if module and module.startswith(f"{__package__.split('.')[0]}.") else None
    cached = cache.enabled and module is not None
    jobs = []
    for i, (view, rows, fig_dir) in enumerate(plan.views):
        key = cache.key("view", study.name, module, frame_digest(rows.reset_index(drop=True))) if cached else None
        if key is not None:
            hit, value = cache.get(key, fig_dir)
            if hit and isinstance(value, Drawn):
                drawn[i] = value
                continue
            if hit:                 # not a drawing: its files go, the view is drawn afresh
                shutil.rmtree(fig_dir, ignore_errors=True)

        def run(study=study, rows=rows, fig_dir=fig_dir):
            return draw_view(study, rows, fig_dir)

        def store(d, key=key, fig_dir=fig_dir):
            return cache.put(key, d, fig_dir, d.files) if d.cacheable else None

        jobs.append(_Job(f"{study.name}: {view.device}, {view.kind}", _view_cost(rows), run,
                         store if key is not None else None, key, study.name, slot, i))
    if plan.table is None:
        extras[slot] = ({}, [])
        return jobs
    key = (cache.key("extras", study.name, frame_digest(plan.table), sorted(plan.starts.items()))
           if cached else None)
    if key is not None:
        hit, value = cache.get(key)
        if hit:
            extras[slot] = value
            return jobs

    def compare(plan=plan):
        try:
            return section_extras(plan)
        except Exception:  # noqa: BLE001 - shown in its section
            return traceback.format_exc()

    jobs.append(_Job(f"{study.name}: comparisons", 1 + plan.table["run"].nunique(), compare,
                     (lambda v, key=key: None if isinstance(v, str) else cache.put(key, v)) if key else None,
                     key, study.name, slot))
    return jobs


def _answers_job(results_dir: Path, staging: Path, studies: bool, cache: DrawCache, out: dict) -> list[_Job]:
    """The answers (advice, audit) drawn into ``staging`` with CSV names of their own, or taken from the cache: its
    key covers every file of the results folder they may read."""
    key = cache.key("answers", results_digest(results_dir), studies) if cache.enabled else None
    if key is not None:
        hit, value = cache.get(key, staging)
        if hit:
            out["answers"] = value
            return []

    def run():
        csvs = Csvs(staging)
        return answers_html(results_dir, csvs, studies), sorted(csvs.used)

    return [_Job("answers", 40, run, (lambda v: cache.put(key, v, staging, v[1])) if key else None, key)]


def _merge_answers(value, staging: Path, tmp: Path, csvs: Csvs, results_dir: Path, studies: bool) -> str:
    """The answers' HTML, their CSVs moved beside the page; drawn again here where a name is taken (the names the
    page would have given them after every section's)."""
    if value is not None and not (set(value[1]) & csvs.used) and all((staging / n).is_file() for n in value[1]):
        page, names = value
        for name in names:
            os.replace(staging / name, tmp / name)
        csvs.used.update(names)
        shutil.rmtree(staging, ignore_errors=True)
        return page
    shutil.rmtree(staging, ignore_errors=True)
    return answers_html(results_dir, csvs, studies)


def _build_into(tmp: Path, runs: list[Run], studies: Mapping[str, Any], results_dir: Path,
                benchmarks: Mapping[str, Any] | None, log, cache: DrawCache) -> ReportResult:
    """The whole report, written into the empty folder ``tmp``: its marker first, and last listing every file."""
    import pandas as pd

    write_marker(tmp, results_dir, final=False)
    n_tables = sum(len(r.tables) for r in runs)
    if n_tables >= READ_NOTICE:
        log(f"report: reading {n_tables} tables of {len(runs)} run folders")
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

    ordered = sorted(studies.values(), key=lambda s: (getattr(s, "order", math.inf), s.name))
    plans = [plan_section(study, runs, tmp, loaded, [p for p in problems if p.study == study.name], devices, errata)
             for study in ordered]
    drawn = [[None] * len(plan.views) for plan in plans]
    extras: list = [None] * len(plans)
    jobs: list[_Job] = []
    for slot, plan in enumerate(plans):
        jobs += _section_jobs(plan, cache, drawn[slot], extras, slot)
    staging, answered = tmp / ".answers", {}
    staging.mkdir()
    # the answers are kept only beside a study's drawings (a build of other studies leaves the results folder as is)
    jobs += _answers_job(results_dir, staging, bool(studies), cache if cache.used or any(j.key for j in jobs)
                         else DrawCache(None), answered)
    if cache.problem:
        log(f"report: {cache.problem}")
    if cache.used:
        log(f"report: {len(cache.used)} drawings from the cache {cache.root}, {len(jobs)} to draw")
    problems_cache: list[str] = []
    for job, value in _run_jobs(jobs, [p.study.name for p in plans], log, problems_cache):
        if job.key is not None:
            cache.used.add(job.key)        # stored by its process: not pruned by this build
        if job.study is None:
            answered["answers"] = value
        elif job.view is not None:
            drawn[job.slot][job.view] = value
        else:
            extras[job.slot] = value
    sections = [finish_section(plan, drawn[i], extras[i], tmp, csvs) for i, plan in enumerate(plans)]
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
    answers = _merge_answers(answered.get("answers"), staging, tmp, csvs, results_dir, bool(studies))
    page = render_html(runs, sections, not studies, results_dir, bench, by_run, links, runs_csv, notes, answers)
    atomic_write_text(tmp / "index.html", page)
    write_marker(tmp, results_dir, final=True)
    if not problems_cache:
        cache.prune()
    return ReportResult(index=Path(), runs=runs, sections=sections, no_study=not studies,
                        table_problems=[f"{p.study}: {p.line}" for p in problems], benchmarks=bench)


_JOBS: tuple = ()        # what the forked processes read: the jobs


def _run_job(i: int) -> tuple[Any, str | None]:
    """Job ``i``'s value, kept in the cache where it has a store (the problem where that failed)."""
    job = _JOBS[i]
    value = job.run()
    return value, job.store(value) if job.store is not None else None


def _summarize_in_child(i: int, send, watch_args: tuple) -> None:
    """A forked process's whole life: die with the report, run job ``i``, hand the result back."""
    die_with_parent(*watch_args)
    try:
        send.send(_run_job(i))
    finally:
        send.close()
        os._exit(0)             # no atexit handler of the parent's runs twice


def _run_jobs(jobs: list[_Job], studies: list[str], log, notes: list[str]):
    """(job, value) of every job, largest first, side by side in forked processes (drawing every run's figures is
    most of a report's time) where there are several cores and studies, else one after the other here; a job whose
    process died is run here after the others. A line per study once all its jobs are done, with the time left."""
    global _JOBS
    import multiprocessing

    def note(problem: str | None) -> None:      # a cache that cannot be written: said once
        if problem and not notes:
            log(f"report: {problem}; the page is whole, and drawn again next time")
        notes.extend([problem] if problem else [])

    left = {name: sum(j.study == name for j in jobs) for name in studies}
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i].cost)
    total, done, t0 = sum(j.cost for j in jobs), 0, time.monotonic()
    finished, said = 0, [t0]

    def say(line: str) -> None:
        log(line)
        said[0] = time.monotonic()

    def report_done(name: str | None):
        nonlocal finished
        if name is None:
            return
        left[name] -= 1
        if left[name] == 0:
            finished += 1
            say(f"report: {name} ({finished}/{len(studies)}){left_now()}")

    def left_now() -> str:          # the jobs running count half done: the largest run first, and long
        now = time.monotonic()
        if now - t0 < TICK_S / 3:   # a short build says nothing of the time
            return ""
        running = sum(jobs[i].cost for i in started if i not in results) // 2
        left = time_left(done + running, total, t0, 0, now)
        return "" if left == ", about 0 s left" else left

    def tick() -> None:             # a long drawing: a line at least every TICK_S seconds
        now = time.monotonic()
        if now - said[0] >= TICK_S:
            running = "; ".join(jobs[i].label for i in order if i in started and i not in results)
            say(f"report: drawing, {len(results)} of {len(jobs)} done after {now - t0:.0f} s"
                f"{' (now ' + running + ')' if running else ''}{left_now()}")

    for name in [n for n in studies if left[n] == 0]:       # all from the cache, or nothing to draw
        left[name] = 1
        report_done(name)
    # side by side where two studies or more are drawn (one study is drawn here, as it always was)
    workers = min(len(jobs), cpu_count(), SUMMARY_PROCESSES) if len({j.study for j in jobs} - {None}) > 1 else 1
    results: dict[int, Any] = {}
    started: set[int] = set()
    _JOBS = tuple(jobs)
    try:
        if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            # forked, not spawned: a spawned process imports the caller's script again (a script without a main
            # guard would run twice). One process per job, so a process that dies (a signal, memory) costs only
            # its own job, done in the loop below; each dies with this process (die_with_parent), so a report
            # killed outright leaves none behind.
            with ParentWatch() as watch:
                for i, (value, problem) in _forked(workers, order, watch.args(), tick, started.add):
                    results[i] = value
                    done += jobs[i].cost
                    note(problem)
                    report_done(jobs[i].study)
                    tick()
        for i in (i for i in order if i not in results):
            started.add(i)
            results[i], problem = _run_job(i)
            done += jobs[i].cost
            note(problem)
            report_done(jobs[i].study)
            tick()
    finally:
        _JOBS = ()
    return [(jobs[i], results[i]) for i in range(len(jobs))]


def _forked(workers: int, order: list[int], watch_args: tuple, tick=lambda: None, start=lambda i: None):
    """(i, result) of each job in ``order`` run in a forked process of its own, at most ``workers`` at a time; a job
    whose process died yields nothing. ``start(i)`` as job i starts; ``tick()`` every few seconds while they run."""
    import multiprocessing
    from multiprocessing.connection import wait

    fork = multiprocessing.get_context("fork")
    pending, running = list(order), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                i = pending.pop(0)
                recv, send = fork.Pipe(duplex=False)
                proc = fork.Process(target=_summarize_in_child, args=(i, send, watch_args), daemon=True)
                proc.start()
                start(i)
                send.close()
                running[recv] = (i, proc)
            ready = wait(list(running), timeout=2.0)
            if not ready:
                tick()
            for recv in ready:
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
                 benchmarks: Mapping[str, Any] | None = None, log=None, cache: bool = True) -> ReportResult:
    """Write ``<out_dir>/index.html`` (default ``<results_dir>/report``, replaced as a whole: UnsafeOutDir before
    any work where `check_report_dir` refuses it; ReportError, all left as it was, for a later failure). ``cache``:
    reuse and keep the drawings in ``<results_dir>/.cache/report/`` (workbench.report.cache); False draws all."""
    results_dir = results_folder(results_dir, "results_dir")
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
            result = _build_into(tmp, runs, studies, results_dir, benchmarks, log or (lambda line: None),
                                 DrawCache.for_results(results_dir, cache))
            swap_in(tmp, out_dir, results_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)     # gone already where the swap worked
    except OSError as e:
        raise ReportError(write_failure(out_dir, e)) from e
    result.index = out_dir / "index.html"
    return result
