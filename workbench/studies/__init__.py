"""The registry of studies.

A study answers one question (see the table in the design brief) and has three parts:

- a **run function** ``run(**params) -> pandas.DataFrame`` that measures and returns one tidy,
  long-format table: the parameter columns, then ``metric``, ``value``, ``unit``; one row per
  measurement. It may be slow; it never plots and never writes files.
- a **summarize (plot) function** ``summarize(table, out_dir) -> Summary | str`` that turns the
  tables of every run found under results/ into figures (PNG/SVG saved in ``out_dir``) and a
  short written finding. ``table`` is all runs' tables concatenated, with three columns added by
  the report: ``run`` (folder name), ``device`` (from the run's meta.json) and ``reference``
  (True for runs committed under results/reference/, e.g. measured on a GPU host). It never
  runs a model.
- a **notebook** ``notebooks/<name>.ipynb``: a thin papermill-parameterized front end that calls
  the run function, writes ``<run_dir>/<name>.parquet`` with ``workbench.provenance.write_table``
  and shows the summarize function's figures inline. Its cell tagged ``parameters`` holds the CPU
  defaults plus ``device = "auto"`` and ``run_dir``; the sweep passes ``device``, ``run_dir`` and
  the study's default parameters for the hardware profile.

Each study lives in its own module in this package, and registers itself at import time:

    from workbench.studies import Study, register

    register(Study(
        name="correctness",
        notebook="notebooks/correctness.ipynb",
        run=run, summarize=summarize,
        defaults={"cpu": {...small, minutes on 2 cores...}, "gpu": {...}},
        question="which (placement x path x family) cells give the right embedding",
    ))

``discover()`` imports every module of this package, so a new study module is picked up by the
sweep, the report and the command line without touching them. ``STUDIES`` maps name -> Study.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

PROFILES = ("cpu", "gpu")


@dataclass
class Summary:
    """What a study's summarize function gives the report: the finding in a few sentences
    (plain text, paragraphs separated by blank lines) and the figure files (PNG/SVG) it saved,
    as absolute paths or paths relative to the ``out_dir`` it was given (an absolute folder)."""

    text: str
    figures: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Study:
    name: str
    notebook: str                               # path relative to the project root
    run: Callable[..., Any]                     # run(**params) -> tidy DataFrame
    summarize: Callable[[Any, Path], Summary | str]
    defaults: Mapping[str, Mapping[str, Any]]   # profile ("cpu"/"gpu") -> parameters
    question: str = ""

    def __post_init__(self) -> None:
        missing = [p for p in PROFILES if p not in self.defaults]
        if missing:
            raise ValueError(f"study {self.name!r} has no default parameters for {missing}")
        unknown = [p for p in self.defaults if p not in PROFILES]
        if unknown:
            raise ValueError(f"study {self.name!r}: unknown profiles {unknown}; use {PROFILES}")

    def params(self, profile: str, **overrides: Any) -> dict[str, Any]:
        """The default parameters for ``profile``, with ``overrides`` applied on top."""
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; use one of {PROFILES}")
        return {**self.defaults[profile], **overrides}


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


def save_table(study_name: str, table: Any, run_dir: str | Path | None = None,
               params: Mapping[str, Any] | None = None, results_root: str | Path = "results") -> Path:
    """Write ``<run_dir>/<study_name>.parquet`` (atomically) and return its path.

    A notebook run by the sweep gets ``run_dir`` from it (meta.json is the sweep's). Run
    interactively with ``run_dir=None``, a new run folder is made under ``results_root`` with its
    own meta.json, so an interactive result is never mixed into, nor overwrites, a finished run.
    An existing table of the same study in ``run_dir`` is refused rather than replaced.
    """
    from ..provenance import collect_meta, finish_meta, new_run_dir, write_meta, write_table

    own_meta = run_dir is None
    run_dir = new_run_dir(results_root, name=f"{study_name}-interactive") if own_meta else Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{study_name}.parquet"
    if path.exists():
        raise FileExistsError(f"{path} exists; a finished run's table is never overwritten (use a new run_dir)")
    if own_meta:
        meta = collect_meta({"studies": {study_name: dict(params or {})}, "mode": "interactive"})
    write_table(table, path)
    if own_meta:
        write_meta(run_dir, finish_meta(meta))
    return path
