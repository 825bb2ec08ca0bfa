"""Nemotron-H Nano VL V2 family spec (its vision tower is RADIO: transformers' `RadioModel`, followed by the
pixel shuffle and `NemotronH_Omni_Reasoning_V3MultiModalProjector`, model_type nemotron_h_omni; the tower is
`workbench.towers.nemotron_vl`): presets, checks, sizes, the transformers mapping and the processor's patch-grid
rule.

Architecture (transformers 5.25, models/radio/modeling_radio.py and models/nemotron_h_omni/modeling_nemotron_h_omni
.py): `NemotronH_Omni_Reasoning_V3.get_image_features` runs the vision model on the processor's packed patches
(its input conditioner detached by ``make_preprocessor_external``: the processor normalizes) and hands the patch
features to the pixel shuffle and the projector. The vision model (a ViT):

- patch embedding: one Linear without bias over a patch's (C, ph, pw) values, plus a learned position table of
  (max_img_size / patch)^2 entries resampled to each image: bilinearly (align_corners false) to a square of
  max(h, w) patches a side, then its top-left h x w corner;
- num_cls_tokens + num_registers learned prefix tokens (3 + 7) before each image's patches; each image attends to
  its own prefix and patches only;
- pre-LayerNorm blocks (eps 1e-6) with q, k, v and o projections with biases, no rotary, scale 1/sqrt(head_dim),
  an MLP fc1 -> GELU (erf) -> fc2 with biases, width * mlp_ratio wide; LayerScale parameters that are the
  identity (layerscale_value 1: C-RADIO has none);
- the features: the patches' outputs (the prefix tokens' dropped), no final norm.

Then the pixel shuffle (downsample_ratio 0.5): each 2 x 2 block of patches concatenated as one vector of
4 * width in the order (0, 0), (0, 1), (1, 0), (1, 1), tokens in the merged grid's raster order; then the
projector: RMSNorm (eps 1e-5, weight and statistics in float32), Linear without bias to projector_hidden_size,
squared ReLU, Linear without bias to the language model's width.

Rows: an image is one item of grid (1, h, w) patches of 16 x 16, h and w even (the processor sizes so); rows in
merge-block order with merge_size 2 (the pixel shuffle's blocks), so the shuffle is a view of 4 consecutive
rows, exactly transformers' order. Videos are not supported yet: transformers packs 2 frames into one tubelet
with its own projection (``video_patch_projection``), which this tower does not hold.

Processor (transformers' `NemotronH_Omni_Reasoning_V3ImageProcessor`, a torchvision-only processor): convert to
RGB, pick a patch grid near the image's own (`patch_grid_size`) with between min_num_patches (1024) and
max_num_patches (13312) patches and both sides even, resize (bicubic, antialiased, in float32) to 16 px a
patch where the size differs, rescale 1/255, normalize with the CLIP mean and std. Here min_pixels /
max_pixels = those patch counts times 16^2. The per-call budget (``max_model_len`` 16384 tokens) binds only
where it is below max_num_patches, which the defaults never are.

Presets:

| preset | depth | width | heads | mlp | patch | prefix | position table | projector | out | source |
|---|---|---|---|---|---|---|---|---|---|---|
| nemotron-nano-vl-v2 | 32 | 1280 | 16 (head_dim 80) | 5120 | 16 | 3 + 7 | 128 x 128 | 5120 -> 4096 | 4096 | [a] |

[a] transformers 5.25: models/radio/configuration_radio.py `RadioConfig` defaults (documented with checkpoint
    nvidia/C-RADIOv4-H; the RADIO-H tower): hidden_size 1280, num_hidden_layers 32, num_attention_heads 16,
    mlp_ratio 4.0, hidden_act gelu, layer_norm_eps 1e-6, qkv_bias true, patch_size 16, max_img_size 2048,
    num_cls_tokens 3, num_registers 7, norm_mean / norm_std the CLIP constants;
    models/nemotron_h_omni/configuration_nemotron_h_omni.py (documented with nvidia/Nemotron-3-Nano-Omni-30B-A3B-
    Reasoning-BF16): downsample_ratio 0.5, projector_hidden_size 4096, vision_hidden_size 1280; the language
    width is `NemotronHConfig`'s default hidden_size (4096); image_processing_nemotron_h_omni.py: patch_size 16,
    min_num_patches 1024, max_num_patches 13312, bicubic, CLIP mean and std. The released 12B V2 checkpoint's
    projector and language widths may differ from these defaults: a folder's config.json gives its own.
"""
from __future__ import annotations

