"""Device-side input normalization of raw pixel rows: five interchangeable implementations.

Serving engines ship raw pixel rows to the GPU and normalize them there, as the first op of the
vision tower::

    y[n, j] = x[n, j] * scale[c] + shift[c],   c = j // (T * P * P)
    scale = rescale / std,  shift = -mean / std            (fp32 math, output in the tower dtype)

`pixels` is ``[N, patch_dim]`` (``patch_dim = C*T*P*P = 1176`` for every real Qwen tower), either
uint8 or a float tensor that holds the integers 0..255.

Binding contract, shared by every implementation (see `InputNorm.forward`)::

    norm(pixels, out_dtype, out=None, n_valid=None) -> Tensor [N, patch_dim] of out_dtype

* ``out``: optional preallocated contiguous ``[N, patch_dim]`` tensor of ``out_dtype`` on the
  pixels' device; written in place and returned.
* ``n_valid``: optional 0-d int32/int64 tensor on the pixels' device, the number of leading real
  rows (the rest is padding of a fixed-shape CUDA-graph bucket). It is never read on the host.
  Rows at or beyond it are not written: with ``out`` they keep their previous contents bit for
  bit, without ``out`` they are unspecified. Values above N act as N, values below 0 as 0.
* Every implementation is CUDA-graph capturable: no host syncs, no data-dependent shapes. The
  one sync in this module, the integer check of float input, is skipped while a graph is being
  captured.
* Non-contiguous ``pixels`` or ``out`` are rejected rather than copied: a hidden ``.contiguous()``
  would add a full read+write of the input to every measurement this workbench makes.

Implementations (`NORMS`):

``eager``           plain torch, fp32 temporaries (the engines' fallback; the slow baseline).
``triton_channel``  one program per (row, channel) over 392 values with a 2048-wide block.
``triton_flat``     1-D grid over all N*1176 elements, channel recomputed per element.
``triton_rows``     2-D tiles of whole rows with per-column scale/shift; skips padding tiles.
``identity``        cast only: models a forgotten normalization.

The Triton kernels, their tiles and launch geometry are in `workbench.norm_kernels` (how
``TRITON_INTERPRET`` picks Triton's CPU interpreter is in its docstring).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from workbench.config import VisionConfig
from workbench.dtypes import names
from workbench.vocabulary import NORM_NAMES, check_norm_name  # the one door for a norm name
from workbench.vocabulary import REAL_NORMS as VOCAB_REAL_NORMS

from .norm_kernels import kernels_interpreted, launch_channel, launch_flat, launch_rows, norm_kernel, rows_tile
from .norm_kernels import CHANNEL_BLOCK, CHANNEL_WARPS, FLAT_BLOCK, FLAT_WARPS, ROWS_CONFIGS  # noqa: F401
from .patches import normalize_reference  # noqa: F401  (the processor's normalization, in float64)

INPUT_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TORCH_OUT_DTYPES = TRITON_OUT_DTYPES + (torch.float64,)

_REPLAYING = 0


class replaying:
    """Context in which host-side value checks are skipped, as in a captured CUDA graph.

    A graph replay runs no Python, so no check can fire there; an emulated replay enters this
    context so that it behaves the same (bad values flow through instead of raising)."""

    def __enter__(self):
        global _REPLAYING
        _REPLAYING += 1
        return self

    def __exit__(self, *exc):
        global _REPLAYING
        _REPLAYING -= 1
        return False


def in_graph() -> bool:
    """Whether the code runs inside a CUDA graph capture or an emulated replay (`replaying`),
    where host-side checks and host-decided work must not happen."""
    return _REPLAYING > 0 or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


# ---- the modules -----------------------------------------------------------------------------

def _esize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class _Trace:
    """An allocation trace being written: ``("alloc", id, bytes)`` / ``("free", id, bytes)``."""

    def __init__(self):
        self.events: list[tuple[str, int, int]] = []
        self._live: dict[str, tuple[int, int]] = {}

    def alloc(self, tag: str, nbytes: int) -> None:
        k = len(self.events)
        self._live[tag] = (k, nbytes)
        self.events.append(("alloc", k, nbytes))

    def free(self, tag: str) -> None:
        k, nbytes = self._live.pop(tag)
        self.events.append(("free", k, nbytes))

    def select(self, n_rows: int, out_bytes: int, src_tag: str | None) -> None:
        """`InputNorm._select`'s allocations: arange, the row mask, the where, then frees."""
        self.alloc("arange", n_rows * 8)
        self.alloc("keep", n_rows)
        self.free("arange")
        self.alloc("where", out_bytes)
        self.free("where")
        if src_tag:
            self.free(src_tag)
        self.free("keep")


