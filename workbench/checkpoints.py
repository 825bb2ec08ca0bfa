"""Real checkpoints from a local transformers model folder: the vision config, the processor's
constants and the vision tower's tensors, never the language model's.

    cfg = wb.VisionConfig.from_pretrained(folder)      # config.json + preprocessor_config.json
    tower = build_tower(cfg)
    load_vision_weights(tower, folder)                  # model.safetensors or its sharded index

The folder is what transformers' ``save_pretrained`` (or a hub download) leaves: ``config.json``
with a ``vision_config``, ``preprocessor_config.json`` (mean, std, rescale, pixel bounds, patch
and merge sizes), and ``model.safetensors`` or ``model.safetensors.index.json`` with its shards.
Which family the folder holds comes from config.json's ``model_type`` (each family lists the
types of its checkpoints, `Family.model_types`). Everything is checked before any tensor is read:
a missing file or key, an unknown family, a processor that disagrees with the vision config, a
missing, unexpected or mis-shaped vision tensor; each error names the folder and the file. Tensors
are read lazily (safetensors' ``safe_open``): only the vision tower's, from the shards that hold
them. Both key layouts transformers has written are accepted: ``visual.*`` (older
``...ForConditionalGeneration`` checkpoints) and ``model.visual.*`` (transformers 5).
"""
from __future__ import annotations

import json
from pathlib import Path

from .config import VisionConfig, families

CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
VISION_PREFIXES = ("model.visual.", "visual.")


class CheckpointError(ValueError):
    """A model folder that cannot give a vision tower; the message names the folder and file."""


def _folder(folder) -> Path:
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder (expected a transformers model folder holding {CONFIG}, "
                              f"{PREPROCESSOR} and {WEIGHTS} or {WEIGHTS_INDEX})")
    return path


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: no {path.name} ({what})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def family_of(config: dict, where: Path):
    """The registered `Family` whose checkpoints carry config.json's ``model_type``."""
    model_type = config.get("model_type")
    known = {t: fam for fam in families().values() for t in fam.model_types}
    if model_type not in known:
        listing = ", ".join(f"{fam.name} ({', '.join(fam.model_types)})" for fam in families().values())
        raise CheckpointError(f"{where}: model_type {model_type!r} is not a known family; known families "
                              f"(model types): {listing}")
    return known[model_type]


def _processor_fields(pp: dict, arch: dict, fam, where: Path) -> dict:
    """VisionConfig processor fields from preprocessor_config.json, checked against the vision config."""
    for key, field in (("patch_size", "patch_size"), ("merge_size", "merge_size"),
                       ("temporal_patch_size", "temporal_patch_size")):
        if key in pp and pp[key] != arch[field]:
            raise CheckpointError(f"{where}: {key}={pp[key]!r} disagrees with config.json's vision_config "
                                  f"({field}={arch[field]!r}); the processor would cut rows the tower cannot read")
    out = {}
    for key in ("image_mean", "image_std"):
        value = pp.get(key)
        if value is None:
            raise CheckpointError(f"{where}: no {key!r} (the processor's normalization constants)")
        if not isinstance(value, (list, tuple)) or len(value) != arch["in_channels"]:
            raise CheckpointError(f"{where}: {key}={value!r} must hold {arch['in_channels']} numbers, one per "
                                  f"channel of the vision config (in_channels={arch['in_channels']})")
        out[key] = tuple(float(v) for v in value)
    if pp.get("do_rescale", True) is False or pp.get("do_normalize", True) is False:
        raise CheckpointError(f"{where}: do_rescale/do_normalize false: the workbench normalizes as the "
                              f"processor does with both on")
    out["rescale_factor"] = float(pp.get("rescale_factor", 1 / 255))
    size = pp.get("size") or {}
    lo = pp.get("min_pixels", size.get("shortest_edge"))
    hi = pp.get("max_pixels", size.get("longest_edge"))
    if lo is None or hi is None:
        raise CheckpointError(f"{where}: no pixel bounds (min_pixels/max_pixels, or size with shortest_edge "
                              f"and longest_edge)")
    if "min_pixels" in pp or "max_pixels" in pp:
        out["min_pixels"], out["max_pixels"] = int(lo), int(hi)     # per frame already
    else:
        out["min_pixels"], out["max_pixels"] = fam.frame_pixels(int(lo), int(hi), arch["temporal_patch_size"])
    return out


