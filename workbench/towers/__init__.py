"""Vision towers of the two Qwen families (one file each) and `build_tower`."""
from __future__ import annotations

from ..config import VisionConfig
from .common import TowerMetadata, VisionTower
from .qwen2_5_vl import Qwen25VisionTower
from .qwen2_vl import Qwen2VisionTower

TOWERS = {"qwen2-vl": Qwen2VisionTower, "qwen2.5-vl": Qwen25VisionTower}


def build_tower(cfg: VisionConfig, **kw) -> VisionTower:
    """The tower class of cfg.family with random (uninitialized) weights; see VisionTower for kw."""
    return TOWERS[cfg.family](cfg, **kw)


__all__ = ["TOWERS", "TowerMetadata", "VisionTower", "Qwen2VisionTower", "Qwen25VisionTower", "build_tower"]
