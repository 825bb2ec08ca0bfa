"""The bounded caches the package keeps (`remember`: the most recently used entries, optionally within a byte bound),
and the bound of the host-side weight caches (`host_cache_bytes`). Imports no torch."""
from __future__ import annotations

import os


def remember(cache: dict, key, size: int, make, max_bytes: int | None = None):
    """``cache[key]``, made by ``make()`` when missing; the cache keeps the ``size`` most recently
    used entries (dicts keep insertion order: a hit moves to the end, the front is evicted) and, with
    ``max_bytes`` (values: lists or dicts of tensors), at most that many bytes of them in all (a value
    larger than that is returned, not kept)."""
    value = cache.pop(key, None)
    if value is None:
        value = make()
    if max_bytes is None or _tensor_bytes(value) <= max_bytes:
        cache[key] = value
    while len(cache) > size or (max_bytes is not None and sum(map(_tensor_bytes, cache.values())) > max_bytes):
        cache.pop(next(iter(cache)))
    return value


def _tensor_bytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in (value.values() if isinstance(value, dict) else value))


def host_cache_bytes() -> int:
    """What each of the host-side weight caches (`host_draws`, `checkpoints.load_vision_weights`) may hold: an
    eighth of this machine's memory, at most 16 GiB (4 GiB where the memory cannot be read)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 << 30
    return min(16 << 30, total // 8)
