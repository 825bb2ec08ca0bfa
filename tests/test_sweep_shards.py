"""Sweeps beyond one process: --shard I/N (job arrays; the report merges the shards of one run)
and --gpus (one worker process per GPU, each pinned with CUDA_VISIBLE_DEVICES).

The sweeps here run the stub studies of tests/stub_study.py (the `stubs` fixture) through
`cli.main` in this process: sharding, merging, resuming and the workers' plumbing do not depend on
what a study measures. The one real end-to-end sweep is in tests/test_sweep_faults.py."""
import json
import os
from pathlib import Path

import pytest

import stub_study
from workbench import cli
from workbench.cli import parse_gpus, parse_shard
from workbench.report import find_runs, load_tables
from workbench.studies import discover, wide
from workbench.sweep import longest_first, shard_studies
from workbench.workers import EMULATE_GPUS_ENV, STUDY_MODULES_ENV, one_gpu_warnings, study_modules

FAST = ["--direct", "--studies", "stub_a,stub_b", "--set", "stub_a.sizes=[1,2,3]", "--set", "stub_b.sizes=[7]"]


def _sweep(results: Path, *extra: str) -> None:
    assert cli.main(["sweep", "--results", str(results), *FAST, *extra]) == 0


def _runs(results: Path) -> list[Path]:
    return sorted(d for d in results.iterdir() if d.is_dir())


@pytest.mark.parametrize("text, message", [("1/1", "0 <= I < N"), ("a/2", "I/N"), ("2", "I/N"), ("-1/2", "0 <= I")])
def test_a_bad_shard_is_refused_naming_it(text, message):
    with pytest.raises(SystemExit, match=message):
        parse_shard(text)


@pytest.mark.parametrize("text", ["", "a,b", "0,0", "-1"])
def test_bad_gpu_lists_are_refused(text):
    with pytest.raises(SystemExit, match="--gpus"):
        parse_gpus(text)


def test_shards_partition_the_studies_whatever_the_order_given():
    studies = [stub_study.make(f"s{k}") for k in (3, 0, 6, 1, 5, 2, 4)]
    for n in (1, 2, 3, 7, 9):
        parts = [shard_studies(studies[::-1], i, n) for i in range(n)]
        names = [s.name for p in parts for s in p]
        assert sorted(names) == sorted(s.name for s in studies) and len(set(names)) == len(names)
        # study k in name order goes to shard k % n: the same partition in every task of an array
        assert [[s.name for s in p] for p in parts] == [[f"s{k}" for k in range(7) if k % n == i] for i in range(n)]


def test_gpu_workers_take_the_longest_studies_first_by_earlier_runs(tmp_path):
    studies = {n: stub_study.make(n) for n in ("cast_cost", "correctness", "fp32_memory", "padding_waste",
                                                 "encoder_latency")}
    chosen = [studies[n] for n in ("cast_cost", "correctness", "fp32_memory", "padding_waste")]

    def run(name, profile, seconds):
        d = tmp_path / name
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"params": {"profile": profile}, "study_seconds": seconds}))
        return d

    run("20260101T000000Z-aaaaaaa-gpu", "gpu", {"cast_cost": 500, "fp32_memory": 70, "correctness": 1})
    run("20260102T000000Z-aaaaaaa-gpu", "gpu", {"correctness": 300})          # newer: wins for correctness
    run("20260103T000000Z-aaaaaaa-cpu", "cpu", {"fp32_memory": 9999})         # another profile: ignored
    run("reference/20250101T000000Z-bbbbbbb-h200", "gpu", {"padding_waste": 230, "cast_cost": 1})
    now = run("20260104T000000Z-aaaaaaa-gpu", "gpu", {"fp32_memory": 1e6})     # the run itself: ignored
    order = [s.name for s in longest_first(chosen, now, "gpu")]
    assert order == ["cast_cost", "correctness", "padding_waste", "fp32_memory"]
    fresh = [s.name for s in longest_first(chosen + [studies["encoder_latency"]], now, "gpu")]
    assert fresh[0] == "encoder_latency"                                      # never timed: first


