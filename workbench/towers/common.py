"""The base class of the vision-tower families, `VisionTower`, and what it resolves and caches.

The forward is split the way serving engines split it: `prepare(grid_thw)` runs on the host and
builds every data-dependent tensor (rotary cos/sin, cu_seqlens, window index, the gather indices
and weights that resample a learned position table to each grid) as a `TowerMetadata`
(`towers.metadata`); `forward_prepared(pixels, meta)` only does fixed-shape device work, so a CUDA
graph can capture it and replay it after new metadata is copied into the same buffers.

Module and parameter names follow the checkpoints (`patch_embed.proj`, `blocks.N.norm1`,
`attn.qkv`, `merger.ln_q`, `merger.mlp.0`; the layers are in `towers.layers`), so a transformers
state dict loads unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from .. import fused as fk
from .. import quack_gemm
from ..caches import remember
from ..attention import check_backend, resolve_backend, warm_fa4
from ..config import VisionConfig
from .layers import GEMM_ALIGN, FoldedPatchEmbed, PatchEmbed, check_gemm_align
from .layers import (GEMM_ALIGN_CHOICES, GEMM_FAST_MULTIPLE, GatedMLP, PatchMerger, RMSNorm,  # noqa: F401
                     VisionAttention, VisionBlock, add_norm, padded_width)
from .metadata import (TowerMetadata, budget_padding, check_grid, filling_grid, merge_block_positions,
                       position_taps, rotary_cos_sin, sequence_rows)
from .metadata import (interpolated_positions, max_windows, pad_offsets, rotary_inv_freq)  # noqa: F401
from .weights import init_checkpoint_like

FUSED_CHOICES = ("auto", True, False)


@dataclass(frozen=True)
class Kernels:
    """What a tower's forward runs, resolved once (`VisionTower.resolve_kernels`): the concrete
    attention backend (one of attention.ATTN_BACKENDS but 'auto'), whether the fused Triton
    block kernels run, and the gated MLPs' gate/up kernel (one of quack_gemm.GEMM_CHOICES; 'quack'
    only with the fused kernels)."""

    backend: str
    fused: bool
    gemm: str = "cublas"


def check_fused(fused):
    """``fused`` if it is one of FUSED_CHOICES ('auto', True, False), else ValueError naming it."""
    if not (isinstance(fused, bool) or (isinstance(fused, str) and fused == "auto")):   # 1 is not True here
        raise ValueError(f"fused must be one of {FUSED_CHOICES} ('auto': the fused Triton kernels on CUDA "
                         f"for bf16/fp16 towers, plain torch ops elsewhere), got {fused!r}")
    return fused


class VisionTower(nn.Module):
    """Base class of every family: input embedding, metadata preparation, weight loading.

    `input_norm` is the device normalization module when normalization is the tower's first op
    (placement `tower`); `device_norm=True` declares that the tower is built for device
    normalization, and then a missing norm module is an error rather than a silent identity.
    `fold_norm=True` (placement `fold`): the normalization is folded into the patch embedding
    (`FoldedPatchEmbed`); the tower takes raw pixel values, casts them to its dtype and runs no
    norm (no input_norm then).
    `gemm_align` (one of GEMM_ALIGN_CHOICES, default GEMM_ALIGN on every device): the SwiGLU MLPs'
    hidden width is padded to a multiple of it where it is not a multiple of 8 (`padded_width`;
    1: no padding), invisibly to `state_dict()` and to loading (`GatedMLP`).
    `gemm` (one of quack_gemm.GEMM_CHOICES, default 'cublas'): 'quack' runs the SwiGLU MLPs' gate/up
    projection and activation as one quack-kernels GEMM (`workbench.quack_gemm`; CUDA compute
    capability 9.x, bf16/fp16, with the fused kernels), their weights kept paired (`GatedMLP.use_pairs`);
    'auto' is 'quack' where it runs and the tower has SwiGLU MLPs, else 'cublas'.
    """

    family: str = ""
    patch_bias: bool = False          # the patch embedding's Conv3d has a bias (Qwen3-VL, GLM-4.1V)
    patch_conv2d: bool = False        # the checkpoint's patch embedding is a Conv2d (Pixtral, Kimi-K2.5)
    rotary_interleaved: bool = False  # rotary angles as (w, h) pairs (Kimi-K2.5), not an h half and a w half

    def __init__(self, cfg: VisionConfig, input_norm: nn.Module | None = None, device_norm: bool = False,
                 attn_backend: str = "auto", fused="auto", gemm_align: int = GEMM_ALIGN, fold_norm: bool = False,
                 gemm: str = "cublas"):
        super().__init__()
        if cfg.family != self.family:
            raise ValueError(f"{type(self).__name__} builds family {self.family!r}, config {cfg.name!r} "
                             f"is {cfg.family!r}")
        if device_norm and input_norm is None:
            raise ValueError("this tower is built for device normalization (device_norm=True) but no norm "
                             "module was given; pass input_norm=wb.make_norm(name, cfg) with name in "
                             "wb.NORMS (an implicit identity would silently skip normalization)")
        if not isinstance(fold_norm, bool):
            raise ValueError(f"fold_norm must be True or False, got {fold_norm!r}")
        if fold_norm and (device_norm or input_norm is not None):
            raise ValueError("fold_norm=True folds the normalization into the patch embedding; a tower built so "
                             "takes no input_norm (device_norm=False): it would normalize twice")
        self.cfg = cfg
        self.device_norm = device_norm
        self.input_norm = input_norm
        self.attn_backend = check_backend(attn_backend)
        self.fused = check_fused(fused)
        self.gemm_align = check_gemm_align(gemm_align)     # the families build their MLPs with it
        self.gemm = quack_gemm.check_gemm(gemm)
        self.fold_norm = fold_norm
        self.patch_embed = (FoldedPatchEmbed if fold_norm else PatchEmbed)(cfg, bias=self.patch_bias,
                                                                           conv2d=self.patch_conv2d)

    # ---- properties ------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embed.proj.weight.device

    # ---- host side -------------------------------------------------------------------------
    def prepare(self, grid_thw: torch.Tensor, n_rows: int | None = None, n_segments: int | None = None,
                max_seqlen: int | None = None, n_window_segments: int | None = None,
                max_window_seqlen: int | None = None, device=None) -> TowerMetadata:
        """Build the metadata for `grid_thw` on the host and move it to `device` (default: the tower's).

        Padding arguments (for a graph runner's fixed budgets): `n_rows` total rows including
        padding (a multiple of 4), `n_segments` / `n_window_segments` the number of sequence slots
        (tails repeat the last offset), `max_seqlen` / `max_window_seqlen` the bound fixed at
        capture. Padding rows get rotary angle 0 and belong to no sequence.
        """
        cfg = self.cfg
        grid = check_grid(grid_thw, cfg)
        n_valid = sum(t * h * w for t, h, w in grid)
        n_rows = n_valid if n_rows is None else int(n_rows)
        if n_rows < n_valid or n_rows % cfg.merge_unit:
            raise ValueError(f"n_rows={n_rows} must be a multiple of {cfg.merge_unit} and >= the {n_valid} "
                             "rows of grid_thw")
        pos = torch.zeros(n_rows, 2, dtype=torch.int64)
        pos[:n_valid] = merge_block_positions(grid, cfg.merge_size)
        cos, sin = rotary_cos_sin(pos, cfg, self.dtype, self.rotary_inv_freq, interleaved=self.rotary_interleaved)
        frame_rows = self.sequences(grid)
        offsets = [0]
        for r in frame_rows:
            offsets.append(offsets[-1] + r)
        uniform = (n_rows == n_valid and len(set(frame_rows)) == 1
                   and (n_segments is None or n_segments == len(frame_rows)))
        meta = TowerMetadata(cos=cos, sin=sin, cu_seqlens=pad_offsets(offsets, n_segments),
                             max_seqlen=max(frame_rows) if max_seqlen is None else int(max_seqlen),
                             n_rows=n_rows, n_valid_rows=n_valid,
                             n_valid=torch.tensor(n_valid, dtype=torch.int32),
                             dense_seqlen=frame_rows[0] if uniform else None)
        meta = self._prepare_family(meta, grid, n_window_segments, max_window_seqlen)
        return meta.to(self.device if device is None else device)

    # the rotary's inverse frequencies (`rotary_cos_sin`): one table for both axes by default
    rotary_inv_freq = staticmethod(rotary_inv_freq)

    # True: an item's frames attend as one sequence (Kimi-K2.5's video chunks); False: each frame alone
    joint_frames: bool = False

    def sequences(self, grid) -> list[int]:
        """Rows of each attention sequence of ``grid`` (`sequence_rows`)."""
        return sequence_rows(grid, self.joint_frames)

    # towers with a learned position table resampled to each grid: 'bilinear' or 'bicubic' taps
    # (`position_taps`), host metadata like the rotary tables; None: no table
    position_resampling: str | None = None

    def _prepare_family(self, meta, grid, n_window_segments, max_window_seqlen) -> TowerMetadata:
        if self.position_resampling is not None:
            dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
            meta.pos_index, meta.pos_weight = position_taps(grid, self.cfg.merge_size, self.table_side,
                                                            self.position_resampling, meta.n_rows, dtype)
        return meta

    def prepare_capture(self, budget: int, max_items: int, device=None) -> TowerMetadata:
        """The static metadata a graph runner captures a budget's general graph with: a grid filling
        the budget, its padding (`budget_padding`), and no dense attention, since that graph must
        also serve padded and packed replays."""
        padding = budget_padding(self.cfg, budget, max_items)
        meta = self.prepare(filling_grid(self.cfg, budget), **padding, device=device)
        return dataclasses.replace(meta, dense_seqlen=None)

    # metadata of the most recent grids `prepare_cached` keeps, per tower (device tensors: a
    # 4096-token image's rotary tables are 10 MiB)
    META_CACHE_SIZE = 16

    def prepare_cached(self, grid_thw: torch.Tensor, **kw) -> TowerMetadata:
        """`prepare` remembered per (grid, padding arguments, device): a repeated image shape costs
        no host work. The result is shared between calls: read it, never write into it."""
        # the tower's device and dtype need no place in the key: `_apply` empties the cache
        key = (tuple(check_grid(grid_thw, self.cfg)), tuple(sorted(kw.items())))
        return remember(self.__dict__.setdefault("_meta_cache", {}), key, self.META_CACHE_SIZE,
                        lambda: self.prepare(grid_thw, **kw))

    def forget_metadata(self) -> None:
        """Drop what `prepare_cached` remembers: the next call of any shape prepares its own, as a new shape's does."""
        self.__dict__.pop("_meta_cache", None)

    def _apply(self, fn, recurse=True):
        self.__dict__.pop("_kernels", None)      # resolved again for the new device or dtype
        self.__dict__.pop("_meta_cache", None)   # device or dtype changes: drop cached tables
        return super()._apply(fn, recurse)

    # ---- device side -----------------------------------------------------------------------
    def refresh_derived(self) -> bool:
        """Bring the tensors derived from the parameters up to date (the folded patch embedding
        of placement `fold`, `FoldedPatchEmbed.refresh`), in place; a host-side check when they
        are fresh. A graph runner calls it before its replays, which run no forward in Python."""
        return self.fold_norm and self.patch_embed.refresh()

    def embed_input(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """First op: normalize on the device (placement `tower`) or cast what arrives (raw
        0..255 values are exact in bf16, fp16 and fp32: with `fold_norm`, the patch embedding's
        folded weights normalize them)."""
        if self.input_norm is not None:
            return self.input_norm(pixels, self.dtype, n_valid=meta.n_valid)
        # no device norm: the tower trusts its input, as engines' towers do (a uint8 batch is
        # then cast raw, which is exactly the silent failure the studies expose)
        return pixels.to(self.dtype)

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        raise NotImplementedError

    def block_attention(self, i: int, meta: TowerMetadata) -> tuple[torch.Tensor, int, int | None]:
        """(cu_seqlens, max_seqlen, dense_seqlen) block i attends with: full attention by default."""
        return meta.cu_seqlens, meta.max_seqlen, meta.dense_seqlen

    def run_blocks(self, x: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """Every block, then the head (`head`: the merger): [N, width] -> [N/4, embed_width] in the
        rows' order. Blocks listed in `taps` (Qwen3-VL's deepstack layers) hand their output to
        `tap(i, x)`, whose [N/4, out_hidden] features follow the head's output along the hidden
        axis, in block order.

        Fused (`kernels`): each block's residual sums ride in the next norm's kernel (the last one
        in the head's, or in a tap's), and the rotary and MLP activations are one kernel each."""
        backend, fused = self.kernels.backend, self.kernels.fused
        taps = self.taps
        features = []
        if not fused:
            for i, blk in enumerate(self.blocks):
                x = blk(x, *self.block_attention(i, meta), meta.cos, meta.sin, backend)
                if i in taps:
                    features.append(self.tap(i, x))
            out = self.head(x)
        else:
            delta = None
            for i, blk in enumerate(self.blocks):
                x, delta = blk.forward_fused(x, delta, *self.block_attention(i, meta), meta.cos, meta.sin, backend)
                if i in taps:
                    x, feature = self.tap_fused(i, x, delta)
                    features.append(feature)
                    delta = None
            out = self.head_fused(x, delta)
        return torch.cat([out, *features], dim=-1) if features else out

    # blocks whose output feeds an extra merger (none but in Qwen3-VL)
    taps: frozenset = frozenset()

    def tap(self, i: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def tap_fused(self, i: int, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, the tap's features) with the residual sum in the tap's first kernel."""
        raise NotImplementedError

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output [N, width] -> merged tokens [N/4, out_hidden]."""
        return self.merger(x)

    def head_fused(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """`head` of x + delta, the residual sum in the head's first kernel."""
        return self.merger.forward_fused(x, delta)

    def resolve_kernels(self, device=None, dtype: torch.dtype | None = None) -> "Kernels":
        """The concrete attention backend and fused choice for ``device`` and ``dtype`` (default:
        the tower's own), from what the tower was built with (``attn_backend``, ``fused``); an
        explicit choice the device or dtype cannot run is a ValueError here. Resolved once: the
        forward uses the result until the tower moves or changes dtype. A target other than the
        tower's own (a CUDA tower modelled on the meta device) is kept likewise."""
        device = self.device if device is None else torch.device(device)
        dtype = self.dtype if dtype is None else dtype
        backend = resolve_backend(self.attn_backend, device, dtype, self.cfg.head_dim)
        if self.fused == "auto":
            fused = device.type == "cuda" and dtype in fk.FUSED_DTYPES and fk.available(device)
        elif self.fused and dtype == torch.float64:
            raise ValueError("the fused kernels compute in float32; a float64 tower needs fused=False (or 'auto')")
        else:
            fused = bool(self.fused)
        if backend == "fa4" and device.type == "cuda":
            warm_fa4(self.cfg.heads, self.cfg.head_dim, dtype, device)       # its JIT compile: now, not timed
        gemm = self._resolve_gemm(device, dtype, fused)
        kernels = Kernels(backend, fused, gemm)
        self.__dict__["_kernels"] = kernels
        return kernels

    def _resolve_gemm(self, device: torch.device, dtype: torch.dtype, fused: bool) -> str:
        """The gated MLPs' gate/up kernel (`gemm`): 'quack' where the device and dtype run it (else a
        ValueError saying why; 'auto' falls back to 'cublas' instead), the fused kernels are on and the tower
        has gated MLPs; their weights then repacked paired, and the pinned kernel compiled now, not in a timed
        call."""
        mlps = [m for m in self.modules() if isinstance(m, GatedMLP)]
        gemm = self.gemm
        if gemm == "auto":         # quack only where it runs: the fused forward of SwiGLU MLPs, on a device it takes
            gemm = "quack" if fused and mlps and quack_gemm.quack_problem(device, dtype) is None else "cublas"
        gemm = quack_gemm.resolve_gemm(gemm, device, dtype)
        if gemm == "quack" and not fused:
            raise ValueError("MLP gemm 'quack' runs in the fused forward; it needs fused=True or 'auto' "
                             "(the fused kernels on), got fused=False")
        if gemm == "quack" and not mlps:
            raise ValueError(f"MLP gemm 'quack' runs the SwiGLU MLPs; {type(self).__name__} has none "
                             f"(its MLPs run on torch's matmuls): use 'cublas'")
        for m in mlps:
            if gemm == "quack":
                m.use_pairs()
                quack_gemm.warm(m.gate_up_weight.shape[1], m.padded_hidden, m.gate_up_bias is not None, dtype,
                                device)
            m.gemm = gemm
        return gemm

    @property
    def kernels(self) -> "Kernels":
        """The kernels the forward runs (`resolve_kernels`, for the tower's device and dtype unless
        resolved for another target)."""
        kernels = self.__dict__.get("_kernels")
        return kernels if kernels is not None else self.resolve_kernels()

    def forward(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """pixels [N, patch_dim] (uint8 for a device-normalizing or folded tower, else float) -> merged
        [N/4, embed_width] (see `run_blocks` for what follows the merged tokens in Qwen3-VL; a family
        that pools frames returns fewer: `VisionConfig.item_tokens`)."""
        if pixels.dim() != 2 or pixels.shape[1] != self.cfg.patch_dim:
            raise ValueError(f"pixels must be [N, {self.cfg.patch_dim}], got {tuple(pixels.shape)}")
        meta = self.prepare_cached(grid_thw)
        if pixels.shape[0] != meta.n_rows:
            raise ValueError(f"pixels have {pixels.shape[0]} rows but grid_thw adds up to {meta.n_rows}")
        out = self.forward_prepared(pixels.to(self.device), meta)
        tokens = sum(self.cfg.item_tokens(grid_thw))
        return out if tokens == out.shape[0] else out[:tokens]

    # ---- weights ---------------------------------------------------------------------------
    def state_mismatch(self, shapes: dict[str, tuple], missing: str = "missing from the checkpoint",
                       name=lambda k: k) -> str | None:
        """What keeps checkpoint tensors of ``shapes`` (tower key -> shape) from loading into this
        tower: missing, unexpected and mis-shaped keys (``name`` gives a key as the checkpoint
        spells it), or None when they fit."""
        own = {k: tuple(v.shape) for k, v in self.state_dict().items() if not k.startswith("input_norm.")}
        absent = sorted(set(own) - set(shapes))
        unexpected = sorted(set(shapes) - set(own))
        wrong = sorted(f"{name(k)}: checkpoint {shapes[k]} vs tower {own[k]}"
                       for k in set(own) & set(shapes) if tuple(shapes[k]) != own[k])
        if not (absent or unexpected or wrong):
            return None

        def show(xs):
            return ", ".join(xs[:12]) + (f" (+{len(xs) - 12} more)" if len(xs) > 12 else "")
        parts = [f"{missing}: {show(absent)}"] if absent else []
        if unexpected:
            parts.append(f"not in the {self.cfg.family} tower {self.cfg.name!r}: {show(unexpected)}")
        if wrong:
            parts.append(f"shape mismatch: {show(wrong)}")
        return "; ".join(parts)

    def init_random(self, seed: int = 0, std: float = 0.02) -> "VisionTower":
        """Checkpoint-like random weights drawn on the host (`init_checkpoint_like`); returns the tower."""
        init_checkpoint_like(self, seed, std)
        return self

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> "VisionTower":
        """Load a transformers vision-model state dict (keys may carry a `...visual.` prefix).

        Raises ValueError naming every missing, unexpected or mis-shaped key."""
        prefixes = {k[: k.index("visual.") + len("visual.")] for k in sd if "visual." in k}
        if len(prefixes) == 1 and all(k.startswith(next(iter(prefixes))) for k in sd):
            p = next(iter(prefixes))
            sd = {k[len(p):]: v for k, v in sd.items()}
        sd = {k: v for k, v in sd.items() if not k.endswith("inv_freq")}
        own = {k: v for k, v in self.state_dict().items() if not k.startswith("input_norm.")}
        problem = self.state_mismatch({k: tuple(v.shape) for k, v in sd.items()})
        if problem:
            raise ValueError("state dict does not fit: " + problem)
        with torch.no_grad():
            for k, v in own.items():
                v.copy_(sd[k])
        return self
