"""Budgets judged out of sample (`workbench.budget_judge`): batches, padding, the eager tail, the verdict."""
import numpy as np
import pytest

from workbench import budget_judge as bj
from workbench import engines


def test_batches_sum_consecutive_items_for_each_size():
    assert bj.requests([1, 2, 3, 4, 5], (1, 2)).tolist() == [1, 2, 3, 4, 5, 3, 7]
    assert bj.requests([1, 2, 3, 4], (4,)).tolist() == [10]


def test_judge_counts_padding_the_eager_tail_and_rows():
    # budgets 10, 20: 5 -> 10 (5 padded), 20 -> 20, 30 -> eager at its own size
    s = bj.judge(np.array([5, 20, 30]), [10, 20])
    assert s["padded_frac"] == pytest.approx(5 / 30) and s["eager_frac"] == pytest.approx(1 / 3)
    assert s["rows_ratio"] == pytest.approx((10 + 20 + 30) / 55)
    exact = bj.judge(np.array([5, 20, 30]), [40], exact=True)        # a graph per length: nothing padded
    assert exact["padded_frac"] == 0 and exact["eager_frac"] == 0 and exact["rows_ratio"] == 1


def test_out_of_sample_fits_on_one_draw_and_judges_on_others():
    t = bj.out_of_sample("screenshots", "qwen2.5-vl-7b", held_out=2, n=128)
    assert set(t["set"]) == set(bj.SETS) and set(t["sample"]) == {"fitted draw", "held-out draws", "other mixes"}
    sets = t.attrs["sets"]
    assert sets["engine default"] == engines.get("vllm-0.34").budgets(16384)
    assert len(sets["planner, fewest graphs"]) <= len(sets["planner, equal graphs"]) <= 36
    assert sets["planner, equal pool"][-1] <= 5120
    by = t.set_index(["set", "sample"])
    # the planner is fitted to its own draw: out of sample it pads at least as much there as on it
    assert by.loc[("planner, equal graphs", "other mixes"), "padded_frac"] >= \
        by.loc[("planner, equal graphs", "fitted draw"), "padded_frac"]
    winner, said = bj.verdict(t)
    held = t[t["sample"] == "held-out draws"].set_index("set")
    if winner is None:
        assert "keep the engine's budgets" in said
        assert (held.drop(index="engine default").rows_ratio >= held.loc["engine default", "rows_ratio"]).all()
    else:
        assert held.loc[winner, "rows_ratio"] < held.loc["engine default", "rows_ratio"] and said.startswith(winner)
