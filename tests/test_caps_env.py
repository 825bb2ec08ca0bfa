"""Sizes capped before allocation, environment variables parsed with a clear error and never at import (issue 64).

- a shard count (``--shard I/N``, ``--shard auto`` from a job array, `SweepPlan.shard`, `shard_cells`) above the
  cap ``shards`` is refused naming the value and the valid range, before a list of that length or a run folder
  exists; ``--workers`` and the emulated GPU count likewise;
- a malformed ``$WORKBENCH_LIMITS`` lets every module import (a subprocess: a fresh import), and the first size
  checked, or the command line, names the variable, its value and the form it takes, without a traceback;
- the sweep worker's own variables, malformed, end in a SystemExit naming them.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli, limits, workers
from workbench.arguments import parse_shard
from workbench.limits import LIMITS_ENV, LimitError, LimitsEnvError
from workbench.sweep import SweepPlan, check_shard, run_sweep, shard_cells, wall_seconds
from workbench.workers import CPU_WORKER_ENV, EMULATE_GPUS_ENV, STUDY_MODULES_ENV, check_gpus, parse_workers

REPO = Path(__file__).resolve().parents[1]
CAP = limits.Limits().shards
BAD_LIMITS = ["bogus", "frames=abc", "frames=-1", "frames=0", "nosuch=3", "frames=1e3", "frames=2.5", "=5",
              "frames=" + "9" * 40, "frames=\uff12\uff10", "frames=2000,,items", "frames==3"]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)


# --------------------------------------------------------------------------- the shard count


@pytest.mark.parametrize("text", [f"0/{CAP + 1}", "3/10000000000", "0/" + "9" * 200])
def test_a_shard_count_over_the_cap_is_refused_naming_value_and_range(text):
    with pytest.raises(SystemExit) as e:
        parse_shard(text)
    msg = str(e.value.code)
    assert f"--shard {text!r}" in msg and f"valid: 1..{CAP:,}" in msg and "'shards'" in msg
    assert f"{LIMITS_ENV}=shards=N" in msg


def test_the_largest_shard_count_within_the_cap_is_taken():
    assert parse_shard(f"{CAP - 1}/{CAP}") == (CAP - 1, CAP)
    assert len(shard_cells([], CAP)) == CAP


def test_a_job_arrays_task_count_over_the_cap_is_refused():
    env = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "50000000"}
    with pytest.raises(SystemExit, match=r"the job array says 3/50000000\).*50,000,000 exceeds the cap"):
        parse_shard("auto", env)
    with pytest.raises(SystemExit, match=r"SLURM_ARRAY_TASK_STEP='two'.*not a task index and count"):
        parse_shard("auto", {**env, "SLURM_ARRAY_TASK_STEP": "two"})


def test_the_shard_cap_can_be_raised_and_lowered_on_purpose(monkeypatch):
    with limits.raised(shards=8):
        with pytest.raises(SystemExit, match="valid: 1..8"):
            parse_shard("0/9")
        assert parse_shard("7/8") == (7, 8)
    monkeypatch.setenv(LIMITS_ENV, f"shards={CAP * 2}")
    assert parse_shard(f"0/{CAP * 2}") == (0, CAP * 2)


def test_a_huge_shard_count_on_the_command_line_leaves_no_run_folder(tmp_path):
    with pytest.raises(SystemExit, match="exceeds the cap"):
        cli.main(["sweep", "--results", str(tmp_path), "--direct", "--profile", "cpu", "--shard", "0/10000000000"])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("count", [10 ** 12, CAP + 1])
def test_the_python_api_checks_the_count_before_it_allocates(tmp_path, count):
    """`shard_cells` and a SweepPlan with a huge shard raise LimitError, not a MemoryError of a list of that
    length, and make no run folder."""
    with pytest.raises(LimitError, match=f"{count:,} exceeds the cap of {CAP:,}"):
        shard_cells([], count)
    plan = SweepPlan(studies=(), params={}, profile="cpu", results=tmp_path, name="x", shard=(0, count))
    with pytest.raises(LimitError, match=f"valid: 1..{CAP:,}"):
        run_sweep(plan)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0), (0, 2.0), "0/2", (True, 2), (0, 1, 2)])
def test_a_malformed_plan_shard_is_named(shard):
    with pytest.raises(ValueError) as e:
        check_shard(shard)
    assert f"shard={shard!r}" in str(e.value).replace("[", "(").replace("]", ")")
    assert f"0 <= index < count, count at most {CAP:,}" in str(e.value)


def test_the_wall_time_estimate_is_not_held_to_the_shard_cap():
    with limits.raised(shards=1):
        assert wall_seconds({"a": 3.0, "b": 2.0, "c": 1.0}, 2) == 3.0


# --------------------------------------------------------------------------- worker and GPU counts


@pytest.mark.parametrize("text", ["1025", "9" * 60])
def test_a_worker_count_over_the_cap_is_refused(text):
    with pytest.raises(SystemExit) as e:
        parse_workers(text)
    assert f"--workers {text!r}" in e.value.code and "valid: 1..1,024, or auto" in e.value.code


def test_an_emulated_gpu_count_is_checked(monkeypatch):
    for value in ("100000000", "65", "9" * 5000):
        monkeypatch.setenv(EMULATE_GPUS_ENV, value)
        with pytest.raises(SystemExit, match=f"{EMULATE_GPUS_ENV}='{value}': .*valid: 0..64"):
            check_gpus([0], "cpu")
    monkeypatch.setenv(EMULATE_GPUS_ENV, "0064")
    check_gpus([63], "cpu")
    monkeypatch.setenv(EMULATE_GPUS_ENV, "\u0663")       # a digit, but not an ASCII one
    with pytest.raises(SystemExit, match="give a number of GPUs to pretend"):
        check_gpus([0], "cpu")


# --------------------------------------------------------------------------- $WORKBENCH_LIMITS


def test_a_malformed_limits_variable_does_not_stop_any_import():
    """Every module of the package imports as it does without the variable (a benchmark script that refuses to run
    without a GPU refuses alike), the studies register, the CLI's parser builds and the presets exist."""
    code = ("import importlib, json, pkgutil, workbench\n"
            "out = {}\n"
            "for m in pkgutil.walk_packages(workbench.__path__, 'workbench.'):\n"
            "    if m.name == 'workbench.__main__': continue\n"
            "    try: importlib.import_module(m.name); out[m.name] = 'ok'\n"
            "    except BaseException as e: out[m.name] = type(e).__name__\n"
            "from workbench.studies import discover; discover()\n"
            "from workbench.arguments import build_parser; build_parser()\n"
            "import workbench as wb; assert wb.PRESET_NAMES\n"
            "print(json.dumps(out))")
    clean = _python(code)
    assert clean.returncode == 0, clean.stderr[-3000:]
    for bad in ("bogus", "frames=abc"):
        done = _python(code, **{LIMITS_ENV: bad})
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout == clean.stdout and done.stdout.count('"ok"') > 50


