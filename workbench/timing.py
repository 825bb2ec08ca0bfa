"""Timers, with one set of statistics (p50, p10, p90, min over ``reps``).

- `cuda_event_ms`: the one CUDA-event timing loop; every device timer here and in the benchmarks
  and tools runs through it.
- `graph_replay_us` (CUDA): the callable captured once, each replay timed between CUDA events on
  cold L2; `cpu_time_us`: host wall time after synchronization; `time_us` picks by device.
- `warm_on_side_stream`, `require_cuda`: the warm-up before a capture and the CUDA check that the
  other measuring modules share.
- `frozen_heap`: host-timed calls with Python's collector kept off the startup heap, as serving
  engines run (vLLM freezes its engine and worker heaps after start-up and warm-up): a full
  collection walks every object of the loaded models, inside whichever timed call happens to
  allocate the object that triggers it.

Why graph replays: an input norm runs inside a captured vision tower in the serving engines, so
what matters is the kernel time with launch overhead removed, on cold L2 (the pixel rows arrive
fresh from the host every step). `graph_replay_us` captures the callable once and times each
replay between CUDA events, after overwriting a buffer several times larger than L2 (an H200 has
60 MB) so no input or output of the previous replay is still cached.

Pure functions: nothing is written to disk. The CUDA timers raise RuntimeError without a GPU
(callers decide whether that is fatal; no number is ever invented).
"""
from __future__ import annotations

import contextlib
import gc
import math
import time

import torch

FLUSH_BYTES = 256 << 20


@contextlib.contextmanager
def collector_paused():
    """No collection inside the block (`gc.disable`), re-enabled after if it was: for one timed call whose
    time decides something (policy auto's race), so a pause that belongs to no plan is not charged to one.
    Collection is only deferred to the end of the block."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def frozen_heap():
    """Collect, then freeze every object alive now (`gc.freeze`) for the block, so the collector's
    passes inside it walk only what the block allocates; unfrozen after, so what dies later is still
    collected. Nests: an inner block leaves the outer one's objects frozen."""
    outer = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty list."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _summary(samples_us: list[float]) -> dict:
    s = sorted(samples_us)
    lo, hi = median_ci(s)
    return dict(p50_us=_quantile(s, 0.5), p10_us=_quantile(s, 0.1), p90_us=_quantile(s, 0.9),
                min_us=s[0], reps=len(s), ci_lo_us=lo, ci_hi_us=hi)


# ---- repeat until the number is known ----------------------------------------------------------
CONFIDENCE = 0.95
REL_CI = 0.02


def median_ci(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics
    (x_(j), x_(n-1-j)) (0-based, sorted) with the largest j whose binomial coverage
    1 - 2 P(Bin(n, 1/2) <= j) is at least ``confidence``. (nan, nan) when even the full range
    covers less (fewer than 6 samples at 95%)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must lie in (0, 1)")
    s = sorted(values)
    n = len(s)
    j, cdf, best = 0, 0.0, None
    log_half = n * math.log(0.5)
    while j < (n + 1) // 2:
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + log_half)
        if 1 - 2 * cdf < confidence:
            break
        best, j = j, j + 1
    if best is None:
        return math.nan, math.nan
    return float(s[best]), float(s[n - 1 - best])


def is_known(values, rel: float = REL_CI, confidence: float = CONFIDENCE) -> bool:
    """Whether the median's confidence interval lies within ``rel`` of the median on both sides."""
    lo, hi = median_ci(values, confidence)
    if math.isnan(lo):
        return False
    med = _quantile(sorted(values), 0.5)
    return max(med - lo, hi - med) <= rel * abs(med)


