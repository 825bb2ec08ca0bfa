"""Command line: ``python -m workbench {report,sweep,compare,advise,audit,info,notebooks}``, its options in
workbench.arguments. A command checks its arguments before anything imports torch (a refusal answers at once), then
runs: ``sweep`` and ``report`` through a plan (workbench.sweep.SweepPlan), ``compare`` in workbench.compare,
``advise`` and ``audit`` on their libraries (workbench.advise, workbench.audit), which the report reads too."""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import warnings
from typing import Any, Sequence

from .arguments import build_parser, glue_dash_values, parse_sets, select_studies
from .checkpoints import CheckpointError
from .compare import compare_command
from .limits import Limits, check_switches
from .provenance import collect_meta, git_info, utc_now
from .report import NO_STUDY_MESSAGE, REPORT_DIRNAME, ReportError, build_report, check_report_dir
from .results import RunFolder
from .notebook_path import check_kernel, default_kernel, sync_notebook
from .studies import GPU_PROFILES, ParamError, default_profile, discover        # the declarations: torch-free
from .sweep import (DEVICE_OF_PROFILE, SweepPlan, SweepResult, interrupted_run, n_studies, resume_sweep,
                    reusable_run, run_sweep)
from .workers import EMULATE_GPUS_ENV, check_gpus, worker_count


def _resolve_plan(sets: dict[str | None, dict[str, Any]], studies: dict, selected: list,
                  profile: str, fits: bool = True) -> dict[str, dict[str, Any]]:
    """Each selected study's parameters for ``profile``, ``--set`` applied and checked; SystemExit naming a bad one."""
    unknown = sorted(k for k in sets if k is not None and k not in studies)
    if unknown:
        raise SystemExit(f"--set names unknown studies {unknown}; registered: {sorted(studies)}")
    unselected = sorted(k for k in sets if k is not None and k not in {s.name for s in selected})
    if unselected:
        raise SystemExit(f"--set names studies {unselected} that this sweep does not run; selected: "
                         f"{sorted(s.name for s in selected)}")
    plan, errors = {}, []
    shared = sets.get(None, {})
    for study in selected:      # KEY=VALUE applies to the studies that declare KEY
        overrides = {k: v for k, v in shared.items() if k in study.params.accepted}
        overrides.update(sets.get(study.name, {}))
        try:
            plan[study.name] = study.resolve(profile, overrides)
        except (ParamError, CheckpointError) as e:
            errors.append(f"--set: {e}")
    nowhere = sorted(k for k in shared if not any(k in s.params.accepted for s in selected))
    if nowhere:
        valid = {s.name: s.params.names for s in selected}
        errors.append(f"--set: no selected study takes {nowhere}; parameters: {valid}")
    for study in selected if fits and not errors else ():     # the footprints import torch: values first
        try:
            study.check_fits(plan[study.name], DEVICE_OF_PROFILE[profile])
        except (ParamError, CheckpointError) as e:   # a model folder changed since its check, too
            errors.append(f"--set: {e}")
    if errors:
        raise SystemExit("\n".join(errors))
    return plan


def precheck(args: argparse.Namespace) -> None:
    """Refuse, before torch loads, options that do not go together, or a bad --resume (each value: the parser's
    types; studies and parameters: `sweep_plan`)."""
    if args.fit and args.max_minutes is None:
        raise SystemExit("--fit trims the repetitions to fit --max-minutes N: give that too")
    if args.resume:     # a resume measures what its meta.json recorded: an option choosing that would be lost
        given = [f"--{option.replace('_', '-')}" for option in ("set", "studies", "shard", "group", "name",
                                                                "max_minutes", "fit") if getattr(args, option)]
        given += ["--profile"] if args.profile != "auto" else []
        if given:
            raise SystemExit(f"--resume {args.resume}: {', '.join(given)} cannot change a run being finished (it "
                             f"keeps the studies and parameters its meta.json recorded); start a new sweep "
                             f"with them instead")
        RunFolder.find(args.results, args.resume)      # the run folder's own checks follow at once
        return
    if args.profile == "cpu":           # the gpu profile's check counts the host's GPUs, with torch
        check_gpus(args.gpus, args.profile)


