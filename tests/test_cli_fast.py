"""`sweep --help`, `report --help` and a refused `--set` answer without importing torch, from the
studies' declarations saved for this very source (any command that imports the studies saves
them); a copy made from another source is never used."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli, notebook_run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder holding the declarations of the registered studies."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = cli.write_declarations(cli.registered_studies())
    assert path is not None and path.is_file() and path.parent.parent == tmp_path
    return tmp_path


def run_cli(cache: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``python -X importtime -m workbench ARGS``; returns the process and the modules it imported."""
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "workbench", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    imported = [line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")]
    return p, imported


@pytest.mark.parametrize("command", ["sweep", "report"])
def test_help_lists_every_parameter_without_torch(cache, command):
    p, imported = run_cli(cache, command, "--help")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]
    assert "pandas" not in imported
    for name, study in cli.registered_studies().items():
        assert f"{name}:" in p.stdout
        for param in study.params.names:
            assert f"  {param} (" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["--set", "correctness.norms=bogus"], "--set: study 'correctness': norms='bogus' is not a valid choice"),
    (["--set", "nosuch=1"], "--set: no selected study takes ['nosuch']"),
    (["--studies", "nope"], "unknown studies ['nope']"),
    (["--set", "budgets=abc"], "budgets='abc' is not an integer"),
])
def test_a_refused_set_answers_without_torch(cache, args, message):
    p, imported = run_cli(cache, "sweep", *args)
    assert p.returncode != 0 and message in p.stderr
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


def test_declarations_of_another_source_are_not_used(cache, monkeypatch):
    assert cli.saved_declarations() is not None
    monkeypatch.setattr(cli, "_source_hash", lambda: "another-source")
    assert cli.saved_declarations() is None


def test_without_saved_declarations_help_imports_the_studies_and_saves_them(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cli.saved_declarations() is None
    text = cli._params_epilog()
    assert "correctness:" in text and cli.declarations_path().is_file()
    declared = cli.saved_declarations()
    assert sorted(declared) == sorted(cli.registered_studies())
    # the saved copy refuses what the studies refuse, with the same words
    studies = cli.registered_studies()
    for sets in ({"correctness": {"norms": ["bogus"]}}, {None: {"seed": -1}}):
        with pytest.raises(SystemExit) as full:
            cli._resolve_plan(sets, studies, list(studies.values()), "cpu")
        with pytest.raises(SystemExit) as fast:
            cli._resolve_plan(sets, declared, list(declared.values()), "cpu")
        assert str(fast.value) == str(full.value)


def _kernel(tmp_path: Path, monkeypatch, python: str) -> None:
    import json

    d = tmp_path / "share" / "jupyter" / "kernels" / notebook_run.PROJECT_KERNEL
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (workbench)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))


def test_sweeps_run_in_the_project_kernel_where_it_runs_this_interpreter(tmp_path, monkeypatch):
    _kernel(tmp_path, monkeypatch, sys.executable)
    assert notebook_run.default_kernel() == "workbench"
    args = cli.build_parser().parse_args(["sweep", "--direct"])
    assert args.kernel is None                       # resolved when the plan is made


def test_sweeps_fall_back_to_python3_without_the_project_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "nothing"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "nothing-either"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "no-prefix"))
    assert notebook_run.default_kernel() == "python3"


def test_a_project_kernel_of_another_interpreter_is_not_used(tmp_path, monkeypatch):
    _kernel(tmp_path, monkeypatch, str(tmp_path / "other-env" / "bin" / "python"))
    assert notebook_run.default_kernel() == "python3"


def test_the_notebooks_declare_the_project_kernel():
    import json

    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        spec = json.loads(nb.read_text(encoding="utf-8"))["metadata"]["kernelspec"]
        assert spec["name"] == notebook_run.PROJECT_KERNEL and spec["display_name"] == "Python (workbench)", nb.name


def test_a_study_registered_in_this_process_is_neither_saved_nor_refused(stubs):
    cli.write_declarations(cli.registered_studies())
    declared = cli.saved_declarations()
    assert "correctness" in declared and not set(stubs) & set(declared)
    args = cli.build_parser().parse_args(["sweep", "--studies", ",".join(stubs)])
    cli.precheck(args)                      # the registry of this process decides, not a saved copy
    assert set(stubs) <= set(s.name for s in cli._select(cli.registered_studies(), args.studies))
