"""Repeat until the number is known: the median's distribution-free interval and the loop that
stops on it (workbench.timing)."""
from __future__ import annotations

import math
import random

import pytest

from workbench import timing


def test_interval_needs_six_samples_at_95_percent():
    assert all(math.isnan(v) for v in timing.median_ci([3.0, 1.0, 2.0, 5.0, 4.0]))
    # six samples: only the full range covers the median with >= 95% (1 - 2 / 64 = 0.969)
    assert timing.median_ci([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (1.0, 6.0)


def test_interval_ranks_match_the_binomial_table():
    # n = 20: the 95% interval is (x_(6), x_(15)) in 1-based ranks (coverage 0.9586)
    values = [float(v) for v in range(1, 21)]
    random.Random(1).shuffle(values)
    assert timing.median_ci(values) == (6.0, 15.0)
    # n = 100: (x_(40), x_(61))
    assert timing.median_ci([float(v) for v in range(1, 101)]) == (40.0, 61.0)


def test_interval_covers_the_true_median_as_often_as_promised():
    rng = random.Random(0)
    trials, n, hits = 3000, 15, 0
    median = math.log(2)          # the median of an exponential with rate 1
    for _ in range(trials):
        lo, hi = timing.median_ci([rng.expovariate(1.0) for _ in range(n)])
        hits += lo <= median <= hi
    assert hits / trials >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / trials)


def test_until_known_stops_as_soon_as_the_interval_is_tight():
    calls = []

    def steady(k):
        calls.append(k)
        return [10.0] * k
    assert len(timing.until_known(steady, min_reps=6, max_reps=50)) == 6
    assert calls == [6]


def test_until_known_repeats_to_the_cap_when_the_number_stays_noisy():
    rng = random.Random(2)
    got = timing.until_known(lambda k: [rng.uniform(1.0, 3.0) for _ in range(k)], min_reps=3, max_reps=40)
    assert len(got) == 40 and not timing.is_known(got)


def test_until_known_stops_between_the_bounds_for_moderate_noise():
    rng = random.Random(3)
    got = timing.until_known(lambda k: [rng.gauss(100.0, 3.0) for _ in range(k)], min_reps=6, max_reps=1000)
    assert 6 < len(got) < 1000 and timing.is_known(got)


@pytest.mark.parametrize("kw, match", [(dict(min_reps=0, max_reps=5), "min_reps"),
                                       (dict(min_reps=6, max_reps=5), "min_reps"),
                                       (dict(min_reps=2, max_reps=5, rel=0.0), "rel")])
def test_until_known_refuses_bounds_that_cannot_hold(kw, match):
    with pytest.raises(ValueError, match=match):
        timing.until_known(lambda k: [1.0] * k, **kw)


def test_cpu_timer_records_its_count_and_interval():
    fixed = timing.cpu_time_us(lambda: sum(range(100)), reps=7, warmup=0)
    assert fixed["reps"] == 7 and fixed["ci_lo_us"] <= fixed["p50_us"] <= fixed["ci_hi_us"]
    adaptive = timing.cpu_time_us(lambda: sum(range(100)), reps=40, warmup=1, min_reps=6)
    assert 6 <= adaptive["reps"] <= 40


def test_a_default_min_reps_follows_a_smaller_cap_and_a_given_one_is_refused():
    from workbench.studies import encoder_latency as s
    from workbench.studies.params import ParamError
    assert s.PARAMS.resolve({"reps": 3}, "gpu")["min_reps"] == 3
    assert s.PARAMS.resolve({}, "gpu")["min_reps"] == 6 and s.PARAMS.resolve({}, "gpu")["reps"] == 10
    with pytest.raises(ParamError, match="min_reps=7 is above reps=6"):
        s.PARAMS.resolve({"reps": 6, "min_reps": 7}, "gpu")


def test_a_frozen_heap_leaves_the_collector_only_what_the_block_allocates_and_is_undone_after():
    import gc
    before = gc.get_freeze_count()
    with timing.frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > before                                  # everything alive at entry is frozen
        young = [[i] for i in range(1000)]                      # allocated inside: not frozen
        assert gc.get_freeze_count() == frozen and all(gc.is_tracked(x) for x in young)
        with timing.frozen_heap():                              # nested: the outer block's objects stay frozen
            assert gc.get_freeze_count() >= frozen
        assert gc.get_freeze_count() >= frozen
    assert gc.get_freeze_count() == before == 0                 # unfrozen: what dies later is collected


def test_a_paused_collector_is_restored_as_it_was_even_on_an_error():
    import gc
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with timing.collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with timing.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()                               # the caller had it off: left off
    finally:
        gc.enable()
