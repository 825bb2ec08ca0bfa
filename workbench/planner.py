"""Exact token-budget planning for the encoder graph runner.

The runner (workbench.runner) replays each pack in the smallest captured budget that fits it;
here every item is taken as replayed *alone* (the single-item view: a lower bound on what packing
can save, and exactly the case of one image per request). For a distribution of per-item merged
tokens, `plan_budgets` picks the budget set (at most ``max_graphs`` budgets, covering the largest
item) that minimizes the expected padded tokens per item, or, given a latency table, the expected
replay time; optionally under a limit on the CUDA-graph memory pool those budgets need
(`graph_pool_bytes`). `expected_padding` scores any budget set; `geometric_budgets` is a denser
ladder than the engines' powers of two (`runner.default_budgets`).

Why the optimum is found exactly: moving a budget down to the largest item it serves never raises
the cost (padding shrinks; replay time is non-decreasing in the budget) nor the pool, so some
optimal set consists of item sizes and includes the largest one. With the distinct sizes
s_0 < ... < s_{n-1}, probabilities p_k and the previous budget at index i, a budget at index j
serves the items i < k <= j at cost  c_j * (P_j - P_i) - (S_j - S_i)  (prefix sums P of p and S
of p*s; c_j = s_j for padding, c_j = L(s_j) and no S term for latency). A dynamic programme over
(budgets used, last budget) finds the optimum in O(max_graphs * n^2) vectorized operations; with a
pool limit it keeps, per state, the Pareto front of (cost, pool bytes of the budgets below). n is capped
(limits ``plan_sizes``, ``pool_plan_sizes``): more distinct sizes are refused, naming the count, not planned for hours.
"""
from __future__ import annotations

import functools
import itertools
import math
import numbers
from collections.abc import Callable, Mapping

import numpy as np

from . import limits
from .budgets import Budgets
from .checkpoints import resolve_config
from .config import VisionConfig

__all__ = ["plan_budgets", "expected_padding", "geometric_budgets", "graph_pool_bytes", "capture_pool_bytes",
           "running_max"]


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def _distribution(mix, cfg=None) -> tuple[np.ndarray, np.ndarray]:
    """(ascending distinct token counts int64, probabilities float64 summing to 1)."""
    if isinstance(mix, str):
        from .samples import mix_distribution
        pairs = mix_distribution(mix, cfg)       # unknown names: ValueError naming the valid ones
    elif isinstance(mix, Mapping):
        pairs = list(mix.items())
        bad_w = [(k, w) for k, w in pairs
                 if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0]
        if bad_w:
            raise ValueError(f"mix weights must be finite numbers > 0; bad (tokens, weight): {bad_w[:8]}")
    elif isinstance(mix, (bytes, bytearray)) or not hasattr(mix, "__iter__"):
        raise TypeError(f"mix must be a sequence of per-item merged-token counts, a mapping tokens -> weight "
                        f"or an image-mix name, got {type(mix).__name__}")
    else:       # counted before a list of them exists: range(1, 10**10) is a sequence too
        if (size := limits.size_of(mix)) is not None:
            limits.check("draws", size, f"mix: {size:,} per-item merged-token counts")
            items = mix.tolist() if isinstance(mix, np.ndarray) else list(mix)
        else:
            cap = limits.current().draws
            items = list(itertools.islice(mix, cap + 1))
            limits.check("draws", len(items), f"mix: an iterable of more than {cap:,} per-item merged-token counts "
                                              f"(counting stopped there)")
        pairs = [(t, 1.0) for t in items]
    if not pairs:
        raise ValueError("mix is empty: give at least one item (merged-token count)")
    bad = [t for t, _ in pairs if not limits.is_integer(t) or t <= 0]
    if bad:
        raise ValueError(f"token counts must be positive integers (merged tokens per item); bad: {bad[:8]}")
    acc: dict[int, float] = {}
    for t, w in pairs:
        acc[int(t)] = acc.get(int(t), 0.0) + float(w)
    sizes = np.array(sorted(acc), dtype=np.int64)
    probs = np.array([acc[s] for s in sizes.tolist()], dtype=np.float64)
    with np.errstate(over="ignore"):
        total = float(probs.sum())
    if not math.isfinite(total) or not np.all(np.isfinite(probs)):
        # an infinite total makes every probability 0 (or NaN): a plan over nothing, silently
        raise ValueError(f"mix weights sum to {total} (largest {float(probs.max())!r}), beyond float64: weights "
                         f"are relative, give finite ones whose sum is finite too (counts or probabilities)")
    return sizes, probs / total