import functools
import math

from .base import BOOL, NUMBER, POSITIVE, Family, checked, check_unused, expect, get, need, norm_params

PATCH, MERGE = 16, 2
CLS_TOKENS, REGISTERS = 3, 7            # RadioConfig.num_cls_tokens, num_registers
PREFIX_TOKENS = CLS_TOKENS + REGISTERS
MIN_PATCHES, MAX_PATCHES = 1024, 13312  # the image processor's min_num_patches, max_num_patches
# checkpoint tensors the tower does not hold: the video projection (images only), the summary's indices, the
# detached input conditioner's constants, the identity LayerScales (`released_keys`' callers check them)
NOT_HELD = ("video_patch_projection.", "summary_idxs", "input_conditioner.", "lambda1")
PROJECTOR_EPS = 1e-5                    # the projector's RMSNorm (transformers passes none: its default)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)      # transformers' OPENAI_CLIP_MEAN / _STD
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

NEMOTRON_PROCESSOR = dict(patch_size=PATCH, temporal_patch_size=1, merge_size=MERGE, image_mean=CLIP_MEAN,
                          image_std=CLIP_STD, eps=1e-6, min_pixels=MIN_PATCHES * PATCH * PATCH,
                          max_pixels=MAX_PATCHES * PATCH * PATCH)


def patch_grid_size(height: int, width: int, patch: int, merge: int, min_patches: int,
                    max_patches: int) -> tuple[int, int]:
    """The (rows, columns) patch grid the processor resizes an image of height x width to: the image's own grid
    (each side ``round(side / patch + 0.5)``, Python's round), scaled down into max_patches, scaled up (each side
    rounded up) to at least min_patches where max_patches > min_patches, then each side made a multiple of
    ``merge``: rounded up where the area stays within max_patches, else down (at least one merge). ValueError
    where a side shrinks to 0 patches."""
    gh, gw = round(height / patch + 0.5), round(width / patch + 0.5)
    shrink = min(math.sqrt(max_patches / (gh * gw)), 1.0)
    gh, gw = math.floor(shrink * gh), math.floor(shrink * gw)
    if gh == 0 or gw == 0:          # transformers' processor fails here too (a division by zero)
        raise ValueError(f"a {height}x{width} image shrinks to a {gh} x {gw} patch grid within {max_patches} "
                         f"patches (too narrow for the processor's rule)")
    if max_patches > min_patches and gh * gw < min_patches:
        grow = math.sqrt(min_patches / (gh * gw))
        gh, gw = math.ceil(grow * gh), math.ceil(grow * gw)
    if gh % merge:
        up = gh + merge - gh % merge
        gh = up if up * gw <= max_patches else max(merge, gh - gh % merge)
    if gw % merge:
        up = gw + merge - gw % merge
        gw = up if gh * up <= max_patches else max(merge, gw - gw % merge)
    return gh, gw


