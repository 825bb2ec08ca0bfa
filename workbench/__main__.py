"""Command line: ``python -m workbench {report,sweep,info}`` (also installed as ``workbench``).

- ``sweep``  runs the registered studies' notebooks through papermill into a new run folder
  ``results/<UTC time>-<sha>-<name>/`` (meta.json, <study>.parquet, executed <study>.ipynb), with
  each study's default parameters for the hardware profile (``cpu``: minutes on 2 cores; ``gpu``
  on a CUDA host).
- ``report`` is the main job: the default sweep, then ``results/report/index.html`` built from
  every run folder (local and committed reference runs). ``--no-sweep`` only rebuilds the page.
- ``info``   prints the provenance record a run would store (git, packages, device, clocks).
- ``notebooks`` regenerates each study notebook's ``parameters`` cell from the study's parameter
  declaration (``--check`` only reports notebooks that are out of step).

Every ``--set`` is checked against the studies' declarations before a run folder exists; the
resolved values are what meta.json records and what the notebooks receive.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from . import cpu_share
from .provenance import (REPO_ROOT, MetaError, RunLock, collect_meta, finish_meta, load_meta, new_run_dir,
                         results_root, write_meta)
from .report import NO_STUDY_MESSAGE, build_report

# Everything heavy (torch, pandas, the studies) is imported inside the commands, so that --help and
# argument errors answer at once.

DEVICE_OF_PROFILE = {"cpu": "cpu", "gpu": "cuda"}


def _parse_value(text: str) -> Any:
    """``--set`` values: JSON where it parses (numbers, lists, true/false, null), else a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse_sets(items: Sequence[str]) -> dict[str | None, dict[str, Any]]:
    """``KEY=VALUE`` applies to every study, ``STUDY.KEY=VALUE`` to one; keyed by study (None = all)."""
    out: dict[str | None, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE or STUDY.KEY=VALUE, got {item!r}")
        study, dot, name = key.rpartition(".")
        out.setdefault(study if dot else None, {})[name] = _parse_value(value)
    return out


def _select(studies: dict, names: str | None) -> list:
    if not names:
        return [studies[k] for k in sorted(studies)]
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in studies]
    if unknown:
        raise SystemExit(f"unknown studies {unknown}; registered: {sorted(studies) or 'none'}")
    return [studies[n] for n in wanted]


