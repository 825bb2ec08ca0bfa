"""Nemotron-H Nano VL V2's vision tower: RADIO (transformers' `RadioModel`, input conditioner detached) with the
pixel shuffle and `NemotronH_Omni_Reasoning_V3MultiModalProjector`, as `get_image_features` runs them.

Forward, rows in merge-block order as everywhere here (merge_size 2: each 2 x 2 block of patches is 4
consecutive rows; temporal_patch_size 1: a row is one 16 x 16 patch, 768 values (C, ph, pw)):

    x = pixels @ patch_projection + sum_k pos_weight[k] * table[pos_index[k]]
                             Linear without bias; the learned (S x S) position table resampled bilinearly
                             (align_corners false) to a square of max(h, w) a side, its top-left h x w
                             corner: 4 taps a row, host metadata
    xe = [prefix, frame 0's rows, prefix, frame 1's rows, ..., padding]
                             the 10 learned cls / register tokens before every frame: one gather
                             (`ext_index`, host metadata) from [x; cls_register_token]
    xe = blocks(xe)          LayerNorm pre-norm; q, k, v (one fused matmul) and o with biases, no rotary;
                             MLP fc1 -> GELU (erf) -> fc2 with biases; each frame attends to its own prefix
                             and rows (`ext_cu_seqlens`)
    x = xe[patch_index]      the rows back, the prefix tokens dropped
    merged = relu(rms(x.view(-1, 4 * width)) @ linear_1)^2 @ linear_2
                             the pixel shuffle is the view (its (0,0), (0,1), (1,0), (1,1) order is the
                             merge block's); RMSNorm weight and statistics in float32

Returns [N/4, out_hidden]: one token per 2 x 2 block, in each image's merged raster order. Every grid-dependent
table (cu_seqlens of the extended sequence, the gathers, the position taps) is host metadata
(`VisionTower.prepare`), so the forward is graph-safe; a graph runner's budget pads the extended sequence with
a prefix per sequence slot, so its shapes are fixed per budget.

Names: the state dict speaks transformers' module names (`vision_model.embeddings.patch_projection`,
`vision_model.encoder.layer.N.attention.q_proj` ..., `multi_modal_projector.*`), translated both ways by
state-dict hooks (`checkpoint_names.CheckpointNames`): the fused qkv as three views, the patch projection kept
here as [width, C, P, P] as the checkpoint's [width, C*P*P]. `load_hf_state_dict` also takes the released
layout (`vision_model.radio_model.model.*`, `mlp1.*`), through the family's `checkpoint_keys`.

No fused Triton kernels (GELU erf, the prefix gathers): the tower runs plain torch ops on every device.

Presets, checks and sizes: the family's spec, `workbench.families.nemotron_vl`.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import VisionConfig
from ..families.nemotron_vl import NOT_HELD, PREFIX_TOKENS, PROJECTOR_EPS
from .checkpoint_names import CheckpointNames
from .common import VisionTower
from .gemma3 import SiglipBlock, no_rotary
from .layers import rms_normalized
from .metadata import TowerMetadata, merge_block_positions, pad_offsets

_LAYER = r"vision_model.encoder.layer.\1."
# tower key -> checkpoint key, applied in order (first match); multi_modal_projector.* keeps its names
CHECKPOINT_NAMES = (
    (r"^patch_embed\.proj\.", "vision_model.embeddings.patch_projection."),
    (r"^position_embedding$", "vision_model.embeddings.position_embedding"),
    (r"^cls_register_token$", "vision_model.embeddings.cls_register_token"),
    (r"^blocks\.(\d+)\.attn\.proj\.", _LAYER + "attention.o_proj."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", _LAYER + "attention.qkv."),
    (r"^blocks\.(\d+)\.", _LAYER),
)


def flat_patches(w: torch.Tensor) -> torch.Tensor:
    """[width, C, P, P] -> the checkpoint's [width, C*P*P] (the same column order)."""
    return w.reshape(w.shape[0], -1)


