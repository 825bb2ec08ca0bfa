"""Variable-length (block-diagonal) attention over packed rows.

Rows of several images / frames are packed into one [N, heads, head_dim] tensor; `cu_seqlens`
([S+1] int32, cumulative row offsets) says where each sequence starts. Rows at or beyond
`cu_seqlens[-1]` belong to no sequence (a graph runner's padding).

Backends (`ATTN_BACKENDS`):
- ``fa4``: FlashAttention-4's CuTe forward (`flash_attn.cute.flash_attn_varlen_func`, the optional
  ``flash-attn-4`` package; CUDA SM90+, fp16/bf16, head dims that are multiples of 8). It runs
  mixed packs faster than torch's flash varlen and cuDNN's dense attention (the rates:
  results/reference/README.md), so ``auto`` takes it wherever it is installed and runs.
  Graph-safe like ``varlen`` (`max_seqlen` fixed on the host, `cu_seqlens` read on the device);
  rows outside every sequence are left unwritten. Unlike torch's flash, its last key tile of the
  last sequence may read past the sequence's end, so a NaN in a padding row's key or value would
  reach real rows (0 x NaN): the keys and values of rows at or past ``cu_seqlens[-1]`` are zeroed
  first, in place, by a kernel that reads the end on the device and writes only those rows. Its
  first call per head dim compiles: towers run it when they resolve their kernels (`warm_fa4`).
- ``varlen``: torch's Flash Attention varlen kernel (the op behind
  `torch.nn.attention.varlen.varlen_attn`, called directly: the wrapper adds a host-side custom-op
  dispatch and one extra kernel per call; CUDA, fp16/bf16 only). Graph-safe: `max_seqlen` is fixed
  at capture, `cu_seqlens` is read on the device. Rows that belong to no sequence are left
  unwritten, exactly as the engines' kernels do (the NaN-leak hazard). When the caller knows that
  every sequence has the same length L >= `DENSE_MIN_ROWS` and no row is padding (``dense_seqlen``,
  fixed on the host like `max_seqlen`), the sequences run as one dense batch through cuDNN's
  attention instead, which is faster than flash from that length on and slower below it; cuDNN's
  own varlen mode (ragged offsets) was far slower and broke graph capture, so padded or
  mixed-length packs stay on flash (the rates: results/reference/README.md).
- ``masked``: dense SDPA with a block-diagonal mask built on the device from `cu_seqlens`.
  Graph-safe in any dtype (fp32 on CUDA); memory grows as N^2, so it suits budgets up to a few
  thousand rows. Padding rows attend among themselves only, and their keys and values are zeroed
  first (a masked NaN would otherwise leak: masks are added, and NaN + -inf and 0 * NaN are NaN).
- ``loop``: one SDPA call per sequence, offsets read on the host. Not graph-safe; the CPU default.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .triton_support import jitted, tl

ATTN_BACKENDS = ("auto", "fa4", "varlen", "masked", "loop")
# the smallest sequence (rows) run as dense cuDNN attention when dense_seqlen allows it
DENSE_MIN_ROWS = 1024


def check_backend(backend) -> str:
    """``backend`` if it names one of ATTN_BACKENDS, else ValueError naming it and the valid ones."""
    if not isinstance(backend, str) or backend not in ATTN_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; valid: {ATTN_BACKENDS}")
    return backend


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int | None = None) -> str:
    """The concrete backend for ``auto`` (CUDA and fp16/bf16: ``fa4`` where it is installed and runs
    ``head_dim``, else ``varlen``; CUDA otherwise ``masked``; CPU ``loop``); an explicit choice the
    device, dtype or head dim cannot run is a ValueError naming the valid ones."""
    check_backend(backend)
    device = torch.device(device)
    half = dtype in (torch.float16, torch.bfloat16)
    if backend == "auto":
        if device.type == "cuda":
            if half and fa4_problem(device, head_dim) is None:
                return "fa4"
            return "varlen" if half and _has_varlen() else "masked"
        return "loop"
    if backend in ("varlen", "fa4") and (device.type != "cuda" or not half):
        raise ValueError(f"attention backend {backend!r} needs CUDA and fp16/bf16, got device={device}, "
                         f"dtype={dtype}; use 'masked' (graph-safe, any dtype) or 'loop'")
    if backend == "varlen" and not _has_varlen():
        raise ValueError("attention backend 'varlen' needs torch>=2.10 "
                         "(torch.nn.attention.varlen.varlen_attn); use 'masked' or 'loop'")
    if backend == "fa4":
        problem = fa4_problem(device, head_dim)
        if problem is not None:
            raise ValueError(f"attention backend 'fa4' {problem}; use 'auto', 'varlen', 'masked' or 'loop'")
    return backend


def _fa4_func():
    """FlashAttention-4's varlen forward, or None where the package is not installed."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - ImportError, or a broken install of its CuTe libraries
        return None
    return flash_attn_varlen_func


