"""Kimi-K2.5 family spec (transformers' `Kimi_K25VisionModel` followed by `Kimi_K25MultimodalProjection`,
model_type kimi_k25; the tower is `workbench.towers.kimi_k25`): presets, checks, sizes, the
transformers mapping and the processor's resize rule.

The tower here is transformers' vision model AND the model's projector ("mm_projector"): the
vision model ends at [tokens, 4, width] pooled patches; the projector's pre-norm, 2x2 shuffle,
in_proj, GELU and out_proj bring each merged token to the language model's width. That is what
the other families call their merger (their towers return merged tokens at the text width), so
the tower returns [tokens, out_hidden] with out_hidden = the text model's hidden size.

Rows: one frame's 14 x 14 patch per row (a Conv2d patch embedding: temporal_patch_size 1, rows of
3 x 14 x 14 = 588), in merge-block order like every family here. A video is cut into chunks of at
most FRAMES frames (the video processor's temporal_patch_size, the tower's temporal table); a
chunk is one item (t, h, w) whose frames attend jointly and whose output is ONE frame's merged
tokens (h w / 4: the chunk's frames averaged per patch, `item_tokens`).

Preset (moonshotai/Kimi-K2.5's vision_config as transformers 5.24 ships it: its
Kimi_K25VisionConfig defaults, documented against the moonshotai/Kimi-K2.6 checkpoint, which
carries the same tower; vLLM 0.33's KimiK25VisionConfig defaults give the same numbers; the
config.json itself was not found in the sources searched):

| preset | depth | width | heads | mlp | position table | out (text hidden) | source |
|---|---|---|---|---|---|---|---|
| kimi-k2.5-1t | 27 | 1152 | 16 | 4304 | 64 x 64 (+ 4 frames) | 7168 | [a], [b] |

[a] Kimi_K25VisionConfig defaults: patch_size 14, pos_emb_height = pos_emb_width = 64, pos_emb_time 4,
    num_attention_heads 16, num_hidden_layers 27, hidden_size 1152, intermediate_size 4304,
    hidden_act gelu_pytorch_tanh, merge_kernel_size (2, 2), rope theta 10000 (axial); every
    LayerNorm of the tower eps 1e-5 (fixed in its code).
[b] Kimi_K25Config defaults: projection_hidden_size 1152, projection_layer_norm_eps 1e-5; the text
    model is DeepSeek-V3's architecture (Kimi-K2), hidden_size 7168 (DeepseekV3Config defaults;
    "1t": Kimi-K2's 1T total parameters).
Processor (transformers' Kimi_K25ImageProcessor / Kimi_K25VideoProcessor defaults; torchvision
only, no PIL variant exists): rescale 1/255, mean = std = (0.5, 0.5, 0.5) (IMAGENET_STANDARD),
bicubic; `navit_resize`: scale = min(1, sqrt(max_patches / (h//14 * w//14)), 512*14 / h, 512*14 / w),
size int(h * scale) x int(w * scale) (never upscaled), then zero-padded at the bottom and right to
multiples of 28; max_patches 16384 for images (max_pixels here = max_patches * 14^2), 4096 for
video chunks of 4 frames (`VIDEO_MAX_PATCHES`, `FRAMES`), size.max_height 512 patches a side
(`MAX_SIDE_PATCHES`).
"""
from __future__ import annotations

import functools
import math
import re

from .base import Family, check_position_table, check_unused, expect, get, hf_rope_theta, need, norm_params, show
from .qwen2_vl import Qwen2VLFamily

FRAMES = 4                   # frames per video chunk: the temporal table's rows (pos_emb_time)
VIDEO_MAX_PATCHES = 4096     # the video processor's max_patches (the image processor's: max_pixels / 14^2)
MAX_SIDE_PATCHES = 512       # the processors' size.max_height / max_width, in patches
KIMI_PROCESSOR = dict(patch_size=14, temporal_patch_size=1, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
                      eps=1e-5, min_pixels=14 * 14, max_pixels=16384 * 14 * 14)


