"""Fused elementwise work of the tower blocks: one Triton kernel where plain torch launches several.

A Qwen vision block in plain torch launches ~27 (Qwen2-VL) to ~42 (Qwen2.5-VL) kernels, most of
them elementwise passes over the [rows, width] activations: the rotary embedding alone is seven
per q and k (casts, two products, a concatenation for rotate-half, a negation, a sum), an RMSNorm
seven, QuickGELU three. Under a CUDA graph at small token counts each costs a few microseconds of
launch and tail; at large token counts each is a full pass over memory. The kernels here compute
the same functions in one pass each:

- `rotary_`: q and k of the qkv projection output rotated in place (fp32 math, rounded once to
  the activation dtype, as ``apply_rotary`` does; large inputs by a row-tiled kernel that reads
  cos/sin once per row);
- `add_norm`: the residual sum and the next LayerNorm / RMSNorm of it in one pass (the sum rounded
  to the activation dtype first, as the unfused ``x + f(x)`` is; RMSNorm scales after the cast back,
  as transformers' Qwen2RMSNorm does);
- `quick_gelu`: ``x * sigmoid(1.702 x)`` with the unfused path's three roundings;
- `silu_mul`: SwiGLU's ``silu(gate) * up`` over one fused gate|up projection output.

Each kernel is launched with ``enable_fp_fusion=False`` so the compiler keeps every product and sum
separately rounded, as the unfused torch ops round them; what can still differ is the order of
the norms' row reductions (a few fp32 ulps of the statistics). Tests compare each kernel with its
plain-torch twin (`reference_*` here) under ``TRITON_INTERPRET=1`` on a CPU, and on CUDA.

On the ``meta`` device every function allocates exactly what it allocates on CUDA and launches
nothing, so the graph-pool model traces the fused forward. Kernels are jitted on first use (see
`workbench.norms` for how that honours ``TRITON_INTERPRET``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .triton_support import interpreting, jitted, tl, triton

FUSED_DTYPES = (torch.bfloat16, torch.float16)
NORM_KINDS = ("layer", "rms")


# ---- kernels (plain functions, jitted on first use) ------------------------------------------

if tl is not None:
    def _rotary_kernel(qkv_ptr, cos_ptr, sin_ptr, n_pairs,
                       H: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                       BLOCK_P: tl.constexpr, BLOCK_J: tl.constexpr):
        # pairs (row, head) of q (axis 1 = 0) or k (axis 1 = 1); qkv is [N, 3, H, D] contiguous
        pid = tl.program_id(0)
        which = tl.program_id(1)
        p = pid * BLOCK_P + tl.arange(0, BLOCK_P)
        j = tl.arange(0, BLOCK_J)
        pm = p < n_pairs
        jm = j < HALF
        m = pm[:, None] & jm[None, :]
        row = (p // H).to(tl.int64)
        head = p % H
        base = row * (3 * H * D) + which * (H * D) + head * D
        x1p = qkv_ptr + base[:, None] + j[None, :]
        x1 = tl.load(x1p, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x1p + HALF, mask=m, other=0.0).to(tl.float32)
        cb = row * D
        c1 = tl.load(cos_ptr + cb[:, None] + j[None, :], mask=m, other=0.0)
        c2 = tl.load(cos_ptr + cb[:, None] + HALF + j[None, :], mask=m, other=0.0)
        s1 = tl.load(sin_ptr + cb[:, None] + j[None, :], mask=m, other=0.0)
        s2 = tl.load(sin_ptr + cb[:, None] + HALF + j[None, :], mask=m, other=0.0)
        # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1); each product rounded, then the sum
        y1 = x1 * c1 + (-x2) * s1
        y2 = x2 * c2 + x1 * s2
        ty = qkv_ptr.dtype.element_ty
        tl.store(x1p, y1.to(ty), mask=m)
        tl.store(x1p + HALF, y2.to(ty), mask=m)

    def _rotary_tiled_kernel(qkv_ptr, cos_ptr, sin_ptr, n_rows,
                            H: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_R: tl.constexpr):
        # BLOCK_R rows per program, every head of q and k: cos/sin are loaded once per row, not per head
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        h = tl.arange(0, BLOCK_H)
        j = tl.arange(0, BLOCK_J)
        r64 = r.to(tl.int64)[:, None, None]
        cm = (r < n_rows)[:, None, None] & (j < HALF)[None, None, :]
        cb = r64 * D + j[None, None, :]
        c1 = tl.load(cos_ptr + cb, mask=cm, other=0.0)
        c2 = tl.load(cos_ptr + cb + HALF, mask=cm, other=0.0)
        s1 = tl.load(sin_ptr + cb, mask=cm, other=0.0)
        s2 = tl.load(sin_ptr + cb + HALF, mask=cm, other=0.0)
        m = cm & (h < H)[None, :, None]
        ty = qkv_ptr.dtype.element_ty
        for which in tl.static_range(2):       # q, then k
            x1p = qkv_ptr + r64 * (3 * H * D) + which * (H * D) + h[None, :, None] * D + j[None, None, :]
            x1 = tl.load(x1p, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(x1p + HALF, mask=m, other=0.0).to(tl.float32)
            # the same products and sums, rounded as in _rotary_kernel: bit-equal outputs
            tl.store(x1p, (x1 * c1 + (-x2) * s1).to(ty), mask=m)
            tl.store(x1p + HALF, (x2 * c2 + x1 * s2).to(ty), mask=m)

    def _add_norm_kernel(x_ptr, d_ptr, s_ptr, y_ptr, w_ptr, b_ptr, eps, W: tl.constexpr,
                         BLOCK: tl.constexpr, HAS_DELTA: tl.constexpr, RMS: tl.constexpr,
                         HAS_BIAS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        cm = c < W
        off = row * W + c
        x = tl.load(x_ptr + off, mask=cm, other=0.0)
        ty = x.dtype
        if HAS_DELTA:
            x = (x.to(tl.float32) + tl.load(d_ptr + off, mask=cm, other=0.0).to(tl.float32)).to(ty)
            tl.store(s_ptr + off, x, mask=cm)
        xf = x.to(tl.float32)
        w = tl.load(w_ptr + c, mask=cm, other=0.0).to(tl.float32)
        if RMS:
            ms = tl.sum(xf * xf, axis=0) / W
            r = 1.0 / tl.sqrt(ms + eps)
            t = (xf * r).to(ty).to(tl.float32)          # RMSNorm: cast back first, then the weight
            y = w * t
        else:
            mean = tl.sum(xf, axis=0) / W
            xc = tl.where(cm, xf - mean, 0.0)
            var = tl.sum(xc * xc, axis=0) / W
            r = 1.0 / tl.sqrt(var + eps)
            y = (xf - mean) * r * w
            if HAS_BIAS:
                y = y + tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)
        tl.store(y_ptr + off, y.to(ty), mask=cm)

    def _quick_gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m, other=0.0)
        ty = x.dtype
        xf = x.to(tl.float32)
        a = (1.702 * xf).to(ty).to(tl.float32)
        s = (1.0 / (1.0 + tl.exp(-a))).to(ty).to(tl.float32)
        tl.store(y_ptr + i, (xf * s).to(ty), mask=m)

    def _silu_mul_kernel(gu_ptr, y_ptr, HP: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < HP
        g = tl.load(gu_ptr + row * (2 * HP) + c, mask=m, other=0.0)
        ty = g.dtype
        gf = g.to(tl.float32)
        u = tl.load(gu_ptr + row * (2 * HP) + HP + c, mask=m, other=0.0).to(tl.float32)
        sg = (gf / (1.0 + tl.exp(-gf))).to(ty).to(tl.float32)
        tl.store(y_ptr + row * HP + c, (sg * u).to(ty), mask=m)

_JITTED: dict = {}


def _kernel(name: str):
    """The jitted fused kernel `name` (see `workbench.triton_support.jitted`)."""
    return jitted(_JITTED, name, lambda: {"rotary": (_rotary_kernel, {}), "rotary_tiled": (_rotary_tiled_kernel, {}),
                                          "add_norm": (_add_norm_kernel, {}),
                                          "quick_gelu": (_quick_gelu_kernel, {}), "silu_mul": (_silu_mul_kernel, {})},
                  "the fused tower kernels need the `triton` package; build the tower with fused=False")


def available(device) -> bool:
    """Whether the fused kernels can run on ``device``: CUDA with Triton, the meta device (shapes
    only), or a CPU under Triton's interpreter."""
    dev = torch.device(device)
    if triton is None:
        return False
    if dev.type in ("cuda", "meta"):
        return True
    return dev.type == "cpu" and interpreting()


