"""The encoder latency study on the CPU (tiny presets, fp32, emulated graphs) and the graph runner's
phase timing it reads. Timings are never asserted: only that they exist, and how they relate."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import workbench as wb
from workbench.runner import PHASES, EncoderGraphRunner
from workbench.studies import STUDIES, ParamError, check_table, load_table, wide
import workbench.studies.correctness.measure  # noqa: F401  (binds correctness.measure)
import workbench.studies.encoder_latency.measure  # noqa: F401  (binds encoder_latency.measure)
import workbench.studies.encoder_latency.params  # noqa: F401  (binds encoder_latency.params)
import workbench.studies.encoder_latency.summary  # noqa: F401  (binds encoder_latency.summary)

ROOT = Path(__file__).resolve().parents[1]
TINY = ["tiny-qwen2-vl", "tiny-qwen2.5-vl"]


# =========================================================================== runner phases

@pytest.mark.parametrize("preset", TINY)
def test_runner_phases_are_timed_and_change_nothing(preset, seed):
    from workbench.studies.encoder_latency.measure import latency_batch
    cfg = wb.VisionConfig.preset(preset)
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=seed)
    gen = torch.Generator().manual_seed(seed)
    # at most 2 items per replay: packs of 4 + 8 and 8 + 8 tokens (budget 16 each), one miss (64 > 32)
    batch = wb.PatchBatch.cat([latency_batch(cfg, t, 1, gen) for t in (8, 8, 8, 4, 64)])
    runner = EncoderGraphRunner(enc, budgets=[16, 32], buffer_dtype=torch.uint8, max_items=2)
    plain = runner.encode(batch)
    phases: dict = {}
    timed = runner.encode(batch, phases=phases)
    assert torch.equal(plain, timed)
    assert set(PHASES) <= set(phases) and "miss" in phases
    assert all(isinstance(v, float) and v > 0 for v in phases.values())
    # the dict accumulates: a second call adds to every phase
    before = dict(phases)
    again = runner.encode(batch, phases=phases)
    assert torch.equal(plain, again)
    assert all(phases[k] > before[k] for k in PHASES)
    st = runner.stats_frame()
    assert len(st) == 3 * 3 and st.miss.sum() == 3


def test_runner_without_misses_has_no_miss_phase_and_refuses_a_non_dict():
    from workbench.studies.encoder_latency.measure import latency_batch
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=0)
    batch = latency_batch(cfg, 16, 2, torch.Generator().manual_seed(0))
    runner = EncoderGraphRunner(enc, budgets=[16], max_items=2)
    phases: dict = {}
    runner.encode(batch, phases=phases)
    assert set(phases) == set(PHASES)
    with pytest.raises(TypeError, match="phases must be a dict"):
        runner.encode(batch, phases=[])


# =========================================================================== the study

@pytest.fixture(scope="module")
def latency_table():
    from workbench.studies import encoder_latency
    return encoder_latency.run(device="cpu", progress=False, presets=TINY, tokens=[16, 32], images=[1, 4], reps=2,
                               warmup=0, breakdown=True, mixes=[])


def test_latency_table_holds_to_the_schema_and_has_the_metrics(latency_table):
    from workbench.studies import encoder_latency as s
    t = check_table(latency_table)
    assert {"p50_ms", "p90_ms", "speedup", "x_floor", "floor_ms", "speedup_vs_transformers", "cos_min", "rel_err",
            "ok", "bit_equal", "phases_ms", *s.params.PHASE_METRICS} <= set(t.metric)
    assert set(t.metric) <= set(s.params.METRICS)
    assert t.device.str.startswith("cpu").all()
    w = wide(t)
    assert set(w.preset) == set(TINY) and set(w.tokens) == {16, 32} and set(w.images) == {1, 4}
    assert set(w.path) == set(s.params.LATENCY_PATHS) and set(w.dtype) == {"float32"}
    assert len(w) == 2 * 2 * 2 * 3
    assert (w.p50_ms > 0).all() and (w.p90_ms >= w.p50_ms).all()


def test_graph_equals_eager_and_ours_agrees_with_transformers(latency_table):
    w = wide(latency_table)
    g = w[w.path == "graph"]
    assert g.ok.all() and g.bit_equal.all() and (g.rel_err == 0).all()
    tr = w[w.path == "transformers"]
    assert tr.ok.all() and (tr.cos_min > 0.99999).all() and (tr.rel_err < 1e-5).all()
    assert w[w.path == "eager"].ok.all()


def test_speedup_floor_and_phases_are_consistent(latency_table):
    w = wide(latency_table)
    cell = ["preset", "tokens", "images"]
    p50 = w.pivot_table(index=cell, columns="path", values="p50_ms")
    g = w[w.path == "graph"].set_index(cell)
    assert np.allclose(g.speedup, (p50.eager / p50.graph).loc[g.index])
    assert np.allclose(g.speedup_vs_transformers, (p50.transformers / p50.graph).loc[g.index])
    assert np.allclose(w.x_floor, w.p50_ms / w.floor_ms)
    assert np.allclose(w.floor_ms, (w.flops_matmul + w.flops_attention_full + w.flops_attention_window)
                       / (w.matmul_tflops * 1e9))
    assert np.allclose(w[w.path == "eager"].speedup, 1.0)
    # qwen2-vl has full attention only; qwen2.5-vl counts its window blocks separately
    assert (w[w.family == "qwen2-vl"].flops_attention_window == 0).all()
    assert (w[w.family == "qwen2.5-vl"].flops_attention_window > 0).all()
    phases = g[["plan_ms", "metadata_ms", "staging_ms", "replay_ms", "copy_out_ms"]]
    assert (phases > 0).all().all()
    assert (phases.sum(axis=1) <= g.phases_ms * 1.5).all()
    assert w[w.path != "graph"].replay_ms.isna().all()


def test_practical_floor_and_kernel_breakdown(latency_table):
    """The practical floor is the matmul FLOPs at the matmul rate plus each attention kind's FLOPs at
    the rate measured for the cell's shapes; the breakdown profiles the graph path's kernels."""
    w = wide(latency_table)
    window = (w.flops_attention_window / (w.attn_tflops_window * 1e9)).fillna(0.0)
    want = w.flops_matmul / (w.matmul_tflops * 1e9) + w.flops_attention_full / (w.attn_tflops_full * 1e9) + window
    assert np.allclose(w.practical_floor_ms, want) and np.allclose(w.x_practical_floor, w.p50_ms / want)
    assert w[w.family == "qwen2-vl"].attn_tflops_window.isna().all()
    assert (w[w.family == "qwen2.5-vl"].attn_tflops_window > 0).all() and (w.attn_tflops_full > 0).all()
    g = w[w.path == "graph"]
    cats = [c for c in w if c.startswith("kernel_") and c.endswith("_ms")]
    assert len(cats) == 8 and (g[cats] >= 0).all().all() and (g.kernel_matmul_ms > 0).all()
    assert (g.kernel_attention_ms > 0).all() and (g.kernels_per_call > 0).all()
    assert (g.prepare_uncached_ms > 0).all() and w[w.path != "graph"].prepare_uncached_ms.isna().all()
    assert w[w.path != "graph"][cats].isna().all().all()
    assert (g.fused == False).all() and (g.exact_fit == False).all()   # noqa: E712  (plain on a CPU)


def test_kernel_names_fall_into_categories():
    from workbench.kernel_profile import kernel_category
    names = {"nvjet_sm90_tst_56x64_64x14_4x2_h_bz_bias_TNN": "matmul",
             "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x128_64x3_tn_align2>": "matmul",
             "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<96, 128, 64, 4>>": "attention",
             "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3": "attention",
             "_add_norm_kernel": "norm", "void at::native::vectorized_layer_norm_kernel<c10::BFloat16>": "norm",
             "_rotary_kernel": "rotary", "_rotary_tiled_kernel": "rotary",
             "_quick_gelu_kernel": "activation", "_silu_mul_kernel": "activation",
             "_rows_kernel": "input_norm", "Memcpy DtoD (Device -> Device)": "copy", "aten::addmm": "matmul",
             "aten::index": "copy", "aten::mul": "elementwise"}
    assert {n: kernel_category(n) for n in names} == names


def test_presentation_and_summary(latency_table, tmp_path):
    from workbench.studies import encoder_latency as s
    tab = s.summary.latency_table(latency_table)
    assert len(tab) == 24 and list(tab.path[:3]) == ["eager", "graph", "transformers"]
    (dev, key), = s.summary.key_numbers(latency_table).items()
    assert dev.startswith("cpu") and len(key) == 8
    assert np.allclose(key["graph speedup over eager (x)"], key["eager ms"] / key["graph ms"])
    text = s.summary.findings(latency_table)
    assert text.startswith(f"On {dev}:") and "graph output equals eager in 8/8 cells" in text
    assert "agrees with transformers in 8/8" in text and "emulated" in text
    wins = int((key["graph speedup over eager (x)"] > 1).sum())
    assert f"graphs beat eager in {wins}/8 cells" in text and "practical floor" not in text    # no floor on a CPU
    # as the report calls it: all runs concatenated, with run and reference columns
    both = [latency_table.assign(run="a", reference=False), latency_table.assign(run="b", reference=True)]
    import pandas as pd
    summary = s.STUDY.summarize(pd.concat(both, ignore_index=True), tmp_path)
    assert len(summary.figures) == 6 and all((tmp_path / Path(f).name).exists() for f in summary.figures)
    assert len(summary.tables) == 2 and "reference" in summary.text


def test_a_wrong_graph_output_is_never_timed(monkeypatch):
    from workbench.studies import encoder_latency as s

    class Broken(EncoderGraphRunner):
        def encode(self, batch, pad_value=0.0, phases=None):
            return super().encode(batch, pad_value, phases) + 1.0

    monkeypatch.setattr(s.measure, "EncoderGraphRunner", Broken)
    t = s.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], tokens=[16], images=[1], reps=1, warmup=0,
              mixes=[])
    w = wide(t)
    g = w[w.path == "graph"].iloc[0]
    assert not g.ok and g.rel_err > 0.01 and np.isnan(g.p50_ms) and np.isnan(g.get("replay_ms", np.nan))
    assert w[w.path == "eager"].p50_ms.notna().all()
    assert "equals eager in 0/1 cells" in s.summary.findings(t)


def test_a_disagreement_with_transformers_times_nothing_and_reference_can_be_skipped(monkeypatch):
    from workbench.studies import encoder_latency as s
    monkeypatch.setitem(s.measure.COS_MIN, torch.float32, 1.5)     # no cosine reaches it
    w = wide(s.run(device="cpu", progress=False, presets=["tiny-qwen2.5-vl"], tokens=[16], images=[2], reps=1,
                   warmup=0, mixes=[]))
    assert not w.ok.any() and "p50_ms" not in w
    monkeypatch.undo()
    w = wide(s.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], tokens=[16], images=[1], reps=1,
                   warmup=0, reference=False, mixes=[]))
    assert set(w.path) == {"eager", "graph"} and w.p50_ms.notna().all()
    assert (w.reps_n == 1).all() and "p50_ci_lo_ms" not in w      # one call: no interval of the median


@pytest.mark.parametrize("overrides, message", [
    (dict(presets=["bogus"]), "presets='bogus' is not a valid choice; valid: qwen2-vl-2b"),
    (dict(norm="identity"), "norm='identity' is not a valid choice; valid: eager, triton_channel"),
    (dict(dtype="float16"), "dtype='float16' is not a valid choice; valid: float32, bfloat16"),
    (dict(tokens=[64, 16]), "strictly ascending"),
    (dict(tokens=[64, 100], images=[1, 3]), "not divisible: [(64, 3), (100, 3)]"),
    (dict(nope=1), "valid: presets, depth, tokens, images, dtype, norm, fused, gemm, breakdown, reference, reps, "
                   "min_reps, warmup, mixes, image_folder, mix_items, fresh, engine_max_budget, engine, engine_cap, seed"),
    (dict(reps=3, min_reps=4), "min_reps=4 is above reps=3, the most repetitions: give min_reps <= reps"),
    (dict(mixes=["beaches"]), "mixes='beaches' is not a valid choice; valid: phone_photos"),
], ids=lambda v: str(v)[:30])
def test_a_bad_param_is_refused_naming_valid_choices(overrides, message):
    from workbench.studies import encoder_latency as s
    with pytest.raises(ParamError) as e:
        s.run(device="cpu", progress=False, **overrides)
    assert message in str(e.value) and "study 'encoder_latency'" in str(e.value)


def test_the_study_is_registered_with_cpu_and_gpu_profiles():
    from workbench.studies import encoder_latency as s
    study = STUDIES["encoder_latency"]
    assert study is s.STUDY and study.notebook == "notebooks/encoder_latency.ipynb"
    cpu, gpu = study.resolve("cpu"), study.resolve("gpu")
    assert cpu["presets"] == list(s.params.TINY_PRESETS) and cpu["dtype"] == "float32" and cpu["norm"] == "eager"
    # gpu: the decision set (the answer table's preset of each family, the cells the advice reads); gpu-full:
    # each real tower once (test below) and the full grids
    full = study.resolve("gpu-full")
    # (the answer presets of the families with a studies preset: Gemma-3 has none yet, `Family.study_presets`)
    answer = [n for n in wb.config.ANSWER_PRESETS if wb.config.PRESETS[n].family in s.params.STUDIED]
    assert gpu["presets"] == answer and full["presets"] == list(s.params.distinct_towers())
    assert "gemma3" not in s.params.STUDIED and "gemma-3-4b" in wb.config.ANSWER_PRESETS
    assert gpu["dtype"] == "bfloat16" and gpu["tokens"] == [256, 4096] and full["tokens"] == [64, 256, 1024, 4096]
    assert gpu["mix_items"] == [4] and full["mix_items"] == [1, 4] and gpu["mixes"] == full["mixes"]
    assert not gpu["breakdown"] and full["breakdown"] and gpu["fresh"] < full["fresh"]
    assert s.measure.grid_for(64, wb.VisionConfig.preset("qwen2-vl-7b")) == [1, 16, 16]
    assert s.measure.grid_for(32, wb.VisionConfig.preset("qwen2-vl-7b")) == [1, 8, 16]


def test_the_notebook_parameters_cell_is_generated_from_the_declaration():
    from workbench.studies import encoder_latency as s
    doc = json.loads((ROOT / "notebooks" / "encoder_latency.ipynb").read_text())
    (cell,) = [c for c in doc["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert "".join(cell["source"]) == s.PARAMS.parameters_cell()


def test_the_breakdown_categories_are_the_profilers():
    from workbench.kernel_profile import KERNEL_CATEGORIES
    from workbench.studies.encoder_latency.params import KERNEL_CATS
    assert sorted(KERNEL_CATS) == sorted([c for c, _ in KERNEL_CATEGORIES] + ["elementwise"])


def test_realistic_batches_time_every_strategy_checked_against_eager(tmp_path):
    """The mix cells: transformers, eager and three runners on a batch drawn from an image mix,
    each output checked against eager before it is timed, with the runners' packing recorded."""
    from workbench.studies import encoder_latency as s
    t = s.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], tokens=[16], images=[1], reps=1, warmup=0,
              mixes=["photos"], mix_items=[2], engine_max_budget=256)
    check_table(t)
    m = wide(s.summary.mix_cells(t))
    assert set(m.path) == set(s.params.MIX_PATHS) and (m.mix == "photos").all() and (m.images == 2).all()
    assert m.ok.astype(bool).all() and (m.image_p50_ms > 0).all()
    runners = m[m.path.str.startswith("graph_")].set_index("path")
    # vLLM 0.34's grid up to 256 (64 ... 224, 256: nine budgets), the photos (176-378 tokens) partly above it,
    # named in every row of the mix cells
    assert runners.loc["graph_engine", "largest_budget"] == 256 and runners.loc["graph_engine", "budgets_n"] == 9
    assert (m.engine == "vllm-0.34").all()
    assert (runners.replays + runners.eager_packs + runners.misses >= 1).all()
    assert (runners.rel_err <= s.measure.GRAPH_TOL[torch.float32]).all()
    # the exact-fit presentation is untouched by the mix rows; the mix table and figure read them
    assert set(wide(s.summary.exact_cells(t)).path) == set(s.params.LATENCY_PATHS)
    table = s.summary.mix_table(t)
    assert len(table) == 1 and table.fastest.iloc[0] in s.params.MIX_PATHS
    # the MLP GEMM the tower resolved to is recorded beside its attention (no quack on a CPU)
    cols = list(table.columns)
    assert cols[cols.index("attention") + 1] == "gemm" and (table.gemm == "cublas").all()
    assert (wide(t).gemm == "cublas").all()
    # the finding counts the realistic batches where auto is within 5% of the better strategy
    ratio = table["auto / best of eager, engine graph"].iloc[0]
    assert f"engines' graphs in {int(ratio <= 1.05)}/1." in s.summary.findings(t)
    # and against the planner's budgets too: the best of three is never slower than the best of two
    best3 = table[s.summary.BEST3].iloc[0]
    assert best3 >= ratio and f"planner's budgets: within 5% in {int(best3 <= 1.05)}/1" in s.summary.findings(t)
    keys = s.summary.key_numbers(t)
    (mixes,) = [k for dev, k in keys.items() if dev.endswith("realistic batches")]
    assert len(mixes) == 1 and mixes.fastest.iloc[0] == table.fastest.iloc[0]
    summary = s.STUDY.summarize(t.assign(run="a", reference=False), tmp_path)
    assert any("encoder_latency_mixes" in str(f) for f in summary.figures)