# Moonshot's checkpoint names (without a leading "model.") -> the tower's; "wqkv": split in three
_BLOCK = r"vision_tower\.encoder\.blocks\.(\d+)\."
ORIGINAL_NAMES = (
    (r"vision_tower\.(?:encoder\.)?patch_embed\.proj\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"vision_tower\.patch_embed\.pos_emb\.weight", "patch_embed.pos_emb.position_embeddings"),
    (_BLOCK + r"norm0\.(weight|bias)", r"layers.\1.norm1.\2"),
    (_BLOCK + r"norm1\.(weight|bias)", r"layers.\1.norm2.\2"),
    (_BLOCK + r"mlp\.fc0\.(weight|bias)", r"layers.\1.mlp.fc1.\2"),
    (_BLOCK + r"mlp\.fc1\.(weight|bias)", r"layers.\1.mlp.fc2.\2"),
    (_BLOCK + r"wo\.(weight|bias)", r"layers.\1.attn.proj.\2"),
    (_BLOCK + r"wqkv\.(weight|bias)", "wqkv"),
    (r"vision_tower\.encoder\.final_layernorm\.(weight|bias)", r"final_layernorm.\1"),
    (r"mm_projector\.pre_norm\.(weight|bias)", r"mm_projector.pre_norm.\1"),
    (r"mm_projector\.proj\.0\.(weight|bias)", r"mm_projector.in_proj.\1"),
    (r"mm_projector\.proj\.2\.(weight|bias)", r"mm_projector.out_proj.\1"),
)


class KimiK25Family(Family):
    name = "kimi-k2.5"
    # transformers has no module holding both; `hf_model_class` pairs Kimi_K25VisionModel and
    # Kimi_K25MultimodalProjection under this name
    hf_class = ("workbench.families.kimi_k25", "Kimi_K25VisionWithProjection")
    model_types = ("kimi_k25",)
    study_presets = ("tiny-kimi-k2.5", "kimi-k2.5-1t")
    vllm_encoder_graphs = True     # the vLLM 0.33 and 0.34 audits: it captures Kimi-K2.5's encoder, the norm in its patch embed
    # transformers 5's Kimi_K25ForConditionalGeneration holds model.vision_tower / model.mm_projector,
    # in memory, its Kimi_K25Model vision_tower / mm_projector (save_pretrained writes Moonshot's
    # layout instead: `checkpoint_keys`)
    checkpoint_layouts = ({"model.vision_tower.": "", "model.mm_projector.": "mm_projector."},
                          {"vision_tower.": "", "mm_projector.": "mm_projector."})
    presets = (
        dict(name="kimi-k2.5-1t", depth=27, width=1152, heads=16, mlp_hidden=4304, out_hidden=7168,
             num_position_embeddings=64 * 64, **KIMI_PROCESSOR),
        # tiny: head_dim 16, an 8 x 8 position table, the processor bounded to ~1 megapixel
        dict(name="tiny-kimi-k2.5", depth=2, width=64, heads=4, mlp_hidden=96, out_hidden=48,
             num_position_embeddings=64, **{**KIMI_PROCESSOR, "max_pixels": 1 << 20}),
    )

    def validate(self, cfg) -> list[str]:
        problems = check_position_table(cfg) + check_unused(cfg, merger_hidden=0, deepstack_indexes=())
        if cfg.temporal_patch_size != 1:
            problems.append(f"temporal_patch_size={cfg.temporal_patch_size} must be 1 (the {self.name} tower embeds "
                            f"one frame per row with a Conv2d; a video chunk's frames are its grid's t)")
        return problems

    def item_tokens(self, cfg, t, h, w) -> int:
        """A chunk's frames are averaged patch by patch: one frame's merged tokens."""
        return h * w // cfg.merge_unit

    def n_params(self, cfg) -> int:
        """Qwen2-VL's blocks and merger (the projector: LayerNorm over width, two linears), plus the
        patch embedding's bias, the position table and the final LayerNorm."""
        w = cfg.width
        return Qwen2VLFamily.n_params(self, cfg) + w + cfg.num_position_embeddings * w + norm_params(w, "layer")

    # the same matmuls as Qwen2-VL's per row (patch embedding, qkv, proj, fc1, fc2) and per token
    row_macs = Qwen2VLFamily.row_macs
    token_macs = Qwen2VLFamily.token_macs

    # ---- transformers ------------------------------------------------------------------------
    def to_hf(self, cfg):
        """transformers' Kimi_K25Config holding the vision config and the projector's sizes (its
        text config is DeepSeek-V3's defaults but for hidden_size = out_hidden; nothing builds it)."""
        from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25Config, Kimi_K25VisionConfig
        side = math.isqrt(cfg.num_position_embeddings)
        vision = Kimi_K25VisionConfig(
            patch_size=cfg.patch_size, pos_emb_height=side, pos_emb_width=side, pos_emb_time=FRAMES,
            num_attention_heads=cfg.heads, num_hidden_layers=cfg.depth, hidden_size=cfg.width,
            intermediate_size=cfg.mlp_hidden, hidden_act="gelu_pytorch_tanh",
            merge_kernel_size=[cfg.merge_size, cfg.merge_size],
            rope_parameters={"rope_type": "axial", "rope_theta": cfg.rope_theta})
        if cfg.eps != 1e-5:
            raise ValueError(f"transformers' Kimi_K25VisionModel fixes every LayerNorm eps at 1e-5; eps={cfg.eps}")
        return Kimi_K25Config(vision_config=vision, text_config={"model_type": "deepseek_v3",
                                                                 "hidden_size": cfg.out_hidden},
                              projection_hidden_size=cfg.width, projection_layer_norm_eps=cfg.eps)

    def hf_model_class(self) -> type:
        return _vision_with_projection()

    def checkpoint_keys(self, cfg, names) -> dict[str, tuple]:
        """transformers 5's names (`checkpoint_layouts`), or Moonshot's own layout, which the published
        checkpoint has and transformers' save_pretrained writes back: blocks under
        vision_tower.encoder with norm0 / norm1, mlp.fc0 / fc1, wo, and one fused wqkv whose q and k
        rows hold interleaved rotary pairs; mm_projector.proj.0 / proj.2 (a leading model. allowed)."""
        w = cfg.width
        out = {}
        for name in names:
            bare = name[len("model."):] if name.startswith("model.") else name
            for pattern, tower in ORIGINAL_NAMES:
                m = re.fullmatch(pattern, bare)
                if m is None:
                    continue
                if tower == "wqkv":
                    block, kind = m.groups()
                    for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                        out[f"layers.{block}.attn.{proj}.{kind}"] = (name, (j * w, (j + 1) * w), cfg.heads if j < 2 else 0)
                else:
                    out[m.expand(tower)] = (name, None, 0)
                break
        # Moonshot's blocks found: that layout (its writer leaves a stray model.mm_projector.pre_norm)
        return out if any(k.startswith("layers.") for k in out) else super().checkpoint_keys(cfg, names)

    def from_hf(self, vc: dict) -> dict:
        """From a vision_config; the projector's output width (the text hidden size) and eps come
        from the checkpoint's top level (`from_hf_config`)."""
        expect(vc, "hidden_act", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
        side = get(vc, "pos_emb_height", 64)
        if get(vc, "pos_emb_width", side) != side:
            raise ValueError(f"vision_config pos_emb_width={vc['pos_emb_width']!r} must equal pos_emb_height={side} "
                             f"(transformers resamples a square position grid)")
        expect(vc, "pos_emb_time", FRAMES, FRAMES)
        merge = get(vc, "merge_kernel_size", [2, 2])
        if not (isinstance(merge, tuple) and len(merge) == 2 and merge[0] == merge[1]):
            raise ValueError(f"vision_config merge_kernel_size={vc.get('merge_kernel_size')!r} must be two equal sizes")
        return dict(depth=need(vc, "num_hidden_layers"), heads=need(vc, "num_attention_heads"),
                    patch_size=need(vc, "patch_size"), temporal_patch_size=1, merge_size=merge[0], in_channels=3,
                    rope_theta=hf_rope_theta(vc), width=need(vc, "hidden_size"),
                    mlp_hidden=need(vc, "intermediate_size"), num_position_embeddings=side * side, eps=1e-5)

    def from_hf_config(self, config: dict) -> dict:
        """The vision_config's fields, and those config.json holds outside it: the projector's output
        width (the text model's hidden size) and its LayerNorm eps, which must be the tower's 1e-5."""
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError("no text_config object (the projector's output width is its hidden_size)")
        if get(config, "projection_layer_norm_eps", 1e-5) != 1e-5:
            raise ValueError(f"projection_layer_norm_eps={config['projection_layer_norm_eps']!r}: this tower "
                             f"supports only 1e-5 (the vision model's own LayerNorms)")
        return dict(self.from_hf(config["vision_config"]), out_hidden=need(text, "hidden_size"))

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers takes each frame's patches in raster order, [rows, 3, P, P]; its merged
        tokens come out in merge-block order, as ours. One item per call: items attend and pool
        apart, and transformers 5.17's pooler cannot take images and video chunks in one call (it
        concatenates per-item index tables of [tokens, t, 4], which differ in t)."""
        import torch
        rows = pixels[raster_order(grid_thw, model.merge_size)].view(-1, 3, model.patch_size, model.patch_size)
        sizes = [int(t * h * w) for t, h, w in grid_thw.tolist()]
        return torch.cat([model(part, grid_thw[i:i + 1]) for i, part in enumerate(rows.split(sizes))])

    # ---- the processor's resize rule ---------------------------------------------------------
    def processor_bounds(self, values: dict, arch: dict) -> dict:
        """Kimi's processors bound an image by max_patches (its patches after resizing) and
        size.max_height = size.max_width (patches a side, MAX_SIDE_PATCHES here)."""
        p = arch["patch_size"]
        size = values.get("size") or {"max_height": MAX_SIDE_PATCHES, "max_width": MAX_SIDE_PATCHES}
        if [size.get(k) for k in ("max_height", "max_width")] != [MAX_SIDE_PATCHES] * 2:
            raise ValueError(f"size={show(size)}: this family supports only max_height = max_width = "
                             f"{MAX_SIDE_PATCHES} (patches a side)")
        return dict(min_pixels=p * p, max_pixels=values.get("max_patches", 16384) * p * p)

    def resize(self, cfg, kind: str, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """((resized h, w), (padded h, w)) of transformers' navit_resize for an image or a video
        frame: scaled down (never up) to the patch budget and the per-side cap, then zero-padded
        to multiples of patch_size * merge_size."""
        p = cfg.patch_size
        budget = cfg.max_pixels // (p * p) if kind == "image" else VIDEO_MAX_PATCHES
        patches = max(1, height // p) * max(1, width // p)
        cap = MAX_SIDE_PATCHES * p
        scale = min(1.0, math.sqrt(budget / patches), cap / height, cap / width)
        h, w = min(max(1, int(height * scale)), cap), min(max(1, int(width * scale)), cap)
        f = p * cfg.merge_size
        return (h, w), (-(-h // f) * f, -(-w // f) * f)

    def video_chunks(self, cfg, n_frames: int) -> list[range]:
        """A video's frames cut into items of at most FRAMES (the last may be shorter)."""
        return [range(s, min(s + FRAMES, n_frames)) for s in range(0, n_frames, FRAMES)]


def raster_order(grid_thw, merge: int):
    """int64 [rows]: for each row of transformers' layout (every frame's patches row by row), the
    row of ours (merge-block order) that holds the same patch."""
    import torch

    out, base = [], 0
    for t, h, w in grid_thw.tolist():
        r, c = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        block = ((r // merge) * (w // merge) + c // merge) * merge * merge + (r % merge) * merge + c % merge
        out += [base + f * h * w + block.reshape(-1) for f in range(t)]
        base += t * h * w
    return torch.cat(out)


@functools.lru_cache(maxsize=1)
def _vision_with_projection() -> type:
    """transformers' Kimi_K25VisionModel and Kimi_K25MultimodalProjection as one module (state
    dict keys vision_tower.* and mm_projector.*, as Kimi_K25Model holds them), called like the
    other families' vision models: (pixels [N, 3, P, P], grid_thw) -> [tokens, text hidden]."""
    from torch import nn
    from transformers.models.kimi_k25.modeling_kimi_k25 import Kimi_K25MultimodalProjection, Kimi_K25VisionModel

    class Kimi_K25VisionWithProjection(nn.Module):
        def __init__(self, config):
            super().__init__()
            config.vision_config._attn_implementation = getattr(config, "_attn_implementation", None) or "sdpa"
            self.vision_tower = Kimi_K25VisionModel(config.vision_config)
            self.mm_projector = Kimi_K25MultimodalProjection(config)
            self.patch_size = config.vision_config.patch_size
            self.merge_size = config.vision_config.merge_kernel_size[0]

        @property
        def dtype(self):
            return self.mm_projector.in_proj.weight.dtype

        def load_state_dict(self, state_dict, strict=True, assign=False):
            """Also a state dict of our tower's names (the vision model's keys bare)."""
            if not any(k.startswith("vision_tower.") for k in state_dict):
                state_dict = {k if k.startswith("mm_projector.") else f"vision_tower.{k}": v
                              for k, v in state_dict.items() if not k.startswith("input_norm.")}
            return super().load_state_dict(state_dict, strict=strict, assign=assign)

        def forward(self, pixels, grid_thw):
            pooled = self.vision_tower(pixels, grid_thw=grid_thw).pooler_output      # [tokens, 4, width]
            return self.mm_projector(pooled).squeeze(1)

    return Kimi_K25VisionWithProjection


FAMILY = KimiK25Family()
