"""Gemma-3 family spec (transformers' `SiglipVisionModel` followed by `Gemma3MultiModalProjector`, model_type
gemma3; the tower is `workbench.towers.gemma3`): presets, checks, sizes, the transformers mapping and the
processor's fixed-size resize.

Architecture (transformers 5.25, models/siglip/modeling_siglip.py and models/gemma3/modeling_gemma3.py):
`Gemma3Model.get_image_features` runs the vision tower on pixel_values and feeds its
``last_hidden_state`` (after the tower's post_layernorm: every block, no feature-layer choice, no
pooling head, ``vision_use_head`` false) to the projector. The SigLIP tower: a Conv2d patch embedding
with bias plus a learned absolute position embedding (one vector per patch of the fixed
image_size / patch_size square grid, no interpolation: `interpolate_pos_encoding` stays off), then
pre-norm encoder layers (LayerNorm, attention with q/k/v/out biases and no rotary, LayerNorm, MLP
fc1 -> GELU(tanh) -> fc2 with biases), then post_layernorm; every LayerNorm with layer_norm_eps. The
projector: the patches laid out as their square grid, average-pooled with kernel = stride =
patches_per_image // sqrt(mm_tokens_per_image) (896 / 14 = 64 a side, 4 x 4 kernel: 4096 -> 256
tokens), a Gemma RMSNorm (x * (1 + w), computed in float32, eps = the vision config's
layer_norm_eps), then ``x @ mm_input_projection_weight`` ([vision hidden, text hidden], no bias).
Attention is bidirectional within one image; images never attend to each other.

Rows: each image (and each pan-and-scan crop) is one item of grid (1, side, side), side =
image_size / patch_size = sqrt(num_position_embeddings); a row is one 14 x 14 patch (Conv2d:
temporal_patch_size 1, 3 x 14 x 14 = 588 columns), rows in merge-block order with merge_size = the
pooling kernel (4): each 4 x 4 block of patches is 16 consecutive rows, so the average pool is a
mean over 16 consecutive rows and the merged tokens come out in the pooled grid's raster order, as
AvgPool2d's flattened output gives them. Position embeddings are gathered by each row's (row, col).
A (t, h, w) grid is t images of one size, each attending alone (Gemma-3 takes no video). A grid
other than side x side is no Gemma-3 input (the processor makes none; transformers' model cannot
run one): the tower still runs it (graph captures, synthetic study shapes), each patch taking the
table entry at its (row, col) clamped to the table.

Processor (transformers' `Gemma3ImageProcessor` (torchvision) / `Gemma3ImageProcessorPil`, called by
`Gemma3Processor`): convert to RGB, resize every image to size.height x size.width = 896 x 896 (no
aspect kept, no padding) with resample 2 = bilinear, rescale 1/255, mean = std = (0.5, 0.5, 0.5).
Here `resize` gives that fixed size whatever the input (min_pixels = max_pixels = 896^2, the size
the processor gives), and `resample` says bilinear. Pan-and-scan (`do_pan_and_scan`, off by
default: Gemma3Processor's images_kwargs, null in the checkpoints' preprocessor_config.json) adds
crops of a wide or tall image, each resized to 896 x 896 as its own item after the whole image
(`pan_and_scan_crops`; `wb.preprocess(..., pan_and_scan=True)`).

Presets (the vision tower is the same SigLIP-So400m at 896 in every multimodal Gemma-3; only the
projector's output width, the text model's hidden size, differs):

| preset | depth | width | heads | mlp | image | tokens | out (text hidden) | source |
|---|---|---|---|---|---|---|---|---|
| gemma-3-4b | 27 | 1152 | 16 | 4304 | 896 (64 x 64 patches) | 256 | 2560 | [a] |
| gemma-3-12b | 27 | 1152 | 16 | 4304 | 896 (64 x 64 patches) | 256 | 3840 | [a] |
| gemma-3-27b | 27 | 1152 | 16 | 4304 | 896 (64 x 64 patches) | 256 | 5376 | [a], [b] |

[a] AI-Hypercomputer/maxtext, MaxText/utils/ckpt_conversion/utils/hf_model_configs.py: the
    transformers Gemma3Config of gemma3-4b, -12b and -27b, each with vision_config hidden_size 1152,
    intermediate_size 4304, num_hidden_layers 27, num_attention_heads 16, patch_size 14, image_size
    896, layer_norm_eps 1e-6, hidden_act gelu_pytorch_tanh, num_channels 3, vision_use_head false;
    mm_tokens_per_image 256; text_config hidden_size 2560 / 3840 / 5376, rms_norm_eps 1e-6.
[b] NVIDIA/TensorRT-LLM, tests/unittest/_torch/modeling/test_modeling_gemma3.py, GEMMA3_27B_CONFIG (a
    27B config.json written by transformers 4.50.0.dev0, its text layers cut for the test): the same
    vision_config, mm_tokens_per_image 256, text hidden_size 5376.
[c] Processor: the checkpoints' preprocessor_config.json as public training and evaluation scripts
    write it back for Gemma-3 checkpoints: Gemma3ImageProcessor, size {height 896, width 896},
    resample 2, mean = std = (0.5, 0.5, 0.5), rescale_factor 1/255, image_seq_length 256,
    do_pan_and_scan and its settings null; transformers 5.25's Gemma3Processor fills those with
    do_pan_and_scan false, min crop size 256, at most 4 crops, min aspect ratio 1.2
    (`PAN_AND_SCAN`). transformers' own Gemma3Config defaults are no source for the sizes: its
    vision_config defaults to SiglipVisionConfig() (SigLIP base, patch 16 at 224) and its text
    hidden_size to 2304.
The projector's RMSNorm takes the vision config's layer_norm_eps (1e-6), not the text model's
rms_norm_eps (also 1e-6 in every checkpoint above): `eps` here is that one epsilon.
"""
from __future__ import annotations

