"""What the package knows about one vision-tower family, in one object, and the helpers its
family modules share.

Each family module (`workbench/families/<family>.py`) holds its presets (the vision configs and
processor constants of the published checkpoints, as data) and one `Family` instance that answers
every family-specific question the rest of the package asks: how a config is validated, its
parameter count, its FLOPs per pixel row and per merged token, how it shrinks to fewer blocks, and
which transformers class and config it corresponds to. `workbench.families` registers the
instances (`FAMILIES`); `VisionConfig` delegates to them by ``cfg.family``. The towers (the
nn.Modules) sit above, in `workbench.towers`, which maps a family name to its tower class.

Plain Python only: importing a spec imports neither torch nor transformers (`to_hf` and the
reference-model helpers import them when called).
"""
from __future__ import annotations

import dataclasses
import json
import math


class Family:
    """Base descriptor; a family module subclasses it and sets the class attributes.

    name: the ``VisionConfig.family`` string (its tower class, `workbench.towers.TOWERS[name]`,
    says the same ``family``). presets: dicts of VisionConfig fields (each with its ``name``;
    ``family`` is added), tiny CPU presets named ``tiny-...``. hf_class: (module, class) of
    transformers' vision model for this family;
    hf_class_aliases: the names of other transformers vision classes with the same architecture
    (a checkpoint of another layout of the family carries one)."""

    name: str = ""
    presets: tuple[dict, ...] = ()
    hf_class: tuple[str, str] = ("", "")
    hf_class_aliases: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()      # config.json `model_type` of the checkpoints of this family
    # the presets that stand for this family where a study measures one tower per family (its cells
    # per preset: staging, pool bytes, padding): (CPU profile, GPU profile); None: not in that
    # profile's default (a family whose input side another family's preset already covers)
    study_presets: tuple[str | None, str | None] = (None, None)
    # the tower's attention has `VisionConfig.kv_heads` key/value heads, each shared by
    # heads / kv_heads query heads (grouped-query attention); False: kv_heads must stay 0
    grouped_kv: bool = False
    # the processor bounds each side (`VisionConfig.longest_edge`, Pixtral) instead of the area
    bounds_longest_edge: bool = False
    # where a checkpoint keeps the tower's tensors: each layout maps checkpoint key prefixes to the
    # tower's (a folder uses the first layout any of its keys match); transformers 5 writes the
    # first, older checkpoints the second
    checkpoint_layouts: tuple[dict[str, str], ...] = ({"model.visual.": ""}, {"visual.": ""})
    # the engine's own cell: where the newest vLLM (`engines.NEWEST`) normalizes this family (a study
    # placement: "tower" for its first op or its patch embedding, "device" for a GPU preprocessor,
    # "outer") and whether it captures the encoder in CUDA graphs (read from its released model files
    # with `python -m workbench audit`, which follows inheritance: a class deriving from a graph-capturing
    # model captures too)
    vllm_placement: str = "tower"
    vllm_encoder_graphs: bool = False
    # the tower takes video items (False: images only, and the mixes with video are left out of what is judged
    # or drawn for it, `samples.takes`)
    takes_video: bool = True
    # the processor's resampling filter ("bicubic", or "bilinear": Gemma-3), for the PIL resize and
    # the torch one (`workbench.preprocess`)
    resample: str = "bicubic"

    # ---- configuration -----------------------------------------------------------------------
    def validate(self, cfg) -> list[str]:
        """Family-specific problems of ``cfg`` (sentences naming the value and what is expected);
        the generic checks (types, positivity, caps) have passed when this runs."""
        return []

    def reduced(self, cfg, depth: int):
        """``cfg`` with ``depth`` blocks (renamed '@depthN'); families with block indices in
        their config override this to keep them meaningful."""
        return dataclasses.replace(cfg, name=f"{cfg.name}@depth{depth}", depth=depth)

    # ---- sizes -------------------------------------------------------------------------------
    def n_params(self, cfg) -> int:
        """Parameters of the tower in checkpoint shapes."""
        raise NotImplementedError

    def row_macs(self, cfg) -> int:
        """Multiply-adds per pixel row of the matmuls that run per row: the patch embedding and
        every block's qkv, projection and MLP."""
        raise NotImplementedError

    def token_macs(self, cfg) -> int:
        """Multiply-adds per merged output token of the matmuls after the blocks (mergers)."""
        raise NotImplementedError

    def item_tokens(self, cfg, t: int, h: int, w: int) -> int:
        """Merged tokens the tower returns for an item of t frames (temporal patches) of h x w
        patches: one per merge block of every frame."""
        return t * h * w // cfg.merge_unit

    def full_attention_blocks(self, cfg) -> int:
        """How many blocks attend over whole frames (the rest attend within windows)."""
        return cfg.depth

    # ---- transformers ------------------------------------------------------------------------
    def to_hf(self, cfg):
        """The transformers vision config equal to ``cfg``."""
        raise NotImplementedError

    def hf_model_class(self) -> type:
        """transformers' vision model class of this family (imports transformers)."""
        raise NotImplementedError

    def from_hf(self, vc: dict) -> dict:
        """VisionConfig fields (architecture only) from a checkpoint's config.json ``vision_config``
        dict; a missing key or a value the tower cannot run is a ValueError naming it."""
        raise NotImplementedError

    def checkpoint_keys(self, cfg, names) -> dict[str, tuple]:
        """Tower key -> (checkpoint key, rows, rope heads) of a model folder's tensors ``names``:
        the tensor, its rows (start, stop) where the tower's tensor is a split of a stored fused one
        (None: whole), and > 0 where its rows are stored as interleaved rotary pairs of that many
        heads (`checkpoint_tensors.VisionTensor.converted`); by default the first of `checkpoint_layouts`
        any name uses. {} where none fits."""
        return {k: (ck, None, 0) for k, ck in layout_keys(names, self.checkpoint_layouts).items()}

    def from_hf_config(self, config: dict) -> dict:
        """VisionConfig fields (architecture only) from a checkpoint's whole config.json: its
        ``vision_config`` (`from_hf`); a family whose tower also reads top-level fields (Mistral3's
        projector) overrides this."""
        return self.from_hf(config["vision_config"])

    def processor_bounds(self, values: dict, arch: dict) -> dict:
        """The resize bounds of preprocessor_config.json: min_pixels / max_pixels per frame, from its
        min_pixels / max_pixels or its size's shortest_edge / longest_edge (`frame_pixels`).
        ``values``: the file's settings, each checked for its kind (a size's entries as
        ``size.shortest_edge`` ...); ``arch``: the vision config's fields. ValueError when absent."""
        lo = values.get("min_pixels", values.get("size.shortest_edge"))
        hi = values.get("max_pixels", values.get("size.longest_edge"))
        if lo is None or hi is None:
            raise ValueError("no pixel bounds (min_pixels/max_pixels, or size with shortest_edge and longest_edge)")
        if "min_pixels" in values or "max_pixels" in values:
            return dict(min_pixels=lo, max_pixels=hi)          # per frame already
        lo, hi = self.frame_pixels(lo, hi, arch["temporal_patch_size"])
        return dict(min_pixels=lo, max_pixels=hi)

    def frame_pixels(self, shortest_edge: int, longest_edge: int, temporal_patch_size: int) -> tuple[int, int]:
        """(min_pixels, max_pixels) per frame from the processor's ``size`` bounds (the Qwen
        processors bound each frame's pixels; GLM's overrides this)."""
        return shortest_edge, longest_edge

    # ---- the processor's sizes ---------------------------------------------------------------
    def resize(self, cfg, kind: str, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """((resized h, w), (padded h, w)) of an image or video frame ('image' or 'video'), where the
        family's processor sizes its own way; None: `images.target_size`, no padding (above the specs)."""
        return None

    def crops(self, cfg, height: int, width: int) -> list[tuple[int, int, int, int]] | None:
        """The extra crops (top, left, bottom, right) the processor's pan-and-scan cuts from an image
        of height x width, each an item of its own after the image (`preprocess(pan_and_scan=True)`);
        None: the family's processor has no such option (every family but Gemma-3)."""
        return None

    def video_chunks(self, cfg, n_frames: int) -> list[range]:
        """The frames of each item a video of ``n_frames`` becomes: one item, all of them."""
        return [range(n_frames)]

    def hf_embeddings(self, model, pixels, grid_thw):
        """transformers' output in our tower's form: the merged embedding [N/4, embed_width]."""
        out = model(pixels, grid_thw)
        return out.pooler_output if hasattr(out, "pooler_output") else out


# ---- shared checks and counts -------------------------------------------------------------------

def layout_keys(names, layouts) -> dict[str, str]:
    """Tower key -> checkpoint key for every tensor under the first of ``layouts`` that any of
    ``names`` uses (a layout: checkpoint prefix -> tower prefix, `Family.checkpoint_layouts`); {}
    where none does."""
    for layout in layouts:
        keys = {own + k[len(prefix):]: k for k in names for prefix, own in layout.items() if k.startswith(prefix)}
        if keys:
            return keys
    return {}


def check_unused(cfg, **defaults) -> list[str]:
    """Problems for fields a family has no use for but that are set away from their default (a
    value the tower would silently ignore)."""
    return [f"{k}={getattr(cfg, k)!r}: the {cfg.family} tower has no use for it (leave it at {v!r})"
            for k, v in defaults.items() if getattr(cfg, k) != v]


def check_position_table(cfg) -> list[str]:
    """A learned position table must be a square grid of entries (it is resampled in 2-D)."""
    n = cfg.num_position_embeddings
    side = math.isqrt(n)
    if n <= 0 or side * side != n:
        return [f"num_position_embeddings={n} must be a positive square (side x side entries of the "
                f"learned position grid, e.g. 2304 = 48 x 48)"]
    return []


def norm_params(width: int, kind: str) -> int:
    """Parameters of one norm: LayerNorm has a bias, RMSNorm not."""
    return 2 * width if kind == "layer" else width


# ---- reading a checkpoint's JSON: one table of value kinds ---------------------------------------
#
# A model folder may come from anyone, so every value read from its config.json or
# preprocessor_config.json goes through `checked` with its kind from a table (VISION_KEYS here,
# the processor's in workbench.checkpoints): a wrong type is a ValueError naming the field, the
# value as the file spells it and what it must be, never a TypeError from deep inside.

_BAD = object()


def _integer(v, least: int):
    # JSON written by other tools may spell an integer 4.0; bool is no integer (True is no depth)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= least else _BAD


def _finite(v):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else _BAD


def _positive(v):
    out = _finite(v)
    return out if out is not _BAD and out > 0 else _BAD


def _all(convert, v):
    out = [convert(x) for x in v] if isinstance(v, list) else [_BAD]
    return _BAD if any(x is _BAD for x in out) else tuple(out)


# the kinds, each named by what a value of it must be (the error message says that)
POSITIVE = "a positive integer"
INDICES = "a list of block indices (integers >= 0)"
NUMBER = "a finite number > 0"
NUMBERS = "a list of finite numbers"
STRING = "a string"
BOOL = "true or false"
OBJECT = "an object or null"
INTEGER = "an integer"
# kind -> its conversion (the value as the workbench stores it, or _BAD)
KINDS = {
    POSITIVE: lambda v: _integer(v, 1),
    INDICES: lambda v: _all(lambda x: _integer(x, 0), v),
    NUMBER: _positive,
    NUMBERS: lambda v: _all(_finite, v),
    STRING: lambda v: v if isinstance(v, str) else _BAD,
    BOOL: lambda v: v if isinstance(v, bool) else _BAD,
    OBJECT: lambda v: v if v is None or isinstance(v, dict) else _BAD,
    INTEGER: lambda v: _integer(v, -(1 << 62)),
}

# every vision_config key a family's `from_hf` reads -> its kind
VISION_KEYS = {
    **dict.fromkeys(("depth", "num_heads", "patch_size", "temporal_patch_size", "spatial_merge_size",
                     "in_channels", "in_chans", "embed_dim", "mlp_ratio", "hidden_size", "intermediate_size",
                     "out_hidden_size", "window_size", "num_position_embeddings", "image_size"), POSITIVE),
    "fullatt_block_indexes": INDICES, "deepstack_visual_indexes": INDICES,
    "rope_theta": NUMBER, "rms_norm_eps": NUMBER, "hidden_act": STRING, "attention_bias": BOOL,
    "rope_parameters": OBJECT, "rope_scaling": OBJECT,
    # Pixtral's vision_config, and the top-level fields of Mistral3's config.json its projector reads
    **dict.fromkeys(("num_hidden_layers", "num_attention_heads", "num_channels", "head_dim"), POSITIVE),
    # Kimi-K2.5's vision_config, and the top-level field of its config.json its projector reads
    **dict.fromkeys(("pos_emb_height", "pos_emb_width", "pos_emb_time"), POSITIVE), "merge_kernel_size": INDICES,
    "projection_layer_norm_eps": NUMBER,
    "text_config": OBJECT, "projector_hidden_act": STRING, "multimodal_projector_bias": BOOL,
    "vision_feature_layer": INTEGER,
    # Gemma-3's SigLIP vision_config, and the top-level field of its config.json its projector reads
    "layer_norm_eps": NUMBER, "vision_use_head": BOOL, "mm_tokens_per_image": POSITIVE,
    # Gemma-4's vision_config
    **dict.fromkeys(("num_key_value_heads", "pooling_kernel_size", "position_embedding_size"), POSITIVE),
    "hidden_activation": STRING, "use_clipped_linears": BOOL, "standardize": BOOL,
    # Nemotron-H Omni's RADIO vision_config
    **dict.fromkeys(("num_cls_tokens", "num_registers", "max_img_size"), POSITIVE),
}


def show(value, width: int = 60) -> str:
    """``value`` as JSON spells it ("32" quoted, Infinity, null), cut to ``width`` characters."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= width else text[:width - 3] + "..."


def checked(value, kind: str, name: str):
    """``value`` converted as ``kind`` (a key of KINDS) says, or a ValueError naming ``name``."""
    out = KINDS[kind](value)
    if out is _BAD:
        raise ValueError(f"{name} = {show(value)} must be {kind}")
    return out


def need(vc: dict, key: str):
    """``vc[key]`` checked as VISION_KEYS says, or a ValueError naming the missing key (the caller
    adds the file)."""
    if key not in vc:
        raise ValueError(f"vision_config has no {key!r}")
    return checked(vc[key], VISION_KEYS[key], f"vision_config.{key}")


def get(vc: dict, key: str, default):
    """``vc[key]`` checked as VISION_KEYS says, or ``default`` where the key is absent."""
    return need(vc, key) if key in vc else default


def expect(vc: dict, key: str, want, default) -> None:
    """A setting the tower hard-codes (an activation, a bias): refuse a checkpoint that differs."""
    got = get(vc, key, default)
    if got != want:
        raise ValueError(f"vision_config {key}={got!r}: this tower supports only {want!r}")


def hf_rope_theta(vc: dict) -> float:
    """The rotary theta of a checkpoint's ``vision_config``: transformers 5 writes it in
    rope_parameters, older versions in rope_scaling or as a bare rope_theta (default 10000)."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = get(vc, key, None)
        if rope:
            if "rope_theta" in rope:
                return checked(rope["rope_theta"], NUMBER, f"vision_config.{key}.rope_theta")
            break
    return get(vc, "rope_theta", 10000.0)


def hf_common(vc: dict) -> dict:
    """The fields every family's vision_config spells alike: depth, heads, patching, rotary theta."""
    return dict(depth=need(vc, "depth"), heads=need(vc, "num_heads"), patch_size=need(vc, "patch_size"),
                temporal_patch_size=get(vc, "temporal_patch_size", 2), merge_size=get(vc, "spatial_merge_size", 2),
                in_channels=get(vc, "in_channels", get(vc, "in_chans", 3)), rope_theta=hf_rope_theta(vc))
