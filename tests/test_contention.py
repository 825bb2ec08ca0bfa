"""The contention study on the CPU: encoded requests decode to the right pixels, bad files and bad
parameters are refused with clear errors, the side-by-side harness really overlaps its two sides, the
serving composition picks the placement the stage costs say, and the study runs end to end."""
from __future__ import annotations

import io
import math
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from workbench import limits
from workbench.contention_model import (Stages, at_slo, check_slo, crossings, max_rate_at_slo, slowdown_at,
                                        winners, winning_span)
from workbench.decode import check_encoded, decode_host, decode_host_many, encode, gpu_decoder, keep_decodable
from workbench.decode import pixel_diff
from workbench.interference import BESIDE, PreprocessWork, WaitWork, aggressor, beside_run, check_duty
from workbench.photos import sample_images
from workbench.results.tables import check_table, wide
from workbench.studies import ParamError, discover, run_study
from workbench.studies.contention.params import BINDING_METRICS, METRICS

BINDING = set(BINDING_METRICS)


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    return sample_images(["astronaut"])["astronaut"].resize((96, 80))


def _png(width: int, height: int, depth: int, colour: int) -> bytes:
    """A PNG written by hand (Pillow writes no 16-bit RGB): one IHDR, one IDAT of zeros, IEND."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    channels = {0: 1, 2: 3}[colour]
    raw = b"".join(b"\0" + bytes(width * channels * depth // 8) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# ---- decode ---------------------------------------------------------------------------------------

def test_a_png_round_trip_gives_the_source_pixels_exactly(photo):
    got = decode_host(encode(photo, "png", name="shot.png"))
    assert got.shape == (80, 96, 3) and got.dtype == np.uint8
    assert np.array_equal(got, np.asarray(photo))


def test_a_jpeg_decodes_close_to_its_source_and_closer_at_higher_quality(photo):
    mean = {}
    for q in (85, 95):
        f = encode(photo, "jpeg", q, name=f"p{q}.jpg")
        assert check_encoded(f.data, f.name) == ("jpeg", 80, 96)
        worst, mean[q] = pixel_diff(decode_host(f), np.asarray(photo))
        assert worst < 255                                   # lossy, but the same picture
    assert 0 < mean[95] < mean[85] < 8


def test_host_decode_on_threads_gives_the_same_pixels_as_one_thread(photo):
    files = [encode(photo.rotate(a), "jpeg", 90, name=f"r{a}.jpg") for a in (0, 90, 180)]
    one = decode_host_many(files, 1)
    two = decode_host_many(files, limits.cpu_count() if limits.cpu_count() > 1 else 1)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))


def test_the_gpu_decoder_is_reported_not_available_on_a_cpu():
    ok, why = gpu_decoder("cpu")
    assert not ok and "CUDA" in why


def _cmyk_jpeg(photo) -> bytes:
    buf = io.BytesIO()
    photo.convert("CMYK").save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("make, message", [
    (lambda p: b"", "empty.jpg: 0 bytes, an empty file; valid: a JPEG or PNG file"),
    (lambda p: (lambda d: d[:len(d) // 2])(encode(p, "jpeg", 90).data), "could not be decoded, the file is truncated or corrupt"),
    (lambda p: (lambda d: d[:len(d) // 2])(encode(p, "png").data), "could not be decoded, the file is truncated or corrupt"),
    (lambda p: b"GIF89a" + bytes(64), "not a JPEG or PNG file Pillow can read"),
    (_cmyk_jpeg, "a CMYK JPEG image (mode CMYK); valid: 8-bit L, RGB"),
    (lambda p: _png(8, 8, 16, 2), "a 16-bit PNG image"),
    (lambda p: _png(8, 8, 16, 0), "a 16-bit PNG image"),
])
def test_bad_files_are_refused_naming_the_file(photo, make, message):
    name = "empty.jpg" if message.startswith("empty") else "bad.img"
    with pytest.raises(ValueError) as e:
        decode_host(make(photo), name)
    assert message in str(e.value) and name in str(e.value)


def test_an_image_above_the_pixel_cap_is_refused_from_its_header(photo):
    data = encode(photo, "png").data
    with limits.raised(input_pixels=96 * 80 - 1), pytest.raises(limits.LimitError, match="big.png: an image of 80x96"):
        check_encoded(data, "big.png")


def test_a_mix_skips_bad_files_with_a_warning_naming_each(photo):
    good = encode(photo, "jpeg", 90).data
    with pytest.warns(UserWarning, match=r"skipped 2 file\(s\).*empty\.jpg: 0 bytes.*cmyk\.jpg: a CMYK"):
        kept = keep_decodable([("a.jpg", good), ("empty.jpg", b""), ("cmyk.jpg", _cmyk_jpeg(photo))])
    assert [k.name for k in kept] == ["a.jpg"]


# ---- parameters -----------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    (dict(duty_cycles=[0.5, 1.5]), "duty cycle 1.5 is outside (0, 1]"),
    (dict(duty_cycles=[0.0]), "duty cycle 0.0 is outside (0, 1]"),
    (dict(loads=[0.0, 0.5]), "arrival rate 0.0 is not positive"),
    (dict(loads=[-1]), "arrival rate -1.0 is not positive"),
    (dict(jpeg_qualities=[101]), "JPEG quality 101 is outside 1..100"),
    (dict(beside=["gpu"]), "beside='gpu' is not a valid choice; valid: same_process, other_process"),
    (dict(slo_ms=0), "slo_ms 0.0 is not a positive time"),
])
def test_bad_parameters_are_refused_before_any_work(override, message):
    with pytest.raises(ParamError) as e:
        discover()["contention"].resolve("cpu", override)
    assert message in str(e.value)


def test_a_duty_cycle_outside_the_range_is_refused_by_the_harness_too():
    assert check_duty(1) == 1.0
    for bad in (0, -0.5, 1.01, True, "0.5"):
        with pytest.raises(ValueError, match="outside \\(0, 1\\]"):
            check_duty(bad)


# ---- the harness ----------------------------------------------------------------------------------

@pytest.mark.parametrize("beside", BESIDE)
def test_the_two_sides_really_overlap(beside):
    """Two works that wait: side by side, the window is shorter than the victim's calls plus the
    aggressor's busy time in it (they ran at once), and the aggressor made calls inside the window."""
    side = aggressor(beside, WaitWork(15))
    try:
        r = beside_run(lambda: WaitWork(15)(), lambda: None, side, 1.0, reps=6, aggressor_s=0.015)
    finally:
        side.close()
    assert len(r["victim_s"]) >= 6 and r["aggressor_s"]
    assert r["window_s"] < sum(r["victim_s"]) + r["aggressor_busy_s"]
    assert r["aggressor_busy_s"] > 0.25 * r["window_s"]


