"""Qwen2-VL family spec: LayerNorm pre-norm blocks, full attention everywhere, QuickGELU MLP.

Presets: the vision configs of Qwen2-VL-2B / 7B (depth 32, width 1280, MLP 5120, merger out
1536 / 3584) with the CLIP processor constants; a tiny one for CPU tests. The tower is
`workbench.towers.qwen2_vl`.
"""
from __future__ import annotations

from .base import Family, check_unused, expect, hf_common, need, norm_params


def qwen_merger_macs(cfg) -> int:
    """Multiply-adds per merged token of a Qwen merger: Linear(4w, 4w) and Linear(4w, out)."""
    m = cfg.width * cfg.merge_unit
    return m * m + m * cfg.out_hidden


def qwen_merger_params(cfg, norm_kind: str) -> int:
    """The Qwen2/2.5-VL merger: ln_q over width, then Linear(4w, 4w) and Linear(4w, out)."""
    m = cfg.width * cfg.merge_unit
    return norm_params(cfg.width, norm_kind) + m * m + m + m * cfg.out_hidden + cfg.out_hidden


class Qwen2VLFamily(Family):
    name = "qwen2-vl"
    hf_class = ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VisionTransformerPretrainedModel")
    model_types = ("qwen2_vl",)
    study_presets = ("tiny-qwen2-vl", "qwen2-vl-7b")
    vllm_encoder_graphs = True
    presets = (
        dict(name="qwen2-vl-2b", mlp_hidden=5120, out_hidden=1536),
        dict(name="qwen2-vl-7b", mlp_hidden=5120, out_hidden=3584),
        # same structure, small width and depth: CPU tests run in seconds
        dict(name="tiny-qwen2-vl", depth=2, width=64, heads=4, mlp_hidden=128, out_hidden=48),
    )

    def hf_model_class(self) -> type:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
        return Qwen2VisionTransformerPretrainedModel
    def validate(self, cfg) -> list[str]:
        return check_unused(cfg, num_position_embeddings=0, deepstack_indexes=(), merger_hidden=0)

    def n_params(self, cfg) -> int:
        w, h = cfg.width, cfg.mlp_hidden
        block = 2 * norm_params(w, "layer") + 4 * w * w + 4 * w + 2 * w * h + h + w
        return w * cfg.patch_dim + cfg.depth * block + qwen_merger_params(cfg, "layer")

    def row_macs(self, cfg) -> int:
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (4 * w * w + 2 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        return qwen_merger_macs(cfg)

    def to_hf(self, cfg):
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
        if cfg.mlp_hidden % cfg.width:
            raise ValueError(f"transformers' Qwen2-VL tower takes an integer mlp_ratio; "
                             f"mlp_hidden={cfg.mlp_hidden} is not a multiple of width={cfg.width}")
        return Qwen2VLVisionConfig(
            depth=cfg.depth, embed_dim=cfg.width, hidden_size=cfg.out_hidden,
            hidden_act="quick_gelu", mlp_ratio=cfg.mlp_hidden // cfg.width, num_heads=cfg.heads,
            in_channels=cfg.in_channels, patch_size=cfg.patch_size,
            spatial_merge_size=cfg.merge_size, temporal_patch_size=cfg.temporal_patch_size,
            rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta},
        )


    def from_hf(self, vc: dict) -> dict:
        expect(vc, "hidden_act", "quick_gelu", "quick_gelu")
        width = need(vc, "embed_dim")
        # Qwen2-VL's vision "hidden_size" is the merger output (the language model's width)
        return dict(hf_common(vc), width=width, mlp_hidden=width * need(vc, "mlp_ratio"),
                    out_hidden=need(vc, "hidden_size"))


FAMILY = Qwen2VLFamily()
