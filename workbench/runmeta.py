"""A run's record (its ``meta.json``) as a typed value: `RunMeta`.

``RunMeta.from_json`` checks every field the code reads against `SCHEMA` and refuses what it cannot
use with a `MetaError` naming the file and the field. Every field may be absent or null; other keys
stay in ``extra`` and are written back (reading a record loses nothing). Light: no torch, no pandas.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import atomic_write_text, read_regular
from .provenance import collect_meta, iso_utc, load_average, parse_iso, utc_now

META_NAME = "meta.json"
MAX_BYTES = 16 * 2**20          # a meta.json is a few kB; far more is not one
MAX_DEPTH = 32                  # collect_meta nests 4 levels deep

_SCALARS = {     # kind -> (check, what it expects, for the message)
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "num": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
            "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "id": (lambda v: isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)),
           "a string or an integer"),
    "any": (lambda v: True, "anything"),
}
# a schema: a scalar kind, {key: schema} (an object), ["list", schema] or ["map", schema] ({name: schema})
_STRINGS = ["list", "str"]
_SECONDS = ["map", "num"]
_PLACEMENT = ["map", {"gpu": "id", "threads": "id", "seconds": "num"}]
SCHEMA: dict[str, Any] = {
    "schema": "int", "started_at": "str", "finished_at": "str", "duration_s": "num", "device": "str",
    "git": {"sha": "str", "short": "str", "dirty": "bool"},
    "params": {"profile": "str", "device": "str", "mode": "str", "studies": ["map", {}],
               "shard": {"index": "int", "count": "int", "group": "str", "cells": ["map", ["list", "any"]]},
               "gpus": ["list", "int"]},
    "failures": _STRINGS, "warnings": _STRINGS,
    "resumed": ["list", {"at": "str", "git": "str", "note": "str", "finished_at": "str", "dirty": "bool",
                         "studies": _STRINGS, "failures": _STRINGS, "warnings": _STRINGS,
                         "study_seconds": _SECONDS, "placement": _PLACEMENT}],
    "placement": _PLACEMENT, "study_seconds": _SECONDS,
}


class MetaError(ValueError):
    """A meta.json that cannot be used: ``str(e)`` starts with its path; ``kind`` is "missing",
    "unreadable" or "invalid"; ``line`` is what the report shows beside the run."""

    def __init__(self, path: Path | str, reason: str, kind: str = "invalid"):
        self.path, self.reason, self.kind = Path(path), reason, kind
        super().__init__(f"{self.path}: {reason}")

    @property
    def line(self) -> str:
        return f"{self.kind} meta.json: {self.reason}"

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.kind))


def _kind(v: Any) -> str:
    for t, name in ((type(None), "null"), (bool, "boolean"), ((int, float), "number"), (str, "string"),
                    (list, "array"), (dict, "object")):
        if isinstance(v, t):
            return name
    return type(v).__name__


def _show(v: Any, limit: int = 40) -> str:
    """A bad value in words: its JSON kind and, for a scalar, a clipped repr."""
    kind = _kind(v)
    a = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    if isinstance(v, (dict, list)):
        return a
    r = repr(v)
    return f"{a} ({r if len(r) <= limit else r[:limit - 3] + '...'})"


def _depth(v: Any, limit: int) -> int:
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return deepest


def _check(v: Any, schema: Any, where: str, out: list[str]) -> None:
    if v is None:
        return
    if isinstance(schema, str):
        ok, expected = _SCALARS[schema]
        if not ok(v):
            out.append(f"{where} is {_show(v)}, not {expected}")
        return
    container = dict if isinstance(schema, dict) or schema[0] == "map" else list
    if not isinstance(v, container):
        out.append(f"{where} is {_show(v)}, not {'an object' if container is dict else 'a list'}")
    elif isinstance(schema, dict):
        for key, sub in schema.items():
            _check(v.get(key), sub, f"{where}.{key}", out)
    else:
        items = v.items() if container is dict else enumerate(v)
        for k, x in items:
            n = len(out)
            _check(x, schema[1], f"{where}.{k}" if container is dict else f"{where}[{k}]", out)
            if len(out) > n and isinstance(schema[1], str):
                break                    # one bad item of a list of scalars says it


def problems(meta: Any) -> list[str]:
    """What is wrong with a parsed meta.json, one line per problem (``[]``: usable). A shard also
    needs its index, count and group, with 0 <= index < count."""
    if not isinstance(meta, dict):
        return [f"it does not hold an object (a JSON {_kind(meta)})"]
    if _depth(meta, MAX_DEPTH) > MAX_DEPTH:
        return [f"it nests more than {MAX_DEPTH} levels deep"]
    out: list[str] = []
    for key, schema in SCHEMA.items():
        _check(meta.get(key), schema, key, out)
    params = meta.get("params")
    shard = params.get("shard") if isinstance(params, dict) else None
    if isinstance(shard, dict):
        missing = [f"params.shard.{k} is missing" for k in ("index", "count", "group") if shard.get(k) is None]
        out += missing
        if not missing and not any(p.startswith("params.shard.") for p in out) \
                and not 0 <= shard["index"] < shard["count"]:
            out.append(f"params.shard is {shard['index']}/{shard['count']}, not I/N with 0 <= I < N")
    return out


def parse(path: Path | str, text: str) -> dict[str, Any]:
    """``text`` as a JSON object; MetaError (kind "unreadable") naming ``path`` otherwise."""
    try:
        meta = json.loads(text)
    except RecursionError:
        raise MetaError(path, "nested too deeply to parse", "unreadable") from None
    except ValueError as e:
        raise MetaError(path, f"not valid JSON ({e})", "unreadable") from None
    if not isinstance(meta, dict):
        raise MetaError(path, f"it does not hold an object (a JSON {_kind(meta)})", "unreadable")
    return meta


def read_text(path: Path | str) -> str:
    """The text of a meta.json, a regular file of at most MAX_BYTES (`read_regular`); MetaError otherwise."""
    try:
        return read_regular(path, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise MetaError(path, "no such file", "missing") from None
    except UnicodeDecodeError as e:
        raise MetaError(path, f"not UTF-8 text ({e})", "unreadable") from None
    except OSError as e:
        raise MetaError(path, f"cannot be read ({e.strerror or e})", "unreadable") from None


def json_default(o: Any) -> Any:
    """What json.dumps cannot write: sets and tuples as lists, numpy and torch scalars as numbers,
    anything else (a path, a torch.dtype) as its text."""
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    item = getattr(o, "item", None)
    if callable(item) and not isinstance(o, Path):
        try:
            return item()
        except Exception:  # noqa: BLE001 - readable beats failing
            pass
    return str(o)


@dataclass
class RunMeta:
    """The fields of a meta.json the code reads, typed as `SCHEMA` checks them; ``extra`` holds
    every other key (packages, torch, nvml, ...), kept as read."""

    schema: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    device: str | None = None
    git: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    failures: list[str] | None = None
    warnings: list[str] | None = None
    resumed: list[dict[str, Any]] | None = None
    placement: dict[str, dict[str, Any]] | None = None
    study_seconds: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False, repr=False)
    _order: tuple = field(default=(), compare=False, repr=False)      # the keys as read, for to_dict

    @classmethod
    def from_dict(cls, meta: dict[str, Any], path: Path | str = META_NAME) -> "RunMeta":
        """``meta`` checked (`problems`; MetaError naming ``path`` and every bad field)."""
        bad = problems(meta)
        if bad:
            raise MetaError(path, "; ".join(bad))
        known = {k: meta[k] for k in SCHEMA if k in meta}
        return cls(**known, extra={k: v for k, v in meta.items() if k not in SCHEMA},
                   path=Path(path), _order=tuple(meta))

    @classmethod
    def collect(cls, params: dict | None = None) -> "RunMeta":
        """A new run's record: the facts at its start (`provenance.collect_meta`) and ``params``."""
        return cls.from_dict(collect_meta(params))

    @classmethod
    def from_json(cls, source: str | Path) -> "RunMeta":
        """A meta.json from its text, or from a path (a run folder or the file itself)."""
        if not (isinstance(source, str) and source.lstrip().startswith(("{", "["))):
            path = Path(source)
            path = path / META_NAME if path.name != META_NAME and path.is_dir() else path
            return cls.from_dict(parse(path, read_text(path)), path)
        return cls.from_dict(parse(META_NAME, source))

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON data: the keys read back in their order, then new fields set here."""
        known = {k: getattr(self, k) for k in SCHEMA}
        out = {k: known.pop(k) if k in known else self.extra[k] for k in self._order
               if k in known or k in self.extra}
        out.update({k: v for k, v in known.items() if v is not None})
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=json_default) + "\n"

    def finish(self) -> "RunMeta":
        """Stamp the end time, the duration and the end load average on the record; return it."""
        finished = utc_now()
        if isinstance(self.extra.get("load_avg"), dict):
            self.extra["load_avg"]["end"] = load_average()
        try:
            self.duration_s = round((finished - parse_iso(self.started_at)).total_seconds(), 3)
        except (TypeError, ValueError, AttributeError):
            self.duration_s = None
        self.finished_at = iso_utc(finished)
        return self

    def write(self, run_dir: Path | str, overwrite: bool = False) -> Path:
        """``run_dir/meta.json``, written atomically. A finished run's record (even one that breaks
        the schema) is evidence and is replaced only with ``overwrite``."""
        path = Path(run_dir) / META_NAME
        if path.exists() and not overwrite:
            try:
                finished = parse(path, read_text(path)).get("finished_at")
            except MetaError:
                finished = None
            if finished:
                raise FileExistsError(f"{path} belongs to a finished run; pass overwrite=True to replace it")
        return atomic_write_text(path, self.to_json())

    @property
    def plan(self) -> dict[str, dict]:
        """{study: its recorded parameters}: what the run planned."""
        return (self.params or {}).get("studies") or {}

    @property
    def shard(self) -> dict | None:
        """{index, count, group, cells} of a shard of a sharded sweep, else None."""
        sh = (self.params or {}).get("shard")
        return sh if sh and sh.get("group") else None

    @property
    def git_label(self) -> str:
        """'abc1234', 'abc1234+dirty' or 'no git'."""
        g = self.git or {}
        short = g.get("short") or (g.get("sha") or "")[:7]
        return short + ("+dirty" if g.get("dirty") is True else "") if short else "no git"

    def open_failures(self) -> list[str]:
        """The failures no later resume has mended: a ``resumed`` entry with ``failures`` (a resume of
        a finished run) replaces the failures of the studies it re-ran with its own."""
        failures = list(self.failures or [])
        for entry in self.resumed or []:
            if "failures" in entry:
                redone = set(entry.get("studies") or [])
                failures = [f for f in failures if f.split(":", 1)[0] not in redone]
                failures += entry.get("failures") or []
        return failures

    def all_warnings(self) -> list[str]:
        return [*(self.warnings or []), *(w for x in self.resumed or [] for w in x.get("warnings") or [])]


def load(run_dir: Path | str) -> RunMeta:
    """``run_dir/meta.json`` read and checked; MetaError naming the file and what is wrong."""
    return RunMeta.from_json(Path(run_dir) / META_NAME)
