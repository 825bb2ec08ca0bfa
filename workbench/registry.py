"""One rule for the registries of studies and benchmarks (light: no torch, no pandas)."""
from __future__ import annotations


def register_once(registry: dict, item, what: str, origin: str):
    """Put ``item`` into ``registry`` under ``item.name``. The same name from another object is an
    error unless both come from the same module (``origin``: the attribute naming the function
    whose module says where an item was defined): re-importing a module registers again."""
    old = registry.get(item.name)
    if old is not None and old is not item and (
            getattr(getattr(old, origin), "__module__", None) != getattr(getattr(item, origin), "__module__", None)):
        raise ValueError(f"{what} {item.name!r} is registered twice")
    registry[item.name] = item
    return item
