"""Correctness study: which (family x placement x path x norm x buffer dtype) cells give the right
embedding, and does NaN in padding rows or in the graph pool leak into real rows.

Every cell builds the encoder exactly as an engine wires it (see workbench.encoder) and encodes
the same real photos and a short video; the reference is the same weights in float64, eager, on
pixels normalized in float64. Wrong cells come from the wiring alone: nothing here knows which
cells should fail. `ok` is rel_err below a per-dtype tolerance (TOLERANCE, justified there).

Reading the verdicts: right and wrong cells lie orders of magnitude apart, so the wiring decides,
not rounding. A bfloat16 graph buffer rounds what it holds: exact for raw 0..255 pixels
(placements tower, fold), not for normalized floats (processor, runner, device). Placement fold
(the normalization folded into the patch embedding) rounds the folded weights to the tower dtype
instead of the normalized pixels: in bf16 its error is a little larger than tower's, shown beside
it. The identity norm (cast only) is
a control, a forgotten normalization: right only where the processor already normalized. An item
encoded alone and inside a mixed batch may differ by the kernels the batch's shapes select
(attention kernel, GEMM tiling by row count), within the tolerance: that is not wiring.
"""
from __future__ import annotations

from .. import Study, register
from .params import PARAMS, footprint


STUDY = register(Study(
    name="correctness",
    guess_s={"cpu": 49},
    order=1,
    notebook="notebooks/correctness.ipynb",
    package=__name__,
    params=PARAMS,
    cells="families",
    columns=("family", "preset", "case", "placement", "path", "norm"),
    footprint=footprint,
    gpus=lambda p, device: p["dp_world_size"] if device == "cuda" and "dp" in p["paths"] else 1,
    question="which (placement x path x family) cells give the right embedding; does NaN in padding/pool "
             "leak into real rows",
))
run, summarize = STUDY.run, STUDY.summarize
