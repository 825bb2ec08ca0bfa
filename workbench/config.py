"""Vision-tower configurations: one frozen dataclass, validation, presets.

A preset is data, not code (gpt-fast style), and a preset is a name: `VisionConfig.preset(name)`
looks it up (with ``depth``, a reduced copy), `VisionConfig.coerce(cfg_or_name)` takes either a
config or a preset name, and `dataclasses.replace(cfg, depth=2)` makes a modified copy that is
validated again. A local transformers model folder is no preset: the one function that takes a
name or a folder sits above this module (`workbench.checkpoints.resolve_config`).

Everything family-specific (the presets themselves, the family's own checks, parameter count,
FLOPs, reduced depth, the transformers mapping) lives in the family's spec under
`workbench.families` (plain Python, below this module) and is reached through `cfg.spec` (a
`workbench.families.base.Family`). So ``import workbench.config`` imports neither torch nor the
towers, and the presets are built when it is imported.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
from dataclasses import dataclass

from . import limits
from .families import FAMILIES as _SPECS

# CLIP statistics used by the Qwen2-VL processor (rescale 1/255 first, then (x - mean) / std).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def families() -> dict:
    """name -> `Family` spec of every registered tower family, in registry order
    (`workbench.families.FAMILIES`)."""
    return _SPECS


def _finite(v) -> bool:
    """A real, finite number (bool excluded: True is no epsilon). NaN and inf pass every `<=`
    comparison silently, so finiteness is checked explicitly."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class VisionConfig:
    """One vision tower plus the processor settings that feed it.

    Sizes are in patches and features; `width` is the residual-stream width, `out_hidden` the
    merger output (the language model's width), `embed_width` what the tower returns per merged
    token (out_hidden, times 1 + the deepstack layers for Qwen3-VL).
    """

    name: str
    family: str                      # one of FAMILIES (the registered families)
    depth: int = 32
    width: int = 1280
    heads: int = 16
    mlp_hidden: int = 5120           # block MLP width: fc1 (Qwen2-VL, Qwen3-VL) or SwiGLU gate/up
    out_hidden: int = 3584
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    in_channels: int = 3
    window_size: int = 112           # Qwen2.5-VL window attention, in pixels
    fullatt_blocks: tuple[int, ...] = (7, 15, 23, 31)  # Qwen2.5-VL blocks with full attention
    rope_theta: float = 10000.0
    eps: float = 1e-6
    # learned position table of num_position_embeddings = side^2 entries, resampled to each grid
    # (Qwen3-VL, Qwen3.5, GLM-4.1V); 0: none (Qwen2-VL, Qwen2.5-VL)
    num_position_embeddings: int = 0
    deepstack_indexes: tuple[int, ...] = ()   # Qwen3-VL blocks whose output feeds an extra merger
    merger_hidden: int = 0           # GLM-4.1V merger SwiGLU width; 0 where the merger is width*merge_unit wide
    # key/value heads of grouped-query attention (EXAONE-4.5: each serves heads / kv_heads query
    # heads); 0: one per query head (every family whose spec has no `grouped_kv`)
    kv_heads: int = 0
    # processor settings
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1.0 / 255.0
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    # a bound on each side instead of the area (Pixtral's processor: the image is shrunk to fit a
    # longest_edge x longest_edge box, then each side rounded up to patch_size * merge_size; the box
    # side is also capped at isqrt(max_pixels), the knob the studies turn); 0: the family bounds
    # the area by min_pixels / max_pixels (smart_resize). Only a family whose spec has
    # `bounds_longest_edge` takes it.
    longest_edge: int = 0
    # the model folder this config was read from (`workbench.checkpoints.resolve_config`), whose
    # vision tensors `build_encoder` loads; None: random seeded weights. A reduced copy has none
    # (fewer blocks).
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        problems, caps = [], []

        def cap(name: str, value: int, what: str) -> None:
            try:
                limits.check(name, value, what)
            except limits.LimitError as e:
                caps.append(str(e))

        if not isinstance(self.name, str):
            problems.append(f"name={self.name!r} must be a string")
        if self.checkpoint is not None and not isinstance(self.checkpoint, str):
            problems.append(f"checkpoint={self.checkpoint!r} must be a folder path (a string) or None")
        known = families()
        if self.family not in known:
            problems.append(f"family={self.family!r} is not one of {tuple(known)}")
        for name in ("depth", "width", "heads", "mlp_hidden", "out_hidden", "patch_size",
                     "temporal_patch_size", "merge_size", "in_channels", "window_size", "min_pixels",
                     "max_pixels"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name}={value!r} must be a positive integer")
            else:  # numpy integers are integers too; store plain ints (hashing, JSON, messages)
                object.__setattr__(self, name, int(value))
        for name in ("num_position_embeddings", "merger_hidden", "kv_heads", "longest_edge"):  # 0: the family has none
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
                problems.append(f"{name}={value!r} must be a non-negative integer")
            else:
                object.__setattr__(self, name, int(value))
        # sequences may come as lists: stored as tuples, so that the config stays hashable
        # (planner caches by config) and equal to the same config spelled with tuples
        for name in ("fullatt_blocks", "deepstack_indexes", "image_mean", "image_std"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("fullatt_blocks", "deepstack_indexes"):
            blocks = getattr(self, name)
            if not isinstance(blocks, tuple) or any(isinstance(b, bool) or not isinstance(b, numbers.Integral)
                                                    for b in blocks):
                problems.append(f"{name}={blocks!r} must be a tuple (or list) of block indices (integers)")
        if problems:
            raise ValueError(f"invalid VisionConfig {self.name!r}: " + "; ".join(problems))
        blocks = tuple(int(b) for b in self.fullatt_blocks)
        object.__setattr__(self, "fullatt_blocks", blocks)
        object.__setattr__(self, "deepstack_indexes", tuple(int(b) for b in self.deepstack_indexes))
        if self.width % self.heads:
            problems.append(f"width={self.width} is not divisible by heads={self.heads}")
        elif (self.width // self.heads) % 4:
            problems.append(f"head_dim={self.width // self.heads} must be divisible by 4 "
                            "(2-D rotary: half the head for h, half for w, in cos/sin pairs)")
        if self.kv_heads and (self.heads % self.kv_heads or not self.spec.grouped_kv):
            problems.append(f"kv_heads={self.kv_heads}: " + (
                f"the {self.family} tower has one key/value head per query head (leave it at 0)"
                if not self.spec.grouped_kv else f"heads={self.heads} is not a multiple of it"))
        if bool(self.longest_edge) != self.spec.bounds_longest_edge:
            problems.append(f"longest_edge={self.longest_edge}: " + (
                f"the {self.family} processor bounds each side; give the longest edge in pixels (> 0)"
                if self.spec.bounds_longest_edge else
                f"the {self.family} processor bounds the area (min_pixels / max_pixels); leave it at 0"))
        # Float settings: a zero, negative, NaN or inf value here fails nowhere later; it turns the
        # embeddings non-finite without a word (rsqrt(var + eps) with eps <= 0, the rotary
        # 1 / theta**(k / half) with theta 0, a NaN or inf scale on every pixel).
        for name in ("eps", "rope_theta", "rescale_factor"):
            value = getattr(self, name)
            if not (_finite(value) and value > 0):
                problems.append(f"{name}={value!r} must be a finite number > 0")
        stats_ok = True
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                problems.append(f"{name}={value!r} must be a tuple of {self.in_channels} numbers "
                                f"(one per channel, in_channels={self.in_channels})")
                stats_ok = False
                continue
            # mean may be any finite number (it is subtracted); std divides, so it must be > 0
            positive = name == "image_std"
            bad = [i for i, v in enumerate(value) if not (_finite(v) and (v > 0 or not positive))]
            if bad:
                want = "finite numbers > 0" if positive else "finite numbers"
                problems.append(f"{name}={tuple(value)} must hold {want}; bad entries at {bad}")
        if stats_ok and (len(self.image_mean) != self.in_channels or len(self.image_std) != self.in_channels):
            problems.append(f"image_mean/image_std need {self.in_channels} values (in_channels), "
                            f"got {len(self.image_mean)}/{len(self.image_std)}")
        # The resize bounds. smart_resize never goes below one merge block, so a max_pixels under
        # it would be exceeded without a word; above the cap, one frame alone is too large.
        factor = self.patch_size * self.merge_size
        if self.max_pixels < factor * factor:
            problems.append(f"max_pixels={self.max_pixels} is below one merge block ({factor}x{factor} = "
                            f"{factor * factor} pixels, patch_size*merge_size={factor}), the smallest size "
                            f"the processor resizes to; use max_pixels >= {factor * factor}")
        if self.min_pixels > self.max_pixels:
            problems.append(f"min_pixels={self.min_pixels} exceeds max_pixels={self.max_pixels}")
        cap("frame_pixels", self.min_pixels, f"min_pixels={self.min_pixels}")
        cap("frame_pixels", self.max_pixels, f"max_pixels={self.max_pixels}")
        # sizes that become allocations: the tower's weights, and the bytes of every patch row
        cap("depth", self.depth, f"depth={self.depth}")
        cap("patch_dim", self.patch_dim, f"patch_dim={self.patch_dim} (in_channels*temporal_patch_size*"
                                         f"patch_size^2 = {self.in_channels}*{self.temporal_patch_size}*"
                                         f"{self.patch_size}^2)")
        cap("tower_params", self.n_params, f"{self.n_params} tower parameters (depth={self.depth}, "
                                           f"width={self.width}, mlp_hidden={self.mlp_hidden}, "
                                           f"out_hidden={self.out_hidden}, merge_size={self.merge_size})")
        if len(set(blocks)) != len(blocks):
            repeated = sorted({b for b in blocks if blocks.count(b) > 1})
            problems.append(f"fullatt_blocks={tuple(blocks)} repeats block(s) {repeated}; give each block once")
        problems += self.spec.validate(self)
        if problems or caps:
            error = limits.LimitError if caps else ValueError
            raise error(f"invalid VisionConfig {self.name!r}: " + "; ".join(problems + caps))

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads of the attention: kv_heads, or heads where it is 0."""
        return self.kv_heads or self.heads

    @property
    def patch_dim(self) -> int:
        """Columns of one pixel row: C * T * P * P (1176 for the real towers)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def spec(self):
        """The family's spec (`workbench.families.base.Family`): everything family-specific."""
        return families()[self.family]

    @property
    def n_params(self) -> int:
        """Parameters of the tower in checkpoint shapes (what `tower_params` caps): the patch
        embedding, each block's norms, attention and MLP, and the merger(s)."""
        return self.spec.n_params(self)

    @property
    def embed_width(self) -> int:
        """Features per merged token the tower returns: out_hidden, and for Qwen3-VL one more
        out_hidden-wide deepstack feature per `deepstack_indexes` entry, concatenated after it."""
        return self.out_hidden * (1 + len(self.deepstack_indexes))

    def item_tokens(self, grid_thw) -> list[int]:
        """Merged tokens the tower returns for each item of ``grid_thw`` ((t, h, w) rows): one per
        merge block of every frame (t h w / merge_unit), or what the family's `item_tokens` says
        (Kimi-K2.5 pools a chunk's frames into one frame's tokens)."""
        rows = grid_thw.tolist() if hasattr(grid_thw, "tolist") else grid_thw
        return [self.spec.item_tokens(self, *(int(v) for v in g)) for g in rows]

    @property
    def merge_unit(self) -> int:
        """Rows merged into one output token (4)."""
        return self.merge_size ** 2

    @property
    def window_merged(self) -> int:
        """Qwen2.5-VL window side in merged tokens (112 px / 28 px = 4)."""
        return self.window_size // (self.patch_size * self.merge_size)

    @property
    def norm_scale(self) -> tuple[float, ...]:
        """Per-channel multiplier of the device normalization: rescale / std."""
        return tuple(self.rescale_factor / s for s in self.image_std)

    @property
    def norm_shift(self) -> tuple[float, ...]:
        """Per-channel offset of the device normalization: -mean / std."""
        return tuple(-m / s for m, s in zip(self.image_mean, self.image_std))

    # ---- presets and transformers mapping ------------------------------------------------
    @classmethod
    def preset(cls, name: str, depth: int | None = None) -> "VisionConfig":
        """The named preset; raises ValueError listing the valid names for anything else (a model
        folder too: `workbench.checkpoints.resolve_config` takes a name or a folder).

        depth: None keeps the preset's own depth (the preset itself); any number gives
        `reduced(depth)`, a renamed '@depthN' copy even at the preset's own depth (what every
        study's ``(preset, depth)`` parameters mean)."""
        try:
            cfg = PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}; a transformers "
                             f"model folder is read by workbench.checkpoints.resolve_config(folder)") from None
        return cfg if depth is None else cfg.reduced(depth)

    @classmethod
    def coerce(cls, cfg_or_name, default: "VisionConfig | None" = None) -> "VisionConfig":
        """``cfg_or_name`` as a VisionConfig: a VisionConfig as it is, a string through `preset`
        (an unknown name is a ValueError listing the valid ones). None gives ``default`` where the
        caller has one (else it is refused like any other value). Anything else is a TypeError
        naming the value and the valid presets: the one check of every entry point that takes a
        config or a preset name."""
        if cfg_or_name is None and default is not None:
            return default
        if isinstance(cfg_or_name, str):
            return cls.preset(cfg_or_name)
        if not isinstance(cfg_or_name, cls):
            either = "a wb.VisionConfig, a preset name or None" if default is not None else \
                "a wb.VisionConfig or a preset name"
            raise TypeError(f"cfg must be {either} (valid presets: {', '.join(PRESET_NAMES)}), "
                            f"got {type(cfg_or_name).__name__} {reprlib.repr(cfg_or_name)}")
        return cfg_or_name

    def to_hf(self):
        """The matching transformers vision config (Qwen2VLVisionConfig, Qwen3VLVisionConfig, ...)."""
        return self.spec.to_hf(self)

    def reduced(self, depth: int) -> "VisionConfig":
        """Same width, fewer blocks, renamed '@depthN'; block indices in the config (Qwen2.5-VL's
        full-attention blocks, Qwen3-VL's deepstack layers) are spread over the new depth the way
        the family's `reduced` says."""
        out = self.spec.reduced(self, depth)
        return dataclasses.replace(out, checkpoint=None) if out.checkpoint else out


