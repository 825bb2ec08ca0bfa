"""Every study's table says which attention its towers ran (the backend `attn_backend="auto"` resolved to
on the run's device), so that runs made with FlashAttention-4 and without it never read as one; and the
run records the versions of FlashAttention-4 and its CuTe libraries where they are installed."""
from __future__ import annotations

import pytest

import workbench.attention as attention
import workbench.towers.common as tower_common
from workbench.provenance import PACKAGES
from workbench.studies import discover
from workbench.studies.encoder_latency.summary import key_numbers

STUDIES = discover()
ONE = "tiny-qwen2-vl"
TINY = {
    "cast_cost": dict(presets=[ONE], budgets=[16], fills=[1.0], reps=1, depth=1),
    "fp32_memory": dict(presets=[ONE], budgets=[16], depth=1),
    "padding_waste": dict(presets=[ONE], reps=1, n_items=2, max_items=[1], depth=1, budget_sets=["pow2"]),
    "encoder_latency": dict(presets=[ONE], tokens=[16], images=[1], reps=1, warmup=0, depth=1, mixes=["photos"],
                            mix_items=[1], fresh=0),
    "correctness": dict(families=[ONE], depth=1, placements=["tower"], norms=["eager"], paths=["eager"],
                        buffer_dtypes=["uint8"], budgets=[64], max_items=4, hazard=False, max_pixels=56 * 56),
    "input_path": dict(presets=["tiny-qwen2.5-vl"], placements=["tower"], paths=["eager"], n_items=1,
                       max_side=64, threads=[1], workers=[1], loads=[0.5], sim_requests=200, reps=1),
    "contention": dict(presets=[ONE], depth=1, mixes=["photos"], n_items=1, max_side=64, jpeg_qualities=[90],
                       threads=[1], duty_cycles=[1.0], beside=["same_process"], placements=["device_norm"],
                       loads=[0.5], sim_requests=200, reps=1),
}


def _run(name: str):
    return STUDIES[name].run(device="cpu", progress=False, **TINY[name])


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_row_names_the_attention_the_towers_resolved_to(name):
    table = _run(name)
    assert "attention" in table.columns, f"{name}'s table does not say which attention ran"
    assert set(table.attention) == {attention.resolve_backend("auto", "cpu", None)} == {"loop"}


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_recorded_attention_follows_the_towers_choice(monkeypatch, name):
    """Where "auto" resolves to another backend (here masked SDPA, which runs on the CPU), the towers run it
    and the table says so: the column is the towers' choice, not a constant."""
    real = attention.resolve_backend

    def masked_for_auto(backend, device, dtype, head_dim=None):
        return "masked" if backend == "auto" else real(backend, device, dtype, head_dim)

    monkeypatch.setattr(attention, "resolve_backend", masked_for_auto)
    monkeypatch.setattr(tower_common, "resolve_backend", masked_for_auto)
    for module in ("correctness", "fp32_memory"):        # these ask the rule itself (no tower is built first)
        monkeypatch.setattr(f"workbench.studies.{module}.measure.resolve_backend", masked_for_auto)
    table = _run(name)
    assert set(table.attention) == {"masked"}
    if name == "encoder_latency":        # and the key numbers show it beside the times
        for part in key_numbers(table.assign(run="r")).values():
            assert set(part.attention) == {"masked"}


def test_runs_record_flash_attention_4_and_its_cute_libraries_where_installed():
    assert {"flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels"} <= set(PACKAGES)
