"""Gemma-4 family spec (transformers' `Gemma4VisionModel` followed by `Gemma4MultimodalEmbedder`, model_type
gemma4; the tower is `workbench.towers.gemma4`): presets, checks, sizes, the transformers mapping and the
processor's aspect-preserving resize.

Architecture (transformers 5.25, models/gemma4/modeling_gemma4.py): `Gemma4Model.get_image_features` runs the
vision model on the processor's patches and hands its output to ``embed_vision``. The vision model:

- patch embedding: the processor's [0, 1] pixels mapped to [-1, 1] in model code (``2 * (x - 0.5)``), then one
  Linear without bias over a patch's 16 x 16 x 3 values, laid out (row, column, channel) in the checkpoint;
  plus a learned position per axis: row ``x`` of table 0 (x = the patch's column) plus row ``y`` of table 1
  (y = its row), each table ``position_embedding_size`` entries long;
- blocks with four RMSNorms each (x * w, statistics in float32): ``x += post_attention_norm(attn(
  input_norm(x)))``, ``x += post_feedforward_norm(mlp(pre_feedforward_norm(x)))``; attention with q, k, v and
  o projections without biases, an RMSNorm over each head of q and k (with scale) and of v (without), a 2-D
  rotary on q and k (theta 100: the first half of each head turned by the column, the second half by the row,
  each half as rotate-half over head_dim / 4 frequencies), and scale 1 (no 1/sqrt(head_dim): the q and k norms
  set it); a gated MLP down(gelu_tanh(gate(x)) * up(x)) without biases; bidirectional within one image;
- a pooler: the patches averaged over pooling_kernel_size x pooling_kernel_size blocks (3 x 3: 9 patches one
  soft token), in the pooled grid's raster order, then multiplied by sqrt(hidden_size) in float32 (and, where
  the config says ``standardize``, shifted and scaled by two buffers: not supported here yet);
- ``embed_vision``: an RMSNorm without scale (eps = the vision config's rms_norm_eps) and one Linear without
  bias to the text model's hidden size.

Rows: an image is one item of grid (1, h, w) patches of 16 x 16, h and w multiples of the pooling kernel (the
processor sizes so); rows in merge-block order with merge_size = the pooling kernel, so the pool is a mean over
9 consecutive rows and the tokens come out in the pooled raster order, as transformers' pooler gives them. A
row's columns are (C, ph, pw) as in every family here: the checkpoint's (ph, pw, C) input projection is
permuted into that order when loaded (and back in the state dict). A video is frames of one size, each frame
attending alone (transformers' video path encodes each frame as an image).

Processor (transformers' `Gemma4ImageProcessorPil` / `Gemma4ImageProcessor` (torchvision)): convert to RGB,
resize (bicubic) to the largest size that keeps the aspect ratio within ``max_soft_tokens * 9`` patches with
both sides multiples of 48 px (`aspect_preserving_size`), no resize where the image has that size already;
rescale 1/255 and no normalization (do_normalize false: mean 0, std 1, the identity): the model maps [0, 1]
to [-1, 1] itself. Here max_pixels = max_soft_tokens * 9 * 16^2 (280 soft tokens for images, the processor's
default; its video processor takes 70 a frame, `VIDEO_MAX_SOFT_TOKENS`), min_pixels one pooled block (48^2).
The workbench's normalization is therefore x / 255 (the processor's constants), and the tower's first step
after it is the model's own 2 * (x - 0.5), as in transformers; placement `fold` folds both affines into the
patch embedding.

Presets:

| preset | depth | width | heads | mlp | patch | pool | position table | soft tokens | out (text hidden) | source |
|---|---|---|---|---|---|---|---|---|---|---|
| gemma-4-e2b | 16 | 768 | 12 (head_dim 64) | 3072 | 16 | 3 x 3 | 2 x 10240 | 280 an image | 1536 | [a], [b] |

[a] transformers 5.25, models/gemma4/configuration_gemma4.py: `Gemma4VisionConfig`'s defaults (documented
    with checkpoint google/gemma-4-e2b-it): hidden_size 768, intermediate_size 3072, num_hidden_layers 16,
    num_attention_heads 12, num_key_value_heads 12, head_dim 64, hidden_activation gelu_pytorch_tanh,
    rms_norm_eps 1e-6, pooling_kernel_size 3, patch_size 16, position_embedding_size 10240, rope theta 100,
    use_clipped_linears false, standardize false; image_processing_pil_gemma4.py: max_soft_tokens 280,
    bicubic, rescale 1/255, do_normalize false, mean (0, 0, 0), std (1, 1, 1).
[b] The E2B config.json as a public model-loader test reproduces it (C#, a Gemma-4 config fixture): the same
    vision_config (model_type gemma4_vision, rope_theta 100, default_output_length 280), text_config
    hidden_size 1536, vision_soft_tokens_per_image 280.
"""
from __future__ import annotations

