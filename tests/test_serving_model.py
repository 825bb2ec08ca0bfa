"""workbench.serving_model against closed-form queueing results (M/M/1 sojourn, Erlang-C), exact
deterministic cases, the batching GPU, the bottleneck bound, the stability flag and bad inputs.

Sample sizes: the sample mean of a queue's waiting times is strongly autocorrelated. At utilization
0.8 the run-to-run spread (measured over seeds) at 200k requests is about 1.9% for the M/M/1 mean
and 5% for its p99, and 3% for the M/M/c mean wait, so the 0.8 cases run MAX_REQUESTS (1M) requests,
which puts each tolerance at 3 or more standard deviations, while the 0.5 case runs 200k."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from workbench.serving_model import (GROWTH_LIMIT, MAX_REQUESTS, Stage, StageCosts, capacities, latency_curve,
                                     max_images_per_s, simulate)

MEAN = 2.0          # ms of exponential host service: mu = 0.5 per ms


def only_host(host, workers=1) -> StageCosts:
    """A queue of host workers alone: the link, device and encoder cost nothing."""
    return StageCosts(host, 0.0, 0.0, 0.0, workers=workers, max_items=1)


@pytest.mark.parametrize("rho, n", [(0.5, 200_000), (0.8, MAX_REQUESTS)])
def test_mm1_sojourn_is_exponential_with_rate_mu_minus_lambda(rho, n):
    mu = 1 / MEAN
    lam = rho * mu
    res = simulate(only_host(Stage.exponential(MEAN)), rate=lam * 1000, n_requests=n, seed=7)
    sojourn = 1 / (mu - lam)
    assert res.mean_ms == pytest.approx(sojourn, rel=0.03)
    assert res.p99_ms == pytest.approx(math.log(100) * sojourn, rel=0.05)
    assert res.p50_ms == pytest.approx(math.log(2) * sojourn, rel=0.05)
    assert res.utilization["host"] == pytest.approx(rho, rel=0.01)
    assert res.throughput == pytest.approx(lam * 1000, rel=0.01)
    assert res.stable


def erlang_c(c: int, a: float) -> float:
    """The probability that an arrival waits in M/M/c, offered load a = lambda/mu Erlangs (a < c)."""
    top = a ** c / math.factorial(c) * c / (c - a)
    return top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)


def test_mmc_mean_wait_matches_erlang_c():
    c, mu = 4, 1 / MEAN
    lam = 0.8 * c * mu
    wait = erlang_c(c, lam / mu) / (c * mu - lam)
    assert erlang_c(1, 0.5) == pytest.approx(0.5)          # M/M/1: P(wait) = rho
    res = simulate(only_host(Stage.exponential(MEAN), workers=c), rate=lam * 1000, n_requests=MAX_REQUESTS, seed=3)
    assert res.mean_ms - MEAN == pytest.approx(wait, rel=0.05)
    assert res.utilization["host"] == pytest.approx(0.8, rel=0.01)


def test_fixed_times_without_queueing_add_up_exactly():
    costs = StageCosts(1.5, 0.25, 0.5, [2.0, 3.0])
    total = 1.5 + 0.25 + 0.5 + 2.0
    res = simulate(costs, rate=20.0, n_requests=5000, seed=1, warmup=0)
    lat, arr = res.latencies_ms, res.arrivals_ms
    assert lat[0] == pytest.approx(total, abs=1e-9)
    empty = np.r_[True, arr[1:] >= arr[:-1] + lat[:-1]]    # the one before had left the system
    assert 0.5 < empty.mean() < 1                          # both kinds occur at this rate
    np.testing.assert_allclose(lat[empty], total, rtol=0, atol=1e-9)
    assert (lat[~empty] > total - 1e-9).all()
    assert (lat > total - 1e-9).all() and lat.max() > total


def test_fixed_host_queue_waits_exactly_as_computed_by_hand():
    # one worker at 4 ms, nothing else: a request waits for the one before it (Lindley by hand)
    res = simulate(StageCosts(4.0, 0.0, 0.0, 0.0), rate=200.0, n_requests=2000, seed=5, warmup=0)
    arr, done = res.arrivals_ms, np.empty(2000)
    free = 0.0
    for i, a in enumerate(arr):
        free = max(a, free) + 4.0
        done[i] = free
    np.testing.assert_allclose(res.latencies_ms, done - arr, rtol=0, atol=1e-9)


def test_gpu_forms_full_batches_and_reaches_k_over_time_k():
    costs = StageCosts(0.1, 0.1, 0.0, [10.0, 12.0, 14.0, 16.0])
    assert costs.max_items == 4
    assert max_images_per_s(costs) == pytest.approx(250.0)
    res = simulate(costs, rate=5000.0, n_requests=8000, seed=2)
    sizes = res.batch_sizes
    assert sizes[0] == 1                                   # the first image finds the GPU idle
    assert (sizes[1:-1] == 4).all() and sizes.sum() == 8000
    assert res.throughput == pytest.approx(250.0, rel=0.01)
    assert res.utilization["gpu"] == pytest.approx(1.0, abs=0.01)
    assert not res.stable


def test_light_load_batches_stay_small():
    costs = StageCosts(0.1, 0.1, 0.0, [10.0, 12.0, 14.0, 16.0])
    res = simulate(costs, rate=5.0, n_requests=2000, seed=2)
    assert res.batch_sizes.mean() < 1.2 and res.stable
    assert res.p50_ms == pytest.approx(10.2, abs=1e-9)     # most find the GPU idle: 0.1 + 0.1 + 10


@pytest.mark.parametrize("costs, bottleneck, expect", [
    (StageCosts(10.0, 1.0, 0.5, [2.0, 3.0], workers=2), "host", 200.0),
    (StageCosts(Stage.samples([5.0, 15.0]), 2.5, 0.5, [2.0, 3.0], workers=16), "h2d", 400.0),
    (StageCosts(1.0, 0.1, 0.5, [Stage.exponential(8.0), 9.0, 10.0, 12.0], workers=8), "gpu", 4000 / 14),
])
def test_max_images_per_s_picks_the_bottleneck(costs, bottleneck, expect):
    caps = capacities(costs)
    assert min(caps, key=caps.get) == bottleneck
    assert max_images_per_s(costs) == pytest.approx(expect)
    # the bound is the saturation throughput: overloaded twice over, the tandem delivers it
    res = simulate(costs, rate=2 * expect, n_requests=20_000, seed=4)
    assert res.throughput == pytest.approx(expect, rel=0.03)
    assert res.utilization[bottleneck] == pytest.approx(1.0, abs=0.02)
    assert not res.stable


def test_stability_flag_above_and_below_the_bound():
    costs = StageCosts(Stage.samples([0.5, 1.0, 2.5]), 0.3, 0.05, [3.0, 3.5, 4.0, 4.5], workers=2)
    cap = max_images_per_s(costs)
    below = simulate(costs, rate=0.5 * cap, n_requests=50_000, seed=0)
    above = simulate(costs, rate=1.2 * cap, n_requests=50_000, seed=0)
    assert below.stable and below.offered_load == pytest.approx(0.5)
    assert abs(below.growth) < GROWTH_LIMIT / 10
    assert not above.stable and above.offered_load == pytest.approx(1.2)
    assert above.growth == pytest.approx(0.2, abs=0.05)      # latency grows by lambda/C - 1 per ms
    assert above.latencies_ms[-1000:].mean() > 2 * above.latencies_ms[:1000].mean()
    # just above the bound the queue grows too slowly to see in a short run: the bound decides
    barely = [simulate(costs, rate=1.005 * cap, n_requests=20_000, seed=s) for s in range(4)]
    assert not any(r.stable for r in barely) and min(r.growth for r in barely) < GROWTH_LIMIT


def test_greedy_batching_can_be_unstable_below_the_bound():
    # k / time(k) is best at k = 1..3 but a full batch of 4 is slow: the greedy GPU takes 4 once the
    # queue holds 4, and from then on the queue grows. The bound cannot see it; growth does.
    costs = StageCosts(0.0, 0.0, 0.0, [1.0, 2.0, 3.0, 100.0])
    assert max_images_per_s(costs) == pytest.approx(1000.0)
    res = simulate(costs, rate=500.0, n_requests=20_000, seed=0)
    assert res.offered_load == pytest.approx(0.5)
    assert res.growth > GROWTH_LIMIT and not res.stable


def test_latency_curve_rows():
    costs = only_host(Stage.exponential(MEAN))
    rows = latency_curve(costs, n_requests=20_000)
    assert [r["load"] for r in rows] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    assert [r["rate"] for r in rows] == pytest.approx([f * 500 for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)])
    p50 = [r["p50_ms"] for r in rows]
    assert p50 == sorted(p50)          # common random numbers: a faster stream only adds waiting
    assert all(r["stable"] for r in rows[:-1])
    assert set(rows[0]) >= {"rate", "p50_ms", "p99_ms", "stable"}
    assert latency_curve(costs, rates=[100.0, 900.0], n_requests=2000)[1]["stable"] is False
    with pytest.raises(ValueError, match="pass rates"):
        latency_curve(StageCosts(0.0, 0.0, 0.0, 0.0))


def test_same_seed_same_latencies():
    costs = StageCosts(Stage.samples([0.5, 1.0, 2.5]), Stage.exponential(0.2), [0.01, 0.02],
                       [Stage.samples([2.0, 3.0]), Stage.exponential(3.0), 4.0], workers=3)
    a, b = (simulate(costs, rate=600.0, n_requests=10_000, seed=11) for _ in range(2))
    np.testing.assert_array_equal(a.latencies_ms, b.latencies_ms)
    np.testing.assert_array_equal(a.batch_sizes, b.batch_sizes)
    assert not np.array_equal(a.latencies_ms, simulate(costs, rate=600.0, n_requests=10_000, seed=12).latencies_ms)


def test_warmup_requests_are_simulated_but_not_measured():
    costs = StageCosts(Stage.exponential(1.0), 0.2, 0.1, [1.0, 1.5], workers=2)
    full = simulate(costs, rate=800.0, n_requests=4000, seed=9, warmup=0)
    part = simulate(costs, rate=800.0, n_requests=4000, seed=9, warmup=1000)
    assert part.latencies_ms.size == 3000 and simulate(costs, 800.0, n_requests=4000).latencies_ms.size == 3600
    np.testing.assert_array_equal(part.latencies_ms, full.latencies_ms[1000:])
    np.testing.assert_array_equal(part.arrivals_ms, full.arrivals_ms[1000:])
    assert part.mean_ms == pytest.approx(full.latencies_ms[1000:].mean())


def test_samples_are_resampled_from_the_measurements():
    stage = Stage.samples([1.0, 2.0, 6.0])
    assert stage.mean_ms == 3.0
    draws = stage.draw(np.random.default_rng(0), 30_000)
    assert set(np.unique(draws)) == {1.0, 2.0, 6.0} and draws.mean() == pytest.approx(3.0, rel=0.02)
    assert StageCosts([1.0, 3.0], 0.0, 0.0, 0.0).host_ms.mean_ms == 2.0     # a sequence means samples


OK = StageCosts(1.0, 0.1, 0.1, [1.0, 2.0])


@pytest.mark.parametrize("make, message", [
    (lambda: simulate(OK, 0), r"rate .* got 0"),
    (lambda: simulate(OK, -3.0), r"rate .* got -3.0"),
    (lambda: simulate(OK, math.nan), r"rate .* got nan"),
    (lambda: simulate(OK, math.inf), r"rate .* got inf"),
    (lambda: simulate(OK, 10.0, n_requests=0), r"n_requests .*\[1, 1000000\].*MAX_REQUESTS.* got 0"),
    (lambda: simulate(OK, 10.0, n_requests=MAX_REQUESTS + 1), r"n_requests .*MAX_REQUESTS.* got 1000001"),
    (lambda: simulate(OK, 10.0, n_requests=10, warmup=10), r"warmup .*\[0, 9\].* got 10"),
    (lambda: simulate(OK, 10.0, n_requests=10, warmup=-1), r"warmup .* got -1"),
    (lambda: StageCosts(1.0, 0.1, 0.1, 1.0, workers=0), r"workers .*\[1, 1024\].* got 0"),
    (lambda: StageCosts(1.0, 0.1, 0.1, 1.0, workers=1025), r"workers .*\[1, 1024\].* got 1025"),
    (lambda: StageCosts(-1.0, 0.1, 0.1, 1.0), r"host_ms .*>= 0.* got -1.0"),
    (lambda: StageCosts(1.0, math.nan, 0.1, 1.0), r"h2d_ms .*finite.* got nan"),
    (lambda: StageCosts(1.0, 0.1, math.inf, 1.0), r"device_ms .*finite.* got inf"),
    (lambda: StageCosts(1.0, 0.1, 0.1, [1.0, -2.0]), r"encoder_ms\[1\] .* got -2.0"),
    (lambda: StageCosts([1.0, math.nan], 0.1, 0.1, 1.0), r"host_ms: every sample .* got nan"),
    (lambda: StageCosts([], 0.1, 0.1, 1.0), r"host_ms must be a non-empty .* got \[\]"),
    (lambda: Stage.samples([]), r"samples must be a non-empty .* got \[\]"),
    (lambda: Stage.fixed(-0.5), r"ms .* got -0.5"),
    (lambda: Stage.exponential(math.inf), r"mean_ms .* got inf"),
    (lambda: StageCosts(1.0, 0.1, 0.1, 1.0, max_items=0), r"max_items .*\[1, 65536\].* got 0"),
    (lambda: StageCosts(1.0, 0.1, 0.1, [1.0, 2.0, 3.0], max_items=2), r"encoder_ms has 3 entries.*max_items = 2"),
    (lambda: StageCosts(1.0, 0.1, 0.1, []), r"encoder_ms has 0 entries"),
])
def test_bad_input_names_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_imports_light():
    code = "import sys, workbench.serving_model; print(sorted({'torch', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