def test_the_first_size_checked_names_the_variable_its_value_and_the_form():
    done = _python("import workbench as wb\nwb.random_images(2)", **{LIMITS_ENV: "frames=abc"})
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench.limits.LimitsEnvError: WORKBENCH_LIMITS='frames=abc': frames must be a "
                           "positive integer (at most 30 digits), got 'abc'")
    assert "NAME=VALUE" in last and "whole number >= 1" in last


@pytest.mark.parametrize("bad", BAD_LIMITS)
def test_every_malformed_value_is_refused_at_first_use(monkeypatch, bad):
    monkeypatch.setenv(LIMITS_ENV, bad)
    with pytest.raises(LimitsEnvError) as e:
        limits.check("frames", 1, "a video of 1 frame")
    assert f"{LIMITS_ENV}={bad!r}" in str(e.value) and "expected comma-separated NAME=VALUE pairs" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(LimitsEnvError):
        limits.integer(3, "n", cap="items")


@pytest.mark.parametrize("args", [["info"], ["report", "--no-sweep"], ["sweep", "--workers", "2", "--direct"],
                                  ["sweep", "--shard", "0/2", "--direct"]])
def test_the_command_line_names_a_malformed_variable_without_a_traceback(tmp_path, args):
    done = subprocess.run([sys.executable, "-m", "workbench", *args, *(["--results", str(tmp_path)]
                                                                       if args[0] != "info" else [])],
                          cwd=REPO, env={**os.environ, LIMITS_ENV: "items=lots"}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{LIMITS_ENV}='items=lots': items must be a positive integer" in done.stderr and "got 'lots'" in done.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("text, want", [("frames=2000", 2000), ("frames=2_000", 2000), (" frames = 7 ,", 7),
                                        ("items=5,frames=9", 9)])
def test_a_well_formed_variable_sets_the_caps(monkeypatch, text, want):
    monkeypatch.setenv(LIMITS_ENV, text)
    assert limits.current().frames == want
    with pytest.raises(LimitError, match=f"cap of {want:,}"):
        limits.check("frames", want + 1, "frames")


# --------------------------------------------------------------------------- the sweep worker's variables


@pytest.mark.parametrize("var, value, match", [
    (CPU_WORKER_ENV, "first", "the worker's index, a whole number >= 0"),
    (CPU_WORKER_ENV, "-1", "the worker's index"),
    (STUDY_MODULES_ENV, "no_such_module_for_wb_tests", "cannot import 'no_such_module_for_wb_tests'"),
    (STUDY_MODULES_ENV, ".relative", "cannot import '.relative'"),
])
def test_a_workers_malformed_variable_is_named(tmp_path, monkeypatch, var, value, match):
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as e:
        workers.work(tmp_path, [], True, "python3")
    assert f"{var}={value!r}" in e.value.code and match in e.value.code


def test_a_results_variable_naming_an_unknown_home_is_named_without_a_traceback(tmp_path):
    import subprocess
    import sys
    env = {**os.environ, "WORKBENCH_RESULTS": "~no_such_user_of_this_machine/x"}
    out = subprocess.run([sys.executable, "-m", "workbench", "report", "--no-sweep"], env=env, capture_output=True,
                         text=True, cwd=tmp_path, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "WORKBENCH_RESULTS='~no_such_user_of_this_machine/x'" in out.stderr