def parse_gpus(text: str | None) -> list[int] | None:
    """``--gpus 0,1`` -> [0, 1]; SystemExit naming the bad value otherwise."""
    if text is None:
        return None
    try:
        ids = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise SystemExit(f"--gpus {text!r}: give distinct GPU indices separated by commas, e.g. --gpus 0,1")
    return ids


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``--shard 1/4`` -> (1, 4); SystemExit naming the bad value otherwise."""
    if text is None:
        return None
    i, sep, n = str(text).partition("/")
    try:
        i, n = int(i), int(n)
    except ValueError:
        sep = ""
    if not sep or n < 1 or not 0 <= i < n:
        raise SystemExit(f"--shard {text!r}: give I/N with 0 <= I < N (shard I of N), e.g. --shard 0/2")
    return i, n


NAME_MAX = 80      # characters of a run name: the folder adds a 25-character time and commit prefix


def parse_name(text: str | None) -> str | None:
    """``--name``: letters, digits, '.', '_' and '-' (others become '-'), at most NAME_MAX
    characters; SystemExit naming the bad value otherwise."""
    import re

    if text is None:
        return None
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")
    if not slug:
        raise SystemExit(f"--name {text!r} has no letter or digit; give a short name such as --name smoke")
    if len(slug) > NAME_MAX:
        raise SystemExit(f"--name is {len(slug)} characters long; give at most {NAME_MAX}")
    return slug


def shard_studies(selected: list, index: int, count: int) -> list:
    """Shard ``index`` of ``count``: study k of the selection in name order goes to shard k % count,
    so every shard of a job array computes the same partition without talking to the others."""
    ordered = sorted(selected, key=lambda s: s.name)
    return [s for k, s in enumerate(ordered) if k % count == index]


# `sweep --gpus` on a host without them, for tests of the worker plumbing: N pretend GPUs (each
# worker still runs on the CPU; meta.json records gpus_emulated)
EMULATE_GPUS_ENV = "WORKBENCH_EMULATE_GPUS"


def _check_gpus(gpus: list[int] | None, profile: str) -> None:
    if not gpus:
        return
    emulated = os.environ.get(EMULATE_GPUS_ENV)
    if emulated:
        if not emulated.isdigit():
            raise SystemExit(f"{EMULATE_GPUS_ENV}={emulated!r}: give a number of GPUs to pretend, e.g. 2")
        n = int(emulated)
    else:
        if profile != "gpu":
            raise SystemExit(f"--gpus {','.join(map(str, gpus))}: the {profile} profile runs on the CPU; --gpus "
                             f"needs the gpu profile on a CUDA host (--profile gpu)")
        import torch

        n = torch.cuda.device_count()
    bad = [g for g in gpus if g >= n]
    if bad:
        raise SystemExit(f"--gpus: {bad} not on this host; it has {n} GPU(s): {list(range(n))}")


def _resolve_plan(sets: dict[str | None, dict[str, Any]], studies: dict, selected: list,
                  profile: str) -> dict[str, dict[str, Any]]:
    """Every selected study's parameters for ``profile`` with the ``--set`` overrides applied and
    checked against its declaration; SystemExit (no traceback, before any run folder exists)
    naming the bad study, parameter, value and the valid choices."""
    from .studies import ParamError

    unknown = sorted(k for k in sets if k is not None and k not in studies)
    if unknown:
        raise SystemExit(f"--set names unknown studies {unknown}; registered: {sorted(studies)}")
    unselected = sorted(k for k in sets if k is not None and k not in {s.name for s in selected})
    if unselected:
        raise SystemExit(f"--set names studies {unselected} that this sweep does not run; selected: "
                         f"{sorted(s.name for s in selected)}")
    plan, errors = {}, []
    shared = sets.get(None, {})
    for study in selected:
        names = set(study.params.names)
        # a KEY=VALUE for every study applies to those that declare KEY; a KEY no selected study
        # declares is refused below
        overrides = {k: v for k, v in shared.items() if k in names}
        overrides.update(sets.get(study.name, {}))
        try:
            plan[study.name] = study.resolve(profile, overrides)
            study.check_fits(plan[study.name], DEVICE_OF_PROFILE[profile])
        except ParamError as e:
            errors.append(f"--set: {e}")
    nowhere = sorted(k for k in shared if not any(k in s.params.names for s in selected))
    if nowhere:
        valid = {s.name: s.params.names for s in selected}
        errors.append(f"--set: no selected study takes {nowhere}; parameters: {valid}")
    if errors:
        raise SystemExit("\n".join(errors))
    return plan


def run_sweep(args: argparse.Namespace) -> tuple[Path | None, list[str]]:
    """Run the selected studies into a new run folder, or finish an interrupted one
    (``--resume``); returns (run folder, failures)."""
    from .studies import default_profile, discover

    studies = discover()
    if not studies:
        print(NO_STUDY_MESSAGE)
        return None, []
    if getattr(args, "resume", None):
        return resume_sweep(args, studies)
    selected = _select(studies, args.studies)
    profile = default_profile() if args.profile == "auto" else args.profile
    device = DEVICE_OF_PROFILE[profile]
    gpus = parse_gpus(getattr(args, "gpus", None))
    shard = parse_shard(getattr(args, "shard", None))
    sets = _parse_sets(args.set or [])
    plan = _resolve_plan(sets, studies, selected, profile)
    _check_gpus(gpus, profile)
    name = parse_name(args.name) or profile
    extra: dict[str, Any] = {}
    if shard is not None:
        mine = shard_studies(selected, *shard)
        if not mine:
            print(f"sweep: shard {shard[0]}/{shard[1]} has no study ({len(selected)} selected over "
                  f"{shard[1]} shards); nothing to run")
            return None, []
        plan = {s.name: plan[s.name] for s in mine}
        selected = mine
        extra["shard"] = {"index": shard[0], "count": shard[1], "group": shard_group(args, name)}
        name = f"{name}-shard{shard[0]}of{shard[1]}"
    if gpus:
        extra["gpus"] = gpus
        if os.environ.get(EMULATE_GPUS_ENV):
            extra["gpus_emulated"] = True
    run_dir = new_run_dir(args.results, name=name)
    lock = RunLock(run_dir)
    lock.acquire()                 # a folder this process just made: nobody else can hold it
    failures: list[str] = []
    try:
        meta = collect_meta({"profile": profile, "device": device,
                             "mode": "direct" if args.direct else "papermill", "studies": plan, **extra})
        write_meta(run_dir, meta)
        print(f"sweep: profile {profile}, {len(selected)} stud{'y' if len(selected) == 1 else 'ies'} "
              + (f"(shard {shard[0]}/{shard[1]}) " if shard else "")
              + (f"on GPUs {gpus} " if gpus else "") + f"-> {run_dir}")
        seconds: dict[str, float] = {}
        placement: dict[str, dict] = {}
        failures, warnings = _execute(selected, plan, device, run_dir, args.direct, args.kernel, gpus=gpus,
                                      seconds=seconds, placement=placement)
        meta["study_seconds"] = seconds          # what a later --gpus sweep orders its studies by
        if placement:                            # which GPU ran each study, as its worker recorded it
            meta["placement"] = placement
        meta["failures"] = failures
        meta["warnings"] = warnings
        write_meta(run_dir, finish_meta(meta))
    finally:
        # a complete run keeps no lock file; one with failures keeps it for --resume to take
        lock.release(remove=not failures and bool(meta.get("finished_at")))
    print(f"sweep: done in {meta['duration_s']:.1f} s, {len(failures)} failure(s): {run_dir}")
    return run_dir, failures


def shard_group(args: argparse.Namespace, name: str) -> str:
    """The name the shards of one run share (--group, $WORKBENCH_RUN_GROUP, $SLURM_ARRAY_JOB_ID, or
    <UTC date>-<git sha>-<name>: shards started the same day from the same code under one name)."""
    from .provenance import git_info, utc_now

    for value in (getattr(args, "group", None), os.environ.get("WORKBENCH_RUN_GROUP"),
                  os.environ.get("SLURM_ARRAY_JOB_ID")):
        if value:
            return str(value)
    return f"{utc_now().strftime('%Y%m%d')}-{git_info().get('short') or 'nogit'}-{name}"


CLAIMS_DIR = ".claims"


def _claim(run_dir: Path, study: str) -> bool:
    """Take ``study`` for this worker: exactly one process can create its claim file."""
    try:
        fd = os.open(run_dir / CLAIMS_DIR / f"{study}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} gpu {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n".encode())
    os.close(fd)
    return True


def cmd_worker(args: argparse.Namespace) -> int:
    """One GPU's worker of ``sweep --gpus``: take the next unclaimed study of the run, run it
    (serially, in this process, on the GPU its CUDA_VISIBLE_DEVICES names), record the outcome in
    ``.claims/<study>.json``, repeat until every study is taken."""
    import time

    from .provenance import atomic_write_text, read_meta
    from .studies import discover

    run_dir = Path(args.run_dir)
    params = read_meta(run_dir).get("params") or {}
    plan, device = params.get("studies") or {}, params.get("device") or "cpu"
    studies = discover()
    for name in [n for n in args.studies.split(",") if n]:
        if not _claim(run_dir, name):
            continue
        t0 = time.perf_counter()
        failures, warnings = _execute([studies[name]], {name: plan[name]}, device, run_dir, args.direct,
                                      args.kernel)
        record = {"study": name, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "pid": os.getpid(),
                  "threads": os.environ.get("OMP_NUM_THREADS", ""),
                  "seconds": round(time.perf_counter() - t0, 1), "failures": failures, "warnings": warnings}
        atomic_write_text(run_dir / CLAIMS_DIR / f"{name}.json", json.dumps(record))
    return 0


def _execute_on_gpus(selected: list, run_dir: Path, direct: bool, kernel: str,
                     gpus: list[int]) -> tuple[list[str], list[str], dict, dict]:
    """``sweep --gpus``: one worker process per GPU, each pinned to it with CUDA_VISIBLE_DEVICES,
    each taking studies in order from the shared list (a claim file per study decides who runs
    it). Returns (failures, warnings, {study: {gpu, seconds, threads}}, {study: seconds} of the studies
    that finished without a failure)."""
    import shutil
    import subprocess

    claims = run_dir / CLAIMS_DIR
    shutil.rmtree(claims, ignore_errors=True)       # a killed sweep's claims mean nothing now
    claims.mkdir()
    order = ",".join(s.name for s in selected)
    procs = []
    for g in gpus:
        cmd = [sys.executable, "-m", "workbench", "worker", str(run_dir), "--studies", order, "--kernel", kernel]
        if direct:
            cmd.append("--direct")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(g)}
        # side by side with torch's default thread count every study of the GPU profile ran 14-26%
        # slower than alone on a 2x H200 host; an OMP_NUM_THREADS the user set wins
        env.setdefault("OMP_NUM_THREADS", str(cpu_share(len(gpus))))
        procs.append((g, subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT))))
    codes = {g: p.wait() for g, p in procs}
    failures: list[str] = []
    warnings: list[str] = []
    placed: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for s in selected:
        rec_path = claims / f"{s.name}.json"
        if rec_path.is_file():
            rec = json.loads(rec_path.read_text())
            failures += rec["failures"]
            warnings += rec["warnings"]
            placed[s.name] = {"gpu": rec["gpu"], "seconds": rec["seconds"], "threads": rec.get("threads", "")}
            if not rec["failures"]:
                seconds[s.name] = rec["seconds"]
        elif (claims / f"{s.name}.claim").is_file():
            who = (claims / f"{s.name}.claim").read_text().strip()
            failures.append(f"{s.name}: its worker ({who}) died before finishing it "
                            f"(exit codes {codes}); resume the run to re-run it")
        else:
            failures.append(f"{s.name}: no worker took it (exit codes {codes}); resume the run to run it")
    shutil.rmtree(claims, ignore_errors=True)
    return failures, warnings, placed, seconds


def longest_first(selected: list, run_dir: Path, profile: str) -> list:
    """``selected`` ordered longest first by the time each study took in the newest other run of
    the same profile that timed it (meta.json ``study_seconds``, under the results folder and its
    reference/ runs); studies never timed go first, in their given order. Workers that take
    studies in this order finish close together (longest-processing-time-first scheduling)."""
    root = run_dir.parent
    metas = sorted([*root.glob("*/meta.json"), *(root / "reference").glob("*/meta.json")],
                   key=lambda m: m.parent.name, reverse=True)        # folder names start with the UTC time
    known: dict[str, float] = {}
    for m in metas:
        if m.parent == run_dir:
            continue
        try:
            meta = load_meta(m.parent)
        except MetaError:          # a broken record of another run orders nothing
            continue
        if (meta.get("params") or {}).get("profile") != profile:
            continue
        for name, sec in (meta.get("study_seconds") or {}).items():
            if isinstance(sec, (int, float)):
                known.setdefault(name, float(sec))
    return sorted(selected, key=lambda s: (s.name in known, -known.get(s.name, 0.0)))


def one_gpu_warnings(selected: list, plan: dict, device: str) -> list[str]:
    """What ``sweep --gpus`` cannot give: each worker sees one GPU, so a study that wants more
    (correctness's dp path on CUDA) skips those rows, as it would on a one-GPU host."""
    out = []
    for s in selected:
        n = s.gpus_wanted(plan[s.name], device)
        if n > 1:
            out.append(f"{s.name}: wants {n} GPUs with these parameters, but each --gpus worker has one, "
                       f"so its rows that need {n} are skipped; run it without --gpus for them")
    return out


def _execute(selected: list, plan: dict, device: str, run_dir: Path, direct: bool,
             kernel: str, gpus: list[int] | None = None, seconds: dict | None = None,
             placement: dict | None = None) -> tuple[list[str], list[str]]:
    """Run each study of ``selected`` into ``run_dir``; returns (failures, warnings), and adds
    each finished study's wall time to ``seconds``. With ``gpus``, one worker process per GPU
    runs them in parallel (`_execute_on_gpus`), longest first by earlier runs' times, and
    ``placement`` gets which GPU ran each study and for how long."""
    import time

    from tqdm.auto import tqdm

    if gpus:
        from .provenance import read_meta
        profile = (read_meta(run_dir).get("params") or {}).get("profile", "cpu")
        ordered = longest_first(selected, run_dir, profile)
        wider = one_gpu_warnings(selected, plan, device)
        for w in wider:
            print(f"sweep: {w}", file=sys.stderr)
        failures, warnings, placed, finished = _execute_on_gpus(ordered, run_dir, direct, kernel, gpus)
        warnings = wider + warnings
        if placement is not None:
            placement.update(placed)
        if seconds is not None:
            seconds.update(finished)
        return failures, warnings

    failures: list[str] = []
    warnings: list[str] = []
    for study in tqdm(selected, desc="studies", unit="study", disable=len(selected) < 2):
        t0 = time.perf_counter()
        failed, warned = finish_study(study, plan[study.name], device, run_dir, direct, kernel)
        failures += failed
        warnings += warned
        if seconds is not None and not failed:
            seconds[study.name] = round(time.perf_counter() - t0, 1)
    return failures, warnings


def finish_study(study: Any, params: dict, device: str, run_dir: Path, direct: bool,
                 kernel: str) -> tuple[list[str], list[str]]:
    """Take one study of ``run_dir`` through the stages it has not reached (workbench.runstate):
    measure and save its table (or, papermill mode, execute its notebook, which loads a table the
    run already holds instead of measuring again), export the notebook's HTML, draw the figures.
    Returns (failures, warnings); a stage that fails is recorded, never raised, and the stages
    after it wait for a resume."""
    from .runstate import study_state

    state = study_state(run_dir, study.name, direct)
    table = run_dir / f"{study.name}.parquet"
    measure = not state.done["table"] or not state.done.get("notebook", True)
    if measure and not direct:
        state.done["html"] = False        # the notebook runs again: so does its readable copy
    try:
        if measure:
            if direct:
                from .studies.tables import write_study_table
                write_study_table(study.run(device=device, progress=False, **params), table)
            else:
                _run_notebook(study, params, device, run_dir, kernel)
        if not table.is_file():
            raise RuntimeError(f"the study wrote no {table.name}")
    except Exception as e:  # noqa: BLE001 - record it, go on with the other studies
        saved = " after saving its table" if table.is_file() else ""
        message = f"{study.name}: {type(e).__name__}{saved}: {e}"
        print(f"sweep: {study.name} FAILED{saved}: {type(e).__name__}: {e}", file=sys.stderr)
        return [message], []
    warnings = []
    for stage, do in (("html", lambda: _export_html(run_dir / f"{study.name}.ipynb")),
                      ("figures", lambda: _save_run_figures(study, table, run_dir))):
        if stage in state.done and not state.done[stage]:
            warning = do()
            if warning:
                warnings.append(warning)
                print(f"sweep: {warning}", file=sys.stderr)
    return [], warnings


def _export_html(notebook: Path) -> str | None:
    """``<study>.html`` beside the executed notebook, so the report links to something a browser
    shows (code, tables, figures); a warning instead of an error where nbconvert is missing."""
    try:
        import nbconvert
        import nbformat

        body, _ = nbconvert.HTMLExporter().from_notebook_node(nbformat.read(str(notebook), as_version=4))
        from .provenance import atomic_write_text
        atomic_write_text(notebook.with_suffix(".html"), body)
    except Exception as e:  # noqa: BLE001 - the measurement is done; only its readable copy is missing
        return f"{notebook.stem}: no HTML export ({type(e).__name__}: {e})"
    return None


def _find_run(results: Path, name: str) -> Path:
    path = Path(name)
    for candidate in (path, Path(results) / name):
        if (candidate / "meta.json").is_file():
            return candidate
    raise SystemExit(f"--resume {name!r}: no run folder with a meta.json there or under {results}/")


def _load_run_meta(run_dir: Path, what: str) -> dict:
    """The run's meta.json, checked; SystemExit naming the file and what is wrong with it."""
    try:
        return load_meta(run_dir)
    except (MetaError, OSError) as e:
        raise SystemExit(f"{what}: {e}") from None


def resume_sweep(args: argparse.Namespace, studies: dict) -> tuple[Path | None, list[str]]:
    """Finish the run folder ``args.resume``: take every study its meta.json planned through the
    stages it has not reached (table, executed notebook, HTML, figures: workbench.runstate),
    with the parameters it recorded; a finished table is never touched.

    A run killed before its end gets its end recorded here. A finished run is a record: one that
    finished without failures is refused unless ``--resume-finished`` asks for it, and one that
    finished with failures (what resume is for) keeps everything it recorded: the resume is
    appended to ``resumed`` with its own studies, failures and end time."""
    from .provenance import git_info, utc_now
    from .runstate import open_failures, run_state
    from .studies import ParamError

    run_dir = _find_run(args.results, args.resume)
    # judged before taking the lock: refusing leaves no trace (not even a .lock) in the folder
    meta = _load_run_meta(run_dir, "--resume")
    state = run_state(run_dir, meta)
    if state.finished and not open_failures(meta):
        if not state.left:
            print(f"sweep: {run_dir} is finished and holds every stage of every planned study; nothing to resume")
            return run_dir, []
        if not getattr(args, "resume_finished", False):
            raise SystemExit(f"--resume: {run_dir.name} finished at {meta.get('finished_at')} without failures; a "
                             f"finished run is a record and is not resumed by default. Left: {state.describe_left()}. "
                             f"Pass --resume-finished to finish that (what the run recorded stays as it is; the "
                             f"resume is added to its meta.json under 'resumed').")
    had_lock = (run_dir / RunLock.NAME).exists()
    lock = RunLock(run_dir)
    try:
        got = lock.acquire()
    except OSError as e:
        raise SystemExit(f"--resume: cannot take the lock of {run_dir} ({e.strerror or e}); is the folder "
                         f"read-only?") from None
    if not got:
        raise SystemExit(f"--resume: {run_dir} is in use by another process ({lock.holder()}); wait for it")
    failures: list[str] = []
    left: dict[str, list[str]] = {}
    try:
        meta = _load_run_meta(run_dir, "--resume")      # again, under the lock
        state = run_state(run_dir, meta)
        params = meta.get("params") or {}
        plan, device = params.get("studies") or {}, params.get("device") or "cpu"
        unknown = sorted(set(plan) - set(studies))
        if unknown:
            raise SystemExit(f"--resume: {run_dir.name} planned studies {unknown} that are not registered now")
        left = state.left
        if left:
            try:   # the recorded values must still be valid for today's declarations
                plan = {n: studies[n].resolve(params.get("profile", "cpu"), plan[n]) for n in left}
            except ParamError as e:
                raise SystemExit(f"--resume: {e}") from None
        now = git_info()
        entry: dict[str, Any] = {"at": utc_now().isoformat(timespec="seconds").replace("+00:00", "Z"),
                                 "studies": list(left), "stages": left, "git": now.get("short"),
                                 "dirty": now.get("dirty")}
        if now.get("sha") != (meta.get("git") or {}).get("sha"):
            entry["note"] = f"resumed with other code than the run started with ({(meta.get('git') or {}).get('short')})"
            print(f"sweep: warning: {entry['note']}", file=sys.stderr)
        print(f"sweep: resuming {run_dir}: {state.describe_left()}")
        seconds: dict[str, float] = {}
        placement: dict[str, dict] = {}
        failures, warnings = _execute([studies[n] for n in left], plan, device, run_dir, state.direct,
                                      args.kernel, gpus=parse_gpus(getattr(args, "gpus", None)),
                                      seconds=seconds, placement=placement)
        if state.finished:
            # what the run recorded stays; the resume is one more entry
            entry.update(failures=failures, warnings=warnings, study_seconds=seconds, placement=placement)
            entry["finished_at"] = utc_now().isoformat(timespec="milliseconds").replace("+00:00", "Z")
            meta.setdefault("resumed", []).append(entry)
            write_meta(run_dir, meta, overwrite=True)
        else:
            meta["study_seconds"] = {**(meta.get("study_seconds") or {}), **seconds}
            if placement:
                meta["placement"] = {**(meta.get("placement") or {}), **placement}
            if left:
                meta.setdefault("resumed", []).append(entry)
            meta["failures"] = failures
            meta["warnings"] = (meta.get("warnings") or []) + warnings
            write_meta(run_dir, finish_meta(meta))
    finally:
        lock.release(remove=not failures or not had_lock)
    print(f"sweep: resumed {len(left)} stud{'y' if len(left) == 1 else 'ies'}, {len(failures)} "
          f"failure(s): {run_dir}")
    return run_dir, failures


def interrupted_run(results: Path, name: str) -> Path | None:
    """The newest run folder under ``results`` named ``*-<sha>-<name>`` for this code (same commit,
    clean tree) that never finished and that no process is working in: what ``make report``
    resumes instead of starting over."""
    from .provenance import git_info, run_in_use

    g = git_info()
    if not g.get("sha") or g.get("dirty"):
        return None
    candidates = sorted(Path(results).glob(f"*-{g['short']}-{name}"), reverse=True)
    for run in candidates:
        try:
            meta = load_meta(run)
        except MetaError:
            continue
        if not meta.get("finished_at") and (meta.get("git") or {}).get("sha") == g["sha"] and not run_in_use(run):
            return run
    return None


def _save_run_figures(study: Any, table: Path, run_dir: Path) -> str | None:
    """The study's figures of this run alone, PNG and SVG, into ``<run_dir>/figures/``, so a run
    folder (a committed reference run too) carries its own pictures. Returns a warning instead
    of raising: a figure that fails to draw never fails a finished measurement."""
    import matplotlib

    matplotlib.use("Agg")
    from .provenance import read_meta
    from .report import Run, run_table

    from .provenance import atomic_write_text
    from .runstate import figures_marker

    folder = run_dir / "figures"
    try:   # the same columns the report adds (run, reference, run_date), from the same code
        run = Run(path=run_dir, meta=read_meta(run_dir), tables={study.name: table})
        summary = study.summarize(run_table(run, study.name), folder)
        pngs = [folder / Path(f).name for f in getattr(summary, "figures", None) or []]
        drawn = [p.name for png in pngs for p in (png, png.with_suffix(".svg")) if p.is_file()]
        atomic_write_text(figures_marker(run_dir, study.name), json.dumps(drawn) + "\n")
    except Exception as e:  # noqa: BLE001
        return f"{study.name}: figures not saved ({type(e).__name__}: {e})"
    return None


def _run_notebook(study: Any, params: dict[str, Any], device: str, run_dir: Path,
                  kernel: str) -> None:
    nb = REPO_ROOT / study.notebook
    if not nb.is_file():
        raise FileNotFoundError(f"notebook {study.notebook} is missing (--direct skips notebooks)")
    try:
        import papermill as pm
    except ImportError as e:
        raise RuntimeError("papermill is not installed (make setup, or make wheels on a GPU "
                           "host; --direct runs studies without notebooks)") from e
    from .studies.plotting import PROGRESS_ENV

    # the kernel inherits this: studies show no progress bars inside the executed notebook
    os.environ[PROGRESS_ENV] = "0"
    pm.execute_notebook(
        str(nb),
        str(run_dir / f"{study.name}.ipynb"),
        parameters={**params, "device": device, "run_dir": str(run_dir.resolve())},
        kernel_name=kernel,
        cwd=str(REPO_ROOT),
        progress_bar=True,
    )


def _parameters_cell_index(doc: dict) -> int:
    tagged = [i for i, c in enumerate(doc["cells"])
              if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"expected one cell tagged 'parameters', found {len(tagged)}")
    return tagged[0]


def sync_notebook(study: Any, check: bool = False) -> bool:
    """Write the study's declared parameters into its notebook's ``parameters`` cell (or, with
    ``check``, only compare). Returns True when the notebook was (or would be) changed."""
    path = REPO_ROOT / study.notebook
    doc = json.loads(path.read_text(encoding="utf-8"))
    i = _parameters_cell_index(doc)
    text = study.params.parameters_cell()
    lines = text.splitlines(keepends=True)
    if "".join(doc["cells"][i]["source"]) == text:
        return False
    if not check:
        doc["cells"][i]["source"] = lines
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def cmd_notebooks(args: argparse.Namespace) -> int:
    from .studies import discover

    stale = []
    for name, study in sorted(discover().items()):
        if sync_notebook(study, check=args.check):
            stale.append(study.notebook)
    verb = "out of step" if args.check else "rewritten"
    print(f"notebooks: {len(stale)} {verb}" + (f": {', '.join(stale)}" if stale else ""))
    return 1 if args.check and stale else 0


def cmd_info(args: argparse.Namespace) -> int:
    params = None
    if args.params:
        try:
            params = json.loads(args.params)
        except ValueError as e:
            raise SystemExit(f"info --params {args.params!r} is not JSON ({e}); give an object, e.g. "
                             """--params '{"budgets": [64]}'""") from None
        if not isinstance(params, dict):
            raise SystemExit(f"info --params {args.params!r} is a JSON {type(params).__name__}; give an object, "
                             """e.g. --params '{"budgets": [64]}'""")
    print(json.dumps(collect_meta(params), indent=2, default=str))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    _, failures = run_sweep(args)
    return 1 if failures else 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import REPORT_DIRNAME, ReportError, check_report_dir

    out = args.out if args.out is not None else Path(args.results) / REPORT_DIRNAME
    try:        # before the sweep: a folder the report may not replace is refused at once
        check_report_dir(out, args.results)
    except ReportError as e:
        raise SystemExit(f"report: {e}") from None
    failures: list[str] = []
    if not args.no_sweep:
        profile = args.profile
        if profile == "auto":
            from .studies import default_profile
            profile = default_profile()
        if not args.resume and not args.studies and not args.set:
            interrupted = interrupted_run(args.results, parse_name(args.name) or profile)
            if interrupted is not None:
                print(f"report: resuming the interrupted run {interrupted.name}")
                args.resume = str(interrupted)
        _, failures = run_sweep(args)
    try:
        result = build_report(args.results, args.out)
    except ReportError as e:
        raise SystemExit(f"report: {e}") from None
    if result.no_study and args.no_sweep:
        print(NO_STUDY_MESSAGE)
    print(f"report: {len(result.runs)} run folder(s), {len(result.sections)} stud"
          f"{'y' if len(result.sections) == 1 else 'ies'} -> {result.index}")
    for problem in result.problems:
        print(f"report: summary failed for {problem}", file=sys.stderr)
    return 1 if failures or result.problems else 0


def _add_sweep_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--profile", choices=("auto", "cpu", "gpu"), default="auto",
                   help="default parameters to use: auto = gpu on a CUDA host, else cpu "
                        "(default: %(default)s)")
    g.add_argument("--studies", metavar="A,B",
                   help="comma-separated studies to run (default: every registered study)")
    g.add_argument("--set", action="append", metavar="[STUDY.]KEY=VALUE",
                   help="override a parameter, for every study or for one (repeatable; VALUE "
                        "is JSON where it parses, else a string)")
    g.add_argument("--name", help="suffix of the run folder name (default: the profile)")
    g.add_argument("--direct", action="store_true",
                   help="call the studies' run functions in this process instead of executing "
                        "their notebooks with papermill")
    g.add_argument("--kernel", default="python3",
                   help="Jupyter kernel for papermill (default: %(default)s, this interpreter)")
    g.add_argument("--resume", metavar="RUN",
                   help="finish an interrupted run folder (a path, or a folder name under --results): only "
                        "the studies without a table run, with the parameters its meta.json recorded")
    g.add_argument("--resume-finished", action="store_true",
                   help="with --resume: also finish a run that finished without failures but lacks a stage "
                        "(what it recorded stays; the resume is added to its meta.json)")
    g.add_argument("--gpus", metavar="0,1,...",
                   help="spread the studies over these GPUs of this host: one worker process per GPU "
                        "(CUDA_VISIBLE_DEVICES set to it, so each notebook runs on its own device, and "
                        "OMP_NUM_THREADS to its share of the host's cores unless set), each "
                        "taking the next study nobody has taken")
    g.add_argument("--shard", metavar="I/N",
                   help="run only shard I of N (0 <= I < N) of the selected studies (study k, in name "
                        "order, belongs to shard k %% N), for a scheduler's job array: SLURM "
                        "(--shard $SLURM_ARRAY_TASK_ID/N), Kubernetes indexed jobs "
                        "($JOB_COMPLETION_INDEX), torchrun ($RANK/$WORLD_SIZE); the report merges the "
                        "shards of one run")
    g.add_argument("--group", metavar="NAME",
                   help="with --shard: the name the shards of one run share (default: $WORKBENCH_RUN_GROUP, "
                        "else $SLURM_ARRAY_JOB_ID, else <UTC date>-<git sha>-<name>)")


