"""advise and the planner refuse impossible numbers, naming them: a budget or graph count that is not a
positive integer, a time that is negative, NaN or infinite, weights whose sum overflows, an empty mix
name. A run table holding such a time is passed over (never recommended as the cheapest design) and the
advice says so; nothing ends in a bare "math domain error"."""
from __future__ import annotations

import math
import re
import shutil

import pandas as pd
import pytest

import workbench as wb
from workbench import planner
from workbench.advise import advise
from workbench.cli import main
from workbench.provenance import REPO_ROOT
from workbench.samples import MIX_NAMES

COMMITTED = REPO_ROOT / "results" / "reference"
PRESET, MIX = "qwen3-vl-8b", "photos"
NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------------------------------------
# the planner
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("latency, says", [
    ({16: -2.0, 32: -1.0}, r"latency table time at budget 16 = -2.0: a replay time must be a finite number >= 0"),
    ({16: 1.0, 32: NAN}, r"budget 32 = nan: a replay time must be a finite number >= 0"),
    ({16: 1.0, 32: INF}, r"budget 32 = inf: a replay time must be a finite number >= 0"),
    ({16: 1.0, 32: "2"}, r"budget 32 = '2': a replay time"),
    ({16: True, 32: 2.0}, r"budget 16 = True: a replay time"),
    (lambda t: t - 100.0, r"latency\(10\) = -90.0: a replay time must be a finite number >= 0"),
    (lambda t: NAN, r"latency\(10\) = nan"),
    (lambda t: INF, r"latency\(10\) = inf"),
    (lambda t: None, r"latency\(10\) = None"),
])
def test_a_negative_or_non_finite_latency_is_refused_naming_it(latency, says):
    with pytest.raises(ValueError, match=says):
        wb.plan_budgets([10, 20], 2, latency=latency)
    with pytest.raises(ValueError, match=r"(latency\(32\)|latency table time at budget \d+) = .*: a replay time "
                                         r"must be a finite number >= 0"):
        wb.expected_padding([10, 20], [32], latency=latency)


def test_a_latency_table_extrapolated_past_float64_is_refused():
    with pytest.raises(ValueError, match=r"extrapolated to 1000 tokens overflows float64 .*17 -> 1e\+308"):
        wb.plan_budgets([10, 1000], 2, latency={16: 1.0, 17: 1e308})
    with pytest.raises(ValueError, match=r"extrapolated to 2000 tokens overflows float64"):
        wb.expected_padding([10, 1000], [16, 2000], latency={16: 1.0, 17: 1e308})
    with pytest.raises(ValueError, match=r"latency times up to 1e\+308 are too large to add up"):
        wb.plan_budgets([10, 20], 2, latency={16: 1e308, 32: 1e308})


def test_running_max_refuses_what_max_would_drop():
    """``max(-inf, nan)`` is -inf: a NaN time once vanished from the smoothed table."""
    with pytest.raises(ValueError, match=r"budget 1 = nan"):
        planner.running_max({1: NAN, 2: 1.0})
    with pytest.raises(ValueError, match=r"budget 2 = -1.0"):
        planner.running_max({1: 1.0, 2: -1.0})
    assert planner.running_max({1: 2.0, 2: 1.0, 3: 0.0}) == {1: 2.0, 2: 2.0, 3: 2.0}


def test_weights_that_overflow_are_refused():
    """Two weights of 1e308 sum to inf: every probability became 0 and the plan served nothing."""
    for call in (lambda m: wb.plan_budgets(m, 2), lambda m: wb.expected_padding(m, [32])):
        with pytest.raises(ValueError, match=r"mix weights sum to inf \(largest 1e\+308\), beyond float64"):
            call({10: 1e308, 20: 1e308})
        for bad in (NAN, INF, -1.0, 0):
            with pytest.raises(ValueError, match=r"mix weights must be finite numbers > 0"):
                call({10: bad, 20: 1.0})


def test_non_positive_budgets_and_counts_are_refused():
    with pytest.raises(ValueError, match=r"max_graphs must be an integer >= 1.*got 0"):
        wb.plan_budgets([10, 20], 0)
    for bad in (0, -1, NAN):
        with pytest.raises(ValueError, match=r"max_pool_bytes must be a finite positive number of bytes"):
            wb.plan_budgets([10, 20], 2, max_pool_bytes=bad, cfg="tiny-qwen2-vl")
    with pytest.raises(ValueError, match=r"budgets must be positive integers.*\[0\]"):
        wb.expected_padding([10, 20], [0, 32])
    with pytest.raises(ValueError, match=r"max_tokens=0 must be a positive integer"):
        wb.geometric_budgets(0)


def test_possible_numbers_still_plan():
    """Zero times, subnormal weights and large finite ones stay valid: only the impossible is refused."""
    assert wb.plan_budgets([10, 20], 2, latency={16: 0.0, 32: 0.0}) == [20]
    assert wb.plan_budgets({10: 5e-324, 20: 5e-324}, 2) == [10, 20]
    assert wb.plan_budgets({10: 1e307, 20: 1e307}, 1) == [20]
    got = wb.expected_padding([10, 20], [16, 32], latency=lambda t: float(t))
    assert got["expected_time"] == 24.0


