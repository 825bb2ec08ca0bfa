"""The memory model of the input path: what one norm call moves and allocates, and what the CUDA
caching allocator reserves for it.

- `count_allocations`: the allocations and frees a call makes, in order, counted from a real call
  with a dispatch mode (works on the meta device, so a real 16384-token budget is sized without
  memory); each norm derives the same trace from its code (`workbench.norms.InputNorm.alloc_trace`,
  with its byte model `traffic`); `trace_peak_bytes` reads peaks off a trace.
- `PoolModel` / `pool_model`: torch's CUDA caching allocator rules, replayed over a trace: the
  graph-pool bytes a captured call reserves.

Pure functions, no device needed; workbench.cuda_memory measures the same quantities on a GPU.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


class _Counter(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every fresh tensor an op returns (aliases and in-place results skipped) and the
    moment its memory is freed (a weakref callback on its storage)."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int, int]] = []
        self._next = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for r, t in zip(returns, outs):
            if not isinstance(t, torch.Tensor) or r.alias_info is not None:
                continue
            nbytes = t.untyped_storage().nbytes()
            k = self._next
            self._next += 1
            self.events.append(("alloc", k, nbytes))
            # the storage, not the tensor: a view (q, k, v of one qkv output) keeps the memory
            # alive after the tensor that owned it dies; torch keeps one Python storage object
            # per storage, which dies with the last tensor or view on it
            weakref.finalize(t.untyped_storage(), self.events.append, ("free", k, nbytes))
        return out


def count_allocations(fn) -> tuple[list[tuple[str, int, int]], object]:
    """Run ``fn()`` and return (its allocation trace, its result), in `InputNorm.alloc_trace`'s form.

    Counted with a TorchDispatchMode: every non-aliasing op output is an allocation, freed when
    the Python tensor dies. Works on CPU tensors and on the meta device (no memory is used)."""
    counter = _Counter()
    with counter:
        result = fn()
    return counter.events, result


def trace_peak_bytes(trace) -> dict:
    """Peak live bytes of a trace, the bytes still live at its end (the output), and the peak of
    the temporaries alone (allocations freed before the end); exact sizes, no rounding."""
    freed = {k for kind, k, _ in trace if kind == "free"}
    live = peak = temp = temp_peak = 0
    for kind, k, nbytes in trace:
        sign = 1 if kind == "alloc" else -1
        live += sign * nbytes
        if k in freed:
            temp += sign * nbytes
        peak, temp_peak = max(peak, live), max(temp_peak, temp)
    return dict(peak_bytes=peak, end_bytes=live, temp_peak_bytes=temp_peak)


# ---- torch's CUDA caching allocator, as a model ---------------------------------------------

@dataclass
class _Block:
    seg: int
    offset: int
    size: int
    free: bool = True


class PoolModel:
    """torch's CUDA caching allocator (default settings, no expandable segments), replayed over
    an allocation trace for one private graph pool; gives the bytes the pool reserves.

    The rules it follows (c10/cuda/CUDACachingAllocator): sizes round up to 512 B; requests up to
    1 MiB come from the small pool (2 MiB segments), larger ones from the large pool, where a
    request under 10 MiB gets a 20 MiB segment and a larger one its own segment rounded up to
    2 MiB; a request takes the smallest free block that fits (best fit) and splits it when the
    rest is >= 512 B (small) or > 1 MiB (large); a freed block merges with free neighbours of its
    segment. Blocks freed during a capture are reused by later allocations of the same capture.
    """

    MIN_BLOCK = 512
    SMALL_SIZE = 1 << 20
    SMALL_BUFFER = 2 << 20
    LARGE_BUFFER = 20 << 20
    MIN_LARGE_ALLOC = 10 << 20
    ROUND_LARGE = 2 << 20

    def __init__(self):
        self.segments: list[list[_Block]] = []
        self.small: list[bool] = []
        self.reserved = self.allocated = self.peak_allocated = 0
        self._held: dict[int, _Block] = {}

    @classmethod
    def round_size(cls, nbytes: int) -> int:
        return max(cls.MIN_BLOCK, -(-nbytes // cls.MIN_BLOCK) * cls.MIN_BLOCK)

    @classmethod
    def segment_size(cls, size: int) -> int:
        if size <= cls.SMALL_SIZE:
            return cls.SMALL_BUFFER
        if size < cls.MIN_LARGE_ALLOC:
            return cls.LARGE_BUFFER
        return -(-size // cls.ROUND_LARGE) * cls.ROUND_LARGE

    def malloc(self, key: int, nbytes: int) -> None:
        size = self.round_size(nbytes)
        small = size <= self.SMALL_SIZE
        fits = [b for s, seg in enumerate(self.segments) if self.small[s] == small
                for b in seg if b.free and b.size >= size]
        if fits:
            block = min(fits, key=lambda b: (b.size, b.seg, b.offset))
        else:
            seg_size = self.segment_size(size)
            block = _Block(len(self.segments), 0, seg_size)
            self.segments.append([block])
            self.small.append(small)
            self.reserved += seg_size
        rest = block.size - size
        if (small and rest >= self.MIN_BLOCK) or (not small and rest > self.SMALL_SIZE):
            seg = self.segments[block.seg]
            tail = _Block(block.seg, block.offset + size, rest)
            seg.insert(seg.index(block) + 1, tail)
            block.size = size
        block.free = False
        self._held[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        block = self._held.pop(key)
        block.free = True
        self.allocated -= block.size
        seg = self.segments[block.seg]
        i = seg.index(block)
        if i + 1 < len(seg) and seg[i + 1].free:
            block.size += seg.pop(i + 1).size
        if i > 0 and seg[i - 1].free:
            prev = seg[i - 1]
            prev.size += block.size
            seg.pop(i)

    def run(self, trace) -> "PoolModel":
        for kind, key, nbytes in trace:
            if kind == "alloc":
                self.malloc(key, nbytes)
            else:
                self.free(key)
        return self


def pool_model(trace) -> dict:
    """`PoolModel` over ``trace``: dict(pool_bytes reserved, peak_bytes allocated, end_bytes)."""
    m = PoolModel().run(trace)
    return dict(pool_bytes=m.reserved, peak_bytes=m.peak_allocated, end_bytes=m.allocated)