def test_a_stream_of_new_shapes_times_each_strategy_checked_and_leaves_a_wrong_one_out(tmp_path):
    """`measure_fresh`: every batch once per strategy, each output checked against eager's for that batch; a
    strategy wrong on one batch, or wrong in the cell's own check, has no time (none is reported for a wrong
    result); the rows of a run carry fresh_image_ms for the others."""
    import workbench as wb
    from workbench.preprocess import preprocess
    from workbench.runner import EncoderGraphRunner
    from workbench.samples import image_mix
    from workbench.studies import encoder_latency as s
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=0)
    batches = [preprocess(image_mix("photos", 2, seed=k, resized=True, cfg=cfg), cfg) for k in (1, 2)]
    runner = EncoderGraphRunner(enc, budgets=[64, 128, 256, 512], buffer_dtype=torch.uint8, max_items=4)
    calls = []

    class Wrong:                 # right on the first batch, wrong on the second
        def encode(self, batch, policy=None):
            calls.append(policy)
            out = runner.encode(batch)
            return out if len(calls) == 1 else out + 1.0

    Wrong.forget_metadata = lambda self: None
    got = s.measure.measure_fresh(enc, None, cfg, batches,
                                  {"graph_engine": (runner, "always"), "graph_auto": (Wrong(), None),
                                   "graph_planner": (runner, "always")}, skip={"graph_planner"})
    assert set(got) == {"eager", "graph_engine"} and len(calls) == 2
    assert all(m["fresh_image_ms"] > 0 and m["fresh_batches"] == 2 for m in got.values())
    started = time.perf_counter()
    t = s.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], tokens=[16], images=[1], reps=1, warmup=0,
              mixes=["photos"], mix_items=[2], engine_max_budget=256, fresh=2)
    m = wide(s.summary.mix_cells(t)).set_index("path")
    assert (m.fresh_image_ms > 0).all() and (m.fresh_batches == 2).all() and m.loc["graph_auto", "explore_calls"] == 0
    t0 = time.perf_counter()      # where the run's seconds went: each cell, its stream, the rate probe
    e = wide(t[t.path == "eager"]).set_index("case")
    assert e.loc["mix", "cell_s"] > e.loc["mix", "fresh_s"] > 0 and e.loc["exact", "cell_s"] > 0
    assert e.loc["exact", "rates_s"] > 0 and e.loc["exact", "cell_s"] > e.loc["exact", "ceiling_s"] >= 0
    assert e.loc["exact", "cell_s"] + e.loc["mix", "cell_s"] < t0 - started
    assert {"fresh: auto / transformers", "fresh stream: auto / transformers"} <= set(s.summary.mix_table(t))
    assert any("(the median batch)" in f and "(the whole stream: " in f for f in s.summary._mix_finding(t))
    assert (m.fresh_p50_image_ms > 0).all()
    # tools/latency_seconds.py reads them back from a run folder, beside the calls it timed
    from test_weights_once import load_tool
    run = tmp_path / "run"
    run.mkdir()
    t.to_parquet(run / "encoder_latency.parquet")
    (run / "meta.json").write_text(json.dumps({"params": {"studies": {"encoder_latency": {"warmup": 0, "reps": 1}}},
                                               "study_seconds": {"encoder_latency": t0 - started}}))
    got = load_tool("latency_seconds").accounting(run).iloc[0]
    assert got.cells_s == pytest.approx(e.cell_s.sum()) and got.timed_calls_s > 0 and got.build_s > 0
    assert got.cells_other_s == pytest.approx(got.cells_s - got.timed_calls_s)

