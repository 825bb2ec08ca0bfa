"""Pixtral vision tower with Mistral3's multimodal projector (transformers' `PixtralVisionModel`,
then `Mistral3MultiModalProjector`, as `Mistral3Model.get_image_features` runs them).

Forward, rows in merge-block order as everywhere here (temporal_patch_size 1: a row is one
14 x 14 patch, 588 values):

    x = ln_pre(patch_embed(pixels))          Conv2d without bias == one matmul per row, then RMSNorm
    x = blocks(x)            RMSNorm pre-norm (eps 1e-5); q, k, v, o without bias; SwiGLU without
                             bias (GLM-4.1V's block); each image attends to itself (one sequence per
                             frame); 2-D rotary over the patch's (row, col), Pixtral's frequencies:
                             of theta^(-2k/head_dim), k = 0 .. head_dim/2 - 1, the even k turn with
                             the row and the odd k with the column (`pixtral_inv_freq`)
    merged = projector(x)    RMSNorm -> each 2 x 2 block's four rows, channel-major (unfold's order)
                             -> merging_layer (4w -> w) -> linear_1 (w -> out) -> GELU -> linear_2

Returns [N/4, out_hidden], merged tokens in each image's merged raster order (Mistral3's). The
grid-dependent tables are the rotary's cos/sin and cu_seqlens: host metadata
(`VisionTower.prepare`), so the forward is graph-safe.

Names: the layers are the shared ones (`patch_embed`, `blocks.N.norm1` / `attn.qkv` / `attn.proj` /
`norm2` / `mlp`, `merger`); the state dict speaks the checkpoint's names
(`vision_tower.patch_conv`, `vision_tower.transformer.layers.N.attention.q_proj` ...,
`multi_modal_projector.*`), translated both ways by state-dict hooks (`checkpoint_names.CheckpointNames`): the
fused qkv weight [3w, w] appears as the views q_proj / k_proj / v_proj [w, w] (writing into them
writes the fused weight, which `load_hf_state_dict` does), and torch's own `load_state_dict`
concatenates them back.

Presets, checks and sizes: the family's spec, `workbench.families.pixtral`.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from .checkpoint_names import CheckpointNames
from .common import VisionTower
from .glm4v import Glm4vBlock
from .layers import RMSNorm, add_norm
from .metadata import TowerMetadata

_LAYER = r"vision_tower.transformer.layers.\1."
# tower key -> checkpoint key, applied in order (first match)
CHECKPOINT_NAMES = (
    (r"^patch_embed\.proj\.", "vision_tower.patch_conv."),
    (r"^ln_pre\.", "vision_tower.ln_pre."),
    (r"^blocks\.(\d+)\.norm1\.", _LAYER + "attention_norm."),
    (r"^blocks\.(\d+)\.norm2\.", _LAYER + "ffn_norm."),
    (r"^blocks\.(\d+)\.attn\.proj\.", _LAYER + "attention.o_proj."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", _LAYER + "attention.qkv."),
    (r"^blocks\.(\d+)\.mlp\.", _LAYER + "feed_forward."),
    (r"^merger\.", "multi_modal_projector."),
)
# the tower's state dict in these names, a fused qkv as its q / k / v projections
NAMES = CheckpointNames(CHECKPOINT_NAMES, r"^(.*\.attention\.)qkv\.(weight)$")


def pixtral_inv_freq(cfg: VisionConfig, dtype=torch.float32) -> torch.Tensor:
    """[2, head_dim/4]: the row half's inverse frequencies, then the column half's. transformers'
    PixtralVisionRotaryEmbedding: theta^(-2k/head_dim) for k < head_dim/2, the even k for the
    row, the odd k for the column (rotate-half over the whole head)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=dtype) / d))
    return torch.stack([inv[0::2], inv[1::2]])


class Mistral3Projector(nn.Module):
    """Mistral3's multimodal projector on merge-block rows: RMSNorm, the patch merger
    (`patch_merger.merging_layer`: Linear(4w -> w) over each block's four rows read channel-major,
    the order of transformers' unfold), linear_1 (w -> out), GELU, linear_2; no biases."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        w, self.unit = cfg.width, cfg.merge_unit
        self.norm = RMSNorm(w, cfg.eps)
        self.patch_merger = nn.Module()
        self.patch_merger.merging_layer = nn.Linear(w * self.unit, w, bias=False)
        self.linear_1 = nn.Linear(w, cfg.out_hidden, bias=False)
        self.linear_2 = nn.Linear(cfg.out_hidden, cfg.out_hidden, bias=False)

    def mlp(self, y: torch.Tensor) -> torch.Tensor:            # normalized [N, w] -> [N/4, out]
        # [N/4, 4 rows, w] -> [N/4, w, 4 rows]: feature c * 4 + row, what unfold gives per block
        merged = y.view(-1, self.unit, y.shape[-1]).transpose(1, 2).reshape(-1, self.unit * y.shape[-1])
        return self.linear_2(F.gelu(self.linear_1(self.patch_merger.merging_layer(merged))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x))

    def forward_fused(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """The last block's residual sum and the norm in one kernel, then the rest."""
        return self.mlp(add_norm(x, delta, self.norm)[1])


class PixtralVisionTower(VisionTower):
    family = "pixtral"
    patch_conv2d = True
    rotary_inv_freq = staticmethod(pixtral_inv_freq)

    def __init__(self, cfg: VisionConfig, **kw):
        super().__init__(cfg, **kw)
        self.ln_pre = RMSNorm(cfg.width, cfg.eps)
        self.blocks = nn.ModuleList(Glm4vBlock(cfg, self.gemm_align) for _ in range(cfg.depth))
        self.merger = Mistral3Projector(cfg)
        NAMES.install(self)

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, patch_dim] -> merged embeddings [n_rows/4, out_hidden], fixed shapes only."""
        return self.run_blocks(self.ln_pre(self.patch_embed(self.embed_input(pixels, meta))), meta)


TOWER = PixtralVisionTower