class InputNorm(nn.Module):
    """One normalization implementation, usable as the first op of a vision tower (one subclass
    per implementation: its kernel, its byte model `traffic`, its allocation trace `alloc_trace`).

    Buffers (fp32, non-persistent so they never enter a state dict, moved by ``.to(device)``):
    ``scale_ch``/``shift_ch`` ``[C]`` and ``scale_col``/``shift_col`` ``[patch_dim]`` (column j
    holds channel ``j // (T*P*P)``). A dtype cast of the module (``tower.to(torch.bfloat16)``)
    leaves them fp32: they are rebuilt from ``cfg`` because bf16 scale/shift would cost up to
    ~0.4% relative error on every pixel.
    """

    name: str = ""
    normalizes: bool = True                  # False: a cast only (a forgotten normalization)
    out_dtypes: tuple[torch.dtype, ...] = TORCH_OUT_DTYPES

    def __init__(self, cfg: VisionConfig, check_values: bool = True):
        super().__init__()
        self.cfg = cfg
        self.check_values = bool(check_values)
        self._make_buffers(torch.device("cpu"))

    def _make_buffers(self, device: torch.device) -> None:
        cfg = self.cfg
        per_channel = cfg.temporal_patch_size * cfg.patch_size ** 2
        # computed in float64 from the config, rounded once to fp32: every implementation then
        # multiplies by bit-identical constants
        scale = torch.tensor(cfg.norm_scale, dtype=torch.float64)
        shift = torch.tensor(cfg.norm_shift, dtype=torch.float64)
        bufs = dict(scale_ch=scale, shift_ch=shift,
                    scale_col=scale.repeat_interleave(per_channel),
                    shift_col=shift.repeat_interleave(per_channel))
        for key, value in bufs.items():
            self.register_buffer(key, value.to(device=device, dtype=torch.float32).contiguous(),
                                 persistent=False)

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        if self.scale_col.dtype != torch.float32:
            self._make_buffers(self.scale_col.device)
        return result

    def extra_repr(self) -> str:
        return f"name={self.name!r}, cfg={self.cfg.name!r}, patch_dim={self.cfg.patch_dim}"

    # ---- validation ------------------------------------------------------------------------
    def _validate(self, pixels, out_dtype, out, n_valid) -> None:
        d = self.cfg.patch_dim
        if not isinstance(pixels, torch.Tensor):
            raise TypeError(f"pixels must be a torch.Tensor [N, {d}], got {type(pixels).__name__}")
        if pixels.dim() != 2 or pixels.shape[1] != d:
            raise ValueError(f"pixels must be 2-D [N, {d}] (patch_dim of {self.cfg.name!r}: "
                             f"C*T*P*P), got shape {tuple(pixels.shape)}")
        if pixels.dtype not in INPUT_DTYPES:
            raise TypeError(f"pixels dtype {pixels.dtype} is not supported; valid: "
                            f"{names(INPUT_DTYPES)}")
        valid_out = self.out_dtypes
        if not isinstance(out_dtype, torch.dtype):
            raise TypeError(f"out_dtype must be a torch.dtype, got {out_dtype!r}; valid: "
                            f"{names(valid_out)}")
        if out_dtype not in valid_out:
            raise ValueError(f"out_dtype {out_dtype} is not supported by {self.name!r}; valid: "
                             f"{names(valid_out)}")
        if not pixels.is_contiguous():
            raise ValueError("pixels must be contiguous (call .contiguous() yourself; the norm "
                             "does not copy silently because that would add a hidden pass)")
        if pixels.device != self.scale_col.device:
            raise ValueError(f"pixels are on {pixels.device} but the norm's buffers on "
                             f"{self.scale_col.device}; move the norm once with "
                             f"norm.to({str(pixels.device)!r})")
        if out is not None:
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
            if tuple(out.shape) != tuple(pixels.shape):
                raise ValueError(f"out shape {tuple(out.shape)} does not match pixels shape "
                                 f"{tuple(pixels.shape)}")
            if out.dtype != out_dtype:
                raise ValueError(f"out dtype {out.dtype} does not match out_dtype {out_dtype}")
            if out.device != pixels.device:
                raise ValueError(f"out is on {out.device} but pixels on {pixels.device}")
            if not out.is_contiguous():
                raise ValueError("out must be contiguous")
        if n_valid is not None:
            if not isinstance(n_valid, torch.Tensor):
                raise TypeError(f"n_valid must be a 0-d int32 tensor on {pixels.device}, got "
                                f"{type(n_valid).__name__} {n_valid!r}; pass a device tensor, e.g. "
                                f"torch.tensor(n, dtype=torch.int32, device=pixels.device) (a "
                                f"python int would be baked into a captured CUDA graph)")
            if n_valid.dim() != 0:
                raise ValueError(f"n_valid must be a 0-d tensor, got shape {tuple(n_valid.shape)}")
            if n_valid.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"n_valid dtype {n_valid.dtype} is not supported; valid: int32, "
                                f"int64")
            if n_valid.device != pixels.device:
                raise ValueError(f"n_valid is on {n_valid.device} but pixels on {pixels.device}")
        if (self.check_values and pixels.dtype != torch.uint8 and pixels.numel()
                and not in_graph()):
            # NaN fails `x == round(x)`, so it is caught here as well
            bad = (pixels < 0) | (pixels > 255) | (pixels != torch.round(pixels))
            if bool(bad.any()):
                r, c = (int(v) for v in bad.nonzero()[0])
                raise ValueError(f"float pixels must hold integers 0..255 (raw pixel values, before "
                                 f"rescale/normalization); found {pixels[r, c].item()!r} at row {r}, "
                                 f"column {c} (make_norm(..., check_values=False) skips this check)")

    # ---- the contract ----------------------------------------------------------------------
    def forward(self, pixels: torch.Tensor, out_dtype: torch.dtype, out: torch.Tensor | None = None,
                n_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize ``pixels`` [N, patch_dim] (uint8, or float holding 0..255) to ``out_dtype``.

        Returns ``out`` when given, else a new contiguous [N, patch_dim] tensor; see the module
        docstring for the ``n_valid`` contract. Raises ValueError/TypeError on bad arguments.
        """
        self._validate(pixels, out_dtype, out, n_valid)
        if pixels.shape[0] == 0:
            return out if out is not None else torch.empty(pixels.shape, dtype=out_dtype,
                                                           device=pixels.device)
        return self.apply_norm(pixels, out_dtype, out, n_valid)

    def apply_norm(self, pixels, out_dtype, out, n_valid) -> torch.Tensor:
        """The implementation, on checked arguments with at least one row."""
        raise NotImplementedError

    def _select(self, y: torch.Tensor, out: torch.Tensor | None, n_valid) -> torch.Tensor:
        """Write y into out (rows < n_valid only when n_valid is given); graph safe."""
        if out is None:
            return y          # padding rows are unspecified without `out`: computing them is fine
        if n_valid is None:
            return out.copy_(y)
        keep = torch.arange(y.shape[0], device=y.device) < n_valid
        # select in out's dtype so the kept rows are preserved bit for bit
        return out.copy_(torch.where(keep[:, None], y.to(out.dtype), out))

    # ---- the memory model of one call -------------------------------------------------------
    def traffic(self, n_rows: int, in_dtype: torch.dtype = torch.uint8,
                out_dtype: torch.dtype = torch.bfloat16, n_valid: int | None = None,
                out: bool = False) -> dict:
        """DRAM bytes one call moves on ``n_rows`` rows, pass by pass (one full read and write per
        torch op, caches ignored; the scale/shift tables, a few KB, too).

        n_valid: rows a graph-safe call is told are real (None: all); out: whether the call writes
        into a preallocated ``out=`` (the runner placement) instead of returning a new tensor.
        Returns dict(bytes, min_bytes, passes, traffic_ratio): ``min_bytes`` is read-once +
        write-once of the rows that must be written."""
        valid = n_rows if n_valid is None else max(0, min(n_valid, n_rows))
        per_elem, passes, rows = self._passes(in_dtype, out_dtype, n_valid is not None and out,
                                              out, n_rows, valid)
        d = self.cfg.patch_dim
        total = per_elem * rows * d
        if n_valid is not None and out and self.selects:
            o = _esize(out_dtype)
            total += n_rows * (8 + 1 + 1) + n_rows * d * (3 * o + 2 * o)   # arange, <, where, copy_
            passes += 4
        min_bytes = (_esize(in_dtype) + _esize(out_dtype)) * valid * d
        return dict(bytes=total, min_bytes=min_bytes, passes=passes,
                    traffic_ratio=total / min_bytes if min_bytes else math.nan)

    # whether a call with both n_valid and out= computes every row and then selects (`_select`)
    selects: bool = False

    def _passes(self, in_dtype, out_dtype, select: bool, out: bool, n_rows: int,
                valid: int) -> tuple[int, int, int]:
        """(bytes per element per row worked on, passes, rows worked on) of the call."""
        raise NotImplementedError

    def alloc_trace(self, n_rows: int, in_dtype: torch.dtype = torch.uint8,
                    out_dtype: torch.dtype = torch.bfloat16, n_valid: bool = False,
                    out: bool = False) -> list[tuple[str, int, int]]:
        """The allocations and frees of one call, in order, as ``("alloc", id, bytes)`` /
        ``("free", id, bytes)``; what is still allocated at the end is the output. Derived from
        the implementation's code (`workbench.memory_model.count_allocations` counts the same
        trace from a real call: the fp32_memory study checks one against the other)."""
        trace = _Trace()
        self._trace(trace, n_rows * self.cfg.patch_dim, n_rows, in_dtype, out_dtype, n_valid, out)
        return trace.events

    def _trace(self, trace: _Trace, el: int, n_rows: int, in_dtype, out_dtype, n_valid, out) -> None:
        raise NotImplementedError


class EagerNorm(InputNorm):
    """Plain torch with fp32 temporaries: the engines' fallback, the slow baseline."""

    name = "eager"
    selects = True

    def apply_norm(self, pixels, out_dtype, out, n_valid):
        # fp32 temporaries on purpose: this is what the engines run (`traffic` models the cost)
        y = pixels.to(torch.float32) * self.scale_col + self.shift_col
        if out is not None and n_valid is None:
            return out.copy_(y)   # copy_ casts; no separate cast pass
        return self._select(y.to(out_dtype), out, n_valid)

    def _passes(self, in_dtype, out_dtype, select, out, n_rows, valid):
        # uint8 -> bf16 is 27 B/element (9x the 3 B floor): to(f32) 1+4, * scale 4+4,
        # + shift 4+4, to(bf16) 4+2; it computes every row, padding included
        i, o = _esize(in_dtype), _esize(out_dtype)
        steps = ([] if in_dtype == torch.float32 else [(i, 4)]) + [(4, 4), (4, 4)]
        if (out and not select) or out_dtype != torch.float32:
            steps.append((4, o))                        # out.copy_(y) casts on the way
        return sum(a + b for a, b in steps), len(steps), n_rows

    def _trace(self, trace, el, n_rows, in_dtype, out_dtype, n_valid, out):
        # x.to(f32) [A], * scale [B], free A, + shift [C], free B; then out= without n_valid:
        # copy_ into out, free C; else C.to(out_dtype) [D] (none for fp32 out), the select with
        # both n_valid and out; free C
        if in_dtype != torch.float32:
            trace.alloc("A", el * 4)
        trace.alloc("B", el * 4)
        if in_dtype != torch.float32:
            trace.free("A")
        trace.alloc("C", el * 4)
        trace.free("B")
        if out and not n_valid:
            trace.free("C")
            return
        cast = out_dtype != torch.float32
        if cast:
            trace.alloc("D", el * _esize(out_dtype))
        if n_valid and out:
            trace.select(n_rows, el * _esize(out_dtype), "D" if cast else None)
        trace.free("C")


