"""Command line: ``python -m workbench {report,sweep,compare,info,notebooks}``.

``sweep`` runs the studies (their notebooks through papermill, or ``--direct``) into a new run
folder ``results/<UTC time>-<sha>-<name>/``; ``report`` sweeps with this host's defaults (reusing
or resuming this commit's default run) and builds ``results/report/index.html``; ``compare``
prints what changed between two runs; ``info`` the provenance record a run would store;
``notebooks`` rewrites each notebook's ``parameters`` cell from its study's declaration.

A command checks its arguments (every ``--set`` against the torch-free declarations, so a refusal
answers at once), turns them into a plan (workbench.sweep.SweepPlan) and hands it on.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .arguments import _parse_sets, _select, build_parser, parse_gpus, parse_name, parse_shard  # noqa: F401
from .notebook_run import PROJECT_KERNEL, default_kernel, sync_notebook
from .provenance import collect_meta, results_root
from .report import NO_STUDY_MESSAGE, build_report
from .sweep import (DEVICE_OF_PROFILE, SweepPlan, SweepResult, find_run, interrupted_run, resume_sweep,
                    reusable_run, run_sweep)
from .workers import EMULATE_GPUS_ENV, check_gpus, work


def _resolve_plan(sets: dict[str | None, dict[str, Any]], studies: dict, selected: list,
                  profile: str, fits: bool = True) -> dict[str, dict[str, Any]]:
    """Every selected study's parameters for ``profile`` with the ``--set`` overrides applied and
    checked against its declaration (torch-free), then whether each study's largest cell fits the
    device; SystemExit (no traceback, before any run folder exists) naming the bad study,
    parameter, value and the valid choices."""
    from .checkpoints import CheckpointError        # light: no torch
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
        names = study.params.accepted
        # a KEY=VALUE for every study applies to those that declare KEY; a KEY no selected study
        # declares is refused below
        overrides = {k: v for k, v in shared.items() if k in names}
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


def registered_studies() -> dict:
    """The registry: every study folder's declaration, torch-free (its ``params.py``); the
    measuring modules load when a study runs."""
    from .studies import discover

    return discover()


def precheck(args: argparse.Namespace) -> None:
    """Refuse, before anything imports torch, a bad --gpus/--shard/--name or a --resume folder
    that is not there; the studies and their parameters are checked once, by `sweep_plan`."""
    gpus = parse_gpus(getattr(args, "gpus", None))
    parse_shard(getattr(args, "shard", None))
    parse_name(getattr(args, "name", None))
    if getattr(args, "resume", None):
        refuse_resume_overrides(args)
        find_run(args.results, args.resume)            # the run folder's own checks follow at once
        return
    if args.profile == "cpu":           # the gpu profile's check counts the host's GPUs, with torch
        check_gpus(gpus, args.profile)


# options that choose what a new run measures: a resume takes all of them from the run's meta.json
_NEW_RUN_OPTIONS = (("set", "--set"), ("studies", "--studies"), ("shard", "--shard"), ("group", "--group"),
                    ("name", "--name"))


def refuse_resume_overrides(args: argparse.Namespace) -> None:
    """SystemExit where ``--resume`` comes with an option it would ignore: a resume finishes the
    run with the studies and parameters its meta.json recorded, so a new value would be lost."""
    given = [flag for attr, flag in _NEW_RUN_OPTIONS if getattr(args, attr, None)]
    if getattr(args, "profile", "auto") != "auto":
        given.append("--profile")
    if given:
        raise SystemExit(f"--resume {args.resume}: {', '.join(given)} cannot change a run being finished (it "
                         f"keeps the studies and parameters its meta.json recorded); start a new sweep "
                         f"with them instead")


def check_profile_device(profile: str) -> None:
    """SystemExit before any run folder exists where the gpu profile is asked for on a host whose
    torch sees no CUDA device (every study of the run would fail on its first tensor)."""
    if profile != "gpu" or os.environ.get(EMULATE_GPUS_ENV):
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"--profile gpu: this host has no CUDA device (torch {torch.__version__}); use "
                         f"--profile cpu, or auto (gpu on a CUDA host, else cpu)")


def check_kernel(name: str) -> None:
    """SystemExit before any run folder exists where papermill's Jupyter kernel is not installed."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return          # no jupyter_client: the notebook stage records why it cannot run
    known = sorted(KernelSpecManager().find_kernel_specs())
    if name not in known:
        raise SystemExit(f"--kernel {name!r}: no Jupyter kernel of that name; installed: {known or 'none'} "
                         f"(make lab registers {PROJECT_KERNEL!r}; --direct runs without notebooks)")


