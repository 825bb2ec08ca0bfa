"""The study framework (parameter declarations, the table format), the measurement core's byte and
memory models, and the two input-path studies on the CPU."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import workbench as wb
from workbench import ceilings, floors, memory_model, timing, ulps
from workbench.norms import NORMS, make_norm, normalize_reference
from workbench.studies import ParamError, TableError, check_table, discover, tidy, wide
from workbench.studies.params import Param, ParamSpec, ascending_unique
import workbench.studies.cast_cost.params  # noqa: F401  (binds cast_cost.params)
import workbench.studies.cast_cost.summary  # noqa: F401  (binds cast_cost.summary)
import workbench.studies.fp32_memory.summary  # noqa: F401  (binds fp32_memory.summary)

CFG = wb.VisionConfig.preset("qwen2.5-vl-7b")
D = CFG.patch_dim


# =========================================================================== parameters

def _spec():
    return ParamSpec(
        Param("families", "list[str]", cpu=["tiny-qwen2-vl"], gpu=["qwen2-vl-7b"], choices=wb.PRESET_NAMES),
        Param("depth", "int", cpu=None, gpu=4, optional=True, minimum=1),
        Param("budgets", "list[int]", cpu=[16, 32], minimum=1, rule=ascending_unique),
        Param("hazard", "bool", cpu=True),
        Param("frac", "float", cpu=0.5),
    )


def test_params_resolve_defaults_per_profile_and_coerce_unambiguous_values():
    spec = _spec()
    assert spec.resolve({}, "cpu") == dict(families=["tiny-qwen2-vl"], depth=None, budgets=[16, 32], hazard=True,
                                           frac=0.5)
    assert spec.resolve({}, "gpu")["depth"] == 4
    got = spec.resolve(dict(families="tiny-qwen2-vl", budgets=16, hazard="false", depth="3", frac=1), "cpu")
    # a papermill `-p families tiny-qwen2-vl` string is one item, never its characters
    assert got == dict(families=["tiny-qwen2-vl"], depth=3, budgets=[16], hazard=False, frac=1.0)
    assert spec.resolve(dict(families="tiny-qwen2-vl, qwen2-vl-7b", depth="null"), "cpu")["families"] == [
        "tiny-qwen2-vl", "qwen2-vl-7b"]


@pytest.mark.parametrize("overrides, message", [
    (dict(depth="abc"), "depth='abc' is not an integer; valid: an integer >= 1 or null"),
    (dict(depth=0), "below the minimum 1"),
    (dict(depth=True), "is not an integer"),
    (dict(families=["bogus"]), "families='bogus' is not a valid choice; valid: qwen2-vl-2b"),
    (dict(budgets=[32, 16]), "strictly ascending"),
    (dict(budgets=[]), "the list is empty"),
    (dict(hazard="maybe"), "not a boolean"),
    (dict(frac="nan"), "not a finite number"),
    (dict(nope=1), "no parameter ['nope']; valid: families, depth, budgets, hazard, frac"),
], ids=lambda v: str(v)[:30])
def test_params_refuse_bad_values_naming_value_and_choices(overrides, message):
    with pytest.raises(ParamError) as e:
        _spec().resolve(overrides, "cpu", study="demo")
    assert message in str(e.value) and "study 'demo'" in str(e.value)


def test_a_declaration_with_an_invalid_default_is_refused():
    with pytest.raises(ParamError, match="not a valid choice"):
        Param("norm", "str", cpu="bogus", choices=NORMS)


def test_parameters_cell_is_valid_python_with_the_cpu_defaults():
    spec = _spec()
    ns: dict = {}
    exec(spec.parameters_cell(), ns)
    assert {k: ns[k] for k in spec.names} == spec.defaults("cpu")
    assert ns["device"] == "auto" and ns["run_dir"] is None
    assert spec.from_namespace(ns) == spec.defaults("cpu")


def test_every_registered_study_declares_its_parameters_once():
    studies = discover()
    assert {"correctness", "cast_cost", "fp32_memory"} <= set(studies)
    for name, study in studies.items():
        for profile in ("cpu", "gpu"):
            assert study.resolve(profile) == study.params.defaults(profile)
        assert "device" not in study.params.names and "run_dir" not in study.params.names


# =========================================================================== tables

def _long():
    return pd.DataFrame({"norm": ["eager", "eager", "triton_rows"], "device": ["cpu: x"] * 3,
                         "metric": ["norm_us", "bytes", "norm_us"], "value": [3.0, 10, 1.5],
                         "unit": ["us", "bytes", "us"]})


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.drop(columns="unit"), "missing column(s) ['unit']"),
    (lambda d: d.drop(columns="device"), "missing column(s) ['device']"),
    (lambda d: d.assign(unit=["us", "bytes", None]), "without a unit"),
    (lambda d: d.assign(unit=["us", "bytes", "ms"]), "more than one unit: {'norm_us': ['us', 'ms']}"),
    (lambda d: d.assign(value=["a", 1, 2]), "non-numeric value"),
    (lambda d: d.assign(norm=[["x"], "eager", "t"]), "holds lists"),
    (lambda d: d.assign(norm="eager"), "measure the same thing twice"),
    (lambda d: d.iloc[:0], "no rows"),
], ids=["no-unit-column", "no-device", "row-without-unit", "unit-changes", "text-value", "list-param",
        "duplicate", "empty"])
def test_the_table_schema_refuses_what_breaks_it(mutate, message):
    with pytest.raises(TableError) as e:
        check_table(mutate(_long()))
    assert message in str(e.value)


def test_check_table_orders_columns_parameters_first():
    t = check_table(_long()[["metric", "value", "unit", "norm", "device"]])
    assert list(t.columns) == ["norm", "device", "metric", "value", "unit"]


def test_tidy_and_wide_round_trip_with_missing_parameters_and_booleans():
    frame = pd.DataFrame({"case": ["a", "b", "c"], "note": [None, "skipped", None], "device": ["cpu: x"] * 3,
                          "err": [0.1, np.nan, 0.3], "ok": [True, np.nan, False]})
    long = tidy(frame, {"err": "relative", "ok": "bool"})
    check_table(long)
    assert len(long) == 5          # the skipped cell keeps one row so it stays visible
    w = wide(long).set_index("case")
    assert w.loc["a", "err"] == 0.1 and bool(w.loc["a", "ok"]) and not bool(w.loc["c", "ok"])
    assert w.loc["b", "note"] == "skipped" and pd.isna(w.loc["a", "note"])


# =========================================================================== measure: byte and memory models

def test_norm_traffic_counts_every_pass():
    n = 1000
    def traffic(name, *a, **k):
        return make_norm(name, CFG).traffic(*a, **k)
    eager = traffic("eager", n)
    assert eager["min_bytes"] == 3 * n * D and eager["bytes"] == 27 * n * D and eager["passes"] == 4
    assert traffic("eager", n, out_dtype=torch.float32)["bytes"] == 21 * n * D
    for name in ("triton_channel", "triton_flat", "triton_rows", "identity"):
        t = traffic(name, n)
        assert t["bytes"] == t["min_bytes"] and t["traffic_ratio"] == 1.0
    # n_valid: only triton kernels stop moving padding; eager with out= also selects
    assert traffic("triton_rows", n, n_valid=250)["bytes"] == 3 * 250 * D
    assert traffic("eager", n, n_valid=250, out=True)["bytes"] > eager["bytes"]
    with pytest.raises(ValueError, match="triton_rows"):
        traffic("nope", n)


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("in_dtype", [torch.uint8, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n_valid, out", [(False, False), (True, False), (False, True), (True, True)])
def test_modelled_allocation_trace_equals_the_counted_one(name, in_dtype, n_valid, out):
    """The analytic trace of each implementation is what a real call allocates and frees, in order
    (counted on the meta device at a real 16384-token budget, so no memory is used)."""
    rows = 4 * 16384
    norm = make_norm(name, CFG, check_values=False).to("meta")
    x = torch.empty(rows, D, dtype=in_dtype, device="meta")
    dst = torch.empty(rows, D, dtype=torch.bfloat16, device="meta") if out else None
    nv = torch.tensor(rows // 2, dtype=torch.int32, device="meta") if n_valid else None
    counted, _ = memory_model.count_allocations(lambda: norm(x, torch.bfloat16, out=dst, n_valid=nv))

    def renumber(trace):
        ids: dict = {}
        return [(k, ids.setdefault(i, len(ids)), b) for k, i, b in trace]

    model = norm.alloc_trace(rows, in_dtype, torch.bfloat16, n_valid=n_valid, out=out)
    assert renumber(counted) == renumber(model)


def test_counting_on_real_cpu_tensors_sees_the_fp32_temporaries(gen_rows=333):
    x = torch.randint(0, 256, (gen_rows, D), dtype=torch.uint8)
    norm = make_norm("eager", CFG)
    counted, y = memory_model.count_allocations(lambda: norm(x, torch.bfloat16))
    assert ulps.bf16_ulps(y, normalize_reference(x, CFG).to(torch.bfloat16)).max() <= 1   # counting changes nothing
    peak = memory_model.trace_peak_bytes(counted)
    assert peak["temp_peak_bytes"] == 8 * gen_rows * D and peak["end_bytes"] == 2 * gen_rows * D


def test_pool_model_follows_the_caching_allocator_rules():
    mib = 1 << 20
    # a 19.3 MB fp32 temporary takes its own segment rounded up to 2 MiB; the second reuses nothing
    trace = make_norm("eager", CFG).alloc_trace(4096)
    got = memory_model.pool_model(trace)
    assert got["pool_bytes"] == 2 * 20 * mib           # two 20 MiB segments; C and D reuse freed blocks
    assert got["peak_bytes"] == 2 * 19267584 and got["end_bytes"] == 9633792
    # small requests share 2 MiB segments; 1-10 MiB requests get a 20 MiB segment that later ones split
    m = memory_model.PoolModel()
    m.malloc(0, 100)
    m.malloc(1, 700)
    assert m.reserved == 2 * mib
    m.malloc(2, 3 * mib)
    m.malloc(3, 3 * mib)
    assert m.reserved == 2 * mib + 20 * mib
    m.free(2)
    m.free(3)
    m.malloc(4, 5 * mib)                                # the freed blocks merged back: no new segment
    assert m.reserved == 22 * mib and m.allocated == 5 * mib + 512 + 1024   # 100 B and 700 B round to 512 B steps
    assert memory_model.PoolModel.segment_size(11 * mib + 1) == 12 * mib


def test_cpu_timer_statistics():
    t = timing.cpu_time_us(lambda: sum(range(1000)), reps=7, warmup=1)
    assert t["reps"] == 7 and t["min_us"] <= t["p10_us"] <= t["p50_us"] <= t["p90_us"]
    assert floors.floor_us(4e9, 4000.0) == pytest.approx(1e3)
    assert floors.flop_floor_us(1e12, 1000.0) == pytest.approx(1e3)
    assert ceilings.copy_ceiling_gbs("cpu", n_bytes=1 << 22, reps=3) > 0


# =========================================================================== the two input-path studies

@pytest.fixture(scope="module")
def cast_table():
    from workbench.studies import cast_cost
    return cast_cost.run(device="cpu", progress=False, budgets=[16], fills=[0.5, 1.0], reps=2, depth=1)


def test_cast_cost_measures_every_design_and_checks_it_first(cast_table):
    from workbench.studies import cast_cost
    check_table(cast_table)
    w = wide(cast_table)
    assert set(w.design) == set(cast_cost.params.DESIGNS)
    assert (w.max_err_ulp <= 1).all()                  # every design's output is right before timing
    assert (w.staging_us > 0).all() and (w.floor_us > 0).all() and (w.share_of_replay < 1).all()
    assert np.allclose(w.ratio_to_floor, w.staging_us / w.floor_us)
    # one tower per family by default, each its own cells with its own row width
    from workbench.config import TINY_PRESET_PER_FAMILY, VisionConfig
    assert sorted(w.preset.unique()) == sorted(TINY_PRESET_PER_FAMILY)
    assert w.family.nunique() == len(TINY_PRESET_PER_FAMILY)
    for preset, g in w.groupby("preset"):
        # bytes follow the design: the bf16 buffer moves more than the uint8 one, valid-only less
        at = g[(g.fill == 0.5) & (g.norm == "eager")].set_index("design")
        assert at.loc["bf16_buffer", "bytes"] > at.loc["uint8_buffer", "bytes"] > at.loc["uint8_valid", "bytes"]
        d = VisionConfig.preset(preset).patch_dim
        assert (at.min_bytes == at.valid_rows * d * 3).all()       # uint8 in, bf16 out: the row width counts
    assert (w.device.str.startswith("cpu")).all()
    # one paragraph per tower, naming its own cheapest design at the fill measured closest to 75%
    paragraphs = cast_cost.summary.findings(cast_table).split("\n\n")
    assert len(paragraphs) == w.preset.nunique()
    for preset, g in w[w.fill == 1.0].groupby("preset"):
        (p,) = [p for p in paragraphs if p.startswith(f"On {preset} on cpu")]
        best = g.sort_values("staging_us").iloc[0]
        assert f"{len(g)}/{len(g)} design outputs" in p and "100% valid" in p
        assert f": {cast_cost.summary.cell_name(best.design, best.norm)}, " in p and "smoke test" in p


@pytest.mark.triton
@pytest.mark.parametrize("design", ["bf16_buffer", "uint8_buffer", "uint8_valid", "runner", "fold", "device"])
def test_every_staging_design_feeds_the_tower_normalized_rows(design, seed):
    """With a Triton kernel (interpreter): the valid rows that reach the tower equal the float64
    reference within one bf16 ulp (fold's tower takes the raw pixels: equal to them, its folded
    weights normalize); padding rows of the runner's and device's buffers are zero."""
    from workbench.studies.cast_cost.measure import build_staging
    cfg = wb.VisionConfig.preset("tiny-qwen2-vl")
    n, big_n = 13, 24
    src = torch.randint(0, 256, (n, cfg.patch_dim), dtype=torch.uint8)
    ref = normalize_reference(src, cfg)
    st = build_staging(design, "triton_rows", cfg, src, ref.float(), big_n, torch.bfloat16)
    y = st.result()
    assert st.raw == (design == "fold")
    assert ulps.bf16_ulps(y[:n], (src if st.raw else ref).to(torch.bfloat16)).max() <= 1
    if design in ("runner", "device", "fold"):
        assert torch.equal(y[n:], torch.zeros_like(y[n:]))


def test_fp32_memory_models_every_cell_on_the_cpu():
    from workbench.studies import fp32_memory
    t = fp32_memory.run(device="cpu", progress=False)
    check_table(t)
    from workbench.config import TINY_PRESET_PER_FAMILY
    assert sorted(t.preset.unique()) == sorted(TINY_PRESET_PER_FAMILY)
    w = wide(t)
    w = w[w.preset == "tiny-qwen2.5-vl"]         # the norm scope is modelled at that family's row width D
    n = w[w.scope == "norm"]
    assert n.trace_matches.all()
    big = n[(n.budget == 16384) & (n.buffer_dtype == "uint8")].set_index("norm")
    rows = 4 * 16384
    assert big.loc["eager", "temp_bytes"] == 8 * rows * D               # two fp32 copies live at once
    for fused in ("triton_channel", "triton_flat", "triton_rows"):
        assert big.loc[fused, "temp_bytes"] == 0
        assert big.loc[fused, "model_bytes"] < big.loc["eager", "model_bytes"] / 3
    assert "pool_bytes" not in set(t.metric)           # nothing measured without CUDA
    text = fp32_memory.summary.findings(t)
    assert len(text.split("\n\n")) == len(TINY_PRESET_PER_FAMILY) and "No CUDA measurement" in text
    per_tower = len(wide(t).query("scope == 'norm'")) // len(TINY_PRESET_PER_FAMILY)
    assert f"trace equals the counted one in {per_tower}/{per_tower} cells" in text


def test_fp32_memory_finding_reads_a_gpu_run_from_its_rows():
    """On a committed H200 run: the eager norm's pool at the largest budget, the model's check
    against the measured pool and what the norm adds inside the tower, all from that run's rows;
    the measured columns reach the key numbers."""
    from pathlib import Path

    from workbench.formatting import fmt_bytes
    from workbench.studies import fp32_memory
    refs = Path(__file__).resolve().parents[1] / "results" / "reference"
    ref = sorted(refs.glob("*qwen3vl/fp32_memory.parquet"))[-1]
    t = pd.read_parquet(ref).assign(run=ref.parent.name, reference=True)
    w = wide(t)
    n, tower = w[(w.scope == "norm") & (w.budget == 16384)], w[(w.scope == "tower") & (w.budget == 16384)]
    text = fp32_memory.summary.findings(t)
    assert text.startswith("On qwen3-vl-8b on NVIDIA H200") and "No CUDA measurement" not in text
    assert f"eager norm parks {fmt_bytes(n[n.norm == 'eager'].model_bytes.max())} in the pool" in text
    within = int((w[w.scope == "norm"].model_error.abs() <= 0.05).sum())
    assert f"measured pool in {within}/{len(w[w.scope == 'norm'])} cells" in text
    assert f"adds at most {fmt_bytes(tower[tower.norm == 'eager'].pool_bytes.max())} (eager)" in text
    (key,) = fp32_memory.summary.key_numbers(t).values()
    assert {"16384 tok: measured MiB", "16384 tok: in tower MiB", "16384 tok: runner peak MiB"} <= set(key.columns)


def test_every_study_table_holds_to_the_schema(cast_table):
    """The tables the studies return pass the schema check (correctness: one small run)."""
    from workbench.studies import correctness
    t = correctness.run(device="cpu", progress=False, families=["tiny-qwen2-vl"], norms=["eager"],
                        paths=["eager"], placements=["tower", "none"], hazard=False)
    for table in (t, cast_table):
        checked = check_table(table)
        assert list(checked.columns[-3:]) == ["metric", "value", "unit"] and "device" in checked
    from workbench.studies import discover
    assert set(discover()) >= {"correctness", "cast_cost", "fp32_memory"}
    w = wide(t)
    cells = w[w.case == "embedding"]
    assert set(w.placement) == {"tower", "none"} and cells.ok.astype(bool).tolist() == cells.ok.tolist()
    assert math.isfinite(w.rel_err.max())
    # the kernel-choice cells: every item alone against the same item in the mixed batch
    kc = w[w.case == "kernel_choice"]
    assert len(kc) == t.n_items.iloc[0] and (kc.rel_err < 1e-4).all() and kc.kernels.str.contains("alone").all()


@pytest.mark.parametrize("preset", ["tiny-qwen2-vl", "tiny-qwen2.5-vl"])
def test_tower_flop_model_equals_torch_flop_counter(preset):
    """The FLOP floor's count (matmuls, full and window attention) is what the tower executes,
    counted by torch's FlopCounterMode on a real forward (grids that tile whole windows; SDPA's math
    path, whose bmm the counter sees: it has no formula for the CPU's fused kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    cfg = wb.VisionConfig.preset(preset)
    enc = wb.build_encoder(cfg, placement="none", norm="eager", dtype=torch.float32, device="cpu")
    grid = torch.tensor([[1, 16, 24], [1, 8, 8]])
    x = torch.randn(int(grid.prod(1).sum()), cfg.patch_dim)
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        enc.visual(x, grid)
    model = floors.tower_flops(cfg, [16 * 24, 8 * 8])
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    assert model["total"] == fc.get_total_flops()
    assert model["matmul"] == counts["aten.mm"] + counts["aten.addmm"]
    assert model["attention_full"] + model["attention_window"] == counts["aten.bmm"]


def test_every_committed_reference_table_holds_to_the_schema():
    """The GPU reference runs the report shows on a CPU machine are in the one table format, with a
    device name in every row and a study that is registered."""
    from pathlib import Path
    from workbench.studies import load_table
    ref = Path(__file__).resolve().parents[1] / "results" / "reference"
    tables = sorted(ref.glob("*/*.parquet"))
    assert tables, "no committed reference table"
    for path in tables:
        t = load_table(path)
        assert path.stem in discover(), path
        assert t.device.str.contains("H200").all(), path