def test_a_cpu_figure_never_calls_the_emulated_runner_a_cuda_graph(latency_table):
    import matplotlib
    matplotlib.use("Agg")
    from workbench.studies import encoder_latency as s
    fig = s.summary.plot_latency(latency_table)
    labels = {lab for ax in fig.axes for lab in ax.get_legend_handles_labels()[1]}
    assert not any("CUDA" in lab for lab in labels) and any("emulated" in lab for lab in labels)


def test_graph_against_eager_in_bf16_is_judged_like_a_correctness_verdict():
    """A pack can run another attention kernel than the same item alone (dense cuDNN vs flash
    varlen): a difference the correctness study's bf16 verdict passes must not leave a latency
    cell untimed. The largest such difference measured so far is in results/reference/README.md
    (the new families' encoder_latency runs, glm-4.1v-9b)."""
    from workbench.studies import correctness, encoder_latency as s
    assert s.measure.GRAPH_TOL[torch.bfloat16] == correctness.measure.TOLERANCE[torch.bfloat16]
    assert s.measure.GRAPH_TOL[torch.bfloat16] > 0.027         # that largest difference
    assert s.measure.GRAPH_TOL[torch.float32] < correctness.measure.TOLERANCE[torch.float32]     # fp32 stays at rounding


def test_realistic_batch_figure_reads_times_that_span_orders_of_magnitude():
    """Qwen3-VL's realistic batches run from milliseconds (video frames) to over a second (12 MP
    photos): the figure switches to a log axis with one range for every panel; a run whose times
    lie close together keeps a linear axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from workbench.studies import encoder_latency as el
    ref = Path(__file__).resolve().parents[1] / "results" / "reference"
    run = sorted(ref.glob("*-h200-qwen3vl/encoder_latency.parquet"))[-1]
    table = pd.read_parquet(run).assign(run=run.parent.name)
    fig = el.summary.plot_mixes(table)
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert axes and all(ax.get_xscale() == "log" for ax in axes)
    assert len({ax.get_xlim() for ax in axes}) == 1
    plt.close(fig)
    w = el.summary.mix_cells(table)
    close = w.assign(value=np.where(w.metric.str.endswith("_ms"), 10.0, w.value))  # every time 10 ms
    fig = el.summary.plot_mixes(close)
    assert all(ax.get_xscale() == "linear" for ax in fig.axes if ax.get_title())
    plt.close(fig)


def test_a_stream_of_new_shapes_takes_turns_and_its_median_batch_ignores_one_slow_call(monkeypatch):
    """The strategies take turns meeting a batch first (none always meets it cold), and one slow call (a host
    hiccup) moves the stream's sum, ``fresh_image_ms``, but not its median batch, ``fresh_p50_image_ms``. The
    clock is the test's: each fake strategy advances it by a known amount."""
    import types
    from workbench.preprocess import preprocess
    from workbench.samples import image_mix
    from workbench.studies import encoder_latency as s
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=0)
    batches = [preprocess(image_mix("photos", 2, seed=k, resized=True, cfg=cfg), cfg) for k in (1, 2, 3)]
    clock, order = [0.0], []
    monkeypatch.setattr(s.measure, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real = enc.encode
    monkeypatch.setattr(enc, "encode", lambda b, **kw: order.append("eager") or real(b, **kw))

    class Fake:
        def __init__(self, name, seconds):
            self.name, self.seconds, self.calls = name, seconds, 0

        def encode(self, batch, policy=None):
            order.append(self.name)
            clock[0] += self.seconds[self.calls]
            self.calls += 1
            return real(batch, path="eager")

        def forget_metadata(self):
            pass

    got = s.measure.measure_fresh(enc, None, cfg, batches, {"graph_engine": (Fake("graph_engine", [1.0, 10.0, 1.0]),
                                                                             "always"),
                                                            "graph_auto": (Fake("graph_auto", [2.0] * 3), None)})
    assert [order[3 * k] for k in range(3)] == ["eager", "graph_engine", "graph_auto"]
    assert got["graph_engine"]["fresh_image_ms"] == pytest.approx(12.0 * 1e3 / 6)      # the sum: the slow call
    assert got["graph_engine"]["fresh_p50_image_ms"] == pytest.approx(1.0 * 1e3 / 2)    # the median batch: not
    assert got["graph_auto"]["fresh_p50_image_ms"] == pytest.approx(2.0 * 1e3 / 2) == got["graph_auto"]["fresh_image_ms"]
    assert got["eager"]["fresh_p50_image_ms"] == 0.0 and all(m["fresh_batches"] == 3 for m in got.values())


def test_the_new_shapes_tick_names_the_column_it_shows():
    """The figure's tick is the median batch where the run kept it, the whole stream in runs made before: its
    legend says which (a committed H200 run, from before the median, and the same with a median added)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from workbench.studies import encoder_latency as el
    ref = Path(__file__).resolve().parents[1] / "results" / "reference"
    run = sorted(ref.glob("*-47bc1f8-h200-fa4-race-qwen2-vl-7b/encoder_latency.parquet"))[-1]
    old = pd.read_parquet(run).assign(run=run.parent.name)
    rows = old[old.metric == "fresh_image_ms"]
    new = pd.concat([old, rows.assign(metric="fresh_p50_image_ms")], ignore_index=True)
    for table, want in ((old, "new shapes, per image"), (new, "new shapes: median batch, per image")):
        fig = el.summary.plot_mixes(table)
        labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
        assert want in labels and not set(el.summary.FRESH_TICK.values()) - {want} & set(labels)
        plt.close(fig)


def test_a_stream_of_new_shapes_makes_every_strategy_prepare_its_own_metadata(monkeypatch):
    """The eager strategy's call must not prepare a shape for a runner that then runs it eagerly (a miss): each
    strategy's time on a new shape holds its own host metadata."""
    from workbench.preprocess import preprocess
    from workbench.samples import image_mix
    from workbench.studies import encoder_latency as s
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    enc = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=torch.float32, device="cpu", seed=0)
    runner = EncoderGraphRunner(enc, budgets=[16], buffer_dtype=torch.uint8, max_items=1)
    batches = [preprocess(image_mix("photos", 1, seed=k, resized=True, cfg=cfg), cfg) for k in (1, 2)]
    assert all(b.n_rows // cfg.merge_unit > 16 for b in batches)          # larger than the budget: a miss
    prepared = []
    real = type(enc.visual).prepare
    monkeypatch.setattr(type(enc.visual), "prepare",
                        lambda self, g, **kw: prepared.append(g.tolist()) or real(self, g, **kw))
    got = s.measure.measure_fresh(enc, None, cfg, batches, {"graph_engine": (runner, "always")})
    assert set(got) == {"eager", "graph_engine"}
    assert runner.stats_frame().miss.all()
    assert len(prepared) == 4 and prepared[0] == prepared[1] and prepared[2] == prepared[3]   # twice per batch


def test_the_realistic_batches_are_timed_with_the_models_heap_frozen(monkeypatch):
    """A full collector pass over the loaded models lands in whichever timed call triggers it: the mix
    cells and the stream of new shapes run with the heap frozen (`timing.frozen_heap`), as engines run, and
    unfrozen after (the study leaves nothing frozen)."""
    import gc
    from workbench.studies import encoder_latency as s
    seen = {}
    for name in ("measure_mix", "measure_fresh"):
        real = getattr(s.measure, name)
        monkeypatch.setattr(s.measure, name, lambda *a, _n=name, _r=real, **k:
                            seen.setdefault(_n, gc.get_freeze_count()) is None or _r(*a, **k))
    s.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], tokens=[16], images=[1], reps=1, warmup=0,
          mixes=["photos"], mix_items=[1], engine_max_budget=256, fresh=1, reference=False)
    assert set(seen) == {"measure_mix", "measure_fresh"} and min(seen.values()) > 0
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("shape", [(517, 96), (3, 5), (1, 7), (64, 1)])
def test_errors_in_place_equal_the_hosts_over_chunks(shape, monkeypatch):
    """The stream of new shapes checks its outputs where they are, in float64 chunks of rows: the same verdict
    values as the recorded host ones (up to the sums' order), one wrong row seen in any chunk."""
    from workbench import reference
    from workbench.reference import cos_min, errors_in_place, rel_err
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 200)     # many chunks, rows split across them
    g = torch.Generator().manual_seed(shape[0])
    b = torch.randn(shape, generator=g).to(torch.bfloat16)
    a = (b.float() + 1e-2 * torch.randn(shape, generator=g)).to(torch.bfloat16)
    a[-1] = -b[-1]                                            # the last row points the other way
    err, cos = errors_in_place(a, b)
    assert err == pytest.approx(rel_err(a, b), rel=1e-12) and cos == pytest.approx(cos_min(a, b), abs=1e-12)
    assert cos < -0.99 and errors_in_place(b, b) == (0.0, pytest.approx(1.0))


