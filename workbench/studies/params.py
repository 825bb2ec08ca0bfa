"""One declaration of a study's parameters, read by everything that needs them.

A study declares each parameter once, as a `Param` (name, kind, allowed values, CPU default, GPU
default, help). That declaration is the only place the defaults live:

- the notebook's cell tagged ``parameters`` is generated from it (`ParamSpec.parameters_cell`,
  kept in step by ``python -m workbench notebooks`` and checked by a test);
- the sweep checks every ``--set`` against it before a run folder exists (`ParamSpec.resolve`);
- ``python -m workbench sweep --help`` lists it (`ParamSpec.describe`);
- the run's meta.json records the resolved values, i.e. what actually ran.

Values are coerced where the intent is unambiguous and refused otherwise, with a message that
names the parameter, the bad value and the valid choices: a list parameter takes a list, one
scalar (``budgets=16`` -> ``[16]``) or a comma-separated string (papermill ``-p families
tiny-qwen2-vl`` -> ``["tiny-qwen2-vl"]``, never iterated character by character).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from .. import limits
from ..checkpoints import CheckpointError, is_model_folder, resolve_config   # torch-free at import

# cpu: tiny towers, a smoke test of everything; gpu: the decision set (the cells the answer table and the advice
# read, one realistic batch of each kind); gpu-full: every cell a GPU study has (the full grids, the long streams)
PROFILES = ("cpu", "gpu", "gpu-full")
GPU_PROFILES = ("gpu", "gpu-full")
KINDS = ("int", "float", "str", "bool", "list[int]", "list[float]", "list[str]")
_SAME = object()      # gpu default: the same as the cpu default


class ParamError(ValueError):
    """A parameter value that a study cannot take; the message names value and valid choices."""


def _checked(check: Callable, *args, prefix: str = "", error: type = ValueError) -> Any:
    """``check(*args)``, its ``error`` turned into a ParamError (message behind ``prefix``): a cap,
    a rule or a spec-wide check refuses a value the way a bad value is refused."""
    try:
        return check(*args)
    except error as e:
        raise ParamError(f"{prefix}{e}") from None


def _scalar(kind: str, name: str, value: Any) -> Any:
    """Coerce one scalar of ``kind`` ('int', 'float', 'str', 'bool')."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.strip().lower() in ("true", "1", "yes")
        raise ParamError(f"{name}={value!r} is not a boolean; valid: true, false")
    if kind == "int":
        if isinstance(value, bool):
            raise ParamError(f"{name}={value!r} is not an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ParamError(f"{name}={value!r} is not an integer")
    if kind == "float":
        if isinstance(value, bool):
            raise ParamError(f"{name}={value!r} is not a number")
        if isinstance(value, (int, float)):
            out = float(value)
        elif isinstance(value, str):
            try:
                out = float(value.strip())
            except ValueError:
                raise ParamError(f"{name}={value!r} is not a number") from None
        else:
            raise ParamError(f"{name}={value!r} is not a number")
        if not math.isfinite(out):
            raise ParamError(f"{name}={value!r} is not a finite number")
        return out
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ParamError(f"{name}={value!r} is not a string")
    raise AssertionError(kind)  # pragma: no cover


def _model_folder(name: str, value: str) -> str:
    """A model folder given for parameter ``name``, as its absolute path, checked whole
    (`workbench.checkpoints.resolve_config`: its JSON, every safetensors header, the shapes and
    dtypes against the tower, without reading tensor data) so that a folder that cannot load is
    refused like any bad value, before a run folder exists."""
    try:
        resolve_config(value)
    except CheckpointError as e:
        raise ParamError(f"{name}={value!r}: not a usable model folder: {e}") from None
    return str(Path(value).expanduser().resolve())


@dataclass(frozen=True)
class Param:
    """One study parameter.

    kind: one of KINDS; cpu / gpu / gpu_full: the defaults of the profiles (gpu defaults to cpu's, gpu_full to
    gpu's: a parameter the decision set narrows keeps its full value in gpu_full);
    choices: the allowed values (of each element, for a list); optional: None is allowed (and
    means "the study's own choice", e.g. the preset's depth); minimum: the smallest allowed number;
    cap: the name of the `workbench.limits` cap on each number (a size knob without one could ask
    for more memory than any machine has; the cap can be raised on purpose, see limits);
    rule: an extra check ``rule(value) -> None`` that raises ValueError with a clear message;
    host_rule: a check against the machine that takes a given value (its cores), run where the value is given
    (a sweep's --set, a notebook's parameters, a resumed run's record: `ParamSpec.resolve`'s overrides), before a
    run folder exists; never on the declared defaults, which are read on machines that do not run them (a GPU
    profile's predictions on a laptop);
    model_folders: a transformers model folder (one holding config.json) is taken besides the
    choices, as its absolute path (a preset parameter: the user's own checkpoint).
    A list holds at most ``limits.list_items`` values; it may be empty only with ``empty_ok`` (an
    axis of cells the study can leave out).
    """

    name: str
    kind: str
    cpu: Any
    gpu: Any = _SAME
    gpu_full: Any = _SAME
    choices: tuple | None = None
    optional: bool = False
    minimum: float | None = None
    cap: str | None = None
    help: str = ""
    rule: Callable[[Any], None] | None = field(default=None, compare=False)
    host_rule: Callable[[Any], None] | None = field(default=None, compare=False)
    empty_ok: bool = False
    model_folders: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"parameter {self.name!r}: unknown kind {self.kind!r}; valid: {KINDS}")
        if "=" in self.help:      # the help becomes a comment on the parameters-cell line, which
            # papermill then cannot parse ("Unable to parse line"; its value is still injected)
            raise ValueError(f"parameter {self.name!r}: its help must not contain '=' (papermill reads "
                             f"the parameters cell line by line): {self.help!r}")
        if self.cap is not None and self.cap not in limits.Limits.names():
            raise ValueError(f"parameter {self.name!r}: no limit named {self.cap!r}; valid: {limits.Limits.names()}")
        with limits.shipped():        # a declaration whose own defaults are invalid is a bug (against the
            for profile in PROFILES:  # shipped caps: a malformed variable never stops an import)
                self.check(self.default(profile))

    def default(self, profile: str) -> Any:
        if profile == "gpu-full" and self.gpu_full is not _SAME:
            value = self.gpu_full
        else:
            value = self.cpu if profile == "cpu" or self.gpu is _SAME else self.gpu
        return list(value) if isinstance(value, (list, tuple)) else value

    @property
    def is_list(self) -> bool:
        return self.kind.startswith("list[")

    def _valid(self) -> str:
        if self.choices is not None:
            return ", ".join(map(str, self.choices)) + (
                " (or a transformers model folder: a path holding config.json)" if self.model_folders else "")
        what = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
                "list[int]": "a list of integers", "list[float]": "a list of numbers",
                "list[str]": "a list of strings"}[self.kind]
        bounds = []
        if self.minimum is not None:
            bounds.append(f">= {self.minimum:g}")
        if self.cap is not None:
            bounds.append(f"<= {getattr(limits.current(), self.cap):,} (limit {self.cap!r})")
        if bounds:
            what += f" {' and '.join(bounds)}" if not self.is_list else f" (each {' and '.join(bounds)})"
        return what + (" or null" if self.optional else "")

    def _element(self, kind: str, value: Any) -> Any:
        try:
            out = _scalar(kind, self.name, value)
        except ParamError as e:
            raise ParamError(f"{e}; valid: {self._valid()}") from None
        if self.choices is not None and out not in self.choices:
            if self.model_folders and is_model_folder(out):
                return _model_folder(self.name, out)
            raise ParamError(f"{self.name}={value!r} is not a valid choice; valid: {self._valid()}")
        if self.minimum is not None and out < self.minimum:
            raise ParamError(f"{self.name}={value!r} is below the minimum {self.minimum:g}; valid: {self._valid()}")
        if self.cap is not None:
            _checked(limits.check, self.cap, out, self.name, error=limits.LimitError)
        return out

    def check(self, value: Any) -> Any:
        """The value coerced to this parameter's kind, or ParamError naming it and the valid values."""
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")
                             and self.kind != "str"):
            if self.optional:
                return None
            raise ParamError(f"{self.name}={value!r}: a value is required; valid: {self._valid()}")
        if self.is_list:
            elem = self.kind[5:-1]
            if isinstance(value, str):
                text = value.strip()
                if text.startswith("["):
                    try:
                        value = json.loads(text)
                    except ValueError:
                        raise ParamError(f"{self.name}={value!r} is not a valid JSON list") from None
                else:
                    value = [v.strip() for v in text.split(",") if v.strip()]
            elif not isinstance(value, (list, tuple)):
                value = [value]
            if not value and not self.empty_ok:
                raise ParamError(f"{self.name}: the list is empty; valid: {self._valid()}")
            # before looking at the values: a list of a million is refused at once
            _checked(limits.check, "list_items", len(value), f"{self.name}: a list of {len(value)} values",
                     error=limits.LimitError)
            out = [self._element(elem, v) for v in value]
            # every element of a list parameter is a cell of the study: a repeat would measure the
            # same rows twice (and the table refuses duplicate measurements after the run)
            repeated = sorted({repr(v) for i, v in enumerate(out) if v in out[:i]})
            if repeated:
                raise ParamError(f"{self.name}={out!r} repeats {', '.join(repeated)}; give each value once")
        else:
            out = self._element(self.kind, value)
        if self.rule is not None:
            _checked(self.rule, out, prefix=f"{self.name}={out!r}: ")
        return out

    def take(self, value: Any) -> Any:
        """A value given for this parameter: `check`, then ``host_rule`` against this machine (ParamError)."""
        out = self.check(value)
        if self.host_rule is not None and out is not None:
            _checked(self.host_rule, out, prefix=f"{self.name}={out!r}: ")
        return out

    def literal(self, profile: str = "cpu") -> str:
        """The default as Python source for the notebook's parameters cell."""
        return repr(self.default(profile)).replace("'", '"')


