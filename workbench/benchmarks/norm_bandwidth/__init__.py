"""Norm bandwidth: every input norm implementation checked against a float64 reference, then timed
as CUDA graph replays against the copy ceilings (``python -m workbench.benchmarks.norm_bandwidth``,
`measure`), and drawn in the report from the committed ``results/reference/norm_bw-*.json``
(`summary`, torch-free)."""
from __future__ import annotations

from .. import Benchmark, register


def summarize(path, doc, out_dir):
    """One committed result file's panel (`summary.summarize`)."""
    from .summary import summarize

    return summarize(path, doc, out_dir)


BENCHMARK = register(Benchmark(name="norm_bandwidth", title="Norm bandwidth (committed benchmark)",
                               summarize=summarize, files="norm_bw-*.json", order=0))
