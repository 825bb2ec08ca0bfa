"""A sweep refuses what it cannot run before its run folder exists, and records what fails after.

Each refusal here is one a user met only after a run folder had been made (an empty "finished"
run, a run full of failures, an override silently dropped): now a one-line SystemExit naming the
option and the valid choices, and nothing under --results. The stub studies of tests/stub_study.py
stand in for real ones where a sweep must run."""
import json
from pathlib import Path

import pytest
import torch

from workbench import cli, stages

FAST = ["--direct", "--studies", "stub_a,stub_b", "--set", "stub_a.sizes=[1,2,3]", "--set", "stub_b.sizes=[7]"]


def _sweep(results: Path, *args: str) -> int:
    return cli.main(["sweep", "--results", str(results), *args])


def _refused(results: Path, *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        _sweep(results, *args)
    assert isinstance(e.value.code, str), e.value.code
    assert not any(results.iterdir()), "a refused sweep left a run folder"
    return e.value.code


def _finished_run(results: Path) -> Path:
    assert _sweep(results, *FAST) == 0
    (run,) = [d for d in results.iterdir() if d.is_dir()]
    return run


@pytest.mark.parametrize("names", [",", " , ,"])
def test_a_study_list_naming_no_study_is_refused(stubs, tmp_path, names):
    message = _refused(tmp_path, "--direct", "--studies", names)
    assert "names no study" in message and "stub_a" in message


def test_a_repeated_list_value_is_refused_before_the_run(stubs, tmp_path):
    message = _refused(tmp_path, "--direct", "--studies", "stub_a", "--set", "stub_a.sizes=[2,3,2]")
    assert "sizes" in message and "repeats 2" in message


def test_repeated_placements_are_refused_by_the_real_study(tmp_path):
    message = _refused(tmp_path, "--direct", "--studies", "correctness", "--set", 'placements=["tower","tower"]')
    assert "placements" in message and "'tower'" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host without CUDA")
def test_the_gpu_profile_on_a_host_without_cuda_is_refused(stubs, tmp_path):
    message = _refused(tmp_path, "--profile", "gpu", *FAST)
    assert "--profile gpu" in message and "no CUDA device" in message and "--profile cpu" in message


def test_an_unknown_jupyter_kernel_is_refused_before_the_run(stubs, tmp_path):
    message = _refused(tmp_path, "--studies", "stub_a", "--kernel", "no-such-kernel-xyz")
    assert "no-such-kernel-xyz" in message and "installed" in message


@pytest.mark.parametrize("extra, flag", [(["--set", "stub_a.sizes=[9]"], "--set"),
                                         (["--studies", "stub_a"], "--studies"),
                                         (["--profile", "cpu"], "--profile"),
                                         (["--shard", "0/2"], "--shard")])
def test_a_resume_refuses_options_it_would_ignore(stubs, tmp_path, extra, flag):
    run = _finished_run(tmp_path)
    before = (run / "meta.json").read_bytes()
    with pytest.raises(SystemExit) as e:
        _sweep(tmp_path, "--resume", run.name, *extra)
    assert flag in e.value.code and "meta.json recorded" in e.value.code
    assert (run / "meta.json").read_bytes() == before


def test_figures_that_fail_to_draw_are_a_recorded_failure_and_a_resume_draws_them(stubs, tmp_path, monkeypatch):
    def full_disk(path, text):                     # the figures stage's last write meets a full disk
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(stages, "atomic_write_text", full_disk)
        assert _sweep(tmp_path, *FAST) == 1                   # the exit says something failed
    (run,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    meta = json.loads((run / "meta.json").read_text())
    assert sorted(meta["failures"]) == [f"stub_{x}: figures not saved (OSError: [Errno 28] No space left on device)"
                                        for x in "ab"]
    tables = {p.name: p.read_bytes() for p in run.glob("*.parquet")}
    assert set(tables) == {"stub_a.parquet", "stub_b.parquet"}          # the measurements stay

    assert _sweep(tmp_path, "--resume", run.name) == 0
    meta = json.loads((run / "meta.json").read_text())
    assert meta["resumed"][-1]["failures"] == [] and (run / "figures" / "stub_a_sizes.png").is_file()
    assert {p.name: p.read_bytes() for p in run.glob("*.parquet")} == tables