def _params_epilog() -> str:
    try:
        from .studies import discover

        studies = discover()
    except Exception as e:  # noqa: BLE001 - --help must work even if a study module is broken
        return f"(study parameters unavailable: {e})"
    parts = ["study parameters (--set KEY=VALUE for every study that has KEY, --set STUDY.KEY=VALUE for one;",
             "lists take JSON, a comma-separated string or one value):"]
    for name, study in sorted(studies.items()):
        parts.append(f"{name}:")
        parts.append(study.params.describe("  "))
    return "\n".join(parts)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog is computed only when help is shown (listing the studies'
    parameters imports them, and with them torch)."""

    def __init__(self, *args, lazy_epilog=None, **kw):
        super().__init__(*args, **kw)
        self._lazy_epilog = lazy_epilog

    def format_help(self) -> str:
        if self._lazy_epilog is not None and self.epilog is None:
            self.epilog = self._lazy_epilog()
        return super().format_help()


def _results_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--results", type=Path, metavar="DIR", default=None,
                   help=f"{what} (default: the project's results/, or $WORKBENCH_RESULTS when set; "
                        f"the same whatever the working directory)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m workbench",
        description="Vision-encoder input-normalization workbench: run the studies, build the "
                    "report, show provenance.",
        epilog="Run folders are results/<UTC time>-<git sha>-<name>/ with meta.json and one "
               "<study>.parquet per study; committed GPU reference runs live in "
               "results/reference/.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{report,sweep,info,notebooks}",
                                parser_class=_Parser)

    p = sub.add_parser("report", help="the main job: default sweep, then results/report/index.html",
                       description="Run the default sweep for this hardware (unless --no-sweep), "
                                   "then build <results>/report/index.html from every run folder.",
                       lazy_epilog=_params_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    _results_option(p, "folder holding the run folders")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where to write the report (default: <results>/report)")
    p.add_argument("--no-sweep", action="store_true",
                   help="only rebuild the report from the run folders already there")
    _add_sweep_options(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("sweep", help="run the studies into a new run folder",
                       description="Run the registered studies (their notebooks, via papermill) "
                                   "into a new run folder under --results.",
                       lazy_epilog=_params_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    _results_option(p, "where the new run folder goes")
    _add_sweep_options(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("info", help="print this machine's provenance record as JSON",
                       description="Print the meta.json record a run started now would store.")
    p.add_argument("--params", metavar="JSON", help="parameters to include, as a JSON object")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("notebooks", help="regenerate the notebooks' parameters cells from the studies",
                       description="Write each study's declared parameters (CPU defaults) into the "
                                   "cell tagged 'parameters' of its notebook.")
    p.add_argument("--check", action="store_true", help="only report notebooks that are out of step "
                                                        "(exit 1 if any)")
    p.set_defaults(func=cmd_notebooks)
    # internal: one GPU's worker of `sweep --gpus` (not listed in the help)
    p = sub.add_parser("worker", description="internal: one worker of sweep --gpus")
    p.add_argument("run_dir")
    p.add_argument("--studies", required=True)
    p.add_argument("--kernel", default="python3")
    p.add_argument("--direct", action="store_true")
    p.set_defaults(func=cmd_worker)
    parser.subcommands = sub.choices
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:   # an unknown flag after a subcommand: show that subcommand's usage, not the top one
        parser.subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "results", "unset") is None:
        args.results = results_root()
    try:        # a malformed $WORKBENCH_LIMITS is named here, not deep inside a study
        from .limits import Limits
        Limits.from_env()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    results = getattr(args, "results", None)
    if results is not None and Path(results).exists() and not Path(results).is_dir():
        raise SystemExit(f"--results {results} is a file, not a folder; give the folder that holds the run folders")
    try:
        return args.func(args)
    except OSError as e:
        if e.errno not in _DISK_ERRNOS:
            raise
        # a read-only or full disk, a missing permission: what and where, not a traceback; what a
        # finished run wrote is never touched by a failed write (files are replaced atomically)
        raise SystemExit(f"{args.command}: {e.strerror or e}: {e.filename or ''}".rstrip(": ")
                         + " (nothing finished was changed; free space or pick a writable --results)") from None


_DISK_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EDQUOT,
                errno.ENOTDIR}


if __name__ == "__main__":
    sys.exit(main())