def _values(table):
    """What a stub's table holds apart from where it ran: (study, size) -> value."""
    w = wide(table.drop(columns=["run", "reference", "run_date", "device"], errors="ignore"))
    return w[["study", "size", "double"]].sort_values(["study", "size"]).reset_index(drop=True)


def test_a_sweep_sharded_two_ways_and_merged_equals_the_unsharded_one(stubs, tmp_path, monkeypatch, capsys):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    _sweep(whole)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4242")
    for i in (0, 1):    # as two tasks of a job array would, with the array's id as the group
        _sweep(sharded, "--shard", f"{i}/2")
    runs = find_runs(sharded)
    assert len(runs) == 2 and {r.logical_name for r in runs} == {"4242 (2 shards)"}
    assert sorted(r.shard["index"] for r in runs) == [0, 1]
    assert sorted(s for r in runs for s in r.tables) == ["stub_a", "stub_b"]   # disjoint
    assert {r.name.rsplit("-", 1)[1] for r in runs} == {"shard0of2", "shard1of2"}
    loaded, problems = load_tables(runs, ["stub_a", "stub_b"])
    assert not problems
    (ref_run,) = find_runs(whole)
    ref, _ = load_tables([ref_run], ["stub_a", "stub_b"])
    for study in ("stub_a", "stub_b"):
        merged = [df for (run, s), df in loaded.items() if s == study]
        assert len(merged) == 1 and set(merged[0]["run"]) == {"4242 (2 shards)"}
        a, b = _values(merged[0]), _values(ref[(ref_run.name, study)])
        assert len(a) > 0
        assert a.equals(b), (a, b)
    # a shard with no study says so and makes no folder
    capsys.readouterr()
    assert cli.main(["sweep", "--results", str(tmp_path / "empty"), "--direct", "--studies", "stub_a",
                     "--shard", "1/2"]) == 0
    assert "shard 1/2 has no study" in capsys.readouterr().out and not (tmp_path / "empty").exists()
    # the report summarizes the shards as one run
    assert cli.main(["report", "--no-sweep", "--results", str(sharded)]) == 0
    page = (sharded / "report" / "index.html").read_text()
    assert "4242 (2 shards)" in page and "shard 0/2 of 4242" in page and "shard 1/2 of 4242" in page


def test_a_second_copy_of_a_study_in_one_shard_group_is_listed_not_merged(stubs, tmp_path):
    for _ in range(2):   # shard 0/1 twice under one group: the same study twice in one logical run
        _sweep(tmp_path, "--shard", "0/1", "--group", "g1")
    runs = find_runs(tmp_path)
    loaded, problems = load_tables(runs, ["stub_a"])
    assert len(loaded) == 1 and len(problems) == 1 and "already has a stub_a table" in problems[0].reason


def test_the_workers_import_the_modules_that_define_the_studies(stubs):
    real = discover()["fp32_memory"]
    modules, roots = study_modules([stubs["stub_a"], real, stubs["stub_b"]])
    assert modules == ["stub_study"] and roots == [str(Path(stub_study.__file__).resolve().parent)]
    assert study_modules([real]) == ([], [])          # the package's own studies: nothing to add


