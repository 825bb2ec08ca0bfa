"""The measurement core shared by the studies and benchmarks.

- Timers with one set of statistics (p50, p10, p90, min over ``reps``): `graph_replay_us` (CUDA:
  the callable captured once, each replay timed between CUDA events on cold L2) and
  `cpu_time_us` (host wall time after synchronization); `time_us` picks by device.
- Ceilings measured in the run: `copy_ceiling_gbs` (CUDA: a Triton SM copy kernel timed as graph
  replays, see `sm_copy_bandwidth_gbs`; CPU: ``copy_``), `matmul_tflops` (bf16 on CUDA, fp32 on
  CPU); and the floors they give, `floor_us` (bytes / bandwidth) and `flop_floor_us`.
- The byte model of the input path: `norm_traffic` (DRAM bytes one norm call moves),
  `norm_alloc_trace` (the allocations and frees it makes, in order), `count_allocations` (the
  same trace, counted from a real call with a dispatch mode: works on the meta device, so a real
  16384-token budget is sized without memory) and `PoolModel` (torch's CUDA caching allocator
  rules, replayed over a trace: the graph-pool bytes a captured call reserves).
- `captured_memory` measures what a captured callable parks in a fresh graph pool (CUDA).

Pure functions: nothing is written to disk. The CUDA helpers raise RuntimeError without a GPU
(callers decide whether that is fatal; no number is ever invented).

Why graph replays: an input norm runs inside a captured vision tower in the serving engines,
so what matters is the kernel time with launch overhead removed, on cold L2 (the pixel rows
arrive fresh from the host every step). `graph_replay_us` captures the callable once and times
each replay between CUDA events, after overwriting a 256 MB buffer so no input or output of the
previous replay is still in L2 (H200: 60 MB of L2).
"""
from __future__ import annotations

import gc
import math
import statistics
import time
import weakref
from dataclasses import dataclass

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


def cpu_time_us(fn, reps: int = 10, warmup: int = 2) -> dict:
    """Host wall time of ``fn()`` (time.perf_counter): dict(p50_us, p10_us, p90_us, min_us, reps).

    Each rep is bracketed by a device synchronize (when CUDA is initialized), so queued GPU work
    is included and never leaks into the next rep. The same statistics as `graph_replay_us`.
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
    return _summary(samples)


def time_us(fn, device, reps: int = 20, warmup: int = 3) -> dict:
    """`graph_replay_us` on a CUDA device (``fn`` must be graph-safe), `cpu_time_us` elsewhere."""
    if torch.device(device).type == "cuda":
        with torch.cuda.device(torch.device(device)):
            return graph_replay_us(fn, reps=reps, warmup=warmup)
    return cpu_time_us(fn, reps=reps, warmup=warmup)


def _warm_on_side_stream(fn, warmup: int):
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


def graph_replay_us(fn, reps: int = 50, warmup: int = 3, flush_bytes: int = FLUSH_BYTES) -> dict:
    """Time ``fn`` as a CUDA-graph replay: dict(p50_us, p10_us, p90_us, min_us, reps).

    ``fn`` is warmed ``warmup`` times on a side stream (Triton compiles, allocator settles), then
    captured once on that stream into a `torch.cuda.CUDAGraph`. Each of the ``reps`` replays is timed on its own
    between two CUDA events; before each, outside the timed region, a ``flush_bytes`` buffer is
    overwritten so L2 holds none of the replay's data (``flush_bytes=0`` times warm replays).
    ``fn`` must be graph-safe (no host syncs); tensors it allocates come from the graph's pool and
    are reused by every replay.
    """
    _require_cuda("graph_replay_us")
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    stream = _warm_on_side_stream(fn, warmup)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
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

from . import default_triton_mode
from .norms import check_norm_name

default_triton_mode()   # before Triton is imported: the interpreter on machines without CUDA
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


def spacing_ulps(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, floor: float = 2 ** -4) -> torch.Tensor:
    """|got - want| in units of ``dtype``'s spacing at |want| (bf16 or fp16), the spacing taken no
    finer than at ``floor``: a result near zero that is a difference of O(1) terms (a norm's
    x - mean, plus a bias) carries the rounding error of those terms, not of the tiny result."""
    bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]        # explicit mantissa bits
    got, want = got.float(), want.float()
    spacing = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(floor))) - bits)
    return (got - want).abs() / spacing


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


def device_label(device) -> str:
    """One name for a device, used in every table and figure: 'NVIDIA H200', 'cpu: <model>'."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    from .provenance import cpu_model
    return f"cpu: {cpu_model()}"