import functools
import math

from .base import (BOOL, NUMBER, POSITIVE, Family, checked, check_unused, expect, get, layout_keys, need,
                   norm_params)

PATCH, POOL = 16, 3
IMAGE_SOFT_TOKENS = 280          # Gemma4ImageProcessorPil.max_soft_tokens
VIDEO_SOFT_TOKENS = 70           # Gemma4VideoProcessor.max_soft_tokens (a frame)
SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)      # what transformers' processors accept
ROPE_THETA = 100.0               # Gemma4VisionConfig.default_theta


def soft_token_pixels(tokens: int, patch: int = PATCH, pool: int = POOL) -> int:
    """max_pixels of a budget of ``tokens`` soft tokens: tokens * pool^2 patches of patch^2 pixels."""
    return tokens * pool * pool * patch * patch


GEMMA4_PROCESSOR = dict(patch_size=PATCH, temporal_patch_size=1, merge_size=POOL, image_mean=(0.0, 0.0, 0.0),
                        image_std=(1.0, 1.0, 1.0), eps=1e-6, rope_theta=ROPE_THETA,
                        min_pixels=(PATCH * POOL) ** 2, max_pixels=soft_token_pixels(IMAGE_SOFT_TOKENS))


def aspect_preserving_size(height: int, width: int, patch: int, max_patches: int, pool: int) -> tuple[int, int]:
    """The size (H, W) Gemma-4's processors resize an image of height x width to: scaled by sqrt(max_patches *
    patch^2 / (height * width)), each side rounded down to a multiple of pool * patch; a side that rounds to 0
    becomes one multiple and the other floor(long / short) multiples, capped at max_patches / pool^2 of them.
    ValueError where both round to 0 or the result exceeds max_patches (what transformers raises)."""
    side = pool * patch
    factor = math.sqrt(max_patches * patch * patch / (height * width))
    th = int(math.floor(factor * height / side)) * side
    tw = int(math.floor(factor * width / side)) * side
    if th == 0 and tw == 0:
        raise ValueError(f"a {height}x{width} image resizes to 0 x 0 under the Gemma-4 rule (sides multiples of "
                         f"{side} px within {max_patches} patches)")
    longest = (max_patches // pool ** 2) * side
    if th == 0:
        th, tw = side, min(int(math.floor(width / height)) * side, longest)
    elif tw == 0:
        th, tw = min(int(math.floor(height / width)) * side, longest), side
    if th * tw > max_patches * patch * patch:
        raise ValueError(f"a {height}x{width} image resizes to {th}x{tw}, more than {max_patches} patches of "
                         f"{patch} px (the Gemma-4 processor refuses it too)")
    return th, tw


class Gemma4Family(Family):
    name = "gemma4"
    # transformers has no module holding both; `hf_model_class` pairs Gemma4VisionModel and
    # Gemma4MultimodalEmbedder under this name
    hf_class = ("workbench.families.gemma4", "Gemma4VisionEmbedder")
    model_types = ("gemma4",)
    # not in the studies' default sweeps yet: the studies' defaults take it once its placement (`outer_graph`)
    # has run in the correctness matrix on a GPU
    study_presets = (None, None)
    # vLLM 0.34 normalizes in the outer model (`vision_input_norm`), inside `_embed_patches`, which both the
    # eager path and `encoder_cudagraph_forward` call: the norm is in the captured graph
    vllm_placement = "outer_graph"
    vllm_encoder_graphs = True
    resample = "bicubic"
    # transformers 5 holds (and save_pretrained writes) model.vision_tower.* / model.embed_vision.*; the bare
    # vision_tower.* / embed_vision.* is the reference module's own state dict
    checkpoint_layouts = (
        {"model.vision_tower.": "vision_tower.", "model.embed_vision.": "embed_vision."},
        {"vision_tower.": "vision_tower.", "embed_vision.": "embed_vision."},
    )
    presets = (
        dict(name="gemma-4-e2b", depth=16, width=768, heads=12, mlp_hidden=3072, out_hidden=1536,
             num_position_embeddings=10240, **GEMMA4_PROCESSOR),
        # tiny: head_dim 16, 70 soft tokens an image (up to 630 patches), a 256-entry table per axis
        dict(name="tiny-gemma4", depth=2, width=64, heads=4, mlp_hidden=96, out_hidden=48, num_position_embeddings=256,
             **{**GEMMA4_PROCESSOR, "max_pixels": soft_token_pixels(VIDEO_SOFT_TOKENS)}),
    )

    def hf_model_class(self) -> type:
        return reference_class()

    def validate(self, cfg) -> list[str]:
        problems = check_unused(cfg, merger_hidden=0, deepstack_indexes=(), temporal_patch_size=1, kv_heads=0)
        if cfg.num_position_embeddings <= 0:
            problems.append(f"num_position_embeddings={cfg.num_position_embeddings}: the gemma4 tower has a learned "
                            f"position table per axis (position_embedding_size entries); it must be > 0")
        block = cfg.patch_size * cfg.merge_size
        if cfg.min_pixels != block * block:
            problems.append(f"min_pixels={cfg.min_pixels}: the gemma4 processor's smallest image is one pooled block "
                            f"(patch_size * merge_size = {block} px a side); it must be {block * block}")
        return problems

    # ---- sizes -------------------------------------------------------------------------------
    def n_params(self, cfg) -> int:
        """Patch projection (no bias), two position tables, per block four RMSNorms, q / k norms, q, k, v, o and
        the gated MLP (no biases); the embedder's projection (its RMSNorm has no scale)."""
        w, h, d = cfg.width, cfg.mlp_hidden, cfg.head_dim
        block = 4 * norm_params(w, "rms") + 2 * norm_params(d, "rms") + 4 * w * w + 3 * w * h
        return cfg.patch_dim * w + 2 * cfg.num_position_embeddings * w + cfg.depth * block + w * cfg.out_hidden

    def row_macs(self, cfg) -> int:
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (4 * w * w + 3 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        """The embedder's projection of each soft token (the pool is no matmul)."""
        return cfg.width * cfg.out_hidden

    # ---- transformers ------------------------------------------------------------------------
    def to_hf(self, cfg):
        """transformers' Gemma4Config with this Gemma4VisionConfig; its text_config carries what the embedder
        reads (hidden_size) and is small: no language model is built from it here."""
        from transformers import Gemma4Config, Gemma4VisionConfig
        vision = Gemma4VisionConfig(hidden_size=cfg.width, intermediate_size=cfg.mlp_hidden,
                                    num_hidden_layers=cfg.depth, num_attention_heads=cfg.heads,
                                    num_key_value_heads=cfg.heads, head_dim=cfg.head_dim, patch_size=cfg.patch_size,
                                    pooling_kernel_size=cfg.merge_size, rms_norm_eps=cfg.eps,
                                    position_embedding_size=cfg.num_position_embeddings,
                                    rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta})
        text = dict(hidden_size=cfg.out_hidden, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16, vocab_size=64, vocab_size_per_layer_input=64,
                    hidden_size_per_layer_input=8, layer_types=["full_attention"])
        return Gemma4Config(vision_config=vision, text_config=text, audio_config=None)

    def from_hf(self, vc: dict) -> dict:
        """The tower's fields of a Gemma4VisionConfig (the embedder's width: `from_hf_config`)."""
        expect(vc, "hidden_activation", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
        for key in ("use_clipped_linears", "standardize", "attention_bias"):
            if vc.get(key) is None:          # absent, or null (attention_bias may be): the default, false
                continue
            if checked(vc[key], BOOL, f"vision_config.{key}") is not False:
                raise ValueError(f"vision_config {key}=true: this tower supports only false (not implemented yet)")
        width, heads = need(vc, "hidden_size"), need(vc, "num_attention_heads")
        kv = get(vc, "num_key_value_heads", heads)
        if kv != heads:
            raise ValueError(f"vision_config num_key_value_heads={kv}: the gemma4 tower takes one key/value head per "
                             f"query head ({heads})")
        head_dim = get(vc, "head_dim", width // heads)
        if head_dim * heads != width:
            raise ValueError(f"vision_config head_dim={head_dim}: the gemma4 tower takes hidden_size / "
                             f"num_attention_heads = {width // heads} (heads * head_dim = hidden_size)")
        rope = get(vc, "rope_parameters", None) or {}
        theta = checked(rope["rope_theta"], NUMBER, "vision_config.rope_parameters.rope_theta") \
            if "rope_theta" in rope else ROPE_THETA
        return dict(depth=need(vc, "num_hidden_layers"), width=width, heads=heads,
                    mlp_hidden=need(vc, "intermediate_size"), patch_size=get(vc, "patch_size", PATCH),
                    temporal_patch_size=1, merge_size=get(vc, "pooling_kernel_size", POOL),
                    in_channels=3, num_position_embeddings=get(vc, "position_embedding_size", 10240),
                    eps=get(vc, "rms_norm_eps", 1e-6), rope_theta=theta)

    def from_hf_config(self, config: dict) -> dict:
        """The vision_config's fields, and the embedder's output width from the text_config."""
        fields = self.from_hf(config["vision_config"])
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError("no text_config object (the embedder's output width is its hidden_size)")
        return dict(fields, out_hidden=checked(text.get("hidden_size"), POSITIVE, "text_config.hidden_size"))

    def checkpoint_keys(self, cfg, names) -> dict[str, tuple]:
        """The first of `checkpoint_layouts` that holds the vision tower's tensors."""
        names = list(names)
        for layout in self.checkpoint_layouts:
            keys = layout_keys(names, (layout,))
            if any(k.startswith("vision_tower.") for k in keys):
                return {k: (ck, None, 0) for k, ck in keys.items()}
        return {}

    def processor_bounds(self, values: dict, arch: dict) -> dict:
        """Gemma4ImageProcessor bounds an image by max_soft_tokens (280 unless it says), pooled by
        pooling_kernel_size, which must be the vision config's."""
        pool = values.get("pooling_kernel_size", arch["merge_size"])
        if pool != arch["merge_size"]:
            raise ValueError(f"pooling_kernel_size={pool} disagrees with config.json's vision_config "
                             f"(pooling_kernel_size={arch['merge_size']})")
        tokens = values.get("max_soft_tokens", IMAGE_SOFT_TOKENS)
        p = arch["patch_size"]
        return dict(min_pixels=(p * pool) ** 2, max_pixels=soft_token_pixels(tokens, p, pool))

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers' soft tokens [N/9, out_hidden] for our rows: every frame as the processor's patches
        (raster order, (ph, pw, C) columns) with its (x, y) positions, all frames in one batch padded with
        position -1 as the processor pads, the per-image tokens concatenated."""
        import torch
        patches, positions = hf_patches(pixels, grid_thw, model.config.vision_config.patch_size,
                                        model.config.vision_config.pooling_kernel_size)
        n = max(p.shape[0] for p in patches)
        batch = pixels.new_zeros(len(patches), n, patches[0].shape[1])
        pos = torch.full((len(patches), n, 2), -1, dtype=torch.int64, device=pixels.device)
        for i, (p, xy) in enumerate(zip(patches, positions)):
            batch[i, :p.shape[0]], pos[i, :p.shape[0]] = p, xy
        return torch.cat(model(batch, pos).pooler_output)

    # ---- the processor's sizes ---------------------------------------------------------------
    def resize(self, cfg, kind: str, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """`aspect_preserving_size` within max_pixels' patches (an image), or the video processor's 70 soft
        tokens a frame (at most max_pixels' patches)."""
        p = cfg.patch_size
        patches = cfg.max_pixels // (p * p)
        if kind == "video":
            patches = min(patches, VIDEO_SOFT_TOKENS * cfg.merge_unit)
        size = aspect_preserving_size(height, width, p, patches, cfg.merge_size)
        return size, size


def hf_patches(pixels, grid_thw, patch: int, pool: int) -> tuple[list, list]:
    """Our rows [N, C*P*P] (merge-block order) -> per frame transformers' patches [h*w, P*P*C] in raster order
    and their positions [h*w, 2] as (x, y) = (column, row)."""
    import torch
    from .pixtral import pixel_images
    patches, positions = [], []
    for image in pixel_images(pixels, grid_thw, patch, pool):
        c, hh, ww = image.shape
        h, w = hh // patch, ww // patch
        patches.append(image.reshape(c, h, patch, w, patch).permute(1, 3, 2, 4, 0).reshape(h * w, -1))
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        positions.append(torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1))
    return patches, positions


@functools.cache
def reference_class() -> type:
    """transformers' image path of Gemma-4 as one module: `Gemma4VisionEmbedder(config)` holds a Gemma4VisionModel
    (`vision_tower`) and a Gemma4MultimodalEmbedder (`embed_vision`), named as in Gemma4Model, and its
    forward(pixel_values, image_position_ids) is transformers' `Gemma4Model.get_image_features` (the soft tokens
    of each image in `pooler_output`). Built on first use: this module imports no torch."""
    import torch
    from torch import nn
    from transformers.models.gemma4.modeling_gemma4 import Gemma4Model, Gemma4MultimodalEmbedder, Gemma4VisionModel

    class Gemma4VisionEmbedder(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.vision_tower = Gemma4VisionModel(config.vision_config)
            self.embed_vision = Gemma4MultimodalEmbedder(config.vision_config, config.text_config)

        @property
        def dtype(self) -> torch.dtype:
            return self.vision_tower.dtype

        def forward(self, pixel_values, image_position_ids):
            return Gemma4Model.get_image_features(self, pixel_values=pixel_values,
                                                  image_position_ids=image_position_ids)

    return Gemma4VisionEmbedder


FAMILY = Gemma4Family()

__all__ = ["FAMILY", "Gemma4Family", "aspect_preserving_size", "hf_patches", "reference_class", "soft_token_pixels"]
