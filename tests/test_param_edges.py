"""Every study at the edges of its declared parameter ranges, on a tiny preset, through what a sweep
does with it: measure, write the table (the step that once failed after measuring, leaving a failed
run folder), read it back and draw the run's figures.

The minimums are read from the declarations themselves (`minimums`): a range a study declares is
one it must honour, so a minimum changed in a params.py is pushed here without editing this file.
Maximums are pushed where they are cheap on a CPU: the seed cap, a fill of 1, a load just below
1.5, the cores of this machine, a model's full capture budget on the meta device, every merged
token its own image. Other list parameters are narrowed to one or two values only to keep each run
short; a minimum never is.
"""
from __future__ import annotations

import pytest

from workbench import limits
from workbench.stages import save_run_figures
from workbench.studies import discover, save_table
from workbench.results.tables import load_table, wide

PRESET = "tiny-qwen2-vl"
SEED_MAX = limits.current().seed


def minimums(study: str) -> dict:
    """Each numeric parameter of ``study`` that declares a minimum, at it (a list: that one value)."""
    out = {}
    for p in discover()[study].params:
        if p.minimum is None or p.kind not in ("int", "float", "list[int]", "list[float]"):
            continue
        value = int(p.minimum) if "int" in p.kind else float(p.minimum)
        out[p.name] = [value] if p.is_list else value
    return out


def measured(study: str, tmp_path, **overrides):
    """``study`` run on the CPU with ``overrides``, its table saved into a run folder as a sweep saves it,
    loaded back and its figures drawn; the wide table (one row per cell)."""
    s = discover()[study]
    resolved = s.resolve("cpu", overrides)          # the edges are inside the declared ranges
    table = s.run(device="cpu", progress=False, **overrides)
    run_dir = tmp_path / f"{study}-run"
    path = save_table(study, table, run_dir=run_dir, params=resolved)
    again = load_table(path)
    assert len(again) == len(table) and set(again.metric) == set(table.metric)
    problem = save_run_figures(s, path, run_dir)
    assert problem is None, problem
    return wide(again)


def test_the_minimums_cover_every_bounded_number():
    """The edges pushed below are the declared ones: every int or float parameter with a minimum, none
    forgotten, each of them accepted at that minimum."""
    expected = {
        "correctness": {"depth", "max_pixels", "budgets", "max_items", "dp_world_size", "seed"},
        "cast_cost": {"depth", "budgets", "reps", "min_reps", "seed"},
        "padding_waste": {"depth", "max_items", "n_items", "reps", "seed"},
        "fp32_memory": {"depth", "budgets", "seed"},
        "encoder_latency": {"depth", "tokens", "images", "reps", "min_reps", "warmup", "mix_items", "fresh",
                            "engine_max_budget", "seed"},
        "input_path": {"depth", "n_items", "max_side", "threads", "workers", "sim_requests", "reps", "min_reps",
                       "seed"},
        "contention": {"depth", "n_items", "max_side", "jpeg_qualities", "threads", "sim_requests", "reps", "seed"},
    }
    for study, names in expected.items():
        got = minimums(study)
        assert set(got) >= names, (study, names - set(got))
        discover()[study].resolve("cpu", got)


def test_correctness_at_its_minimums(tmp_path):
    """One block, the smallest image, a one-token budget holding one item, one dp rank: every path runs."""
    w = measured("correctness", tmp_path, **minimums("correctness"), families=[PRESET], placements=["tower"],
                 norms=["eager"], buffer_dtypes=["uint8"], hazard=False)
    assert set(w.depth) == {1} and {"eager", "dp"} <= set(w.path)


def test_correctness_at_the_seed_cap_and_two_ranks(tmp_path):
    w = measured("correctness", tmp_path, families=[PRESET], depth=1, budgets=[1, 16], max_items=1, dp_world_size=2,
                 seed=SEED_MAX, placements=["tower"], norms=["eager"], buffer_dtypes=["uint8"],
                 paths=["eager", "cudagraph", "dp"], hazard=False)
    assert {"eager", "dp"} <= set(w.path)


def test_cast_cost_at_its_minimums_and_the_fill_edges(tmp_path):
    """A one-token budget (four pixel rows), one repetition, fills from almost nothing to full."""
    w = measured("cast_cost", tmp_path, **minimums("cast_cost"), presets=[PRESET], fills=[1e-6, 1.0])
    assert set(w.budget) == {1} and set(w.fill) == {1e-6, 1.0}