def test_the_preprocessor_runs_in_another_process(photo):
    """The study's preprocessor (decode, resize, patchify, normalize), pickled into a child process: it works
    there beside a victim here, and the child is gone once closed."""
    files = tuple(encode(photo, "jpeg", 90, name=f"c{i}.jpg") for i in range(2))
    side = aggressor("other_process", PreprocessWork(files, "tiny-qwen2-vl", 1, "cpu"))
    try:
        r = beside_run(lambda: WaitWork(5)(), lambda: None, side, 1.0, reps=3, aggressor_s=0.02)
    finally:
        side.close()
    assert r["aggressor_s"] and r["aggressor_busy_s"] > 0 and side.proc.poll() is not None


def test_a_lower_duty_cycle_keeps_the_aggressor_busy_less_of_the_time():
    side = aggressor("same_process", WaitWork(10))
    try:
        busy = {d: (lambda r: r["aggressor_busy_s"] / r["window_s"])(
            beside_run(lambda: WaitWork(5)(), lambda: None, side, d, reps=4, aggressor_s=0.01)) for d in (0.25, 1.0)}
    finally:
        side.close()
    assert busy[0.25] < busy[1.0]


# ---- the serving composition ----------------------------------------------------------------------

def _stages(decode_ms: float, slowdown: dict) -> Stages:
    """Hand-made costs: a 4 ms encoder per image, host rows 1 ms, a GPU preprocessor 0.5 ms per image."""
    return Stages(decode_ms=decode_ms, rows_fp32_ms=1.0, rows_uint8_ms=0.8,
                  link_ms={"fp32_rows": 0.3, "uint8_rows": 0.1, "encoded": 0.02}, preprocess_ms=0.5,
                  gpu_decode=True, encoder_ms=(4.0, 7.0, 10.0, 13.0), slowdown=slowdown)


def test_a_gpu_preprocessor_wins_where_the_host_decode_is_the_bottleneck():
    # one host thread decoding 20 ms per image caps the host placements near 50 images/s
    st = _stages(20.0, {1.0: (1.2, 1.1)})
    win = winners(at_slo(st, [20, 100, 200], slo_ms=60, threads=1, n_requests=4000))
    assert win[100] in ("gpu_preprocess", "epd_second_gpu") and win[200] in ("gpu_preprocess", "epd_second_gpu")
    assert max_rate_at_slo(st, "gpu_preprocess", 60, hi=400, n_requests=4000) > \
        max_rate_at_slo(st, "device_norm", 60, hi=400, n_requests=4000)


