"""Timing helpers: host wall time, CUDA-graph replay time, and the device copy ceilings.

Pure functions: nothing is written to disk. The graph helpers need CUDA and raise RuntimeError
without it (callers decide whether that is fatal; no number is ever invented).

Why graph replays: an input norm runs inside a captured vision tower in the serving engines,
so what matters is the kernel time with launch overhead removed, on cold L2 (the pixel rows
arrive fresh from the host every step). `graph_replay_us` captures the callable once and times
each replay between CUDA events, after overwriting a 256 MB buffer so no input or output of the
previous replay is still in L2 (H200: 60 MB of L2).
"""
from __future__ import annotations

import math
import statistics
import time

import torch

FLUSH_BYTES = 256 << 20


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty list."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _summary(samples_us: list[float]) -> dict:
    s = sorted(samples_us)
    return dict(p50_us=_quantile(s, 0.5), p10_us=_quantile(s, 0.1), p90_us=_quantile(s, 0.9),
                min_us=s[0], reps=len(s))


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA device; none is available")


def median_cpu_us(fn, warmup: int = 2, reps: int = 10) -> float:
    """Median host wall time of ``fn()`` in microseconds (time.perf_counter).

    Each rep is bracketed by a device synchronize (when CUDA is initialized), so queued GPU work
    is included and never leaks into the next rep.
    """
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def graph_replay_us(fn, reps: int = 50, warmup: int = 3, flush_bytes: int = FLUSH_BYTES) -> dict:
    """Time ``fn`` as a CUDA-graph replay: dict(p50_us, p10_us, p90_us, min_us, reps).

    ``fn`` is warmed ``warmup`` times on a side stream (Triton compiles, allocator settles), then
    captured once into a `torch.cuda.CUDAGraph`. Each of the ``reps`` replays is timed on its own
    between two CUDA events; before each, outside the timed region, a ``flush_bytes`` buffer is
    overwritten so L2 holds none of the replay's data (``flush_bytes=0`` times warm replays).
    ``fn`` must be graph-safe (no host syncs); tensors it allocates come from the graph's pool and
    are reused by every replay.
    """
    _require_cuda("graph_replay_us")
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    flush = torch.empty(max(1, flush_bytes), dtype=torch.uint8, device="cuda")
    graph.replay()                       # the first replay uploads the graph: not timed
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        if flush_bytes:
            flush.fill_(1)
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    del graph, flush
    return _summary(samples)


# ---- copy ceilings ---------------------------------------------------------------------------

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency; the CPU helpers still work
    triton = None
    tl = None

# (BLOCK int32 elements per program, num_warps): 16-byte vector loads/stores in every case;
# the best of these is the ceiling, so one unlucky shape does not lower it
SM_COPY_CONFIGS = ((1024, 4), (2048, 4), (4096, 8))

if tl is not None:
    def _sm_copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        start = tl.program_id(0).to(tl.int64) * BLOCK
        offs = tl.arange(0, BLOCK)
        # the bound as an int32 scalar keeps the per-element compare 32-bit
        mask = offs < tl.minimum(n - start, BLOCK).to(tl.int32)
        tl.store(dst_ptr + start + offs, tl.load(src_ptr + start + offs, mask=mask), mask=mask)

_COPY_KERNEL: dict = {}


def _copy_kernel():
    # jitted on first use, like workbench.norms, so TRITON_INTERPRET is read at that moment
    if triton is None:
        raise RuntimeError("the SM copy kernel needs the `triton` package")
    if "k" not in _COPY_KERNEL:
        # n stays specialized: knowing n % 16 == 0 lets the masked accesses vectorize
        _COPY_KERNEL["k"] = triton.jit(_sm_copy_kernel)
    return _COPY_KERNEL["k"]