def _presets() -> dict[str, VisionConfig]:
    """Every family's presets: the real checkpoints first (registry order), then the tiny ones."""
    with limits.shipped():      # checked against the default caps: a malformed variable never stops an import
        made = [VisionConfig(**{**p, "family": name}) for name, fam in families().items() for p in fam.presets]
    made.sort(key=lambda c: c.name.startswith("tiny-"))          # stable: family order kept
    return {c.name: c for c in made}


# name -> VisionConfig of every preset, and the names of the presets and of the families
PRESETS: dict[str, VisionConfig] = _presets()
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)
FAMILIES: tuple[str, ...] = tuple(families())
# the presets that stand for the families in the studies' CPU and GPU defaults (`Family.study_presets`)
TINY_PRESET_PER_FAMILY = [f.study_presets[0] for f in families().values() if f.study_presets[0]]
REAL_PRESET_PER_FAMILY = [f.study_presets[1] for f in families().values() if f.study_presets[1]]
# one real preset per family, the family's study preset else its first real one: the rows of the answer table
ANSWER_PRESETS = [f.study_presets[1] or next((n for n, c in PRESETS.items() if c.family == name
                                              and not n.startswith("tiny-")), None)
                  for name, f in families().items()]
ANSWER_PRESETS = [n for n in ANSWER_PRESETS if n is not None]