def test_cast_cost_at_the_seed_cap(tmp_path):
    w = measured("cast_cost", tmp_path, presets=[PRESET], depth=1, budgets=[16], fills=[1.0], reps=1, min_reps=1,
                 seed=SEED_MAX, designs=["uint8_buffer", "runner", "fold"])
    assert set(w.design) == {"uint8_buffer", "runner", "fold"}


def test_padding_waste_at_its_minimums(tmp_path):
    """One item drawn, one item per replay, one repetition, every budget set."""
    w = measured("padding_waste", tmp_path, **minimums("padding_waste"), presets=[PRESET])
    assert 1 in set(w.max_items.dropna())


def test_padding_waste_with_more_items_per_replay_than_drawn(tmp_path):
    w = measured("padding_waste", tmp_path, presets=[PRESET], depth=1, max_items=[4], n_items=1, reps=1,
                 seed=SEED_MAX, budget_sets=["planner_time", "vllm-0.34"])
    assert 4 in set(w.max_items.dropna())


def test_fp32_memory_at_both_ends(tmp_path):
    """Modelled on the meta device on a CPU: a one-token budget and a one-block tower, and the caps of
    both (the largest budget, the deepest tower) at the seed cap."""
    lo = measured("fp32_memory", tmp_path / "lo", **minimums("fp32_memory"), presets=[PRESET])
    assert set(lo.budget) == {1}
    cap = limits.current()
    hi = measured("fp32_memory", tmp_path / "hi", presets=[PRESET], depth=cap.depth, budgets=[cap.budget_tokens],
                  seed=SEED_MAX)
    assert set(hi.budget) == {cap.budget_tokens}


def test_encoder_latency_at_its_minimums(tmp_path):
    """One merged token in one image, one timed call and no warm-up, batches of one item, no fresh
    batch, the smallest engine budget."""
    w = measured("encoder_latency", tmp_path, **minimums("encoder_latency"), presets=[PRESET])
    assert set(w.tokens.dropna()) >= {1}


def test_encoder_latency_with_one_token_per_image_at_the_seed_cap(tmp_path):
    """As many images as merged tokens (the most a token count holds), a fresh batch of one item."""
    w = measured("encoder_latency", tmp_path, presets=[PRESET], depth=1, tokens=[4], images=[1, 4], reps=1,
                 min_reps=1, warmup=0, mix_items=[1], fresh=1, engine_max_budget=64, seed=SEED_MAX)
    assert {1, 4} <= set(w.images.dropna())


def test_input_path_at_its_minimums(tmp_path):
    """The known failure: one image drawn made its single-image and whole-draw rows the same cell.
    Now one row per placement and path holds both, and the load model still runs on it."""
    w = measured("input_path", tmp_path, **minimums("input_path"), presets=[PRESET])
    enc = w[w.encoder_ms.notna()]
    assert not enc.empty and set(enc.k) == {1.0}
    assert (enc.batch_ms == enc.encoder_ms).all()             # the whole draw is the one image
    assert w.max_images_per_s.notna().any()


def test_contention_at_its_minimums(tmp_path):
    """One block, one image of 16 pixels a side, JPEG quality 1, one host thread, one repetition, the fewest
    simulated requests: every part runs and the duty cycle's top, 1, is taken."""
    w = measured("contention", tmp_path, **minimums("contention"), presets=[PRESET], mixes=["photos"],
                 beside=["same_process"], duty_cycles=[1.0])
    assert {"decode", "interference", "serving"} <= set(w.part) and "jpeg-q1" in set(w.encoding)


def test_input_path_at_its_maximums(tmp_path):
    """Every core of this machine, a load just below its bound, the workers' cap, the seed cap, the long
    side's cap (the images as drawn)."""
    cores = limits.cpu_count()
    w = measured("input_path", tmp_path, presets=[PRESET], depth=1, n_items=2, max_side=limits.current().budget_tokens,
                 threads=sorted({1, cores}), workers=[limits.current().workers], loads=[1e-6, 1.49],
                 sim_requests=100, reps=1, min_reps=1, seed=SEED_MAX)
    assert cores in set(w.threads.dropna()) and {2.0} == set(w[w.batch_ms.notna()].k)
