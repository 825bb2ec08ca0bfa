"""``sweep --workers N|auto``: the cpu profile's studies in N worker processes side by side, the longest first.

A bad count is refused before a run folder exists; the gpu profile and --gpus refuse more than one; a sweep in
workers writes the same tables as one run in this process, and meta.json records the count."""
import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from workbench import cli, workers
from workbench.studies import discover
from workbench.sweep import SweepPlan, longest_first, plan_time, wall_seconds
from workbench.workers import EMULATE_GPUS_ENV, parse_workers, worker_count

FAST = ["--direct", "--profile", "cpu", "--studies", "stub_a,stub_b", "--set", "stub_a.sizes=[1,2,3]",
        "--set", "stub_b.sizes=[7]"]


def _run(results: Path) -> Path:
    (run,) = [d for d in results.iterdir() if (d / "meta.json").is_file()]
    return run


def _tables(run: Path, names) -> dict[str, pd.DataFrame]:
    """Each study's table without the columns that say which run made it."""
    return {n: pd.read_parquet(run / f"{n}.parquet").drop(columns=["run", "run_date"], errors="ignore")
            for n in names}


@pytest.mark.parametrize("text, want", [("1", 1), ("3", 3), ("auto", "auto"), (" AUTO ", "auto"), (None, None)])
def test_a_worker_count_parses(text, want):
    assert parse_workers(text) == want


@pytest.mark.parametrize("text", ["0", "-2", "x", "", "1.5"])
def test_a_bad_worker_count_is_refused_before_the_run_folder(stubs, tmp_path, text):
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--results", str(tmp_path), *FAST, "--workers", text])
    assert f"--workers {text!r}" in e.value.code and ">= 1, or auto" in e.value.code
    assert not any(tmp_path.iterdir()), "a refused sweep left a run folder"


def test_more_than_one_worker_is_refused_on_the_gpu_profile_and_beside_gpus(stubs, tmp_path, monkeypatch):
    for count in ("2", "auto"):
        with pytest.raises(SystemExit, match=f"--workers {count}: the gpu profile .* --gpus 0,1"):
            cli.main(["sweep", "--results", str(tmp_path), *FAST, "--profile", "gpu", "--workers", count])
    monkeypatch.setenv(EMULATE_GPUS_ENV, "2")
    with pytest.raises(SystemExit, match="--workers 2 with --gpus 0,1: .* give one of the two"):
        cli.main(["sweep", "--results", str(tmp_path), *FAST, "--gpus", "0,1", "--workers", "2"])
    assert not any(tmp_path.iterdir())
    assert worker_count(1, "gpu", 5) == 1 and worker_count(None, "gpu", 5, default="auto") == 1


def test_auto_is_one_worker_per_core_and_never_more_than_the_studies(monkeypatch):
    monkeypatch.setattr(workers, "cpu_share", lambda processes: max(1, 4 // processes))    # a 4-core host
    assert worker_count("auto", "cpu", 6) == 4 and worker_count("auto", "cpu", 2) == 2
    assert worker_count(8, "cpu", 3) == 3 and worker_count(None, "cpu", 6) == 1
    assert worker_count(None, "cpu", 6, default="auto") == 4          # what the report asks for
    assert worker_count(None, "cpu", 6, gpus=[0, 1], default="auto") == 1


def test_workers_take_the_longest_study_first_by_its_guess_where_no_run_timed_it(tmp_path):
    studies = discover()
    chosen = [studies[n] for n in ("fp32_memory", "cast_cost", "correctness", "padding_waste")]
    order = [s.name for s in longest_first(chosen, tmp_path / "now", "cpu")]
    assert order == sorted(order, key=lambda n: -studies[n].guess_s["cpu"]) and len(order) == 4
    unguessed = dataclasses.replace(studies["fp32_memory"], name="never_timed", guess_s=None)
    assert longest_first([*chosen, unguessed], tmp_path / "now", "cpu")[0] is unguessed     # unknown: first


def test_the_prediction_is_the_wall_time_of_the_busiest_worker(tmp_path, capsys):
    studies = discover()
    chosen = [studies[n] for n in ("cast_cost", "fp32_memory", "padding_waste")]
    params = {s.name: s.resolve("cpu") for s in chosen}
    run = tmp_path / "20260101T000000Z-abc1234-cpu"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"params": {"profile": "cpu", "studies": params}, "study_seconds": {
        "cast_cost": 600.0, "fp32_memory": 240.0, "padding_waste": 300.0}}))
    assert wall_seconds({"a": 600.0, "b": 240.0, "c": 300.0}, 2) == 600.0
    for n, says in ((1, "about 19.0 min"), (2, "about 10.0 min in 2 workers"), (5, "about 10.0 min in 3 workers")):
        plan = SweepPlan(studies=tuple(chosen), params=params, profile="cpu", results=tmp_path, name="cpu", workers=n)
        plan_time(plan)
        assert says in capsys.readouterr().out


def test_two_workers_write_the_tables_one_process_writes(stubs, tmp_path):
    assert cli.main(["sweep", "--results", str(tmp_path / "serial"), *FAST]) == 0
    assert cli.main(["sweep", "--results", str(tmp_path / "two"), *FAST, "--workers", "2"]) == 0
    serial, two = _run(tmp_path / "serial"), _run(tmp_path / "two")
    meta = json.loads((two / "meta.json").read_text())
    assert meta["params"]["workers"] == 2 and meta["finished_at"] and not meta["failures"]
    assert "workers" not in json.loads((serial / "meta.json").read_text())["params"]
    assert set(meta["study_seconds"]) == {"stub_a", "stub_b"} and not meta.get("placement")
    assert not (two / ".claims").exists()
    a, b = _tables(serial, stubs), _tables(two, stubs)
    for name in stubs:
        assert len(a[name]) > 0
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True)


def test_the_report_sweeps_in_one_worker_per_core(stubs, tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "cpu_share", lambda processes: max(1, 2 // processes))    # a 2-core host
    assert cli.main(["report", "--results", str(tmp_path), *FAST]) == 0
    assert json.loads((_run(tmp_path) / "meta.json").read_text())["params"]["workers"] == 2


@pytest.mark.slow
def test_real_studies_in_two_workers_give_the_serial_tables(tmp_path, monkeypatch):
    """correctness (one tower, a few cells, its Triton launches reused) and fp32_memory: no timing in either."""
    small = ["--direct", "--profile", "cpu", "--studies", "correctness,fp32_memory",
             "--set", 'correctness.families=["tiny-qwen2-vl"]', "--set", 'correctness.placements=["tower","device"]',
             "--set", 'correctness.norms=["eager","triton_rows"]', "--set", 'correctness.paths=["eager","cudagraph"]',
             "--set", 'fp32_memory.presets=["tiny-qwen2-vl"]']
    # at the thread count of each worker: how many threads share a GEMM's or an attention's sums sets their order
    # (with torch's default of one per core the errors differ in their last bits, the verdicts do not)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(workers.cpu_share(2))
    try:
        assert cli.main(["sweep", "--results", str(tmp_path / "serial"), *small]) == 0
    finally:
        torch.set_num_threads(threads)
    assert cli.main(["sweep", "--results", str(tmp_path / "two"), *small, "--workers", "2"]) == 0
    a, b = (_tables(_run(tmp_path / d), ["correctness", "fp32_memory"]) for d in ("serial", "two"))
    for name in a:
        assert len(a[name]) > 0
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True)