class ParamSpec:
    """A study's parameters, in declaration order; ``device`` and ``run_dir`` are the framework's."""

    FRAMEWORK = ("device", "run_dir")

    def __init__(self, *params: Param, check: Callable[[dict], None] | None = None,
                 renamed: Mapping[str, str] | None = None):
        names = [p.name for p in params]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"parameters declared twice: {dup}")
        clash = [n for n in names if n in self.FRAMEWORK]
        if clash:
            raise ValueError(f"{clash} are set by the framework, not declared by a study")
        self.params = {p.name: p for p in params}
        self._check = check
        # old name -> declared name: a value given under a parameter's former name (an older run's
        # meta.json, a command from before the rename) is taken as the new one's
        self.renamed = dict(renamed or {})
        bad = {old: new for old, new in self.renamed.items() if new not in self.params or old in self.params}
        if bad:
            raise ValueError(f"renamed {bad}: each old name must be undeclared and name a declared parameter")

    def __iter__(self):
        return iter(self.params.values())

    @property
    def names(self) -> list[str]:
        return list(self.params)

    @property
    def accepted(self) -> set[str]:
        """Every key `resolve` takes: the declared names and their former ones (``renamed``)."""
        return set(self.params) | set(self.renamed)

    def defaults(self, profile: str) -> dict[str, Any]:
        if profile not in PROFILES:
            raise ParamError(f"unknown profile {profile!r}; valid: {', '.join(PROFILES)}")
        return {p.name: p.default(profile) for p in self}

    def resolve(self, overrides: Mapping[str, Any] | None = None, profile: str = "cpu",
                study: str = "") -> dict[str, Any]:
        """The profile's defaults with ``overrides`` applied, every value checked and coerced.

        Raises ParamError for an unknown name (listing the valid ones) or a bad value."""
        where = f"study {study!r}: " if study else ""
        overrides = self._renamed(dict(overrides or {}), where)
        unknown = sorted(k for k in overrides if k not in self.params)
        if unknown:
            raise ParamError(f"{where}no parameter {unknown}; valid: {', '.join(self.names)}")
        out = self.defaults(profile)
        for name, value in overrides.items():
            out[name] = _checked(self.params[name].take, value, prefix=where, error=ParamError)
        if "min_reps" in out and "reps" in out and out["min_reps"] > out["reps"]:
            if "min_reps" in overrides:     # a repetition cap below its minimum; a default minimum follows the cap
                raise ParamError(f"{where}min_reps={out['min_reps']} is above reps={out['reps']}, the most "
                                 "repetitions: give min_reps <= reps")
            out["min_reps"] = out["reps"]
        if self._check is not None:
            _checked(self._check, out, prefix=where)
        return out

    def _renamed(self, overrides: dict[str, Any], where: str) -> dict[str, Any]:
        for old, new in self.renamed.items():
            if old in overrides:
                if new in overrides:
                    raise ParamError(f"{where}{old!r} is the former name of {new!r}: give one of them, not both")
                overrides[new] = overrides.pop(old)
        return overrides

    def from_namespace(self, namespace: Mapping[str, Any], study: str = "") -> dict[str, Any]:
        """The declared parameters read from a notebook's globals (after papermill injected its
        values), checked: the notebook's second cell calls this so a bad value fails at once."""
        missing = [n for n in self.names if n not in namespace]
        if missing:
            raise ParamError(f"the notebook defines no {missing}: regenerate its parameters cell "
                             f"(python -m workbench notebooks)")
        return self.resolve({n: namespace[n] for n in self.names}, "cpu", study)

    def parameters_cell(self) -> str:
        """Source of the notebook cell tagged ``parameters``: the CPU defaults, one per line."""
        lines = ["# Parameters: generated from the study's declaration (python -m workbench notebooks);",
                 "# papermill overrides them. Defaults: the CPU profile (minutes on 2 cores)."]
        width = max(len(f"{p.name} = {p.literal()}") for p in self)
        for p in self:
            text = f"{p.name} = {p.literal()}"
            gpu, full = p.literal("gpu"), p.literal("gpu-full")
            note = p.help + (f" [gpu: {gpu}]" if gpu != p.literal() else "") + \
                (f" [gpu-full: {full}]" if full != gpu else "")
            lines.append(f"{text:<{width}}  # {note}" if note else text)
        lines.append('device = "auto"    # "auto" | "cpu" | "cuda"')
        lines.append("run_dir = None     # None: a new run folder under the project's results/")
        return "\n".join(lines)

    def describe(self, indent: str = "  ") -> str:
        """One line per parameter: name, kind, valid values, cpu and gpu defaults, help."""
        out = []
        for p in self:
            extra = f" choices: {', '.join(map(str, p.choices))};" if p.choices else ""
            gpu, full = p.literal("gpu"), p.literal("gpu-full")
            out.append(f"{indent}{p.name} ({p.kind}{', optional' if p.optional else ''}):{extra} "
                       f"cpu {p.literal()}" + (f", gpu {gpu}" if gpu != p.literal() else "")
                       + (f", gpu-full {full}" if full != gpu else "") + (f". {p.help}" if p.help else ""))
        return "\n".join(out)


def ascending_unique(values: Iterable[int]) -> None:
    """A rule for budget lists: strictly ascending."""
    values = list(values)
    if values != sorted(set(values)):
        raise ValueError("must be strictly ascending without repeats")


def fractions(values: Iterable[float]) -> None:
    """A rule for fill levels: each in (0, 1]."""
    bad = [v for v in values if not 0 < v <= 1]
    if bad:
        raise ValueError(f"{bad} are not fractions in (0, 1]")
