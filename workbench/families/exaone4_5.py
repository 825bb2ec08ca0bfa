"""EXAONE-4.5 family spec (transformers' `Exaone4_5_VisionModel`; the tower is
`workbench.towers.exaone4_5`): the Qwen2.5-VL tower with grouped-query attention.

What differs from Qwen2.5-VL (transformers 5.24, models/exaone4_5): the attention's fused qkv
projection (with bias) gives `heads` query heads but only `num_key_value_heads` key and value
heads ([q | k | v] = heads + 2 x kv_heads heads of head_dim = width / heads), each key/value head
shared by heads / kv_heads consecutive query heads; the rotary, window attention, RMSNorm
(eps 1e-6) blocks, SwiGLU MLP with biases and RMSNorm merger are Qwen2.5-VL's. Its processor
(`Exaone4_5_Processor`, a Qwen2-VL processor) uses transformers' Qwen2-VL image processor
(`Qwen2VLImageProcessor`, `...Pil` without torchvision) and Qwen2-VL video processor, so the
resize rule (smart_resize, factor 28) and row layout are the Qwen family's.

Presets:

| preset | depth | width | heads | kv heads | mlp | out | full attention | source |
|---|---|---|---|---|---|---|---|---|
| exaone4.5-33b | 28 | 2048 | 32 | 8 | 5120 | 5120 | 6, 13, 20, 27 | [a] |

All: patch 14, temporal patch 2, merge 2, window 112 px, silu, rope theta 10000 (transformers'
default; the config gives none). Processor: transformers' Qwen2VLImageProcessor defaults (rescale
1/255, CLIP mean / std, size shortest_edge 3136 / longest_edge 1003520 = 56 x 56 / 28 x 28 x 1280,
per frame, bicubic), the class transformers 5.24 maps model_type exaone4_5 to [b]; the published
preprocessor_config.json was not found in the sources searched, so a folder's own file, read by
`workbench.checkpoints`, overrides these.
[a] LGAI-EXAONE/EXAONE-4.5-33B's vision_config as NVIDIA/TensorRT-LLM's EXAONE-4.5 model test
    (tests/unittest/_torch/modeling/test_modeling_exaone4_5.py) quotes it from the released
    checkpoint's config.json (model_type exaone4_5_vision, depth 28, hidden_size 2048, num_heads
    32, num_key_value_heads 8, intermediate_size 5120, out_hidden_size 5120, fullatt_block_indexes
    [6, 13, 20, 27], window_size 112, patch_size 14). Consistent with the model card (a vision
    encoder of 1.2B parameters: this preset has 1.29e9) and with the text model's width (5120,
    the merger's output). transformers' Exaone4_5_VisionConfig defaults are Qwen2.5-VL-7B's
    (32 blocks, hidden 3584, 16 heads) with 8 key/value heads, not this checkpoint.
[b] transformers/models/auto/image_processing_auto.py: exaone4_5 -> Qwen2VLImageProcessor
    (torchvision) / Qwen2VLImageProcessorPil (pil); video_processing_auto.py: Qwen2VLVideoProcessor.
"""
from __future__ import annotations

from .base import POSITIVE, checked
from .qwen2_5_vl import Qwen25VLFamily


class Exaone45Family(Qwen25VLFamily):
    name = "exaone4.5"
    hf_class = ("transformers.models.exaone4_5.modeling_exaone4_5", "Exaone4_5_VisionModel")
    model_types = ("exaone4_5",)
    study_presets = ("tiny-exaone4.5", "exaone4.5-33b")
    vllm_encoder_graphs = True      # inherited from Qwen2.5-VL's model class (the audit of vLLM 0.33 and 0.34)
    grouped_kv = True
    presets = (
        dict(name="exaone4.5-33b", depth=28, width=2048, heads=32, kv_heads=8, mlp_hidden=5120, out_hidden=5120,
             fullatt_blocks=(6, 13, 20, 27)),
        # 4 query heads of dim 16 over 2 key/value heads: the grouping is exercised, head_dim stays
        # a multiple of 8 (FlashAttention-4 takes it)
        dict(name="tiny-exaone4.5", depth=4, width=64, heads=4, kv_heads=2, mlp_hidden=96, out_hidden=48,
             fullatt_blocks=(1, 3)),
    )

    def hf_model_class(self) -> type:
        from transformers.models.exaone4_5.modeling_exaone4_5 import Exaone4_5_VisionModel
        return Exaone4_5_VisionModel

    def qkv_width(self, cfg) -> int:
        """Output features of the fused qkv projection: heads + 2 x kv_heads heads."""
        return (cfg.heads + 2 * cfg.n_kv_heads) * cfg.head_dim

    def hf_config_class(self) -> type:
        from transformers.models.exaone4_5.configuration_exaone4_5 import Exaone4_5_VisionConfig
        return Exaone4_5_VisionConfig

    def hf_config_kwargs(self, cfg) -> dict:
        return dict(super().hf_config_kwargs(cfg), num_key_value_heads=cfg.n_kv_heads)

    def from_hf(self, vc: dict) -> dict:
        # transformers' Exaone4_5_VisionConfig gives 8 key/value heads where the file names none
        kv = checked(vc.get("num_key_value_heads", 8), POSITIVE, "vision_config.num_key_value_heads")
        return dict(super().from_hf(vc), kv_heads=kv)


FAMILY = Exaone45Family()
