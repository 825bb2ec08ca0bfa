"""Real checkpoints from a local transformers model folder: the vision config, the processor's
constants and the vision tower's tensors, never the language model's.

    cfg = resolve_config(folder)                       # check_model_folder: JSON and every header
    tower = build_tower(cfg)
    load_vision_weights(tower, folder)                  # model.safetensors or its sharded index

The folder is what transformers' ``save_pretrained`` (or a hub download) leaves: ``config.json``
with a ``vision_config``, ``preprocessor_config.json`` (mean, std, rescale, pixel bounds, patch
and merge sizes), and ``model.safetensors`` or ``model.safetensors.index.json`` with its shards.
Which family the folder holds comes from config.json's ``model_type`` (each family lists the
types of its checkpoints, `Family.model_types`). Both key layouts transformers has written are
accepted: ``visual.*`` (older ``...ForConditionalGeneration`` checkpoints) and ``model.visual.*``
(transformers 5).

A folder may come from anyone, so everything is checked before a tower is allocated or a tensor
read (`check_model_folder`), each error a `CheckpointError` naming the file and the field or
tensor: every JSON value has its kind (`workbench.families.base.KINDS`), no NaN, Infinity or
pathological nesting, no file larger than a config can be; every safetensors header is parsed
here (a u64 length, then JSON) and its offsets must tile the file's data exactly; the names and
shapes must be those of the tower the config implies (built on the meta device: no memory),
every float tensor must carry the dtype config.json declares (a relabelled tensor would be cast
from the wrong bytes); the index may name only files inside the folder, and only regular files
are opened (a FIFO would block forever). Then only the vision tensors are read (safetensors'
``safe_open``), from the shards that hold them.

This is the one module that knows model folders: `resolve_config` takes a preset name or a folder
(every entry point that accepts a folder goes through it); `VisionConfig.preset` takes names only.
It imports the config (below it), never the other way round. The folder's files and JSON are
read by `workbench.checkpoint_files`, the safetensors headers by `workbench.checkpoint_tensors`.
"""
from __future__ import annotations

import os
from pathlib import Path

from .caches import host_cache_bytes, remember
from .checkpoint_files import CONFIG, DTYPE_LABELS, PREPROCESSOR, CheckpointError, model_folder, read_json
from .checkpoint_files import JSON_MAX_BYTES, JSON_MAX_DEPTH, NAME_OF_LABEL, WEIGHTS, WEIGHTS_INDEX  # noqa: F401
from .checkpoint_tensors import check_tensors, meta_tower, vision_tensors
from .checkpoint_tensors import DTYPE_BYTES, HEADER_MAX_BYTES, VISION_PREFIXES  # noqa: F401
from .config import PRESET_NAMES, VisionConfig, families
from .families.base import BOOL, NUMBER, NUMBERS, OBJECT, POSITIVE, checked, show

# ---- config.json and preprocessor_config.json ----------------------------------------------------

def family_of(config: dict, where: Path):
    """The registered `Family` whose checkpoints carry config.json's ``model_type``."""
    model_type = config.get("model_type")
    known = {t: fam for fam in families().values() for t in fam.model_types}
    if not isinstance(model_type, str) or model_type not in known:
        listing = ", ".join(f"{fam.name} ({', '.join(fam.model_types)})" for fam in families().values())
        shown = repr(model_type) if isinstance(model_type, str) else show(model_type)
        raise CheckpointError(f"{where}: model_type {shown} is not a known family; known families (model "
                              f"types): {listing}")
    return known[model_type]


