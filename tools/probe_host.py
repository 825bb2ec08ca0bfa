"""One-call probe of the graph path's host side (H200): how much of an encode call is not the replay,
and which Python functions that time is spent in.

For the qwen2-vl-7b tower (bf16, full depth, random weights) at 64, 256 and 1024 tokens, one image,
uint8 pixels in pinned host memory, a runner with exactly that budget (as the encoder latency study
builds it): the p50 of a whole `encode` call (device synchronized after each), of the graph replay
alone (CUDA events), of the host time until `encode` returns (no synchronization: what the host
spends launching), and a cProfile of 40 calls (top functions by own time). Writes
$OUT/probe_host.json. Run on the device from the repo root: ``PYTHONPATH=$PWD python3 tools/probe_host.py``.

Its run on the H200 (2026-11-30, results/reference/probe_host-h200-20261130.json) read, at 64 / 256
/ 1024 tokens: encode 2.236 / 4.019 / 17.087 ms, replay 1.880 / 3.550 / 17.493 ms, host time
until encode returns 0.402 / 0.570 / 0.718 ms. So a call costs 0.36-0.47 ms beyond its replay at
64-256 tokens. Without a synchronization per call the host queues calls ahead of the device:
the profile of 40 back-to-back calls then shows the graph launch waiting on the full queue,
and no Python function above 0.1 ms per call."""
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch

from workbench.config import VisionConfig
from workbench.runner import EncoderGraphRunner
from workbench.studies.encoder_latency.measure import build_models, latency_batch
from workbench.timing import cuda_event_ms


def main():
    dev = torch.device("cuda")
    cfg = VisionConfig.preset("qwen2-vl-7b")
    enc, _ = build_models(cfg, "triton_rows", torch.bfloat16, dev, 0, reference=False)
    res = {"gpu": torch.cuda.get_device_name(), "preset": "qwen2-vl-7b", "cells": {}}
    for tokens in (64, 256, 1024):
        batch = latency_batch(cfg, tokens, 1, torch.Generator().manual_seed(0))
        batch = type(batch)(batch.pixels.pin_memory(), batch.grid_thw)
        runner = EncoderGraphRunner(enc, budgets=[tokens], buffer_dtype=torch.uint8, max_items=1)
        with torch.inference_mode():
            for _ in range(5):
                runner.encode(batch)
            torch.cuda.synchronize()
            whole, host = [], []
            for _ in range(40):
                t0 = time.perf_counter()
                runner.encode(batch)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                host.append((t1 - t0) * 1e3)
                whole.append((t2 - t0) * 1e3)
            cap = runner.graphs[tokens]
            cap = cap.exact.get(1, cap)
            replay = cuda_event_ms(cap.graph.replay, 20)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(40):
                runner.encode(batch)
            torch.cuda.synchronize()
            prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        cell = {"encode_p50_ms": statistics.median(whole), "host_until_return_p50_ms": statistics.median(host),
                "replay_p50_ms": statistics.median(replay), "cprofile_40_calls": s.getvalue()}
        print(tokens, {k: round(v, 3) for k, v in cell.items() if k != "cprofile_40_calls"}, flush=True)
        print(s.getvalue()[:3500], flush=True)
        res["cells"][str(tokens)] = cell
        del runner
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_host.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