class NemotronVLFamily(Family):
    name = "nemotron-vl"
    # transformers has no module holding both; `hf_model_class` pairs RadioModel and the projector under this name
    hf_class = ("workbench.families.nemotron_vl", "NemotronVisionProjector")
    model_types = ("nemotron_h_omni",)
    # not in the studies' default sweeps: its placement (`outer`, no graphs) is the hazard the studies show
    study_presets = (None, None)
    # vLLM 0.34 normalizes in the outer model (`_normalize_pixel_values` in nano_nemotron_vl.py) on the eager
    # path, and captures no encoder CUDA graphs for it (yet: the day it does, that norm is left out of them)
    vllm_placement = "outer"
    vllm_encoder_graphs = False
    takes_video = False         # images only: the video projection is not held (`resize` refuses a video item)
    resample = "bicubic"
    # transformers' module names (the reference's own state dict), and save_pretrained's (the released
    # checkpoint's: vision_model.radio_model.model.*, mlp1.*, a fused qkv): `checkpoint_keys`
    checkpoint_layouts = ({"vision_model.": "vision_model.", "multi_modal_projector.": "multi_modal_projector."},)
    presets = (
        dict(name="nemotron-nano-vl-v2", depth=32, width=1280, heads=16, mlp_hidden=5120, merger_hidden=4096,
             out_hidden=4096, num_position_embeddings=(2048 // PATCH) ** 2, **NEMOTRON_PROCESSOR),
        # tiny: head_dim 16, a 16 x 16 position table (max_img_size 256), 16 to 256 patches an image
        dict(name="tiny-nemotron-vl", depth=2, width=64, heads=4, mlp_hidden=256, merger_hidden=96, out_hidden=48,
             num_position_embeddings=256, **{**NEMOTRON_PROCESSOR, "min_pixels": 16 * PATCH * PATCH,
                                             "max_pixels": 256 * PATCH * PATCH}),
    )

    def hf_model_class(self) -> type:
        return reference_class()

    def validate(self, cfg) -> list[str]:
        problems = check_unused(cfg, deepstack_indexes=(), temporal_patch_size=1, kv_heads=0)
        side = math.isqrt(max(cfg.num_position_embeddings, 0))
        if cfg.num_position_embeddings <= 0 or side * side != cfg.num_position_embeddings:
            problems.append(f"num_position_embeddings={cfg.num_position_embeddings}: the nemotron-vl tower's position "
                            f"table is (max_img_size / patch_size)^2 entries; it must be a positive square")
        if cfg.merge_size != MERGE:
            problems.append(f"merge_size={cfg.merge_size}: the pixel shuffle (downsample_ratio 0.5) merges 2 x 2 "
                            f"patches; it must be 2")
        if cfg.merger_hidden <= 0:
            problems.append(f"merger_hidden={cfg.merger_hidden}: the projector's hidden width "
                            f"(projector_hidden_size) must be > 0")
        if cfg.mlp_hidden != int(cfg.width * (cfg.mlp_hidden / cfg.width)):
            problems.append(f"mlp_hidden={cfg.mlp_hidden}: not width * mlp_ratio for any ratio transformers "
                            f"rounds back to it")
        return problems

    # ---- sizes -------------------------------------------------------------------------------
    def n_params(self, cfg) -> int:
        """Patch projection (no bias), the position table, the prefix tokens, per block two LayerNorms, q, k, v
        and o and the MLP (all with biases); the projector's RMSNorm and two Linears (no biases). The identity
        LayerScales and the video projection (not run here) are left out."""
        w, h = cfg.width, cfg.mlp_hidden
        block = 2 * norm_params(w, "layer") + 4 * w * w + 4 * w + 2 * w * h + h + w
        merged = w * cfg.merge_unit
        projector = merged + merged * cfg.merger_hidden + cfg.merger_hidden * cfg.out_hidden
        return (cfg.patch_dim * w + (cfg.num_position_embeddings + PREFIX_TOKENS) * w + cfg.depth * block
                + projector)

    def row_macs(self, cfg) -> int:
        """Per pixel row; the PREFIX_TOKENS extra rows of every image run the blocks too, a per-image cost this
        per-row model leaves out."""
        w = cfg.width
        return cfg.patch_dim * w + cfg.depth * (4 * w * w + 2 * w * cfg.mlp_hidden)

    def token_macs(self, cfg) -> int:
        """The projector's two Linears per merged token."""
        return cfg.width * cfg.merge_unit * cfg.merger_hidden + cfg.merger_hidden * cfg.out_hidden

    # ---- transformers ------------------------------------------------------------------------
    def to_hf(self, cfg):
        """transformers' NemotronH_Omni_Reasoning_V3_Config with this RadioConfig (and its video projection,
        which the config requires, unused here); a small text_config carries the projector's output width."""
        from transformers import RadioConfig
        from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import \
            NemotronH_Omni_Reasoning_V3_Config
        vision = RadioConfig(hidden_size=cfg.width, num_hidden_layers=cfg.depth, num_attention_heads=cfg.heads,
                             mlp_ratio=cfg.mlp_hidden / cfg.width, layer_norm_eps=cfg.eps, patch_size=cfg.patch_size,
                             max_img_size=math.isqrt(cfg.num_position_embeddings) * cfg.patch_size,
                             num_cls_tokens=CLS_TOKENS, num_registers=REGISTERS, video_temporal_patch_size=2,
                             norm_mean=list(cfg.image_mean), norm_std=list(cfg.image_std))
        text = dict(hidden_size=cfg.out_hidden, num_hidden_layers=1, layers_block_type=["attention"], vocab_size=64,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
                    mamba_num_heads=2, mamba_head_dim=8, ssm_state_size=8, n_groups=1)
        return NemotronH_Omni_Reasoning_V3_Config(vision_config=vision.to_dict(), text_config=text, audio_config=None,
                                                  downsample_ratio=1 / cfg.merge_size, vision_hidden_size=cfg.width,
                                                  projector_hidden_size=cfg.merger_hidden)

    def from_hf(self, vc: dict) -> dict:
        """The tower's fields of a RadioConfig (the projector's: `from_hf_config`)."""
        expect(vc, "hidden_act", "gelu", "gelu")
        for key, want in (("use_swiglu_ffn", False), ("qkv_bias", True)):
            if key in vc and checked(vc[key], BOOL, f"vision_config.{key}") is not want:
                raise ValueError(f"vision_config {key}={str(not want).lower()}: this tower supports only "
                                 f"{str(want).lower()}")
        if "layerscale_value" in vc and checked(vc["layerscale_value"], NUMBER, "vision_config.layerscale_value") != 1:
            raise ValueError(f"vision_config layerscale_value={vc['layerscale_value']}: this tower supports only 1 "
                             f"(C-RADIO's identity LayerScale)")
        prefix = (get(vc, "num_cls_tokens", CLS_TOKENS), get(vc, "num_registers", REGISTERS))
        if prefix != (CLS_TOKENS, REGISTERS):
            raise ValueError(f"vision_config num_cls_tokens, num_registers = {prefix}: this tower supports only "
                             f"{CLS_TOKENS} and {REGISTERS} (transformers' defaults)")
        width, patch = need(vc, "hidden_size"), get(vc, "patch_size", PATCH)
        ratio = checked(vc.get("mlp_ratio", 4.0), NUMBER, "vision_config.mlp_ratio")
        side = get(vc, "max_img_size", 2048) // patch
        return dict(depth=need(vc, "num_hidden_layers"), width=width, heads=need(vc, "num_attention_heads"),
                    mlp_hidden=int(width * ratio), patch_size=patch, temporal_patch_size=1, merge_size=MERGE,
                    in_channels=get(vc, "num_channels", 3), num_position_embeddings=side * side,
                    eps=get(vc, "layer_norm_eps", 1e-6))

    def from_hf_config(self, config: dict) -> dict:
        """The vision_config's fields, and the projector's widths from the top level and the text_config."""
        fields = self.from_hf(config["vision_config"])
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError("no text_config object (the projector's output width is its hidden_size)")
        if text.get("num_nextn_predict_layers") not in (None, 0):
            raise ValueError("text_config num_nextn_predict_layers > 0: such a model adds a final LayerNorm to the "
                             "vision features (vision_final_layernorm), which this tower does not hold yet")
        ratio = checked(config.get("downsample_ratio", 0.5), NUMBER, "downsample_ratio")
        if ratio != 1 / MERGE:
            raise ValueError(f"downsample_ratio={ratio}: this tower supports only 0.5 (2 x 2 pixel shuffle)")
        vision = checked(config.get("vision_hidden_size", fields["width"]), POSITIVE, "vision_hidden_size")
        if vision != fields["width"]:
            raise ValueError(f"vision_hidden_size={vision} disagrees with vision_config.hidden_size={fields['width']}")
        return dict(fields, merger_hidden=checked(config.get("projector_hidden_size", 4096), POSITIVE,
                                                  "projector_hidden_size"),
                    out_hidden=checked(text.get("hidden_size"), POSITIVE, "text_config.hidden_size"))

    def checkpoint_keys(self, cfg, names) -> dict[str, tuple]:
        """transformers' module names as they are, or the released layout's (what save_pretrained writes):
        vision_model.radio_model.model.*, mlp1.*, each block's fused qkv split into q, k, v rows."""
        names = set(names)
        if any(k.startswith("vision_model.radio_model.") for k in names):
            keys = {k: v for k, v in released_keys(cfg).items() if v[0] in names}
        else:
            keys = super().checkpoint_keys(cfg, names)
        return {k: v for k, v in keys.items() if not any(s in k for s in NOT_HELD)}

    def processor_bounds(self, values: dict, arch: dict) -> dict:
        """min_num_patches / max_num_patches (1024 / 13312 unless it says) of patch_size^2 pixels."""
        p = arch["patch_size"]
        lo, hi = values.get("min_num_patches", MIN_PATCHES), values.get("max_num_patches", MAX_PATCHES)
        return dict(min_pixels=lo * p * p, max_pixels=hi * p * p)

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers' tokens [N/4, out_hidden] for our rows: each frame's patches in raster order, packed with
        image_grid_hw, as the processor gives them."""
        import torch
        from .pixtral import pixel_images
        p = model.config.vision_config.patch_size
        patches = [image.reshape(image.shape[0], image.shape[1] // p, p, image.shape[2] // p, p)
                   .permute(1, 3, 0, 2, 4).reshape(-1, image.shape[0] * p * p)
                   for image in pixel_images(pixels, grid_thw, p, MERGE)]
        hw = torch.tensor([[h, w] for t, h, w in grid_thw.tolist() for _ in range(t)])
        return torch.cat(model(torch.cat(patches), hw).pooler_output)

    # ---- the processor's sizes ---------------------------------------------------------------
    def resize(self, cfg, kind: str, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """`patch_grid_size` within cfg's min_pixels / max_pixels patches, 16 px a patch."""
        if kind == "video":
            raise ValueError("the nemotron-vl tower takes images only: transformers packs video frames in pairs "
                             "with a projection of its own (video_patch_projection), not supported here yet")
        p = cfg.patch_size
        gh, gw = patch_grid_size(height, width, p, cfg.merge_size, cfg.min_pixels // (p * p), cfg.max_pixels // (p * p))
        return (gh * p, gw * p), (gh * p, gw * p)


def released_keys(cfg) -> dict[str, tuple]:
    """Tower key (transformers' module name) -> (the released checkpoint's key, rows, 0)."""
    src, w = "vision_model.radio_model.model.", cfg.width
    keys = {"vision_model.embeddings.patch_projection.weight": (src + "patch_generator.embedder.weight", None, 0),
            "vision_model.embeddings.position_embedding": (src + "patch_generator.pos_embed", None, 0),
            "vision_model.embeddings.cls_register_token": (src + "patch_generator.cls_token.token", None, 0)}
    for i in range(cfg.depth):
        ours, theirs = f"vision_model.encoder.layer.{i}.", f"{src}blocks.{i}."
        for kind in ("weight", "bias"):
            for j, part in enumerate("qkv"):
                keys[f"{ours}attention.{part}_proj.{kind}"] = (f"{theirs}attn.qkv.{kind}", (j * w, (j + 1) * w), 0)
            keys[f"{ours}attention.o_proj.{kind}"] = (f"{theirs}attn.proj.{kind}", None, 0)
            for name in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
                keys[f"{ours}{name}.{kind}"] = (f"{theirs}{name}.{kind}", None, 0)
    for ours, theirs in (("layer_norm", "0"), ("linear_1", "1"), ("linear_2", "3")):
        keys[f"multi_modal_projector.{ours}.weight"] = (f"mlp1.{theirs}.weight", None, 0)
    return keys


@functools.cache
def reference_class() -> type:
    """transformers' image path of Nemotron-H Omni as one module: `NemotronVisionProjector(config)` holds a
    RadioModel (`vision_model`, its input conditioner detached as the model detaches it) and the projector
    (`multi_modal_projector`), named as in NemotronH_Omni_Reasoning_V3, and its forward(pixel_values,
    image_grid_hw) is transformers' `get_image_features` (each image's tokens in `pooler_output`). Built on first
    use: this module imports no torch."""
    from torch import nn
    from transformers import AutoModel
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3, NemotronH_Omni_Reasoning_V3MultiModalProjector)

    class NemotronVisionProjector(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.vision_model = AutoModel.from_config(config.vision_config)
            self.vision_model.make_preprocessor_external()
            self.vision_final_layernorm = None
            self.multi_modal_projector = NemotronH_Omni_Reasoning_V3MultiModalProjector(
                config.vision_hidden_size * MERGE * MERGE, config.projector_hidden_size, config.text_config.hidden_size)

        @property
        def dtype(self):
            return self.vision_model.dtype

        pixel_shuffle = NemotronH_Omni_Reasoning_V3.pixel_shuffle

        def forward(self, pixel_values, image_grid_hw):
            return NemotronH_Omni_Reasoning_V3.get_image_features(self, pixel_values, image_grid_hw)

    return NemotronVisionProjector


FAMILY = NemotronVLFamily()

__all__ = ["FAMILY", "NOT_HELD", "NemotronVLFamily", "PREFIX_TOKENS", "patch_grid_size", "reference_class",
           "released_keys"]