def _processor_fields(pp: dict, arch: dict, fam) -> dict:
    """VisionConfig processor fields from preprocessor_config.json, every value of the table
    below checked for its kind first, then against the vision config (ValueError; the caller adds
    the file)."""
    kinds = dict(patch_size=POSITIVE, merge_size=POSITIVE, temporal_patch_size=POSITIVE, image_mean=NUMBERS,
                 image_std=NUMBERS, do_rescale=BOOL, do_normalize=BOOL, rescale_factor=NUMBER, size=OBJECT,
                 min_pixels=POSITIVE, max_pixels=POSITIVE, max_patches=POSITIVE, max_soft_tokens=POSITIVE,
                 pooling_kernel_size=POSITIVE, min_num_patches=POSITIVE, max_num_patches=POSITIVE)
    side = pp.get("patch_size")
    if isinstance(side, dict):       # Pixtral's processor writes {"height": p, "width": p}
        h, w = (checked(side.get(k), POSITIVE, f"patch_size.{k}") for k in ("height", "width"))
        if h != w:
            raise ValueError(f"patch_size={show(side)}: the towers take square patches")
        pp = dict(pp, patch_size=h)
    v = {k: checked(pp[k], kind, k) for k, kind in kinds.items() if k in pp}
    size = v.get("size") or {}
    v.update({f"size.{k}": checked(size[k], POSITIVE, f"size.{k}") for k in ("shortest_edge", "longest_edge")
              if k in size})
    for key, field in (("patch_size", "patch_size"), ("merge_size", "merge_size"),
                       ("temporal_patch_size", "temporal_patch_size")):
        if key in v and v[key] != arch[field]:
            raise ValueError(f"{key}={v[key]!r} disagrees with config.json's vision_config ({field}={arch[field]!r}); "
                             f"the processor would cut rows the tower cannot read")
    out = {}
    for key in ("image_mean", "image_std"):
        if key not in v:
            raise ValueError(f"no {key!r} (the processor's normalization constants)")
        if len(v[key]) != arch["in_channels"]:
            raise ValueError(f"{key}={pp[key]!r} must hold {arch['in_channels']} numbers, one per channel of the "
                             f"vision config (in_channels={arch['in_channels']})")
        out[key] = v[key]
    if v.get("do_rescale", True) is False:
        raise ValueError("do_rescale false: the workbench rescales as the processor does with it on")
    if v.get("do_normalize", True) is False:
        # the processor skips its normalize step (Gemma-4's: the model maps [0, 1] itself): the identity
        out = dict(image_mean=(0.0,) * arch["in_channels"], image_std=(1.0,) * arch["in_channels"])
    out["rescale_factor"] = v.get("rescale_factor", 1 / 255)
    return dict(out, **fam.processor_bounds(v, arch))


def _declared_label(config: dict, where: Path) -> str | None:
    """The safetensors label of the dtype config.json declares for the weights, None where it
    declares none. The top level first: save_pretrained writes the model's dtype there, and
    transformers 4 left a stale "float32" in vision_config beside bf16 weights."""
    vc = config.get("vision_config")
    for scope, d in (("", config), ("vision_config.", vc if isinstance(vc, dict) else {})):
        for key in ("dtype", "torch_dtype"):
            value = d.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or value not in DTYPE_LABELS:
                raise CheckpointError(f"{where}: {scope}{key} = {show(value)} must be one of "
                                      f"{', '.join(DTYPE_LABELS)}")
            return DTYPE_LABELS[value]
    return None


def _read_configs(path: Path, name: str | None) -> tuple[VisionConfig, str | None]:
    """(the folder's VisionConfig, the label of its declared dtype): JSON only."""
    config = read_json(path, CONFIG, "the model's config, with its vision_config")
    fam = family_of(config, path / CONFIG)
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        raise CheckpointError(f"{path / CONFIG}: no vision_config object (a {fam.name} checkpoint has one)")
    try:
        arch = fam.from_hf_config(config)
    except ValueError as e:
        raise CheckpointError(f"{path / CONFIG}: {e}") from None
    declared = _declared_label(config, path / CONFIG)
    pp = read_json(path, PREPROCESSOR, "the image processor's settings: mean, std, pixel bounds")
    try:
        fields = dict(arch, **_processor_fields(pp, arch, fam))
    except ValueError as e:
        raise CheckpointError(f"{path / PREPROCESSOR}: {e}") from None
    try:
        cfg = VisionConfig(name=name or path.name, family=fam.name, checkpoint=str(path.resolve()), **fields)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return cfg, declared


def read_vision_config(folder, name: str | None = None) -> VisionConfig:
    """The VisionConfig of a local transformers model folder: config.json's ``vision_config`` (the
    tower) and preprocessor_config.json (mean, std, rescale, pixel bounds; its patch and merge
    sizes must agree with the vision config). Reads JSON only (`check_model_folder` also checks
    the tensors). name: defaults to the folder name."""
    return _read_configs(model_folder(folder), name)[0]


def check_model_folder(folder, name: str | None = None) -> VisionConfig:
    """The VisionConfig of a model folder, after every check that needs no tensor data: the JSON
    files (kinds, finiteness, nesting, sizes), the processor against the vision config, every
    safetensors header that holds a vision tensor (offsets, sizes, dtypes), the names, shapes and
    dtype labels against the tower the config implies (built on the meta device: nothing is
    allocated), and that the index names only regular files inside the folder. Raises
    CheckpointError with a one-line message naming the file and the field or tensor."""
    path = model_folder(folder)
    cfg, declared = _read_configs(path, name)
    check_tensors(path, vision_tensors(path, cfg), meta_tower(cfg), declared)
    return cfg


