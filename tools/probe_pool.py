"""One-call H200 probe: where does a general graph's measured pool part from `graph_pool_bytes`?

padding_waste compares the pool of every runner it builds with the model (the ratios per run are
in results/reference/README.md). The model replays an allocation trace of the tower's capture
forward, counted on the meta device (`planner.capture_trace`), through a caching-allocator model.
For each preset (full depth, bf16, the triton_rows norm in the tower, as padding_waste builds it)
and budget, this probe records:

- ``pool_measured``: the pool of a runner holding that one budget's general graph, right after
  construction (as padding_waste measures `pool_bytes`);
- ``pool_model``: `graph_pool_bytes` for the same runner;
- the meta trace's and the CUDA trace's allocation count, peak live bytes and pool model (the same
  forward, counted with the same dispatch mode on the GPU), and whether the two traces are equal
  allocation for allocation (size and order).

If the traces are equal and the measured pool still differs, the difference lies in how the
allocator places a capture's blocks (not in what the tower allocates). Writes $OUT/probe_pool.json
(or ./probe_pool.json). Run on the device from the repo root:
`PYTHONPATH=$PWD python3 tools/probe_pool.py [PRESET:BUDGET,BUDGET ...]`.
"""
import json
import os
import sys

import torch

import workbench as wb
from workbench.cuda_memory import pool_segment_bytes
from workbench.memory_model import pool_model, trace_peak_bytes
from workbench.planner import capture_trace, forward_trace, graph_pool_bytes
from workbench.runner import EncoderGraphRunner

NORM = "triton_rows"
DEFAULT = ["qwen3-vl-8b:1024,4096,12288", "glm-4.1v-9b:1024,4096"]


def sizes(trace) -> list:
    return [e[2] for e in trace if e[0] == "alloc"]


def summary(trace) -> dict:
    return dict(allocs=len(sizes(trace)), peak_bytes=trace_peak_bytes(trace)["peak_bytes"],
                pool_bytes=pool_model(trace)["pool_bytes"])


def main(args) -> None:
    out = {"env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
           "norm": NORM, "cells": []}
    for spec in args or DEFAULT:
        preset, budgets = spec.split(":")
        cfg = wb.VisionConfig.preset(preset)
        enc = wb.build_encoder(cfg, placement="tower", norm=NORM, dtype=torch.bfloat16, device="cuda", seed=0)
        for b in map(int, budgets.split(",")):
            mt = capture_trace(cfg, b, torch.bfloat16, NORM, torch.uint8, 1)
            ct = forward_trace(enc.visual, b, 1, torch.uint8, "cuda")
            with torch.inference_mode():
                runner = EncoderGraphRunner(enc, [b], buffer_dtype=torch.uint8, max_items=1, policy="always",
                                            warmup=1, exact_capture="first_use")
                torch.cuda.synchronize()
                measured = pool_segment_bytes(runner.pool)
            del runner
            torch.cuda.empty_cache()
            first_diff = next((i for i, (x, y) in enumerate(zip(sizes(mt), sizes(ct))) if x != y), None)
            cell = dict(preset=preset, budget=b, pool_measured=measured,
                        pool_model=graph_pool_bytes(cfg, [b], max_items=1, norm=NORM),
                        meta=summary(mt), cuda=summary(ct), traces_equal=sizes(mt) == sizes(ct),
                        first_difference=first_diff)
            out["cells"].append(cell)
            mib = 2 ** 20
            print(f"{preset} {b}: measured {measured / mib:.0f} MiB, model {cell['pool_model'] / mib:.0f}; "
                  f"meta trace {cell['meta']['allocs']} allocs peak {cell['meta']['peak_bytes'] / mib:.0f} MiB, "
                  f"cuda trace {cell['cuda']['allocs']} peak {cell['cuda']['peak_bytes'] / mib:.0f} MiB, "
                  f"cuda trace's pool model {cell['cuda']['pool_bytes'] / mib:.0f}; equal {cell['traces_equal']} "
                  f"(first difference at {first_diff})", flush=True)
        del enc
        torch.cuda.empty_cache()
    path = os.path.join(os.environ.get("OUT", "."), "probe_pool.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