def sweep_plan(args: argparse.Namespace, studies: dict) -> SweepPlan:
    """The checked sweep the options of ``sweep``/``report`` ask for (SystemExit before any run folder exists)."""
    selected = select_studies(studies, args.studies)
    sets = parse_sets(args.set or [])
    if args.profile == "auto":      # torch tells the profile: refuse a bad value before it loads
        _resolve_plan(sets, studies, selected, "cpu", fits=False)
    profile = default_profile() if args.profile == "auto" else args.profile
    params = _resolve_plan(sets, studies, selected, profile)
    check_gpus(args.gpus, profile)
    workers = worker_count(args.workers, profile, len(selected), args.gpus, default_workers(args))
    if profile in GPU_PROFILES and not os.environ.get(EMULATE_GPUS_ENV):   # every study would fail on its first tensor
        import torch
        if not torch.cuda.is_available():
            raise SystemExit(f"--profile {profile}: this host has no CUDA device (torch {torch.__version__}); use "
                             f"--profile cpu, or auto (gpu on a CUDA host, else cpu)")
    kernel = args.kernel or default_kernel()
    if not args.direct:
        check_kernel(kernel)
    name = args.name or profile
    return SweepPlan(studies=tuple(selected), params=params, profile=profile, results=args.results, name=name,
                     mode="direct" if args.direct else "papermill", kernel=kernel,
                     gpus=tuple(args.gpus or ()) or None,
                     gpus_emulated=bool(args.gpus and os.environ.get(EMULATE_GPUS_ENV)),
                     shard=args.shard, group=shard_group(args.group, name) if args.shard is not None else None,
                     max_minutes=args.max_minutes, fit=args.fit, workers=workers)


def default_workers(args: argparse.Namespace) -> int | str:
    """Without --workers: the report (make report) runs a CPU sweep's studies side by side, one per core."""
    return "auto" if args.command == "report" else 1


def shard_group(group: str | None, name: str) -> str:
    """The name the shards of one run share: --group, $WORKBENCH_RUN_GROUP, $SLURM_ARRAY_JOB_ID, or
    <UTC date>-<git sha>-<name> (shards started the same day from the same code under one name)."""
    return (group or os.environ.get("WORKBENCH_RUN_GROUP") or os.environ.get("SLURM_ARRAY_JOB_ID")
            or f"{utc_now().strftime('%Y%m%d')}-{git_info().get('short') or 'nogit'}-{name}")


def _sweep(args: argparse.Namespace, resume: str | None) -> SweepResult:
    """Run the sweep the options ask for, or finish the run folder ``resume``; print its summary."""
    precheck(args)
    studies = discover()
    if not studies:
        result = SweepResult(None, [], NO_STUDY_MESSAGE)
    elif resume:
        result = resume_sweep(resume, args.results, studies, kernel=args.kernel or default_kernel(),
                              gpus=args.gpus, resume_finished=args.resume_finished,
                              workers=args.workers, default_workers=default_workers(args))
    else:
        result = run_sweep(sweep_plan(args, studies))
    print(result.summary)
    return result


def cmd_notebooks(args: argparse.Namespace) -> int:
    stale = [study.notebook for _, study in sorted(discover().items())
             if sync_notebook(study, check=args.check)]
    listed = f": {', '.join(stale)}" if stale else ""
    hint = " (run python -m workbench notebooks)" if args.check and stale else ""
    print(f"notebooks: {len(stale)} {'out of step' if args.check else 'rewritten'}{listed}{hint}")
    return 1 if args.check and stale else 0