def until_known(measure, min_reps: int, max_reps: int, rel: float = REL_CI,
                confidence: float = CONFIDENCE) -> list[float]:
    """Samples from ``measure(k)`` (k new samples per call, a list) until the median is known:
    at least ``min_reps`` and at most ``max_reps`` of them, stopping as soon as the median's
    confidence interval lies within ``rel`` of it (`is_known`), as pyperf and asv repeat.
    Rounds grow by half of what is there, so a noisy measurement costs few rounds."""
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got min_reps={min_reps}, max_reps={max_reps}")
    if not rel > 0:
        raise ValueError(f"rel={rel!r} must be > 0 (the interval's half-width as a fraction of the median)")
    samples = list(measure(min_reps))
    while len(samples) < max_reps and not is_known(samples, rel, confidence):
        samples += measure(min(max_reps - len(samples), max(1, len(samples) // 2)))
    return samples


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def require_cuda(what: str) -> None:
    """Raise RuntimeError naming ``what`` when torch sees no CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA device; none is available")


def cpu_time_us(fn, reps: int = 10, warmup: int = 2, min_reps: int | None = None, rel: float = REL_CI) -> dict:
    """Host wall time of ``fn()`` (time.perf_counter): dict(p50_us, p10_us, p90_us, min_us, reps,
    ci_lo_us, ci_hi_us: the median's 95% interval, nan below 6 samples).

    Each rep is bracketed by a device synchronize (when CUDA is initialized), so queued GPU work
    is included and never leaks into the next rep. The same statistics as `graph_replay_us`.
    ``reps`` calls are timed; with ``min_reps`` given, between ``min_reps`` and ``reps`` of them,
    until the median is known within ``rel`` (`until_known`).
    """
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    for _ in range(warmup):
        fn()

    def measure(k: int) -> list[float]:
        out = []
        for _ in range(k):
            _sync()
            t0 = time.perf_counter()
            fn()
            _sync()
            out.append((time.perf_counter() - t0) * 1e6)
        return out
    samples = measure(reps) if min_reps is None else until_known(measure, min(min_reps, reps), reps, rel)
    return _summary(samples)


def time_us(fn, device, reps: int = 20, warmup: int = 3, min_reps: int | None = None) -> dict:
    """`graph_replay_us` on a CUDA device (``fn`` must be graph-safe), `cpu_time_us` elsewhere."""
    if torch.device(device).type == "cuda":
        with torch.cuda.device(torch.device(device)):
            return graph_replay_us(fn, reps=reps, warmup=warmup, min_reps=min_reps)
    return cpu_time_us(fn, reps=reps, warmup=warmup, min_reps=min_reps)


def cuda_event_ms(fn, reps: int, warmup: int = 0, before=None, sync_each: bool = False) -> list[float]:
    """Device time of each of ``reps`` calls of ``fn``, in milliseconds, in call order: each call
    is timed on its own between two CUDA events recorded on the current stream.

    ``warmup`` untimed calls come first, then a device synchronize. ``before`` (when given) runs
    before every call, outside the timed region (the L2 flush of `graph_replay_us`). Without
    ``sync_each`` the calls are queued back to back and the host waits once at the end, so host
    launch time hides behind the queue; with it the host waits for each call's end event before
    it launches the next one.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
        if sync_each:
            end.synchronize()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def warm_on_side_stream(fn, warmup: int):
    """Run ``fn`` ``warmup`` times (at least once) on a new side stream and return that stream, for
    the capture that follows: capturing on the stream that was warmed keeps one-time allocations
    (Triton compiles, the per-stream cuBLAS workspace) out of the graph's pool."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return stream


def graph_replay_us(fn, reps: int = 50, warmup: int = 3, flush_bytes: int = FLUSH_BYTES,
                    min_reps: int | None = None, rel: float = REL_CI) -> dict:
    """Time ``fn`` as a CUDA-graph replay: the statistics of `cpu_time_us` (``min_reps`` as there).

    ``fn`` is warmed ``warmup`` times on a side stream (Triton compiles, allocator settles), then
    captured once on that stream into a `torch.cuda.CUDAGraph`. Each of the ``reps`` replays is timed on its own
    between two CUDA events; before each, outside the timed region, a ``flush_bytes`` buffer is
    overwritten so L2 holds none of the replay's data (``flush_bytes=0`` times warm replays).
    ``fn`` must be graph-safe (no host syncs); tensors it allocates come from the graph's pool and
    are reused by every replay.
    """
    require_cuda("graph_replay_us")
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    stream = warm_on_side_stream(fn, warmup)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    flush = torch.empty(max(1, flush_bytes), dtype=torch.uint8, device="cuda")
    before = (lambda: flush.fill_(1)) if flush_bytes else None
    graph.replay()                      # untimed: it uploads the graph

    def measure(k: int) -> list[float]:
        return [t * 1e3 for t in cuda_event_ms(graph.replay, k, before=before)]
    samples = measure(reps) if min_reps is None else until_known(measure, min(min_reps, reps), reps, rel)
    del graph, flush
    return _summary(samples)
