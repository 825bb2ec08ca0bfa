"""Vision towers, one module per family, and the family registry.

A family module holds its tower class, its presets and its `Family` descriptor (`FAMILY`).
Adding a family: write its module, then add it to the import and to `FAMILIES` below.
"""
from __future__ import annotations

from ..config import VisionConfig
from . import glm4v, qwen2_5_vl, qwen2_vl, qwen3_5, qwen3_vl
from .common import TowerMetadata, VisionTower
from .family import Family
from .qwen2_5_vl import Qwen25VisionTower
from .qwen2_vl import Qwen2VisionTower
from .qwen3_5 import Qwen35VisionTower
from .qwen3_vl import Qwen3VLVisionTower
from .glm4v import Glm4vVisionTower

# name -> descriptor; the order is the order of the preset list and of every family listing
FAMILIES: dict[str, Family] = {f.name: f for f in (qwen2_vl.FAMILY, qwen2_5_vl.FAMILY, qwen3_vl.FAMILY,
                                                    qwen3_5.FAMILY, glm4v.FAMILY)}
TOWERS = {name: f.tower for name, f in FAMILIES.items()}


def build_tower(cfg: VisionConfig, **kw) -> VisionTower:
    """The tower class of cfg.family with random (uninitialized) weights; see VisionTower for kw."""
    return FAMILIES[cfg.family].tower(cfg, **kw)


__all__ = ["FAMILIES", "TOWERS", "Family", "TowerMetadata", "VisionTower", "Qwen2VisionTower", "Qwen25VisionTower",
           "Qwen3VLVisionTower", "Qwen35VisionTower", "Glm4vVisionTower", "build_tower"]
