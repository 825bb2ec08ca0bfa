"""Qwen3-VL vision tower (transformers' `Qwen3VLVisionModel`): patch 16, learned position table,
LayerNorm blocks with a GELU(tanh) MLP, full attention per frame, a merger, and deepstack mergers.

Forward, rows in merge-block order as everywhere here:

    x = patch_embed(pixels) (Conv3d with bias)  +  pos_embed resampled to the frame's grid
    x = blocks(x)                       full attention per frame, 2-D rotary as in Qwen2-VL
    merged = merger(x)                  LayerNorm(width) -> 2x2 shuffle -> fc1 -> GELU -> fc2
    deepstack_k = deepstack_merger_list[k](output of block deepstack_indexes[k])
                                        2x2 shuffle -> LayerNorm(4 width) -> fc1 -> GELU -> fc2

The position table holds num_position_embeddings = side x side learned vectors; every frame of
h x w patches reads it bilinearly (corners aligned) at its own grid, 4 taps per row. The taps and
weights depend only on the grid: `prepare` computes them on the host (`position_taps`) and the
forward gathers with them (`interpolated_positions`), so a CUDA graph replays any grid of its
budget.

Output form: the tower returns ONE tensor, the merged tokens with the deepstack features
concatenated after them along the hidden axis, [N/4, out_hidden * (1 + len(deepstack_indexes))]
(`VisionConfig.embed_width`): what vLLM's Qwen3-VL returns, and a single tensor keeps every path
(eager, the CUDA-graph runner, the data-parallel gather) unchanged. The language model splits it
back: columns [0, out_hidden) are the embedding that replaces the image tokens, block k's
deepstack feature is columns [(k+1) out_hidden, (k+2) out_hidden), added to the hidden state at
LM layer k.

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
    configs give them (sgl-jax's Qwen3VLVisionConfig defaults for the 2B; the project's FACTS).
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
import importlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from .common import (TowerMetadata, VisionBlock, VisionTower, add_norm, interpolated_positions)
from .family import Family, check_position_table, check_unused, expect, get, hf_common, need, norm_params
from .qwen2_vl import qwen_merger_macs

QWEN3_PROCESSOR = dict(patch_size=16, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
                       min_pixels=65536, max_pixels=16777216)
# the Qwen3-VL 8B / 30B-A3B / 235B-A22B tower, and the 2B / 4B one
TOWER_27 = dict(depth=27, width=1152, heads=16, mlp_hidden=4304, num_position_embeddings=2304, **QWEN3_PROCESSOR)
TOWER_24 = dict(depth=24, width=1024, heads=16, mlp_hidden=4096, num_position_embeddings=2304, **QWEN3_PROCESSOR)
# tiny towers: a 16 x 16 position table, the processor bounded to ~1 megapixel so photos stay small
TINY_QWEN3 = dict(width=64, heads=4, mlp_hidden=128, out_hidden=48, num_position_embeddings=256,
                  **{**QWEN3_PROCESSOR, "max_pixels": 1 << 20})


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Qwen3VLBlock(VisionBlock):
    def __init__(self, cfg: VisionConfig):
        mlp = nn.Module()
        mlp.linear_fc1 = nn.Linear(cfg.width, cfg.mlp_hidden)
        mlp.linear_fc2 = nn.Linear(cfg.mlp_hidden, cfg.width)
        super().__init__(cfg, "layer", mlp)

    def mlp_out(self, h):
        return self.mlp.linear_fc2(gelu_tanh(self.mlp.linear_fc1(h)))

    def mlp_fused(self, h):
        """fc1 with GELU(tanh) in cuBLASLt's GEMM epilogue (`torch._addmm_activation`), then fc2.

        GELU(tanh) alone is one elementwise pass over the fc1 output (rows x mlp_hidden), so a
        kernel of its own saves nothing; folding it into the GEMM does. A Triton GEMM with it lost
        to cuBLAS (probe_tma); cuBLASLt's GELU-bias epilogue is the tanh form this family asks for,
        and on the H200 it computes that form and makes the MLP faster at every row count tried
        (tools/probe_gelu.py; the numbers are in results/reference/README.md). On a CPU the same call
        computes the erf form, so there the plain ops run. On the meta device (the graph-pool
        model's trace) the CUDA path runs, so the model sees one fc1 output where the plain ops
        hold two. Checked against the plain twin and float64 in tests/test_cuda.py."""
        if h.device.type not in ("cuda", "meta"):
            return self.mlp_out(h)
        fc1 = self.mlp.linear_fc1
        return self.mlp.linear_fc2(torch._addmm_activation(fc1.bias, h, fc1.weight.t(), use_gelu=True))


class Qwen3VLMerger(nn.Module):
    """Merge each 2x2 block of rows into one token: LayerNorm, shuffle (4 rows -> one 4w row),
    fc1, GELU, fc2. The main merger normalizes each row before the shuffle (LayerNorm(width)), a
    deepstack merger the shuffled row (LayerNorm(4 width), ``postshuffle``)."""

    def __init__(self, cfg: VisionConfig, postshuffle: bool):
        super().__init__()
        self.merged = cfg.width * cfg.merge_unit
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.merged if postshuffle else cfg.width, eps=cfg.eps)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, cfg.out_hidden)

    def mlp(self, y: torch.Tensor) -> torch.Tensor:          # [N/4, 4w] -> [N/4, out_hidden]
        return self.linear_fc2(F.gelu(self.linear_fc1(y)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:       # [N, width] -> [N/4, out_hidden]
        if self.postshuffle:
            return self.mlp(self.norm(x.view(-1, self.merged)))
        return self.mlp(self.norm(x).view(-1, self.merged))

    def summed(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, merger output of it), the residual sum and the norm in one fused kernel
        (the shuffle is a view: a post-shuffle norm reads the same memory as 4w-wide rows)."""
        if self.postshuffle:
            d = None if delta is None else delta.view(-1, self.merged)
            s, y = add_norm(x.view(-1, self.merged), d, self.norm)
            return s.view(x.shape), self.mlp(y)
        s, y = add_norm(x, delta, self.norm)
        return s, self.mlp(y.view(-1, self.merged))

    def forward_fused(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        return self.summed(x, delta)[1]


class Qwen3VLVisionTower(VisionTower):
    family = "qwen3-vl"
    patch_bias = True
    position_resampling = "bilinear"

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.width)
        self.blocks = nn.ModuleList(Qwen3VLBlock(cfg) for _ in range(cfg.depth))
        self.merger = Qwen3VLMerger(cfg, postshuffle=False)
        self.deepstack_merger_list = nn.ModuleList(Qwen3VLMerger(cfg, postshuffle=True)
                                                   for _ in cfg.deepstack_indexes)
        self.taps = {b: k for k, b in enumerate(cfg.deepstack_indexes)}     # block -> deepstack merger
        self.table_side = math.isqrt(cfg.num_position_embeddings)

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, patch_dim] -> [n_rows/4, embed_width] (merged | deepstack...), fixed shapes."""
        x = self.patch_embed(self.embed_input(pixels, meta))
        x = x + interpolated_positions(self.pos_embed.weight, meta, x.dtype)
        return self.run_blocks(x, meta)

    def tap(self, i, x):
        return self.deepstack_merger_list[self.taps[i]](x)

    def tap_fused(self, i, x, delta):
        return self.deepstack_merger_list[self.taps[i]].summed(x, delta)


def qwen3_params(cfg) -> int:
    """Qwen3-VL / Qwen3.5 tower parameters (deepstack mergers included)."""
    w, h, m = cfg.width, cfg.mlp_hidden, cfg.width * cfg.merge_unit
    block = 2 * norm_params(w, "layer") + 4 * w * w + 4 * w + 2 * w * h + h + w
    merger = m * m + m + m * cfg.out_hidden + cfg.out_hidden
    return (w * cfg.patch_dim + w + cfg.num_position_embeddings * w + cfg.depth * block
            + norm_params(w, "layer") + merger + len(cfg.deepstack_indexes) * (norm_params(m, "layer") + merger))


class Qwen3VLFamily(Family):
    name = "qwen3-vl"
    tower = Qwen3VLVisionTower
    hf_class = ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLVisionModel")
    hf_config = ("transformers.models.qwen3_vl.configuration_qwen3_vl", "Qwen3VLVisionConfig")
    model_types = ("qwen3_vl", "qwen3_vl_moe")
    study_presets = ("tiny-qwen3-vl", "qwen3-vl-8b")
    deepstack = True        # the transformers config takes deepstack_visual_indexes
    presets = (
        dict(name="qwen3-vl-2b", out_hidden=2048, deepstack_indexes=(5, 11, 17), **TOWER_24),
        dict(name="qwen3-vl-4b", out_hidden=2560, deepstack_indexes=(5, 11, 17), **TOWER_24),
        dict(name="qwen3-vl-8b", out_hidden=4096, deepstack_indexes=(8, 16, 24), **TOWER_27),
        dict(name="qwen3-vl-30b-a3b", out_hidden=2048, deepstack_indexes=(8, 16, 24), **TOWER_27),
        dict(name="qwen3-vl-235b-a22b", out_hidden=4096, deepstack_indexes=(8, 16, 24), **TOWER_27),
        dict(name="tiny-qwen3-vl", depth=4, deepstack_indexes=(1, 2), **TINY_QWEN3),
    )

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
        module, name = self.hf_config
        kw = dict(depth=cfg.depth, hidden_size=cfg.width, hidden_act="gelu_pytorch_tanh",
                  intermediate_size=cfg.mlp_hidden, num_heads=cfg.heads, in_channels=cfg.in_channels,
                  patch_size=cfg.patch_size, spatial_merge_size=cfg.merge_size,
                  temporal_patch_size=cfg.temporal_patch_size, out_hidden_size=cfg.out_hidden,
                  num_position_embeddings=cfg.num_position_embeddings,
                  rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta})
        if self.deepstack:
            kw["deepstack_visual_indexes"] = list(cfg.deepstack_indexes)
        return getattr(importlib.import_module(module), name)(**kw)

    def from_hf(self, vc: dict) -> dict:
        expect(vc, "hidden_act", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
        return dict(hf_common(vc), width=need(vc, "hidden_size"), mlp_hidden=need(vc, "intermediate_size"),
                    out_hidden=need(vc, "out_hidden_size"), num_position_embeddings=need(vc, "num_position_embeddings"),
                    deepstack_indexes=get(vc, "deepstack_visual_indexes", ()))

    def hf_embeddings(self, model, pixels, grid_thw):
        out = model(pixels, grid_thw)
        return torch.cat([out.pooler_output, *(getattr(out, "deepstack_features", None) or [])], dim=-1)


FAMILY = Qwen3VLFamily()
