"""The outer model: a vision tower plus the wiring that decides where normalization lives.

`build_encoder(cfg, placement, norm, dtype, device)` returns a `VisionEncoder` whose `.visual` is
the tower and whose `.encode(batch, path)` is what a model runner calls. The placements are wired
the way engines wire them, so that their failures come from the wiring alone:

- ``processor``: the CPU processor normalizes (`wb.preprocess(..., normalize=True)`); no device norm.
- ``outer``: the outer model normalizes in `get_image_features` before calling the tower. A graph
  runner calls the tower directly and so skips it: the cudagraph path sees raw pixels.
- ``tower``: normalization is the tower's first op, so every path that runs the tower gets it.
- ``runner``: the model runner normalizes the valid rows before dispatching to any path.
- ``none``: nobody normalizes (raw 0..255 values reach the patch embedding).
- ``double`` (study case, not a placement to use): CPU-normalized input and tower normalization.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from .config import PRESET_NAMES, VisionConfig
from .norms import NORMS, _interpreting, make_norm
from .preprocess import PatchBatch
from .towers import build_tower

PLACEMENTS = ("processor", "outer", "tower", "runner", "none")
STUDY_PLACEMENTS = PLACEMENTS + ("double",)
PATHS = ("eager", "cudagraph", "dp")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}

# placements whose encoder takes the processor's float32 normalized pixels instead of uint8
FLOAT_INPUT_PLACEMENTS = ("processor", "double")


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "fp64": "float64"}


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        name = _DTYPE_ALIASES.get(name, name)
        if name in DTYPES:
            return DTYPES[name]
    raise ValueError(f"unsupported dtype {dtype!r}; valid: {tuple(DTYPES)} (or torch dtypes, bf16/fp32/fp16/fp64)")


def resolve_device(device) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else must be a valid, present device."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"invalid device {device!r}; valid: 'auto', 'cpu', 'cuda', 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but this torch has no CUDA device; use 'cpu' or 'auto'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; valid: 'auto', 'cpu', 'cuda', 'cuda:N'")
    return dev


class VisionEncoder(nn.Module):
    """Outer model: `.visual` (the tower), the placement's norm module, and `encode`."""

    def __init__(self, cfg: VisionConfig, placement: str, norm: str, dtype: torch.dtype, device: torch.device,
                 attn_backend: str = "auto", check_inputs: bool = True):
        super().__init__()
        if placement not in STUDY_PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; valid: {PLACEMENTS} (and the study case 'double')")
        if norm not in NORMS:
            raise ValueError(f"unknown norm {norm!r}; valid: {NORMS}")
        self.cfg, self.placement, self.norm_name = cfg, placement, norm
        self.check_inputs = check_inputs
        device_norm = placement in ("tower", "double")
        norm_module = make_norm(norm, cfg, check_values=check_inputs)
        self.visual = build_tower(cfg, input_norm=norm_module if device_norm else None, device_norm=device_norm,
                                  attn_backend=attn_backend)
        # the outer model's own norm (placement `outer`) and the model runner's (placement `runner`)
        self.outer_norm = norm_module if placement == "outer" else None
        self.runner_norm = norm_module if placement == "runner" else None
        self.to(device=device)
        self.visual.to(dtype=dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.visual.dtype

    @property
    def device(self) -> torch.device:
        return self.visual.device

    @property
    def input_kind(self) -> str:
        """'normalized' (float32 from the CPU processor) or 'uint8' (raw pixels)."""
        return "normalized" if self.placement in FLOAT_INPUT_PLACEMENTS else "uint8"

    # ---- the outer model's eager entry point -------------------------------------------------
    def get_image_features(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """What the engine's model calls on the eager path: outer norm (if placed here), then tower."""
        if self.outer_norm is not None:
            pixels = self.outer_norm(pixels, self.dtype)
        return self.visual(pixels, grid_thw)

    def runner_normalize(self, pixels: torch.Tensor, out_dtype: torch.dtype | None = None, out=None,
                         n_valid=None) -> torch.Tensor:
        """The model runner's normalization (placement `runner`); a plain pass-through otherwise."""
        if self.runner_norm is None:
            return pixels
        return self.runner_norm(pixels, out_dtype or self.dtype, out=out, n_valid=n_valid)

    # ---- the model runner's entry point ------------------------------------------------------
    def check_batch(self, batch: PatchBatch) -> None:
        if not isinstance(batch, PatchBatch):
            raise TypeError(f"encode takes a wb.PatchBatch (from wb.preprocess), got {type(batch).__name__}")
        if batch.n_items == 0:
            raise ValueError("empty batch: no items to encode")
        if batch.pixels.shape[1] != self.cfg.patch_dim:
            raise ValueError(f"batch rows have {batch.pixels.shape[1]} columns, the {self.cfg.name!r} tower "
                             f"takes {self.cfg.patch_dim}")
        if self.check_inputs:
            want_float = self.placement in FLOAT_INPUT_PLACEMENTS
            if want_float and not batch.pixels.dtype.is_floating_point:
                raise ValueError(f"placement {self.placement!r} takes CPU-normalized float pixels "
                                 f"(wb.preprocess(..., normalize=True)), got {batch.pixels.dtype}")
            if not want_float and batch.pixels.dtype != torch.uint8:
                raise ValueError(f"placement {self.placement!r} takes raw uint8 pixels (wb.preprocess(...)), "
                                 f"got {batch.pixels.dtype}")

    def encode(self, batch: PatchBatch, path: str = "eager", runner=None, **kw) -> torch.Tensor:
        """Merged embeddings [N/4, out_hidden] in item order, on this encoder's device.

        path: one of PATHS. `cudagraph` uses `runner` (a wb.EncoderGraphRunner over this encoder)
        or builds a default one; `dp` shards items over torch.distributed ranks (kw go to it).
        """
        if path not in PATHS:
            raise ValueError(f"unknown path {path!r}; valid: {PATHS}")
        self.check_batch(batch)
        if path == "eager":
            return self.encode_eager(batch)
        if path == "cudagraph":
            from .runner import EncoderGraphRunner
            if runner is None:
                runner = self.default_runner(batch)
            elif not isinstance(runner, EncoderGraphRunner):
                raise TypeError(f"runner must be a workbench EncoderGraphRunner (or None for the default), "
                                f"got {type(runner).__name__}")
            elif runner.encoder is not self:
                raise ValueError("the runner was built for another encoder")
            return runner.encode(batch)
        from .dp import encode_dp
        return encode_dp(self, batch, **kw)

    def default_runner(self, batch: PatchBatch):
        """The runner `encode(path='cudagraph')` uses without `runner=`: built for the first batch
        (`EncoderGraphRunner.default_for`), kept, and rebuilt when a later batch has an item
        larger than its largest budget. Keeping the first batch's budgets would run every larger
        item eagerly (a miss) for the encoder's whole life, which only `runner.stats` shows.
        """
        from .runner import EncoderGraphRunner, default_budgets
        current = getattr(self, "_default_runner", None)
        if current is None:
            self._default_runner = EncoderGraphRunner.default_for(self, batch)
            return self._default_runner
        wanted = default_budgets(EncoderGraphRunner.default_max_tokens(self, batch))
        if wanted[-1] <= current.budgets[-1]:
            return current
        # grow, never shrink: the budgets cover both the old batches and this one (default_budgets
        # are powers of two from 64, so `wanted` extends `current.budgets` when both are defaults)
        old = current.budgets
        biggest = max(r // self.cfg.merge_unit for r in batch.item_rows)
        # drop the old runner (its buffers and, on CUDA, its graph pool) before capturing again
        self._default_runner = current = None
        self._default_runner = EncoderGraphRunner.default_for(self, batch)
        warnings.warn(f"the default cudagraph runner was rebuilt: an item of {biggest} merged tokens exceeds its "
                      f"largest budget {old[-1]}; budgets {old} -> {self._default_runner.budgets} (every budget "
                      f"was captured again). To capture once, pass runner=wb.EncoderGraphRunner(enc, "
                      f"budgets=[...]) with budgets covering your largest item.", stacklevel=3)
        return self._default_runner

    @torch.no_grad()
    def encode_eager(self, batch: PatchBatch) -> torch.Tensor:
        pixels = batch.pixels.to(self.device, non_blocking=True)
        pixels = self.runner_normalize(pixels)
        return self.get_image_features(pixels, batch.grid_thw)


def build_encoder(cfg: VisionConfig | str, placement: str = "tower", norm: str = "triton_rows",
                  dtype=torch.bfloat16, device="auto", attn_backend: str = "auto", seed: int | None = 0,
                  check_inputs: bool = True) -> VisionEncoder:
    """Outer model with `.visual` for `cfg` (a VisionConfig or a preset name).

    placement: one of PLACEMENTS (or 'double'); norm: one of NORMS; dtype: tower dtype; device:
    'auto' | 'cpu' | 'cuda'. Weights are random (seeded, checkpoint-like scales) unless seed is
    None; load real ones with `enc.visual.load_hf_state_dict(sd)`.
    """
    if isinstance(cfg, str):
        cfg = VisionConfig.preset(cfg)
    if not isinstance(cfg, VisionConfig):
        raise TypeError(f"cfg must be a wb.VisionConfig or a preset name ({', '.join(PRESET_NAMES)}), "
                        f"got {type(cfg).__name__}")
    # checked before anything uses them (norm.startswith below, the tower build): a None or a typo
    # must name itself and the choices, not surface as an AttributeError from deep inside
    if placement not in STUDY_PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; valid: {PLACEMENTS} (and the study case 'double')")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; valid: {NORMS}")
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype)
    if norm.startswith("triton") and dev.type == "cpu" and not _interpreting():
        raise ValueError(f"norm {norm!r} is a Triton kernel; on CPU it runs only under TRITON_INTERPRET=1 "
                         f"(set before the first Triton call); CPU-native choices: 'eager', 'identity'")
    enc = VisionEncoder(cfg, placement, norm, dtype, dev, attn_backend=attn_backend, check_inputs=check_inputs)
    if seed is not None:
        # init_random draws in fp32 and copy_ rounds into the tower dtype: the same weights a
        # fp32 init followed by a cast would give, without two extra casts of every parameter
        enc.visual.init_random(seed)
    return enc.eval()
