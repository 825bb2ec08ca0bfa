"""The vision tensors of a model folder from their safetensors headers, parsed and checked
here (no tensor data read): the key mapping from the checkpoint's names to the tower's, and the
check of names, shapes and dtype labels against the tower a config implies.

    tensors = vision_tensors(folder, cfg)              # tower key -> VisionTensor, headers only
    check_tensors(folder, tensors, meta_tower(cfg), declared)
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .checkpoint_files import (DTYPE_LABELS, NAME_OF_LABEL, WEIGHTS, WEIGHTS_INDEX, CheckpointError, file_inside,
                               open_checkpoint_file, read_json)
from .config import VisionConfig
from .families.base import show

VISION_PREFIXES = ("model.visual.", "visual.")
HEADER_MAX_BYTES = 100 << 20     # what safetensors itself refuses above
# safetensors dtype label -> bytes per element (the labels torch reads)
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


# ---- safetensors headers -------------------------------------------------------------------------

@dataclass(frozen=True)
class VisionTensor:
    """One vision tensor as its safetensors header describes it."""

    key: str                     # the checkpoint's name for it
    file: Path
    dtype: str                   # safetensors label: F32, BF16, ...
    shape: tuple[int, ...]       # the tower's tensor's (of the rows below, where a fused tensor is split)
    rows: tuple[int, int] | None = None     # the tower's tensor is these rows of the stored one
    rope_heads: int = 0          # > 0: rows stored as interleaved rotary pairs, per head of that many

    def converted(self, stored):
        """The tower's tensor from the stored one (`Family.checkpoint_keys`): the rows, then per
        head the pairs (0, 1), (2, 3), ... split into halves (transformers' PermuteForRope)."""
        t = stored if self.rows is None else stored[self.rows[0]:self.rows[1]]
        if self.rope_heads:
            n = t.shape[0]
            t = t.reshape(self.rope_heads, n // self.rope_heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)
        return t


def _entry(name: str, e) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, each checked against the others."""
    dtype = e.get("dtype") if isinstance(e, dict) else None
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ValueError(f"tensor {name}: dtype {show(dtype)} is not one of {', '.join(DTYPE_BYTES)}")
    shape, span = e.get("shape"), e.get("data_offsets")

    def naturals(xs):
        return isinstance(xs, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs)
    if not naturals(shape) or not naturals(span) or len(span) != 2 or span[0] > span[1]:
        raise ValueError(f"tensor {name}: shape {show(shape)} and data_offsets {show(span)} "
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
    with open_checkpoint_file(file) as f:
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


def _vision_keys(names, where: Path, cfg: VisionConfig) -> dict[str, tuple]:
    """Tower key -> (checkpoint key, rows, rope heads) for every vision tensor, as the family maps
    the folder's names (`Family.checkpoint_keys`: by default the first of its layouts,
    `Family.checkpoint_layouts`, checkpoint prefix -> tower prefix, that the folder's keys use)."""
    keys = cfg.spec.checkpoint_keys(cfg, names)
    if keys:
        return keys
    prefixes = [prefix for layout in cfg.spec.checkpoint_layouts for prefix in layout]
    raise CheckpointError(f"{where}: no vision tensors (no key starts with {' or '.join(prefixes)})")


def _shard_map(path: Path) -> dict[str, Path]:
    """Checkpoint key -> the file the index places it in, every entry confined to the folder."""
    index = path / WEIGHTS_INDEX
    weight_map = read_json(path, WEIGHTS_INDEX, "the shard index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: no weight_map object")
    files: dict[str, Path] = {}
    for key, entry in weight_map.items():
        if not isinstance(entry, str) or entry not in files:
            files[entry] = file_inside(path, entry, f"{index}: weight_map[{show(key)}]")
    missing = sorted(entry for entry, file in files.items() if not os.path.lexists(file))
    if missing:
        raise CheckpointError(f"{path}: shard(s) {', '.join(missing)} named in {WEIGHTS_INDEX} are missing")
    return {key: files[entry] for key, entry in weight_map.items()}


def vision_tensors(path: Path, cfg: VisionConfig) -> dict[str, VisionTensor]:
    """Tower key -> its tensor, from the headers of the files that hold the vision tensors (the
    one file, or the shards the index names for them), each header checked whole; the names as
    ``cfg``'s family maps them (`Family.checkpoint_keys`)."""
    if os.path.lexists(path / WEIGHTS_INDEX):
        shards = _shard_map(path)
        headers = {}
    elif os.path.lexists(path / WEIGHTS):
        file = file_inside(path, WEIGHTS, str(path / WEIGHTS))
        headers = {file: _read_header(file)}
        shards = dict.fromkeys(headers[file], file)
    else:
        raise CheckpointError(f"{path}: no {WEIGHTS} or {WEIGHTS_INDEX} (the model's tensors)")
    out = {}
    for k, (ck, rows, rope) in _vision_keys(shards, path, cfg).items():
        file = shards[ck]
        if file not in headers:
            headers[file] = _read_header(file)
        if ck not in headers[file]:
            raise CheckpointError(f"{file}: no tensor {ck}, which {WEIGHTS_INDEX} places in this file")
        dtype, shape = headers[file][ck]
        if rows is not None:
            if rows[1] > shape[0]:
                raise CheckpointError(f"{file}: tensor {ck} {shape} has no rows {rows[0]}..{rows[1] - 1} (its {k})")
            shape = (rows[1] - rows[0], *shape[1:])
        out[k] = VisionTensor(ck, file, dtype, shape, rows, rope)
    return out


# ---- against the tower ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def meta_tower(cfg: VisionConfig):
    """The tower of ``cfg`` on the meta device: its state_dict's names and shapes without memory,
    so a config.json claiming width 4096 over 32-wide tensors costs nothing before it is refused."""
    import torch

    from .towers import build_tower

    with torch.device("meta"):
        return build_tower(cfg)


def check_tensors(path: Path, tensors: dict[str, VisionTensor], tower, declared: str | None) -> None:
    """Names and shapes against ``tower`` (missing, unexpected, mis-shaped: each named with both
    shapes and its file), then each float tensor's dtype label against the declared one (any
    float label where config.json declares none). ``declared``: the safetensors label of the
    dtype config.json declares, None where it declares none."""
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
