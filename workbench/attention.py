"""Variable-length (block-diagonal) attention over packed rows.

Rows of several images / frames are packed into one [N, heads, head_dim] tensor; `cu_seqlens`
([S+1] int32, cumulative row offsets) says where each sequence starts. Rows at or beyond
`cu_seqlens[-1]` belong to no sequence (a graph runner's padding).

Backends (`ATTN_BACKENDS`):
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

ATTN_BACKENDS = ("auto", "varlen", "masked", "loop")
# the smallest sequence (rows) run as dense cuDNN attention when dense_seqlen allows it
DENSE_MIN_ROWS = 1024


def check_backend(backend) -> str:
    """``backend`` if it names one of ATTN_BACKENDS, else ValueError naming it and the valid ones."""
    if not isinstance(backend, str) or backend not in ATTN_BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; valid: {ATTN_BACKENDS}")
    return backend


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """Pick the concrete backend for `auto`; validate explicit choices."""
    check_backend(backend)
    device = torch.device(device)
    half = dtype in (torch.float16, torch.bfloat16)
    if backend == "auto":
        if device.type == "cuda":
            return "varlen" if half and _has_varlen() else "masked"
        return "loop"
    if backend == "varlen":
        if device.type != "cuda" or not half:
            raise ValueError(f"attention backend 'varlen' needs CUDA and fp16/bf16, got device={device}, "
                             f"dtype={dtype}; use 'masked' (graph-safe, any dtype) or 'loop'")
        if not _has_varlen():
            raise ValueError("attention backend 'varlen' needs torch>=2.10 "
                             "(torch.nn.attention.varlen.varlen_attn); use 'masked' or 'loop'")
    return backend


def _has_varlen() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


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
                out[sl] = F.scaled_dot_product_attention(
                    q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1)).transpose(0, 1)
        return out
    raise ValueError(f"unknown attention backend {backend!r}; valid: {ATTN_BACKENDS[1:]}")