def test_the_realistic_batch_table_shows_how_well_autos_median_is_known():
    """Timed until known: six calls give a 95% interval of the median, recorded per strategy and
    shown for policy auto in the realistic-batch table (its half-width in percent, its calls)."""
    from workbench.studies import encoder_latency as s
    from workbench.studies.encoder_latency.summary import mix_table
    table = s.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], tokens=[16], images=[1], reps=8,
                  min_reps=6, warmup=0, reference=False, mixes=["photos"], mix_items=[1])
    w = wide(table)
    timed = w[w.p50_ms.notna()]
    assert (timed.reps_n >= 6).all() and (timed.reps_n <= 8).all()
    assert (timed.p50_ci_lo_ms <= timed.p50_ms).all() and (timed.p50_ms <= timed.p50_ci_hi_ms).all()
    m = mix_table(table)
    assert m["auto p50 95% interval (±%)"].between(0, 1000).all() and m["auto timed calls"].between(6, 8).all()


def test_auto_verdicts_counts_a_reference_and_sees_auto_slowed(tmp_path, capsys):
    """tools/auto_verdicts.py over a committed H200 run: its counts, and the same run with auto made 10% slower."""
    from test_weights_once import load_tool
    tool = load_tool("auto_verdicts")
    run = ROOT / "results/reference/20261205T025012Z-3200d44-h200-fa4-race-glm-4.1v-9b"
    t = tool.cells(run)
    got = tool.verdicts(t, 0.05).iloc[0]
    assert (got.cells, got.within, got["slower than transformers"]) == (2, 2, 0)
    table = load_table(run / "encoder_latency.parquet")
    slow = (table.path == "graph_auto") & table.metric.isin(["image_p50_ms", "fresh_image_ms"])
    poisoned = tmp_path / run.name
    poisoned.mkdir()
    table.assign(value=table.value.where(~slow, table.value * 1.1)).to_parquet(poisoned / "encoder_latency.parquet")
    auto = wide(table[table.path == "graph_auto"]).set_index("mix")
    first = auto.first_ms / (auto.image_p50_ms * auto.images)       # the first call against the steady one
    assert t.set_index("mix")["auto first / steady call"].to_dict() == pytest.approx(first.to_dict())
    got = tool.verdicts(tool.cells(poisoned), 0.05).iloc[0]
    assert (got.within, got["fresh within"]) == (0, 0)
    assert tool.main([str(run), "--csv", str(tmp_path / "cells.csv")]) == 0 and len(pd.read_csv(tmp_path / "cells.csv")) == 2
    with pytest.raises(SystemExit):
        tool.main([str(tmp_path)])                     # no table there
    assert "no encoder_latency.parquet in" in capsys.readouterr().err


