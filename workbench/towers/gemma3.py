"""Gemma-3's vision tower: SigLIP (transformers' `SiglipVisionModel`) with Gemma-3's multimodal projector
(`Gemma3MultiModalProjector`), as `Gemma3Model.get_image_features` runs them.

Forward, rows in merge-block order as everywhere here (merge_size 4: each 4 x 4 block of patches is 16
consecutive rows; temporal_patch_size 1: a row is one 14 x 14 patch, 588 values):

    x = patch_embed(pixels) + position_embedding[row's (row, col)]
                             Conv2d with bias == one matmul per row; the learned table holds one vector
                             per patch of the fixed side x side grid (64 x 64 at 896 px), gathered by
                             each row's patch coordinates (host metadata: `pos_index`)
    x = blocks(x)            LayerNorm pre-norm (eps 1e-6); q, k, v (one fused matmul) and out_proj with
                             biases; no rotary; MLP fc1 -> GELU(tanh) -> fc2 with biases; each image
                             attends to itself only (bidirectional)
    x = post_layernorm(x)
    y = the mean of each block's 16 rows        transformers' AvgPool2d(4) over the patch grid
    merged = (y * rsqrt(mean(y^2) + eps) * (1 + w)) @ mm_input_projection_weight
                             Gemma's RMSNorm in float32, then the projection [width, out_hidden]

Returns [N/16, out_hidden]: one token per 4 x 4 block, in each image's pooled raster order (256 per
896 px image). The grid-dependent tables are cu_seqlens and the position gather: host metadata
(`VisionTower.prepare`), so the forward is graph-safe. The tower has no rotary: its cos / sin tables are
zero columns wide.

Names: the layers are the shared ones (`patch_embed`, `blocks.N.norm1` / `attn.qkv` / `attn.proj` /
`norm2` / `mlp.fc1` / `mlp.fc2`), plus `position_embedding`, `post_layernorm` and
`multi_modal_projector`; the state dict speaks the checkpoint's names
(`vision_tower.embeddings.patch_embedding`, `vision_tower.encoder.layers.N.self_attn.q_proj` ...,
`vision_tower.post_layernorm`, `multi_modal_projector.*`), translated both ways by state-dict hooks
(`checkpoint_names.CheckpointNames`): the fused qkv weight [3w, w] and bias [3w] appear as the views q_proj / k_proj /
v_proj (writing into them writes the fused tensors, which `load_hf_state_dict` does), and torch's own
`load_state_dict` concatenates them back.

Presets, checks and sizes: the family's spec, `workbench.families.gemma3`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import varlen_attention
from ..config import VisionConfig
from .checkpoint_names import CheckpointNames
from .common import VisionTower
from .layers import VisionAttention, add_norm, rms_normalized
from .metadata import TowerMetadata, merge_block_positions
from .qwen3_vl import Qwen3VLBlock

_LAYER = r"vision_tower.encoder.layers.\1."
# tower key -> checkpoint key, applied in order (first match)
CHECKPOINT_NAMES = (
    (r"^patch_embed\.proj\.", "vision_tower.embeddings.patch_embedding."),
    (r"^position_embedding\.", "vision_tower.embeddings.position_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", _LAYER + "layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", _LAYER + "layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.proj\.", _LAYER + "self_attn.out_proj."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", _LAYER + "self_attn.qkv."),
    (r"^blocks\.(\d+)\.mlp\.", _LAYER + "mlp."),
    (r"^post_layernorm\.", "vision_tower.post_layernorm."),
)
# the tower's state dict in these names, a fused qkv as its q / k / v projections
NAMES = CheckpointNames(CHECKPOINT_NAMES, r"^(.*\.self_attn\.)qkv\.(weight|bias)$")


def no_rotary(cfg: VisionConfig, dtype=torch.float32) -> torch.Tensor:
    """No inverse frequencies: SigLIP has no rotary, so its cos / sin tables are [rows, 0]."""
    return torch.zeros(0, dtype=dtype)


def patch_positions(grid, merge: int, side: int, n_rows: int) -> torch.Tensor:
    """int64 [n_rows, 1]: each row's entry of the side x side position table, row * side + col of its
    patch (rows in merge-block order), coordinates clamped to the table (a grid larger than it is no
    Gemma-3 input); padding rows read entry 0 (their output is never read)."""
    pos = merge_block_positions(grid, merge).clamp(max=side - 1)
    out = torch.zeros(n_rows, 1, dtype=torch.int64)
    out[: pos.shape[0], 0] = pos[:, 0] * side + pos[:, 1]
    return out


class SiglipAttention(VisionAttention):
    """q, k and v with biases in one fused matmul, out_proj (here `proj`) with bias; no rotary."""

    def forward(self, x, cu_seqlens, max_seqlen, cos, sin, backend, dense_seqlen=None, fused=False):
        q, k, v = self.project_qkv(x).unbind(1)
        o = varlen_attention(q, k, v, cu_seqlens, max_seqlen, backend, dense_seqlen=dense_seqlen)
        return self.proj(o.reshape(x.shape[0], -1))


class SiglipBlock(Qwen3VLBlock):
    """Qwen3-VL's LayerNorm block with a GELU(tanh) MLP under SigLIP's names (mlp.fc1 / mlp.fc2), with
    attention that has no rotary."""

    mlp_names = ("fc1", "fc2")

    def __init__(self, cfg: VisionConfig):
        super().__init__(cfg)
        self.attn = SiglipAttention(cfg)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: statistics and scale in float32 (float64 in a float64 tower), the scale stored as
    an offset from one (x * (1 + w)), the result cast back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = rms_normalized(x, self.eps)
        return (xf * (1.0 + self.weight.to(xf.dtype))).to(x.dtype)


class Gemma3Projector(nn.Module):
    """Gemma3MultiModalProjector on merge-block rows: each block's merge_unit rows averaged (the
    average pool), Gemma's RMSNorm (`mm_soft_emb_norm`), then ``@ mm_input_projection_weight``."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.unit = cfg.merge_unit
        self.mm_input_projection_weight = nn.Parameter(torch.empty(cfg.width, cfg.out_hidden))
        self.mm_soft_emb_norm = GemmaRMSNorm(cfg.width, cfg.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # [N, width] -> [N/unit, out_hidden]
        pooled = x.view(-1, self.unit, x.shape[-1]).mean(1)
        return self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight


class Gemma3VisionTower(VisionTower):
    family = "gemma3"
    patch_bias = True
    patch_conv2d = True
    rotary_inv_freq = staticmethod(no_rotary)

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.table_side = math.isqrt(cfg.num_position_embeddings)
        self.position_embedding = nn.Embedding(cfg.num_position_embeddings, cfg.width)
        self.blocks = nn.ModuleList(SiglipBlock(cfg) for _ in range(cfg.depth))
        self.post_layernorm = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.multi_modal_projector = Gemma3Projector(cfg)
        NAMES.install(self)

    def _prepare_family(self, meta, grid, n_window_segments, max_window_seqlen) -> TowerMetadata:
        meta.pos_index = patch_positions(grid, self.cfg.merge_size, self.table_side, meta.n_rows)
        return meta

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, patch_dim] -> merged tokens [n_rows/16, out_hidden], fixed shapes only."""
        x = self.patch_embed(self.embed_input(pixels, meta))
        x = x + F.embedding(meta.pos_index[:, 0], self.position_embedding.weight).to(x.dtype)
        return self.run_blocks(x, meta)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.post_layernorm(x))

    def head_fused(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """The last block's residual sum and post_layernorm in one kernel, then the projector."""
        return self.multi_modal_projector(add_norm(x, delta, self.post_layernorm)[1])

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> "Gemma3VisionTower":
        """Also under the model's names (`Family.checkpoint_layouts`: transformers 5's model.vision_tower.*,
        the published vision_tower.vision_model.*, with multi_modal_projector.*); other tensors (the
        language model's) are left out."""
        keys = self.cfg.spec.checkpoint_keys(self.cfg, list(sd))
        return super().load_hf_state_dict({k: sd[ck] for k, (ck, _, _) in keys.items()} if keys else sd)


TOWER = Gemma3VisionTower