def _time(value, where: str, minimum: float = 0.0) -> float:
    """``value`` as a replay time: a finite number >= ``minimum`` (a bool, a string, NaN, inf or a negative
    time is no time a replay can take: refused, naming ``where`` it came from and the value)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < minimum:
        raise ValueError(f"{where} = {value!r}: a replay time must be a finite number >= 0")
    return float(value)


def running_max(table: Mapping[int, float]) -> dict[int, float]:
    """The running maximum of a measured (budget -> time) table, in budget order: what `latency`
    must be (non-decreasing in the budget) when timing noise put a larger budget a hair below a
    smaller one (on a loaded CPU by far more). A NaN, infinite or negative time is refused, not
    passed over (``max`` would drop a NaN silently)."""
    out, top = {}, -math.inf
    for b in sorted(table):
        top = max(top, _time(table[b], f"latency table time at budget {b!r}"))
        out[b] = top
    return out


def _latency_fn(latency) -> Callable[[np.ndarray], np.ndarray]:
    """A vectorized tokens -> replay time from a table {budget: time} or a callable."""
    if callable(latency):       # negative values are refused by `_times`, once a decreasing curve has been named
        def f(x):
            return np.array([_time(latency(int(v)), f"latency({int(v)})", -math.inf) for v in np.asarray(x).tolist()],
                            dtype=np.float64)
        return f
    if not isinstance(latency, Mapping) or not latency:
        raise TypeError(f"latency must be a non-empty mapping budget -> replay time or a callable "
                        f"tokens -> time, got {latency!r}")
    keys = list(latency)
    bad = [k for k in keys if not limits.is_integer(k) or k <= 0]
    if bad:
        raise ValueError(f"latency table keys must be positive integer budgets (merged tokens); bad: {bad}")
    xs = np.array(sorted(int(k) for k in keys), dtype=np.float64)
    ys = np.array([_time(latency[k], f"latency table time at budget {k!r}") for k in sorted(keys)], dtype=np.float64)
    down = np.nonzero(np.diff(ys) < 0)[0]
    if down.size:
        i = int(down[0])
        raise ValueError(f"latency table must be non-decreasing in the budget: {int(xs[i])} -> {ys[i]} but "
                         f"{int(xs[i + 1])} -> {ys[i + 1]} (a larger budget that replays faster); fix or "
                         f"smooth the measurement (planner.running_max)")

    def f(x):
        x = np.asarray(x, dtype=np.float64)
        y = np.interp(x, xs, ys)                  # linear inside, flat below the first point
        if xs.size > 1:                           # above the last point: the last segment's slope
            with np.errstate(over="ignore", invalid="ignore"):
                slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
                y = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), y)
            if not np.all(np.isfinite(y)):
                at = int(x[~np.isfinite(y)][0])
                raise ValueError(f"latency table extrapolated to {at} tokens overflows float64 (last points "
                                 f"{int(xs[-2])} -> {float(ys[-2])!r}, {int(xs[-1])} -> {float(ys[-1])!r}): give "
                                 f"times in a larger unit or a table point at or above {at}")
        return y
    return f


def _times(latency, tokens: np.ndarray, increasing: bool) -> np.ndarray:
    """``latency`` (as plan_budgets takes it) at ascending ``tokens``, each a finite time >= 0, and with
    ``increasing`` never decreasing; a ValueError naming the first that is not."""
    t = _latency_fn(latency)(tokens)
    down = np.nonzero(np.diff(t) < 0)[0] if increasing else []
    if len(down):
        i = int(down[0])
        raise ValueError(f"latency must be non-decreasing in tokens: {int(tokens[i])} -> {t[i]} but "
                         f"{int(tokens[i + 1])} -> {t[i + 1]}")
    neg = np.nonzero(t < 0)[0]
    if neg.size:                                  # raises, naming the first
        _time(float(t[neg[0]]), f"latency({int(tokens[neg[0]])})")
    return t


def _check_summable(times: np.ndarray) -> None:
    """The programme adds and subtracts a few expected times (each at most the largest): times near the
    float64 maximum would overflow to inf or NaN there and pick an arbitrary plan."""
    top = float(times.max())
    if not math.isfinite(top * 4):
        raise ValueError(f"latency times up to {top!r} are too large to add up in float64: give them in a "
                         f"larger unit (ms instead of ns)")


def _check_max_graphs(max_graphs) -> int:
    if not limits.is_integer(max_graphs) or max_graphs < 1:
        raise ValueError(f"max_graphs must be an integer >= 1 (the most budgets to capture), got {max_graphs!r}")
    return limits.check("budgets", int(max_graphs), f"max_graphs={int(max_graphs)} budgets")


# ---------------------------------------------------------------------------------------------
# the graph-pool model
# ---------------------------------------------------------------------------------------------
def capture_trace(cfg: VisionConfig, budget: int, dtype, norm: str | None, buffer_dtype, max_items: int) -> list:
    """The allocation trace (`memory_model.count_allocations`) of one budget's capture forward,
    counted on the meta device with the kernels a CUDA tower of ``dtype`` runs: what
    `graph_pool_bytes` models (arguments as there, already checked)."""
    import torch

    from .norms import make_norm
    from .towers import build_tower

    input_norm = make_norm(norm, cfg, check_values=False) if norm is not None else None
    with torch.device("meta"):
        tower = build_tower(cfg, input_norm=input_norm, device_norm=norm is not None, attn_backend="auto")
    tower = tower.to(device="meta", dtype=dtype)
    # the kernels a CUDA tower of this dtype runs ('auto' resolved for CUDA): flash varlen
    # attention and the fused block kernels for fp16/bf16, dense masked SDPA and plain torch
    # otherwise; all have meta kernels
    tower.resolve_kernels(device="cuda")
    return forward_trace(tower, budget, max_items, buffer_dtype, "meta")


def forward_trace(tower, budget: int, max_items: int, buffer_dtype, device) -> list:
    """The allocation trace of ``tower``'s forward over the shapes a runner captures ``budget``
    with (`prepare_capture`), on ``device`` (meta: no memory)."""
    import torch

    from .memory_model import count_allocations

    meta = tower.prepare_capture(budget, max_items, device=device)
    pixels = torch.zeros(budget * tower.cfg.merge_unit, tower.cfg.patch_dim, dtype=buffer_dtype, device=device)
    with torch.inference_mode():
        trace, out = count_allocations(lambda: tower.forward_prepared(pixels, meta))
    del out
    return trace


@functools.lru_cache(maxsize=128)
def _capture_trace_pool(cfg, budget: int, dtype, norm, buffer_dtype, max_items: int) -> int:
    from .memory_model import pool_model
    return pool_model(capture_trace(cfg, budget, dtype, norm, buffer_dtype, max_items))["pool_bytes"]


def capture_pool_bytes(cfg, budget: int, dtype=None, norm: str | None = None, buffer_dtype=None,
                       max_items: int = 16) -> int:
    """Bytes a fresh graph pool reserves when one budget's tower forward is captured into it
    (intermediates freed back to the pool, the static output kept): see `graph_pool_bytes`."""
    import torch
    cfg = resolve_config(cfg)
    dtype = torch.bfloat16 if dtype is None else dtype
    buffer_dtype = (torch.uint8 if norm is not None else dtype) if buffer_dtype is None else buffer_dtype
    budget = limits.integer(budget, "budget", cap="budget_tokens")
    max_items = limits.integer(max_items, "max_items", cap="items")
    return _capture_trace_pool(cfg, budget, dtype, norm, buffer_dtype, max_items)


def _output_bytes(cfg, budget: int, dtype) -> int:
    import torch

    from .memory_model import PoolModel
    return PoolModel.round_size(budget * cfg.embed_width * torch.empty((), dtype=dtype).element_size())


def graph_pool_bytes(cfg, budgets, dtype=None, max_items: int = 16, norm: str | None = None,
                     buffer_dtype=None) -> int:
    """Modelled bytes of the one CUDA-graph memory pool that an EncoderGraphRunner with these
    budgets reserves.

    The runner captures every budget into one shared pool, largest first, and keeps each graph's
    static output ([budget, embed_width] in the tower dtype). A capture's intermediates are freed
    back to the pool and reused by the next (smaller) capture, so the model is

        pool = capture_pool_bytes(largest budget) + sum over the other budgets of their output
               bytes (rounded up to the allocator's 512 B blocks).

    capture_pool_bytes comes from the tower's own code, not from a formula: the tower is built on
    the 'meta' device (no memory), its `forward_prepared` over the runner's capture shapes (a
    dummy grid filling the budget, cfg.merge_unit * budget rows) runs under
    `memory_model.count_allocations` in inference mode, with the attention op a CUDA tower of that
    dtype uses (torch's flash `varlen_attn` for bf16/fp16, which has a meta kernel; the dense
    masked SDPA for fp32), and the allocation trace is replayed through `memory_model.PoolModel`
    (torch's caching-allocator rules: 512 B rounding, 2/20 MiB segments, best fit, splitting and
    coalescing) to give the bytes the pool reserves.

    dtype: the tower dtype (default bf16). norm: the tower's first-op norm (a wb.NORMS name; the eager norm's fp32
    temporaries then appear in the trace) or None (no norm in the graph); buffer_dtype: the static pixel buffer's
    dtype (default uint8 with a norm, else `dtype`; a buffer dtype other than the tower dtype adds the cast).
    max_items sizes only metadata (cu_seqlens), which the runner allocates outside the pool, so it changes nothing
    here.

    Limits: the padding_waste reference runs compare the model with the measured pool of every runner they build,
    and the pool probe of docs/probes.md one budget's graph alone (results/reference/README.md gives the ratios);
    the model can be above or below, so leave headroom either way. Runners of several budgets measured below it: the
    smaller captures, outputs included, fit in the space the largest one left. The traces themselves are exact (the
    CUDA tower's dispatch trace equals the meta one, allocation for allocation; for qwen2-vl-7b its peak equals the
    measured peak allocation, and for qwen3-vl-8b one graph's pool equals the model to the byte, while on
    glm-4.1v-9b the allocator places the same trace in fewer bytes); what the trace cannot see is memory a kernel
    allocates inside one op (Qwen2.5-VL's windowed flash-attention blocks allocate ~7 KB per row that no op
    returns), and the allocator's segment placement across several captures differs from the model by up to one
    20 MiB segment. The smaller captures' outputs are counted on top of the largest capture's pool. cuBLAS workspaces,
    Triton compilation and the graph's RNG state are outside the pool (the runner warms up on the stream it captures
    on). Give max_pool_bytes some headroom accordingly.
    """
    import torch
    cfg = resolve_config(cfg)
    dtype = torch.bfloat16 if dtype is None else dtype
    budgets = Budgets.of(budgets)
    max_items = limits.integer(max_items, "max_items", cap="items")
    total = capture_pool_bytes(cfg, budgets[-1], dtype, norm, buffer_dtype, max_items)
    return total + sum(_output_bytes(cfg, b, dtype) for b in budgets[:-1])


# ---------------------------------------------------------------------------------------------
# the dynamic programme
# ---------------------------------------------------------------------------------------------
_CHUNK = 256


def _dp(c: np.ndarray, P: np.ndarray, S: np.ndarray, G: int):
    """Unconstrained optimum. c[j]: per-item cost of budget j (s_j or L(s_j)); P, S: prefix sums
    of length n+1 (S is zero for latency). Returns (cost of each budget count g = 1..G, argmin
    tables) where layer g's value at j is the best cost of g budgets, the largest at j."""
    n = c.size
    f = c * P[1:] - S[1:]                      # one budget at j serves every size <= s_j
    layers, args = [f], []
    idx = np.arange(n)
    for _ in range(2, G + 1):
        a = f + S[1:]                          # f_{g-1}[i] + S_{i}  (prefix up to and including i)
        b = P[1:]
        new = np.full(n, np.inf)
        arg = np.full(n, -1, dtype=np.int64)
        for j0 in range(1, n, _CHUNK):
            j1 = min(n, j0 + _CHUNK)
            m = a[None, :j1 - 1] - c[j0:j1, None] * b[None, :j1 - 1]          # [j, i], i < j1-1
            m[idx[None, :j1 - 1] >= idx[j0:j1, None]] = np.inf                # only i < j
            k = np.argmin(m, axis=1)
            new[j0:j1] = m[np.arange(j1 - j0), k] + c[j0:j1] * P[j0 + 1:j1 + 1] - S[j0 + 1:j1 + 1]
            arg[j0:j1] = k
        layers.append(new)
        args.append(arg)
        f = new
    return layers, args


