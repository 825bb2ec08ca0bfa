"""Cast cost: what staging the graph input costs per replay, for each design an engine could choose.

A captured encoder graph reads its pixels from a static input buffer. Before every replay the
runner fills it with the batch's valid rows and pads the rest; then (in the tower placements) the
graph normalizes it. The designs, each with every norm implementation where it has a norm:

- ``bf16_buffer``  bf16 buffer: zero the padding + cast-copy uint8 into it; the tower's norm runs
                   over all rows (reading bf16): the engine before its buffer became uint8;
- ``uint8_buffer`` uint8 buffer: zero + copy; the norm over all rows (the engine today);
- ``uint8_valid``  uint8 buffer: copy only the valid rows; the norm skips padding via ``n_valid``;
- ``runner``       the runner normalizes the source rows straight into the bf16 buffer (valid rows
                   only, ``out=``) and zeroes the padding; no norm in the graph;
- ``fp32_buffer``  fp32 buffer holding CPU-normalized floats (the legacy path): zero + copy, then
                   the tower casts fp32 -> bf16 (its "norm" column is that cast);
- ``fold``         placement fold: uint8 buffer, zero + copy; the graph only casts it to bf16 (its
                   "norm" column is that cast: the patch embedding's folded weights normalize), no
                   norm kernel; checked against the raw pixels, which is what its tower takes;
- ``device``       placement device: the GPU preprocessor normalizes the valid rows into a bf16
                   tensor of its own before the encoder ("norm", outside the graph), the runner
                   copies them into the bf16 buffer and zeroes the padding ("copy").

Per (design, norm, budget, fill) it measures the copy part, the norm part and both together (CUDA:
graph replays on cold L2, median and p90; CPU: host time), the bytes each moves (workbench.memory_model
byte model), the byte floor at the copy ceiling measured in the same run, and the tower's own
replay at that budget, also measured in the same run, beside its FLOP floor (matmul + attention
FLOPs at the matmul rate measured in the run). Every design's output is checked against a
float64 reference before it is timed.

Reading the numbers: the tower replays at a multiple of its FLOP floor, so the input's share of a
tower at its floor would be that multiple larger; the smallest budgets are bound by the latency of
one tiny kernel (``launch_us``), not by bytes; CPU times are host times on cache-resident data,
so ratios below 1x the DRAM floor there are the caches.
"""
from __future__ import annotations

from .. import Study, register
from .params import PARAMS, footprint


STUDY = register(Study(
    name="cast_cost",
    guess_s={"cpu": 21},
    order=2,
    notebook="notebooks/cast_cost.ipynb",
    package=__name__,
    params=PARAMS,
    cells="presets",
    columns=("family", "preset", "design", "budget", "fill", "norm"),
    per_preset=True,
    footprint=footprint,
    question="per-replay input staging cost for each graph buffer dtype vs the byte floor and vs the tower's "
             "own time",
))
run, summarize = STUDY.run, STUDY.summarize