def is_model_folder(value) -> bool:
    """Whether ``value`` names a folder holding a config.json: what a model folder must be at least
    (`check_model_folder` checks the rest). Any entry of that name counts, a FIFO or a broken link
    too, so that the check names what is wrong with it; nothing is opened."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        return False
    try:
        return os.path.lexists(Path(value).expanduser() / CONFIG)
    except (OSError, ValueError):      # ValueError: a NUL byte in the path
        return False


def resolve_config(cfg_or_name_or_folder, depth: int | None = None) -> VisionConfig:
    """A VisionConfig from a preset name or a local transformers model folder (a VisionConfig
    passes as it is): the one entry point that takes a folder.

    A name goes to `VisionConfig.preset`. A folder (an ``os.PathLike``, or a string naming a
    directory or a folder holding config.json) is checked whole by `check_model_folder` (JSON,
    every safetensors header, the tensors' shapes and dtypes, no tensor data read), so a folder
    that cannot load fails here with a CheckpointError naming the file and field; its config
    carries its processor constants and the folder (``checkpoint``: `build_encoder` loads its
    weights). Anything else is refused as `VisionConfig.coerce` refuses it: a ValueError listing
    the presets for an unknown name, a TypeError for another type.

    depth: None keeps the config's own depth; a number gives `reduced(depth)` (renamed, and a
    folder's copy has no checkpoint: fewer blocks draw random weights)."""
    value = cfg_or_name_or_folder
    if isinstance(value, os.PathLike) or (isinstance(value, str) and value not in PRESET_NAMES
                                          and (is_model_folder(value) or _is_dir(value))):
        cfg = check_model_folder(value)
    elif isinstance(value, str) and value not in PRESET_NAMES:
        raise ValueError(f"unknown preset {value!r}; valid presets: {', '.join(PRESET_NAMES)}, or a transformers "
                         f"model folder (holding config.json)")
    else:
        cfg = VisionConfig.coerce(value)
    return cfg if depth is None else cfg.reduced(depth)


def _is_dir(value: str) -> bool:
    try:
        return Path(value).expanduser().is_dir()
    except (OSError, ValueError):
        return False


def load_vision_weights(tower, folder):
    """Load the vision tower's tensors of a local model folder into ``tower`` (built from
    `read_vision_config` of the same folder, or a config of the same shapes); returns ``tower``.

    The headers are checked as `check_model_folder` does, against this tower (a missing,
    unexpected or mis-shaped tensor is an error naming it and both shapes, and nothing is
    loaded); then only the vision tensors are read, file by file, and cast into the tower's dtype. What was read
    is kept for the next tower built from the same folder (the latest `LOAD_CACHE_ENTRIES` folders, within
    `LOAD_CACHE_BYTES`), and read again where a file was replaced or changed since."""
    from safetensors import SafetensorError, safe_open

    path = model_folder(folder)
    tensors = vision_tensors(path, tower.cfg)
    check_tensors(path, tensors, tower, _declared_label(read_json(path, CONFIG, "the model's config"), path / CONFIG))
    own = tower.state_dict()
    by_file: dict[Path, list[tuple[str, object]]] = {}
    for k, t in tensors.items():
        if k in own:
            by_file.setdefault(t.file, []).append((k, t))

    def read() -> dict:
        state = {}
        for file, keys in by_file.items():
            try:
                with safe_open(str(file), framework="pt") as f:
                    state.update((k, t.converted(f.get_tensor(t.key))) for k, t in keys)
            except (SafetensorError, OSError) as e:     # the file changed since its header was checked
                raise CheckpointError(f"{file}: {e}") from None
        return state

    # kept for the next tower of the same folder; a file replaced or changed since (`_stamp`) is read again
    key = tuple((str(file), *_stamp(file), tuple((k, t.key, t.rows, t.rope_heads) for k, t in keys))
                for file, keys in by_file.items())
    return tower.load_hf_state_dict(remember(_LOADED, key, LOAD_CACHE_ENTRIES, read, LOAD_CACHE_BYTES))


# the vision tensors of the latest folders loaded (`load_vision_weights`), read once for the towers a sweep builds
# from one folder again and again; bounded in entries and bytes, read-only
LOAD_CACHE_ENTRIES = 2
LOAD_CACHE_BYTES = host_cache_bytes()
_LOADED: dict = {}


def _stamp(file: Path) -> tuple[int, ...]:
    try:
        st = os.stat(file)
    except OSError as e:
        raise CheckpointError(f"{file}: {e.strerror or e}") from None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


__all__ = ["CheckpointError", "check_model_folder", "read_vision_config", "load_vision_weights", "family_of",
           "is_model_folder", "resolve_config"]