def _pareto_dp(c, P, S, G, out_b, cap):
    """Constrained optimum: fronts of (cost, sum of output bytes of the budgets below the current
    largest) per (g, j); entries above `cap` are dropped, dominated ones too. Returns the best
    (cost, g, budget indices) over all g with the largest budget at n-1, or None."""
    n = c.size
    # layer arrays: j, cost, out, parent (index into the previous layer's arrays)
    j = np.arange(n)
    layer = (j, c * P[1:] - S[1:], np.zeros(n), np.full(n, -1))
    layers = [layer]
    for _ in range(2, G + 1):
        lj, lc, lo, _ = layers[-1]
        nj, nc, no, npar = [], [], [], []
        add_out = lo + out_b[lj]                                  # the old largest becomes a lower budget
        keep = add_out <= cap
        base_idx = np.nonzero(keep)[0]
        bj, bc, bo = lj[keep], lc[keep] + S[lj[keep] + 1], add_out[keep]
        bp = P[bj + 1]
        for t in range(1, n):
            sel = bj < t
            if not sel.any():
                continue
            cost = bc[sel] - c[t] * bp[sel] + c[t] * P[t + 1] - S[t + 1]
            outs = bo[sel]
            src = base_idx[sel]
            order = np.lexsort((cost, outs))                      # by out, then cost
            cost, outs, src = cost[order], outs[order], src[order]
            prev_min = np.concatenate(([np.inf], np.minimum.accumulate(cost)[:-1]))
            front = cost < prev_min                               # strictly cheaper than every smaller-out entry
            k = int(front.sum())
            nj.append(np.full(k, t))
            nc.append(cost[front])
            no.append(outs[front])
            npar.append(src[front])
        if not nj:
            break
        layers.append((np.concatenate(nj), np.concatenate(nc), np.concatenate(no), np.concatenate(npar)))
    best = None
    for g, (lj, lc, lo, _) in enumerate(layers, start=1):
        hit = np.nonzero(lj == n - 1)[0]
        if hit.size:
            e = hit[np.lexsort((lo[hit], lc[hit]))[0]]
            if best is None or lc[e] < best[0] - 1e-12 * max(1.0, abs(best[0])):
                best = (float(lc[e]), g, int(e))
    if best is None:
        return None
    _, g, e = best
    chosen = []
    for layer_i in range(g - 1, -1, -1):
        lj, _, _, lp = layers[layer_i]
        chosen.append(int(lj[e]))
        e = int(lp[e])
    return sorted(chosen)


