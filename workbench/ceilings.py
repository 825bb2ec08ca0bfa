"""Ceilings of the device, measured in the run: what a time is read against.

- `copy_ceiling_gbs`: the copy bandwidth (CUDA: a Triton SM copy kernel timed as graph replays,
  `sm_copy_bandwidth_gbs`; CPU: ``copy_``); `copy_bandwidth_gbs` is the eager ``copy_`` on CUDA,
  reported beside it for reference.
- `matmul_tflops`: the dense matmul rate (bf16 on CUDA, fp32 on a CPU).
- `attention_tflops`: the fastest attention kernel's rate for given shapes, among
  `attention_candidates`.

Pure functions: nothing is written to disk. The CUDA-only helpers raise RuntimeError without a
GPU (callers decide whether that is fatal; no number is ever invented).
"""
from __future__ import annotations

import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import dense_attention, fa4_problem, fa4_varlen, flash_varlen, varlen_attention
from .timing import cpu_time_us, cuda_event_ms, graph_replay_us, require_cuda, time_us
from .triton_support import jitted, tl, triton

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

_JITTED: dict = {}


def _copy_kernel():
    """The jitted SM copy kernel (see `workbench.triton_support.jitted`)."""
    # n stays specialized (no do_not_specialize): knowing n % 16 == 0 lets the masked accesses vectorize
    return jitted(_JITTED, "copy", lambda: {"copy": (_sm_copy_kernel, {})},
                  "the SM copy kernel needs the `triton` package")


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
    ``copy_`` (see `copy_bandwidth_gbs`): a graph-captured ``copy_`` runs well below an eager one,
    so ``copy_`` is not a fair ceiling for graph replays.
    """
    require_cuda("sm_copy_bandwidth_gbs")
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
    require_cuda("copy_bandwidth_gbs")
    device = torch.device(device) if device is not None else torch.device("cuda")
    src = torch.randint(0, 256, (n_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    with torch.cuda.device(device):
        ms = statistics.median(cuda_event_ms(lambda: dst.copy_(src), reps, warmup=warmup))
    return 2 * n_bytes / (ms * 1e-3) / 1e9


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


# ---- attention rates (the encoder latency study's practical floor) ---------------------------

def attention_candidates(device, dtype, head_dim: int | None = None) -> tuple[str, ...]:
    """Attention kernels `attention_tflops` tries on ``device``/``dtype``: on CUDA in fp16/bf16
    torch's flash varlen and, for equal sequences, SDPA's cuDNN, flash and memory-efficient
    backends, and FlashAttention-4 where it runs ``head_dim``; elsewhere one SDPA call per sequence
    (what the towers run on a CPU). The best of them is the device's rate, whatever the tower runs."""
    if torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        fa4 = ("fa4",) if fa4_problem(device, head_dim) is None else ()
        return ("flash_varlen", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", *fa4)
    return ("sdpa_loop",)


_ATTN_RATES: dict = {}


def attention_tflops(seq_rows: int, n_seqs: int, heads: int, head_dim: int, device, dtype,
                     reps: int = 10) -> tuple[float, str, dict]:
    """The fastest attention rate (TFLOP/s, 4 x s^2 x heads x head_dim per sequence) over
    ``n_seqs`` sequences of ``seq_rows`` rows among `attention_candidates`, measured now on random
    inputs (graph replays on CUDA, host time elsewhere): (rate, kernel name, {kernel: rate}).
    Kernels that refuse the shape are left out. Remembered per shape for the process."""
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
        q4, k4, v4 = (t.view(n_seqs, seq_rows, heads, head_dim).transpose(1, 2) for t in (q, k, v))

        def fn():
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4)
        return fn

    fns = {"flash_varlen": lambda: flash_varlen(q, k, v, cu, seq_rows),
           "sdpa_cudnn": (lambda: dense_attention(q, k, v, seq_rows)),
           "sdpa_flash": sdpa("FLASH_ATTENTION"), "sdpa_efficient": sdpa("EFFICIENT_ATTENTION"),
           "sdpa_loop": lambda: varlen_attention(q, k, v, cu, seq_rows, "loop"),
           "fa4": lambda: fa4_varlen(q, k, v, cu, seq_rows)}
    rates = {}
    for name in attention_candidates(dev, dtype, head_dim):
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
