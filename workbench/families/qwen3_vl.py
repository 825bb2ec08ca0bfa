"""Qwen3-VL family spec (transformers' `Qwen3VLVisionModel`; the tower is `workbench.towers.qwen3_vl`):
presets, checks, sizes and the transformers mapping.

Presets (vision_config of each published config.json; processor: rescale 1/255, mean = std = 0.5,
min/max pixels 65536 / 16777216 from the family's preprocessor_config.json `size`):

| preset | depth | width | mlp | out | deepstack | source |
|---|---|---|---|---|---|---|
| qwen3-vl-2b | 24 | 1024 | 4096 | 2048 | 5, 11, 17 | [a] |
| qwen3-vl-4b | 24 | 1024 | 4096 | 2560 | 5, 11, 17 | [b] |
| qwen3-vl-8b | 27 | 1152 | 4304 | 4096 | 8, 16, 24 | [c] |
| qwen3-vl-30b-a3b | 27 | 1152 | 4304 | 2048 | 8, 16, 24 | [d] |
| qwen3-vl-235b-a22b | 27 | 1152 | 4304 | 4096 | 8, 16, 24 | [e] |

All: 16 heads, patch 16, temporal patch 2, merge 2, num_position_embeddings 2304, gelu_pytorch_tanh.
[a] Qwen/Qwen3-VL-2B-Instruct: out 2048 and the 24 / 1024 / 4096 / [5, 11, 17] tower as vendored
    configs give them (sgl-jax's Qwen3VLVisionConfig defaults for the 2B).
[b] Qwen/Qwen3-VL-4B-Instruct config.json, transcribed in a public repository's test fixture
    (vision_config: out_hidden_size 2560, deepstack [5, 11, 17], depth 24, hidden 1024, mlp 4096).
[c] Qwen/Qwen3-VL-8B-Instruct config.json as AutoConfig printed it (transformers 4.57.3) in a
    public repository's script (out_hidden_size 4096).
[d] Qwen/Qwen3-VL-30B-A3B-Instruct config.json at commit 1fc78ad, transcribed byte for byte in a
    public repository's parser test (out_hidden_size 2048).
[e] Qwen/Qwen3-VL-235B-A22B-Instruct config.json, as quoted in a public architecture note
    ("verified 2026-05-15": out_hidden_size 4096, deepstack [8, 16, 24]).
"""
from __future__ import annotations

import dataclasses

from .base import Family, check_position_table, check_unused, expect, get, hf_common, need, norm_params
from .qwen2_vl import qwen_merger_macs

QWEN3_PROCESSOR = dict(patch_size=16, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
                       min_pixels=65536, max_pixels=16777216)
# the Qwen3-VL 8B / 30B-A3B / 235B-A22B tower, and the 2B / 4B one
TOWER_27 = dict(depth=27, width=1152, heads=16, mlp_hidden=4304, num_position_embeddings=2304, **QWEN3_PROCESSOR)
TOWER_24 = dict(depth=24, width=1024, heads=16, mlp_hidden=4096, num_position_embeddings=2304, **QWEN3_PROCESSOR)
# tiny towers: a 16 x 16 position table, the processor bounded to ~1 megapixel so photos stay small
TINY_QWEN3 = dict(width=64, heads=4, mlp_hidden=128, out_hidden=48, num_position_embeddings=256,
                  **{**QWEN3_PROCESSOR, "max_pixels": 1 << 20})


def qwen3_params(cfg) -> int:
    """Qwen3-VL / Qwen3.5 tower parameters (deepstack mergers included)."""
    w, h, m = cfg.width, cfg.mlp_hidden, cfg.width * cfg.merge_unit
    block = 2 * norm_params(w, "layer") + 4 * w * w + 4 * w + 2 * w * h + h + w
    merger = m * m + m + m * cfg.out_hidden + cfg.out_hidden
    return (w * cfg.patch_dim + w + cfg.num_position_embeddings * w + cfg.depth * block
            + norm_params(w, "layer") + merger + len(cfg.deepstack_indexes) * (norm_params(m, "layer") + merger))


