"""A run's record (its ``meta.json``) as a typed value: `RunMeta`, whose field types are the checks.
Every field may be absent or null; other keys stay in ``extra`` and are written back. No torch, no pandas."""
from __future__ import annotations

import json
import math
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import UnionType
from typing import Any, TypedDict, get_args, get_origin, get_type_hints, is_typeddict

from ..files import atomic_write_text, read_regular
from ..provenance import collect_meta, iso_utc, load_average, utc_now

META_NAME = "meta.json"
MAX_BYTES = 16 * 2**20          # a meta.json is a few kB; far more is not one
MAX_DEPTH = 32                  # collect_meta nests 4 levels deep
# The objects in a record the code reads: each key checked where present, none required
Git = TypedDict("Git", {"sha": str, "short": str, "dirty": bool})
Shard = TypedDict("Shard", {"index": int, "count": int, "group": str, "cells": dict[str, list[Any]]})
Params = TypedDict("Params", {"profile": str, "device": str, "mode": str, "studies": dict[str, dict],
                              "shard": Shard, "gpus": list[int], "workers": int})
Placement = dict[str, TypedDict("Place", {"gpu": str | int, "threads": str | int, "seconds": float})]
Resumed = TypedDict("Resumed", {"at": str, "git": str, "note": str, "finished_at": str, "dirty": bool,
                                "studies": list[str], "failures": list[str], "warnings": list[str],
                                "study_seconds": dict[str, float], "placement": Placement})
_SCALARS = {str: "a string", int: "an integer", float: "a finite number", bool: "true or false"}
_JSON = ((type(None), "null"), (bool, "boolean"), ((int, float), "number"), (str, "string"), (list, "array"),
         (dict, "object"))


class MetaError(ValueError):
    """A meta.json that cannot be used: ``str(e)`` starts with its path; ``line`` is what the report shows beside
    the run, starting with ``kind``: "missing", "unreadable" or "invalid"."""

    def __init__(self, path: Path | str, reason: str, kind: str = "invalid"):
        self.path, self.line = Path(path), f"{kind} meta.json: {reason}"
        super().__init__(f"{self.path}: {reason}")


def _kind(v: Any) -> str:
    return next((name for t, name in _JSON if isinstance(v, t)), type(v).__name__)


def _show(v: Any) -> str:
    """A bad value in words: its JSON kind and, for a scalar, a repr clipped to 40 characters."""
    a = f"{'an' if _kind(v)[0] in 'aeiou' else 'a'} {_kind(v)}"
    r = repr(v)
    return a if isinstance(v, (dict, list)) else f"{a} ({r if len(r) <= 40 else r[:37] + '...'})"


def _too_deep(v: Any, limit: int) -> bool:
    """Whether ``v`` nests lists and objects more than ``limit`` levels deep (looked at level by level)."""
    level = [v]
    for _ in range(limit + 1):
        level = [x for x in level if isinstance(x, (dict, list))]
        if not level:
            return False
        level = [y for x in level for y in (x.values() if isinstance(x, dict) else x)]
    return True


def _fits(v: Any, t: type) -> bool:
    if t is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return isinstance(v, t) and (t is bool or not isinstance(v, bool))


def _check(v: Any, t: Any, where: str, out: list[str]) -> None:
    """A line in ``out`` for each part of ``v`` that does not fit the type ``t`` (null fits any)."""
    kinds = get_args(t) if get_origin(t) is UnionType else (t,)
    if v is None or t is Any:
        return
    if all(k in _SCALARS for k in kinds):
        if not any(_fits(v, k) for k in kinds):
            out.append(f"{where} is {_show(v)}, not {' or '.join(_SCALARS[k] for k in kinds)}")
        return
    container = list if get_origin(t) is list else dict
    if not isinstance(v, container):
        out.append(f"{where} is {_show(v)}, not {'a list' if container is list else 'an object'}")
    elif is_typeddict(t):
        for key, sub in t.__annotations__.items():
            _check(v.get(key), sub, f"{where}.{key}", out)
    elif get_args(t):           # list[X] or dict[str, X]
        item = get_args(t)[-1]
        for k, x in v.items() if container is dict else enumerate(v):
            n = len(out)
            _check(x, item, f"{where}.{k}" if container is dict else f"{where}[{k}]", out)
            if len(out) > n and item in _SCALARS:
                break           # one bad item of a list of scalars says it