def plan_budgets(mix, max_graphs: int, max_pool_bytes: int | None = None, cfg=None, latency=None,
                 **pool_kw) -> list[int]:
    """Ascending merged-token budgets, at most `max_graphs` of them, the last one the largest
    item, minimizing the expected cost of replaying each item alone in the smallest budget that
    fits it. Exact (dynamic programme; module docstring).

    mix: per-item merged-token counts (a sequence), a mapping tokens -> weight, or an image-mix
    name (its exact `samples.mix_distribution(name, cfg)`).
    Objective: expected padded tokens per item (budget - tokens); with `latency`, the expected
    replay time instead: a mapping budget -> replay time (times between table points are linearly
    interpolated; below the smallest point the smallest point's time is used, above the largest
    the last segment is extrapolated linearly) or a callable tokens -> time. Times must not
    decrease with the budget (a table that does is a ValueError naming the pair), nor be negative,
    NaN or infinite, nor so large that their sums overflow (each a ValueError naming the value).
    max_pool_bytes: a limit on `graph_pool_bytes(cfg, budgets, **pool_kw)` (needs cfg; pool_kw:
    dtype, norm, buffer_dtype, max_items); the optimum under it is still exact (Pareto fronts of
    cost and pool bytes). If even the cheapest covering set (the largest item's budget alone)
    exceeds the limit, a ValueError names the bytes it needs and the limit.
    Ties: the fewest budgets win. Budgets may come out below a runner's max_items (tiny items);
    EncoderGraphRunner rejects such budgets, so raise them or lower max_items there.
    """
    G = _check_max_graphs(max_graphs)
    if max_pool_bytes is not None:
        if cfg is None:
            raise ValueError("max_pool_bytes needs cfg (a wb.VisionConfig or preset name): the pool a budget "
                             "set needs depends on the tower")
        if not isinstance(max_pool_bytes, numbers.Real) or isinstance(max_pool_bytes, bool) \
                or not math.isfinite(max_pool_bytes) or max_pool_bytes <= 0:
            raise ValueError(f"max_pool_bytes must be a finite positive number of bytes, got {max_pool_bytes!r}")
    elif pool_kw:
        raise TypeError(f"{sorted(pool_kw)} only apply together with max_pool_bytes")
    sizes, probs = _distribution(mix, cfg)
    limits.check("plan_sizes" if max_pool_bytes is None else "pool_plan_sizes", sizes.size, f"plan_budgets: a mix "
                 f"of {sizes.size:,} distinct merged-token counts (the exact programme is quadratic in them: round "
                 f"the sizes first, e.g. up to a multiple of 8)")
    # the plan's last budget is the largest item: one above the budget cap no runner could capture
    limits.check("budget_tokens", int(sizes[-1]), f"the largest item of the mix, {int(sizes[-1])} merged "
                                                  f"tokens (the plan's largest budget)")
    n = sizes.size
    G = min(G, n)
    P = np.concatenate(([0.0], np.cumsum(probs)))
    if latency is None:
        c = sizes.astype(np.float64)
        S = np.concatenate(([0.0], np.cumsum(probs * sizes)))
    else:
        c = _times(latency, sizes, increasing=True)
        _check_summable(c)
        S = np.zeros(n + 1)
    if max_pool_bytes is None:
        layers, args = _dp(c, P, S, G)
        finals = np.array([layer[n - 1] for layer in layers])
        best = float(finals.min())
        g = int(np.nonzero(finals <= best + 1e-12 * max(1.0, abs(best)))[0][0]) + 1
        chosen, j = [n - 1], n - 1
        for layer in range(g - 1, 0, -1):
            j = int(args[layer - 1][j])
            chosen.append(j)
        return [int(sizes[k]) for k in sorted(chosen)]
    cfg = resolve_config(cfg)
    largest = int(sizes[-1])
    need = graph_pool_bytes(cfg, [largest], **pool_kw)
    if need > max_pool_bytes:
        raise ValueError(f"max_pool_bytes={int(max_pool_bytes)} is too small: even the cheapest covering set, "
                         f"the largest item's budget [{largest}] alone, needs {need} bytes of graph pool "
                         f"({cfg.name})")
    import torch
    dtype = pool_kw.get("dtype") or torch.bfloat16
    out_b = np.array([_output_bytes(cfg, int(s), dtype) for s in sizes.tolist()], dtype=np.float64)
    chosen = _pareto_dp(c, P, S, G, out_b, float(max_pool_bytes - need))
    return [int(sizes[k]) for k in chosen]


