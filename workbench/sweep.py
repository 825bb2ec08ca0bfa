"""Sweeps: a `SweepPlan` in, a run folder ``<results>/<UTC time>-<sha>-<name>/`` and a `SweepResult` out;
`resume_sweep` finishes a run folder. The studies run here, in one worker process per GPU, or in N worker processes
side by side on the CPU (workers.py)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from . import limits, provenance      # git_info looked up when called: tests stand in for it
from .results import META_NAME, MetaError, RunFolder, RunMeta, newest_timings, run_in_use, run_of_commit, timings
from .notebook_path import default_kernel
from .stages import finish_study
from .studies import ParamError
from .workers import execute_in_workers, one_gpu_warnings, worker_count

DEVICE_OF_PROFILE = {"cpu": "cpu", "gpu": "cuda", "gpu-full": "cuda"}
UNTIMED_STUDY_S = 60.0     # the estimate of a study no committed run has timed


@dataclass(frozen=True)
class SweepPlan:
    """What a new sweep runs, checked and resolved before any run folder exists."""
    studies: tuple                    # the selected study objects, in the order they run
    params: Mapping[str, dict]        # study name -> its resolved parameters (what meta.json records)
    profile: str                      # "cpu", "gpu" or "gpu-full"
    results: Path                     # the folder the run folder goes into
    name: str                         # the run folder's name suffix
    mode: str = "papermill"           # or "direct": the studies' run functions in this process
    kernel: str | None = None         # Jupyter kernel for papermill (None: notebook_path.default_kernel())
    gpus: tuple[int, ...] | None = None   # one worker process per GPU
    gpus_emulated: bool = False       # the GPUs are pretended (workers.EMULATE_GPUS_ENV)
    workers: int = 1                  # worker processes side by side on the CPU (1: the studies run here)
    shard: tuple[int, int] | None = None  # (index, count): run only that shard of the studies
    group: str | None = None          # with shard: the name the shards of one run share
    max_minutes: float | None = None  # refuse a plan predicted to take longer (with fit: trim its repetitions)
    fit: bool = False

    @property
    def processes(self) -> int:
        """The CPU worker processes it runs: never more than its studies (a shard may hold fewer than planned)."""
        return max(1, min(self.workers, len(self.studies)))


@dataclass(frozen=True)
class SweepResult:
    """What a sweep or a resume did: its run folder (None: none was made), its failures, the line that says so."""
    run_dir: Path | None
    failures: list[str]
    summary: str


def n_studies(n: int) -> str:
    return f"{n} stud{'y' if n == 1 else 'ies'}"


@dataclass
class _Outcome:
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)   # wall time of each study that finished
    placement: dict[str, dict] = field(default_factory=dict)  # with GPUs: which one ran each study


@dataclass(frozen=True)
class Cell:
    """A unit of a sharded sweep: a study, the values of its cell parameter it runs (None: all), its seconds
    (``alone``: as a run of that cell alone took them, else scaled from a run of the study)."""
    study: str
    values: tuple | None
    seconds: float
    alone: bool = False


def study_cells(study, params: Mapping[str, Any], recorded: tuple[float, Mapping[str, Any]] | None,
                alone: Mapping[Any, list[tuple[float, Mapping[str, Any]]]] | None = None) -> list[Cell]:
    """A cell per value of the study's cell parameter (or one), with the ``recorded`` seconds shared by weight;
    a value ``alone`` holds runs of by itself takes the seconds of the newest with these settings otherwise."""
    weights = study.cost(params)
    seconds, then = (recorded[0], study.cost(recorded[1])) if recorded else (UNTIMED_STUDY_S, weights)
    rate = seconds / (sum(then.values()) or 1.0)
    if not weights:
        return [Cell(study.name, None, rate)]
    same = {}
    for v, runs in (alone or {}).items():
        sec = next((sec for sec, p in runs if _same_settings(study, p, params)), None)
        if sec is not None:
            same[v] = sec
    cells = [Cell(study.name, (v,), same.get(v, rate * w), v in same) for v, w in weights.items()]
    return cells if len(cells) > 1 else [replace(cells[0], values=None)]


def _same_settings(study, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != study.cells} == {k: v for k, v in b.items() if k != study.cells}


def shard_cells(cells: list[Cell], count: int) -> list[list[Cell]]:
    """``cells`` dealt longest first to the least-loaded of ``count`` shards, the same in every task; ``count`` is
    checked against the cap ``shards`` before a list of that length exists."""
    return _deal(cells, check_shard((0, count))[1])


def check_shard(shard) -> tuple[int, int]:
    """A plan's ``shard`` as (index, count): whole numbers, 0 <= index < count <= the cap ``shards``; ValueError
    (LimitError above the cap) naming the value and the valid range otherwise."""
    cap = limits.current().shards
    form = f"(index, count): whole numbers with 0 <= index < count, count at most {cap:,} (limit 'shards')"
    if not isinstance(shard, (tuple, list)) or len(shard) != 2:
        raise ValueError(f"shard={shard!r} must be {form}, e.g. (0, 2) for the first of two shards")
    index, count = shard
    if not (limits.is_integer(index) and limits.is_integer(count)) or not 0 <= index < count:
        raise ValueError(f"shard={tuple(shard)!r} must be {form}")
    limits.check("shards", int(count), f"shard={tuple(shard)!r}: a count of shards (valid: 1..{cap:,})")
    return int(index), int(count)


def _deal(cells: list[Cell], count: int) -> list[list[Cell]]:
    loads, parts = [0.0] * count, [[] for _ in range(count)]
    for c in sorted(cells, key=lambda c: (-c.seconds, c.study, repr(c.values))):
        k = min(range(count), key=lambda i: (loads[i], i))
        parts[k].append(c)
        loads[k] += c.seconds
    return parts


def recorded_seconds(folders: list[Path], profile: str, exclude: Path | None = None) -> dict[str, tuple[float, dict]]:
    """{study: (seconds, params)} from the newest run of ``profile`` that timed it."""
    return newest_timings(timings(folders, profile, exclude))


def timed_alone(timings: list[tuple[str, float, dict]], studies: list) -> dict[str, dict[Any, list[tuple[float, dict]]]]:
    """{study: {value of its cell parameter: [(seconds, params), ...]}}, newest first, from the ``timings``
    (`workbench.results.timings`) of the study on that one value (one preset, say): measured cells, where FLOPs only scale another."""
    cells = {s.name: s.cells for s in studies if s.cells}
    known: dict[str, dict[Any, list[tuple[float, dict]]]] = {}
    for name, sec, params in timings:
        values = params.get(cells.get(name)) if name in cells else None
        if isinstance(values, list) and len(values) == 1 and isinstance(values[0], (str, int, float)):
            known.setdefault(name, {}).setdefault(values[0], []).append((sec, params))
    return known


def shard_plan(studies: list, params: Mapping[str, dict], index: int, count: int,
               recorded: Mapping[str, tuple[float, dict]], alone: Mapping[str, dict] | None = None
               ) -> tuple[list, dict[str, dict], dict[str, list | None]]:
    """Shard ``index``: (its studies, their params for its cells, {study: its cell values, None for all})."""
    cells = [c for s in studies for c in study_cells(s, params[s.name], recorded.get(s.name), (alone or {}).get(s.name))]
    chosen: dict[str, list | None] = {}
    for c in shard_cells(cells, count)[index]:
        chosen[c.study] = None if c.values is None else [*chosen.get(c.study, []), *c.values]
    picked = [s for s in studies if s.name in chosen]
    out = {s.name: dict(params[s.name]) for s in picked}
    for s in picked:
        if chosen[s.name] is not None:        # in the order the plan gave them
            out[s.name][s.cells] = chosen[s.name] = [v for v in params[s.name][s.cells] if v in chosen[s.name]]
    return picked, out, chosen


REPS_PARAMS = ("reps", "warmup", "min_reps")     # what --fit trims, each down to its declared minimum


def predict(studies: list, params: Mapping[str, dict], results: Path,
            profile: str) -> dict[str, tuple[float, list[Cell], str]]:
    """{study: (predicted seconds, its cells, how)}: the newest timed run of the profile here or under reference/,
    scaled to these cells by tower FLOPs (`study_cells`); untimed: the study's guess or UNTIMED_STUDY_S. ``how``
    is "" for a run of these settings, else what the number rests on (a guess; a run of other settings)."""
    found = list(timings([Path(results), Path(results) / "reference"], _timed_like(profile)))   # each meta.json once
    recorded, alone = newest_timings(found), timed_alone(found, studies)
    out = {}
    for s in studies:
        cells = study_cells(s, params[s.name], recorded.get(s.name) or guessed_seconds(s, profile), alone.get(s.name))
        how = _other_settings(s, recorded[s.name][1], params[s.name]) if s.name in recorded else "untimed: a guess"
        out[s.name] = (sum(c.seconds for c in cells), cells, "" if all(c.alone for c in cells) else how)
    return out


def _cell_lines(est: Mapping[str, tuple[float, list[Cell], str]]) -> list[str]:
    """A line per study of several cells: each cell's predicted seconds, the longest first."""
    return [f"  {name}: " + ", ".join(f"{c.values[0]} {c.seconds:.0f} s" for c in sorted(cells, key=lambda c: -c.seconds))
            for name, (_, cells, _) in est.items() if len(cells) > 1]


