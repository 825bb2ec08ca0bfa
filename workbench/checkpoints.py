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
It imports the config (below it), never the other way round.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .config import PRESET_NAMES, VisionConfig, families
from .families.base import BOOL, NUMBER, NUMBERS, OBJECT, POSITIVE, checked, show
from .files import NotRegularFile, open_regular

CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
VISION_PREFIXES = ("model.visual.", "visual.")

JSON_MAX_BYTES = 16 << 20        # a config or an index is kilobytes to a few MB; more is not one
JSON_MAX_DEPTH = 32              # a config nests a few levels
HEADER_MAX_BYTES = 100 << 20     # what safetensors itself refuses above
# safetensors dtype label -> bytes per element (the labels torch reads)
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# config.json's dtype name -> the label its float tensors carry
DTYPE_LABELS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
NAME_OF_LABEL = {label: name for name, label in DTYPE_LABELS.items()}


class CheckpointError(ValueError):
    """A model folder that cannot give a vision tower; the message names the folder and file."""


def _show(value, width: int = 60) -> str:
    """``value`` as the JSON file spells it, cut short (`workbench.families.base.show`)."""
    return show(value, width)


def _folder(folder) -> Path:
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder (expected a transformers model folder holding {CONFIG}, "
                              f"{PREPROCESSOR} and {WEIGHTS} or {WEIGHTS_INDEX})")
    return path


# ---- files: inside the folder, regular, bounded ---------------------------------------------------

def _roots(folder: Path) -> tuple[Path, ...]:
    """Where the folder's files may lie once links are followed: the folder itself, and for a
    snapshot in the hub's cache (.../snapshots/<revision>/, whose files link to ../../blobs/)
    the blobs folder beside it."""
    real = folder.resolve()
    return (real, real.parent.parent / "blobs") if real.parent.name == "snapshots" else (real,)


def _inside(folder: Path, entry, where: str) -> Path:
    """``folder / entry`` where ``entry`` names a file that stays inside the folder after links
    are followed: an index from anyone could name ../../.ssh/id_rsa or /dev/zero."""
    if not isinstance(entry, str) or not entry or "\0" in entry or os.path.isabs(entry) or ".." in Path(entry).parts:
        raise CheckpointError(f"{where}: {_show(entry, 200)} must name a file inside the folder (a relative "
                              f"path without '..')")
    path = folder / entry
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as e:       # a loop of links
        raise CheckpointError(f"{where}: {entry} cannot be resolved ({e})") from None
    if not any(real.is_relative_to(root) for root in _roots(folder)):
        raise CheckpointError(f"{where}: {entry} resolves to {real}, outside the folder {folder}; only the "
                              f"folder's own files are read")
    return path


def _open_regular(path: Path):
    """``path`` opened for binary reading if it is a regular file (or a link to one); anything
    else is refused unopened (`workbench.files.open_regular`: a FIFO blocks its reader forever, a
    device never ends)."""
    try:
        return open_regular(path)
    except NotRegularFile as e:
        raise CheckpointError(f"{path}: {e.kind}, not a regular file; a model folder's files must be regular "
                              f"files (or links to them)") from None
    except (OSError, ValueError) as e:          # ValueError: a NUL byte in the name
        raise CheckpointError(f"{path}: cannot be opened ({getattr(e, 'strerror', None) or e})") from None


def _json_problem(data) -> str | None:
    """The first thing a config must not hold, by its dotted path: a non-finite number (Python's
    json reads NaN and Infinity, which JSON has not, and 1e999 as inf) or nesting deeper than
    JSON_MAX_DEPTH. Iterative: a deep value must not exhaust the stack here either."""
    todo = [("", data, 0)]
    while todo:
        name, value, depth = todo.pop()
        if depth > JSON_MAX_DEPTH:
            return f"{name} nests deeper than {JSON_MAX_DEPTH} levels (a config nests a few)"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name} = {json.dumps(value)} must be a finite number (JSON has no NaN or Infinity)"
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        todo += [(f"{name}[{k}]" if isinstance(k, int) else f"{name}.{k}" if name else k, v, depth + 1)
                 for k, v in items]
    return None