def read_vision_config(folder, name: str | None = None) -> VisionConfig:
    """The VisionConfig of a local transformers model folder: config.json's ``vision_config`` (the
    tower) and preprocessor_config.json (mean, std, rescale, pixel bounds; its patch and merge
    sizes must agree with the vision config). Reads JSON only. name: defaults to the folder name."""
    path = _folder(folder)
    config = _read_json(path / CONFIG, "the model's config, with its vision_config")
    fam = family_of(config, path / CONFIG)
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        raise CheckpointError(f"{path / CONFIG}: no vision_config object (a {fam.name} checkpoint has one)")
    try:
        arch = fam.from_hf(vc)
    except ValueError as e:
        raise CheckpointError(f"{path / CONFIG}: {e}") from None
    pp = _read_json(path / PREPROCESSOR, "the image processor's settings: mean, std, pixel bounds")
    fields = dict(arch, **_processor_fields(pp, arch, fam, path / PREPROCESSOR))
    try:
        return VisionConfig(name=name or path.name, family=fam.name, checkpoint=str(path.resolve()), **fields)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


# ---- tensors -------------------------------------------------------------------------------------

def _shards(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (the index's weight_map, or the one file)."""
    if (path / WEIGHTS_INDEX).is_file():
        index = _read_json(path / WEIGHTS_INDEX, "the shard index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{path / WEIGHTS_INDEX}: no weight_map object")
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise CheckpointError(f"{path}: shard(s) {', '.join(missing)} named in {WEIGHTS_INDEX} are missing")
        return {k: path / f for k, f in weight_map.items()}
    if (path / WEIGHTS).is_file():
        from safetensors import safe_open
        with safe_open(str(path / WEIGHTS), framework="pt") as f:
            return {k: path / WEIGHTS for k in f.keys()}
    raise CheckpointError(f"{path}: no {WEIGHTS} or {WEIGHTS_INDEX} (the model's tensors)")


def _vision_keys(names, where: Path) -> dict[str, str]:
    """Tower key -> checkpoint key for every vision tensor, under whichever prefix the folder uses."""
    for prefix in VISION_PREFIXES:
        keys = {k[len(prefix):]: k for k in names if k.startswith(prefix)}
        if keys:
            return keys
    raise CheckpointError(f"{where}: no vision tensors (no key starts with {' or '.join(VISION_PREFIXES)})")


def load_vision_weights(tower, folder):
    """Load the vision tower's tensors of a local model folder into ``tower`` (built from
    `read_vision_config` of the same folder, or a config of the same shapes); returns ``tower``.

    Every name and shape is checked against the tower from the safetensors headers first (a
    missing, unexpected or mis-shaped tensor is an error naming it and both shapes, and nothing is
    loaded); then only the vision tensors are read, file by file, and cast into the tower's dtype."""
    from safetensors import safe_open

    path = _folder(folder)
    shards = _shards(path)
    keys = _vision_keys(shards, path)
    own = {k: v for k, v in tower.state_dict().items() if not k.startswith("input_norm.")}
    ckpt_shapes = {}
    by_file: dict[Path, list[str]] = {}
    for k, ck in keys.items():
        by_file.setdefault(shards[ck], []).append(k)
    for file, ks in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for k in ks:
                ckpt_shapes[k] = tuple(f.get_slice(keys[k]).get_shape())
    ckpt_shapes = {k: s for k, s in ckpt_shapes.items() if not k.endswith("inv_freq")}
    problem = tower.state_mismatch(ckpt_shapes, missing="vision tensors missing from the checkpoint",
                                   name=lambda k: keys[k])
    if problem:
        raise CheckpointError(f"{path}: {problem}; nothing was loaded")
    state = {}
    for file, ks in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for k in ks:
                if k in own:
                    state[k] = f.get_tensor(keys[k])
    return tower.load_hf_state_dict(state)


__all__ = ["CheckpointError", "read_vision_config", "load_vision_weights", "family_of"]