def square_patches(w: torch.Tensor, channels: int = 3) -> torch.Tensor:
    p = math.isqrt(w.shape[1] // channels)
    return w.reshape(w.shape[0], channels, p, p)


NAMES = CheckpointNames(CHECKPOINT_NAMES, r"^(.*\.attention\.)qkv\.(weight|bias)$",
                        layouts=((r".*embeddings\.patch_projection\.weight$", flat_patches, square_patches),))


@dataclasses.dataclass
class RadioMetadata(TowerMetadata):
    """`TowerMetadata` with the extended sequence (every frame's prefix tokens before its rows)."""

    ext_index: torch.Tensor | None = None          # int64 [n_ext]: row of [x; prefix] at each position
    patch_index: torch.Tensor | None = None        # int64 [n_rows]: each row's position in the extended sequence
    ext_cu_seqlens: torch.Tensor | None = None     # int32 [S+1]
    ext_max_seqlen: int = 0
    ext_dense_seqlen: int | None = None


def bilinear_taps(n: int, side: int) -> tuple[list[int], list[int], list[float]]:
    """Per output index of a resize from ``side`` to ``n`` (align_corners false, as torch's bilinear
    interpolate): (first tap, second tap, the second's weight)."""
    i0s, i1s, lams = [], [], []
    for i in range(n):
        if n == side:
            i0s.append(i), i1s.append(i), lams.append(0.0)
            continue
        src = max((i + 0.5) * side / n - 0.5, 0.0)
        i0 = min(int(math.floor(src)), side - 1)
        i0s.append(i0), i1s.append(i0 + (1 if i0 < side - 1 else 0)), lams.append(min(max(src - i0, 0.0), 1.0))
    return i0s, i1s, lams


def radio_position_taps(grid, merge: int, side: int, n_rows: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 [n_rows, 4], ``dtype`` [n_rows, 4]): each row's 4 entries of the side x side table and their
    weights, the table resized to max(h, w) a side and cropped to the frame; padding rows weigh 0."""
    index = torch.zeros(n_rows, 4, dtype=torch.int64)
    weight = torch.zeros(n_rows, 4, dtype=torch.float64)
    start = 0
    for t, h, w in grid:
        y0, y1, ly = bilinear_taps(max(h, w), side)
        pos = merge_block_positions([(1, h, w)], merge)
        r, c = pos[:, 0].tolist(), pos[:, 1].tolist()
        for f in range(t):
            for k, (ri, ci) in enumerate(zip(r, c)):
                row = start + k
                index[row] = torch.tensor([y0[ri] * side + y0[ci], y0[ri] * side + y1[ci],
                                           y1[ri] * side + y0[ci], y1[ri] * side + y1[ci]])
                weight[row] = torch.tensor([(1 - ly[ri]) * (1 - ly[ci]), (1 - ly[ri]) * ly[ci],
                                            ly[ri] * (1 - ly[ci]), ly[ri] * ly[ci]])
            start += h * w
    return index, weight.to(dtype)


def extended_layout(frame_rows: list[int], n_rows: int, n_slots: int, prefix: int) -> tuple[torch.Tensor, ...]:
    """(ext_index [n_rows + prefix * n_slots], patch_index [n_rows], offsets of the real sequences): each frame
    as its prefix then its rows; padding rows, then the unused slots' prefixes, after the last sequence."""
    ext, patch, offsets = [], [0] * n_rows, [0]
    row = 0
    for r in frame_rows:
        ext += [n_rows + j for j in range(prefix)]
        for k in range(r):
            patch[row + k] = len(ext) + k
        ext += list(range(row, row + r))
        row += r
        offsets.append(len(ext))
    for k in range(row, n_rows):
        patch[k] = len(ext)
        ext.append(k)
    ext += [n_rows + j for _ in range(n_slots - len(frame_rows)) for j in range(prefix)]
    return torch.tensor(ext, dtype=torch.int64), torch.tensor(patch, dtype=torch.int64), offsets


class RadioBlock(SiglipBlock):
    """SigLIP's LayerNorm block (fc1 / fc2 with biases, no rotary) with GELU (erf), RADIO's activation."""

    def mlp_out(self, h):
        return self.fc2(F.gelu(self.fc1(h)))


class NemotronProjector(nn.Module):
    """The pixel shuffle (a view of 4 consecutive rows), then RMSNorm (float32 weight and statistics), Linear,
    squared ReLU, Linear; no biases."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.merged = cfg.width * cfg.merge_unit
        self.layer_norm = nn.Module()
        self.layer_norm.weight = nn.Parameter(torch.ones(self.merged))
        self.linear_1 = nn.Linear(self.merged, cfg.merger_hidden, bias=False)
        self.linear_2 = nn.Linear(cfg.merger_hidden, cfg.out_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # [N, width] -> [N/4, out_hidden]
        y = x.reshape(-1, self.merged)
        yf = rms_normalized(y, PROJECTOR_EPS)
        y = (self.layer_norm.weight.to(yf.dtype) * yf).to(x.dtype)
        return self.linear_2(torch.square(F.relu(self.linear_1(y))))


class NemotronVLVisionTower(VisionTower):
    family = "nemotron-vl"
    patch_conv2d = True
    rotary_inv_freq = staticmethod(no_rotary)

    def __init__(self, cfg: VisionConfig, **kw):
        if kw.get("fused") is True:
            raise ValueError("the nemotron-vl tower has no fused kernels (GELU erf, prefix tokens); use fused='auto' "
                             "or False")
        super().__init__(cfg, **kw)
        self.fused = False
        self.table_side = math.isqrt(cfg.num_position_embeddings)
        self.position_embedding = nn.Parameter(torch.empty(1, cfg.num_position_embeddings, cfg.width))
        self.cls_register_token = nn.Parameter(torch.empty(PREFIX_TOKENS, cfg.width))
        self.blocks = nn.ModuleList(RadioBlock(cfg) for _ in range(cfg.depth))
        self.multi_modal_projector = NemotronProjector(cfg)
        NAMES.install(self)

    def _prepare_family(self, meta, grid, n_window_segments, max_window_seqlen) -> TowerMetadata:
        dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        meta.pos_index, meta.pos_weight = radio_position_taps(grid, self.cfg.merge_size, self.table_side,
                                                              meta.n_rows, dtype)
        frames = self.sequences(grid)
        n_slots = meta.cu_seqlens.numel() - 1
        ext, patch, offsets = extended_layout(frames, meta.n_rows, n_slots, PREFIX_TOKENS)
        fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(TowerMetadata)}
        return RadioMetadata(**fields, ext_index=ext, patch_index=patch,
                             ext_cu_seqlens=pad_offsets(offsets, n_slots),
                             ext_max_seqlen=meta.max_seqlen + PREFIX_TOKENS,
                             ext_dense_seqlen=None if meta.dense_seqlen is None else meta.dense_seqlen + PREFIX_TOKENS)

    def block_attention(self, i: int, meta: TowerMetadata) -> tuple[torch.Tensor, int, int | None]:
        return meta.ext_cu_seqlens, meta.ext_max_seqlen, meta.ext_dense_seqlen

    def forward_prepared(self, pixels: torch.Tensor, meta: TowerMetadata) -> torch.Tensor:
        """pixels [n_rows, patch_dim] -> tokens [n_rows/4, out_hidden], fixed shapes only."""
        x = self.patch_embed(self.embed_input(pixels, meta))
        # the resampling in float32 (float64 in a float64 tower), as transformers interpolates the table
        w = meta.pos_weight
        taps = F.embedding(meta.pos_index, self.position_embedding[0]).to(w.dtype) * w[..., None]   # [n, 4, width]
        x = x + taps.sum(1).to(x.dtype)
        xe = torch.cat([x, self.cls_register_token.to(x.dtype)])[meta.ext_index]
        backend = self.kernels.backend
        for i, blk in enumerate(self.blocks):
            xe = blk(xe, *self.block_attention(i, meta), meta.cos, meta.sin, backend)
        return self.head(xe[meta.patch_index])

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(x)

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> "NemotronVLVisionTower":
        """transformers' module names or the released layout (`Family.checkpoint_keys`); other tensors (the
        language model's) are left out, and so are the video projection and the summary's indices. The
        LayerScales must be ones (C-RADIO's identity); ValueError otherwise."""
        for k in [k for k in sd if k.endswith(".lambda1")]:
            if not bool((sd[k] == 1).all()):
                raise ValueError(f"{k} is not all ones: this tower has no LayerScale (C-RADIO's is the identity)")
        keys = self.cfg.spec.checkpoint_keys(self.cfg, list(sd))
        if keys:
            sd = {k: sd[ck] if rows is None else sd[ck][rows[0]:rows[1]] for k, (ck, rows, _) in keys.items()}
        sd = {k: v for k, v in sd.items() if not any(s in k for s in NOT_HELD)}
        problem = self.state_mismatch({k: tuple(v.shape) for k, v in sd.items()})
        if problem:
            raise ValueError("state dict does not fit: " + problem)
        with torch.no_grad():
            self.load_state_dict(sd, strict=False)
        return self


TOWER = NemotronVLVisionTower
