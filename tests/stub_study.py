"""A stub study for the tests of the sweep's logic (sharding, resume, GPU workers, run stages): it
measures nothing and returns a small tidy table in milliseconds, so those tests check the sweep,
not the studies, and never wait for a model.

A test registers stubs only for itself (the `stubs` fixture of tests/conftest.py calls `make` and
workbench.studies.register, and removes them afterwards), so the real registry the other tests
see never holds them. A process the sweep starts (a ``sweep --gpus`` worker, a notebook's kernel)
has no fixture: there, importing this module registers the stubs, because the sweep named it in
workbench.workers.STUDY_MODULES_ENV (a worker) or the stub notebook asks for it (`notebook`).

Each stub takes ``sizes`` (one row per size, value 2*size: a result that depends only on its
parameters, so two runs of the same plan give equal tables) and ``fail`` (raise instead: a study
that breaks while it runs).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from workbench.studies import Param, ParamSpec, Study, Summary, register

NAMES = ("stub_a", "stub_b")
TESTS = Path(__file__).resolve().parent
SPEC = ParamSpec(
    Param("sizes", "list[int]", cpu=[1, 2], gpu=[1, 2, 3], minimum=1, cap="items", help="one row per size"),
    Param("fail", "bool", cpu=False, help="raise instead of returning a table"),
)


def run(device="auto", progress=True, *, _name="stub", **params):
    params = SPEC.resolve(params, "gpu" if str(device).startswith("cuda") else "cpu", study=_name)
    if params["fail"]:
        raise RuntimeError(f"{_name} fails on purpose")
    return pd.DataFrame({"study": _name, "size": params["sizes"], "device": f"{device}: stub",
                         "metric": "double", "value": [2.0 * s for s in params["sizes"]], "unit": "count"})


def summarize(table, out_dir, *, _name="stub"):
    """One 'figure' (a 1x1 PNG and its SVG) and a finding that counts the rows."""
    from PIL import Image

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{_name}_sizes.png"
    Image.new("RGB", (1, 1)).save(png)
    png.with_suffix(".svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>')
    return Summary(text=f"{_name}: {len(table)} rows on {', '.join(sorted(set(table['device'])))}.",
                   figures=[png])


def _bound(fn, name):
    """``fn`` with the study's name filled in, as a module-level name (what a worker imports)."""
    def bound(*args, **kw):
        return fn(*args, _name=name, **kw)
    bound.__module__, bound.__qualname__ = __name__, f"{fn.__name__}[{name}]"
    return bound


def make(name: str = NAMES[0], notebook: str | Path = "notebooks/no_such_stub.ipynb") -> Study:
    """The stub ``name``; stub_a's sizes are independent cells (a sharded sweep may split them)."""
    return Study(name=name, notebook=str(notebook), run=_bound(run, name), summarize=_bound(summarize, name),
                 params=SPEC, question=f"Does the sweep take {name} through every stage?", order=1000.0,
                 cells="sizes" if name == NAMES[0] else None)


def notebook(path: Path, name: str = NAMES[0]) -> Path:
    """A minimal notebook for the stub ``name`` at ``path`` (what papermill mode executes): its
    parameters cell, then what a study notebook does (notebook_params, run_study), and a cell
    that prints the table."""
    def code(source, tags=()):
        return {"cell_type": "code", "execution_count": None, "metadata": {"tags": list(tags)}, "outputs": [],
                "source": source}

    cells = [
        code(SPEC.parameters_cell(), tags=["parameters"]),
        code(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport stub_study\n"
             f"stub_study.register_in_this_process({name!r}, {str(path)!r})"),
        code(f"from workbench.studies import notebook_params, run_study\n"
             f"table, path = run_study({name!r}, notebook_params({name!r}, globals()), device, run_dir)"),
        code("print(table.to_string())"),
    ]
    for i, cell in enumerate(cells):
        cell["id"] = f"stub-{i}"
    doc = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                       "language": "python"}},
           "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(doc, indent=1))
    return path


def register_in_this_process(name: str, notebook_path: str | None = None) -> Study:
    """For a process with no fixture (a notebook's kernel): register the stub ``name``."""
    kw = {} if notebook_path is None else {"notebook": notebook_path}
    return register(make(name, **kw))


def _registered_by_the_sweep() -> bool:
    from workbench.workers import STUDY_MODULES_ENV

    return __name__ in os.environ.get(STUDY_MODULES_ENV, "").split(",")


if _registered_by_the_sweep():       # a worker of `sweep --gpus`: its parent ran these stubs
    for _n in NAMES:
        register(make(_n))