# ---- ceilings and floors --------------------------------------------------------------------

def copy_ceiling_gbs(device, n_bytes: int | None = None, reps: int = 10) -> float:
    """The copy ceiling of ``device`` in GB/s (read + write counted), measured now.

    CUDA: `sm_copy_bandwidth_gbs` (a Triton copy kernel as graph replays, the way every norm and
    staging step is timed; 1 GiB by default). CPU: ``dst.copy_(src)`` of 64 MiB uint8, median
    host time: the memory bandwidth a CPU run's times should be read against.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return sm_copy_bandwidth_gbs(dev, n_bytes=n_bytes or 1 << 30, reps=reps)
    n = n_bytes or 64 << 20
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = cpu_time_us(lambda: dst.copy_(src), reps=reps, warmup=2)
    return 2 * n / (t["p50_us"] * 1e-6) / 1e9


def matmul_tflops(device, n: int | None = None, reps: int = 10) -> float:
    """Dense matmul rate of ``device`` in TFLOP/s, measured now: bf16 n^3 (n=8192) as graph
    replays on CUDA; fp32 (n=512) host-timed on a CPU. The FLOP floor of the towers uses it."""
    dev = torch.device(device)
    if dev.type == "cuda":
        n = n or 8192
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        t = time_us(lambda: torch.mm(a, b, out=c), dev, reps=reps)
    else:
        n = n or 512
        a, b = torch.randn(n, n), torch.randn(n, n)
        t = cpu_time_us(lambda: a @ b, reps=reps)
    return 2 * n ** 3 / (t["p50_us"] * 1e-6) / 1e12


def floor_us(n_bytes: float, gbs: float) -> float:
    """The time ``n_bytes`` of DRAM traffic take at ``gbs`` GB/s, in microseconds."""
    return n_bytes / (gbs * 1e3)


def flop_floor_us(flops: float, tflops: float) -> float:
    """The time ``flops`` take at ``tflops`` TFLOP/s, in microseconds."""
    return flops / (tflops * 1e6)


def tower_flops(cfg, seq_rows) -> dict:
    """FLOPs of one tower forward over sequences of ``seq_rows`` pixel rows each (one per image or
    video frame), counted from the config: dict(matmul, attention_full, attention_window, total).

    matmul: 2 x the multiply-adds of the patch embedding, every block's qkv, projection and MLP
    (fc1 + fc2, or gate + up + down for SwiGLU) per row, and the merger per merged token.
    attention: QK^T and PV, 4 x s^2 x width per block and sequence of s rows, in the blocks with
    full attention; Qwen2.5-VL's window blocks attend within windows of (window_merged x
    merge_size)^2 rows, counted as whole windows (an upper bound at ragged image edges).
    """
    seq_rows = [int(s) for s in seq_rows]
    rows = sum(seq_rows)
    w, m = cfg.width, cfg.mlp_hidden
    mlp = 2 * w * m if cfg.family == "qwen2-vl" else 3 * w * m
    per_row = cfg.patch_dim * w + cfg.depth * (4 * w * w + mlp)
    merged = w * cfg.merge_unit
    merger = merged * merged + merged * cfg.out_hidden
    matmul = 2 * (per_row * rows + merger * rows // cfg.merge_unit)
    full_blocks = cfg.depth if cfg.family == "qwen2-vl" else len(cfg.fullatt_blocks)
    window_blocks = cfg.depth - full_blocks
    win = (cfg.window_merged * cfg.merge_size) ** 2
    full = full_blocks * sum(4 * s * s * w for s in seq_rows)
    window = window_blocks * sum(4 * min(s, win) * s * w for s in seq_rows)
    return dict(matmul=matmul, attention_full=full, attention_window=window, total=matmul + full + window)


# ---- the byte model of one norm call ----------------------------------------------------------

def _esize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def norm_traffic(name: str, n_rows: int, patch_dim: int, in_dtype: torch.dtype = torch.uint8,
                 out_dtype: torch.dtype = torch.bfloat16, n_valid: int | None = None,
                 out: bool = False) -> dict:
    """DRAM bytes one call of norm ``name`` moves on ``n_rows`` x ``patch_dim`` input, pass by pass
    (one full read and write per torch op, caches ignored; the scale/shift tables, a few KB, too).

    n_valid: rows a graph-safe call is told are real (None: all); out: whether the call writes
    into a preallocated ``out=`` (the runner placement) instead of returning a new tensor.
    Returns dict(bytes, min_bytes, passes, traffic_ratio): ``min_bytes`` is read-once + write-once
    of the rows that must be written. Eager uint8 -> bf16 is 27 B/element (9x the 3 B floor):
    ``to(f32)`` 1+4, ``* scale`` 4+4, ``+ shift`` 4+4, ``to(bf16)`` 4+2. With n_valid and out it
    computes every row and then selects: + arange/compare (12 B/row), ``where`` 2+2+2, ``copy_`` 2+2.
    triton_rows skips padding tiles (reads/writes only valid rows); triton_flat and triton_channel
    mask padding (no traffic, but every program still launches); identity is a cast (+ the same
    select as eager when n_valid and out are given).
    """
    check_norm_name(name)
    i, o = _esize(in_dtype), _esize(out_dtype)
    d = patch_dim
    valid = n_rows if n_valid is None else max(0, min(n_valid, n_rows))
    work = n_rows if name in ("eager", "identity") else valid
    select = n_valid is not None and out
    per_elem, passes = 0, 0
    if name == "eager":
        steps = ([] if in_dtype == torch.float32 else [(i, 4)]) + [(4, 4), (4, 4)]
        if out and not select:
            steps.append((4, o))                       # out.copy_(y) casts on the way
        elif out_dtype != torch.float32:
            steps.append((4, o))
        per_elem, passes = sum(a + b for a, b in steps), len(steps)
    elif name == "identity":
        per_elem, passes = (0, 0) if (in_dtype == out_dtype and not out) else (i + o, 1)
    else:
        per_elem, passes = i + o, 1
    total = per_elem * work * d
    if select and name in ("eager", "identity"):
        total += n_rows * (8 + 1 + 1) + n_rows * d * (3 * o + 2 * o)   # arange, <, where, copy_
        passes += 4
    min_bytes = (i + o) * valid * d
    return dict(bytes=total, min_bytes=min_bytes, passes=passes,
                traffic_ratio=total / min_bytes if min_bytes else math.nan)


def norm_alloc_trace(name: str, n_rows: int, patch_dim: int, in_dtype: torch.dtype = torch.uint8,
                     out_dtype: torch.dtype = torch.bfloat16, n_valid: bool = False,
                     out: bool = False) -> list[tuple[str, int, int]]:
    """The allocations and frees of one call of norm ``name`` (workbench.norms), in order, as
    ``("alloc", id, bytes)`` / ``("free", id, bytes)``; what is still allocated at the end is the
    output. Derived from the implementation's code (see `count_allocations` for the check):

    eager   x.to(f32) [A], * scale [B], free A, + shift [C], free B, then: out= without n_valid:
            copy_ into out, free C; else C.to(out_dtype) [D] (none when out_dtype is fp32) and,
            with both n_valid and out, arange [E], < [F], free E, where [G], copy_, free G, D, F;
            free C.
    triton  the output [O] when no out= is given; nothing else (fp32 stays in registers).
    identity the cast [O] (none when dtypes match), plus the select of eager when n_valid and out.
    """
    check_norm_name(name)
    el = n_rows * patch_dim
    ob = el * _esize(out_dtype)
    events: list[tuple[str, int, int]] = []
    ids = iter(range(1_000_000))
    live: dict[str, tuple[int, int]] = {}

    def alloc(tag, nbytes):
        k = next(ids)
        live[tag] = (k, nbytes)
        events.append(("alloc", k, nbytes))

    def free(tag):
        k, nbytes = live.pop(tag)
        events.append(("free", k, nbytes))

    def select(src_tag):
        alloc("arange", n_rows * 8)
        alloc("keep", n_rows)
        free("arange")
        alloc("where", ob)
        free("where")
        if src_tag:
            free(src_tag)
        free("keep")

    if name == "eager":
        if in_dtype != torch.float32:
            alloc("A", el * 4)
        alloc("B", el * 4)
        if in_dtype != torch.float32:
            free("A")
        alloc("C", el * 4)
        free("B")
        if out and not n_valid:
            free("C")
            return events
        cast = out_dtype != torch.float32
        if cast:
            alloc("D", ob)
        if n_valid and out:
            select("D" if cast else None)
        free("C")
    elif name == "identity":
        cast = in_dtype != out_dtype
        if out and not n_valid:
            return events
        if cast:
            alloc("O", ob)
        if n_valid and out:
            select("O" if cast else None)
    else:
        if not out:
            alloc("O", ob)
    return events


class _Counter(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every fresh tensor an op returns (aliases and in-place results skipped) and the
    moment its memory is freed (a weakref callback on its storage)."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int, int]] = []
        self._next = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for r, t in zip(returns, outs):
            if not isinstance(t, torch.Tensor) or r.alias_info is not None:
                continue
            nbytes = t.untyped_storage().nbytes()
            k = self._next
            self._next += 1
            self.events.append(("alloc", k, nbytes))
            # the storage, not the tensor: a view (q, k, v of one qkv output) keeps the memory
            # alive after the tensor that owned it dies; torch keeps one Python storage object
            # per storage, which dies with the last tensor or view on it
            weakref.finalize(t.untyped_storage(), self.events.append, ("free", k, nbytes))
        return out


def count_allocations(fn) -> tuple[list[tuple[str, int, int]], object]:
    """Run ``fn()`` and return (its allocation trace, its result), in `norm_alloc_trace`'s form.

    Counted with a TorchDispatchMode: every non-aliasing op output is an allocation, freed when
    the Python tensor dies. Works on CPU tensors and on the meta device (no memory is used)."""
    counter = _Counter()
    with counter:
        result = fn()
    return counter.events, result


def trace_peak_bytes(trace) -> dict:
    """Peak live bytes of a trace, the bytes still live at its end (the output), and the peak of
    the temporaries alone (allocations freed before the end); exact sizes, no rounding."""
    freed = {k for kind, k, _ in trace if kind == "free"}
    live = peak = temp = temp_peak = 0
    for kind, k, nbytes in trace:
        sign = 1 if kind == "alloc" else -1
        live += sign * nbytes
        if k in freed:
            temp += sign * nbytes
        peak, temp_peak = max(peak, live), max(temp_peak, temp)
    return dict(peak_bytes=peak, end_bytes=live, temp_peak_bytes=temp_peak)


# ---- torch's CUDA caching allocator, as a model ---------------------------------------------

@dataclass
class _Block:
    seg: int
    offset: int
    size: int
    free: bool = True


class PoolModel:
    """torch's CUDA caching allocator (default settings, no expandable segments), replayed over
    an allocation trace for one private graph pool; gives the bytes the pool reserves.

    The rules it follows (c10/cuda/CUDACachingAllocator): sizes round up to 512 B; requests up to
    1 MiB come from the small pool (2 MiB segments), larger ones from the large pool, where a
    request under 10 MiB gets a 20 MiB segment and a larger one its own segment rounded up to
    2 MiB; a request takes the smallest free block that fits (best fit) and splits it when the
    rest is >= 512 B (small) or > 1 MiB (large); a freed block merges with free neighbours of its
    segment. Blocks freed during a capture are reused by later allocations of the same capture.
    """

    MIN_BLOCK = 512
    SMALL_SIZE = 1 << 20
    SMALL_BUFFER = 2 << 20
    LARGE_BUFFER = 20 << 20
    MIN_LARGE_ALLOC = 10 << 20
    ROUND_LARGE = 2 << 20

    def __init__(self):
        self.segments: list[list[_Block]] = []
        self.small: list[bool] = []
        self.reserved = self.allocated = self.peak_allocated = 0
        self._held: dict[int, _Block] = {}

    @classmethod
    def round_size(cls, nbytes: int) -> int:
        return max(cls.MIN_BLOCK, -(-nbytes // cls.MIN_BLOCK) * cls.MIN_BLOCK)

    @classmethod
    def segment_size(cls, size: int) -> int:
        if size <= cls.SMALL_SIZE:
            return cls.SMALL_BUFFER
        if size < cls.MIN_LARGE_ALLOC:
            return cls.LARGE_BUFFER
        return -(-size // cls.ROUND_LARGE) * cls.ROUND_LARGE

    def malloc(self, key: int, nbytes: int) -> None:
        size = self.round_size(nbytes)
        small = size <= self.SMALL_SIZE
        fits = [b for s, seg in enumerate(self.segments) if self.small[s] == small
                for b in seg if b.free and b.size >= size]
        if fits:
            block = min(fits, key=lambda b: (b.size, b.seg, b.offset))
        else:
            seg_size = self.segment_size(size)
            block = _Block(len(self.segments), 0, seg_size)
            self.segments.append([block])
            self.small.append(small)
            self.reserved += seg_size
        rest = block.size - size
        if (small and rest >= self.MIN_BLOCK) or (not small and rest > self.SMALL_SIZE):
            seg = self.segments[block.seg]
            tail = _Block(block.seg, block.offset + size, rest)
            seg.insert(seg.index(block) + 1, tail)
            block.size = size
        block.free = False
        self._held[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        block = self._held.pop(key)
        block.free = True
        self.allocated -= block.size
        seg = self.segments[block.seg]
        i = seg.index(block)
        if i + 1 < len(seg) and seg[i + 1].free:
            block.size += seg.pop(i + 1).size
        if i > 0 and seg[i - 1].free:
            prev = seg[i - 1]
            prev.size += block.size
            seg.pop(i)

    def run(self, trace) -> "PoolModel":
        for kind, key, nbytes in trace:
            if kind == "alloc":
                self.malloc(key, nbytes)
            else:
                self.free(key)
        return self


def pool_model(trace) -> dict:
    """`PoolModel` over ``trace``: dict(pool_bytes reserved, peak_bytes allocated, end_bytes)."""
    m = PoolModel().run(trace)
    return dict(pool_bytes=m.reserved, peak_bytes=m.peak_allocated, end_bytes=m.allocated)


def _pool_segment_bytes(pool_id) -> int | None:
    """Bytes of the allocator segments that belong to graph pool ``pool_id`` (None if this torch's
    memory snapshot does not say which pool a segment belongs to)."""
    segments = torch.cuda.memory_snapshot()
    if segments and "segment_pool_id" not in segments[0]:
        return None
    return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id") or ()) == tuple(pool_id))


def captured_memory(fn, device, warmup: int = 2) -> dict:
    """What capturing ``fn`` into a fresh CUDA graph pool costs: dict(pool_bytes = bytes of the
    segments of the graph's own pool, per the allocator's memory snapshot; reserved_bytes =
    reserved bytes the capture added, the same figure from the global counter; peak_bytes = peak
    allocated bytes during the capture above what was allocated before; end_bytes = still
    allocated after).

    ``fn`` is warmed on the stream the capture then uses (Triton compiles; cuBLAS allocates one
    workspace per stream, 32 MiB on Hopper, which would otherwise land in the first pool captured
    on a new stream), then the cache is emptied so that only the capture's own segments are
    counted. A trivial graph is kept captured meanwhile: the first graph registered with the
    CUDA generator allocates its RNG seed and offset (2 x 512 B, outside the graph's pool, in
    whatever small segment has room), which is no part of what ``fn`` costs. The measured graph
    is kept alive until the counters are read, then released."""
    _require_cuda("captured_memory")
    dev = torch.device(device)
    with torch.cuda.device(dev):
        stream = _warm_on_side_stream(fn, warmup)
        tiny = torch.zeros(1, device=dev)
        keeper = torch.cuda.CUDAGraph()
        with torch.cuda.graph(keeper, stream=stream):
            tiny.add_(1)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        reserved0, allocated0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            result = fn()
        torch.cuda.synchronize()
        reserved = torch.cuda.memory_reserved() - reserved0
        own = _pool_segment_bytes(graph.pool())
        out = dict(pool_bytes=reserved if own is None else own, reserved_bytes=reserved,
                   peak_bytes=torch.cuda.max_memory_allocated() - allocated0,
                   end_bytes=torch.cuda.memory_allocated() - allocated0)
        del result, graph, keeper
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return out


def eager_peak_bytes(fn, device) -> dict:
    """Peak allocated bytes of one eager call of ``fn`` above what was allocated before (CUDA),
    and what stayed allocated after it: dict(peak_bytes, end_bytes)."""
    _require_cuda("eager_peak_bytes")
    with torch.cuda.device(torch.device(device)):
        torch.cuda.synchronize()
        allocated0 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        torch.cuda.synchronize()
        out = dict(peak_bytes=torch.cuda.max_memory_allocated() - allocated0,
                   end_bytes=torch.cuda.memory_allocated() - allocated0)
        del result
    return out


# ---- attention rates and kernel breakdown (the encoder latency study's practical floor) ---------

def attention_candidates(device, dtype) -> tuple[str, ...]:
    """Attention kernels `attention_tflops` tries on ``device``/``dtype``: on CUDA in fp16/bf16
    torch's flash varlen and, for equal sequences, SDPA's cuDNN, flash and memory-efficient
    backends; elsewhere one SDPA call per sequence (what the towers run on a CPU)."""
    if torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return ("flash_varlen", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient")
    return ("sdpa_loop",)


_ATTN_RATES: dict = {}


def attention_tflops(seq_rows: int, n_seqs: int, heads: int, head_dim: int, device, dtype,
                     reps: int = 10) -> tuple[float, str, dict]:
    """The fastest attention rate (TFLOP/s, 4 x s^2 x heads x head_dim per sequence) over
    ``n_seqs`` sequences of ``seq_rows`` rows among `attention_candidates`, measured now on random
    inputs (graph replays on CUDA, host time elsewhere): (rate, kernel name, {kernel: rate}).
    Kernels that refuse the shape are left out. Remembered per shape for the process."""
    from .attention import dense_attention, flash_varlen, varlen_attention

    dev = torch.device(device)
    key = (seq_rows, n_seqs, heads, head_dim, str(dev), dtype)
    if key in _ATTN_RATES:
        return _ATTN_RATES[key]
    n = seq_rows * n_seqs
    gen = torch.Generator(device=dev).manual_seed(seq_rows * 7919 + n_seqs)
    qkv = torch.randn(n, 3, heads, head_dim, device=dev, dtype=dtype, generator=gen)
    q, k, v = qkv.unbind(1)
    cu = torch.arange(0, n + 1, seq_rows, device=dev, dtype=torch.int32)
    flops = 4.0 * seq_rows * seq_rows * heads * head_dim * n_seqs

    def sdpa(backend):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q4, k4, v4 = (t.view(n_seqs, seq_rows, heads, head_dim).transpose(1, 2) for t in (q, k, v))

        def fn():
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4)
        return fn

    fns = {"flash_varlen": lambda: flash_varlen(q, k, v, cu, seq_rows),
           "sdpa_cudnn": (lambda: dense_attention(q, k, v, seq_rows)),
           "sdpa_flash": sdpa("FLASH_ATTENTION"), "sdpa_efficient": sdpa("EFFICIENT_ATTENTION"),
           "sdpa_loop": lambda: varlen_attention(q, k, v, cu, seq_rows, "loop")}
    rates = {}
    for name in attention_candidates(dev, dtype):
        try:
            with torch.inference_mode():
                t = time_us(fns[name], dev, reps=reps, warmup=2)
        except RuntimeError:     # a backend that does not take this shape ("No available kernel")
            continue
        rates[name] = flops / (t["p50_us"] * 1e6)
    if not rates:
        raise RuntimeError(f"no attention kernel ran {n_seqs} x {seq_rows} rows on {dev} ({dtype})")
    best = max(rates, key=rates.get)
    _ATTN_RATES[key] = (rates[best], best, rates)
    return _ATTN_RATES[key]


# kernel (CUDA) or op (CPU) name patterns -> category, first match wins
KERNEL_CATEGORIES = (
    ("attention", r"flash|fmha|cudnn|attention|sdpa"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|aten::(addmm|mm|bmm|matmul|linear)\b"),
    ("input_norm", r"_rows_kernel|_channel_kernel|_flat_kernel"),
    ("norm", r"layer_norm|add_norm|rms|aten::(native_layer_norm|layer_norm|rsqrt|mean|pow)\b|reduce_kernel"),
    ("rotary", r"rotary|CatArrayBatchedCopy|neg_kernel|aten::(cat|neg)\b"),
    ("activation", r"gelu|silu|sigmoid"),
    ("copy", r"copy|memcpy|memset|index|gather|scatter|aten::(index|to|_to_copy|copy_|clone|contiguous)\b"),
)


def kernel_category(name: str) -> str:
    """The category of a CUDA kernel or CPU op name (`KERNEL_CATEGORIES`; 'elementwise' otherwise)."""
    import re
    for cat, pat in KERNEL_CATEGORIES:
        if re.search(pat, name, flags=re.IGNORECASE):
            return cat
    return "elementwise"


def kernel_breakdown(fn, device) -> dict:
    """Device time of one call of ``fn`` by kernel category (torch.profiler): on CUDA the kernels'
    device time, on a CPU the ops' self time. Returns {category: ms, ..., 'kernels': count}."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    fn()                                    # warm: compiles and first-call work stay out
    if cuda:
        torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize(dev)
    out: dict = {"kernels": 0}
    for e in prof.key_averages():
        us = e.device_time_total if cuda else e.self_cpu_time_total if e.key.startswith("aten::") else 0
        if us <= 0:
            continue
        cat = kernel_category(e.key)
        out[cat] = out.get(cat, 0.0) + us / 1e3
        out["kernels"] += e.count
    return out
