"""Caps on every size a user can ask for, checked before anything is allocated.

A typo in a size (one zero too many in a budget, 10000 frames instead of 100) must end in an error
that names the value and the cap, not in a machine that swaps for an hour or a process the kernel
kills without a word. Each cap here is generous for real work (the largest published towers,
videos at the engines' own frame cap) and small enough that one item or one cell fits a host or an
accelerator. Raise one on purpose:

    WORKBENCH_LIMITS="frames=2000,budget_tokens=131072" python -m workbench sweep ...

or, in Python, for a block of code::

    with wb.limits.raised(frames=2000):
        batch = wb.preprocess(videos, cfg)

`check(name, value, what)` raises `LimitError` (a ValueError) whose message names the value, the
cap and both ways to raise it.

A malformed variable never stops an import: what the package ships (its presets, checked against
the caps as they load) is checked against the defaults (`shipped`), so ``import workbench`` works and
the command line can say what is wrong instead of a traceback; the first size checked after that
ends in `LimitsEnvError` (a ValueError) naming the variable, its value and the form it takes.

`integer(value, what, minimum, cap)` checks a count or a size where it enters the public API (an
integer, numpy's included, never a bool, at least `minimum`, within the cap) and `seed(value)` a
random seed, so every entry point words these errors alike.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
import os
import sys
from dataclasses import dataclass
from typing import Iterator

LIMITS_ENV = "WORKBENCH_LIMITS"


@dataclass(frozen=True)
class Limits:
    """The caps (each an inclusive maximum)."""

    frames: int = 768                     # frames of one video (the engines' video sampling cap)
    input_pixels: int = 1 << 27           # H*W of one decoded image or frame before resizing (~11585^2)
    frame_pixels: int = 1 << 24           # the processor's min_pixels / max_pixels (H*W after resizing, ~4096^2)
    item_rows: int = 1 << 18              # patch rows of one item after resizing (65536 merged tokens)
    batch_rows: int = 1 << 20             # patch rows of one batch (1.2 GB of uint8 rows at patch 14)
    budget_tokens: int = 1 << 16          # merged tokens of one graph budget (4 patch rows each)
    budgets: int = 64                     # graph budgets of one runner or one sweep list
    graphs: int = 4096                    # CUDA graphs one runner keeps captured (budgets + exact-fit variants)
    items: int = 4096                     # items of one batch, one mix draw, one sweep cell
    reps: int = 100_000                   # timed repetitions or warm-up calls of one measurement
    world_size: int = 64                  # ranks of the data-parallel path
    depth: int = 256                      # blocks of one tower
    seed: int = (1 << 32) - 1             # random seeds (numpy's range)
    tower_params: int = 1 << 32           # parameters of one tower (checkpoint shapes; 17 GB in fp32)
    patch_dim: int = 1 << 12              # columns of one patch row, C*T*P*P (what turns rows into bytes)
    total_pixels: int = 1 << 31           # decoded pixels one sample_video / image_mix call makes (T*H*W summed)
    draws: int = 1 << 22                  # sizes one mix_sizes / mix_tokens call draws (records, no pixels)
    list_items: int = 64                  # values of one list parameter of a study (a sweep axis)
    folder_images: int = 1 << 16          # image files one folder mix reads (each decoded once; samples.get_mix)
    threads: int = 1024                   # host threads of one preprocessing call (also: the cores there)
    workers: int = 1024                   # worker processes: the serving model's host processors, a sweep's --workers
    sim_requests: int = 1_000_000         # requests the serving model simulates per arrival rate
    shards: int = 4096                    # shards of one sharded sweep (--shard I/N: N, a job array's task count)
    plan_sizes: int = 4096                # distinct item sizes one budget plan weighs (its programme is quadratic)
    pool_plan_sizes: int = 256            # the same under a pool limit (a Pareto front per state: far more work)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_env(cls, text: str | None = None) -> "Limits":
        """The defaults with ``$WORKBENCH_LIMITS`` (``name=value,...``) applied; LimitsEnvError where it is
        malformed."""
        return _parse(os.environ.get(LIMITS_ENV, "") if text is None else text)


def expected_form() -> str:
    """What ``$WORKBENCH_LIMITS`` holds, for the error messages."""
    return (f"comma-separated NAME=VALUE pairs, each NAME one of {', '.join(Limits.names())} and each VALUE a "
            f"whole number >= 1, e.g. {LIMITS_ENV}=frames=2000,budget_tokens=131072")


class LimitsEnvError(ValueError):
    """A malformed ``$WORKBENCH_LIMITS``: the message names the variable, its value and the form it takes."""


@functools.lru_cache(maxsize=16)
def _parse(text: str) -> Limits:
    """The caps ``text`` sets over the defaults (cached: every size checked looks the caps up)."""
    changes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in Limits.names():
            raise LimitsEnvError(f"{LIMITS_ENV}={text!r}: {part!r} is not NAME=VALUE with a known NAME; "
                                 f"expected {expected_form()}")
        digits = value.replace("_", "")
        number = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 30 else 0
        if number < 1:
            raise LimitsEnvError(f"{LIMITS_ENV}={text!r}: {name} must be a positive integer (at most 30 digits), "
                                 f"got {value!r}; expected {expected_form()}")
        changes[name] = number
    return dataclasses.replace(Limits(), **changes)


@contextlib.contextmanager
def shipped() -> Iterator[Limits]:
    """The default caps, whatever the variable says, for the code inside the ``with`` block: what the
    package ships (its presets) is checked against them as it loads, so a malformed variable never stops an
    import; the first size a user's call checks names the variable instead."""
    global _current
    before, _current = _current, Limits()
    try:
        yield _current
    finally:
        _current = before


