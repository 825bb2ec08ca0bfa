"""Engine policies as data (`workbench.engines`) and the runner reproducing them (emulated on CPU)."""
import dataclasses

import pytest
import torch

import workbench as wb
from workbench import engines
from workbench.reference import rel_err
from workbench.runner import EncoderGraphRunner

# vLLM 0.34's documented grid for a Qwen tower (budget range 64..max, default cap 5120): quarter octaves to
# 1024, every 128 to 2560, then 1/8 octaves rounded up to 128
VLLM_034_QWEN = [64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1152, 1280,
                 1408, 1536, 1664, 1792, 1920, 2048, 2176, 2304, 2432, 2560, 2816, 3072, 3456, 3840, 4224, 4608, 5120]


def test_vllm_034_budgets_are_the_documented_36_from_64_to_5120():
    b = engines.get("vllm-0.34").budgets(16384)
    assert b == VLLM_034_QWEN and len(b) == 36
    # the padding the grid bounds: a quarter of the budget below 1024, an eighth above
    for lo, hi in zip(b, b[1:]):
        assert (hi - lo) / hi <= (0.25 if hi <= 1024 else 0.125)


def test_vllm_034_cap_and_range():
    p = engines.get("vllm-0.34")
    assert p.budgets(3000) == [x for x in VLLM_034_QWEN if x <= 3000] + [3000]
    assert p.budgets(16384, cap=8192)[:36] == VLLM_034_QWEN and p.budgets(16384, cap=8192)[-1] == 8192
    assert p.max_items(p.budgets(16384)) == 64          # min(5120 // 64, 64)
    with pytest.raises(ValueError, match=r"cap of 32 .* below the smallest budget 64"):
        p.budgets(16384, cap=32)


def test_vllm_033_powers_of_two_and_the_largest():
    assert engines.get("vllm-0.33").budgets(5000) == [64, 128, 256, 512, 1024, 2048, 4096, 5000]
    assert engines.get("vllm-0.33").budgets(16384) == [64 << k for k in range(9)]


def test_item_multiple_budgets_fill_up_to_16_items_exactly():
    b = engines.item_multiple_budgets(256, 5120)
    assert b[:16] == [256 * c for c in range(1, 17)] and b[-1] == 5120
    assert all(x % 256 == 0 for x in b)


def test_unknown_engine_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown engine 'vllm-0.35'.*vllm-0.33, vllm-0.34, sglang-0.5.23"):
        engines.get("vllm-0.35")
    with pytest.raises(ValueError, match="unknown engine"):
        EncoderGraphRunner(wb.build_encoder(wb.VisionConfig.preset("tiny-qwen2-vl"), device="cpu"), engine="vllm")


def test_packing_rules_per_release():
    tokens, frames = [100, 300, 50, 2000], [1, 1, 1, 1]
    new = engines.get("vllm-0.34")
    packs, misses, spill = engines.pack(new, tokens, frames, new.budgets(16384), 64)
    assert packs == [(2560, [3, 1, 0, 2])] and not misses and not spill      # one replay, largest first
    packs, misses, spill = engines.pack(new, [4000, 3000], [1, 1], new.budgets(16384), 64)
    assert packs == [] and spill == [0, 1]                                    # above the cap: one eager forward
    packs, _, spill = engines.pack(new, [10] * 5, [1] * 5, new.budgets(16384), 4)
    assert packs == [] and spill == [0, 1, 2, 3, 4]                           # more items than a replay holds
    old = engines.get("vllm-0.33")
    packs, misses, spill = engines.pack(old, tokens, frames, old.budgets(16384), 64)
    # smallest first; 2000 alone (budget 2048) outweighs the pack (512) and joining costs 4096 > 512 + 2048
    assert packs == [(64, [2]), (512, [0, 1]), (2048, [3])] and not misses and not spill
    sg = engines.get("sglang-0.5.23")
    assert engines.pack(sg, tokens, frames, [16384], 64) == ([(2450, [3, 1, 0, 2])], [], [])


def _tiny(seed, placement="tower"):
    cfg = dataclasses.replace(wb.VisionConfig.preset("tiny-qwen2.5-vl"), max_pixels=200 * 200)
    return wb.build_encoder(cfg, placement=placement, norm="eager", dtype=torch.float32, device="cpu", seed=seed)


@pytest.fixture(scope="module")
def photos():
    p = wb.sample_images()
    return [p["chelsea"].resize((120, 84)), p["coffee"].resize((150, 100)), p["astronaut"].resize((64, 64))]