def _read_json(folder: Path, name: str, what: str) -> dict:
    """The JSON object in ``folder / name``, read only if it is a regular file of at most
    JSON_MAX_BYTES inside the folder, and holding only finite numbers, a few levels deep."""
    path = folder / name
    if not os.path.lexists(path):
        raise CheckpointError(f"{folder}: no {name} ({what})")
    with _open_regular(_inside(folder, name, str(path))) as f:
        size = os.fstat(f.fileno()).st_size
        if size > JSON_MAX_BYTES:
            raise CheckpointError(f"{path}: {size:,} bytes; a {name} is at most {JSON_MAX_BYTES:,} bytes here")
        try:
            raw = f.read(JSON_MAX_BYTES + 1)
        except OSError as e:
            raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        data = json.loads(raw)
    except RecursionError:
        raise CheckpointError(f"{path}: nested deeper than Python's JSON reader goes (a config nests a "
                              f"few levels)") from None
    except ValueError as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    problem = _json_problem(data)
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    return data


# ---- config.json and preprocessor_config.json ----------------------------------------------------

def family_of(config: dict, where: Path):
    """The registered `Family` whose checkpoints carry config.json's ``model_type``."""
    model_type = config.get("model_type")
    known = {t: fam for fam in families().values() for t in fam.model_types}
    if not isinstance(model_type, str) or model_type not in known:
        listing = ", ".join(f"{fam.name} ({', '.join(fam.model_types)})" for fam in families().values())
        shown = repr(model_type) if isinstance(model_type, str) else _show(model_type)
        raise CheckpointError(f"{where}: model_type {shown} is not a known family; known families (model "
                              f"types): {listing}")
    return known[model_type]


def _processor_fields(pp: dict, arch: dict, fam) -> dict:
    """VisionConfig processor fields from preprocessor_config.json, every value of the table
    below checked for its kind first, then against the vision config (ValueError; the caller adds
    the file)."""
    kinds = dict(patch_size=POSITIVE, merge_size=POSITIVE, temporal_patch_size=POSITIVE, image_mean=NUMBERS,
                 image_std=NUMBERS, do_rescale=BOOL, do_normalize=BOOL, rescale_factor=NUMBER, size=OBJECT,
                 min_pixels=POSITIVE, max_pixels=POSITIVE)
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
    if v.get("do_rescale", True) is False or v.get("do_normalize", True) is False:
        raise ValueError("do_rescale/do_normalize false: the workbench normalizes as the processor does with both on")
    out["rescale_factor"] = v.get("rescale_factor", 1 / 255)
    lo = v.get("min_pixels", v.get("size.shortest_edge"))
    hi = v.get("max_pixels", v.get("size.longest_edge"))
    if lo is None or hi is None:
        raise ValueError("no pixel bounds (min_pixels/max_pixels, or size with shortest_edge and longest_edge)")
    if "min_pixels" in v or "max_pixels" in v:
        out["min_pixels"], out["max_pixels"] = lo, hi      # per frame already
    else:
        out["min_pixels"], out["max_pixels"] = fam.frame_pixels(lo, hi, arch["temporal_patch_size"])
    return out


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
                raise CheckpointError(f"{where}: {scope}{key} = {_show(value)} must be one of "
                                      f"{', '.join(DTYPE_LABELS)}")
            return DTYPE_LABELS[value]
    return None


def _read_configs(path: Path, name: str | None) -> tuple[VisionConfig, str | None]:
    """(the folder's VisionConfig, the label of its declared dtype): JSON only."""
    config = _read_json(path, CONFIG, "the model's config, with its vision_config")
    fam = family_of(config, path / CONFIG)
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        raise CheckpointError(f"{path / CONFIG}: no vision_config object (a {fam.name} checkpoint has one)")
    try:
        arch = fam.from_hf(vc)
    except ValueError as e:
        raise CheckpointError(f"{path / CONFIG}: {e}") from None
    declared = _declared_label(config, path / CONFIG)
    pp = _read_json(path, PREPROCESSOR, "the image processor's settings: mean, std, pixel bounds")
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
    return _read_configs(_folder(folder), name)[0]


# ---- safetensors headers -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tensor:
    """One vision tensor as its safetensors header describes it."""

    key: str                     # the checkpoint's name for it
    file: Path
    dtype: str                   # safetensors label: F32, BF16, ...
    shape: tuple[int, ...]


