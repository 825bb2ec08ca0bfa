"""The project's environment descriptions agree with each other, and the entry points exist.

pyproject.toml is the single source of dependencies; environment.yml (conda), the Makefile,
tools/gpu-wheels.txt (the GPU host's offline bundle) and .ci/run must not drift from it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
BINDING_TARGETS = ("help", "setup", "test", "report", "sweep", "lab", "wheels", "clean")
# conda's own packages, not Python distributions that pyproject could list
CONDA_ONLY = {"python", "pip"}


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def env_text() -> str:
    return (ROOT / "environment.yml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def env(env_text) -> dict:
    return yaml.safe_load(env_text)


def _pip_section(env: dict) -> list[str]:
    for dep in env["dependencies"]:
        if isinstance(dep, dict) and "pip" in dep:
            return [str(x) for x in dep["pip"]]
    return []


def _conda_specs(env: dict) -> dict[str, str]:
    """conda dependencies as name -> version text ('' when unpinned)."""
    specs = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            m = re.match(r"^([A-Za-z0-9_.-]+)\s*(?:[=<>!~]=?\s*(.*))?$", dep.strip())
            assert m, f"cannot read conda dependency {dep!r}"
            specs[m.group(1).lower()] = (m.group(2) or "").strip()
    return specs


def _project_requirements(pyproject: dict) -> dict[str, list[Requirement]]:
    """Every requirement pyproject names (core and extras), by canonical name."""
    project = pyproject["project"]
    reqs = [Requirement(r) for r in project.get("dependencies", [])]
    for extra in project.get("optional-dependencies", {}).values():
        reqs += [Requirement(r) for r in extra]
    by_name: dict[str, list[Requirement]] = {}
    for r in reqs:
        by_name.setdefault(canonicalize_name(r.name), []).append(r)
    return by_name


def _pins_in_comments(text: str) -> list[tuple[str, str]]:
    """``name==version`` pins mentioned in environment.yml's comments (e.g. the CPU torch)."""
    pins = []
    for line in text.splitlines():
        if "#" in line:
            comment = line.split("#", 1)[1]
            pins += re.findall(r"\b([A-Za-z][A-Za-z0-9_.-]*)==([0-9][A-Za-z0-9.+!-]*)", comment)
    return pins


# --------------------------------------------------------------------------- environment.yml


def test_environment_names_the_workbench_env(env):
    assert env["name"] == "workbench"
    assert "pip" in _conda_specs(env), "the env needs pip for its pip section"


def test_environment_python_satisfies_requires_python(env, pyproject):
    version = _conda_specs(env).get("python")
    assert version, "environment.yml must pin python"
    version = version.rstrip(".*")
    spec = SpecifierSet(pyproject["project"]["requires-python"])
    # conda's `python=3.11` means any 3.11.x: its first and a late patch release must both fit
    for patch in ("0", "99"):
        assert spec.contains(Version(f"{version}.{patch}")), (
            f"python={version} in environment.yml is outside requires-python {spec}")


def test_environment_installs_the_project_with_every_extra(env, pyproject):
    editable = [e for e in _pip_section(env) if e.startswith("-e") or e.startswith(".")]
    assert editable, "environment.yml must install the project itself from its pip section"
    m = re.search(r"\[([^\]]*)\]", editable[0])
    named = {x.strip() for x in m.group(1).split(",")} if m else set()
    declared = set(pyproject["project"].get("optional-dependencies", {}))
    assert named <= declared, f"extras {sorted(named - declared)} are not in pyproject.toml"
    assert named == declared, (
        f"environment.yml leaves out extras {sorted(declared - named)}: not the same environment")


def test_pinned_packages_are_pyproject_dependencies(env, env_text, pyproject):
    known = _project_requirements(pyproject)
    pins: list[tuple[str, str]] = []
    for name, version in _conda_specs(env).items():
        if name not in CONDA_ONLY:
            pins.append((name, version))
    for entry in _pip_section(env):
        if entry.startswith("-") or entry.startswith("."):
            continue
        req = Requirement(entry)
        pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
        pins.append((req.name, pinned[0] if pinned else ""))
    pins += _pins_in_comments(env_text)
    for name, version in pins:
        key = canonicalize_name(name)
        assert key in known, f"{name} is pinned in environment.yml but is not in pyproject.toml"
        if version and re.match(r"^[0-9]", version):
            for req in known[key]:
                assert req.specifier.contains(Version(version.rstrip(".*")), prereleases=True), (
                    f"{name}=={version} in environment.yml contradicts pyproject's {req}")


def test_cpu_torch_pin_is_the_same_in_makefile_and_environment(env_text):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    m = re.search(r"^CPU_TORCH\s*:?=\s*torch==(\S+)", makefile, re.M)
    assert m, "the Makefile must pin the CPU torch as CPU_TORCH := torch==VERSION"
    env_torch = {v for n, v in _pins_in_comments(env_text) if n == "torch"}
    assert env_torch == {m.group(1)}, (
        f"Makefile installs torch=={m.group(1)} on CPU, environment.yml says {env_torch}")


# --------------------------------------------------------------------------- Makefile


def _make_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        env.pop(var, None)
    return env


def test_makefile_has_every_binding_target_with_a_description():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    described = dict(re.findall(r"^([A-Za-z][A-Za-z0-9_-]*):[^#\n=]*##[ \t]*(\S.*)$", text, re.M))
    missing = [t for t in BINDING_TARGETS if t not in described]
    assert not missing, f"Makefile targets without a `## description`: {missing}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_is_the_default_goal_and_lists_the_targets():
    run = lambda *a: subprocess.run(["make", "-s", "-C", str(ROOT), *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=60, env=_make_env())
    helped = run("help")
    assert helped.returncode == 0, helped.stderr
    listed = {line.split()[0] for line in helped.stdout.splitlines() if line.startswith("  ")}
    missing = [t for t in BINDING_TARGETS if t not in listed]
    assert not missing, f"`make help` does not list {missing}:\n{helped.stdout}"
    default = run()
    assert default.returncode == 0, default.stderr
    assert default.stdout == helped.stdout, "`make` alone must run `help`"


# --------------------------------------------------------------------------- CI and GPU bundle


def test_ci_run_calls_make_test():
    ci = ROOT / ".ci" / "run"
    text = ci.read_text(encoding="utf-8")
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    assert text.startswith("#!") and "bash" in text.splitlines()[0]
    assert re.search(r"^\s*set -euo pipefail\b", text, re.M)
    assert re.search(r"^\s*(exec\s+)?make\b[^\n#]*\btest\b", text, re.M), ".ci/run must run make test"


def test_gpu_wheel_list_is_pinned_and_covers_the_notebook_stack():
    lines = [line.split("#", 1)[0].strip()
             for line in (ROOT / "tools" / "gpu-wheels.txt").read_text().splitlines()]
    reqs = [Requirement(line) for line in lines if line]
    for r in reqs:
        ops = [s.operator for s in r.specifier]
        assert ops == ["=="], f"{r} in tools/gpu-wheels.txt must be pinned with =="
    names = {canonicalize_name(r.name) for r in reqs}
    assert len(names) == len(reqs), "tools/gpu-wheels.txt names a package twice"
    for needed in ("papermill", "nbclient", "nbformat", "jupyter-client", "ipykernel"):
        assert needed in names, f"tools/gpu-wheels.txt lacks {needed}"
    # torch and friends come with the GPU image: never ship them in the bundle
    assert not names & {"torch", "triton", "nvidia-ml-py", "numpy"}
