"""Command line: ``python -m workbench {report,sweep,compare,info,notebooks}`` (also installed as ``workbench``).

- ``sweep``  runs the registered studies' notebooks through papermill into a new run folder
  ``results/<UTC time>-<sha>-<name>/`` (meta.json, <study>.parquet, executed <study>.ipynb), with
  each study's default parameters for the hardware profile (``cpu``: minutes on 2 cores; ``gpu``
  on a CUDA host).
- ``report`` is the main job: the default sweep, then ``results/report/index.html`` built from
  every run folder (local and committed reference runs). ``--no-sweep`` only rebuilds the page.
- ``compare`` prints every metric two runs both measured, with the ratio and what changed
  (workbench.compare).
- ``info``   prints the provenance record a run would store (git, packages, device, clocks).
- ``notebooks`` regenerates each study notebook's ``parameters`` cell from the study's parameter
  declaration (``--check`` only reports notebooks that are out of step).

Every ``--help`` and every refused argument answer without importing torch: the studies'
declarations (``studies/<name>/params.py``) and the names they take are torch-free.
Every ``--set`` is checked against the studies' declarations before a run folder exists; the
resolved values are what meta.json records and what the notebooks receive. A command turns its
arguments into a plan (workbench.sweep.SweepPlan), hands it to workbench.sweep and prints the
result; the parsed arguments go no deeper.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .notebook_run import FALLBACK_KERNEL, PROJECT_KERNEL, default_kernel, sync_notebook
from .provenance import collect_meta, results_root
from .report import NO_STUDY_MESSAGE, build_report
from .sweep import (DEVICE_OF_PROFILE, SweepPlan, SweepResult, find_run, interrupted_run, resume_sweep,
                    reusable_run, run_sweep)
from .workers import EMULATE_GPUS_ENV, check_gpus, work

# Everything heavy (torch, pandas, the studies) is imported inside the commands, so that --help and
# argument errors answer at once.


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
    if not wanted:
        raise SystemExit(f"--studies {names!r} names no study; give comma-separated names from {sorted(studies)}")
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


# --shard auto: where a scheduler's array task says which task it is, and how many there are
SHARD_SOURCES = (("Slurm", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"), ("torchrun", "RANK", "WORLD_SIZE"))


def _shard_from_env(env) -> tuple[int, int]:
    """(index, count) of this task from the first scheduler whose variables are set: a Slurm
    array's task id counted from its first id in steps of its step (--array=1-16:3 gives 0..5),
    else torchrun's RANK/WORLD_SIZE; SystemExit naming the variables where none is set."""
    for name, index_var, count_var in SHARD_SOURCES:
        if index_var not in env or count_var not in env:
            continue
        try:
            i, n = int(env[index_var]), int(env[count_var])
            if name == "Slurm":
                first, step = int(env.get("SLURM_ARRAY_TASK_MIN", 0)), int(env.get("SLURM_ARRAY_TASK_STEP", 1))
                i, rest = divmod(i - first, max(step, 1))
                if rest:
                    raise ValueError
        except ValueError:
            raise SystemExit(f"--shard auto: {index_var}={env[index_var]!r} with {count_var}={env[count_var]!r} "
                             f"is not a task index and count") from None
        return i, n
    wanted = "; ".join(f"{name}: {i} and {n}" for name, i, n in SHARD_SOURCES)
    raise SystemExit(f"--shard auto: no job array variables are set ({wanted}); give --shard I/N")


def parse_shard(text: str | None, env=None) -> tuple[int, int] | None:
    """``--shard 1/4`` -> (1, 4); ``--shard auto`` reads a job array's variables (`_shard_from_env`);
    SystemExit naming the bad value otherwise."""
    if text is None:
        return None
    if str(text).strip().lower() == "auto":
        i, n = _shard_from_env(os.environ if env is None else env)
        sep = "/"
    else:
        i, sep, n = str(text).partition("/")
        try:
            i, n = int(i), int(n)
        except ValueError:
            sep = ""
    if not sep or n < 1 or not 0 <= i < n:
        raise SystemExit(f"--shard {text!r}: give I/N with 0 <= I < N (shard I of N), e.g. --shard 0/2, or auto "
                         f"(a Slurm array task or a torchrun rank)" + (f"; the job array says {i}/{n}" if sep else ""))
    return i, n


