"""Vision towers (nn.Modules), one module per family, and the map from a family name to its tower.

Each tower module holds its tower class (`TOWER`); everything else about a family (presets,
checks, sizes, the transformers mapping) is its spec in `workbench.families`, below this package.
Adding a family: write its tower module, then add it to the import and to `TOWERS` below.
"""
from __future__ import annotations

from ..config import VisionConfig
from . import (exaone4_5, gemma3, gemma4, glm4v, glm_ocr, kimi_k25, nemotron_vl, pixtral, qwen2_5_vl, qwen2_vl, qwen3_5,
               qwen3_vl)
from .common import VisionTower
from .metadata import TowerMetadata
from .qwen2_5_vl import Qwen25VisionTower
from .qwen2_vl import Qwen2VisionTower
from .qwen3_5 import Qwen35VisionTower
from .qwen3_vl import Qwen3VLVisionTower
from .glm4v import Glm4vVisionTower

# family name -> tower class, in the order of `workbench.families.FAMILIES`
TOWERS: dict[str, type[VisionTower]] = {m.TOWER.family: m.TOWER for m in (qwen2_vl, qwen2_5_vl, exaone4_5, qwen3_vl,
                                                                            qwen3_5, glm4v, glm_ocr, pixtral,
                                                                            kimi_k25, gemma3, gemma4, nemotron_vl)}


def build_tower(cfg: VisionConfig, **kw) -> VisionTower:
    """The tower class of cfg.family with random (uninitialized) weights; see VisionTower for kw."""
    return TOWERS[cfg.family](cfg, **kw)


__all__ = ["TOWERS", "TowerMetadata", "VisionTower", "Qwen2VisionTower", "Qwen25VisionTower",
           "Qwen3VLVisionTower", "Qwen35VisionTower", "Glm4vVisionTower", "build_tower"]