def _entry(name: str, e) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, each checked against the others."""
    dtype = e.get("dtype") if isinstance(e, dict) else None
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ValueError(f"tensor {name}: dtype {_show(dtype)} is not one of {', '.join(DTYPE_BYTES)}")
    shape, span = e.get("shape"), e.get("data_offsets")

    def naturals(xs):
        return isinstance(xs, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs)
    if not naturals(shape) or not naturals(span) or len(span) != 2 or span[0] > span[1]:
        raise ValueError(f"tensor {name}: shape {_show(shape)} and data_offsets {_show(span)} "
                         f"must be a list of sizes >= 0 and [begin, end] with begin <= end")
    nbytes = DTYPE_BYTES[dtype] * math.prod(shape)
    if span[1] - span[0] != nbytes:
        raise ValueError(f"tensor {name}: data_offsets {span} hold {span[1] - span[0]} bytes, but {dtype} "
                         f"{tuple(shape)} needs {nbytes}")
    return dtype, tuple(shape), span[0], span[1]


def _check_layout(spans: list[tuple[int, int, str]], data_bytes: int) -> None:
    """The tensors' byte ranges must tile the data exactly, as safetensors requires: each inside
    it, none overlapping another, no gap, nothing after the last."""
    for begin, end, name in spans:           # first: a truncated file says so, not "a gap"
        if end > data_bytes:
            raise ValueError(f"tensor {name}: data_offsets [{begin}, {end}] lie outside the {data_bytes:,} bytes "
                             f"of data (a truncated file, or a header that lies about offsets)")
    at, last = 0, None
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ValueError(f"tensor {name}: data_offsets [{begin}, {end}] " + (
                f"overlap tensor {last}'s bytes (which end at {at})" if begin < at else
                f"leave bytes [{at}, {begin}) of the data to no tensor"))
        at, last = end, name
    if at != data_bytes:
        raise ValueError(f"the tensors cover {at:,} of the {data_bytes:,} bytes of data")


def _read_header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype label, shape) of a safetensors file, checked against the file before any
    tensor is read. The format: a little-endian u64 N, N bytes of JSON (name -> {dtype, shape,
    data_offsets [begin, end] into the data} and an optional __metadata__), then the data."""
    with _open_regular(file) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            head = f.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or n > min(size - 8, HEADER_MAX_BYTES):
                raise CheckpointError(f"{file}: {size:,} bytes, " + (
                    "shorter than the 8-byte header length a safetensors file starts with" if len(head) < 8 else
                    f"but its header length says {n:,} bytes of JSON follow (a truncated file or a bad header)"))
            raw = f.read(n)
        except OSError as e:
            raise CheckpointError(f"{file}: cannot be read ({e.strerror or e})") from None
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError(f"a JSON {type(header).__name__}, not an object")
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{file}: the safetensors header is not a JSON object ({e})") from None
    header.pop("__metadata__", None)
    try:
        entries = {name: _entry(name, e) for name, e in header.items()}
        _check_layout([(b, e, name) for name, (_, _, b, e) in entries.items()], size - 8 - n)
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from None
    return {name: (dtype, shape) for name, (dtype, shape, _, _) in entries.items()}


def _vision_keys(names, where: Path) -> dict[str, str]:
    """Tower key -> checkpoint key for every vision tensor, under whichever prefix the folder uses."""
    for prefix in VISION_PREFIXES:
        keys = {k[len(prefix):]: k for k in names if k.startswith(prefix)}
        if keys:
            return keys
    raise CheckpointError(f"{where}: no vision tensors (no key starts with {' or '.join(VISION_PREFIXES)})")


def _shard_map(path: Path) -> dict[str, Path]:
    """Checkpoint key -> the file the index places it in, every entry confined to the folder."""
    index = path / WEIGHTS_INDEX
    weight_map = _read_json(path, WEIGHTS_INDEX, "the shard index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: no weight_map object")
    files: dict[str, Path] = {}
    for key, entry in weight_map.items():
        if not isinstance(entry, str) or entry not in files:
            files[entry] = _inside(path, entry, f"{index}: weight_map[{_show(key)}]")
    missing = sorted(entry for entry, file in files.items() if not os.path.lexists(file))
    if missing:
        raise CheckpointError(f"{path}: shard(s) {', '.join(missing)} named in {WEIGHTS_INDEX} are missing")
    return {key: files[entry] for key, entry in weight_map.items()}


