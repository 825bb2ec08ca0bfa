"""The Triton kernels of the Triton norms (`workbench.norms`), their tile constants and launch
geometry.

The kernels are plain functions here and are passed to ``triton.jit`` lazily, on the first call
of a Triton norm in the process. ``triton.jit`` reads ``TRITON_INTERPRET`` when it wraps a
function, so setting ``TRITON_INTERPRET=1`` at any time before that first call (e.g. at the top of
a test module, before or after importing this one) runs the kernels in Triton's CPU interpreter;
after the first call the choice is fixed for the process. Without the interpreter the Triton
norms need CUDA tensors.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from contextlib import contextmanager

import torch

from . import limits

# triton_rows tile configurations the GPU benchmark sweeps; the first one is the default.
# Why these: a row is 1176 contiguous bytes, so a [BLOCK_R, 2048] tile covers BLOCK_R whole rows
# in one masked pass (43% of the lanes idle, but idle lanes cost issue slots, not bandwidth), and
# all of the program's loads are issued before its first store. 8 rows x 2048 with 8 warps is 64
# values per thread: 60 registers for uint8 -> bf16 (Triton 3.9, ptxas sm_90a), so 4 programs
# (32 warps) fit an SM by registers and keep ~37 KB of reads in flight per SM, about what
# HBM3e needs (4.8 TB/s x ~0.7 us latency / 132 SMs ~ 26 KB). 65536 rows give 8192 programs
# (~62 per SM, so the last wave costs < 2%), and padding is skipped at 8-row granularity.
# The column-looped shapes (512 and 256 wide: 3 and 5 column tiles) waste fewer lanes, but the
# compiler cannot prove `out` does not alias `pixels`, so each column tile's loads wait for the
# previous tile's stores (checked in the PTX); the sweep decides between the two trade-offs, and
# the default is the configuration that won it (results/reference/README.md, "Numbers behind the
# code's choices", with the geometries tried there and dropped).
ROWS_CONFIGS = (
    dict(block_rows=4, block_cols=2048, num_warps=4),
    dict(block_rows=8, block_cols=2048, num_warps=8),
    dict(block_rows=8, block_cols=2048, num_warps=4),
    dict(block_rows=16, block_cols=2048, num_warps=8),
    dict(block_rows=16, block_cols=512, num_warps=4),
    dict(block_rows=32, block_cols=256, num_warps=4),
)

CHANNEL_BLOCK = 2048      # the peer engine's block over one channel's L = T*P*P = 392 values
FLAT_BLOCK = 1024
FLAT_WARPS = 4
CHANNEL_WARPS = 4

# Under Triton's CPU interpreter each program runs as Python over numpy arrays, so a launch costs
# per program, not per element (every Triton op of every program is a Python call): there the flat
# kernel and the default rows tile take far larger blocks, the same kernel code and masks on a
# coarser grid, which is what makes the CPU studies' Triton cells take seconds rather than
# minutes. The channel kernel keeps one channel per program but takes many rows of it there (on
# CUDA it is compiled as before: one program per (row, channel) is its design).
# ``INTERPRETER_GEOMETRY = "gpu"`` keeps the GPU grids there too (the kernel unit tests use it, to
# exercise the GPU's program boundaries); CUDA always runs the GPU grids.
INTERPRETER_GEOMETRY = "coarse"
INTERPRETER_FLAT_BLOCK = 1 << 16
INTERPRETER_BLOCK_ROWS = 512
INTERPRETER_CHANNEL_ROWS = 256


def _coarse(pixels) -> bool:
    return pixels.device.type != "cuda" and INTERPRETER_GEOMETRY == "coarse"


# ---- Triton kernels ------------------------------------------------------------------------
# Kept as plain functions and jitted on first use (see the module docstring). D (columns), L and
# C are constexpr: with D = 1176 = 8 * 147 known at compile time the compiler can prove 8-element
# alignment of every row start and vectorize uint8 loads / 16-bit stores; as runtime ints it
# could only assume 1. Program bases are computed in int64 scalars so N * D may exceed 2**31,
# while the per-element offsets stay int32 (64-bit vector index math is measurably slower).

from .triton_support import jitted, tl, triton

if tl is not None:
    def _channel_kernel(x_ptr, out_ptr, scale_ptr, shift_ptr, n_valid_ptr, n_rows,
                        D: tl.constexpr, L: tl.constexpr, BLOCK: tl.constexpr,
                        HAS_N_VALID: tl.constexpr, ROWS: tl.constexpr = 1):
        ch = tl.program_id(1)
        w = tl.load(scale_ptr + ch)
        b = tl.load(shift_ptr + ch)
        offs = tl.arange(0, BLOCK)
        if ROWS == 1:   # the GPU's grid: one program per (row, channel)
            row = tl.program_id(0)
            base = row.to(tl.int64) * D + ch * L
            # a padding row becomes a fully masked block (the peer geometry masks, it does not
            # exit); the row test is folded into the bound rather than and-ed in as a scalar mask
            limit = L
            if HAS_N_VALID:
                limit = tl.where(row < tl.load(n_valid_ptr), L, 0)
            mask = offs < limit
            x = tl.load(x_ptr + base + offs, mask=mask, other=0).to(tl.float32)
            tl.store(out_ptr + base + offs, (x * w + b).to(out_ptr.dtype.element_ty), mask=mask)
        else:           # the interpreter's coarse grid: ROWS rows of one channel per program
            rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
            end = n_rows
            if HAS_N_VALID:
                end = tl.minimum(end, tl.load(n_valid_ptr))
            limit = tl.where(rows < end, L, 0)
            mask = offs[None, :] < limit[:, None]
            ptrs = rows.to(tl.int64)[:, None] * D + ch * L + offs[None, :]
            x = tl.load(x_ptr + ptrs, mask=mask, other=0).to(tl.float32)
            tl.store(out_ptr + ptrs, (x * w + b).to(out_ptr.dtype.element_ty), mask=mask)

    def _flat_kernel(x_ptr, out_ptr, scale_ptr, shift_ptr, n_valid_ptr, n_rows,
                     D: tl.constexpr, L: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr,
                     HAS_N_VALID: tl.constexpr):
        start = tl.program_id(0).to(tl.int64) * BLOCK
        limit = n_rows.to(tl.int64)
        if HAS_N_VALID:
            limit = tl.minimum(tl.load(n_valid_ptr).to(tl.int64), limit)
        # elements of this block that lie in valid rows, clamped to 0..BLOCK, as an int32
        remaining = tl.minimum(tl.maximum(limit * D - start, 0), BLOCK).to(tl.int32)
        row0 = start // D
        col0 = (start - row0 * D).to(tl.int32)
        i = tl.arange(0, BLOCK)
        j = col0 + i                          # index counted from the start of row0
        ch = (j // L) % C
        mask = i < remaining
        w = tl.load(scale_ptr + ch, mask=mask, other=0.0)
        b = tl.load(shift_ptr + ch, mask=mask, other=0.0)
        x = tl.load(x_ptr + start + i, mask=mask, other=0).to(tl.float32)
        y = x * w + b
        tl.store(out_ptr + start + i, y.to(out_ptr.dtype.element_ty), mask=mask)

    def _rows_kernel(x_ptr, out_ptr, scale_ptr, shift_ptr, n_valid_ptr, n_rows,
                     D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     HAS_N_VALID: tl.constexpr):
        pid = tl.program_id(0)
        row0 = pid * BLOCK_R
        limit = n_rows
        if HAS_N_VALID:
            n_valid = tl.load(n_valid_ptr)
            # a padding tile costs one 4-byte load and nothing else
            if row0 >= n_valid:
                return
            limit = tl.minimum(limit, n_valid)
        rows = row0 + tl.arange(0, BLOCK_R)
        row_mask = rows < limit
        base = pid.to(tl.int64) * (BLOCK_R * D)
        x_tile = x_ptr + base
        o_tile = out_ptr + base
        r = tl.arange(0, BLOCK_R)
        for c0 in tl.static_range(0, D, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            col_mask = cols < D
            # one scale/shift vector per tile, broadcast over its rows: no per-element division
            w = tl.load(scale_ptr + cols, mask=col_mask, other=0.0)
            b = tl.load(shift_ptr + cols, mask=col_mask, other=0.0)
            offs = r[:, None] * D + cols[None, :]
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(x_tile + offs, mask=mask, other=0).to(tl.float32)
            y = x * w[None, :] + b[None, :]
            tl.store(o_tile + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def rows_tile(block_rows: int | None = None, block_cols: int | None = None, num_warps: int | None = None) -> dict:
    """The triton_rows tile: ROWS_CONFIGS[0] with the entries given replaced; ValueError for one
    that is not a positive power of two."""
    tile = dict(ROWS_CONFIGS[0])
    tile.update({k: v for k, v in dict(block_rows=block_rows, block_cols=block_cols,
                                       num_warps=num_warps).items() if v is not None})
    for key, value in tile.items():
        if not _is_pow2(value):
            raise ValueError(f"{key}={value!r} must be a positive power of two")
    return tile


_JITTED: dict = {}


def norm_kernel(name: str):
    """The jitted norm kernel `name` ("channel", "flat" or "rows"; see `jitted`); RuntimeError
    without Triton."""
    fixed_rows = dict(do_not_specialize=["n_rows"])
    return jitted(_JITTED, name, lambda: {"channel": (_channel_kernel, fixed_rows), "flat": (_flat_kernel, fixed_rows),
                                          "rows": (_rows_kernel, fixed_rows)},
                  "the Triton norms need the `triton` package; eager and identity do not")


def kernels_interpreted() -> bool:
    """Whether the norm kernels run in Triton's CPU interpreter, as they were jitted (call after
    `norm_kernel`)."""
    return _JITTED["interpreted"]


# ---- launches, and their reuse under the interpreter ---------------------------------------------
# Interpreted, a launch costs a tenth of a second of Python, and a study that encodes the same photos through several
# encoders (correctness: one per placement and norm, each staged through graph buffers) launches the same kernel on
# the same rows again and again. Inside `reusing_launches()` an interpreted launch whose kernel, grid, shapes,
# dtypes, constants, valid input rows and scale/shift equal an earlier one's copies that launch's output rows instead
# of running: the same bits, since a launch reads only the rows below n_valid and writes only those (padding rows
# are neither read nor written, so their contents are not part of the key). CUDA launches always run.
# WORKBENCH_REUSE_LAUNCHES=0 (or off, false, no) turns it off (to check that the tables come out the same without it).
REUSE_BYTES = 256 * 2**20         # the outputs kept at most; the oldest go first
REUSE_ENV = limits.REUSE_LAUNCHES_ENV
_REUSE: OrderedDict | None = None


@contextmanager
def reusing_launches():
    """Reuse identical interpreted launches in this block (nested: the outer block's store); forgotten at its end."""
    global _REUSE
    outer = _REUSE
    if limits.switch(REUSE_ENV, True):       # a value other than on or off: ValueError naming it
        _REUSE = OrderedDict() if outer is None else outer
    try:
        yield
    finally:
        _REUSE = outer


def _digest(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=20).hexdigest()


def _launch(kernel, grid, pixels, out, scale, shift, nv_ptr, has_nv: bool, **meta) -> None:
    """``kernel[grid](...)`` over ``pixels`` [N, D] into ``out``, reused inside `reusing_launches` (CPU only)."""
    n = pixels.shape[0]
    if _REUSE is None or pixels.device.type == "cuda":
        kernel[grid](pixels, out, scale, shift, nv_ptr, n, HAS_N_VALID=has_nv, **meta)
        return
    valid = min(max(int(nv_ptr), 0), n) if has_nv else n      # a host read: fine on the CPU
    key = (kernel.fn.__name__, grid, tuple(pixels.shape), pixels.dtype, out.dtype, has_nv, valid,
           tuple(sorted(meta.items())), _digest(pixels[:valid]), _digest(scale), _digest(shift))
    if (hit := _REUSE.get(key)) is not None:
        _REUSE.move_to_end(key)
        out[:valid].copy_(hit)
        return
    kernel[grid](pixels, out, scale, shift, nv_ptr, n, HAS_N_VALID=has_nv, **meta)
    _REUSE[key] = out[:valid].clone()
    while sum(v.nbytes for v in _REUSE.values()) > REUSE_BYTES:
        _REUSE.popitem(last=False)


def launch_channel(kernel, pixels, out, scale_ch, shift_ch, nv_ptr, has_nv: bool, channels: int) -> None:
    """One program per (row, channel) over its T*P*P values; under the interpreter's coarse
    geometry, one per (INTERPRETER_CHANNEL_ROWS rows, channel)."""
    n, d = pixels.shape
    per_channel = d // channels
    if _coarse(pixels):   # interpreted: a channel's values over many rows per program
        block, rows = triton.next_power_of_2(per_channel), INTERPRETER_CHANNEL_ROWS
    else:
        block, rows = max(CHANNEL_BLOCK, triton.next_power_of_2(per_channel)), 1
    _launch(kernel, (triton.cdiv(n, rows), channels), pixels, out, scale_ch, shift_ch, nv_ptr, has_nv, D=d,
            L=per_channel, BLOCK=block, ROWS=rows, num_warps=CHANNEL_WARPS)


def launch_flat(kernel, pixels, out, scale_ch, shift_ch, nv_ptr, has_nv: bool, channels: int) -> None:
    """A 1-D grid of FLAT_BLOCK elements per program over all N*patch_dim elements."""
    n, d = pixels.shape
    block = INTERPRETER_FLAT_BLOCK if _coarse(pixels) else FLAT_BLOCK
    _launch(kernel, (triton.cdiv(n * d, block),), pixels, out, scale_ch, shift_ch, nv_ptr, has_nv,
            D=d, L=d // channels, C=channels, BLOCK=block, num_warps=FLAT_WARPS)


def launch_rows(kernel, pixels, out, scale_col, shift_col, nv_ptr, has_nv: bool, block_rows: int,
                block_cols: int, num_warps: int, default_tile: bool = False) -> None:
    """One program per tile of ``block_rows`` whole rows (the default tile interpreted:
    ``INTERPRETER_BLOCK_ROWS``)."""
    n, d = pixels.shape
    if default_tile and _coarse(pixels):
        block_rows = max(block_rows, INTERPRETER_BLOCK_ROWS)
    _launch(kernel, (triton.cdiv(n, block_rows),), pixels, out, scale_col, shift_col, nv_ptr, has_nv,
            D=d, BLOCK_R=block_rows, BLOCK_C=block_cols, num_warps=num_warps)