def test_the_gpu_full_profile_times_every_distinct_tower_once():
    """The GPU default: one preset per tower (presets whose configs differ only in the merger's widths share
    one), every family's studies preset among them, and every real preset's tower covered."""
    import dataclasses
    from workbench.config import PRESETS, REAL_PRESET_PER_FAMILY
    from workbench.studies.encoder_latency.params import REAL_PRESETS, distinct_towers, tower_key
    gpu = STUDIES["encoder_latency"].resolve("gpu-full")["presets"]
    assert tuple(gpu) == distinct_towers()
    keys = [tower_key(n) for n in gpu]
    assert len(set(keys)) == len(keys)                                   # no tower twice
    assert {tower_key(n) for n in REAL_PRESETS} == set(keys)             # and none left out
    assert set(REAL_PRESET_PER_FAMILY) <= set(gpu) and {PRESETS[n].family for n in REAL_PRESETS} == \
        {PRESETS[n].family for n in gpu}
    for name in set(REAL_PRESETS) - set(gpu):     # what a left-out preset differs in: its merger only
        twin = next(n for n in gpu if tower_key(n) == tower_key(name))
        a, b = dataclasses.asdict(PRESETS[name]), dataclasses.asdict(PRESETS[twin])
        assert {k for k in a if a[k] != b[k]} <= {"name", "out_hidden", "merger_hidden", "checkpoint"}
    assert {"qwen2.5-vl-72b", "qwen3-vl-235b-a22b", "glm-4.5v"}.isdisjoint(gpu) and "qwen3-vl-2b" in gpu