class IdentityNorm(InputNorm):
    """Cast only: models a forgotten normalization."""

    name = "identity"
    normalizes = False
    selects = True

    def apply_norm(self, pixels, out_dtype, out, n_valid):
        if out is not None and n_valid is None:
            return out.copy_(pixels)
        return self._select(pixels.to(out_dtype), out, n_valid)

    def _passes(self, in_dtype, out_dtype, select, out, n_rows, valid):
        if in_dtype == out_dtype and not out:
            return 0, 0, n_rows
        return _esize(in_dtype) + _esize(out_dtype), 1, n_rows

    def _trace(self, trace, el, n_rows, in_dtype, out_dtype, n_valid, out):
        if out and not n_valid:
            return
        cast = in_dtype != out_dtype
        if cast:
            trace.alloc("O", el * _esize(out_dtype))
        if n_valid and out:
            trace.select(n_rows, el * _esize(out_dtype), "O" if cast else None)


class TritonNorm(InputNorm):
    """A Triton kernel: one read of the input, one write of the valid rows, fp32 in registers."""

    out_dtypes = TRITON_OUT_DTYPES
    kernel_name = ""

    def apply_norm(self, pixels, out_dtype, out, n_valid):
        if pixels.device.type == "meta":
            # shapes only (byte counting on the meta device): the kernel has no data to touch,
            # and it allocates nothing besides the output
            return out if out is not None else torch.empty(pixels.shape, dtype=out_dtype, device="meta")
        kernel = norm_kernel(self.kernel_name)
        if pixels.device.type != "cuda" and not kernels_interpreted():
            raise RuntimeError(f"{self.name!r} runs on CUDA tensors; for CPU tensors set "
                               f"TRITON_INTERPRET=1 before the first Triton norm call of the "
                               f"process (pixels are on {pixels.device})")
        if out is None:
            out = torch.empty(pixels.shape, dtype=out_dtype, device=pixels.device)
        # without n_valid the pointer is never dereferenced (HAS_N_VALID is constexpr)
        nv_ptr = n_valid if n_valid is not None else self.scale_ch
        self.launch(kernel, pixels, out, nv_ptr, n_valid is not None)
        return out

    def launch(self, kernel, pixels, out, nv_ptr, has_nv: bool) -> None:
        raise NotImplementedError

    def _passes(self, in_dtype, out_dtype, select, out, n_rows, valid):
        # padding rows are skipped (rows) or masked (flat, channel): no traffic either way
        return _esize(in_dtype) + _esize(out_dtype), 1, valid

    def _trace(self, trace, el, n_rows, in_dtype, out_dtype, n_valid, out):
        if not out:
            trace.alloc("O", el * _esize(out_dtype))