def fa4_problem(device, head_dim: int | None) -> str | None:
    """Why FlashAttention-4 cannot run on ``device`` for ``head_dim`` (None: it can)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"needs a CUDA device, got {device}"
    if head_dim is not None and head_dim % 8:
        return f"needs a head dim that is a multiple of 8, got {head_dim}"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"needs compute capability 9.0 or newer (Hopper, Blackwell), got {major}.x"
    if _fa4_func() is None:
        return "is not installed (pip install flash-attn-4; docs/gpu-hosts.md says how to bring it to " \
               "a host without a registry)"
    return None


def _has_varlen() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


if tl is not None:
    def _zero_tail_kernel(x_ptr, end_ptr, n_rows, row_stride, W: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_W: tl.constexpr):
        r0 = tl.program_id(0) * BLOCK_R
        end = tl.load(end_ptr)
        if r0 + BLOCK_R > end:                     # blocks of real rows only read the end
            rows = r0 + tl.arange(0, BLOCK_R)
            keep = (rows >= end) & (rows < n_rows)
            zero = tl.zeros([BLOCK_R, BLOCK_W], dtype=x_ptr.dtype.element_ty)
            for w0 in range(0, W, BLOCK_W):
                cols = w0 + tl.arange(0, BLOCK_W)
                ptr = x_ptr + rows[:, None].to(tl.int64) * row_stride + cols[None, :]
                tl.store(ptr, zero, mask=keep[:, None] & (cols[None, :] < W))

_JITTED: dict = {}


def zero_tail_(x: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """Zero the rows of ``x`` ([N, H, D], each row's H x D contiguous) at or past ``end`` (a
    1-element int32 CUDA tensor), in place and graph-safe; returns ``x``."""
    n, h, d = x.shape
    if x.stride(2) != 1 or x.stride(1) != d:
        x.masked_fill_((torch.arange(n, device=x.device) >= end)[:, None, None], 0)
        return x
    kernel = jitted(_JITTED, "zero_tail", lambda: {"zero_tail": (_zero_tail_kernel, {})},
                    "zeroing padding rows needs the `triton` package")
    block_r = 16
    kernel[(-(-n // block_r),)](x, end, n, x.stride(0), W=h * d, BLOCK_R=block_r, BLOCK_W=256)
    return x


_FA4_WARM: set = set()


def warm_fa4(heads: int, head_dim: int, dtype: torch.dtype, device) -> None:
    """Run FlashAttention-4's varlen forward once on a small pack of ``heads`` x ``head_dim``, so that
    its JIT compile (seconds per head dim and dtype) happens now, at build time, once per process,
    never inside a timed call or a graph capture."""
    key = (heads, head_dim, dtype, str(torch.device(device)))
    if key in _FA4_WARM or torch.cuda.is_current_stream_capturing():
        return
    with torch.no_grad():
        q, k, v = (torch.zeros(128, heads, head_dim, dtype=dtype, device=device) for _ in range(3))
        fa4_varlen(q, k, v, torch.tensor([0, 128], dtype=torch.int32, device=device), 128)
    _FA4_WARM.add(key)


def fa4_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
               max_seqlen: int) -> torch.Tensor:
    """FlashAttention-4's varlen forward on [N, H, D] (q, k, v may be strided views of one qkv).
    Keys and values of rows past the last sequence are zeroed in place first (module docstring)."""
    if q.device.type == "meta":     # an allocation trace (`planner.capture_trace`): under no_grad FA4
        return q.new_empty(q.shape)  # allocates its output and no log-sum-exp; nothing to zero
    end = cu_seqlens[-1:]
    zero_tail_(k, end)
    zero_tail_(v, end)
    return _fa4_func()(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                       max_seqlen_k=max_seqlen)[0]


def use_dense(backend: str, dense_seqlen: int | None) -> bool:
    """Whether `varlen_attention` runs dense cuDNN attention for these arguments."""
    return backend == "varlen" and dense_seqlen is not None and dense_seqlen >= DENSE_MIN_ROWS


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlen: int) -> torch.Tensor:
    """N / seqlen equal sequences of ``seqlen`` rows as one batched cuDNN attention; [N, H, D] in
    and out (q, k, v may be strided views of one qkv tensor)."""
    n, h, d = q.shape
    if n % seqlen:
        raise ValueError(f"{n} rows do not split into sequences of {seqlen}")
    s = n // seqlen
    q4, k4, v4 = (t.view(s, seqlen, h, d).transpose(1, 2) for t in (q, k, v))
    o = torch.ops.aten._scaled_dot_product_cudnn_attention(q4, k4, v4, None, False, 0.0, False, False)[0]
    return o.transpose(1, 2).reshape(n, h, d)


def flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                 max_seqlen: int) -> torch.Tensor:
    """torch's flash varlen forward, called as `varlen_attn` calls it, without its wrapper."""
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None:  # pragma: no cover - older torch: the public wrapper
        from torch.nn.attention.varlen import varlen_attn
        return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)
    return op(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, False, False)[0]


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, backend: str, dense_seqlen: int | None = None) -> torch.Tensor:
    """Block-diagonal attention. q, k, v: [N, H, D]; cu_seqlens: [S+1] int32; returns [N, H, D].

    dense_seqlen: every sequence has this many rows and none is padding (see `use_dense`); only
    the ``varlen`` backend uses it."""
    if backend == "fa4":
        return fa4_varlen(q, k, v, cu_seqlens, max_seqlen)
    if backend == "varlen":
        if use_dense(backend, dense_seqlen):
            return dense_attention(q, k, v, dense_seqlen)
        return flash_varlen(q, k, v, cu_seqlens, max_seqlen)
    if backend == "masked":
        n = q.shape[0]
        rows = torch.arange(n, device=q.device, dtype=cu_seqlens.dtype)
        # segment id of each row; rows past the last offset get id S (padding, a block of its own)
        seg = torch.searchsorted(cu_seqlens[1:].contiguous(), rows, right=True)
        mask = seg[:, None] == seg[None, :]                               # [N, N] bool
        # a masked key still enters the products: its score gets -inf *added* (NaN + -inf = NaN) and
        # its value weight 0 (0 * NaN = NaN). Zero keys and values of rows outside every sequence so
        # stale NaN/Inf in padding cannot reach real rows.
        pad = (rows >= cu_seqlens[-1])[:, None, None]
        k, v = k.masked_fill(pad, 0), v.masked_fill(pad, 0)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             attn_mask=mask)
        return out.transpose(0, 1)
    if backend == "loop":
        out = torch.empty_like(q)  # rows outside every sequence stay unwritten, like the kernels
        offsets = cu_seqlens.tolist()
        for start, end in zip(offsets[:-1], offsets[1:]):
            if end > start:
                sl = slice(start, end)
                # [1, heads, rows, head_dim]: SDPA takes its fused kernels for 4-D inputs only (3-D ones run the
                # math fallback, with its masked-softmax guards)
                out[sl] = F.scaled_dot_product_attention(
                    *(t[sl].transpose(0, 1)[None] for t in (q, k, v)))[0].transpose(0, 1)
        return out
    raise ValueError(f"unknown attention backend {backend!r}; valid: {ATTN_BACKENDS[1:]}")