# ------------------------------------------------------------------------------------------------
# advise
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mix", ["", "   "])
def test_an_empty_mix_is_refused_naming_the_valid_ones(mix):
    """``--mix ""`` once meant the default mix, silently."""
    with pytest.raises(SystemExit) as e:
        main(["advise", "--preset", PRESET, "--mix", mix])
    assert f"advise --mix {mix!r}: empty; valid: {', '.join(MIX_NAMES)}, or --set image_folder=PATH" in str(e.value)
    with pytest.raises(ValueError, match=r"unknown image mix .*; valid: phone_photos"):
        advise(PRESET, mix)


@pytest.mark.parametrize("value", ["0", "-3", "nan", "1.5"])
def test_max_graphs_on_the_command_line_must_be_positive(value, capsys):
    with pytest.raises(SystemExit):
        main(["advise", "--preset", PRESET, "--max-graphs", value])
    assert f"argument --max-graphs: '{value}' is not a whole number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("kw, says", [
    (dict(engine_max_budget=0), r"engine_max_budget=0 must be a positive integer"),
    (dict(engine_max_budget=-64), r"engine_max_budget=-64 must be a positive integer"),
    (dict(engine_max_budget=NAN), r"engine_max_budget=nan must be a positive integer"),
    (dict(engine_max_budget=True), r"engine_max_budget=True must be a positive integer"),
    (dict(max_graphs=0), r"max_graphs=0 must be a positive integer"),
    (dict(max_graphs=-2), r"max_graphs=-2 must be a positive integer"),
    (dict(max_graphs=2.5), r"max_graphs=2.5 must be a positive integer"),
])
def test_advise_refuses_non_positive_budgets_and_counts(kw, says, tmp_path):
    """Once silently raised to 64 (engine_max_budget) or ignored where the planner's set was short enough."""
    with pytest.raises(ValueError, match=says):
        advise(PRESET, MIX, tmp_path, **kw)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """(the advice from the committed runs, the staging run it read, that run's cast_cost table): what a bad
    copy is made of."""
    a = advise(PRESET, MIX, _results_with(None, tmp=tmp_path_factory.mktemp("committed")))
    run = COMMITTED / a.staging.run
    return a, run, pd.read_parquet(run / "cast_cost.parquet")


def _results_with(run, table=None, tmp=None):
    """A new results folder under ``tmp`` holding the committed runs and, newest of all, a copy of ``run``
    whose cast_cost table is ``table`` (a GPU run: advise reads it before the committed ones)."""
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(dir=tmp))
    (root / "reference").symlink_to(COMMITTED, target_is_directory=True)
    if run is not None:
        new = root / "20991231T000000Z-abc1234-impossible"
        new.mkdir()
        shutil.copy(run / "meta.json", new / "meta.json")
        table.to_parquet(new / "cast_cost.parquet")
    return root


def _staging_us(table, where=None):
    mask = table.metric == "staging_us"
    return mask if where is None else mask & where


def test_a_negative_or_nan_staging_time_is_never_the_cheapest(staged, tmp_path, capsys):
    a, run, table = staged
    cheapest = a.staging.text.split(": ", 1)[1].split(" / ")[0]          # the design the good run recommends
    bad = table.copy()
    bad.loc[_staging_us(bad, bad.design == cheapest), "value"] = -5.0
    second = next(d for d in bad.design.unique() if d != cheapest)
    bad.loc[_staging_us(bad, bad.design == second), "value"] = NAN
    got = advise(PRESET, MIX, _results_with(run, bad, tmp_path))
    assert got.staging.run == "20991231T000000Z-abc1234-impossible"
    assert f": {cheapest} /" not in got.staging.text and f": {second} /" not in got.staging.text
    assert "-5.0 us" not in got.staging.text and "nan us" not in got.staging.text
    assert re.search(r"; \d+ impossible row\(s\) skipped", got.staging.text), got.staging.text
    assert main(["advise", "--preset", PRESET, "--mix", MIX, "--results", str(_results_with(run, bad, tmp_path))]) == 0
    assert "impossible row(s) skipped" in capsys.readouterr().out


def test_a_run_of_only_impossible_staging_times_says_so(staged, tmp_path):
    a, run, table = staged
    bad = table.copy()
    bad.loc[_staging_us(bad), "value"] = NAN
    got = advise(PRESET, MIX, _results_with(run, bad, tmp_path))
    assert got.choice is None
    assert re.fullmatch(r"all \d+ staging rows of the cast_cost run hold impossible numbers \(negative or non-finite "
                        r"time, budget below 1 token\): none used", got.staging.text), got.staging.text
    assert got.staging.run == "20991231T000000Z-abc1234-impossible"


def test_a_zero_budget_in_a_run_table_is_passed_over(staged, tmp_path, capsys):
    """It gave "advise: math domain error" (the log of a zero budget) and no advice at all."""
    a, run, table = staged
    bad = table.copy()
    bad.loc[bad.budget == bad.budget.min(), "budget"] = 0
    assert main(["advise", "--preset", PRESET, "--mix", MIX, "--results", str(_results_with(run, bad, tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "math domain error" not in out and "impossible row(s) skipped" in out
    assert math.isfinite(float(re.search(r"([\d.]+) us per replay", out)[1]))