def cmd_info(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params) if args.params else None
        why = "" if not args.params or isinstance(params, dict) else f"is a JSON {type(params).__name__}"
    except ValueError as e:
        why = f"is not JSON ({e})"
    if why:
        raise SystemExit(f"info --params {args.params!r} {why}; give an object, e.g. "
                         """--params '{"budgets": [64]}'""")
    print(json.dumps(collect_meta(params), indent=2, default=str))
    return 0


SETUP_SECONDS_ENV = "WORKBENCH_SETUP_SECONDS"     # make report: what its set-up took, for the last line


def _stage_times(sweep: str, page_s: float) -> str:
    """'set-up 3 s, sweep 140 s, page 60 s': the set-up as make timed it (``$WORKBENCH_SETUP_SECONDS``), if it did."""
    setup = os.environ.get(SETUP_SECONDS_ENV, "").strip()
    return ", ".join(([f"set-up {int(setup)} s"] if setup.isdigit() else []) + [sweep, f"page {page_s:.0f} s"])


def cmd_report(args: argparse.Namespace) -> int:
    import time

    try:        # before the sweep: a folder the report may not replace is refused at once
        check_report_dir(args.out or args.results / REPORT_DIRNAME, args.results)
    except ReportError as e:
        raise SystemExit(f"report: {e}") from None
    failures: list[str] = []
    t0, sweep = time.monotonic(), "no sweep (--no-sweep)"
    if not args.no_sweep:
        precheck(args)
        resume, reuse = args.resume, None
        if not resume and not args.studies and not args.set and not args.fresh:
            profile = default_profile() if args.profile == "auto" else args.profile
            name = args.name or profile
            interrupted = interrupted_run(args.results, name)
            if interrupted is not None:
                print(f"report: resuming the interrupted run {interrupted.name}")
                resume = str(interrupted)
            else:
                reuse = reusable_run(args.results, name, profile, discover())
        if reuse is not None:
            print(f"report: reusing {reuse.name}, the finished default {profile} sweep of this commit "
                  f"(--fresh, or make sweep, measures again)")
            sweep = "sweep reused"
        else:
            failures = _sweep(args, resume).failures
            sweep = f"sweep {time.monotonic() - t0:.0f} s"
    t1 = time.monotonic()
    try:
        result = build_report(args.results, args.out, log=lambda line: print(line, flush=True),
                              cache=not args.no_cache)
    except ReportError as e:
        raise SystemExit(f"report: {e}") from None
    if result.no_study and args.no_sweep:
        print(NO_STUDY_MESSAGE)
    for problem in result.problems:
        print(f"report: summary failed for {problem}", file=sys.stderr, flush=True)
    # the last line: where the page is, and what each stage took
    print(f"report: {len(result.runs)} run folder(s), {n_studies(len(result.sections))} -> {result.index} "
          f"({_stage_times(sweep, time.monotonic() - t1)})", flush=True)
    return 1 if failures or result.problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    try:        # the parser's defaults read $WORKBENCH_RESULTS: a value it cannot use is named, no traceback
        parser = build_parser()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    args, extra = parser.parse_known_args(glue_dash_values(sys.argv[1:] if argv is None else argv))
    if extra:   # an unknown flag after a subcommand: show that subcommand's usage, not the top one
        parser.subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:        # a malformed $WORKBENCH_LIMITS, or an on/off variable neither on nor off, is named here, not in a study
        Limits.from_env()
        check_switches()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    results = getattr(args, "results", None)
    if results is not None and results.exists() and not results.is_dir():
        raise SystemExit(f"--results {results} is a file, not a folder; give the folder that holds the run folders")
    try:
        return COMMANDS[args.command](args)
    except OSError as e:
        if e.errno not in _DISK_ERRNOS:
            raise
        # a read-only or full disk, a missing permission: what and where; files are replaced atomically
        raise SystemExit(f"{args.command}: {e.strerror or e}: {e.filename or ''}".rstrip(": ")
                         + " (nothing finished was changed; free space or pick a writable --results)") from None