def test_sweep_floor_counts_the_fewest_timed_forwards_at_a_committed_per_image_time(capsys):
    """tools/sweep_floor.py: a realistic cell's batch calls and an input_path image's forwards at the fewest
    repetitions, times the committed H200 per-image time; a preset without one is listed, not guessed."""
    from test_weights_once import load_tool
    tool = load_tool("sweep_floor")
    lat = dict(presets=["qwen3-vl-8b", "nope"], mixes=["documents"], mix_items=[4], warmup=2, min_reps=6, fresh=4)
    ip = dict(presets=["qwen3-vl-8b"], mixes=["documents"], n_items=8, placements=["tower", "fold"],
              paths=["eager", "cudagraph"], min_reps=6)
    assert tool.latency_calls(lat) == 5 * (1 + 2 + 6 + 4) and tool.input_path_calls(ip) == 2 * 2 * 2 * (1 + 6)
    ms = {("qwen3-vl-8b", "documents", 4): 100.0, ("qwen3-vl-8b", "documents", 1): 300.0}
    table, missing = tool.floors(ms, lat, ip)
    got = table.set_index("study").floor_s
    assert got["encoder_latency"] == pytest.approx(0.1 * 4 * 65) and got["input_path"] == pytest.approx(0.3 * 8 * 56)
    assert missing == ["encoder_latency nope documents x4"]
    run = ROOT / "results/reference/20261205T024624Z-3200d44-h200-fa4-race-qwen3-vl-8b"
    measured = tool.per_image_ms([run])
    assert measured[("qwen3-vl-8b", "documents", 4)] == pytest.approx(130.8, abs=0.05)
    assert tool.per_image_ms([run], device="cpu: another host") == {}        # no time pooled across devices
    assert tool.main(["--runs", str(run)]) == 0 and "at least" in capsys.readouterr().out
    # another default asked for: fewer fresh batches ask for fewer calls; a bad value is refused by the declaration
    assert tool.main(["--runs", str(run), "--set", "encoder_latency.fresh=0"]) == 0
    assert "per realistic latency cell: 40 batch calls" in capsys.readouterr().out      # the decision set: warm-up 1
    assert tool.main(["--runs", str(run), "--profile", "gpu-full", "--set", "encoder_latency.fresh=0"]) == 0
    assert "per realistic latency cell: 45 batch calls" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tool.main(["--set", "input_path.n_items=0"])
    assert "n_items=0 is below the minimum 1" in capsys.readouterr().err
