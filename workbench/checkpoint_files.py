"""A model folder's files as the checkpoint reader opens them: the names it expects, only
regular files inside the folder, and JSON bounded in size and nesting, with finite numbers. Every
error is a `CheckpointError` naming the file.

Its readers: `model_folder` (the folder itself), `file_inside` (a name an index gives, confined to
the folder), `open_checkpoint_file` (regular files only) and `read_json` (a config or an index)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .families.base import show
from .files import NotRegularFile, open_regular

CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"

JSON_MAX_BYTES = 16 << 20        # a config or an index is kilobytes to a few MB; more is not one
JSON_MAX_DEPTH = 32              # a config nests a few levels
# config.json's dtype name -> the label its float tensors carry
DTYPE_LABELS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
NAME_OF_LABEL = {label: name for name, label in DTYPE_LABELS.items()}


class CheckpointError(ValueError):
    """A model folder that cannot give a vision tower; the message names the folder and file."""


def model_folder(folder) -> Path:
    """``folder`` (``~`` expanded) as a Path, or a CheckpointError where it is not a folder."""
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


def file_inside(folder: Path, entry, where: str) -> Path:
    """``folder / entry`` where ``entry`` names a file that stays inside the folder after links
    are followed: an index from anyone could name ../../.ssh/id_rsa or /dev/zero. ``where``
    begins the error's message (the file, or the index entry, that names ``entry``)."""
    if not isinstance(entry, str) or not entry or "\0" in entry or os.path.isabs(entry) or ".." in Path(entry).parts:
        raise CheckpointError(f"{where}: {show(entry, 200)} must name a file inside the folder (a relative "
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


def open_checkpoint_file(path: Path):
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


def read_json(folder: Path, name: str, what: str) -> dict:
    """The JSON object in ``folder / name``, read only if it is a regular file of at most
    JSON_MAX_BYTES inside the folder, and holding only finite numbers, a few levels deep.
    ``what``: what the file holds, for the error where it is missing."""
    path = folder / name
    if not os.path.lexists(path):
        raise CheckpointError(f"{folder}: no {name} ({what})")
    with open_checkpoint_file(file_inside(folder, name, str(path))) as f:
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
