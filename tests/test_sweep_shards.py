"""Sweeps beyond one process: --shard I/N (job arrays; the report merges the shards of one run)
and --gpus (one worker process per GPU, each pinned with CUDA_VISIBLE_DEVICES)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import parse_gpus, parse_shard
from workbench.sweep import longest_first, shard_studies
from workbench.workers import EMULATE_GPUS_ENV, one_gpu_warnings
from workbench.report import find_runs, load_tables
from workbench.studies import discover, wide

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--direct", "--studies", "fp32_memory,padding_waste", "--set", "fp32_memory.budgets=[1024]",
        "--set", "padding_waste.max_items=[1]", "--set", "padding_waste.n_items=2",
        "--set", 'padding_waste.budget_sets=["pow2","planner"]']


def _sweep(results: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--results", str(results), *FAST, *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stdout + p.stderr
    return p


@pytest.mark.parametrize("text, message", [("1/1", "0 <= I < N"), ("a/2", "I/N"), ("2", "I/N"), ("-1/2", "0 <= I")])
def test_a_bad_shard_is_refused_naming_it(text, message):
    with pytest.raises(SystemExit, match=message):
        parse_shard(text)


@pytest.mark.parametrize("text", ["", "a,b", "0,0", "-1"])
def test_bad_gpu_lists_are_refused(text):
    with pytest.raises(SystemExit, match="--gpus"):
        parse_gpus(text)


def test_shards_partition_the_studies_whatever_the_order_given():
    studies = list(discover().values())
    for n in (1, 2, 3, 7):
        parts = [shard_studies(studies[::-1], i, n) for i in range(n)]
        names = [s.name for p in parts for s in p]
        assert sorted(names) == sorted(s.name for s in studies) and len(set(names)) == len(names)


def test_gpu_workers_take_the_longest_studies_first_by_earlier_runs(tmp_path):
    studies = {s.name: s for s in discover().values()}
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


def _deterministic(table, study):
    """The metrics of a study that do not depend on timing: model bytes, padded fractions, FLOPs."""
    w = wide(table.drop(columns=["run", "reference", "run_date", "device"], errors="ignore"))
    keep = {"fp32_memory": ["model_bytes", "trace_matches"],
            "padding_waste": ["padded_frac_expected", "padded_frac", "matmul_flops_padding", "graphs"]}[study]
    params = [c for c in w.columns if c in ("norm", "budget", "buffer", "scope", "mix", "budget_set", "case",
                                            "max_items", "max_graphs", "in_dtype", "buffer_dtype")]
    cols = [c for c in keep if c in w.columns]
    return w[params + cols].dropna(subset=cols, how="all").sort_values(params).reset_index(drop=True)


@pytest.mark.slow
def test_a_sweep_sharded_two_ways_and_merged_equals_the_unsharded_one(tmp_path):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    _sweep(whole)
    for i in (0, 1):    # as two tasks of a job array would, with the array's id as the group
        _sweep(sharded, "--shard", f"{i}/2", env={"SLURM_ARRAY_JOB_ID": "4242"})
    runs = find_runs(sharded)
    assert len(runs) == 2 and {r.logical_name for r in runs} == {"4242 (2 shards)"}
    assert sorted(r.shard["index"] for r in runs) == [0, 1]
    assert sorted(s for r in runs for s in r.tables) == ["fp32_memory", "padding_waste"]   # disjoint
    loaded, problems = load_tables(runs, ["fp32_memory", "padding_waste"])
    assert not problems
    (ref_run,) = find_runs(whole)
    ref, _ = load_tables([ref_run], ["fp32_memory", "padding_waste"])
    for study in ("fp32_memory", "padding_waste"):
        merged = [df for (run, s), df in loaded.items() if s == study]
        assert len(merged) == 1 and set(merged[0]["run"]) == {"4242 (2 shards)"}
        a, b = _deterministic(merged[0], study), _deterministic(ref[(ref_run.name, study)], study)
        assert len(a) > 0
        assert a.equals(b), (a, b)
    # the report summarizes the shards as one run
    subprocess.run([sys.executable, "-m", "workbench", "report", "--no-sweep", "--results", str(sharded)], cwd=ROOT,
                   check=True, capture_output=True, timeout=600)
    page = (sharded / "report" / "index.html").read_text()
    assert "4242 (2 shards)" in page and "shard 0/2 of 4242" in page and "shard 1/2 of 4242" in page


@pytest.mark.slow
def test_a_second_copy_of_a_study_in_one_shard_group_is_listed_not_merged(tmp_path):
    for _ in range(2):   # shard 0/1 twice under one group: the same study twice in one logical run
        _sweep(tmp_path, "--shard", "0/1", "--group", "g1")
    runs = find_runs(tmp_path)
    loaded, problems = load_tables(runs, ["fp32_memory"])
    assert len(loaded) == 1 and len(problems) == 1 and "already has a fp32_memory table" in problems[0].reason


@pytest.mark.slow
def test_gpus_run_one_worker_per_gpu_each_pinned_and_record_the_placement(tmp_path):
    # the worker plumbing on a CPU host: two pretend GPUs, each worker on the CPU
    p = _sweep(tmp_path, "--gpus", "0,1", "--profile", "cpu", env={EMULATE_GPUS_ENV: "2"})
    assert "on GPUs [0, 1]" in p.stdout
    (run,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    meta = json.loads((run / "meta.json").read_text())
    assert meta["params"]["gpus"] == [0, 1] and meta["finished_at"] and not meta["failures"]
    assert meta["params"]["gpus_emulated"] is True
    placement = meta["placement"]
    assert set(placement) == {"fp32_memory", "padding_waste"}
    assert {v["gpu"] for v in placement.values()} <= {"0", "1"}      # CUDA_VISIBLE_DEVICES of its worker
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))          # each worker's share of the cores
    assert {v["threads"] for v in placement.values()} == {os.environ.get("OMP_NUM_THREADS", share)}
    assert (run / "fp32_memory.parquet").is_file() and (run / "padding_waste.parquet").is_file()
    assert not (run / ".claims").exists()
    assert set(meta["study_seconds"]) == {"fp32_memory", "padding_waste"}    # for the next --gpus order


@pytest.mark.slow
def test_a_killed_shard_resumes_only_what_is_missing(tmp_path):
    _sweep(tmp_path, "--shard", "0/1", "--group", "g2")
    (run,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    kept = run / "fp32_memory.parquet"
    before = kept.stat().st_mtime_ns
    (run / "padding_waste.parquet").unlink()        # as if the shard was killed during that study
    meta = json.loads((run / "meta.json").read_text())
    meta.pop("finished_at")
    (run / "meta.json").write_text(json.dumps(meta))
    p = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--results", str(tmp_path), "--resume", run.name],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "resuming" in p.stdout and "padding_waste" in p.stdout
    assert kept.stat().st_mtime_ns == before and (run / "padding_waste.parquet").is_file()
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