class ChannelNorm(TritonNorm):
    """One program per (row, channel) over T*P*P values with a 2048-wide block (the peer
    engine's geometry)."""

    name = "triton_channel"
    kernel_name = "channel"

    def launch(self, kernel, pixels, out, nv_ptr, has_nv):
        launch_channel(kernel, pixels, out, self.scale_ch, self.shift_ch, nv_ptr, has_nv, self.cfg.in_channels)


class FlatNorm(TritonNorm):
    """A 1-D grid over all N*patch_dim elements, the channel recomputed per element."""

    name = "triton_flat"
    kernel_name = "flat"

    def launch(self, kernel, pixels, out, nv_ptr, has_nv):
        launch_flat(kernel, pixels, out, self.scale_ch, self.shift_ch, nv_ptr, has_nv, self.cfg.in_channels)


class RowsNorm(TritonNorm):
    """2-D tiles of whole rows with per-column scale/shift; padding tiles return at once. The
    tile (``block_rows``, ``block_cols``, ``num_warps``; powers of two) defaults to
    ``ROWS_CONFIGS[0]``."""

    name = "triton_rows"

    def __init__(self, cfg: VisionConfig, check_values: bool = True, block_rows: int | None = None,
                 block_cols: int | None = None, num_warps: int | None = None):
        super().__init__(cfg, check_values)
        tile = rows_tile(block_rows, block_cols, num_warps)
        self._default_tile = tile == rows_tile()
        self.block_rows, self.block_cols, self.num_warps = (tile["block_rows"], tile["block_cols"],
                                                            tile["num_warps"])

    kernel_name = "rows"

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", block_rows={self.block_rows}, block_cols={self.block_cols}, "
                f"num_warps={self.num_warps}")

    def launch(self, kernel, pixels, out, nv_ptr, has_nv):
        launch_rows(kernel, pixels, out, self.scale_col, self.shift_col, nv_ptr, has_nv, self.block_rows,
                    self.block_cols, self.num_warps, default_tile=self._default_tile)


