"""Memory measured on a CUDA device: the bytes a captured callable parks in its graph pool and the
peak of an eager call (what workbench.memory_model predicts).

- `pool_segment_bytes`: the bytes of the allocator segments that belong to one graph pool.
- `captured_memory`: what capturing a callable into a fresh graph pool costs.
- `eager_peak_bytes`: the peak allocated bytes of one eager call.

Each raises RuntimeError without a GPU (callers decide whether that is fatal; no number is ever
invented).
"""
from __future__ import annotations

import gc

import torch

from .timing import require_cuda, warm_on_side_stream


def pool_segment_bytes(pool_id) -> int | None:
    """Bytes of the allocator segments that belong to graph pool ``pool_id`` (None if this torch's
    memory snapshot does not say which pool a segment belongs to)."""
    segments = torch.cuda.memory_snapshot()
    if segments and "segment_pool_id" not in segments[0]:
        return None
    return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id") or ()) == tuple(pool_id))


def captured_memory(fn, device, warmup: int = 2) -> dict:
    """What capturing ``fn`` into a fresh CUDA graph pool costs: dict(pool_bytes = bytes of the
    segments of the graph's own pool, per the allocator's memory snapshot; reserved_bytes =
    reserved bytes the capture added, the same figure from the global counter; peak_bytes = peak
    allocated bytes during the capture above what was allocated before; end_bytes = still
    allocated after).

    ``fn`` is warmed on the stream the capture then uses (Triton compiles; cuBLAS allocates one
    workspace per stream, which would otherwise land in the first pool captured on a new stream),
    then the cache is emptied so that only the capture's own segments are
    counted. A trivial graph is kept captured meanwhile: the first graph registered with the
    CUDA generator allocates its RNG seed and offset (2 x 512 B, outside the graph's pool, in
    whatever small segment has room), which is no part of what ``fn`` costs. The measured graph
    is kept alive until the counters are read, then released."""
    require_cuda("captured_memory")
    dev = torch.device(device)
    with torch.cuda.device(dev):
        stream = warm_on_side_stream(fn, warmup)
        tiny = torch.zeros(1, device=dev)
        keeper = torch.cuda.CUDAGraph()
        with torch.cuda.graph(keeper, stream=stream):
            tiny.add_(1)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        reserved0, allocated0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            result = fn()
        torch.cuda.synchronize()
        reserved = torch.cuda.memory_reserved() - reserved0
        own = pool_segment_bytes(graph.pool())
        out = dict(pool_bytes=reserved if own is None else own, reserved_bytes=reserved,
                   peak_bytes=torch.cuda.max_memory_allocated() - allocated0,
                   end_bytes=torch.cuda.memory_allocated() - allocated0)
        del result, graph, keeper
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return out


def eager_peak_bytes(fn, device) -> dict:
    """Peak allocated bytes of one eager call of ``fn`` above what was allocated before (CUDA),
    and what stayed allocated after it: dict(peak_bytes, end_bytes)."""
    require_cuda("eager_peak_bytes")
    with torch.cuda.device(torch.device(device)):
        torch.cuda.synchronize()
        allocated0 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        torch.cuda.synchronize()
        out = dict(peak_bytes=torch.cuda.max_memory_allocated() - allocated0,
                   end_bytes=torch.cuda.memory_allocated() - allocated0)
        del result
    return out
