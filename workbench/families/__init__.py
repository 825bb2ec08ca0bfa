"""The family specs, one module per family, and their registry: plain Python, no torch.

A family module holds its presets (as data) and its `Family` spec (`FAMILY`): validation, sizes,
FLOPs, reduced depth, the transformers mapping. `workbench.config` builds its presets from here;
the towers (`workbench.towers`, torch) sit above and map each family name to its tower class.
Adding a family: write its spec module here and its tower module there, then add each to its
package's registry (`FAMILIES` below, `TOWERS` there).
"""
from __future__ import annotations

from . import (exaone4_5, gemma3, gemma4, glm4v, glm_ocr, kimi_k25, nemotron_vl, pixtral, qwen2_5_vl, qwen2_vl, qwen3_5,
               qwen3_vl)
from .base import Family

# name -> spec; the order is the order of the preset list and of every family listing
FAMILIES: dict[str, Family] = {f.name: f for f in (qwen2_vl.FAMILY, qwen2_5_vl.FAMILY, exaone4_5.FAMILY,
                                                    qwen3_vl.FAMILY, qwen3_5.FAMILY, glm4v.FAMILY, glm_ocr.FAMILY,
                                                    pixtral.FAMILY, kimi_k25.FAMILY, gemma3.FAMILY,
                                                    gemma4.FAMILY, nemotron_vl.FAMILY)}

__all__ = ["FAMILIES", "Family"]
