"""The input_path study on the CPU: its table adds up, its bytes are the payloads' own, its load
model is consistent with the stages it measured, and bad parameters fail before any work."""
from __future__ import annotations

import math

import pytest

import workbench as wb
from workbench.studies import input_path as study
from workbench.studies.input_path import summary
from workbench.studies.input_path.params import PLACEMENT_PAYLOAD, check_payload
from workbench.studies.params import ParamError
from workbench.limits import cpu_count
from workbench.results.tables import check_table, wide


@pytest.fixture(scope="module")
def table():
    return study.run(device="cpu", progress=False, presets=["tiny-qwen2.5-vl"], placements=["processor", "tower"],
                     paths=["eager", "cudagraph"], n_items=2, max_side=128, threads=[1], workers=[1, 2],
                     loads=[0.3, 0.8], sim_requests=2000, reps=1)


def test_table_is_tidy_and_labelled_emulated(table):
    check_table(table)
    w = wide(table)
    assert set(w.emulated) == {True}
    assert {"host_ms", "h2d_bytes", "h2d_ms", "device_ms", "encoder_ms", "total_ms", "p50_ms", "p99_ms",
            "max_images_per_s"} <= set(table.metric)
    # every encoder cell says how often it was timed (reps=1 caps it; 1 sample gives no interval)
    enc = w[w.encoder_ms.notna() | w.batch_ms.notna()]
    assert enc.timed_reps.eq(1).all() and "ci_rel" not in set(table.metric)


def test_total_is_the_sum_of_its_parts(table):
    w = wide(table)
    tot = w[w.total_ms.notna()]
    enc = w[w.encoder_ms.notna()].set_index(["placement", "path"]).encoder_ms
    for r in tot.itertuples():
        assert math.isclose(r.total_ms, r.host_ms + r.h2d_ms + enc[r.placement, r.path], rel_tol=1e-9)


def test_payload_bytes_are_the_rows_and_images_themselves(table):
    w = wide(table)
    b = w[w.h2d_bytes.notna()].set_index("payload").h2d_bytes
    assert b["fp32_rows"] == 4 * b["uint8_rows"] and b["bf16_rows"] == 2 * b["uint8_rows"]
    assert b["uint8_frame"] * 2 == b["uint8_rows"]          # a still image's rows carry its frame twice
    assert b["resized_image"] == b["uint8_frame"]            # the same pixels, unpatchified
    assert b["decoded_image"] > 0


def test_load_model_follows_its_measured_stages(table):
    w = wide(table)
    cap = w[w.max_images_per_s.notna()]
    assert (cap.max_images_per_s > 0).all() and cap.max_images_per_s.map(math.isfinite).all()
    # more host workers never lower the sustainable rate
    for (pl, path), g in cap.groupby(["placement", "path"]):
        g = g.sort_values("workers")
        assert g.max_images_per_s.is_monotonic_increasing
    lat = w[w.p99_ms.notna()]
    assert (lat.p99_ms >= lat.p50_ms).all()
    # no image can be served faster than its stages back to back
    tot = w[w.total_ms.notna() & (w.backend == "torchvision")].set_index(["placement", "path"]).total_ms
    for r in lat.itertuples():
        assert r.p50_ms >= 0.99 * tot[r.placement, r.path] * 0.5   # host times are medians of a noisy host


def test_summary_draws_and_says(table, tmp_path):
    b = summary.breakdown(table)
    assert set(b.placement) == {"processor", "tower"} and len(b) == 4
    assert (b.saves_ms[b.placement == "processor"] == 0).all()
    out = summary.summarize(table, tmp_path)
    assert len(out.figures) >= 3 and "per image" in out.text


@pytest.mark.parametrize("kw, match", [
    (dict(backends=["opencv"]), "opencv"),
    (dict(threads=[0]), "threads"),
    (dict(threads=[1, 100_000]), r"100,000 exceeds the cap of 1,024"),
    (dict(threads=[1, 1000]), r"1000 exceeds the \d+ cores"),
    (dict(loads=[0.0]), "load 0.0 is not a fraction"),
    (dict(loads=[2.0]), "load 2.0 is not a fraction"),
    (dict(sim_requests=2_000_000), r"2,000,000.*'sim_requests'"),
    (dict(workers=[2000]), r"2,000.*'workers'"),
    (dict(placements=["outer"]), "outer"),
])
def test_bad_parameters_fail_before_any_work(kw, match):
    with pytest.raises((ParamError, ValueError), match=match):
        study.run(device="cpu", progress=False, presets=["tiny-qwen2-vl"], **kw)


def test_payload_door_names_the_placement_and_the_valid_payloads():
    with pytest.raises(ValueError, match=r"placement 'processor' cannot take payload 'uint8_rows'.*valid: fp32_rows"):
        check_payload("processor", "uint8_rows")
    with pytest.raises(ValueError, match="unknown payload 'jpeg'"):
        check_payload("tower", "jpeg")
    for pl, payload in PLACEMENT_PAYLOAD.items():
        if pl in wb.PLACEMENTS:
            assert check_payload(pl, payload) == payload


@pytest.mark.skipif(cpu_count() < 2, reason="needs 2 cores")
def test_threads_without_one_still_serves_every_load_at_the_fewest_threads():
    """threads=[2] (no 1 in it): the serving model takes the host time timed at 2 threads, and its rows say so."""
    w = wide(study.run(device="cpu", progress=False, presets=["tiny-qwen2.5-vl"], placements=["processor", "tower"],
                       paths=["eager"], n_items=1, max_side=64, threads=[2], workers=[1], loads=[0.5],
                       sim_requests=200, reps=1))
    load = w[w.p99_ms.notna()]
    assert set(load.placement) == {"processor", "tower"} and set(load.threads) == {2.0}
