"""Runnable GPU benchmarks (``python -m workbench.benchmarks.<name>``) and the registry the report
reads them through.

A benchmark is a folder, ``benchmarks/<name>/``, in the shape of a study: ``measure.py``
measures (``python -m workbench.benchmarks.<name>``: it imports torch, prints a table and ends
with one JSON line; it exits 2 without CUDA rather than print numbers it did not measure),
``summary.py`` draws the committed result files (``results/reference/*.json`` whose object has
``"benchmark": "<name>"``) and writes the finding, torch-free, and ``__init__.py`` registers a
`Benchmark` at import time; `discover` imports every folder, so the report shows a new benchmark
without naming it.
"""
from __future__ import annotations

import importlib
import math
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..registry import register_once

__all__ = ["Benchmark", "BenchmarkPanel", "BENCHMARKS", "register", "discover"]


@dataclass
class BenchmarkPanel:
    """One committed result file, drawn: the finding (plain text, paragraphs separated by blank
    lines) and the figure files saved (absolute paths; PNG shown, an SVG beside it linked)."""

    source: str                     # file name under results/reference/
    device: str = ""
    date: str = ""
    text: str = ""
    figures: list[Path] = field(default_factory=list)
    error: str | None = None        # one line: why this file could not be shown
    captions: dict[str, str] = field(default_factory=dict)   # figure file name -> what it shows


@dataclass(frozen=True)
class Benchmark:
    """A committed benchmark the report draws.

    name: the ``"benchmark"`` value of its result files, and the report's folder for its figures;
    title: its section heading; files: a glob of its result files' names, so that a file that is
    not even JSON is still shown in its section with the reason; summarize(path, doc, out_dir):
    one file's panel (figures saved into ``out_dir``, never raises for a bad file: the panel's
    ``error`` says why); order: where its section goes among the benchmarks."""

    name: str
    title: str
    summarize: Callable[[Path, Mapping[str, Any], Path], BenchmarkPanel]
    files: str = "*.json"
    order: float = math.inf

    @property
    def missing(self) -> str:
        """The line a report shows when no result file of this benchmark is committed."""
        return (f"No committed {self.name.replace('_', ' ')} benchmark: no reference/*.json with "
                f'"benchmark": "{self.name}".')


BENCHMARKS: dict[str, Benchmark] = {}


def register(benchmark: Benchmark) -> Benchmark:
    """Add ``benchmark`` to BENCHMARKS (`workbench.registry.register_once`)."""
    return register_once(BENCHMARKS, benchmark, "benchmark", "summarize")


def discover() -> dict[str, Benchmark]:
    """Import every benchmark folder of this package (each registers its benchmark; none imports
    torch) and return BENCHMARKS."""
    for mod in pkgutil.iter_modules(__path__):
        if mod.ispkg and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    return BENCHMARKS
