"""The padding-waste study on the CPU: its numbers checked against independent counts."""
import gc

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.config import VisionConfig
from workbench.memory_model import count_allocations, trace_peak_bytes
from workbench.planner import expected_padding, running_max
from workbench.runner import default_budgets
from workbench.samples import mix_distribution, mix_tokens
from workbench.studies import check_table, wide
from workbench.studies import padding_waste as pw
import workbench.studies.padding_waste.params  # noqa: F401  (binds padding_waste.params)

PRESET = "tiny-qwen2-vl"


@pytest.fixture(scope="module")
def table():
    return pw.run(device="cpu", progress=False, preset=PRESET, mixes=["photos"], n_items=5, max_items=[1, 4],
                  reps=1, seed=3)


def _per_row_matmul_flops(cfg) -> int:
    w, m = cfg.width, cfg.mlp_hidden
    mlp = 2 * w * m if cfg.family == "qwen2-vl" else 3 * w * m
    merged = w * cfg.merge_unit
    # per pixel row: patch embedding and every block; per merged token (4 rows): the merger
    return 2 * (cfg.patch_dim * w + cfg.depth * (4 * w * w + mlp)) + 2 * (merged * merged + merged * cfg.out_hidden) // 4


def test_the_table_holds_to_the_schema_and_has_every_case(table):
    check_table(table)
    w = wide(table)
    assert set(w.case) == {"replay", "edge", "expected", "runner", "curve", "sizes", "out_of_sample"}
    assert set(w[w.case == "runner"].budget_set) == set(pw.params.BUDGET_SETS)
    # out of sample: each set on the draw the planner was fitted to, on held-out draws and on the other mixes;
    # on its own draw the planner (optimal there, as many graphs) pads no more than the engine's grid
    o = w[w.case == "out_of_sample"].set_index(["judged_set", "sample"])
    assert set(o.index.get_level_values("sample")) == {"fitted draw", "held-out draws", "other mixes"}
    assert o.loc[("planner, equal graphs", "fitted draw"), "padded_frac_judged"] <= \
        o.loc[("engine default", "fitted draw"), "padded_frac_judged"]
    assert (table.device.str.startswith("cpu")).all()


def test_single_item_padding_equals_an_independent_count_from_the_drawn_items(table):
    cfg = VisionConfig.preset(PRESET)
    tokens = np.array(mix_tokens("photos", 5, seed=3, cfg=cfg))
    w = wide(table)
    runs = w[(w.case == "runner") & (w.max_items == 1)]
    for r in runs.itertuples():
        budgets = np.array([int(b) for b in r.budgets.split(",")])
        fit = np.array([budgets[budgets >= t].min() for t in tokens])
        assert r.padded_frac == pytest.approx(((fit - tokens).sum()) / fit.sum())
        assert r.replays_per_image == 1 and r.misses == 0
        # matmuls run over every padded row; the CPU attention path spends nothing on them
        assert r.matmul_flops_padding == pytest.approx(_per_row_matmul_flops(cfg) * 4 * (fit - tokens).sum())
        assert r.attention_flops_padding == 0
        assert r.rel_err_vs_eager < 1e-5      # fp32 on the CPU: the runner's output is eager's


def test_expected_padding_and_the_planner_beat_powers_of_two(table):
    w = wide(table)
    exp = w[w.case == "expected"].set_index("budget_set")
    dist = dict(mix_distribution("photos", VisionConfig.preset(PRESET)))
    pow2 = default_budgets(max(dist))
    assert exp.loc["pow2", "budgets"] == ",".join(map(str, pow2))
    assert exp.loc["pow2", "padded_frac_expected"] == pytest.approx(expected_padding(dist, pow2)["padded_frac"])
    assert exp.loc["planner", "graphs"] <= len(pow2)
    assert exp.loc["planner", "padded_frac_expected"] <= exp.loc["pow2", "padded_frac_expected"]
    assert exp.loc["planner", "padded_frac_expected"] <= exp.loc["geometric", "padded_frac_expected"] + 1e-12
    curve = w[w.case == "curve"].sort_values("max_graphs")
    assert list(curve.max_graphs) == list(range(1, len(pow2) + 1))
    assert np.all(np.diff(curve.padded_frac_expected) <= 1e-12)      # more graphs never pad more


def test_packing_replays_fewer_times_than_items(table):
    w = wide(table)
    packed = w[(w.case == "runner") & (w.max_items == 4)]
    assert (packed.replays_per_image <= 1).all()
    single = w[(w.case == "runner") & (w.max_items == 1)].set_index("budget_set")
    for r in packed.itertuples():
        assert r.padded_frac <= single.loc[r.budget_set, "padded_frac"] + 1e-12