@pytest.mark.timeout(900)
def test_gpus_run_one_worker_per_gpu_each_pinned_and_record_the_placement(stubs, tmp_path, monkeypatch, capsys):
    # the worker plumbing on a CPU host: two pretend GPUs, each worker a process on the CPU
    monkeypatch.setenv(EMULATE_GPUS_ENV, "2")
    _sweep(tmp_path, "--gpus", "0,1", "--profile", "cpu")
    assert "on GPUs [0, 1]" in capsys.readouterr().out
    assert STUDY_MODULES_ENV not in os.environ              # set for the workers only
    (run,) = _runs(tmp_path)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["params"]["gpus"] == [0, 1] and meta["finished_at"] and not meta["failures"]
    assert meta["params"]["gpus_emulated"] is True
    placement = meta["placement"]
    assert set(placement) == {"stub_a", "stub_b"}
    assert {v["gpu"] for v in placement.values()} <= {"0", "1"}      # CUDA_VISIBLE_DEVICES of its worker
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))          # each worker's share of the cores
    assert {v["threads"] for v in placement.values()} == {os.environ.get("OMP_NUM_THREADS", share)}
    assert (run / "stub_a.parquet").is_file() and (run / "stub_b.parquet").is_file()
    assert not (run / ".claims").exists()
    assert set(meta["study_seconds"]) == {"stub_a", "stub_b"}    # for the next --gpus order


@pytest.mark.timeout(900)
def test_a_study_that_fails_in_a_gpu_worker_is_recorded_and_the_other_runs(stubs, tmp_path, monkeypatch):
    monkeypatch.setenv(EMULATE_GPUS_ENV, "2")
    assert cli.main(["sweep", "--results", str(tmp_path), *FAST, "--set", "stub_b.fail=true",
                     "--gpus", "0,1", "--profile", "cpu"]) == 1
    (run,) = _runs(tmp_path)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["failures"] == ["stub_b: RuntimeError: stub_b fails on purpose"]
    assert (run / "stub_a.parquet").is_file() and not (run / "stub_b.parquet").exists()
    assert set(meta["study_seconds"]) == {"stub_a"} and set(meta["placement"]) == {"stub_a", "stub_b"}


def test_a_killed_shard_resumes_only_what_is_missing(stubs, tmp_path, capsys):
    _sweep(tmp_path, "--shard", "0/1", "--group", "g2")
    (run,) = _runs(tmp_path)
    kept = run / "stub_a.parquet"
    before = kept.stat().st_mtime_ns
    (run / "stub_b.parquet").unlink()        # as if the shard was killed during that study
    meta = json.loads((run / "meta.json").read_text())
    meta.pop("finished_at")
    (run / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "stub_b" in out
    assert kept.stat().st_mtime_ns == before and (run / "stub_b.parquet").is_file()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["params"]["shard"]["group"] == "g2" and meta["finished_at"]


def test_gpus_warns_about_a_study_that_wants_more_gpus_than_a_worker_has():
    studies = discover()
    corr = studies["correctness"]
    gpu_params = corr.resolve("gpu")
    assert "dp" in gpu_params["paths"] and gpu_params["dp_world_size"] == 2
    plan = {"correctness": gpu_params, "fp32_memory": studies["fp32_memory"].resolve("gpu")}
    (w,) = one_gpu_warnings([corr, studies["fp32_memory"]], plan, "cuda")
    assert w.startswith("correctness: wants 2 GPUs") and "without --gpus" in w
    assert one_gpu_warnings([corr], plan, "cpu") == []              # gloo processes on a CPU
    no_dp = {"correctness": {**gpu_params, "paths": [p for p in gpu_params["paths"] if p != "dp"]}}
    assert one_gpu_warnings([corr], no_dp, "cuda") == []


def test_the_report_lists_the_warnings_a_run_recorded(tmp_path):
    from workbench import provenance as prov
    from workbench.report import build_report
    run = tmp_path / "20261130T000000Z-abc1234-gpus"
    run.mkdir()
    prov.write_meta(run, prov.finish_meta(prov.collect_meta({"profile": "gpu", "device": "cuda", "studies": {}}))
                    | {"warnings": ["correctness: wants 2 GPUs with these parameters, but each --gpus worker has one"]})
    page = build_report(tmp_path, studies={}).index.read_text()
    assert "Warnings a run recorded:" in page and "correctness: wants 2 GPUs" in page