class LimitError(ValueError):
    """A size above its cap (see workbench.limits)."""


_current: Limits | None = None


def current() -> Limits:
    """The caps in force: ``$WORKBENCH_LIMITS`` over the defaults, or what `raised` set."""
    return _current if _current is not None else Limits.from_env()


@contextlib.contextmanager
def raised(**caps: int) -> Iterator[Limits]:
    """Raise (or lower) some caps for the code inside the ``with`` block."""
    global _current
    unknown = sorted(set(caps) - set(Limits.names()))
    if unknown:
        raise ValueError(f"no limit named {unknown}; valid: {', '.join(Limits.names())}")
    before = _current
    _current = dataclasses.replace(current(), **{k: integer(v, k) for k, v in caps.items()})
    try:
        yield _current
    finally:
        _current = before


def check(name: str, value: int, what: str) -> int:
    """``value`` when it is within the cap ``name``; LimitError otherwise, naming both and how to
    raise the cap (``what`` says what the value is, e.g. "budget 1000000 merged tokens")."""
    cap = getattr(current(), name)
    if value > cap:
        raise LimitError(f"{what}: {value:,} exceeds the cap of {cap:,} (limit {name!r}); raise it on purpose "
                         f"with {LIMITS_ENV}={name}=N or `with workbench.limits.raised({name}=N):`")
    return value


def is_integer(value) -> bool:
    """An integer (numpy integers too), not a bool: a bool is not a count."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(value, what: str, minimum: int = 1, cap: str | None = None) -> int:
    """``value`` as an int when it is an integer (numpy integers too; a bool is not a count) of at
    least ``minimum`` and, with ``cap``, within that cap; ValueError (LimitError above the cap)
    naming ``what`` and the value otherwise. NaN, inf and 2.0 are refused here, not later as a raw
    TypeError from `range` or an allocation."""
    if not is_integer(value) or value < minimum:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        bound = f" (at most {getattr(current(), cap):,}, limit {cap!r})" if cap else ""
        raise ValueError(f"{what}={value!r} must be {kind}{bound}")
    value = int(value)
    if cap is not None:
        check(cap, value, f"{what}={value}")
    return value


def size_of(values) -> int | None:
    """How many values ``values`` says it holds (its len; a range's true length, also past what len() can return),
    None where it says nothing (an iterator: count it as it is taken, at most a cap plus one)."""
    if isinstance(values, range):
        return max(0, -(-(values.stop - values.start) // values.step))
    if not hasattr(values, "__len__"):
        return None
    try:
        return len(values)
    except OverflowError:      # a length beyond an index: more than any cap
        return sys.maxsize + 1


def seed(value, what: str = "seed") -> int:
    """A random seed: an integer 0..cap (numpy's generators take no negative seed)."""
    return integer(value, what, minimum=0, cap="seed")


# the spellings an on/off environment variable takes (case and surrounding spaces aside); empty is unset
SWITCH_ON, SWITCH_OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
REUSE_LAUNCHES_ENV = "WORKBENCH_REUSE_LAUNCHES"     # interpreted Triton launches reused (norm_kernels)
PROGRESS_ENV = "WORKBENCH_PROGRESS"                 # progress bars shown (studies.plotting)
SWITCHES = {REUSE_LAUNCHES_ENV: True, PROGRESS_ENV: True}     # every on/off variable the package reads: its default


def switch(name: str, default: bool) -> bool:
    """The on/off environment variable ``name``: ``default`` where it is unset or empty, else one of
    SWITCH_ON / SWITCH_OFF in any case with spaces around; ValueError naming the variable, its value and the
    accepted values otherwise (a typo such as "flase" never silently means on)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in SWITCH_ON or value in SWITCH_OFF:
        return value in SWITCH_ON
    raise ValueError(f"{name}={raw!r} is neither on nor off; accepted, in any case: {', '.join(SWITCH_ON)} (on), "
                     f"{', '.join(SWITCH_OFF)} (off), or unset for the default ({'on' if default else 'off'})")


def check_switches() -> None:
    """Every variable of SWITCHES read once: the command line calls it first, so that a value that is neither on
    nor off is named before any work, not where a study first reads it."""
    for name, default in SWITCHES.items():
        switch(name, default)


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask, where the OS has one): the bound on
    every thread or worker count a user asks for."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def within_cores(n: int, what: str) -> int:
    """``n`` if this process may run on at least ``n`` cores, else ValueError naming ``what``, the
    value and the valid range (a thread count asked of the machine that runs it)."""
    cores = cpu_count()
    if n > cores:
        raise ValueError(f"{what}={n} exceeds the {cores} cores this process may run on; valid: 1..{cores}")
    return n