def test_a_latency_table_with_noise_is_made_monotone_for_the_planner():
    assert running_max({64: 1.0, 128: 0.9, 256: 2.0}) == {64: 1.0, 128: 1.0, 256: 2.0}


def test_bad_parameters_name_the_value_and_the_choices():
    with pytest.raises(ValueError, match="mixes"):
        pw.run(device="cpu", progress=False, mixes=["bogus"])
    with pytest.raises(ValueError, match="budget_sets"):
        pw.run(device="cpu", progress=False, budget_sets=["pow3"])


def test_the_allocation_counter_keeps_memory_alive_while_a_view_holds_it():
    """A tensor that dies while a view of it lives has not freed its memory (q, k, v split from
    one qkv output): the counter follows the storage, not the tensor object."""
    def fn():
        y = torch.ones(64, 64) * 2          # one fresh tensor: 16 KiB
        return y[:1]                         # y dies here; the view keeps its storage
    trace, out = count_allocations(fn)
    allocs = [k for kind, k, n in trace if kind == "alloc" and n == 64 * 64 * 4]
    freed = {k for kind, k, _ in trace if kind == "free"}
    assert len(allocs) == 2                   # ones() and the product
    assert allocs[1] not in freed             # the product's memory is still held by `out`
    assert trace_peak_bytes(trace)["end_bytes"] == 64 * 64 * 4
    del out
    gc.collect()
    assert ("free", allocs[1], 64 * 64 * 4) in trace


def test_padding_cost_model_of_the_gpu_study_runs_on_a_committed_run():
    """tools/padding_cost.py prices the study's forwards with a committed H200 replay table: one
    step per replay-table budget and per mix x set x max_items, and the runners as built now
    (one warm-up, exact-fit graphs where used, one encode per cell) cost less than before."""
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("padding_cost", root / "tools" / "padding_cost.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    runs = sorted((root / "results" / "reference").glob("*glm4v/padding_waste.parquet"))
    table = pd.read_parquet(runs[-1])
    now = tool.step_seconds(table, "glm-4.1v-9b", 2, before=False)
    then = tool.step_seconds(table, "glm-4.1v-9b", 2, before=True)
    assert len(now) == len(then) == 17 + 7 * 4 * 2
    assert all(a <= b for a, b in zip(now, then)) and sum(now) < 0.7 * sum(then)
    # a mix's sets that give one runner share it: those steps issue no forward
    unshared = tool.step_seconds(table, "glm-4.1v-9b", 2, before=False, shared=False)
    assert all(a <= b for a, b in zip(now, unshared)) and 0.0 in now and 0.0 not in unshared
    with pytest.raises(SystemExit, match="no replay table for 'qwen3-vl-8b'"):
        tool.step_seconds(table, "qwen3-vl-8b", 2, before=False)


def test_the_finding_gives_each_tower_its_own_verdicts(table):
    """One paragraph per run and tower: the padded fractions of powers of two and of the planner,
    the runner's check and (GPU run) the steps where a padded replay loses to eager, each from the
    rows of that run; a CPU run says it is a smoke test."""
    from pathlib import Path
    import workbench.studies.padding_waste.summary  # noqa: F401  (binds padding_waste.summary)

    refs = Path(__file__).resolve().parents[1] / "results" / "reference"
    ref = sorted(refs.glob("*qwen3vl/padding_waste.parquet"))[-1]
    both = pd.concat([table.assign(run="local", reference=False),
                      pd.read_parquet(ref).assign(run=ref.parent.name, reference=True)], ignore_index=True)
    cpu, gpu = pw.summary.findings(both).split("\n\n")
    for p, rows in ((cpu, wide(table)), (gpu, wide(pd.read_parquet(ref)))):
        exp = rows[rows.case == "expected"].pivot_table(index="mix", columns="budget_set",
                                                        values="padded_frac_expected")
        assert f"{pw.summary._span(exp.pow2)} of replayed rows with powers of two, {pw.summary._span(exp.planner)}" in p
        runs = rows[rows.case == "runner"]
        assert f"max rel_err {runs.rel_err_vs_eager.max():.2g}" in p
    assert cpu.startswith(f"On {PRESET} on cpu") and "CPU run" in cpu and "CPU run" not in gpu
    edge = wide(pd.read_parquet(ref)).query("case == 'edge'")
    assert gpu.startswith("On qwen3-vl-8b on NVIDIA H200")
    assert f"slower than eager at {int((edge.edge_replay_ms > edge.eager_ms).sum())}/{len(edge)} steps" in gpu