# the registry: adding an implementation is one class above and one entry here
NORMS: dict[str, type[InputNorm]] = {cls.name: cls for cls in (EagerNorm, ChannelNorm, FlatNorm, RowsNorm,
                                                               IdentityNorm)}
assert tuple(NORMS) == NORM_NAMES, "workbench.vocabulary.NORM_NAMES must list NORMS in order"
REAL_NORMS = tuple(n for n, cls in NORMS.items() if cls.normalizes)
assert REAL_NORMS == VOCAB_REAL_NORMS, "workbench.vocabulary.REAL_NORMS must be the norms that normalize"
TILE_KEYS = ("block_rows", "block_cols", "num_warps")


def make_norm(name: str, cfg: VisionConfig, check_values: bool = True, **rows_config) -> InputNorm:
    """The norm `name` (one of NORMS) for `cfg`, on the CPU; move it with ``.to(device)``.

    ``rows_config`` (``block_rows``, ``block_cols``, ``num_warps``, powers of two) overrides the
    default tile of ``triton_rows`` (``ROWS_CONFIGS[0]``); it is an error for other norms.
    ``check_values=False`` skips the integer/range check of float input (a host sync).
    """
    cls = NORMS[check_norm_name(name)]
    unknown = set(rows_config) - set(TILE_KEYS)
    if unknown:
        raise TypeError(f"unexpected keyword(s) {sorted(unknown)}; valid: block_rows, block_cols, "
                        f"num_warps (triton_rows only)")
    given = {k: v for k, v in rows_config.items() if v is not None}
    if given and cls is not RowsNorm:
        raise ValueError(f"{', '.join(given)} only apply to 'triton_rows', not {name!r}")
    return cls(cfg, check_values=check_values, **given)

