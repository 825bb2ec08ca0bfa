"""workbench.planner: the exact budget planner against brute force, the pool model, the ladders."""
from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

import workbench as wb
from workbench.planner import capture_pool_bytes, graph_pool_bytes
from workbench.runner import default_budgets
from workbench.samples import MIX_NAMES

TINY = "tiny-qwen2-vl"


def _random_mix(rng, max_distinct=8, max_tokens=300):
    n = int(rng.integers(1, max_distinct + 1))
    sizes = np.sort(rng.choice(np.arange(1, max_tokens + 1), size=n, replace=False))
    weights = rng.integers(1, 10, size=n)
    return {int(s): int(w) for s, w in zip(sizes, weights)}


def _interp(table):
    xs = np.array(sorted(table), dtype=float)
    ys = np.array([table[k] for k in sorted(table)], dtype=float)

    def f(t):
        if t <= xs[-1] or xs.size == 1:
            return float(np.interp(t, xs, ys))
        return float(ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (t - xs[-1]))
    return f


def _cost(mix, budgets, time_of=None):
    """Expected padded tokens (or replay time) per item, each item alone in the smallest budget."""
    total = sum(mix.values())
    out = 0.0
    for s, w in mix.items():
        b = min(v for v in budgets if v >= s)
        out += w / total * ((b - s) if time_of is None else time_of(b))
    return out


def _brute(mix, max_graphs, time_of=None, pool=None, limit=None):
    sizes = sorted(mix)
    best = None
    for k in range(min(max_graphs, len(sizes))):
        for rest in itertools.combinations(sizes[:-1], k):
            budgets = list(rest) + [sizes[-1]]
            if pool is not None and pool(budgets) > limit:
                continue
            c = _cost(mix, budgets, time_of)
            best = c if best is None else min(best, c)
    return best


def test_padding_objective_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        mix = _random_mix(rng)
        g = int(rng.integers(1, 6))
        plan = wb.plan_budgets(mix, g)
        assert plan == sorted(set(plan)) and len(plan) <= g and plan[-1] == max(mix)
        assert set(plan) <= set(mix)
        assert _cost(mix, plan) == pytest.approx(_brute(mix, g), rel=1e-9, abs=1e-9), (mix, g, plan)
        assert wb.expected_padding(mix, plan)["padded_tokens"] == pytest.approx(_cost(mix, plan), abs=1e-9)


def test_sequence_mix_is_counted_by_occurrence(seed):
    rng = np.random.default_rng(seed)
    for _ in range(20):
        items = rng.integers(1, 200, size=int(rng.integers(1, 15))).tolist()
        g = int(rng.integers(1, 5))
        mix = {}
        for t in items:
            mix[t] = mix.get(t, 0) + 1
        assert _cost(mix, wb.plan_budgets(items, g)) == pytest.approx(_brute(mix, g), abs=1e-9)


def test_latency_objective_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    for trial in range(50):
        mix = _random_mix(rng)
        g = int(rng.integers(1, 6))
        if trial % 2:
            a, b2, e = rng.uniform(1, 50), rng.uniform(0, 1), rng.uniform(0.5, 2.0)
            lat = lambda t, a=a, b2=b2, e=e: a + b2 * t ** e          # noqa: E731
            time_of = lat
        else:
            keys = np.sort(rng.choice(np.arange(1, 400), size=int(rng.integers(1, 6)), replace=False))
            vals = np.cumsum(rng.uniform(0, 20, size=keys.size)) + rng.uniform(0, 50)
            lat = {int(k): float(v) for k, v in zip(keys, vals)}
            time_of = _interp(lat)
        plan = wb.plan_budgets(mix, g, latency=lat)
        assert len(plan) <= g and plan[-1] == max(mix)
        assert _cost(mix, plan, time_of) == pytest.approx(_brute(mix, g, time_of), rel=1e-9, abs=1e-9), \
            (mix, g, lat, plan)
        got = wb.expected_padding(mix, plan, latency=lat)["expected_time"]
        assert got == pytest.approx(_cost(mix, plan, time_of), rel=1e-9)


def test_pool_limited_optimum_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(12):
        mix = _random_mix(rng, max_distinct=7, max_tokens=3000)
        g = int(rng.integers(2, 6))
        sizes = sorted(mix)

        def pool(b):
            return graph_pool_bytes(TINY, b)
        # every covering set's pool; a limit somewhere between the cheapest and the dearest
        pools = sorted({pool(list(r) + [sizes[-1]]) for k in range(min(g, len(sizes)))
                        for r in itertools.combinations(sizes[:-1], k)})
        limit = pools[int(rng.integers(0, len(pools)))]
        lat = None if rng.integers(2) else (lambda t: 3.0 + t ** 0.8)
        plan = wb.plan_budgets(mix, g, max_pool_bytes=limit, cfg=TINY, latency=lat)
        assert pool(plan) <= limit and len(plan) <= g and plan[-1] == sizes[-1]
        want = _brute(mix, g, lat, pool, limit)
        assert _cost(mix, plan, lat) == pytest.approx(want, rel=1e-9, abs=1e-9), (mix, g, limit, plan)
        checked += 1
    assert checked


def test_pool_limit_too_small_names_bytes():
    need = graph_pool_bytes(TINY, [900])
    with pytest.raises(ValueError, match=f"needs {need} bytes.*max_pool_bytes=1000|max_pool_bytes=1000.*needs {need}"):
        wb.plan_budgets({100: 1, 900: 1}, 3, max_pool_bytes=1000, cfg=TINY)
    # exactly the largest budget alone fits: the planner falls back to one budget
    assert wb.plan_budgets({100: 1, 900: 1}, 3, max_pool_bytes=need, cfg=TINY) == [900]