def problems(meta: Any) -> list[str]:
    """What is wrong with a parsed meta.json, one line per problem (``[]``: usable)."""
    if not isinstance(meta, dict):
        return [f"it does not hold an object (a JSON {_kind(meta)})"]
    if _too_deep(meta, MAX_DEPTH):
        return [f"it nests more than {MAX_DEPTH} levels deep"]
    out: list[str] = []
    for key, t in _FIELDS.items():
        _check(meta.get(key), t, key, out)
    params = meta.get("params")
    shard = params.get("shard") if isinstance(params, dict) else None
    if isinstance(shard, dict):
        out += [f"params.shard.{k} is missing" for k in ("index", "count", "group") if shard.get(k) is None]
        if not any(p.startswith("params.shard.") for p in out) and not 0 <= shard["index"] < shard["count"]:
            out.append(f"params.shard is {shard['index']}/{shard['count']}, not I/N with 0 <= I < N")
    return out


def parse(path: Path | str) -> dict[str, Any]:
    """The JSON object in the regular file ``path`` (MAX_BYTES at most); MetaError otherwise."""
    try:
        meta = json.loads(read_regular(path, MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise MetaError(path, "no such file", "missing") from None
    except UnicodeDecodeError as e:
        raise MetaError(path, f"not UTF-8 text ({e})", "unreadable") from None
    except OSError as e:
        raise MetaError(path, f"cannot be read ({e.strerror or e})", "unreadable") from None
    except RecursionError:
        raise MetaError(path, "nested too deeply to parse", "unreadable") from None
    except ValueError as e:
        raise MetaError(path, f"not valid JSON ({e})", "unreadable") from None
    if not isinstance(meta, dict):
        raise MetaError(path, f"it does not hold an object (a JSON {_kind(meta)})", "unreadable")
    return meta


def json_default(o: Any) -> Any:
    """What json.dumps cannot write: sets and tuples as lists, numpy and torch scalars as numbers, else text."""
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if callable(getattr(o, "item", None)) and not isinstance(o, Path):
        with suppress(Exception):   # readable beats failing
            return o.item()
    return str(o)


@dataclass
class RunMeta:
    """The fields of a meta.json the code reads; ``extra``: the other keys (packages, torch, ...) as read."""

    schema: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    device: str | None = None
    git: Git | None = None
    params: Params | None = None
    failures: list[str] | None = None
    warnings: list[str] | None = None
    resumed: list[Resumed] | None = None
    placement: Placement | None = None
    study_seconds: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _order: tuple = field(default=(), compare=False, repr=False)      # the keys as read, for to_dict

    @classmethod
    def from_dict(cls, meta: dict[str, Any], path: Path | str = META_NAME) -> "RunMeta":
        """``meta`` checked (`problems`; MetaError naming ``path`` and every bad field)."""
        bad = problems(meta)
        if bad:
            raise MetaError(path, "; ".join(bad))
        known = {k: meta[k] for k in _FIELDS if k in meta}
        return cls(**known, extra={k: v for k, v in meta.items() if k not in _FIELDS}, _order=tuple(meta))

    @classmethod
    def collect(cls, params: dict | None = None) -> "RunMeta":
        """A new run's record: the facts at its start (`provenance.collect_meta`) and ``params``."""
        return cls.from_dict(collect_meta(params))

    @classmethod
    def from_json(cls, path: str | Path) -> "RunMeta":
        """A meta.json from its path: a run folder or the file itself."""
        path = Path(path)
        path = path / META_NAME if path.name != META_NAME and path.is_dir() else path
        return cls.from_dict(parse(path), path)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON data: the keys read back in their order, then new fields set here."""
        known = {k: getattr(self, k) for k in _FIELDS}
        out = {k: known.pop(k) if k in known else self.extra[k] for k in self._order if k in known or k in self.extra}
        out.update({k: v for k, v in known.items() if v is not None})
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=json_default) + "\n"

    def finish(self) -> "RunMeta":
        """Stamp the end time, the duration and the end load average on the record; return it."""
        finished, self.duration_s = utc_now(), None
        if isinstance(self.extra.get("load_avg"), dict):
            self.extra["load_avg"]["end"] = load_average()
        with suppress(TypeError, ValueError):     # no start time, or not one fromisoformat reads
            self.duration_s = round((finished - datetime.fromisoformat(self.started_at)).total_seconds(), 3)
        self.finished_at = iso_utc(finished)
        return self

    def write(self, run_dir: Path | str, overwrite: bool = False) -> Path:
        """``run_dir/meta.json``, written atomically. A finished run's record (even one that fails
        the checks) is evidence and is replaced only with ``overwrite``."""
        path = Path(run_dir) / META_NAME
        with suppress(MetaError):
            if path.exists() and not overwrite and parse(path).get("finished_at"):
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


# {field: its type, null aside}: what `problems` checks, in the order a new record writes them
_FIELDS = {k: get_args(t)[0] for k, t in get_type_hints(RunMeta).items() if k not in ("extra", "_order")}