def test_the_serving_gpu_preprocessor_wins_where_rows_are_slow_to_ship():
    # mild interference, but uint8 rows take 6 ms to cross (the host placements and the second GPU ship them)
    st = Stages(decode_ms=20.0, rows_fp32_ms=1.0, rows_uint8_ms=0.8,
                link_ms={"fp32_rows": 24.0, "uint8_rows": 6.0, "encoded": 0.02}, preprocess_ms=0.5,
                gpu_decode=True, encoder_ms=(4.0, 7.0, 10.0, 13.0), slowdown={1.0: (1.2, 1.1)})
    win = winners(at_slo(st, [40, 200], slo_ms=80, threads=8, n_requests=4000))
    assert win[200] == "gpu_preprocess"


def test_heavy_interference_hands_the_win_to_the_host_or_the_second_gpu():
    # a preprocessor that triples the encoder's time: the host placements (8 threads) and the second GPU win
    st = _stages(2.0, {0.5: (3.0, 3.0), 1.0: (3.0, 3.0)})
    rows = at_slo(st, [100, 200], slo_ms=60, threads=8, n_requests=4000)
    win = winners(rows)
    assert win[200] in ("device_norm", "epd_second_gpu", "cpu_processor") and win[200] != "gpu_preprocess"
    assert max_rate_at_slo(st, "gpu_preprocess", 60, hi=600, n_requests=4000) < \
        max_rate_at_slo(st, "epd_second_gpu", 60, hi=600, n_requests=4000)


def test_crossings_and_spans_follow_the_winners():
    win = {10.0: "a", 20.0: "a", 30.0: "b", 40.0: None}
    assert crossings(win) == [dict(from_placement="a", to_placement="b", rate=25.0),
                              dict(from_placement="b", to_placement="none", rate=35.0)]
    assert winning_span(win, "a") == (10.0, 20.0) and all(math.isnan(v) for v in winning_span(win, "c"))


def test_the_slowdown_is_interpolated_from_nothing_beside_to_the_measured_duties():
    st = _stages(1.0, {0.5: (2.0, 1.5), 1.0: (3.0, 2.0)})
    assert slowdown_at(st, 0.0) == (1.0, 1.0) and slowdown_at(st, 0.25) == (1.5, 1.25)
    assert slowdown_at(st, 0.75) == (2.5, 1.75) and slowdown_at(st, 1.0) == (3.0, 2.0)


def test_an_slo_below_the_encoders_own_time_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"slo_ms=3 .*not above the encoder's own time for one image, 4 ms"):
        check_slo(3, _stages(1.0, {}))
    with pytest.raises(ValueError, match="arrival rate 0 is not a positive number"):
        at_slo(_stages(1.0, {}), [0], slo_ms=50)


# ---- the study, end to end ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def table(tmp_path_factory):
    params = dict(presets=["tiny-qwen2-vl"], depth=1, mixes=["photos", "screenshots"], n_items=2, max_side=64,
                  threads=[1], duty_cycles=[1.0], beside=["same_process"], loads=[0.25, 0.75, 1.5],
                  sim_requests=400, reps=2)
    run_dir = tmp_path_factory.mktemp("contention-run")
    t, path = run_study("contention", discover()["contention"].resolve("cpu", params), "cpu", run_dir, progress=False)
    assert path.is_file()
    return t


def test_the_binding_metrics_are_declared_with_their_units():
    assert set(BINDING_METRICS) <= set(METRICS) and METRICS["images_per_s_at_slo"] == "images/s"
    assert all(METRICS[m] == "ms" for m in BINDING_METRICS if m.endswith("_ms") or "_ms_" in m)


def test_the_study_runs_end_to_end_with_the_binding_metrics_finite(table):
    check_table(table)
    assert BINDING <= set(table.metric)
    vals = table[table.metric.isin(BINDING)].value
    assert np.isfinite(vals).all() and (vals >= 0).all()
    assert table.device.str.startswith("cpu").all() and set(table.emulated) == {True}


def test_the_table_says_nvjpeg_is_not_available_instead_of_a_time(table):
    w = wide(table)
    nv = w[(w.part == "decode") & (w.decoder == "nvjpeg")]
    assert len(nv) and not nv.available.astype(bool).any() and nv.decode_ms.isna().all()
    png = w[(w.part == "decode") & (w.encoding == "png") & w.source_max_abs_diff.notna()]
    assert (png.source_max_abs_diff == 0).all()                      # lossless


def test_every_placement_is_served_and_only_the_second_gpu_is_modelled(table):
    w = wide(table)
    best = w[w.max_images_per_s_at_slo.notna()]
    assert set(best.placement) == {"cpu_processor", "device_norm", "gpu_preprocess", "epd_second_gpu"}
    assert set(best[best.modelled.astype(bool)].placement) == {"epd_second_gpu"}


def test_the_summary_draws_both_figures_and_states_a_finding(table, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from workbench.studies.contention import summary
    out = summary.summarize(table, tmp_path)
    assert len(out.figures) == 2 and "serves the most within the p99 target" in out.text
