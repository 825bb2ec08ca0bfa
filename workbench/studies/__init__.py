"""The registry of studies.

A study answers one question (see the table in the design brief) and has four parts:

- a **parameter declaration** ``PARAMS = ParamSpec(Param(...), ...)`` (workbench.studies.params):
  each parameter once, with kind, allowed values, CPU default and GPU default. It generates the
  notebook's ``parameters`` cell, checks the sweep's ``--set`` values before a run folder exists,
  feeds ``--help``, and its resolved values are what meta.json records.
- a **run function** ``run(device="auto", progress=True, **params) -> pandas.DataFrame`` that
  resolves ``params`` against the declaration (the device's profile supplies the defaults),
  measures, and returns one tidy long table (workbench.studies.tables): parameter columns with
  ``device`` among them, then ``metric``, ``value``, ``unit``. It never plots nor writes files.
- a **summarize function** ``summarize(table, out_dir) -> Summary | str`` that turns the tables of
  every run found under results/ into figures (PNG and SVG saved in ``out_dir``) and a short
  written finding that names the device. ``table`` is all runs' tables concatenated, with
  ``run`` (folder name) and ``reference`` (True for runs committed under results/reference/)
  added by the report. It never runs a model.
- a **notebook** ``notebooks/<name>.ipynb``: thin; its parameters cell is generated from the
  declaration (``python -m workbench notebooks``), it calls `notebook_params`, the run function,
  `save_table`, and the summarize module's plot functions.

Each study lives in its own module in this package and registers itself at import time;
``discover()`` imports every module, so a new study is picked up by the sweep, the report and the
command line without touching them. ``STUDIES`` maps name -> Study.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .params import PROFILES, Param, ParamError, ParamSpec
from .tables import TableError, check_table, load_table, tidy, wide, write_study_table

__all__ = ["PROFILES", "Param", "ParamError", "ParamSpec", "Study", "Summary", "STUDIES", "register",
           "discover", "default_profile", "profile_of", "notebook_params", "save_table", "TableError",
           "check_table", "load_table", "tidy", "wide", "write_study_table"]


@dataclass
class Summary:
    """What a study's summarize function gives the report: the finding in a few sentences
    (plain text, paragraphs separated by blank lines), the figure files (PNG/SVG) it saved, as
    absolute paths or paths relative to the ``out_dir`` it was given (an absolute folder), and
    small tables of the key numbers (columns named with their units)."""

    text: str
    figures: list[Path] = field(default_factory=list)
    tables: list[tuple[str, Any]] = field(default_factory=list)   # (caption, pandas DataFrame) to show


@dataclass(frozen=True)
class Study:
    name: str
    notebook: str                               # path relative to the project root
    run: Callable[..., Any]                     # run(device=..., **params) -> tidy DataFrame
    summarize: Callable[[Any, Path], Summary | str]
    params: ParamSpec                           # the one declaration of its parameters
    question: str = ""

    def resolve(self, profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The profile's defaults with ``overrides`` applied, every value checked (ParamError)."""
        return self.params.resolve(overrides, profile, study=self.name)


STUDIES: dict[str, Study] = {}


def register(study: Study) -> Study:
    """Add ``study`` to STUDIES. Registering the same name twice from different objects is an
    error (re-importing the same module is not)."""
    old = STUDIES.get(study.name)
    if old is not None and old is not study and (
            getattr(old.run, "__module__", None) != getattr(study.run, "__module__", None)):
        raise ValueError(f"study {study.name!r} is registered twice")
    STUDIES[study.name] = study
    return study


def discover() -> dict[str, Study]:
    """Import every study module in this package (each registers itself) and return STUDIES."""
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    return STUDIES


def default_profile() -> str:
    """``gpu`` where torch sees a CUDA device, else ``cpu``."""
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"


def profile_of(device: Any) -> str:
    """The parameter profile that suits a device: ``gpu`` for CUDA (or ``auto`` on a CUDA host)."""
    name = str(device)
    if name == "auto" or device is None:
        return default_profile()
    return "gpu" if name.startswith("cuda") else "cpu"


def notebook_params(name: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The study's declared parameters from a notebook's globals, checked and coerced (the cell
    after ``parameters`` calls this, so a bad papermill value fails before any work)."""
    study = discover()[name]
    return study.params.from_namespace(namespace, study=name)


def save_table(study_name: str, table: Any, run_dir: str | Path | None = None,
               params: Mapping[str, Any] | None = None, results_root: str | Path | None = None) -> Path:
    """Check ``table`` against the study table format and write ``<run_dir>/<study_name>.parquet``
    atomically; returns its path.

    A notebook run by the sweep gets ``run_dir`` from it (meta.json is the sweep's). Run
    interactively with ``run_dir=None``, a new run folder is made under ``results_root`` (default:
    the project's results/, whatever the working directory) with its own meta.json recording
    ``params``, so an interactive result is never mixed into, nor overwrites, a finished run. An
    existing table of the same study in ``run_dir`` is refused rather than replaced.
    """
    from ..provenance import REPO_ROOT, collect_meta, finish_meta, new_run_dir, write_meta

    table = check_table(table, name=f"{study_name} table")
    own_meta = run_dir is None
    if own_meta:
        root = Path(results_root) if results_root is not None else REPO_ROOT / "results"
        run_dir = new_run_dir(root, name=f"{study_name}-interactive")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{study_name}.parquet"
    if path.exists():
        raise FileExistsError(f"{path} exists; a finished run's table is never overwritten (use a new run_dir)")
    if own_meta:
        meta = collect_meta({"studies": {study_name: dict(params or {})}, "mode": "interactive"})
    write_study_table(table, path)
    if own_meta:
        write_meta(run_dir, finish_meta(meta))
    return path