def _vision_tensors(path: Path) -> dict[str, _Tensor]:
    """Tower key -> its tensor, from the headers of the files that hold the vision tensors (the
    one file, or the shards the index names for them), each header checked whole."""
    if os.path.lexists(path / WEIGHTS_INDEX):
        shards = _shard_map(path)
        headers = {}
    elif os.path.lexists(path / WEIGHTS):
        file = _inside(path, WEIGHTS, str(path / WEIGHTS))
        headers = {file: _read_header(file)}
        shards = dict.fromkeys(headers[file], file)
    else:
        raise CheckpointError(f"{path}: no {WEIGHTS} or {WEIGHTS_INDEX} (the model's tensors)")
    out = {}
    for k, ck in _vision_keys(shards, path).items():
        file = shards[ck]
        if file not in headers:
            headers[file] = _read_header(file)
        if ck not in headers[file]:
            raise CheckpointError(f"{file}: no tensor {ck}, which {WEIGHTS_INDEX} places in this file")
        out[k] = _Tensor(ck, file, *headers[file][ck])
    return out


# ---- against the tower ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _meta_tower(cfg: VisionConfig):
    """The tower of ``cfg`` on the meta device: its state_dict's names and shapes without memory,
    so a config.json claiming width 4096 over 32-wide tensors costs nothing before it is refused."""
    import torch

    from .towers import build_tower

    with torch.device("meta"):
        return build_tower(cfg)


def _check_tensors(path: Path, tensors: dict[str, _Tensor], tower, declared: str | None) -> None:
    """Names and shapes against ``tower`` (missing, unexpected, mis-shaped: each named with both
    shapes and its file), then each float tensor's dtype label against the declared one (any
    float label where config.json declares none)."""
    shapes = {k: t.shape for k, t in tensors.items() if not k.endswith("inv_freq")}
    problem = tower.state_mismatch(shapes, missing="vision tensors missing from the checkpoint",
                                   name=lambda k: f"{tensors[k].key} (in {tensors[k].file.name})")
    if problem:
        raise CheckpointError(f"{path}: {problem}; nothing was loaded")
    want = {declared} if declared else set(DTYPE_LABELS.values())
    said = (f"config.json declares {NAME_OF_LABEL[declared]} ({declared})" if declared else
            f"config.json declares no dtype and a tower weight must be a float ({', '.join(sorted(want))})")
    own = tower.state_dict()
    for k, t in tensors.items():
        # integer buffers, if a tower has any, are exempt: the rule is about float weights' bytes
        if k in own and own[k].is_floating_point() and t.dtype not in want:
            raise CheckpointError(f"{t.file}: tensor {t.key} is stored as {t.dtype}, but {said}; refused rather "
                                  f"than cast from bytes its label may not describe")


def check_model_folder(folder, name: str | None = None) -> VisionConfig:
    """The VisionConfig of a model folder, after every check that needs no tensor data: the JSON
    files (kinds, finiteness, nesting, sizes), the processor against the vision config, every
    safetensors header that holds a vision tensor (offsets, sizes, dtypes), the names, shapes and
    dtype labels against the tower the config implies (built on the meta device: nothing is
    allocated), and that the index names only regular files inside the folder. Raises
    CheckpointError with a one-line message naming the file and the field or tensor."""
    path = _folder(folder)
    cfg, declared = _read_configs(path, name)
    _check_tensors(path, _vision_tensors(path), _meta_tower(cfg), declared)
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
    loaded); then only the vision tensors are read, file by file, and cast into the tower's dtype."""
    from safetensors import SafetensorError, safe_open

    path = _folder(folder)
    tensors = _vision_tensors(path)
    _check_tensors(path, tensors, tower, _declared_label(_read_json(path, CONFIG, "the model's config"), path / CONFIG))
    own = tower.state_dict()
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for k, t in tensors.items():
        if k in own:
            by_file.setdefault(t.file, []).append((k, t.key))
    state = {}
    for file, keys in by_file.items():
        try:
            with safe_open(str(file), framework="pt") as f:
                state.update((k, f.get_tensor(ck)) for k, ck in keys)
        except (SafetensorError, OSError) as e:     # the file changed since its header was checked
            raise CheckpointError(f"{file}: {e}") from None
    return tower.load_hf_state_dict(state)


__all__ = ["CheckpointError", "check_model_folder", "read_vision_config", "load_vision_weights", "family_of",
           "is_model_folder", "resolve_config"]