# ---------------------------------------------------------------------------------------------
# scoring and ladders
# ---------------------------------------------------------------------------------------------
def expected_padding(mix, budgets, cfg=None, latency=None) -> dict:
    """How a budget set serves `mix` (as plan_budgets takes it) when every item is replayed alone
    in the smallest budget that fits it:

    padded_tokens  expected padded tokens per item (budget - tokens; an item larger than every
                   budget runs eagerly and adds no padding);
    padded_frac    padded tokens / budget tokens over the replayed items (the share of replayed
                   rows that are padding);
    miss_frac      fraction of items larger than every budget;
    mean_budget    mean budget of the replayed items (nan when every item misses);
    expected_time  (only with `latency`, as in plan_budgets) expected replay time per replayed
                   item, over the replayed items.
    """
    sizes, probs = _distribution(mix, cfg)
    b = np.array(Budgets.of(budgets), dtype=np.int64)
    pos = np.searchsorted(b, sizes, side="left")
    hit = pos < b.size
    used = np.where(hit, b[np.minimum(pos, b.size - 1)], 0)
    p_hit = float(probs[hit].sum())
    padded = float((probs[hit] * (used[hit] - sizes[hit])).sum())
    budget_tokens = float((probs[hit] * used[hit]).sum())
    out = dict(padded_tokens=padded,
               padded_frac=padded / budget_tokens if budget_tokens else math.nan,
               miss_frac=1.0 - p_hit if p_hit < 1.0 else 0.0,
               mean_budget=budget_tokens / p_hit if p_hit else math.nan)
    if latency is not None:
        t = _times(latency, used[hit], increasing=False)
        out["expected_time"] = float((probs[hit] * t).sum() / p_hit) if p_hit else math.nan
    return out


def geometric_budgets(max_tokens: int, ratio: float = 2 ** 0.5, smallest: int = 64) -> list[int]:
    """A geometric ladder smallest * ratio**k, rounded to integers (each at least one above the
    previous, so strictly ascending), up to the first value >= max_tokens. ratio=2 gives
    runner.default_budgets; the default sqrt(2) is twice as dense (about 15 % expected padding
    for sizes spread evenly in log scale instead of about 30 %)."""
    max_tokens = limits.integer(max_tokens, "max_tokens", cap="budget_tokens")
    smallest = limits.integer(smallest, "smallest", cap="budget_tokens")
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not math.isfinite(ratio) or ratio <= 1:
        raise ValueError(f"ratio must be a finite number > 1, got {ratio!r}")
    out, k = [smallest], 1
    while out[-1] < max_tokens:
        out.append(max(out[-1] + 1, round(smallest * ratio ** k)))
        k += 1
        # a ratio barely above 1 makes a ladder of one budget per token: refused as it grows
        limits.check("budgets", len(out), f"geometric_budgets(max_tokens={max_tokens}, ratio={ratio}, "
                                          f"smallest={smallest}): budgets in the ladder so far")
    return out
