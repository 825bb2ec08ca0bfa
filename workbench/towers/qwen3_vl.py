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

Presets, checks and sizes: the family's spec, `workbench.families.qwen3_vl`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from .common import VisionTower
from .layers import VisionBlock, add_norm
from .metadata import TowerMetadata, interpolated_positions

def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Qwen3VLBlock(VisionBlock):
    # the checkpoint's names of the MLP's two linears (Kimi-K2.5's block: fc1 / fc2)
    mlp_names = ("linear_fc1", "linear_fc2")

    def __init__(self, cfg: VisionConfig):
        mlp = nn.Module()
        first, second = self.mlp_names
        setattr(mlp, first, nn.Linear(cfg.width, cfg.mlp_hidden))
        setattr(mlp, second, nn.Linear(cfg.mlp_hidden, cfg.width))
        super().__init__(cfg, "layer", mlp)

    @property
    def fc1(self) -> nn.Linear:
        return getattr(self.mlp, self.mlp_names[0])

    @property
    def fc2(self) -> nn.Linear:
        return getattr(self.mlp, self.mlp_names[1])

    def mlp_out(self, h):
        return self.fc2(gelu_tanh(self.fc1(h)))

    def mlp_fused(self, h):
        """fc1 with GELU(tanh) in cuBLASLt's GEMM epilogue (`torch._addmm_activation`), then fc2.

        GELU(tanh) alone is one elementwise pass over the fc1 output (rows x mlp_hidden), so a
        kernel of its own saves nothing; folding it into the GEMM does. A Triton GEMM with it lost
        to cuBLAS (probe_tma, docs/probes.md); cuBLASLt's GELU-bias epilogue is the tanh form this family asks for,
        and on the H200 it computes that form and makes the MLP faster at every row count tried
        (probe_gelu, docs/probes.md; the numbers are in results/reference/README.md). On a CPU the same call
        computes the erf form, so there the plain ops run. On the meta device (the graph-pool
        model's trace) the CUDA path runs, so the model sees one fc1 output where the plain ops
        hold two. Checked against the plain twin and float64 in tests/test_cuda.py."""
        if h.device.type not in ("cuda", "meta"):
            return self.mlp_out(h)
        fc1 = self.fc1
        return self.fc2(torch._addmm_activation(fc1.bias, h, fc1.weight.t(), use_gelu=True))


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


TOWER = Qwen3VLVisionTower