import functools
import itertools
import math

from .base import (POSITIVE, Family, check_position_table, check_unused, checked, expect, get, layout_keys, need,
                   norm_params, show)

# image_size / patch_size of every published tower: 896 / 14
SIDE = 64
GEMMA3_PROCESSOR = dict(patch_size=14, temporal_patch_size=1, merge_size=4, image_mean=(0.5, 0.5, 0.5),
                        image_std=(0.5, 0.5, 0.5), eps=1e-6, min_pixels=896 * 896, max_pixels=896 * 896)
SIGLIP_SO400M = dict(depth=27, width=1152, heads=16, mlp_hidden=4304, num_position_embeddings=SIDE * SIDE,
                     **GEMMA3_PROCESSOR)
# Gemma3Processor's images_kwargs (its defaults where preprocessor_config.json says null)
PAN_AND_SCAN = dict(min_crop_size=256, max_num_crops=4, min_ratio_to_activate=1.2)


def image_side(cfg) -> int:
    """Pixels a side of every item: the position table's side (patches) times the patch size."""
    return math.isqrt(cfg.num_position_embeddings) * cfg.patch_size


class Gemma3Family(Family):
    name = "gemma3"
    # transformers has no module holding both; `hf_model_class` pairs SiglipVisionModel and
    # Gemma3MultiModalProjector under this name
    hf_class = ("workbench.families.gemma3", "SiglipGemma3Vision")
    model_types = ("gemma3",)
    # not in the studies' default sweeps yet: the studies' defaults take it once its placements are in
    # the correctness matrix
    study_presets = (None, None)
    # vLLM 0.34 hands the SigLIP tower the norm as a constructor argument, its first op on NCHW uint8
    # images, and captures the encoder in CUDA graphs of fixed-size items
    vllm_placement = "tower"
    vllm_encoder_graphs = True
    resample = "bilinear"
    # transformers 5 holds model.vision_tower.* / model.multi_modal_projector.* in memory; the published
    # checkpoints (transformers 4.50) vision_tower.vision_model.* / multi_modal_projector.*; transformers 5's
    # save_pretrained writes vision_tower.* / multi_modal_projector.* (`checkpoint_keys` picks the layout that
    # holds the tower)
    checkpoint_layouts = (
        {"model.vision_tower.": "vision_tower.", "model.multi_modal_projector.": "multi_modal_projector."},
        {"vision_tower.vision_model.": "vision_tower.", "multi_modal_projector.": "multi_modal_projector."},
        {"vision_tower.": "vision_tower.", "multi_modal_projector.": "multi_modal_projector."},
    )
    presets = (
        dict(name="gemma-3-4b", out_hidden=2560, **SIGLIP_SO400M),
        dict(name="gemma-3-12b", out_hidden=3840, **SIGLIP_SO400M),
        dict(name="gemma-3-27b", out_hidden=5376, **SIGLIP_SO400M),
        # tiny: head_dim 16, 224 px images (16 x 16 patches, pooled 4 x 4 to 16 tokens)
        dict(name="tiny-gemma3", depth=2, width=64, heads=4, mlp_hidden=96, out_hidden=48, num_position_embeddings=256,
             **{**GEMMA3_PROCESSOR, "min_pixels": 224 * 224, "max_pixels": 224 * 224}),
    )

    def hf_model_class(self) -> type:
        return reference_class()

    def validate(self, cfg) -> list[str]:
        problems = check_position_table(cfg) + check_unused(cfg, merger_hidden=0, deepstack_indexes=(),
                                                            temporal_patch_size=1, rope_theta=10000.0)
        side = math.isqrt(cfg.num_position_embeddings)
        if side * side == cfg.num_position_embeddings and side % cfg.merge_size:
            problems.append(f"merge_size={cfg.merge_size}: the projector pools the {side} x {side} patch grid with a "
                            f"merge_size x merge_size kernel; it must divide {side}")
        size = image_side(cfg) ** 2
        if (cfg.min_pixels, cfg.max_pixels) != (size, size):
            problems.append(f"min_pixels={cfg.min_pixels}, max_pixels={cfg.max_pixels}: the gemma3 processor resizes "
                            f"every image to {image_side(cfg)} x {image_side(cfg)} (sqrt(num_position_embeddings) x "
                            f"patch_size); both must be {size}")
        return problems

    # ---- sizes -------------------------------------------------------------------------------
    def n_params(self, cfg) -> int:
        """Patch embedding (with bias), position table, per block two LayerNorms, q/k/v/out and the
        MLP (all with biases), post_layernorm; the projector's RMSNorm and projection matrix."""
        w, h, o = cfg.width, cfg.mlp_hidden, cfg.out_hidden
        block = 2 * norm_params(w, "layer") + 4 * (w * w + w) + (w * h + h) + (h * w + w)
        embed = cfg.patch_dim * w + w + cfg.num_position_embeddings * w
        return embed + cfg.depth * block + norm_params(w, "layer") + w + w * o

    def row_macs(self, cfg) -> int:
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (4 * w * w + 2 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        """The projection of each pooled token (the pooling is no matmul)."""
        return cfg.width * cfg.out_hidden

    # ---- transformers ------------------------------------------------------------------------
    def to_hf(self, cfg):
        """transformers' Gemma3Config with this SiglipVisionConfig; its text_config carries only what the
        projector reads (hidden_size): no language model is built from it."""
        from transformers import Gemma3Config, SiglipVisionConfig
        side = math.isqrt(cfg.num_position_embeddings)
        vision = SiglipVisionConfig(hidden_size=cfg.width, intermediate_size=cfg.mlp_hidden,
                                    num_hidden_layers=cfg.depth, num_attention_heads=cfg.heads,
                                    num_channels=cfg.in_channels,
                                    image_size=side * cfg.patch_size, patch_size=cfg.patch_size,
                                    hidden_act="gelu_pytorch_tanh", layer_norm_eps=cfg.eps, vision_use_head=False)
        text = dict(model_type="gemma3_text", hidden_size=cfg.out_hidden, rms_norm_eps=cfg.eps, num_hidden_layers=1,
                    vocab_size=64)
        return Gemma3Config(vision_config=vision, text_config=text,
                            mm_tokens_per_image=(side // cfg.merge_size) ** 2)

    def from_hf(self, vc: dict) -> dict:
        """The tower's fields of a SigLIP vision_config (the projector's: `from_hf_config`)."""
        expect(vc, "hidden_act", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
        expect(vc, "vision_use_head", False, True)
        patch, image = need(vc, "patch_size"), get(vc, "image_size", 224)
        if image % patch:
            raise ValueError(f"vision_config image_size={image} is not a multiple of patch_size={patch} (the "
                             f"patch embedding would drop the remainder)")
        side = image // patch
        return dict(depth=need(vc, "num_hidden_layers"), width=need(vc, "hidden_size"),
                    heads=need(vc, "num_attention_heads"), mlp_hidden=need(vc, "intermediate_size"),
                    patch_size=patch, temporal_patch_size=1, in_channels=get(vc, "num_channels", 3),
                    num_position_embeddings=side * side, eps=get(vc, "layer_norm_eps", 1e-6))

    def from_hf_config(self, config: dict) -> dict:
        """The vision_config's fields, and the projector's from the top level (mm_tokens_per_image: the
        pooling kernel, merge_size) and the text_config (hidden_size: the output width)."""
        fields = self.from_hf(config["vision_config"])
        side = math.isqrt(fields["num_position_embeddings"])
        tokens = get(config, "mm_tokens_per_image", 256)
        per_side = math.isqrt(tokens)
        if per_side * per_side != tokens or side % per_side:
            raise ValueError(f"mm_tokens_per_image={tokens}: the projector pools the {side} x {side} patch grid to a "
                             f"square grid of tokens; it must be a square whose side divides {side}")
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError("no text_config object (the projector's output width is its hidden_size)")
        return dict(fields, merge_size=side // per_side, out_hidden=need(text, "hidden_size"))

    def checkpoint_keys(self, cfg, names) -> dict[str, tuple]:
        """The first of `checkpoint_layouts` that holds the vision tower's tensors (a published
        checkpoint's multi_modal_projector.* alone would also match transformers 5's saved layout)."""
        names = list(names)
        for layout in self.checkpoint_layouts:
            keys = layout_keys(names, (layout,))
            if any(k.startswith("vision_tower.") for k in keys):
                return {k: (ck, None, 0) for k, ck in keys.items()}
        return {}

    def processor_bounds(self, values: dict, arch: dict) -> dict:
        """Gemma3ImageProcessor resizes to size.height x size.width, which must be the tower's image size."""
        size = values.get("size") or {}
        side = math.isqrt(arch["num_position_embeddings"]) * arch["patch_size"]
        got = [checked(size.get(k), POSITIVE, f"size.{k}") if k in size else None
               for k in ("height", "width")]
        if got != [side, side]:
            raise ValueError(f"size={show(values.get('size'))}: the gemma3 tower takes {side} x {side} images "
                             f"(vision_config image_size); size must be {{height: {side}, width: {side}}}")
        return dict(min_pixels=side * side, max_pixels=side * side)

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers' tokens [N/16, out_hidden] for our rows: every frame laid back out as a
        [3, H, W] image, all in one pixel_values batch, the per-image tokens concatenated."""
        import torch
        from .pixtral import pixel_images
        vc = model.config.vision_config
        merge = vc.image_size // vc.patch_size // math.isqrt(model.config.mm_tokens_per_image)
        images = pixel_images(pixels, grid_thw, vc.patch_size, merge)
        out = model(torch.stack(images))
        out = out.pooler_output if hasattr(out, "pooler_output") else out     # older transformers: the tensor
        return out.reshape(-1, out.shape[-1])

    # ---- the processor's sizes ---------------------------------------------------------------
    def resize(self, cfg, kind: str, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Every image and video frame: image_side x image_side, whatever its size (no aspect kept)."""
        s = image_side(cfg)
        return (s, s), (s, s)

    def crops(self, cfg, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """Pan-and-scan's crops with Gemma3Processor's settings (`PAN_AND_SCAN`)."""
        return pan_and_scan_crops(height, width)


def pan_and_scan_crops(height: int, width: int, min_crop_size: int = PAN_AND_SCAN["min_crop_size"],
                       max_num_crops: int = PAN_AND_SCAN["max_num_crops"],
                       min_ratio_to_activate: float = PAN_AND_SCAN["min_ratio_to_activate"]
                       ) -> list[tuple[int, int, int, int]]:
    """The crops (top, left, bottom, right) Gemma-3's pan-and-scan cuts from an image of height x width,
    in the processor's order (row by row): none for an image within min_ratio_to_activate of square or
    whose crops would be smaller than min_crop_size; else 2 .. max_num_crops crops along the long side
    (as many as the aspect ratio rounded half up, at most long side / min_crop_size), each
    ceil(long side / n) long, the last cut at the image's edge."""
    if width >= height:
        if width / height < min_ratio_to_activate:
            return []
        n_w = min(max_num_crops, max(2, min(int(math.floor(width / min_crop_size)),
                                            int(math.floor(width / height + 0.5)))))
        n_h = 1
    else:
        if height / width < min_ratio_to_activate:
            return []
        n_h = min(max_num_crops, max(2, min(int(math.floor(height / min_crop_size)),
                                            int(math.floor(height / width + 0.5)))))
        n_w = 1
    crop_w, crop_h = int(math.ceil(width / n_w)), int(math.ceil(height / n_h))
    if min(crop_w, crop_h) < min_crop_size:
        return []
    return [(top, left, min(top + crop_h, height), min(left + crop_w, width))
            for top, left in itertools.product(range(0, n_h * crop_h, crop_h), range(0, n_w * crop_w, crop_w))]


@functools.cache
def reference_class() -> type:
    """transformers' image path of Gemma-3 as one module: `SiglipGemma3Vision(config)` holds a
    SiglipVisionModel (`vision_tower`) and a Gemma3MultiModalProjector (`multi_modal_projector`), named
    as in Gemma3Model, and its forward(pixel_values) is transformers' `Gemma3Model.get_image_features`
    (the tower's last_hidden_state through the projector; the tokens [images, mm_tokens_per_image,
    text hidden] in `pooler_output`). Built on first use: this module imports no torch."""
    import torch
    from torch import nn
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Model, Gemma3MultiModalProjector
    from transformers.models.siglip.modeling_siglip import SiglipVisionModel

    class SiglipGemma3Vision(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.vision_tower = SiglipVisionModel(config.vision_config)
            self.multi_modal_projector = Gemma3MultiModalProjector(config)

        @property
        def dtype(self) -> torch.dtype:
            return self.vision_tower.dtype

        def forward(self, pixel_values):
            return Gemma3Model.get_image_features(self, pixel_values=pixel_values)

    return SiglipGemma3Vision


FAMILY = Gemma3Family()

__all__ = ["FAMILY", "Gemma3Family", "PAN_AND_SCAN", "image_side", "pan_and_scan_crops", "reference_class"]
