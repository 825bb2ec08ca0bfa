"""Where a strategy's time goes on encoder_latency's stream of new shapes (results/reference/README.md, the
`h100/` rows, says what it found): each strategy on fresh batches, in the study's order and reversed, with the
runner's phases, the allocator's device allocations and the collector's full passes inside each call. Usage:
python3 tools/probe_stream.py [PRESET [MIX]] [--frozen] (a GPU; on a CPU a one-block smoke test; --frozen: the
heap frozen once the models are built, as engines run, `timing.frozen_heap`)."""
import contextlib
import gc
import sys
import time

import torch

from workbench.config import VisionConfig
from workbench.encoder import build_encoder
from workbench.preprocess import preprocess
from workbench.runner import EncoderGraphRunner
from workbench.samples import image_mix
from workbench.studies.encoder_latency.measure import _mix_runners, _pinned
from workbench.timing import frozen_heap

frozen = "--frozen" in sys.argv
if frozen:
    sys.argv.remove("--frozen")
preset = sys.argv[1] if len(sys.argv) > 1 else "qwen2-vl-7b"
mix = sys.argv[2] if len(sys.argv) > 2 else "screenshots"
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # cpu: a smoke test of this script
cfg = VisionConfig.preset(preset, depth=None if dev.type == "cuda" else 1)
enc = build_encoder(cfg, placement="tower", norm="triton_rows", dtype=torch.bfloat16, device=dev, seed=0)
print("attention", enc.visual.kernels.backend, "fused", enc.visual.kernels.fused, flush=True)
runner = EncoderGraphRunner(enc, engine="vllm-0.34", buffer_dtype=torch.uint8)
planner = _mix_runners(enc, cfg, mix, runner)["graph_planner"][0]     # the study's planner runner


def batch(seed):
    return _pinned(preprocess(image_mix(mix, 4, seed=seed, resized=True, cfg=cfg), cfg), dev)


passes = []        # the collector's full (generation 2) passes: their ms, appended when each ends
_t = {}


def _on_gc(phase, info):
    if info["generation"] == 2:
        if phase == "start":
            _t["s"] = time.perf_counter()
        else:
            passes.append((time.perf_counter() - _t["s"]) * 1e3)


gc.callbacks.append(_on_gc)


def allocs():
    """The allocator's device allocations (cudaMalloc) and retries so far: a call that allocates anew pays them."""
    if dev.type != "cuda":
        return 0, 0
    s = torch.cuda.memory_stats()
    return s.get("num_device_alloc", 0), s.get("num_alloc_retries", 0)


def timed(fn, phases=None):
    enc.visual.forget_metadata()
    runner.forget_metadata()
    planner.forget_metadata()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    a0, g0 = allocs(), len(passes)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    ms = (time.perf_counter() - t0) * 1e3
    a1, gcs = allocs(), passes[g0:]
    return (f"{ms:.1f}ms/{a1[0] - a0[0]}mallocs/{a1[1] - a0[1]}retries"
            + (f"/gc2 {'+'.join(f'{p:.0f}' for p in gcs)}ms" if gcs else ""))


steady = batch(0)
with torch.inference_mode(), (frozen_heap() if frozen else contextlib.nullcontext()):
    for _ in range(3):
        enc.encode(steady)
    print("settle calls", runner.settle(steady), flush=True)
    # where a runner call's host time goes before any kernel runs, on a shape it has not seen
    b = batch(30)
    for name, fn in (("graph_input", lambda: runner.encoder.graph_input(b)), ("plan", lambda: runner.plan(b)),
                     ("check_batch", lambda: enc.check_batch(b))):
        t0 = time.perf_counter(); fn(); print(f"host {name} {(time.perf_counter() - t0) * 1e3:.2f} ms", flush=True)
    for k in range(1, 9):
        b = batch(k)
        order = ["eager", "always", "planner", "auto"] if k % 2 else ["auto", "always", "planner", "eager"]
        got = {}
        for name in order:
            if name == "eager":
                got[name] = timed(lambda: enc.encode(b, path="eager"))
            elif name == "planner":
                got[name] = timed(lambda: planner.encode(b))
            else:
                got[name] = timed(lambda: runner.encode(b, policy="always" if name == "always" else None))
        ph = {}
        enc.visual.forget_metadata(); runner.forget_metadata()
        t_ph = timed(lambda: runner.encode(b, phases=ph))
        again = timed(lambda: enc.encode(b, path="eager"))
        print(f"batch {k} order {order}: " + " ".join(f"{n} {v}" for n, v in got.items())
              + f" | auto with phases {t_ph}: " + " ".join(f"{n} {v * 1e3:.1f}" for n, v in ph.items())
              + f" | eager again {again}", flush=True)
    # the same without forgetting metadata: what the tower's host-side preparation costs a call
    b = batch(20)
    for name in ("eager", "auto", "eager", "auto"):
        (torch.cuda.synchronize() if dev.type == "cuda" else None); t0 = time.perf_counter()
        enc.encode(b) if name == "eager" else runner.encode(b)
        (torch.cuda.synchronize() if dev.type == "cuda" else None); print(f"kept metadata: {name} {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