def _launch_ok(t: torch.Tensor) -> bool:
    """False on the meta device (allocate only); raises where no kernel can run."""
    if t.device.type == "meta":
        return False
    if not available(t.device):
        raise RuntimeError(f"the fused tower kernels run on CUDA tensors (or on a CPU under "
                           f"TRITON_INTERPRET=1), got {t.device}; build the tower with fused=False")
    return True


_NOFMA = dict(enable_fp_fusion=False)


# ---- the fused operations -------------------------------------------------------------------

# From this many rows on, rotary_ runs the row-tiled kernel (four rows, every head, per program;
# cos/sin read once per row): the row count from which it beat the per-pair kernel in
# the rotary probe of docs/probes.md (results/reference/README.md).
ROTARY_ROWS_MIN = 1024


def rotary_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q and k of ``qkv`` [N, 3, H, D] (contiguous) in place with cos/sin [N, D] (fp32).

    Two kernels compute it with the same roundings (bit-equal outputs): one (row, head) pair per
    lane group for small N, whole rows per program from `ROTARY_ROWS_MIN` rows."""
    n, three, h, d = qkv.shape
    if three != 3 or not qkv.is_contiguous() or d % 2:
        raise ValueError(f"qkv must be a contiguous [N, 3, H, D] tensor with even D, got {tuple(qkv.shape)}")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.shape != (n, d) or sin.shape != (n, d) \
            or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"cos/sin must be contiguous float32 [{n}, {d}], got {cos.dtype} {tuple(cos.shape)} / "
                         f"{sin.dtype} {tuple(sin.shape)}")
    if not _launch_ok(qkv) or n == 0:
        return qkv
    if n >= ROTARY_ROWS_MIN:
        block_r = 4
        _kernel("rotary_tiled")[(triton.cdiv(n, block_r),)](
            qkv, cos, sin, n, H=h, D=d, HALF=d // 2, BLOCK_H=triton.next_power_of_2(h),
            BLOCK_J=triton.next_power_of_2(d // 2), BLOCK_R=block_r, num_warps=4, **_NOFMA)
        return qkv
    block_p = 32
    grid = (triton.cdiv(n * h, block_p), 2)
    _kernel("rotary")[grid](qkv, cos, sin, n * h, H=h, D=d, HALF=d // 2, BLOCK_P=block_p,
                            BLOCK_J=triton.next_power_of_2(d // 2), num_warps=4, **_NOFMA)
    return qkv


def add_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
             eps: float, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, norm(s)) with s = x + delta rounded to x's dtype (s = x when delta is None).

    kind: 'layer' (LayerNorm with weight and bias) or 'rms' (Qwen2.5-VL RMSNorm, weight only)."""
    if kind not in NORM_KINDS:
        raise ValueError(f"unknown norm kind {kind!r}; valid: {NORM_KINDS}")
    if x.dim() != 2 or not x.is_contiguous() or (delta is not None and (delta.shape != x.shape
                                                                         or not delta.is_contiguous())):
        raise ValueError(f"add_norm takes contiguous [rows, width] tensors, got {tuple(x.shape)}"
                         f"{'' if delta is None else f' and {tuple(delta.shape)}'}")
    n, w = x.shape
    s = torch.empty_like(x) if delta is not None else x
    y = torch.empty_like(x)
    if not _launch_ok(x) or n == 0:
        return s, y
    has_bias = kind == "layer" and bias is not None
    _kernel("add_norm")[(n,)](x, delta if delta is not None else x, s, y, weight,
                              bias if has_bias else weight, float(eps), W=w,
                              BLOCK=triton.next_power_of_2(w), HAS_DELTA=delta is not None,
                              RMS=kind == "rms", HAS_BIAS=has_bias, num_warps=4 if w <= 2048 else 8, **_NOFMA)
    return s, y


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(1.702 x), rounded as the three unfused ops round."""
    if not x.is_contiguous():
        raise ValueError("quick_gelu takes a contiguous tensor")
    y = torch.empty_like(x)
    if not _launch_ok(x) or x.numel() == 0:
        return y
    block = 2048
    _kernel("quick_gelu")[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block, num_warps=8, **_NOFMA)
    return y


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up over ``gu`` = [rows, 2*Hp] (gate | up), rounded as the unfused ops round."""
    if gu.dim() != 2 or gu.shape[1] % 2 or not gu.is_contiguous():
        raise ValueError(f"silu_mul takes a contiguous [rows, 2*hidden] tensor, got {tuple(gu.shape)}")
    n, hp = gu.shape[0], gu.shape[1] // 2
    y = torch.empty(n, hp, dtype=gu.dtype, device=gu.device)
    if not _launch_ok(gu) or n == 0:
        return y
    block = 1024
    _kernel("silu_mul")[(n, triton.cdiv(hp, block))](gu, y, HP=hp, BLOCK=block, num_warps=4, **_NOFMA)
    return y


# ---- plain-torch twins (the unfused ops the towers run elsewhere; tests compare against them) ----

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [N, H, D]; cos/sin: [N, D] (fp32, or fp64 for an fp64 tower). Math in cos's dtype."""
    xf = x.to(cos.dtype)
    return (xf * cos[:, None] + rotate_half(xf) * sin[:, None]).to(x.dtype)


def reference_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    q, k, v = qkv.unbind(1)
    return torch.stack([apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v], dim=1)


def reference_add_norm(x, delta, weight, bias, eps, kind):
    s = x if delta is None else x + delta
    if kind == "layer":
        return s, F.layer_norm(s, (s.shape[-1],), weight, bias, eps)
    xf = s.float()
    return s, weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype)


def reference_quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def reference_silu_mul(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u
