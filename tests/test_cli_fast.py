"""Every `--help` and every refused argument answers without importing torch or pandas, with no
cache of any kind: the studies' declarations (workbench/studies/<name>/params.py) and the names
they take (workbench.vocabulary, workbench.config) are torch-free modules."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli, notebook_path
from workbench.studies import discover

REPO = Path(__file__).resolve().parent.parent


def run_cli(cache: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``python -X importtime -m workbench ARGS`` with the cache folder ``cache``; returns the
    process and the modules it imported."""
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "workbench", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    imported = [line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")]
    return p, imported


def assert_light(imported: list[str]) -> None:
    """An instant answer imports neither torch (seconds) nor pandas (half a second)."""
    heavy = [m for m in imported if m.partition(".")[0] in ("torch", "pandas")]
    assert not heavy, f"imported {heavy[:3]}...: a study's params.py (or what it imports) is not torch-free"


@pytest.mark.parametrize("command", [[], ["sweep"], ["report"], ["compare"], ["info"], ["notebooks"]],
                         ids=lambda c: " ".join(c) or "top")
def test_every_help_answers_without_torch(tmp_path, command):
    p, imported = run_cli(tmp_path, *command, "--help")
    assert p.returncode == 0 and "usage: python -m workbench" in p.stdout, p.stderr[-2000:]
    assert_light(imported)
    assert not any(tmp_path.iterdir())                       # nothing cached
    if command in (["sweep"], ["report"]):
        for name, study in discover().items():
            assert f"{name}:" in p.stdout
            for param in study.params.names:
                assert f"  {param} (" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["sweep", "--set", "correctness.norms=bogus"], "--set: study 'correctness': norms='bogus' is not a valid choice"),
    (["sweep", "--set", "nosuch=1"], "--set: no selected study takes ['nosuch']"),
    (["sweep", "--set", "nosuch.depth=1"], "--set names unknown studies ['nosuch']"),
    (["sweep", "--studies", "nope"], "unknown studies ['nope']"),
    (["sweep", "--set", "budgets=abc"], "budgets='abc' is not an integer"),
    (["sweep", "--set", "seed=-1"], "seed=-1 is below the minimum 0"),
    # refused only by a rule of workbench.studies.params, which the saved declarations name
    (["sweep", "--studies", "cast_cost", "--set", "budgets=64,16"], "budgets=[64, 16]: must be strictly ascending"),
    (["sweep", "--studies", "cast_cost", "--set", "fills=[0.5,2]"], "[2.0] are not fractions in (0, 1]"),
    (["sweep", "--shard", "3/2"], "--shard '3/2'"),
    (["sweep", "--gpus", "0,0"], "--gpus '0,0'"),
    (["sweep", "--profile", "cpu", "--gpus", "0"], "--gpus 0: the cpu profile runs on the CPU"),
    (["sweep", "--name", "!!!"], "--name '!!!' has no letter or digit"),
    (["sweep", "--resume", "no-such-run"], "--resume 'no-such-run': no run folder"),
    (["report", "--set", "depth=0"], "depth=0 is below the minimum 1"),
    (["report", "--out", "README.md"], "report: refusing to write the report into"),
    (["compare", "no-such-run", "latest"], "compare: no run folder with tables named 'no-such-run'"),
    (["compare", "a", "b", "--rows", "0"], "--rows: '0' is not a whole number >= 1"),
    (["info", "--params", "[1]"], "info --params '[1]' is a JSON list"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_a_refused_argument_answers_without_torch(tmp_path, args, message):
    p, imported = run_cli(tmp_path, *args)
    assert p.returncode != 0 and message in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert_light(imported)


def test_the_declarations_import_neither_torch_nor_pandas_and_nothing_is_cached(tmp_path):
    code = ("import sys; from workbench.studies import discover; s = discover(); "
            "print(sorted(s), [m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules])")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().endswith("[]") and "correctness" in out, out
    assert not any(tmp_path.iterdir())
    assert not list((REPO / "workbench" / "studies").glob("*.json"))


def _kernel(tmp_path: Path, monkeypatch, python: str) -> None:
    import json

    d = tmp_path / "share" / "jupyter" / "kernels" / notebook_path.PROJECT_KERNEL
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (workbench)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))


def test_sweeps_run_in_the_project_kernel_where_it_runs_this_interpreter(tmp_path, monkeypatch):
    _kernel(tmp_path, monkeypatch, sys.executable)
    assert notebook_path.default_kernel() == "workbench"
    args = cli.build_parser().parse_args(["sweep", "--direct"])
    assert args.kernel is None                       # resolved when the plan is made


def test_sweeps_fall_back_to_python3_without_the_project_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "nothing"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "nothing-either"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "no-prefix"))
    assert notebook_path.default_kernel() == "python3"


def test_a_project_kernel_of_another_interpreter_is_not_used(tmp_path, monkeypatch):
    _kernel(tmp_path, monkeypatch, str(tmp_path / "other-env" / "bin" / "python"))
    assert notebook_path.default_kernel() == "python3"


def test_the_notebooks_declare_the_project_kernel():
    import json

    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        spec = json.loads(nb.read_text(encoding="utf-8"))["metadata"]["kernelspec"]
        assert spec["name"] == notebook_path.PROJECT_KERNEL and spec["display_name"] == "Python (workbench)", nb.name


def test_a_study_registered_in_this_process_is_not_refused(stubs):
    args = cli.build_parser().parse_args(["sweep", "--studies", ",".join(stubs)])
    cli.precheck(args)                      # the registry of this process decides
    assert set(stubs) <= set(s.name for s in cli.select_studies(discover(), args.studies))
