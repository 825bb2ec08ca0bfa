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
from workbench.arguments import parse_gpus, parse_shard
from workbench.report import find_runs, load_tables
from workbench.studies import discover, wide
from workbench.sweep import Cell, longest_first, shard_cells, shard_plan, study_cells
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


def test_shards_partition_the_cells_whatever_the_order_given():
    import dataclasses
    whole = [stub_study.make(f"s{k}") for k in (3, 0, 6, 1, 5, 2, 4)]          # no cell parameter
    split = [dataclasses.replace(stub_study.make("stub_a"), name=f"c{k}") for k in range(3)]   # cells: sizes
    studies = whole + split
    params = {s.name: {"sizes": [1, 2, 3, 4, 5], "fail": False} for s in studies}
    want = {(s.name, None) for s in whole} | {(s.name, v) for s in split for v in range(1, 6)}
    for n in (1, 2, 3, 7, 9, 30):
        got = []
        for i in range(n):
            mine, p, cells = shard_plan(studies[::-1] if i % 2 else studies, params, i, n, {})
            assert [s.name for s in mine] == sorted(cells, key=[s.name for s in (studies[::-1] if i % 2 else
                                                                                studies)].index)
            for s in mine:
                if cells[s.name] is None:
                    assert p[s.name] == params[s.name]
                    got.append((s.name, None))
                else:       # the shard's params hold exactly its cells, in the plan's order
                    assert p[s.name]["sizes"] == cells[s.name] == sorted(cells[s.name])
                    got += [(s.name, v) for v in cells[s.name]]
        # every cell in exactly one shard, whatever order each task listed the studies in
        assert sorted(got, key=repr) == sorted(want, key=repr) and len(got) == len(want)


def test_shards_balance_the_recorded_seconds_cell_by_cell():
    a, b = stub_study.make("stub_a"), stub_study.make("stub_b")
    # stub_a took 100 s for sizes 1-4 (each a cell of equal weight), stub_b 10 s as a whole
    recorded = {"stub_a": (100.0, {"sizes": [1, 2, 3, 4]}), "stub_b": (10.0, {"sizes": [1]})}
    cells = study_cells(a, {"sizes": [1, 2, 3, 4]}, recorded["stub_a"]) + study_cells(b, {"sizes": [5]},
                                                                                      recorded["stub_b"])
    assert cells == [Cell("stub_a", (v,), 25.0) for v in (1, 2, 3, 4)] + [Cell("stub_b", None, 10.0)]
    parts = shard_cells(cells, 2)
    assert [sum(c.seconds for c in p) for p in parts] == [60.0, 50.0]        # vs 100 / 10 by whole study
    assert len(shard_cells(cells, 5)) == 5 and all(len(p) == 1 for p in shard_cells(cells, 5))
    # a cell per preset weighs by its tower's FLOPs: a 7B tower's cell costs more than a tiny one's
    import dataclasses
    presets = dataclasses.replace(a, cells="presets")
    w = {c.values[0]: c.seconds for c in study_cells(presets, {"presets": ["tiny-qwen2.5-vl", "qwen2.5-vl-7b"]},
                                                     None)}
    assert w["qwen2.5-vl-7b"] > 100 * w["tiny-qwen2.5-vl"] and abs(sum(w.values()) - 60.0) < 1e-9


def test_a_study_split_over_shards_merges_into_one_table(stubs, tmp_path, monkeypatch):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    sets = ["--direct", "--studies", "stub_a", "--set", "stub_a.sizes=[1,2,3,4,5]"]
    assert cli.main(["sweep", "--results", str(whole), *sets]) == 0
    monkeypatch.setenv("WORKBENCH_RUN_GROUP", "cells")
    for i in range(3):
        assert cli.main(["sweep", "--results", str(sharded), *sets, "--shard", f"{i}/3"]) == 0
    runs = find_runs(sharded)
    assert len(runs) == 3 and all(r.tables == {"stub_a": r.tables["stub_a"]} for r in runs)
    split = [r.shard["cells"]["stub_a"] for r in sorted(runs, key=lambda r: r.shard["index"])]
    assert sorted(v for s in split for v in s) == [1, 2, 3, 4, 5] and all(s for s in split)
    loaded, problems = load_tables(runs, ["stub_a"])
    assert not problems and len(loaded) == 3
    from workbench.report import study_table
    merged = study_table("stub_a", runs)
    assert set(merged["run"]) == {"cells (3 shards)"}
    (ref_run,) = find_runs(whole)
    ref, _ = load_tables([ref_run], ["stub_a"])
    assert _values(merged).equals(_values(ref[(ref_run.name, "stub_a")]))
    # a shard that ran a cell another shard of the group ran too: listed, not merged twice
    assert cli.main(["sweep", "--results", str(sharded), *sets, "--shard", "0/3"]) == 0
    loaded, problems = load_tables(find_runs(sharded), ["stub_a"])
    assert len(loaded) == 3 and len(problems) == 1 and "already has a stub_a table" in problems[0].reason


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
                     "--set", "stub_a.sizes=[1]", "--shard", "1/2"]) == 0
    assert "shard 1/2 has no cell" in capsys.readouterr().out and not (tmp_path / "empty").exists()
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
    from workbench.report import build_report
    from workbench.results.meta import RunMeta
    run = tmp_path / "20261130T000000Z-abc1234-gpus"
    run.mkdir()
    meta = RunMeta.collect({"profile": "gpu", "device": "cuda", "studies": {}}).finish()
    meta.warnings = ["correctness: wants 2 GPUs with these parameters, but each --gpus worker has one"]
    meta.write(run)
    page = build_report(tmp_path, studies={}).index.read_text()
    assert "Warnings runs recorded (" in page and "correctness: wants 2 GPUs" in page


@pytest.mark.parametrize("env, want", [
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}, (2, 4)),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_STEP": "3"}, (2, 3)),                               # --array=1-7:3 is tasks 1, 4, 7
    ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2)),                              # torchrun
])
def test_shard_auto_reads_the_job_arrays_task_and_size(env, want):
    assert parse_shard("auto", env=env) == want


@pytest.mark.parametrize("env, message", [
    ({}, "no job array variables are set"),
    ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "4"}, "is not a task index and count"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "the job array says 3/2"),
])
def test_shard_auto_without_a_usable_job_array_is_refused_naming_it(env, message):
    with pytest.raises(SystemExit, match=message):
        parse_shard("auto", env=env)
