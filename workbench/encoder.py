"""The outer model: a vision tower plus the wiring that decides where normalization lives.

`build_encoder(cfg, placement, norm, dtype, device)` returns a `VisionEncoder` whose `.visual` is
the tower and whose `.encode(batch, path)` is what a model runner calls. The placements are wired
the way engines wire them, so that their failures come from the wiring alone:

- ``processor``: the CPU processor normalizes (`wb.preprocess(..., normalize=True)`); no device norm.
- ``fold``: the normalization is folded into the patch embedding's weights and bias
  (`towers.layers.FoldedPatchEmbed`): the tower casts the raw uint8 rows to its dtype and runs no
  norm at all, on every path (``norm=`` is unused).
- ``device``: preprocessing on the GPU; its last step normalizes the uint8 rows with ``norm=``
  into the tower dtype, out of place, at the entry of `encode` (and of the dp path's per-rank
  encode), before any path is chosen: eager, the graph runner (which then stages normalized
  floats: a float buffer, copied like `processor`'s) and dp all receive normalized rows. Unlike
  ``runner`` (normalizes straight into the graph buffer, valid rows only, fused with staging) it
  writes a tensor of its own first; unlike ``outer`` (skipped by the graph path) no path misses it.
- ``outer``: the outer model normalizes in `get_image_features` before calling the tower. A graph
  runner calls the outer model's graph forward (`graph_forward`), which goes straight to the tower's
  and so skips it: the cudagraph path sees raw pixels.
- ``outer_graph``: the outer model normalizes in a helper that both `get_image_features` and its
  graph forward (`graph_forward`, what the runner captures) call, as vLLM's Gemma-4 does (its
  `vision_input_norm` in `_embed_patches`, called by `encoder_cudagraph_forward` too): right on every
  path, the norm captured in the graph like placement ``tower``'s.
- ``tower``: normalization is the tower's first op, so every path that runs the tower gets it.
- ``runner``: the model runner normalizes the valid rows before dispatching to any path.
- ``none``: nobody normalizes (raw 0..255 values reach the patch embedding).
- ``double`` (study case, not a placement to use): CPU-normalized input and tower normalization.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Callable

import torch
from torch import nn

from . import limits
from .config import VisionConfig
from . import vocabulary
from .devices import resolve_device  # noqa: F401  (re-exported: its old home)
from .dtypes import BY_NAME, dtype_name
from .dtypes import resolve_dtype as _resolve_dtype
from .norms import InputNorm, make_norm
from .triton_support import interpreting
from .preprocess import PatchBatch
from .towers import build_tower
from .towers.common import check_fused
from .quack_gemm import check_gemm
from .towers.weights import skipped_default_init
from .towers.layers import GEMM_ALIGN
from .vocabulary import PATHS, PLACEMENT_TABLE, PLACEMENTS, STUDY_PLACEMENTS, Placement  # noqa: F401
from .vocabulary import check_placement

# the graph input buffer dtypes the runner takes, and the tower dtypes (names in workbench.vocabulary)
BUFFER_DTYPES = tuple(BY_NAME[n] for n in vocabulary.BUFFER_DTYPES)
TOWER_DTYPES = tuple(BY_NAME[n] for n in vocabulary.TOWER_DTYPES)
DTYPES = {dtype_name(d): d for d in TOWER_DTYPES}


def resolve_dtype(dtype) -> torch.dtype:
    """A tower dtype from a dtype, a name or an alias (bf16, fp32, fp16, fp64)."""
    return _resolve_dtype(dtype, allowed=TOWER_DTYPES, what="tower dtype")


class VisionEncoder(nn.Module):
    """Outer model: `.visual` (the tower), the placement's norm module, and `encode`."""

    def __init__(self, cfg: VisionConfig, placement: Placement, norm: InputNorm, dtype: torch.dtype,
                 device: torch.device, attn_backend: str = "auto", check_inputs: bool = True, fused="auto",
                 gemm_align: int = GEMM_ALIGN, gemm: str = "cublas"):
        """Trusts its arguments (`build_encoder` checks them): a `PLACEMENT_TABLE` row and a norm
        object (`workbench.norms.make_norm`), which normalizes where the placement says."""
        super().__init__()
        self.spec, self.cfg, self.norm = placement, cfg, norm
        self.check_inputs = check_inputs
        where = self.spec.norm_in
        self.visual = build_tower(cfg, input_norm=norm if where == "tower" else None, device_norm=where == "tower",
                                  fold_norm=where == "fold", attn_backend=attn_backend, fused=fused,
                                  gemm_align=gemm_align, gemm=gemm)
        # the GPU preprocessor's norm (placement `device`), the outer model's own (placement
        # `outer`) and the model runner's (placement `runner`)
        self.preprocessor_norm = norm if where == "device" else None
        self.outer_norm = norm if where in ("outer", "outer_graph") else None
        # the outer model's norm that its graph forward also runs (placement `outer_graph`)
        self.graph_norm = norm if where == "outer_graph" else None
        self.runner_norm = norm if where == "runner" else None
        self.to(device=device)
        self.visual.to(dtype=dtype)

    @property
    def placement(self) -> str:
        return self.spec.name

    @property
    def norm_name(self) -> str:
        return self.norm.name

    @property
    def dtype(self) -> torch.dtype:
        return self.visual.dtype

    @property
    def device(self) -> torch.device:
        return self.visual.device

    @property
    def input_kind(self) -> str:
        """'normalized' (float32 from the CPU processor) or 'uint8' (raw pixels)."""
        return self.spec.input_kind

    # ---- the GPU preprocessor's last step (placement `device`) -------------------------------
    def device_preprocess(self, batch: PatchBatch) -> PatchBatch:
        """Placement `device`: the batch's uint8 rows normalized on this encoder's device into its
        dtype, out of place (the whole batch, one norm call); the batch itself otherwise. What
        every path then receives (`Placement.runner_input`)."""
        if self.preprocessor_norm is None:
            return batch
        pixels = batch.pixels.to(self.device, non_blocking=True)
        return PatchBatch(self.preprocessor_norm(pixels, self.dtype), batch.grid_thw)

    def graph_input(self, batch: PatchBatch) -> PatchBatch:
        """The batch a graph runner stages, checked: for placement `device`, the normalized rows
        `encode` hands it, or a uint8 batch given to `runner.encode` directly, which is
        preprocessed here as `encode` would; for every other placement the batch itself."""
        if self.preprocessor_norm is not None and batch.pixels.dtype == torch.uint8:
            self.check_batch(batch)
            return self.device_preprocess(batch)
        self.check_batch(batch, kind=self.spec.runner_input)
        return batch

    # ---- the outer model's eager entry point -------------------------------------------------
    def get_image_features(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """What the engine's model calls on the eager path: outer norm (if placed here), then tower."""
        if self.outer_norm is not None:
            pixels = self.outer_norm(pixels, self.dtype)
        return self.visual(pixels, grid_thw)

    def graph_forward(self, pixels: torch.Tensor, meta) -> torch.Tensor:
        """What the outer model's encoder-graph forward runs on a graph runner's static buffers (vLLM's
        `encoder_cudagraph_forward`): the tower's graph-safe forward, after the outer model's norm where its
        graph forward calls it too (placement `outer_graph`; rows past ``meta.n_valid`` left to the norm's
        contract), never placement `outer`'s. Fixed shapes only: a graph captures it."""
        if self.graph_norm is not None:
            pixels = self.graph_norm(pixels, self.dtype, n_valid=meta.n_valid)
        return self.visual.forward_prepared(pixels, meta)

    def runner_normalize(self, pixels: torch.Tensor, out_dtype: torch.dtype | None = None, out=None,
                         n_valid=None) -> torch.Tensor:
        """The model runner's normalization (placement `runner`); a plain pass-through otherwise."""
        if self.runner_norm is None:
            return pixels
        return self.runner_norm(pixels, out_dtype or self.dtype, out=out, n_valid=n_valid)

    # ---- the model runner's entry point ------------------------------------------------------
    def check_batch(self, batch: PatchBatch, kind: str | None = None) -> None:
        """Refuse a batch this encoder cannot take: kind 'uint8' or 'normalized' (default: the
        placement's input_kind; a graph runner checks what it receives, `Placement.runner_input`)."""
        if not isinstance(batch, PatchBatch):
            raise TypeError(f"encode takes a wb.PatchBatch (from wb.preprocess), got {type(batch).__name__}")
        if batch.n_items == 0:
            raise ValueError("empty batch: no items to encode")
        if batch.pixels.shape[1] != self.cfg.patch_dim:
            raise ValueError(f"batch rows have {batch.pixels.shape[1]} columns, the {self.cfg.name!r} tower "
                             f"takes {self.cfg.patch_dim}")
        if self.check_inputs:
            want_float = (kind or self.spec.input_kind) == "normalized"
            if want_float and not batch.pixels.dtype.is_floating_point:
                raise ValueError(f"placement {self.placement!r} takes {self._normalized_source()} float pixels "
                                 f"{self._normalized_call()}, got {batch.pixels.dtype}")
            if not want_float and batch.pixels.dtype != torch.uint8:
                raise ValueError(f"placement {self.placement!r} takes raw uint8 pixels (wb.preprocess(...)), "
                                 f"got {batch.pixels.dtype}" + self._uint8_why())
            if want_float:
                self._check_normalized(batch.pixels)

    def _normalized_source(self) -> str:
        return "CPU-normalized" if self.spec.input_kind == "normalized" else "device-normalized"

    def _normalized_call(self) -> str:
        if self.spec.input_kind == "normalized":
            return "(wb.preprocess(..., normalize=True))"
        return "(enc.device_preprocess(batch), or uint8 rows)"

    def _uint8_why(self) -> str:
        """Why a uint8 placement refuses normalized floats, where it is not obvious."""
        if self.spec.norm_in == "fold":
            return ("; its normalization is folded into the patch embedding's weights, so normalized input "
                    "would be normalized twice")
        if self.spec.norm_in == "device":
            return "; its GPU preprocessor normalizes them (enc.device_preprocess) before every path"
        return ""

    # normalized values may sit this far outside their channel's range: a cast of the processor's
    # float32 to bf16 or fp16 rounds them by less
    NORMALIZED_TOLERANCE = 0.02

    def _check_normalized(self, pixels: torch.Tensor) -> None:
        """Normalized input must be finite and, per channel c, within (0 - mean_c) / std_c ..
        (255 * rescale_factor - mean_c) / std_c: what the processor makes of levels 0..255. One
        NaN pixel would turn every output row NaN (attention mixes it into all of them), and raw
        0..255 floats (the normalization forgotten) give finite, wrong embeddings; both would pass
        without a word. The uint8 placements' norms check their input alike (check_values)."""
        cfg = self.cfg
        mean = torch.tensor(cfg.image_mean, dtype=torch.float64)
        std = torch.tensor(cfg.image_std, dtype=torch.float64)
        channel = torch.arange(pixels.shape[1]) // (cfg.patch_dim // cfg.in_channels)
        lo, hi = (-mean / std)[channel], ((255 * cfg.rescale_factor - mean) / std)[channel]
        tol = self.NORMALIZED_TOLERANCE
        lo_t, hi_t = ((v + d).float().to(pixels.device) for v, d in ((lo, -tol), (hi, tol)))
        step = 1 << 16  # rows per pass: the comparison temporaries stay small for any batch
        for start in range(0, pixels.shape[0], step):
            x = pixels[start:start + step]
            bad = ~((x >= lo_t) & (x <= hi_t))  # NaN fails both comparisons
            if not bool(bad.any()):
                continue
            r, col = (int(v) for v in bad.nonzero()[0])
            value = x[r, col].item()
            finite = x[torch.isfinite(x)]
            if not math.isfinite(value):
                why = "not finite (one such pixel turns every output row NaN)"
            elif finite.numel() and float(finite.max()) > 2 * float(hi.max()):
                why = "raw 0..255 pixel values? the processor's normalization is missing"
            else:
                why = "outside what the processor makes of levels 0..255"
            raise ValueError(
                f"placement {self.placement!r} takes {self._normalized_source()} pixels {self._normalized_call()}; "
                f"found {value!r} at row {start + r}, column {col} (channel {int(channel[col])}, expected "
                f"{float(lo[col]):.4f}..{float(hi[col]):.4f}): {why} "
                f"(build_encoder(..., check_inputs=False) skips this check)")

    # What builds the runner of `encode(batch, path="cudagraph")` without runner=: a function
    # (encoder, batch) -> runner. The graph runner sits above the encoder, so the encoder never
    # looks it up; the package, which sees both, hands it in (workbench/__init__.py).
    default_runner_factory: Callable | None = None

    def encode(self, batch: PatchBatch, path: str = "eager", runner=None) -> torch.Tensor:
        """Merged embeddings [N/4, embed_width] in item order, on this encoder's device.

        path: 'eager' (the outer model calls the tower) or 'cudagraph' (`runner.encode(batch)`:
        runner is a wb.EncoderGraphRunner over this encoder, or None for a default one built for
        the batch). Path 'dp' runs across torch.distributed ranks, not on one encoder: call
        `workbench.dp.encode_dp(enc, batch)` on every rank.
        """
        if path not in PATHS:
            raise ValueError(f"unknown path {path!r}; valid: {PATHS}")
        if path == "dp":
            raise ValueError("path 'dp' runs on every torch.distributed rank at once, not through one encoder: "
                             "call workbench.dp.encode_dp(enc, batch) on each rank (under torchrun, or in a "
                             "function started by workbench.launch.launch(fn, world_size))")
        self.check_batch(batch)
        if path == "eager" and runner is not None:
            raise TypeError("path 'eager' takes no runner (runner= is for path 'cudagraph')")
        batch = self.device_preprocess(batch)     # placement device: before any path is chosen
        if path == "eager":
            return self.encode_eager(batch)
        return self._graph_runner(batch, runner).encode(batch)

    def _graph_runner(self, batch: PatchBatch, runner):
        """``runner`` checked against this encoder, or the default one for ``batch``."""
        if runner is None:
            if self.default_runner_factory is None:
                raise ValueError("path 'cudagraph' without runner= needs the default runner, which the package "
                                 "wires in when wb.build_encoder or wb.EncoderGraphRunner is first used (not when "
                                 "workbench.encoder is imported alone); pass runner=wb.EncoderGraphRunner(enc, "
                                 "budgets=[...]), or call runner.encode(batch)")
            return self.default_runner_factory(self, batch)
        # duck-typed: the runner class lives above the encoder
        if not callable(getattr(runner, "encode", None)) or not hasattr(runner, "encoder"):
            raise TypeError(f"runner must be a workbench EncoderGraphRunner (or None for the default), "
                            f"got {type(runner).__name__}")
        if runner.encoder is not self:
            raise ValueError("the runner was built for another encoder")
        return runner

    @torch.no_grad()
    def encode_eager(self, batch: PatchBatch) -> torch.Tensor:
        """The eager path on a batch as the paths receive it (`Placement.runner_input`: for
        placement `device`, already normalized by `device_preprocess`)."""
        pixels = batch.pixels.to(self.device, non_blocking=True)
        pixels = self.runner_normalize(pixels)
        return self.get_image_features(pixels, batch.grid_thw)


def build_encoder(cfg: VisionConfig | str | os.PathLike, placement: str = "tower", norm: str = "triton_rows",
                  dtype=torch.bfloat16, device="auto", attn_backend: str = "auto", seed: int | None = 0,
                  check_inputs: bool = True, fused="auto", weights: str | os.PathLike | None = None,
                  gemm_align: int = GEMM_ALIGN, gemm: str = "cublas") -> VisionEncoder:
    """Outer model with `.visual` for `cfg`: a VisionConfig, a preset name, or a local transformers
    model folder (its config.json and preprocessor_config.json give the config, its safetensors
    the vision tower's weights: `workbench.checkpoints`).

    weights: a model folder whose vision tensors to load (default: the folder ``cfg`` names, or the
    one a config read from a folder carries, ``cfg.checkpoint``); without, the weights are random
    (seeded, see ``seed``).

    placement: one of PLACEMENTS (or 'double'); norm: one of NORMS (checked, but run by no one
    for the placements of `vocabulary.NORM_FREE_PLACEMENTS`: processor, fold, none); dtype: tower dtype; device:
    'auto' | 'cpu' | 'cuda'; fused: 'auto' (the fused Triton block kernels of `workbench.fused` on
    CUDA for bf16/fp16 towers), True or False; gemm_align: the SwiGLU MLPs' hidden width is padded
    to a multiple of it where it is not a multiple of 8, invisibly to state dicts and loading
    (`towers.layers.GatedMLP`; default 64 on every device, 1: no padding; the tower checks it); gemm: the
    SwiGLU MLPs' gate/up kernel, 'cublas' (default), 'quack' (`workbench.quack_gemm`: one quack-kernels
    GEMM with the activation in its epilogue; CUDA compute capability 9.x, bf16/fp16, fused kernels on) or
    'auto' (quack where it runs, else cublas).
    Weights are random (seeded, checkpoint-like scales) unless seed is None (seed: an integer
    0..limits.seed); load real ones with `enc.visual.load_hf_state_dict(sd)`.
    check_inputs: refuse a batch the placement cannot take (dtype; for CPU-normalized input, values
    outside the normalized range or not finite); False is the engines' behaviour, for studies.
    """
    from .checkpoints import resolve_config     # the one reader of model folders (torch-free at import)
    cfg = resolve_config(cfg)                   # a folder's config carries the folder: cfg.checkpoint
    if weights is None and cfg.checkpoint is not None:
        weights = cfg.checkpoint
    # checked before anything uses them (norm.startswith below, the tower build): a None or a typo
    # must name itself and the choices, not surface as an AttributeError from deep inside;
    # make_norm is the norm's one door (workbench.vocabulary.check_norm_name)
    spec = check_placement(placement)
    norm_module = make_norm(norm, cfg, check_values=check_inputs)
    check_fused(fused)
    check_gemm(gemm)
    if seed is not None:
        seed = limits.seed(seed, "seed")
    if not isinstance(check_inputs, bool):
        raise ValueError(f"check_inputs must be True or False, got {check_inputs!r}")
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype)
    if norm.startswith("triton") and dev.type == "cpu" and not interpreting():
        raise ValueError(f"norm {norm!r} is a Triton kernel; on CPU it runs only under TRITON_INTERPRET=1 "
                         f"(set before the first Triton call); CPU-native choices: 'eager', 'identity'")
    # every parameter is written below (drawn or loaded): torch's default initialization would be drawn for nothing
    with skipped_default_init() if weights is not None or seed is not None else contextlib.nullcontext():
        enc = VisionEncoder(cfg, spec, norm_module, dtype, dev,
                            attn_backend=attn_backend, check_inputs=check_inputs, fused=fused, gemm_align=gemm_align,
                            gemm=gemm)
    enc.visual.resolve_kernels()     # an attention backend or fused choice this device cannot run fails here
    if weights is not None:
        from .checkpoints import load_vision_weights
        load_vision_weights(enc.visual, weights)
    elif seed is not None:
        # init_random draws in fp32 and copy_ rounds into the tower dtype: the same weights a
        # fp32 init followed by a cast would give, without two extra casts of every parameter
        enc.visual.init_random(seed)
    return enc.eval()