def _other_settings(study, then: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """Where the timed run's settings differ from the plan's (the cell parameter aside, which the FLOPs scale):
    "from a run with other settings: reps 3 (here 10), ..." for the first three, or ""."""
    def show(v) -> str:
        text = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        return text if len(text) <= 24 else text[:21] + "..."
    diff = [k for k in now if k != study.cells and k in then and then[k] != now[k]]
    if not diff:
        return ""
    more = f", {len(diff) - 3} more" if len(diff) > 3 else ""
    return ("from a run with other settings: " + ", ".join(f"{k} {show(then[k])} (here {show(now[k])})"
                                                        for k in diff[:3]) + more)


def _timed_like(profile: str) -> tuple[str, ...]:
    """The profiles whose runs time a plan of ``profile``: gpu-full's cells are the gpu profile's and more, so a
    gpu run scales to them where no gpu-full run is recorded."""
    return (profile, "gpu") if profile == "gpu-full" else (profile,)


def guessed_seconds(study, profile: str) -> tuple[float, dict] | None:
    """(seconds, params) of the study's own guess for its defaults on ``profile`` (`Study.guess_s`; gpu-full
    without its own takes gpu's, with gpu's params, so the prediction says it rests on other settings), or None."""
    guesses = study.guess_s or {}
    if profile == "gpu-full" and profile not in guesses and "gpu" in guesses:
        return float(guesses["gpu"]), study.resolve("gpu")
    guess = guesses.get(profile)
    return None if guess is None else (float(guess), study.resolve(profile))


def _scale_reps(study, p: dict, factor: float) -> tuple[dict, float]:
    """``p`` with its repetitions scaled by ``factor`` (each at least its minimum); the factor reached."""
    reps = {k: p[k] for k in REPS_PARAMS if isinstance(p.get(k), int) and k in study.params.accepted}
    if not reps.get("reps"):
        return p, 1.0
    floor = {d.name: d.minimum or 0 for d in study.params if d.name in reps}
    new = {k: max(floor[k], int(v * factor)) for k, v in reps.items()}
    if "min_reps" in new:
        new["min_reps"] = min(new["min_reps"], new["reps"])
    return {**p, **new}, new["reps"] / reps["reps"]


def wall_seconds(seconds: Mapping[str, float], workers: int = 1) -> float:
    """The wall time of studies taking ``seconds`` in ``workers`` processes, each taking the longest one left."""
    return max(sum(c.seconds for c in part) for part in _deal([Cell(n, None, t) for n, t in seconds.items()],
                                                               max(1, min(workers, len(seconds)))))


def plan_time(plan: SweepPlan) -> dict:
    """Print the predicted wall time; with max_minutes, refuse a plan over it (SystemExit, before any run folder
    exists) or, with fit, return the params with their repetitions trimmed so that it fits (time taken as
    proportional to the repetitions)."""
    studies, params, workers = list(plan.studies), dict(plan.params), plan.processes
    est = predict(studies, params, plan.results, plan.profile)
    total = wall_seconds({n: t for n, (t, _, _) in est.items()}, workers)
    alone = lambda k: sum(c.alone for c in k)       # noqa: E731
    print("sweep: predicted " + ", ".join(f"{n} {t:.0f} s ({len(k)} cell{'s' * (len(k) > 1)}"
                                          + (f", {alone(k)} timed alone" if alone(k) else "")
                                          + (f", {how}" if how else "") + ")" for n, (t, k, how) in est.items())
          + f"; about {total / 60:.1f} min" + (f" on {len(plan.gpus)} GPUs" if plan.gpus else "")
          + (f" in {workers} workers" if workers > 1 else ""), *_cell_lines(est), sep="\n")
    if plan.max_minutes is None or total <= plan.max_minutes * 60:
        return params
    if not plan.fit:
        raise SystemExit(f"sweep: predicted {total / 60:.1f} min, over --max-minutes {plan.max_minutes:g}; narrow it "
                         f"(--studies, --set presets=...), or add --fit to trim the repetitions")
    factor = plan.max_minutes * 60 / total
    out, scaled = dict(params), {}
    for s in studies:
        out[s.name], reached = _scale_reps(s, params[s.name], factor)
        scaled[s.name] = est[s.name][0] * reached
    fitted = wall_seconds(scaled, workers)
    if fitted > plan.max_minutes * 60:
        raise SystemExit(f"sweep: even at the fewest repetitions the plan takes about {fitted / 60:.1f} min, over "
                         f"--max-minutes {plan.max_minutes:g}; narrow it (--studies, --set presets=...)")
    trimmed = {n: {k: out[n][k] for k in REPS_PARAMS if k in out[n] and out[n][k] != params[n].get(k)} for n in out}
    print(f"sweep: --fit: repetitions trimmed to {({n: t for n, t in trimmed.items() if t})}; "
          f"about {fitted / 60:.1f} min predicted")
    return out


def run_sweep(plan: SweepPlan) -> SweepResult:
    """Run the plan's studies (its shard of them) into a new run folder."""
    extra: dict[str, Any] = {}
    if plan.shard is not None:
        index, count = check_shard(plan.shard)
        # balanced by committed runs only: every host of a job array sees the same ones
        found = list(timings([Path(plan.results) / "reference"], _timed_like(plan.profile)))
        mine, params, cells = shard_plan(list(plan.studies), plan.params, index, count, newest_timings(found),
                                         timed_alone(found, list(plan.studies)))
        if not mine:
            return SweepResult(None, [], f"sweep: shard {index}/{count} has no cell ({n_studies(len(plan.studies))} "
                                         f"selected over {count} shards); nothing to run")
        extra["shard"] = {"index": index, "count": count, "group": plan.group, "cells": cells}
        plan = replace(plan, studies=tuple(mine), params=params, name=f"{plan.name}-shard{index}of{count}")
    if plan.gpus:
        extra.update(gpus=list(plan.gpus), **({"gpus_emulated": True} if plan.gpus_emulated else {}))
    studies, workers = list(plan.studies), plan.processes
    if workers > 1:
        extra["workers"] = workers
    params = plan_time(plan)
    device = DEVICE_OF_PROFILE[plan.profile]
    run = RunFolder.create(plan.results, name=plan.name)
    lock = run.lock()
    lock.acquire()                 # a folder this process just made: nobody else can hold it
    meta, outcome = RunMeta(), _Outcome()
    try:
        meta = RunMeta.collect({"profile": plan.profile, "device": device, "mode": plan.mode,
                                "studies": params, **extra})
        meta.write(run.path)
        print(f"sweep: profile {plan.profile}, {n_studies(len(studies))} "
              + (f"(shard {plan.shard[0]}/{plan.shard[1]}) " if plan.shard else "")
              + (f"on GPUs {list(plan.gpus)} " if plan.gpus else "")
              + (f"in {workers} worker processes " if workers > 1 else "") + f"-> {run.path}")
        outcome = _execute(studies, params, device, run.path, plan.mode == "direct", plan.kernel or default_kernel(),
                           plan.profile, plan.gpus, workers)
        _record(run.path, meta, outcome)
    finally:
        # a complete run keeps no lock file; one with failures keeps it for --resume to take
        lock.release(remove=not outcome.failures and bool(meta.finished_at))
    return SweepResult(run.path, outcome.failures,
                       f"sweep: done in {meta.duration_s:.1f} s, {len(outcome.failures)} failure(s): {run.path}")


def _resume_meta(run: RunFolder) -> RunMeta:
    """The run's meta.json where it records a sweep to finish; SystemExit naming the folder and what is missing
    otherwise (a bare record, such as ``{}``, planned nothing: stamping it finished would make a run of nothing)."""
    try:
        meta = run.meta()
    except MetaError as e:
        raise SystemExit(f"--resume: {e}") from None
    if not meta.plan:
        raise SystemExit(f"--resume: {run.path}: its {META_NAME} plans no study (params.studies is missing or "
                         f"empty), so it is no sweep's run folder; nothing to resume, and the folder is left as it is")
    return meta


def resume_sweep(run: str | Path, results: Path, studies: dict, *, kernel: str | None = None,
                 gpus: tuple[int, ...] | list[int] | None = None, resume_finished: bool = False,
                 workers: int | str | None = None, default_workers: int | str = 1) -> SweepResult:
    """Finish the run folder ``run`` (a path, or a name under ``results``) with its recorded parameters; ``workers``
    (None: ``default_workers``) as `workers.worker_count` takes them."""
    folder = RunFolder.find(results, str(run))
    run_dir = folder.path
    # judged before taking the lock: refusing leaves no trace (not even a .lock) in the folder
    meta = _resume_meta(folder)
    state = folder.state(meta)
    if state.finished and not meta.open_failures():
        if not state.left:
            return SweepResult(run_dir, [], f"sweep: {run_dir} is finished and holds every stage of every planned "
                                            f"study; nothing to resume")
        if not resume_finished:
            raise SystemExit(f"--resume: {run_dir.name} finished at {meta.finished_at} without failures; a "
                             f"finished run is a record and is not resumed by default. Left: {state.describe_left()}. "
                             f"Pass --resume-finished to finish that (what the run recorded stays as it is; the "
                             f"resume is added to its meta.json under 'resumed').")
    lock = folder.lock()
    had_lock = lock.path.exists()
    try:
        got = lock.acquire()
    except OSError as e:
        raise SystemExit(f"--resume: cannot take the lock of {run_dir} ({e.strerror or e}); is the folder "
                         f"read-only?") from None
    if not got:
        raise SystemExit(f"--resume: {run_dir} is in use by another process ({lock.holder()}); wait for it")
    outcome, left = _Outcome(), {}
    try:
        meta = _resume_meta(folder)      # again, under the lock
        state = folder.state(meta)
        params = meta.params or {}
        plan, device, profile = meta.plan, params.get("device") or "cpu", params.get("profile", "cpu")
        if unknown := sorted(set(plan) - set(studies)):
            raise SystemExit(f"--resume: {run_dir.name} planned studies {unknown} that are not registered now")
        left = state.left
        try:   # the recorded values must still be valid for today's declarations
            plan = {n: studies[n].resolve(profile, plan[n]) for n in left}
        except ParamError as e:
            raise SystemExit(f"--resume: {e}") from None
        now, then = provenance.git_info(), meta.git or {}
        entry: dict[str, Any] = {"at": provenance.iso_utc(timespec="seconds"), "studies": list(left),
                                 "stages": left, "git": now.get("short"), "dirty": now.get("dirty")}
        if now.get("sha") != then.get("sha"):
            entry["note"] = f"resumed with other code than the run started with ({then.get('short')})"
            print(f"sweep: warning: {entry['note']}", file=sys.stderr)
        print(f"sweep: resuming {run_dir}: {state.describe_left()}")
        outcome = _execute([studies[n] for n in left], plan, device, run_dir, state.direct,
                           kernel or default_kernel(), profile, gpus,
                           worker_count(workers, profile, len(left), gpus, default_workers))
        if state.finished:      # what the run recorded stays; the resume is one more entry
            entry.update(failures=outcome.failures, warnings=outcome.warnings, study_seconds=outcome.seconds,
                         placement=outcome.placement, finished_at=provenance.iso_utc())
            meta.resumed = [*(meta.resumed or []), entry]
            meta.write(run_dir, overwrite=True)
        else:
            _record(run_dir, meta, outcome, entry if left else None)
    finally:
        lock.release(remove=not outcome.failures or not had_lock)
    return SweepResult(run_dir, outcome.failures,
                       f"sweep: resumed {n_studies(len(left))}, {len(outcome.failures)} failure(s): {run_dir}")


def _execute(selected: list, plan: dict, device: str, run_dir: Path, direct: bool, kernel: str, profile: str,
             gpus: tuple[int, ...] | list[int] | None = None, workers: int = 1) -> _Outcome:
    """Run ``selected`` into ``run_dir`` one after the other, or with ``gpus`` one worker process per GPU, or with
    ``workers`` > 1 that many worker processes on the CPU (the longest study offered first)."""
    from tqdm.auto import tqdm
    if gpus or workers > 1:
        wider = one_gpu_warnings(selected, plan, device) if gpus else []
        for w in wider:
            print(f"sweep: {w}", file=sys.stderr)
        failures, placed, finished = execute_in_workers(longest_first(selected, run_dir, profile), run_dir, direct,
                                                        kernel, gpus, workers)
        return _Outcome(failures, wider, finished, placed)
    out = _Outcome()
    # a bar on a terminal; in a log, one plain line per study (no carriage returns)
    bar = tqdm(selected, desc="studies", unit="study", disable=len(selected) < 2 or not sys.stderr.isatty())
    for k, study in enumerate(bar, 1):
        bar.set_description(f"study {k}/{len(selected)}: {study.name}")
        if bar.disable:
            print(f"sweep: study {k}/{len(selected)}: {study.name}", flush=True)
        t0 = time.perf_counter()
        failed = finish_study(study, plan[study.name], device, run_dir, direct, kernel)
        out.failures += failed
        if not failed:
            out.seconds[study.name] = round(time.perf_counter() - t0, 1)
    return out


def _record(run_dir: Path, meta: RunMeta, outcome: _Outcome, entry: dict | None = None) -> None:
    """Add ``outcome`` (and the resume ``entry``) to the run's unfinished ``meta`` and write it finished."""
    meta.study_seconds = {**(meta.study_seconds or {}), **outcome.seconds}
    if outcome.placement:
        meta.placement = {**(meta.placement or {}), **outcome.placement}
    if entry is not None:
        meta.resumed = [*(meta.resumed or []), entry]
    meta.failures = outcome.failures
    meta.warnings = (meta.warnings or []) + outcome.warnings
    meta.finish().write(run_dir)


def longest_first(selected: list, run_dir: Path, profile: str) -> list:
    """``selected`` longest first by the runs beside ``run_dir`` and under reference/, else by the study's own guess
    (`Study.guess_s`); the studies with neither first."""
    root = run_dir.parent
    known = {name: sec for name, (sec, _) in recorded_seconds([root, root / "reference"], profile, run_dir).items()}
    known |= {s.name: guess[0] for s in selected if s.name not in known and (guess := guessed_seconds(s, profile))}
    return sorted(selected, key=lambda s: (s.name in known, -known.get(s.name, 0.0)))


def _run_of_this_code(results: Path, name: str, wanted) -> Path | None:
    """The newest run ``*-<sha>-<name>`` of this commit, from a clean tree, for which ``wanted(run, meta)``."""
    g = provenance.git_info()
    if not g.get("sha") or g.get("dirty"):
        return None
    return run_of_commit(results, name, g["sha"], wanted)


def interrupted_run(results: Path, name: str) -> Path | None:
    """The newest run of this code that never finished and no process works in (``make report`` resumes it)."""
    return _run_of_this_code(results, name, lambda run, meta: not meta.finished_at and not run_in_use(run))


def reusable_run(results: Path, name: str, profile: str, studies: dict) -> Path | None:
    """The newest complete run of this code, without open failures, of the default sweep of ``profile``."""
    want = {n: s.resolve(profile) for n, s in studies.items()}
    return _run_of_this_code(results, name, lambda run, meta: (
        meta.finished_at and not meta.open_failures() and (meta.params or {}).get("profile") == profile
        and meta.plan == want and not (meta.params or {}).get("shard") and not RunFolder(run).state(meta).left))
