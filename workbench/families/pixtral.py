"""Pixtral family spec (transformers' `PixtralVisionModel` followed by Mistral3's multimodal projector,
as `Mistral3Model.get_image_features` runs them; the tower is `workbench.towers.pixtral`).

What the tower is (transformers 5.24, models/pixtral and models/mistral3): a Conv2d patch embedding
(no bias, patch 14), an RMSNorm (`ln_pre`, eps 1e-5), pre-norm blocks (RMSNorm eps 1e-5; q, k, v,
o projections without bias; SwiGLU MLP without bias, act `hidden_act` = silu in the checkpoints),
2-D rotary over each patch's (row, col) with Pixtral's frequency layout (of the head_dim/2
frequencies theta^(-2k/head_dim), the even ones turn with the row, the odd ones with the column),
every image attending only to itself (a block-diagonal mask); then Mistral3's projector on the
last hidden state (`vision_feature_layer` -1, the only value the tower takes): RMSNorm (the text
model's rms_norm_eps, 1e-5), the patch merger (each 2 x 2 block of patches, unfolded channel-major,
through a bias-free Linear(4 width -> width)), Linear(width -> text hidden), GELU (erf),
Linear(text hidden -> text hidden), no biases (`multimodal_projector_bias` false). The tower
returns the merged tokens at the text model's width, [N/4, out_hidden], like every family here.

Rows (how they map to transformers' pixel_values): transformers takes a zero-padded batch
[B, 3, H_max, W_max] with `image_sizes`, convolves each image and flattens its patches row-major.
Here an image of H x W pixels (multiples of patch_size * merge_size = 28) is the PatchBatch item
with grid (1, H/14, W/14) whose rows are its patches in merge-block order (as every family here:
block row, block col, then the 2 x 2 patches inside), each row the patch's pixels (C, ph, pw) =
patch_dim 3 x 14 x 14 = 588 columns: temporal_patch_size 1 (no temporal axis; the Conv2d weight
[width, 3, 14, 14] read flat is the row's matmul weight). The order inside an image is free for
the blocks (attention is permutation-equivariant given each row's own rotary angles and the
per-image sequence), and the merge-block order is what the projector needs: its merged tokens come
out in the merged grid's raster order, as Mistral3's patch merger gives them. `hf_embeddings`
lays the rows back out as pixel_values. Mistral3 takes no video: a (t, h, w) grid here is t
images of one size, each attending alone.

Processor (`PixtralProcessor` over `PixtralImageProcessor`, `...Pil` without torchvision): rescale
1/255, CLIP mean / std, bicubic; resize: an image larger than the longest_edge box shrinks by
max(h, w) / longest_edge (sides floored), then each side rounds up to a multiple of
patch_size * spatial_merge_size = 28 (the processor passes that product as the patch size); small
images are not enlarged (`images.longest_edge_resize`; `VisionConfig.longest_edge`, with
max_pixels = longest_edge^2 so the studies' max_pixels cap only binds below it). Its text side
puts [IMG] per merged token, [IMG_BREAK] after each merged row and [IMG_END] last: tokens the
language model sees, not the tower (it returns h/2 x w/2 tokens per image).

Presets:

| preset | depth | width | heads | mlp | out (text hidden) | patch | longest edge | source |
|---|---|---|---|---|---|---|---|---|
| mistral-small-3.1-24b | 24 | 1024 | 16 | 4096 | 5120 | 14 | 1540 | [a], [b], [c] |

[a] mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json (transformers 4.50.0.dev0), as
    NVIDIA/TensorRT-LLM's Mistral3 model test quotes it (fixture mistral_small_3_1_24b_config):
    vision_config hidden_size 1024, intermediate_size 4096, num_hidden_layers 24,
    num_attention_heads 16, head_dim 64, patch_size 14, image_size 1540, hidden_act silu,
    rope_theta 10000; top level spatial_merge_size 2, projector_hidden_act gelu,
    multimodal_projector_bias false, vision_feature_layer -1; text_config hidden_size 5120,
    rms_norm_eps 1e-05. The same vision numbers (and the same top-level fields) are quoted from
    Mistral-Small-3.2's config.json by other public repositories.
[b] transformers 5.24's Mistral3Config defaults (models/mistral3/configuration_mistral3.py, whose
    docstring names this checkpoint): vision hidden 1024, intermediate 4096, 24 layers, 16 heads,
    head_dim 64, patch 14, image 1540; spatial_merge_size 2, projector_hidden_act gelu,
    vision_feature_layer -1, multimodal_projector_bias false; text hidden 5120, rms_norm_eps 1e-5.
    Its default vision hidden_act is "gelu", not the checkpoint's "silu": the preset takes [a]'s.
[c] Processor: the checkpoint's preprocessor_config.json (as quoted in public tests of Mistral3
    processors: PixtralImageProcessor, patch_size {height 14, width 14}, size {longest_edge 1540},
    CLIP mean / std, resample 3 = bicubic, rescale 1/255) and processor_config.json (PixtralProcessor,
    patch_size 14, spatial_merge_size 2).
Pixtral-12B (mistral-community/pixtral-12b: model_type llava, patch 16, no patch merger, a LLaVA
projector) is not a preset: its head is another model's (LlavaMultiModalProjector, merge 1), which
this family's tower and the merge-block rows (merge 2) do not describe.
"""
from __future__ import annotations