def sweep_plan(args: argparse.Namespace, studies: dict) -> SweepPlan:
    """The sweep the options of ``sweep``/``report`` ask for, checked (SystemExit naming what is
    wrong, before any run folder exists) and resolved against the registry ``studies``."""
    from .studies import default_profile

    selected = _select(studies, args.studies)
    sets = _parse_sets(args.set or [])
    if args.profile == "auto":      # torch tells the profile: refuse a bad value before it loads
        _resolve_plan(sets, studies, selected, "cpu", fits=False)
    profile = default_profile() if args.profile == "auto" else args.profile
    gpus = parse_gpus(args.gpus)
    shard = parse_shard(args.shard)
    params = _resolve_plan(sets, studies, selected, profile)
    check_gpus(gpus, profile)
    check_profile_device(profile)
    kernel = args.kernel or default_kernel()
    if not args.direct:
        check_kernel(kernel)
    name = parse_name(args.name) or profile
    return SweepPlan(studies=tuple(selected), params=params, profile=profile, results=args.results, name=name,
                     mode="direct" if args.direct else "papermill", kernel=kernel,
                     gpus=tuple(gpus) if gpus else None, gpus_emulated=bool(gpus and os.environ.get(EMULATE_GPUS_ENV)),
                     shard=shard, group=shard_group(args.group, name) if shard is not None else None)


def shard_group(group: str | None, name: str) -> str:
    """The name the shards of one run share (--group, $WORKBENCH_RUN_GROUP, $SLURM_ARRAY_JOB_ID, or
    <UTC date>-<git sha>-<name>: shards started the same day from the same code under one name)."""
    from .provenance import git_info, utc_now

    for value in (group, os.environ.get("WORKBENCH_RUN_GROUP"), os.environ.get("SLURM_ARRAY_JOB_ID")):
        if value:
            return str(value)
    return f"{utc_now().strftime('%Y%m%d')}-{git_info().get('short') or 'nogit'}-{name}"


def _sweep(args: argparse.Namespace, resume: str | None) -> SweepResult:
    """Run the sweep the options ask for, or finish the run folder ``resume``; print its summary."""
    precheck(args)
    studies = registered_studies()
    if not studies:
        result = SweepResult(None, note=NO_STUDY_MESSAGE)
    elif resume:
        result = resume_sweep(resume, args.results, studies, kernel=args.kernel or default_kernel(), gpus=parse_gpus(args.gpus),
                              resume_finished=args.resume_finished)
    else:
        result = run_sweep(sweep_plan(args, studies))
    print(result.summary())
    return result


def cmd_worker(args: argparse.Namespace) -> int:
    """Internal: one GPU's worker of ``sweep --gpus`` (workbench.workers)."""
    work(Path(args.run_dir), [n for n in args.studies.split(",") if n], args.direct, args.kernel)
    return 0


