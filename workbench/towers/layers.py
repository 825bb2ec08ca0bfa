"""The layers the vision-tower families share, named as the checkpoints name them: the patch
embedding, attention, RMSNorm, the GEMM-aligned SwiGLU MLP, the patch merger and the pre-norm
block; the MLP, merger and block carry a fused-kernel forward beside the plain one (`add_norm`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import fused as fk
from .. import quack_gemm
from ..fused import apply_rotary
from ..attention import varlen_attention
from ..config import VisionConfig
from ..norms import in_graph


# ---- GEMM alignment of the SwiGLU MLPs ---------------------------------------------------------
#
# cuBLAS runs a GEMM whose inner or output width is not a multiple of 8 elements on slow, narrowly
# aligned kernels: Qwen2.5-VL's MLP width 3420 ran far slower than the same GEMM zero-padded to
# 3456, while widths that are multiples of 8 but not of 64 (Qwen3-VL's 4304) already ran fast
# (results/reference/README.md, `GEMM_ALIGN`, has the measurements). So a hidden width that is not
# a multiple of GEMM_FAST_MULTIPLE is padded to a multiple of `gemm_align`; any other is left alone.
GEMM_FAST_MULTIPLE = 8
# The default pads on every device: a tower is built on the host and moved afterwards (its device
# is not known when it is built), the padding is exact, and one layout everywhere keeps the CPU
# tests on the layout the GPU runs. gemm_align=1 turns the padding off.
GEMM_ALIGN = 64
GEMM_ALIGN_CHOICES = tuple(1 << i for i in range(9))        # 1, 2, 4, ..., 256


def check_gemm_align(gemm_align) -> int:
    """``gemm_align`` if it is one of GEMM_ALIGN_CHOICES (a power of two from 1 to 256), else a
    ValueError naming it and the choices."""
    if isinstance(gemm_align, bool) or not isinstance(gemm_align, int) or gemm_align not in GEMM_ALIGN_CHOICES:
        raise ValueError(f"gemm_align must be a power of two from 1 to 256, one of {GEMM_ALIGN_CHOICES} (the "
                         f"MLP hidden width is padded to a multiple of it where it is not a multiple of "
                         f"{GEMM_FAST_MULTIPLE}; 1: no padding), got {gemm_align!r}")
    return gemm_align


def padded_width(hidden: int, gemm_align: int) -> int:
    """The hidden width an MLP multiplies with: ``hidden`` rounded up to a multiple of
    ``gemm_align`` where it is not a multiple of GEMM_FAST_MULTIPLE, else ``hidden`` itself."""
    if hidden % GEMM_FAST_MULTIPLE == 0:
        return hidden
    return -(-hidden // gemm_align) * gemm_align


class GatedMLP(nn.Module):
    """down(silu(gate(h)) * up(h)), checkpoint names gate_proj / up_proj / down_proj (Qwen2.5-VL
    blocks with biases, GLM-4.1V blocks and merger without).

    The hidden width is padded to Hp = `padded_width(hidden, gemm_align)`: gate_proj and up_proj
    share one [2*Hp, width] buffer (gate rows, zeros, up rows, zeros; the same for the biases) and
    down_proj one [width, Hp] buffer with zero columns past hidden. The checkpoint-shaped
    parameters are views into them, so `state_dict()` holds the checkpoint's names and shapes, and
    a load (`load_state_dict`, `VisionTower.load_hf_state_dict`) writes only the real rows: the
    padding is never written and stays zero, and captured graphs see the new weights. Both
    forwards multiply with the padded buffers: a padded hidden unit is silu(0) * 0 = 0 and meets
    a zero column of down_proj, so the output is the unpadded one (up to the matmuls' rounding).
    Inference only: the matmuls read the buffers, so autograd does not reach the parameters.
    Redone after an `_apply` (.to, .cuda, dtype casts) that replaced the parameters with fresh
    tensors (not after one that changed nothing), and after a load that replaced them (``assign=True``).

    The FLOP, byte and parameter models (`Family.row_macs` / `n_params`, `workbench.floors`) count
    the real hidden width: a floor is the work the checkpoint asks for, and the padding is work
    added only to reach a faster kernel. (The graph-pool model traces the forward itself, so it
    sees the padded activations, which are what the pool really holds.)

    Paired layout (`use_pairs`, for quack's gated GEMM, `workbench.quack_gemm`): the buffer holds the gate
    and up rows alternating (gate 0, up 0, gate 1, up 1, ..., zero pairs past hidden), gate_proj and up_proj
    its even and odd rows. ``gemm`` ('cublas' or 'quack', set by the tower's `resolve_kernels`) picks the
    fused forward's kernels."""

    def __init__(self, width: int, hidden: int, bias: bool, gemm_align: int = GEMM_ALIGN):
        super().__init__()
        self.gemm_align = gemm_align          # checked by the tower (`check_gemm_align`)
        self.pairs, self.gemm = False, "cublas"
        self.gate_proj = nn.Linear(width, hidden, bias=bias)
        self.up_proj = nn.Linear(width, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, width, bias=bias)
        self._pack()
        self.register_load_state_dict_post_hook(GatedMLP._repack_if_replaced)

    def _gate_up(self, buf: torch.Tensor, hid: int, hp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate rows and the up rows of a packed buffer (the first ``hid`` of each)."""
        if self.pairs:
            return buf[0:2 * hid:2], buf[1:2 * hid:2]
        return buf[:hid], buf[hp:hp + hid]

    def _pack(self) -> None:
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        hid, width = g.weight.shape
        hp = padded_width(hid, self.gemm_align)
        kw = dict(dtype=g.weight.dtype, device=g.weight.device)
        with torch.no_grad():
            gu_w = torch.zeros(2 * hp, width, **kw)
            down_w = torch.zeros(d.weight.shape[0], hp, **kw)
            gate, up = self._gate_up(gu_w, hid, hp)
            gate.copy_(g.weight)
            up.copy_(u.weight)
            down_w[:, :hid] = d.weight
            gu_b = None
            if g.bias is not None:
                gu_b = torch.zeros(2 * hp, **kw)
                gate, up = self._gate_up(gu_b, hid, hp)
                gate.copy_(g.bias)
                up.copy_(u.bias)
        g.weight.data, u.weight.data = self._gate_up(gu_w, hid, hp)
        if gu_b is not None:
            g.bias.data, u.bias.data = self._gate_up(gu_b, hid, hp)
        d.weight.data = down_w[:, :hid]
        self.gate_up_weight, self.gate_up_bias, self.down_weight = gu_w, gu_b, down_w

    def use_pairs(self) -> None:
        """Repack into the paired layout (quack's); the weights stay what they are. Before any capture: a
        repack allocates new buffers, which a graph captured earlier would not see."""
        if not self.pairs:
            self.pairs = True
            self._pack()

    def _views(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        pairs = [(self.gate_proj.weight, self.gate_up_weight), (self.up_proj.weight, self.gate_up_weight),
                 (self.down_proj.weight, self.down_weight)]
        if self.gate_up_bias is not None:
            pairs += [(self.gate_proj.bias, self.gate_up_bias), (self.up_proj.bias, self.gate_up_bias)]
        return pairs

    def _replaced(self) -> bool:
        """Whether a parameter is no longer a view of its packed buffer."""
        return any(p.device != buf.device or p.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
                   for p, buf in self._views())

    @staticmethod
    def _repack_if_replaced(module: "GatedMLP", incompatible_keys) -> None:
        # a plain load copies into the views; an assigning one (assign=True: a tower built on the
        # meta device, then given real tensors) replaces the parameters, and the padded buffers
        # would keep the old values. Repacked only then: a repack allocates new buffers, which a
        # captured graph would not see.
        if module._replaced():
            module._pack()

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self._replaced():          # a conversion that changed nothing (.to of the same device and dtype) keeps them
            self._pack()
        return out

    @property
    def padded_hidden(self) -> int:
        """Hp, the hidden width the matmuls run with (the real one is gate_proj.out_features)."""
        return self.down_weight.shape[1]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # gate and up as two matmuls, as transformers computes them, over the padded halves (or pairs)
        hp, w, b = self.padded_hidden, self.gate_up_weight, self.gate_up_bias
        (gw, uw), (gb, ub) = self._gate_up(w, hp, hp), self._gate_up(b, hp, hp) if b is not None else (None, None)
        gate = F.linear(h, gw, gb)
        up = F.linear(h, uw, ub)
        return F.linear(F.silu(gate) * up, self.down_weight, self.down_proj.bias)

    def forward_fused(self, h: torch.Tensor) -> torch.Tensor:
        if self.gemm == "quack":       # gate/up and the SwiGLU in one kernel (the paired layout)
            act = quack_gemm.swiglu(h, self.gate_up_weight, self.gate_up_bias)
        elif self.pairs:               # paired but not on quack (a module used alone): torch's ops, exact
            gu = F.linear(h, self.gate_up_weight, self.gate_up_bias)
            act = F.silu(gu[:, 0::2]) * gu[:, 1::2]
        else:
            act = fk.silu_mul(F.linear(h, self.gate_up_weight, self.gate_up_bias))
        return F.linear(act, self.down_weight, self.down_proj.bias)


class PatchEmbed(nn.Module):
    """Conv3d with stride = kernel over (C, T, P, P) == one matmul per row (Qwen2/2.5-VL without
    bias, Qwen3-VL and GLM-4.1V with one).

    The weight keeps the checkpoint's Conv3d shape [width, C, T, P, P], or with ``conv2d`` its
    Conv2d shape [width, C, P, P] (Pixtral, whose rows have no temporal axis: T = 1)."""

    def __init__(self, cfg: VisionConfig, bias: bool = False, conv2d: bool = False):
        super().__init__()
        if conv2d and cfg.temporal_patch_size != 1:
            raise ValueError(f"a Conv2d patch embedding takes rows of one frame; temporal_patch_size="
                             f"{cfg.temporal_patch_size} must be 1")
        temporal = () if conv2d else (cfg.temporal_patch_size,)
        self.proj = nn.Module()
        self.proj.weight = nn.Parameter(torch.empty(cfg.width, cfg.in_channels, *temporal,
                                                    cfg.patch_size, cfg.patch_size))
        self.proj.bias = nn.Parameter(torch.empty(cfg.width)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, patch_dim] tower dtype
        w = self.proj.weight
        if self.proj.bias is None:
            return x @ w.view(w.shape[0], -1).t()
        return F.linear(x, w.view(w.shape[0], -1), self.proj.bias)


class FoldedPatchEmbed(PatchEmbed):
    """The patch embedding with the input normalization folded into it (placement `fold`): it
    takes raw pixel values (0..255, cast to the tower dtype) and gives what `PatchEmbed` gives on
    normalized ones. Column j of the matmul belongs to channel c = j // (T*P*P), whose
    normalization is x * s_c + t_c (s = rescale / std, t = -mean / std, `VisionConfig.norm_scale`
    / `norm_shift`), so W' = W * s (per column) and b' = b + W @ t (Qwen2/2.5-VL have no bias:
    then b' = W @ t is one).

    ``proj.weight`` / ``proj.bias`` stay the checkpoint's parameters: state dicts, loading and
    random init see only them. ``folded_weight`` [width, patch_dim] and ``folded_bias`` [width]
    are non-persistent buffers derived from them in float64 and rounded once to the tower dtype.
    `refresh` redoes them when the parameters changed since (their version counters or storage:
    a load, an init, ``.to(dtype)``), writing into the same buffers (``copy_``), so a captured
    CUDA graph reads the new values at its next replay; the forward refreshes except while a
    graph is captured or (emulated) replayed, where no Python runs: the graph runner refreshes
    before its replays (`VisionTower.refresh_derived`). Once fresh, the forward is one matmul
    with bias, the same as `PatchEmbed`'s."""

    def __init__(self, cfg: VisionConfig, bias: bool = False, conv2d: bool = False):
        super().__init__(cfg, bias=bias, conv2d=conv2d)
        self.cfg = cfg
        self.register_buffer("folded_weight", torch.empty(cfg.width, cfg.patch_dim), persistent=False)
        self.register_buffer("folded_bias", torch.empty(cfg.width), persistent=False)
        self._source = None           # the parameters' state the buffers were folded from

    def _source_key(self) -> tuple:
        w, b = self.proj.weight, self.proj.bias
        return tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in (w, b) if t is not None)

    def _column_constants(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, t) per input column, float64 [patch_dim] each."""
        per_channel = self.cfg.patch_dim // self.cfg.in_channels
        s, t = (torch.tensor(v, dtype=torch.float64, device=device).repeat_interleave(per_channel)
                for v in (self.cfg.norm_scale, self.cfg.norm_shift))
        return s, t

    @torch.no_grad()
    def refresh(self) -> bool:
        """Fold the current parameters into the buffers if they changed since the last fold;
        returns whether it did. In place where the buffers already have the parameters' dtype
        and device (and can be written in the current mode); allocated anew otherwise."""
        key = self._source_key()
        if key == self._source:
            return False
        w = self.proj.weight
        w64 = w.detach().reshape(w.shape[0], -1).to(torch.float64)
        s, t = self._column_constants(w.device)
        b64 = w64 @ t
        if self.proj.bias is not None:
            b64 = b64 + self.proj.bias.detach().to(torch.float64)
        for name, value in (("folded_weight", w64 * s), ("folded_bias", b64)):
            buf = getattr(self, name)
            # an inference tensor can only be written inside inference mode
            writable = not buf.is_inference() or torch.is_inference_mode_enabled()
            if buf.shape == value.shape and buf.dtype == w.dtype and buf.device == w.device and writable:
                buf.copy_(value)          # rounds once into the tower dtype
            else:
                setattr(self, name, value.to(w.dtype))
        self._source = key
        return True

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._source = None           # new dtype or device: fold again from the converted parameters
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [N, patch_dim] raw 0..255 values, tower dtype
        if not in_graph():
            self.refresh()
        return F.linear(x, self.folded_weight, self.folded_bias)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig, qkv_bias: bool = True, proj_bias: bool = True):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=qkv_bias)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=proj_bias)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """[N, width] -> [N, 3, heads, head_dim]: queries, keys and values of every head."""
        return self.qkv(x).view(x.shape[0], 3, self.heads, self.head_dim)

    def forward(self, x, cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen=None, fused=False):
        n = x.shape[0]                                                    # x: [N, width]
        qkv = self.project_qkv(x)
        if fused:  # q and k rotated in place, one kernel
            q, k, v = fk.rotary_(qkv, cos, sin).unbind(1)
        else:
            q, k, v = qkv.unbind(1)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = varlen_attention(q, k, v, cu_seqlens, max_seqlen, backend, dense_seqlen=dense_seqlen)
        return self.proj(o.reshape(n, -1))


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last axis, in float32 (float64 for a float64 ``x``), not cast back: the statistics every
    RMSNorm here shares, each applying its scale its own way."""
    xf = x.float() if x.dtype != torch.float64 else x
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Qwen2.5-VL RMSNorm: statistics in fp32, scale applied after casting back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalized(x, self.eps).to(x.dtype)


class PatchMerger(nn.Module):
    """Normalize, group each merge block (4 consecutive rows) into one row, 2-layer MLP with GELU."""

    def __init__(self, cfg: VisionConfig, norm: nn.Module):
        super().__init__()
        self.merged = cfg.width * cfg.merge_unit
        self.ln_q = norm
        self.mlp = nn.Sequential(nn.Linear(self.merged, self.merged), nn.GELU(),
                                 nn.Linear(self.merged, cfg.out_hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, width] -> [N/4, out_hidden]
        return self.mlp(self.ln_q(x).view(-1, self.merged))

    def forward_fused(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """The last block's residual sum and ln_q in one kernel, then the MLP."""
        _, y = add_norm(x, delta, self.ln_q)
        return self.mlp(y.view(-1, self.merged))


class VisionBlock(nn.Module):
    """A pre-norm block: x + attn(norm1(x)), then + mlp(norm2(x)). A family gives the norm kind
    ('layer' or 'rms'), its MLP module and attention options, and runs its MLP twice: `mlp_out(h)`
    in plain torch ops, `mlp_fused(h)` with the fused kernels."""

    def __init__(self, cfg: VisionConfig, norm_kind: str, mlp: nn.Module, **attn_kw):
        super().__init__()
        self.norm1, self.norm2 = (nn.LayerNorm(cfg.width, eps=cfg.eps) if norm_kind == "layer"
                                  else RMSNorm(cfg.width, cfg.eps) for _ in range(2))
        self.attn = VisionAttention(cfg, **attn_kw)
        self.mlp = mlp

    def mlp_out(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mlp_fused(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x, cu_seqlens, max_seqlen, dense_seqlen, cos, sin, backend):
        x = x + self.attn(self.norm1(x), cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen)
        return x + self.mlp_out(self.norm2(x))

    def forward_fused(self, x, delta, cu_seqlens, max_seqlen, dense_seqlen, cos, sin, backend):
        """(x + delta + attention, MLP output): the caller adds the MLP output in its next norm."""
        x, h = add_norm(x, delta, self.norm1)
        a = self.attn(h, cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen, fused=True)
        x, h = add_norm(x, a, self.norm2)
        return x, self.mlp_fused(h)


def add_norm(x: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, norm(x + delta)) in one fused kernel, for a LayerNorm or an RMSNorm module."""
    if isinstance(norm, nn.LayerNorm):
        return fk.add_norm(x, delta, norm.weight, norm.bias, norm.eps, "layer")
    if isinstance(norm, RMSNorm):
        return fk.add_norm(x, delta, norm.weight, None, norm.eps, "rms")
    raise TypeError(f"no fused kernel for {type(norm).__name__}")