def cmd_advise(args: argparse.Namespace) -> int:
    """``python -m workbench advise``: the advice as text (or ``--json``); SystemExit naming a bad
    preset, mix, folder or --set."""
    from .advise import advise          # the planner imports torch: not for --help
    from .samples import FOLDER_PREFIX, MIX_NAMES

    if args.mix is not None and not args.mix.strip():     # not the default mix, silently
        raise SystemExit(f"advise --mix {args.mix!r}: empty; valid: {', '.join(MIX_NAMES)}, or --set image_folder=PATH")
    folder = None
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if key.strip() != "image_folder" or not sep or not value.strip():
            raise SystemExit(f"advise --set {item!r}: the one key advise takes is image_folder=PATH (a folder of "
                             f"your images); a named mix goes to --mix")
        folder = value.strip()
    if folder and args.mix:
        raise SystemExit(f"advise: --mix {args.mix!r} and --set image_folder={folder!r} name two mixes; give one")
    mix = f"{FOLDER_PREFIX}{folder}" if folder else (args.mix or "photos")
    try:
        result = advise(args.preset, mix, args.results, max_graphs=args.max_graphs, engine=args.engine,
                        engine_source=args.engine_source, engine_cap=args.engine_cap)
    except (ValueError, CheckpointError, OSError) as e:
        raise SystemExit(f"advise: {e}") from None
    if args.json:
        out = {k: v for k, v in result.__dict__.items() if k not in ("placement", "staging", "latency")}
        out.update(placement=result.placement.__dict__, staging=result.staging.__dict__,
                   latency=result.latency.__dict__ if result.latency else None,
                   engine_options=result.compilation_config(),
                   vllm_compilation_config=result.compilation_config())
        print(json.dumps(out, indent=2, default=str))
    else:
        print(result.text())
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """``python -m workbench audit PATH [NEW]``: print the audit (a table, or ``--json``), or with NEW
    what changed from PATH to NEW; keep the (NEW) audit under ``<results>/audits/`` unless
    ``--no-save``; 1 when a model class (of NEW) needs attention."""
    from dataclasses import asdict

    from .audit import ATTENTION, AuditError, audit, compare, compare_table, save
    new_path = getattr(args, "new", None)
    try:
        with warnings.catch_warnings(record=True) as caught:      # a link skipped: one plain line each
            warnings.simplefilter("always")
            old = audit(args.path) if new_path else None
            result = audit(new_path or args.path)
    except AuditError as e:
        raise SystemExit(str(e)) from None
    for w in caught if args.json or new_path else ():      # the table's own lines name them otherwise
        print(f"audit: warning: {w.message}", file=sys.stderr)
    if old is None:
        print(result.to_json() if args.json else result.table(), end="\n" if not args.json else "")
    else:
        rows = compare(old, result)
        print(json.dumps({"old": asdict(old), "new": asdict(result), "changes": rows}, indent=2) if args.json
              else compare_table(old, result, rows))
    if not args.no_save and result.engine != "vllm" and not result.models:
        # no vLLM model folder and no class found: kept, it would stand as the newest audit the report shows
        print(f"audit: not saved: {result.source} holds no vLLM model folder and no model class that normalizes "
              f"or captures its encoder; give a vLLM source tree, its package folder or a wheel", file=sys.stderr)
    elif not args.no_save:
        print(f"audit: saved to {save(result, args.results)}", file=sys.stderr)
    return 1 if any(m.verdict_key in ATTENTION for m in result.models) else 0


COMMANDS = {"report": cmd_report, "sweep": lambda args: 1 if _sweep(args, args.resume).failures else 0,
            "advise": cmd_advise, "audit": cmd_audit, "info": cmd_info, "compare": compare_command,
            "notebooks": cmd_notebooks}
_DISK_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EDQUOT, errno.ENOTDIR}
