"""Qwen3.5 family spec (transformers' `Qwen3_5VisionModel`; the tower is `workbench.towers.qwen3_5`):
the Qwen3-VL spec without deepstack.

Presets (processor: rescale 1/255, mean = std = 0.5, min/max pixels 65536 / 16777216 as
Qwen/Qwen3.5-2B-Base's preprocessor_config.json gives them, quoted in a public session log):

| preset | depth | width | mlp | out | source |
|---|---|---|---|---|---|
| qwen3.5-9b | 27 | 1152 | 4304 | 4096 | [a] |

[a] the Qwen3.5-9B config.json vision_config as a public repository's config-contract test quotes
    it (deepstack_visual_indexes [], depth 27, hidden 1152, intermediate 4304, 16 heads,
    num_position_embeddings 2304, out_hidden_size 4096, patch 16); an unsloth re-upload of the
    same model carries the same vision_config. The other Qwen3.5 sizes' vision configs were not
    found in the sources searched and are left out.
"""
from __future__ import annotations

from .base import check_position_table, check_unused
from .qwen3_vl import TINY_QWEN3, TOWER_27, Qwen3VLFamily


class Qwen35Family(Qwen3VLFamily):
    name = "qwen3.5"
    hf_class = ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5VisionModel")
    model_types = ("qwen3_5", "qwen3_5_moe")
    study_presets = ("tiny-qwen3.5", None)
    vllm_encoder_graphs = True
    deepstack = False
    presets = (
        dict(name="qwen3.5-9b", out_hidden=4096, **TOWER_27),
        dict(name="tiny-qwen3.5", depth=2, **TINY_QWEN3),
    )

    def hf_model_class(self) -> type:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
        return Qwen3_5VisionModel

    def hf_config_class(self) -> type:
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
        return Qwen3_5VisionConfig
    def validate(self, cfg) -> list[str]:
        return check_position_table(cfg) + check_unused(cfg, merger_hidden=0, deepstack_indexes=())

    def reduced(self, cfg, depth: int):
        return super(Qwen3VLFamily, self).reduced(cfg, depth)


FAMILY = Qwen35Family()