def test_pool_model_is_capture_plus_kept_outputs():
    cap = capture_pool_bytes(TINY, 512)
    assert graph_pool_bytes(TINY, [512]) == cap
    cfg = wb.VisionConfig.preset(TINY)
    assert graph_pool_bytes(TINY, [64, 256, 512]) == cap + 2 * (64 + 256) * cfg.out_hidden  # bf16, 512 B multiples
    assert capture_pool_bytes(TINY, 4096) >= cap
    # the eager norm's fp32 temporaries [rows, 1176] enter the pool when it is the tower's first op
    assert capture_pool_bytes(TINY, 512, norm="eager") > cap
    assert capture_pool_bytes("tiny-qwen2.5-vl", 512) > 0


def test_committed_mixes_never_pad_more_than_powers_of_two():
    for name in MIX_NAMES:
        largest = wb.mix_distribution(name)[-1][0]
        pow2 = default_budgets(largest)
        plan = wb.plan_budgets(name, len(pow2))
        mine, theirs = wb.expected_padding(name, plan), wb.expected_padding(name, pow2)
        assert mine["padded_tokens"] <= theirs["padded_tokens"] + 1e-9, name
        assert mine["miss_frac"] == 0 and plan[-1] == largest


def test_enough_graphs_give_zero_padding(seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        mix = _random_mix(rng, max_distinct=12)
        plan = wb.plan_budgets(mix, len(mix) + int(rng.integers(0, 3)))
        assert plan == sorted(mix)
        assert wb.expected_padding(mix, plan)["padded_tokens"] == 0


def test_thousands_of_sizes_are_fast():
    rng = np.random.default_rng(1)
    items = rng.choice(np.arange(1, 40000), size=3000, replace=False).tolist()
    t = time.perf_counter()
    plan = wb.plan_budgets(items, 12)
    elapsed = time.perf_counter() - t
    assert len(plan) == 12 and plan[-1] == max(items)
    assert elapsed < 3.0, f"{elapsed:.2f} s"   # about 0.2 s on a 2-core CPU; slack for shared runners


def test_expected_padding_by_hand():
    r = wb.expected_padding([10, 10, 30, 100], [16, 64])
    assert r["padded_tokens"] == pytest.approx((6 + 6 + 34 + 0) / 4)
    assert r["miss_frac"] == pytest.approx(0.25)
    assert r["mean_budget"] == pytest.approx((16 + 16 + 64) / 3)
    assert r["padded_frac"] == pytest.approx(46 / 96)


def test_geometric_budgets():
    assert wb.geometric_budgets(5000, ratio=2) == default_budgets(5000)
    lad = wb.geometric_budgets(16384)
    assert lad[0] == 64 and lad[-1] >= 16384 and lad[-2] < 16384
    assert all(b > a for a, b in zip(lad, lad[1:]))
    assert len(lad) == 2 * len(default_budgets(16384)) - 1
    assert wb.geometric_budgets(3, smallest=64) == [64]
    assert wb.geometric_budgets(10, ratio=1.01, smallest=1) == list(range(1, 11))
    for bad in (dict(ratio=1), dict(smallest=0), dict(ratio=float("nan"))):
        with pytest.raises(ValueError):
            wb.geometric_budgets(100, **bad)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="max_graphs must be an integer >= 1"):
        wb.plan_budgets([1, 2], 0)
    with pytest.raises(ValueError, match="mix is empty"):
        wb.plan_budgets([], 3)
    with pytest.raises(ValueError, match="positive integers.*bad: \\[0, -4\\]"):
        wb.plan_budgets([0, -4, 5], 3)
    with pytest.raises(ValueError, match="positive integers"):
        wb.plan_budgets([2.5], 3)
    with pytest.raises(ValueError, match="unknown image mix 'nope'; valid: .*phone_photos.*photos"):
        wb.plan_budgets("nope", 3)
    with pytest.raises(ValueError, match="max_pool_bytes needs cfg"):
        wb.plan_budgets([1, 2], 3, max_pool_bytes=10 ** 9)
    with pytest.raises(ValueError, match="non-decreasing.*128 -> 5.0 but 256 -> 4.0"):
        wb.plan_budgets([100, 200], 2, latency={64: 1.0, 128: 5.0, 256: 4.0})
    with pytest.raises(ValueError, match="weights must be finite numbers > 0"):
        wb.plan_budgets({5: 0}, 2)
    with pytest.raises(ValueError, match="non-decreasing in tokens"):
        wb.plan_budgets([10, 20], 2, latency=lambda t: -t)


def test_the_pool_model_traces_the_general_graph_whatever_max_items(monkeypatch):
    """max_items sizes only metadata: a budget's traced capture is the general graph (flash
    attention, the one a runner must capture for padded packs), also when one item per replay
    would make the budget-filling grid a single exact-fit sequence (dense attention from 1024 rows)."""
    import workbench.attention as attention
    from workbench import planner

    def no_dense(*a, **k):
        raise AssertionError("the pool model traced dense attention: not the runner's general graph")

    monkeypatch.setattr(attention, "dense_attention", no_dense)
    planner._capture_trace_pool.cache_clear()
    for preset in ("qwen2-vl-7b", "qwen2.5-vl-7b"):
        cfg = wb.VisionConfig.preset(preset).reduced(2)
        one, many = (planner.graph_pool_bytes(cfg, [256, 1024], max_items=m) for m in (1, 8))
        assert one == many, (preset, one, many)
    planner._capture_trace_pool.cache_clear()