def sm_copy_run(src: torch.Tensor, dst: torch.Tensor, block: int = 2048, num_warps: int = 4) -> None:
    """Copy ``src`` into ``dst`` (same shape, contiguous) with the Triton SM copy kernel.

    Copies as int32 words when the byte count and both addresses allow it, else as uint8.
    """
    kernel = _copy_kernel()
    if src.numel() != dst.numel() or src.dtype != dst.dtype:
        raise ValueError(f"src {tuple(src.shape)} {src.dtype} and dst {tuple(dst.shape)} {dst.dtype} differ")
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("sm_copy_run needs contiguous src and dst (a reshaped copy would be written)")
    a = src.reshape(-1).view(torch.uint8)
    b = dst.reshape(-1).view(torch.uint8)
    if a.numel() % 4 == 0 and a.data_ptr() % 4 == 0 and b.data_ptr() % 4 == 0:
        a, b = a.view(torch.int32), b.view(torch.int32)
    n = a.numel()
    kernel[(triton.cdiv(n, block),)](a, b, n, BLOCK=block, num_warps=num_warps)


def sm_copy_bandwidth_gbs(device=None, n_bytes: int = 1 << 30, reps: int = 20) -> float:
    """The device copy ceiling in GB/s (1e9 B/s), bytes counted = read + write = 2 * n_bytes.

    Measured the way the norm kernels are measured: a simple Triton copy kernel (int32 words,
    16-byte vector loads/stores, masked tail) over ``n_bytes``, captured in a CUDA graph and
    timed by `graph_replay_us` (median replay, L2 flushed before each); the best of
    `SM_COPY_CONFIGS`. This is the floor the norm is compared with. It differs from an eager
    ``copy_`` (see `copy_bandwidth_gbs`): on the H200 an eager copy_ measured 4127 GB/s, a
    graph-captured copy_ only 2711 GB/s, so copy_ is not a fair ceiling for graph replays.
    """
    _require_cuda("sm_copy_bandwidth_gbs")
    device = torch.device(device) if device is not None else torch.device("cuda")
    src = torch.randint(0, 256, (n_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = 0.0
    with torch.cuda.device(device):
        for block, warps in SM_COPY_CONFIGS:
            t = graph_replay_us(lambda: sm_copy_run(src, dst, block, warps), reps=reps)
            best = max(best, 2 * n_bytes / (t["p50_us"] * 1e-6) / 1e9)
    if not torch.equal(src, dst):
        raise RuntimeError("the SM copy kernel produced a wrong copy; the ceiling is not valid")
    return best


def copy_bandwidth_gbs(device=None, n_bytes: int = 1 << 30, reps: int = 20, warmup: int = 3) -> float:
    """Eager ``dst.copy_(src)`` bandwidth in GB/s, bytes counted = read + write = 2 * n_bytes.

    uint8 buffers of ``n_bytes``; each copy is timed on its own between CUDA events, median over
    ``reps``. Not graph-captured (see `sm_copy_bandwidth_gbs` for why the two differ).
    """
    _require_cuda("copy_bandwidth_gbs")
    device = torch.device(device) if device is not None else torch.device("cuda")
    src = torch.randint(0, 256, (n_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    with torch.cuda.device(device):
        for _ in range(warmup):
            dst.copy_(src)
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends):
            start.record()
            dst.copy_(src)
            end.record()
        torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    return 2 * n_bytes / (ms * 1e-3) / 1e9


# ---- formatting ------------------------------------------------------------------------------

def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in bf16 units in the last place (both bf16; +0 and -0 are the same point): the sign-
    magnitude bit patterns are mapped onto one ordered integer line and subtracted."""
    def ordered(t):
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        mag = bits & 0x7FFF
        return torch.where(bits < 0, -mag, mag)
    return (ordered(a) - ordered(b)).abs()


def fmt_us(us: float) -> str:
    """A duration given in microseconds, in the most readable unit: '59.3 us', '1.24 ms'."""
    if us != us:
        return "nan"
    if us < 1e3:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_bytes(n: float) -> str:
    """A byte count in binary units: '1.00 GiB', '9.19 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


def fmt_gbs(gbs: float) -> str:
    """A bandwidth in GB/s (1e9 bytes per second): '3950 GB/s'."""
    return f"{gbs:.0f} GB/s"