import functools

from .base import NUMBER, POSITIVE, VISION_KEYS, Family, check_unused, checked, hf_rope_theta, show

MISTRAL3_FACTOR = 14 * 2       # the processor's resize unit: patch_size * spatial_merge_size
MISTRAL3_PROCESSOR = dict(patch_size=14, temporal_patch_size=1, merge_size=2, eps=1e-5, longest_edge=1540,
                          min_pixels=MISTRAL3_FACTOR ** 2, max_pixels=1540 ** 2)
# what transformers hard-codes in PixtralVisionModel (every RMSNorm of the vision tower)
PIXTRAL_EPS = 1e-5
_ABSENT = object()


def _read(d: dict, key: str, where: str, default=_ABSENT):
    """``d[key]`` checked as base.VISION_KEYS says (``where`` names the object in messages), or
    ``default`` where it is absent (no default: a ValueError naming the key)."""
    if key not in d:
        if default is _ABSENT:
            raise ValueError(f"{where} has no {key!r}")
        return default
    return checked(d[key], VISION_KEYS[key], f"{where}.{key}")


def _only(value, want, what: str) -> None:
    if value != want:
        raise ValueError(f"{what}={show(value)}: this tower supports only {show(want)}")


class PixtralFamily(Family):
    name = "pixtral"
    hf_class = ("workbench.families.pixtral", "PixtralMistral3Vision")
    model_types = ("mistral3",)
    study_presets = ("tiny-pixtral", "mistral-small-3.1-24b")
    bounds_longest_edge = True
    # vLLM ships the resized uint8 image and patchifies and normalizes it on the GPU; Mistral3 gained
    # encoder CUDA graphs in 0.34 (the patchify outside the graph, the norm inside it)
    vllm_placement = "device"
    vllm_encoder_graphs = True
    # transformers 5 writes model.vision_tower.* / model.multi_modal_projector.*, the published
    # checkpoints (transformers 4) vision_tower.* / multi_modal_projector.*
    checkpoint_layouts = tuple({f"{top}{part}.": f"{part}." for part in ("vision_tower", "multi_modal_projector")}
                               for top in ("model.", ""))
    presets = (
        dict(name="mistral-small-3.1-24b", depth=24, width=1024, heads=16, mlp_hidden=4096, out_hidden=5120,
             **MISTRAL3_PROCESSOR),
        # tiny: head_dim 16 (four row and four column frequencies), images within a 1024 px box
        dict(name="tiny-pixtral", depth=2, width=64, heads=4, mlp_hidden=96, out_hidden=48,
             **{**MISTRAL3_PROCESSOR, "longest_edge": 1024, "max_pixels": 1 << 20}),
    )

    def hf_model_class(self) -> type:
        return reference_class()

    def validate(self, cfg) -> list[str]:
        problems = check_unused(cfg, num_position_embeddings=0, deepstack_indexes=(), merger_hidden=0,
                                temporal_patch_size=1, eps=PIXTRAL_EPS)
        if cfg.merge_size != 2:
            problems.append(f"merge_size={cfg.merge_size}: Mistral3's patch merger here merges 2 x 2 patches "
                            f"(spatial_merge_size 2); other sizes are untested")
        floor = (cfg.patch_size * cfg.merge_size) ** 2
        if cfg.min_pixels != floor:
            problems.append(f"min_pixels={cfg.min_pixels}: the pixtral processor enlarges nothing; leave it at "
                            f"{floor} (one merge block, (patch_size * merge_size)^2, the smallest size it gives)")
        return problems

    def n_params(self, cfg) -> int:
        w, h, o = cfg.width, cfg.mlp_hidden, cfg.out_hidden
        block = 2 * w + 4 * w * w + 3 * w * h                   # two RMSNorms, q/k/v/o, SwiGLU (no biases)
        projector = w + cfg.merge_unit * w * w + w * o + o * o  # norm, patch merger, linear_1, linear_2
        return w * cfg.patch_dim + w + cfg.depth * block + projector

    def row_macs(self, cfg) -> int:
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (4 * w * w + 3 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        w, o = cfg.width, cfg.out_hidden
        return cfg.merge_unit * w * w + w * o + o * o

    def to_hf(self, cfg):
        """transformers' Mistral3Config with this PixtralVisionConfig; its text_config carries only
        what the projector reads (hidden_size, rms_norm_eps): no language model is built from it."""
        from transformers import Mistral3Config, PixtralVisionConfig
        vision = PixtralVisionConfig(
            hidden_size=cfg.width, intermediate_size=cfg.mlp_hidden, num_hidden_layers=cfg.depth,
            num_attention_heads=cfg.heads, num_channels=cfg.in_channels, image_size=cfg.longest_edge,
            patch_size=cfg.patch_size, hidden_act="silu",
            rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta})
        text = dict(model_type="mistral", hidden_size=cfg.out_hidden, rms_norm_eps=cfg.eps, num_hidden_layers=1,
                    vocab_size=64)
        return Mistral3Config(vision_config=vision, text_config=text, spatial_merge_size=cfg.merge_size,
                              projector_hidden_act="gelu", vision_feature_layer=-1, multimodal_projector_bias=False)

    def from_hf(self, vc: dict) -> dict:
        """The vision tower's fields of a Pixtral vision_config (the projector's: `from_hf_config`)."""
        where = "vision_config"
        _only(_read(vc, "hidden_act", where, "gelu"), "silu", f"{where}.hidden_act")
        width, heads = _read(vc, "hidden_size", where), _read(vc, "num_attention_heads", where)
        head_dim = _read(vc, "head_dim", where, None)
        if head_dim is not None and heads * head_dim != width:
            raise ValueError(f"{where}.head_dim={head_dim}: transformers' PixtralAttention uses hidden_size / "
                             f"num_attention_heads = {width // heads}")
        return dict(depth=_read(vc, "num_hidden_layers", where), width=width, heads=heads,
                    mlp_hidden=_read(vc, "intermediate_size", where), patch_size=_read(vc, "patch_size", where),
                    in_channels=_read(vc, "num_channels", where, 3), rope_theta=hf_rope_theta(vc),
                    temporal_patch_size=1, eps=PIXTRAL_EPS)

    def from_hf_config(self, config: dict) -> dict:
        """The tower's fields from Mistral3's config.json: the vision_config's, and the projector's
        from the top level (spatial_merge_size, projector_hidden_act, multimodal_projector_bias,
        vision_feature_layer) and the text_config (hidden_size, rms_norm_eps)."""
        fields = self.from_hf(config["vision_config"])
        _only(_read(config, "projector_hidden_act", "config", "gelu"), "gelu", "projector_hidden_act")
        _only(_read(config, "multimodal_projector_bias", "config", False), False, "multimodal_projector_bias")
        _only(_read(config, "vision_feature_layer", "config", -1), -1, "vision_feature_layer")
        text = _read(config, "text_config", "config")
        if text is None:
            raise ValueError("text_config is null: the projector's width is the text model's hidden_size")
        eps = checked(text.get("rms_norm_eps", 1e-6), NUMBER, "text_config.rms_norm_eps")
        _only(eps, PIXTRAL_EPS, "text_config.rms_norm_eps (the projector's RMSNorm)")
        return dict(fields, merge_size=_read(config, "spatial_merge_size", "config", 2),
                    out_hidden=checked(text.get("hidden_size"), POSITIVE, "text_config.hidden_size"))

    def processor_bounds(self, values: dict, arch: dict) -> dict:
        """PixtralImageProcessor bounds each side by size.longest_edge."""
        side = values.get("size.longest_edge")
        if side is None:
            raise ValueError("no size.longest_edge (the pixtral processor's bound on each side)")
        return dict(longest_edge=side, max_pixels=side * side,
                    min_pixels=(arch["patch_size"] * arch["merge_size"]) ** 2)

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers' merged tokens [N/4, out_hidden] for our rows: each frame laid back out as an
        image in a zero-padded pixel_values batch with its image_sizes, the per-image outputs
        concatenated."""
        import torch
        images = pixel_images(pixels, grid_thw, model.config.vision_config.patch_size, model.config.spatial_merge_size)
        sizes = torch.tensor([im.shape[1:] for im in images])
        batch = pixels.new_zeros(len(images), images[0].shape[0], *sizes.max(0).values.tolist())
        for b, im in zip(batch, images):
            b[:, :im.shape[1], :im.shape[2]] = im
        return torch.cat(model(batch, sizes).pooler_output)


def pixel_images(pixels, grid_thw, patch: int, merge: int) -> list:
    """Our rows [N, C*P*P] (merge-block order, T = 1) -> one [C, h*P, w*P] image per frame."""
    out, start = [], 0
    for t, h, w in grid_thw.tolist():
        rows = pixels[start:start + t * h * w].reshape(t, h // merge, w // merge, merge, merge, -1, patch, patch)
        start += t * h * w
        # (t, block row, block col, row in block, col in block, C, ph, pw) -> (t, C, h*P, w*P)
        out += list(rows.permute(0, 5, 1, 3, 6, 2, 4, 7).reshape(t, -1, h * patch, w * patch))
    return out


def image_rows(image, patch: int, merge: int):
    """One [C, H, W] image (H, W multiples of patch * merge) -> (rows [N, C*P*P] in merge-block
    order, grid [[1, H/P, W/P]]): `pixel_images`' inverse, how a transformers pixel_values image
    compares with our rows."""
    import torch
    c, h, w = image.shape
    gh, gw = h // patch, w // patch
    blocks = image.reshape(c, gh // merge, merge, patch, gw // merge, merge, patch)
    # (C, block row, row in block, ph, block col, col in block, pw) -> (block row, block col, row, col, C, ph, pw)
    rows = blocks.permute(1, 4, 2, 5, 0, 3, 6).reshape(gh * gw, c * patch * patch)
    return rows, torch.tensor([[1, gh, gw]])


@functools.cache
def reference_class() -> type:
    """transformers' image path of Mistral3 as one module: `PixtralMistral3Vision(config)` holds a
    PixtralVisionModel (`vision_tower`) and a Mistral3MultiModalProjector (`multi_modal_projector`),
    named as in Mistral3Model, and its forward(pixel_values, image_sizes) is transformers'
    `Mistral3Model.get_image_features` (the selected hidden state through the projector; the
    per-image merged tokens in `pooler_output`). Built on first use: this module imports no torch."""
    import torch
    from torch import nn
    from transformers.models.mistral3.modeling_mistral3 import Mistral3Model, Mistral3MultiModalProjector
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionModel

    class PixtralMistral3Vision(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.vision_tower = PixtralVisionModel(config.vision_config)
            self.multi_modal_projector = Mistral3MultiModalProjector(config)

        @property
        def dtype(self) -> torch.dtype:
            return self.vision_tower.dtype

        def forward(self, pixel_values, image_sizes):
            return Mistral3Model.get_image_features(self, pixel_values=pixel_values, image_sizes=image_sizes,
                                                    return_dict=True)

    return PixtralMistral3Vision


FAMILY = PixtralFamily()

__all__ = ["FAMILY", "PixtralFamily", "image_rows", "pixel_images", "reference_class"]