class Qwen3VLFamily(Family):
    name = "qwen3-vl"
    hf_class = ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLVisionModel")
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    study_presets = ("tiny-qwen3-vl", "qwen3-vl-8b")
    vllm_encoder_graphs = True
    deepstack = True        # the transformers config takes deepstack_visual_indexes
    presets = (
        dict(name="qwen3-vl-2b", out_hidden=2048, deepstack_indexes=(5, 11, 17), **TOWER_24),
        dict(name="qwen3-vl-4b", out_hidden=2560, deepstack_indexes=(5, 11, 17), **TOWER_24),
        dict(name="qwen3-vl-8b", out_hidden=4096, deepstack_indexes=(8, 16, 24), **TOWER_27),
        dict(name="qwen3-vl-30b-a3b", out_hidden=2048, deepstack_indexes=(8, 16, 24), **TOWER_27),
        dict(name="qwen3-vl-235b-a22b", out_hidden=4096, deepstack_indexes=(8, 16, 24), **TOWER_27),
        dict(name="tiny-qwen3-vl", depth=4, deepstack_indexes=(1, 2), **TINY_QWEN3),
    )

    def hf_model_class(self) -> type:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel
        return Qwen3VLVisionModel

    def hf_config_class(self) -> type:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
        return Qwen3VLVisionConfig
    def validate(self, cfg) -> list[str]:
        problems = check_position_table(cfg) + check_unused(cfg, merger_hidden=0)
        ds = cfg.deepstack_indexes
        if any(b < 0 or b >= cfg.depth for b in ds) or list(ds) != sorted(set(ds)):
            problems.append(f"deepstack_indexes={ds} must be increasing block indices in 0..{cfg.depth - 1} "
                            f"(depth={cfg.depth}), each once")
        return problems

    def reduced(self, cfg, depth: int):
        """Fewer blocks; the deepstack layers keep their relative depth (block b of D becomes
        b * depth // D), merged where two land on one block, so the output can get narrower."""
        ds = tuple(sorted({b * depth // cfg.depth for b in cfg.deepstack_indexes}))
        return dataclasses.replace(cfg, name=f"{cfg.name}@depth{depth}", depth=depth, deepstack_indexes=ds)

    def n_params(self, cfg) -> int:
        return qwen3_params(cfg)

    def row_macs(self, cfg) -> int:
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (4 * w * w + 2 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        return (1 + len(cfg.deepstack_indexes)) * qwen_merger_macs(cfg)

    def to_hf(self, cfg):
        if cfg.eps != 1e-6:
            raise ValueError(f"transformers' {self.hf_class[1]} fixes every LayerNorm eps at 1e-6; eps={cfg.eps}")
        kw = dict(depth=cfg.depth, hidden_size=cfg.width, hidden_act="gelu_pytorch_tanh",
                  intermediate_size=cfg.mlp_hidden, num_heads=cfg.heads, in_channels=cfg.in_channels,
                  patch_size=cfg.patch_size, spatial_merge_size=cfg.merge_size,
                  temporal_patch_size=cfg.temporal_patch_size, out_hidden_size=cfg.out_hidden,
                  num_position_embeddings=cfg.num_position_embeddings,
                  rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta})
        if self.deepstack:
            kw["deepstack_visual_indexes"] = list(cfg.deepstack_indexes)
        return self.hf_config_class()(**kw)

    def from_hf(self, vc: dict) -> dict:
        expect(vc, "hidden_act", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
        return dict(hf_common(vc), width=need(vc, "hidden_size"), mlp_hidden=need(vc, "intermediate_size"),
                    out_hidden=need(vc, "out_hidden_size"), num_position_embeddings=need(vc, "num_position_embeddings"),
                    deepstack_indexes=get(vc, "deepstack_visual_indexes", ()))

    def hf_embeddings(self, model, pixels, grid_thw):
        import torch

        out = model(pixels, grid_thw)
        return torch.cat([out.pooler_output, *(getattr(out, "deepstack_features", None) or [])], dim=-1)


FAMILY = Qwen3VLFamily()
