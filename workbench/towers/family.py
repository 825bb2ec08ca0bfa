"""What the package knows about one vision-tower family, in one object.

Each family module (`workbench/towers/<family>.py`) holds its tower class, its presets (the vision
configs and processor constants of the published checkpoints, as data) and one `Family` instance
that answers every family-specific question the rest of the package asks: how a config is
validated, its parameter count, its FLOPs per pixel row and per merged token, how it shrinks to
fewer blocks, and which transformers class and config it corresponds to. `workbench.towers`
registers the instances (`FAMILIES`); `VisionConfig` delegates to them by ``cfg.family``.

This module imports nothing heavy: a descriptor is plain Python until a tower is built.
"""
from __future__ import annotations

import dataclasses
import importlib
import math


class Family:
    """Base descriptor; a family module subclasses it and sets the class attributes.

    name: the ``VisionConfig.family`` string. tower: the `VisionTower` subclass. presets: dicts of
    VisionConfig fields (each with its ``name``; ``family`` is added), tiny CPU presets named
    ``tiny-...``. hf_class: (module, class) of transformers' vision model for this family;
    hf_class_aliases: the names of other transformers vision classes with the same architecture
    (a checkpoint of another layout of the family carries one)."""

    name: str = ""
    tower: type | None = None
    presets: tuple[dict, ...] = ()
    hf_class: tuple[str, str] = ("", "")
    hf_class_aliases: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()      # config.json `model_type` of the checkpoints of this family
    # the presets that stand for this family where a study measures one tower per family (its cells
    # per preset: staging, pool bytes, padding): (CPU profile, GPU profile); None: not in that
    # profile's default (a family whose input side another family's preset already covers)
    study_presets: tuple[str | None, str | None] = (None, None)

    # ---- configuration -----------------------------------------------------------------------
    def validate(self, cfg) -> list[str]:
        """Family-specific problems of ``cfg`` (sentences naming the value and what is expected);
        the generic checks (types, positivity, caps) have passed when this runs."""
        return []

    def reduced(self, cfg, depth: int):
        """``cfg`` with ``depth`` blocks (renamed '@depthN'); families with block indices in
        their config override this to keep them meaningful."""
        return dataclasses.replace(cfg, name=f"{cfg.name}@depth{depth}", depth=depth)

    # ---- sizes -------------------------------------------------------------------------------
    def n_params(self, cfg) -> int:
        """Parameters of the tower in checkpoint shapes."""
        raise NotImplementedError

    def row_macs(self, cfg) -> int:
        """Multiply-adds per pixel row of the matmuls that run per row: the patch embedding and
        every block's qkv, projection and MLP."""
        raise NotImplementedError

    def token_macs(self, cfg) -> int:
        """Multiply-adds per merged output token of the matmuls after the blocks (mergers)."""
        raise NotImplementedError

    def full_attention_blocks(self, cfg) -> int:
        """How many blocks attend over whole frames (the rest attend within windows)."""
        return cfg.depth

    # ---- transformers ------------------------------------------------------------------------
    def to_hf(self, cfg):
        """The transformers vision config equal to ``cfg``."""
        raise NotImplementedError

    def hf_model_class(self) -> type:
        """transformers' vision model class of this family (imported now)."""
        module, cls = self.hf_class
        return getattr(importlib.import_module(module), cls)

    def from_hf(self, vc: dict) -> dict:
        """VisionConfig fields (architecture only) from a checkpoint's config.json ``vision_config``
        dict; a missing key or a value the tower cannot run is a ValueError naming it."""
        raise NotImplementedError

    def frame_pixels(self, shortest_edge: int, longest_edge: int, temporal_patch_size: int) -> tuple[int, int]:
        """(min_pixels, max_pixels) per frame from the processor's ``size`` bounds (the Qwen
        processors bound each frame's pixels; GLM's overrides this)."""
        return shortest_edge, longest_edge

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers' output in our tower's form: the merged embedding [N/4, embed_width]."""
        out = model(pixels, grid_thw)
        return out.pooler_output if hasattr(out, "pooler_output") else out


# ---- shared checks and counts -------------------------------------------------------------------

def check_unused(cfg, **defaults) -> list[str]:
    """Problems for fields a family has no use for but that are set away from their default (a
    value the tower would silently ignore)."""
    return [f"{k}={getattr(cfg, k)!r}: the {cfg.family} tower has no use for it (leave it at {v!r})"
            for k, v in defaults.items() if getattr(cfg, k) != v]


def check_position_table(cfg) -> list[str]:
    """A learned position table must be a square grid of entries (it is resampled in 2-D)."""
    n = cfg.num_position_embeddings
    side = math.isqrt(n)
    if n <= 0 or side * side != n:
        return [f"num_position_embeddings={n} must be a positive square (side x side entries of the "
                f"learned position grid, e.g. 2304 = 48 x 48)"]
    return []


def norm_params(width: int, kind: str) -> int:
    """Parameters of one norm: LayerNorm has a bias, RMSNorm not."""
    return 2 * width if kind == "layer" else width


# ---- reading a checkpoint's vision_config -------------------------------------------------------

def need(vc: dict, key: str):
    """``vc[key]``, or a ValueError naming the missing key (the caller adds the file)."""
    if key not in vc:
        raise ValueError(f"vision_config has no {key!r}")
    return vc[key]


def expect(vc: dict, key: str, want, default) -> None:
    """A setting the tower hard-codes (an activation, a bias): refuse a checkpoint that differs."""
    got = vc.get(key, default)
    if got != want:
        raise ValueError(f"vision_config {key}={got!r}: this tower supports only {want!r}")


def hf_common(vc: dict) -> dict:
    """The fields every family's vision_config spells alike: depth, heads, patching, rotary theta."""
    rope = vc.get("rope_parameters") or vc.get("rope_scaling") or {}
    return dict(depth=need(vc, "depth"), heads=need(vc, "num_heads"), patch_size=need(vc, "patch_size"),
                temporal_patch_size=vc.get("temporal_patch_size", 2), merge_size=vc.get("spatial_merge_size", 2),
                in_channels=vc.get("in_channels", vc.get("in_chans", 3)),
                rope_theta=float(rope.get("rope_theta", vc.get("rope_theta", 10000.0))))