@pytest.mark.parametrize("engine", list(engines.ENGINES))
def test_runner_reproduces_each_engine_and_stays_right(engine, photos, seed):
    enc = _tiny(seed)
    batch = wb.preprocess(photos, enc.cfg)
    runner = EncoderGraphRunner(enc, engine=engine, budgets=[8, 16, 24, 48], max_items=4, buffer_dtype=torch.float32)
    out = runner.encode(batch)
    assert rel_err(out, enc.encode(batch)) < 1e-6
    st = runner.stats_frame()
    if engine == "vllm-0.34":
        assert len(st) == 1 and st.budget[0] == 48 and st["items"][0] == 3     # the whole batch, one replay
    elif engine == "sglang-0.5.23":
        assert len(st) == 1 and st.padded_rows[0] == 0 and runner.budgets == [batch.n_rows // 4]
    else:
        assert len(st) >= 2
    assert runner.shared == engines.get(engine).shared_buffers


def test_runner_defaults_from_the_engine_rule(seed):
    enc = _tiny(seed)
    runner = EncoderGraphRunner(enc, engine="vllm-0.34", policy="always")
    assert runner.budgets == VLLM_034_QWEN and runner.max_items == 64
    assert all(c.pixels.data_ptr() == runner.input_buffer.data_ptr() for c in runner.graphs.values())
    old = EncoderGraphRunner(enc, engine="vllm-0.33", budgets=[8, 16, 32], max_items=4, policy="always")
    assert len({c.pixels.data_ptr() for c in old.graphs.values()}) == 3       # a buffer per budget


def test_a_batch_above_the_largest_budget_spills_to_one_eager_forward(photos, seed):
    enc = _tiny(seed)
    batch = wb.preprocess(photos, enc.cfg)
    runner = EncoderGraphRunner(enc, engine="vllm-0.34", budgets=[8, 16], max_items=4, buffer_dtype=torch.float32)
    out = runner.encode(batch)
    assert rel_err(out, enc.encode(batch)) < 1e-6
    st = runner.stats_frame()
    assert len(st) == 1 and bool(st.miss[0]) and st["items"][0] == 3 and st.valid_rows[0] == batch.n_rows


def test_the_stale_rows_check_finds_a_stage_that_leaves_real_rows_unwritten(photos, seed, monkeypatch):
    from workbench.studies.correctness.measure import _stale_rows
    enc = _tiny(seed)
    raw = wb.preprocess(photos, enc.cfg)
    rows = _stale_rows(enc, raw, [8, 16, 24, 48], 4, {}, "tower", "eager")
    assert [r["padding"] for r in rows] == ["whole buffer", "valid rows only"]
    assert all(r["ok"] and r["replays"] == 1 and r["rows_changed"] == 0 for r in rows)
    stage = EncoderGraphRunner.stage
    # a staging that skips the pack's last merge block: under shared buffers that block holds what a larger pack left
    monkeypatch.setattr(EncoderGraphRunner, "stage", lambda self, cap, px, pad_value=0.0: stage(self, cap, px[:-4],
                                                                                                  pad_value))
    whole, valid = _stale_rows(enc, raw, [8, 16, 24, 48], 4, {}, "tower", "eager")
    assert whole["ok"]                       # the padding written whole rewrites the skipped block too
    assert not valid["ok"] and valid["rows_changed"] >= 1


def test_a_cap_is_refused_where_the_release_has_none_or_below_the_smallest_budget():
    assert engines.with_cap("vllm-0.34", 8192).budgets(16384)[-1] == 8192
    assert engines.with_cap("vllm-0.34", None) is engines.get("vllm-0.34")
    with pytest.raises(ValueError, match="vllm-0.33 has no budget cap option.*releases with one: vllm-0.34"):
        engines.with_cap("vllm-0.33", 4096)
    with pytest.raises(ValueError, match=r"engine_cap=32 is below the smallest budget 64; valid caps: whole numbers "
                                         r"64\.\.65,536"):
        engines.with_cap("vllm-0.34", 32)
    from workbench.studies import encoder_latency
    from workbench.studies.params import ParamError
    for bad, says in (({"engine_cap": 32}, "below the minimum 64"), ({"engine": "vllm-0.35"}, "not a valid choice"),
                      ({"engine": "vllm-0.33", "engine_cap": 4096}, "has no budget cap option")):
        with pytest.raises(ParamError, match=says):
            encoder_latency.run(device="cpu", progress=False, **bad)
