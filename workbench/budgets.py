"""Graph budgets: the merged-token sizes an encoder graph runner captures, as one validated type.

A user's budget list is checked once, where it enters (`Budgets.of`: the runner, the planner's
scores and its pool model accept and refuse the same lists with the same words); what comes out
is an ascending tuple of distinct positive ints within the caps, which the code that takes it
trusts.
"""
from __future__ import annotations

import itertools
import numbers

from . import limits


class Budgets(tuple):
    """Ascending, distinct budgets in merged tokens, each within the ``budget_tokens`` cap, at most
    ``budgets`` of them. Make one with `Budgets.of`; a Budgets is a tuple (``b[-1]`` is the
    largest)."""

    __slots__ = ()

    @classmethod
    def of(cls, budgets, what: str = "budgets", ascending: bool = False) -> "Budgets":
        """``budgets`` checked: a non-empty sequence of positive integers (numpy integers too),
        sorted and deduplicated; ``ascending=True`` refuses a list that is not already ascending
        and distinct instead (the runner: budgets listed out of order are a slip worth naming).
        A Budgets passes as it is."""
        if isinstance(budgets, Budgets):
            return budgets
        ndim = getattr(budgets, "ndim", 1)
        if isinstance(budgets, (str, bytes, numbers.Number)) or not hasattr(budgets, "__iter__") or ndim != 1:
            raise ValueError(f"{what} must be a list of positive integers (merged tokens), got {budgets!r}")
        cap = limits.current().budgets     # counted before a list exists: range(1, 10**12) is a sequence too
        if (size := limits.size_of(budgets)) is not None:
            limits.check("budgets", size, f"{what}: a list of {size:,} budgets")
        values = list(itertools.islice(budgets, cap + 1))
        if not values:
            raise ValueError(f"{what} is empty; give at least one budget in merged tokens, e.g. [64, 128, 256]")
        bad = [b for b in values if not limits.is_integer(b) or b < 1]
        if bad:
            raise ValueError(f"{what} must be positive integers (merged tokens); bad values: {bad[:8]}")
        limits.check("budgets", len(values), f"{what}: a list of {len(values)} budgets" if len(values) <= cap else
                     f"{what}: an iterable of more than {cap:,} budgets (counting stopped there)")
        for i, b in enumerate(values):
            limits.check("budget_tokens", int(b), f"{what}[{i}]={int(b)} merged tokens")
        values = [int(b) for b in values]
        if ascending:
            if values != sorted(values):
                raise ValueError(f"{what} must be sorted ascending, got {values}")
            if len(set(values)) != len(values):
                raise ValueError(f"{what} must not repeat, got {values}")
        return tuple.__new__(cls, sorted(set(values)))

    def holding(self, max_items: int) -> "Budgets":
        """These budgets, each raised to at least ``max_items`` (a runner's pack of max_items
        sequences needs one merged token each), deduplicated."""
        return tuple.__new__(Budgets, sorted({max(b, int(max_items)) for b in self}))

    def __repr__(self) -> str:
        return f"Budgets({list(self)})"
