"""Qwen2.5-VL family spec: RMSNorm, SwiGLU MLP, window attention with a few full-attention blocks.

Presets: the vision configs of Qwen2.5-VL-3B / 7B / 72B (depth 32, width 1280, SwiGLU 3420, full
attention in blocks 7, 15, 23, 31, merger out 2048 / 3584 / 8192) with the CLIP processor
constants; a tiny one for CPU tests. The tower is `workbench.towers.qwen2_5_vl`.
"""
from __future__ import annotations

import dataclasses

from .base import Family, check_unused, expect, hf_common, need, norm_params
from .qwen2_vl import qwen_merger_macs, qwen_merger_params


class Qwen25VLFamily(Family):
    name = "qwen2.5-vl"
    hf_class = ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel")
    model_types = ("qwen2_5_vl",)
    study_presets = ("tiny-qwen2.5-vl", "qwen2.5-vl-7b")
    vllm_encoder_graphs = True
    presets = (
        dict(name="qwen2.5-vl-3b", mlp_hidden=3420, out_hidden=2048),
        dict(name="qwen2.5-vl-7b", mlp_hidden=3420, out_hidden=3584),
        dict(name="qwen2.5-vl-72b", mlp_hidden=3420, out_hidden=8192),
        dict(name="tiny-qwen2.5-vl", depth=4, width=64, heads=4, mlp_hidden=96, out_hidden=48,
             fullatt_blocks=(1, 3)),
    )

    def hf_model_class(self) -> type:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
        return Qwen2_5_VisionTransformerPretrainedModel
    def validate(self, cfg) -> list[str]:
        problems = []
        unit = cfg.patch_size * cfg.merge_size
        if cfg.window_size % unit:
            problems.append(f"window_size={cfg.window_size} px is not a multiple of "
                            f"patch_size*merge_size={unit} px")
        bad = [b for b in cfg.fullatt_blocks if not 0 <= b < cfg.depth]
        if bad:
            problems.append(f"fullatt_blocks {bad} are outside 0..{cfg.depth - 1} (depth={cfg.depth}); "
                            f"use dataclasses.replace(cfg, depth=..., fullatt_blocks=...)")
        return problems + check_unused(cfg, num_position_embeddings=0, deepstack_indexes=(), merger_hidden=0)

    def reduced(self, cfg, depth: int):
        """Same width, fewer blocks; the full-attention blocks keep their spacing (every 8th block,
        the last one always full) so window and full attention both run."""
        step = cfg.fullatt_blocks[1] - cfg.fullatt_blocks[0] if len(cfg.fullatt_blocks) > 1 else depth
        full = tuple(sorted({b for b in range(step - 1, depth, step)} | {depth - 1}))
        return dataclasses.replace(cfg, name=f"{cfg.name}@depth{depth}", depth=depth, fullatt_blocks=full)

    def qkv_width(self, cfg) -> int:
        """Output features of the fused qkv projection (a grouped-kv family has fewer)."""
        return 3 * cfg.width

    def n_params(self, cfg) -> int:
        w, h, qkv = cfg.width, cfg.mlp_hidden, self.qkv_width(cfg)
        block = 2 * norm_params(w, "rms") + (w + 1) * qkv + w * w + w + 3 * w * h + 2 * h + w
        return w * cfg.patch_dim + cfg.depth * block + qwen_merger_params(cfg, "rms")

    def row_macs(self, cfg) -> int:
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (w * self.qkv_width(cfg) + w * w + 3 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        return qwen_merger_macs(cfg)

    def full_attention_blocks(self, cfg) -> int:
        return len(cfg.fullatt_blocks)

    def hf_config_class(self) -> type:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
        return Qwen2_5_VLVisionConfig

    def hf_config_kwargs(self, cfg) -> dict:
        return dict(
            depth=cfg.depth, hidden_size=cfg.width, hidden_act="silu", intermediate_size=cfg.mlp_hidden,
            num_heads=cfg.heads, in_channels=cfg.in_channels, patch_size=cfg.patch_size,
            spatial_merge_size=cfg.merge_size, temporal_patch_size=cfg.temporal_patch_size,
            window_size=cfg.window_size, out_hidden_size=cfg.out_hidden,
            fullatt_block_indexes=list(cfg.fullatt_blocks),
            rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta},
        )

    def to_hf(self, cfg):
        return self.hf_config_class()(**self.hf_config_kwargs(cfg))


    def from_hf(self, vc: dict) -> dict:
        expect(vc, "hidden_act", "silu", "silu")
        return dict(hf_common(vc), width=need(vc, "hidden_size"), mlp_hidden=need(vc, "intermediate_size"),
                    out_hidden=need(vc, "out_hidden_size"), window_size=need(vc, "window_size"),
                    fullatt_blocks=need(vc, "fullatt_block_indexes"))


FAMILY = Qwen25VLFamily()