def cmd_notebooks(args: argparse.Namespace) -> int:
    studies = registered_studies()
    stale = [study.notebook for _, study in sorted(studies.items()) if sync_notebook(study, check=args.check)]
    verb = "out of step" if args.check else "rewritten"
    print(f"notebooks: {len(stale)} {verb}" + (f": {', '.join(stale)}" if stale else "")
          + (" (run python -m workbench notebooks)" if args.check and stale else ""))
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
    return 1 if _sweep(args, args.resume).failures else 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import REPORT_DIRNAME, ReportError, check_report_dir

    out = args.out if args.out is not None else Path(args.results) / REPORT_DIRNAME
    try:        # before the sweep: a folder the report may not replace is refused at once
        check_report_dir(out, args.results)
    except ReportError as e:
        raise SystemExit(f"report: {e}") from None
    failures: list[str] = []
    if not args.no_sweep:
        precheck(args)
        resume, reuse = args.resume, None
        if not resume and not args.studies and not args.set and not args.fresh:
            from .studies import default_profile
            profile = default_profile() if args.profile == "auto" else args.profile
            name = parse_name(args.name) or profile
            interrupted = interrupted_run(args.results, name)
            if interrupted is not None:
                print(f"report: resuming the interrupted run {interrupted.name}")
                resume = str(interrupted)
            else:
                reuse = reusable_run(args.results, name, profile, registered_studies())
        if reuse is not None:
            # `make report` renders; `make sweep` (or --fresh) measures again
            print(f"report: reusing {reuse.name}, the finished default {profile} sweep of this commit "
                  f"(--fresh, or make sweep, measures again)")
        else:
            failures = _sweep(args, resume).failures
    try:
        result = build_report(args.results, args.out, log=lambda line: print(line, flush=True))
    except ReportError as e:
        raise SystemExit(f"report: {e}") from None
    if result.no_study and args.no_sweep:
        print(NO_STUDY_MESSAGE)
    print(f"report: {len(result.runs)} run folder(s), {len(result.sections)} stud"
          f"{'y' if len(result.sections) == 1 else 'ies'} -> {result.index}")
    for problem in result.problems:
        print(f"report: summary failed for {problem}", file=sys.stderr)
    return 1 if failures or result.problems else 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Print every metric both runs measured, with the ratio and what changed; --csv saves it all
    (never inside a run folder, never over a file compare did not write; exit 2 for a bad value)."""
    from .compare import BadArgument, CompareError, compare_runs, csv_target, resolve_run, summary_line, write_csv

    studies = [s.strip() for s in args.studies.split(",") if s.strip()] if args.studies else None
    try:
        runs = [resolve_run(run, args.results) for run in (args.run_a, args.run_b)]     # named before pandas loads
        if args.csv:                                 # refused before the comparison, not after it
            csv_target(args.csv, args.results, args.force)
        df = compare_runs(*runs, args.results, studies=studies)
        shared = sorted(set(df.attrs["studies_a"]) & set(df.attrs["studies_b"]))
        if args.csv and shared:
            write_csv(df, args.csv, args.results, args.force)
    except BadArgument as e:
        print(f"compare: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except CompareError as e:
        raise SystemExit(f"compare: {e}") from None
    import pandas as pd
    a, b = Path(df.attrs["a"]), Path(df.attrs["b"])
    print(f"a: {a}\nb: {b}")
    only = sorted(set(df.attrs["studies_a"]) ^ set(df.attrs["studies_b"]))
    if not shared:
        print(f"compare: the two runs have no study in common (a: {', '.join(df.attrs['studies_a']) or 'none'}; "
              f"b: {', '.join(df.attrs['studies_b']) or 'none'})")
        return 1
    if only:
        print(f"studies in one run only (not compared): {', '.join(only)}")
    for study in shared:
        g = df[df["study"] == study]
        print(f"{study}: {summary_line(g)}" + ("" if len(g) else " (no cell measured in both: other "
                                                                 "presets, sizes or parameters)"))
    if args.csv:
        print(f"compare: every value written to {args.csv}")
    show = df if args.all else df[df["flag"] != ""]
    if len(show):
        show = show[[c for c in show.columns if not show[c].astype(str).isin(["", "-"]).all()]]
        with pd.option_context("display.max_rows", args.rows, "display.width", 200,
                               "display.max_columns", 40, "display.float_format", "{:.4g}".format):
            print(show.head(args.rows).to_string(index=False))
        if len(show) > args.rows:
            print(f"... {len(show) - args.rows} more rows (--rows N, or --csv FILE for all)")
    else:
        print("no flagged change (--all lists every value)")
    return 0


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
        return COMMANDS[args.command_name](args)
    except OSError as e:
        if e.errno not in _DISK_ERRNOS:
            raise
        # a read-only or full disk, a missing permission: what and where, not a traceback; what a
        # finished run wrote is never touched by a failed write (files are replaced atomically)
        raise SystemExit(f"{args.command}: {e.strerror or e}: {e.filename or ''}".rstrip(": ")
                         + " (nothing finished was changed; free space or pick a writable --results)") from None


COMMANDS = {"report": cmd_report, "sweep": cmd_sweep, "info": cmd_info, "compare": cmd_compare,
            "notebooks": cmd_notebooks, "worker": cmd_worker}
_DISK_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EDQUOT,
                errno.ENOTDIR}