NAME_MAX = 80      # characters of a run name: the folder adds a 25-character time and commit prefix


def parse_name(text: str | None) -> str | None:
    """``--name``: letters, digits, '.', '_' and '-' (others become '-'), at most NAME_MAX
    characters; SystemExit naming the bad value otherwise."""
    from .runstate import slug

    if text is None:
        return None
    name = slug(text, empty="")
    if not name:
        raise SystemExit(f"--name {text!r} has no letter or digit; give a short name such as --name smoke")
    if len(name) > NAME_MAX:
        raise SystemExit(f"--name is {len(name)} characters long; give at most {NAME_MAX}")
    return name


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
    g.add_argument("--kernel", default=None,
                   help=f"Jupyter kernel for papermill (default: the project's kernel {PROJECT_KERNEL!r}, which "
                        f"make lab registers, where it runs this interpreter; else {FALLBACK_KERNEL!r})")
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
    g.add_argument("--shard", metavar="I/N|auto",
                   help="run only shard I of N (0 <= I < N) of the selected studies' cells; auto: I and N "
                        "from a Slurm array task ($SLURM_ARRAY_TASK_ID, $SLURM_ARRAY_TASK_COUNT) or torchrun "
                        "($RANK, $WORLD_SIZE) (a study "
                        "split by preset where its cells are independent, else whole; dealt longest "
                        "first by the seconds the committed reference runs recorded, so every task "
                        "computes the same split), for a scheduler's job array: SLURM "
                        "(--shard $SLURM_ARRAY_TASK_ID/N), Kubernetes indexed jobs "
                        "($JOB_COMPLETION_INDEX), torchrun ($RANK/$WORLD_SIZE); the report merges the "
                        "shards of one run")
    g.add_argument("--group", metavar="NAME",
                   help="with --shard: the name the shards of one run share (default: $WORKBENCH_RUN_GROUP, "
                        "else $SLURM_ARRAY_JOB_ID, else <UTC date>-<git sha>-<name>)")


def _params_epilog() -> str:
    try:
        studies = registered_studies()
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


def _positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


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
    sub = parser.add_subparsers(dest="command", required=True, metavar="{report,sweep,compare,info,notebooks}",
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
    p.add_argument("--fresh", action="store_true",
                   help="sweep again even when a finished default sweep of this commit exists (by "
                        "default the report reuses it, and resumes an interrupted one)")
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

    p = sub.add_parser("compare", help="compare two runs: every metric both measured, the ratio, what changed",
                       description="Join the two runs' study tables on their parameter columns and print "
                                   "every metric present in both with the ratio b/a, flagging timings that "
                                   "moved beyond both runs' own p10-p90 spread and every verdict change "
                                   "(ok -> WRONG). From Python: workbench.compare.compare_runs(a, b).")
    p.add_argument("run_a", metavar="RUN_A", help="a run folder, a run name under --results or its reference/, "
                                                  "or 'latest'")
    p.add_argument("run_b", metavar="RUN_B", help="the same, for the second run (ratio = b / a)")
    _results_option(p, "folder holding the run folders")
    p.add_argument("--studies", metavar="A,B", help="only these studies")
    p.add_argument("--all", action="store_true", help="print every value, not only the flagged ones")
    p.add_argument("--rows", type=_positive_int, default=40, help="rows printed at most (default: %(default)s)")
    p.add_argument("--csv", type=Path, metavar="FILE",
                   help="write every compared value to this new CSV file (never inside a run folder)")
    p.add_argument("--force", action="store_true",
                   help="let --csv replace a CSV file that compare wrote before (no other file is ever replaced)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("notebooks", help="regenerate the notebooks' parameters cells from the studies",
                       description="Write each study's declared parameters (CPU defaults) into the "
                                   "cell tagged 'parameters' of its notebook.")
    p.add_argument("--check", action="store_true", help="only report files that are out of step "
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

