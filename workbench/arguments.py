"""The parser of ``python -m workbench`` and the checks of its option values, its types: a bad value raises
SystemExit naming value and choices while the command line is parsed, before anything runs."""
from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

from . import limits
from .engines import ENGINES, NEWEST as ENGINE_DEFAULT
from .provenance import results_root
from .results import slug
from .notebook_path import FALLBACK_KERNEL, PROJECT_KERNEL
from .studies import discover       # the declarations: torch-free
from .workers import parse_workers


def parse_sets(items: Sequence[str]) -> dict[str | None, dict[str, Any]]:
    """{study (None: all): {KEY: VALUE}} of ``[STUDY.]KEY=VALUE``s; VALUE is JSON where it parses, else a string."""
    out: dict[str | None, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE or STUDY.KEY=VALUE, got {item!r}")
        study, dot, name = key.rpartition(".")
        try:
            value = json.loads(value)
        except ValueError:
            pass
        out.setdefault(study if dot else None, {})[name] = value
    return out


def select_studies(studies: dict, names: str | None) -> list:
    """The studies ``--studies`` names (comma-separated, in that order; empty or None: every
    registered study, by name); SystemExit for a list that names none, or naming the registered
    ones for an unknown name."""
    if not names:
        return [studies[k] for k in sorted(studies)]
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        raise SystemExit(f"--studies {names!r} names no study; give comma-separated names from {sorted(studies)}")
    unknown = [n for n in wanted if n not in studies]
    if unknown:
        raise SystemExit(f"unknown studies {unknown}; registered: {sorted(studies) or 'none'}")
    return [studies[n] for n in wanted]


def parse_gpus(text: str) -> list[int]:
    """``--gpus 0,1`` -> [0, 1]; SystemExit naming the bad value otherwise."""
    try:
        ids = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise SystemExit(f"--gpus {text!r}: give distinct GPU indices separated by commas, e.g. --gpus 0,1")
    return ids


# --shard auto: a job array's task index and count (Slurm counts from its first id in steps)
SHARD_SOURCES = (("Slurm", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"), ("torchrun", "RANK", "WORLD_SIZE"))


def _shard_from_env(env) -> tuple[int, int]:
    for name, index_var, count_var in SHARD_SOURCES:
        if index_var in env and count_var in env:
            try:
                i, n = int(env[index_var]), int(env[count_var])
                if name == "Slurm":
                    step = max(int(env.get("SLURM_ARRAY_TASK_STEP", 1)), 1)
                    i, rest = divmod(i - int(env.get("SLURM_ARRAY_TASK_MIN", 0)), step)
                    if rest:
                        raise ValueError
            except ValueError:
                extra = "".join(f" and {v}={env[v]!r}" for v in ("SLURM_ARRAY_TASK_STEP", "SLURM_ARRAY_TASK_MIN")
                                if name == "Slurm" and v in env)
                raise SystemExit(f"--shard auto: {index_var}={env[index_var]!r} with {count_var}={env[count_var]!r}"
                                 f"{extra} is not a task index and count (whole numbers, the index a task of the "
                                 f"array)") from None
            return i, n
    wanted = "; ".join(f"{name}: {i} and {n}" for name, i, n in SHARD_SOURCES)
    raise SystemExit(f"--shard auto: no job array variables are set ({wanted}); give --shard I/N")


def parse_shard(text: str, env=None) -> tuple[int, int]:
    """``--shard 1/4`` -> (1, 4); ``auto``: from a job array's variables; SystemExit otherwise, a count over the
    cap ``shards`` included (before the sweep deals its cells into that many shards)."""
    auto = str(text).strip().lower() == "auto"
    if auto:
        (i, n), sep = _shard_from_env(os.environ if env is None else env), "/"
    else:
        i, sep, n = str(text).partition("/")
        try:
            i, n = int(i), int(n)
        except ValueError:
            sep = ""
    why = ("not two whole numbers I/N" if not sep else f"N={n} is no count of shards" if n < 1 else
           f"I={i} is negative" if i < 0 else f"I={i} is not below N={n} (shards count from 0)" if i >= n else "")
    if why:
        try:
            most = f"{limits.current().shards:,}"
        except ValueError:      # a malformed $WORKBENCH_LIMITS: named by the count's check, not here
            most = "the cap 'shards'"
        raise SystemExit(f"--shard {text!r}: {why}" + (f" (the job array says {i}/{n})" if auto else "")
                         + f"; --shard takes I/N with 0 <= I < N <= {most} (shard I of N), e.g. --shard 0/2, or auto "
                         f"(a Slurm array task or a torchrun rank)")
    try:
        check_shard_count(n, f"--shard {text!r}" + (f" (the job array says {i}/{n})" if auto else ""))
    except ValueError as e:       # over the cap, or a malformed $WORKBENCH_LIMITS
        raise SystemExit(str(e)) from None
    return i, n


# options whose value may start with '-' and a digit (--shard -1/2): argparse reads such a value as an unknown option
# and says only "expected one argument"; glued to its option (--shard=-1/2), it reaches the option's own check
DASH_VALUE_OPTIONS = ("--shard",)


def glue_dash_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with each value of DASH_VALUE_OPTIONS that starts with '-' and a digit glued to its option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in DASH_VALUE_OPTIONS and re.match(r"-\d", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def check_shard_count(n: int, what: str) -> int:
    """``n`` when it is within the cap ``shards``; LimitError naming ``what``, the value and the valid range."""
    cap = limits.current().shards
    return limits.check("shards", n, f"{what}: a count of shards (valid: 1..{cap:,})")


NAME_MAX = 80      # characters of a run name: the folder adds a 25-character time and commit prefix


def parse_name(text: str) -> str:
    """``--name``: letters, digits, '.', '_' and '-' (others become '-'), at most NAME_MAX characters."""
    name = slug(text, empty="")
    if not name:
        raise SystemExit(f"--name {text!r} has no letter or digit; give a short name such as --name smoke")
    if len(name) > NAME_MAX:
        raise SystemExit(f"--name is {len(name)} characters long; give at most {NAME_MAX}")
    return name


def _number(cast, valid, what: str):
    """An argparse type: ``cast(text)`` where ``valid`` holds for it, else an error saying it is not ``what``."""
    def convert(text: str):
        try:
            if valid(cast(text)):
                return cast(text)
        except ValueError:
            pass
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return convert


def _given(valid: str, cast=str):
    """An argparse type: ``cast(text)``, refusing an empty or blank value, which would otherwise mean the default
    (every study, a new sweep instead of a resume) or the current folder, silently; the error says ``valid``."""
    def convert(text: str):
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is empty; give {valid() if callable(valid) else valid}")
        return cast(text)
    return convert


def _study_names() -> str:
    return "comma-separated study names from " + ", ".join(sorted(discover()))


_positive_int = _number(int, lambda n: n >= 1, "a whole number >= 1")
_minutes = _number(float, lambda m: 0 < m < float("inf"), "a number of minutes > 0 (e.g. 15 or 2.5)")


def _add_sweep_options(p: _Parser) -> None:
    p.params_epilog = True      # --set takes the studies' parameters: the help lists them
    g = p.add_argument_group("sweep")
    g.add_argument("--profile", choices=("auto", "cpu", "gpu", "gpu-full"), default="auto",
                   help="default parameters to use: auto = gpu on a CUDA host, else cpu; gpu is the decision set "
                        "(the cells the answer and the advice read), gpu-full every GPU cell: the full grids, "
                        "the 12 MP photos, the long streams (default: %(default)s)")
    g.add_argument("--studies", metavar="A,B", type=_given(_study_names),
                   help="comma-separated studies to run (default: every registered study)")
    g.add_argument("--set", action="append", metavar="[STUDY.]KEY=VALUE",
                   help="override a parameter, for every study or for one (repeatable; VALUE is JSON where it "
                        "parses, else a string)")
    g.add_argument("--name", type=parse_name, help="suffix of the run folder name (default: the profile)")
    g.add_argument("--max-minutes", type=_minutes, metavar="N",
                   help="refuse, before anything runs, a sweep predicted to take longer (the prediction, from the "
                        "newest timed runs of the profile scaled by tower FLOPs, is printed before every sweep)")
    g.add_argument("--fit", action="store_true", help="with --max-minutes: trim the studies' repetitions (reps, "
                                                      "warmup, min_reps) to fit instead of refusing")
    g.add_argument("--direct", action="store_true", help="call the studies' run functions in this process "
                                                         "instead of executing their notebooks with papermill")
    g.add_argument("--kernel", default=None, type=_given("the name of an installed Jupyter kernel"),
                   help=f"Jupyter kernel for papermill (default: the project's kernel {PROJECT_KERNEL!r}, which "
                        f"make lab registers, where it runs this interpreter; else {FALLBACK_KERNEL!r})")
    g.add_argument("--resume", metavar="RUN", type=_given("a run folder, or a folder name under --results"),
                   help="finish an interrupted run folder (a path, or a folder name under --results): only the "
                        "studies without a table run, with the parameters its meta.json recorded")
    g.add_argument("--resume-finished", action="store_true",
                   help="with --resume: also finish a run that finished without failures but lacks a stage (what "
                        "it recorded stays; the resume is added to its meta.json)")
    g.add_argument("--gpus", type=parse_gpus, metavar="0,1,...",
                   help="spread the studies over these GPUs of this host: one worker process per GPU "
                        "(CUDA_VISIBLE_DEVICES set to it, so each notebook runs on its own device, and OMP_NUM_THREADS "
                        "to its share of the host's cores unless set), each taking the next study nobody has taken")
    g.add_argument("--workers", type=parse_workers, metavar="N|auto",
                   help="cpu profile: run the studies in N worker processes side by side (OMP_NUM_THREADS set to "
                        "each one's share of the cores unless set), the longest first; auto: one per core, at most "
                        "one per study (default: auto for report, 1 for sweep: one after the other in this process)")
    g.add_argument("--shard", type=parse_shard, metavar="I/N|auto",
                   help="run only shard I of N of the selected studies' cells, for a job array (auto: I and N "
                        "from $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT or torchrun's $RANK/$WORLD_SIZE); "
                        "cells are dealt longest first by the reference runs' seconds, so every task computes "
                        "the same split, and the report merges the shards of one run")
    g.add_argument("--group", metavar="NAME", type=_given("the name the shards of one run share"),
                   help="with --shard: the name the shards of one run share (default: $WORKBENCH_RUN_GROUP, else "
                        "$SLURM_ARRAY_JOB_ID, else <UTC date>-<git sha>-<name>)")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help, with ``params_epilog``, ends with the studies' parameters (imported then only)."""
    params_epilog = False

    def format_help(self) -> str:
        if self.params_epilog and self.epilog is None:
            try:
                studies = discover()
            except Exception as e:  # noqa: BLE001 - --help must work even if a study module is broken
                self.epilog = f"(study parameters unavailable: {e})"
            else:
                self.epilog = "\n".join(
                    ["study parameters (--set KEY=VALUE for every study that has KEY, --set STUDY.KEY=VALUE for one;",
                     "lists take JSON, a comma-separated string or one value):"]
                    + [f"{name}:\n{study.params.describe('  ')}" for name, study in sorted(studies.items())])
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m workbench", description="Vision-encoder input-normalization workbench: run the "
                                                             "studies, build the report, show provenance.",
                     epilog="Run folders are results/<UTC time>-<git sha>-<name>/ with meta.json and one "
                            "<study>.parquet per study; committed GPU reference runs live in results/reference/.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="{report,sweep,compare,advise,audit,info,notebooks}")

    def command(name: str, results: str | None = None, **kw) -> argparse.ArgumentParser:
        p = sub.add_parser(name, **kw)
        if results:
            p.add_argument("--results", type=_given("a folder", Path), metavar="DIR", default=results_root(),
                           help=f"{results} (default: the project's results/, or $WORKBENCH_RESULTS when set; "
                                f"the same whatever the working directory)")
        return p

    sweeps = dict(formatter_class=argparse.RawDescriptionHelpFormatter)
    p = command("report", "folder holding the run folders", **sweeps,
                help="the main job: default sweep, then results/report/index.html",
                description="Run the default sweep for this hardware (unless --no-sweep), then build "
                            "<results>/report/index.html from every run folder.")
    p.add_argument("--out", type=_given("a folder", Path), metavar="DIR",
                   help="where to write the report (default: <results>/report)")
    p.add_argument("--no-sweep", action="store_true", help="only rebuild the report from the run folders already there")
    p.add_argument("--no-cache", action="store_true",
                   help="draw every figure again: neither read nor keep <results>/.cache/report/, where the report "
                        "keeps what it drew, reused while the runs' tables and the code are unchanged")
    p.add_argument("--fresh", action="store_true",
                   help="sweep again even when a finished default sweep of this commit exists (by default the "
                        "report reuses it, and resumes an interrupted one)")
    _add_sweep_options(p)
    _add_sweep_options(command("sweep", "where the new run folder goes", **sweeps,
                               help="run the studies into a new run folder",
                               description="Run the registered studies (their notebooks, via papermill) "
                                           "into a new run folder under --results."))

    p = command("info", help="print this machine's provenance record as JSON",
                description="Print the meta.json record a run started now would store.")
    p.add_argument("--params", metavar="JSON", help="parameters to include, as a JSON object")

    p = command("compare", "folder holding the run folders",
                help="compare two runs: every metric both measured, the ratio, what changed",
                description="Join the two runs' study tables on their parameter columns and print every metric "
                            "present in both with the ratio b/a, flagging timings that moved beyond both runs' own "
                            "p10-p90 spread and every verdict change (ok -> WRONG). From Python: "
                            "workbench.compare.compare_runs(a, b).")
    run_spec = _given("a run folder, a run name under --results or its reference/, or 'latest'")
    p.add_argument("run_a", metavar="RUN_A", type=run_spec,
                   help="a run folder, a run name under --results or its reference/, or 'latest'")
    p.add_argument("run_b", metavar="RUN_B", type=run_spec, help="the same, for the second run (ratio = b / a)")
    p.add_argument("--studies", metavar="A,B", type=_given(_study_names), help="only these studies")
    p.add_argument("--all", action="store_true", help="print every value, not only the flagged ones")
    p.add_argument("--rows", type=_positive_int, default=40, help="rows printed at most (default: %(default)s)")
    p.add_argument("--csv", type=_given("a file name", Path), metavar="FILE",
                   help="write every compared value to this new CSV file (never inside a run folder)")
    p.add_argument("--force", action="store_true",
                   help="let --csv replace a CSV file that compare wrote before (no other file is ever replaced)")

    p = command("advise", "folder holding the run folders",
                help="a configuration an engine can take, for one tower and one traffic mix",
                description="Where to normalize (the newest correctness and cast_cost runs, among the placements "
                            "the engine can apply), the engine release's default graph budgets against the planner's "
                            "judged out of sample, and that release's own options. Numbers come from run folders "
                            "only; what none measured is named with the command that would measure it.")
    p.add_argument("--preset", required=True, type=_given("a preset name or a transformers model folder"),
                   help="a preset name or a transformers model folder")
    p.add_argument("--mix", help="a named image mix (default photos)")
    p.add_argument("--set", action="append", metavar="image_folder=PATH", help="the mix of a folder of your images")
    p.add_argument("--max-graphs", type=_positive_int, help="budgets to plan (default: as many as the engines' "
                                                             "powers of two up to the mix's largest item)")
    p.add_argument("--engine", default=ENGINE_DEFAULT, choices=tuple(ENGINES),
                   help="the engine release whose budgets and options the advice speaks (default: %(default)s)")
    p.add_argument("--engine-cap", type=int, metavar="TOKENS",
                   help="the release's largest auto-generated budget (vLLM 0.34: encoder_cudagraph_max_token_budget, "
                        "default 5120)")
    p.add_argument("--engine-source", metavar="PATH", type=_given("the engine's source tree, package folder or wheel"),
                   help="that release's source tree, package folder or wheel: every option name printed is checked "
                        "against it")
    p.add_argument("--json", action="store_true", help="print the advice as JSON")

    p = command("audit", "folder whose audits/ keeps each audit (the report shows the newest)",
                help="where a serving engine's model files normalize, read statically",
                description="Read a vLLM source tree, installed package or wheel with Python's ast (nothing is "
                            "imported): per model class, device normalization, where the norm runs, encoder CUDA "
                            "graphs, and the correctness matrix's verdict. Exit 1 when a class needs attention.")
    p.add_argument("path", metavar="PATH", type=_given("a vLLM source tree, its installed package folder, or a wheel"),
                   help="a vLLM source tree, its installed package folder, or a wheel")
    p.add_argument("new", metavar="NEW", nargs="?", type=_given("a second vLLM source tree, package folder or wheel"),
                   help="a second one (a newer release): print what changed from PATH to NEW, exit 1 when a class "
                        "of NEW needs attention, keep only NEW's audit")
    p.add_argument("--json", action="store_true", help="print the audit as JSON")
    p.add_argument("--no-save", action="store_true", help="do not keep it under <results>/audits/")

    p = command("notebooks", help="regenerate the notebooks' parameters cells from the studies",
                description="Write each study's declared parameters (CPU defaults) into the cell tagged "
                            "'parameters' of its notebook.")
    p.add_argument("--check", action="store_true", help="only report files that are out of step (exit 1 if any)")
    parser.subcommands = sub.choices
    return parser
