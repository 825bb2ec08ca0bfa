"""Bad sweep and command-line input ends in a clear error, before any run folder exists: every size
knob of every study has a cap (workbench.limits) and a cell that cannot fit the device is refused;
no raw traceback for a bad name, bad JSON, GPUs on a CPU profile or a disk that refuses writes."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli
from workbench import limits
from workbench import sweep as sweep_module
from workbench.studies import ParamError, discover
from workbench.studies import footprint as fp

REPO = Path(__file__).resolve().parents[1]


def _plan(*sets: str, studies: str | None = None, profile: str = "cpu"):
    registry = discover()
    selected = cli.select_studies(registry, studies)
    return cli._resolve_plan(cli.parse_sets(list(sets)), registry, selected, profile)


# integer knobs that are no size: bounded by their own rule (a JPEG quality is 1..100), nothing to cap
NOT_SIZES = {("contention", "jpeg_qualities")}


def test_every_integer_size_knob_of_every_study_has_a_cap():
    uncapped = [(name, p.name) for name, s in discover().items() for p in s.params
                if p.kind in ("int", "list[int]") and p.cap is None and (name, p.name) not in NOT_SIZES]
    assert uncapped == []


def test_a_jpeg_quality_outside_1_to_100_is_refused_by_its_rule():
    from workbench.studies.contention.params import PARAMS
    for bad, says in ((0, "below the minimum 1"), (101, "JPEG quality 101 is outside 1..100")):
        with pytest.raises(ValueError, match=f"jpeg_qualities.*{says}"):
            PARAMS.resolve({"jpeg_qualities": [bad]}, "cpu")


@pytest.mark.parametrize("setting, value, cap", [
    ("cast_cost.budgets=[100000000]", "100,000,000", "budget_tokens"),
    ("cast_cost.reps=1e9", "1,000,000,000", "reps"),
    ("correctness.dp_world_size=512", "512", "world_size"),
    ("encoder_latency.tokens=[1e8]", "100,000,000", "budget_tokens"),
    ("encoder_latency.warmup=1000000", "1,000,000", "reps"),
    ("padding_waste.n_items=100000", "100,000", "items"),
    ("correctness.max_pixels=100000000", "100,000,000", "frame_pixels"),
    ("fp32_memory.seed=4294967296", "4,294,967,296", "seed"),
])
def test_a_size_above_its_cap_is_refused_naming_value_cap_and_how_to_raise_it(tmp_path, setting, value, cap):
    study = setting.split(".")[0]
    with pytest.raises(SystemExit) as e:
        _plan(setting, studies=study)
    msg = str(e.value)
    assert value in msg and repr(cap) in msg and limits.LIMITS_ENV in msg and "limits.raised" in msg


def test_a_cap_raised_on_purpose_lets_the_value_through(monkeypatch):
    monkeypatch.setenv(limits.LIMITS_ENV, "reps=2000000000")
    plan = _plan("cast_cost.reps=1e9", studies="cast_cost")
    assert plan["cast_cost"]["reps"] == 10 ** 9
    with limits.raised(world_size=1024):
        monkeypatch.delenv(limits.LIMITS_ENV)
        assert _plan("correctness.dp_world_size=512", studies="correctness")["correctness"]["dp_world_size"] == 512


def test_a_negative_seed_and_a_huge_list_are_refused():
    with pytest.raises(SystemExit, match=r"seed=-1 is below the minimum 0"):
        _plan("cast_cost.seed=-1", studies="cast_cost")
    with pytest.raises(SystemExit, match=r"a list of 65 values: 65 exceeds the cap of 64"):
        _plan("cast_cost.budgets=" + ",".join(str(i) for i in range(1, 66)), studies="cast_cost")


def test_a_cell_that_cannot_fit_the_device_is_refused_before_the_run_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(fp, "available_bytes", lambda device: (2 * 10 ** 9, "MemAvailable of this host"))
    with pytest.raises(SystemExit) as e:
        _plan('encoder_latency.presets=["qwen2.5-vl-72b"]', "encoder_latency.tokens=[16384]",
              "encoder_latency.images=[1]", studies="encoder_latency")
    msg = str(e.value)
    assert "encoder_latency" in msg and "qwen2.5-vl-72b, 16384 tokens" in msg and "2.0 GB this device has" in msg
    assert _plan(studies="encoder_latency")          # the defaults fit
    with pytest.raises(SystemExit, match="needs about"):
        cli.main(["sweep", "--results", str(tmp_path), "--studies", "encoder_latency",
                  "--set", 'presets=["qwen2.5-vl-72b"]', "--set", "tokens=[16384]", "--set", "images=[1]"])
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_the_footprint_grows_with_the_cell():
    study = discover()["cast_cost"]
    small = study.footprint(study.resolve("cpu", {"budgets": [64]}), "cpu")
    large = study.footprint(study.resolve("cpu", {"budgets": [64, 16384]}), "cpu")
    assert 0 < small.bytes < large.bytes and "16384" in large.cell
    with pytest.raises(ParamError, match="needs about"):
        fp.check_fits("cast_cost", fp.Footprint(10 ** 15, "x"), "cpu")


@pytest.mark.parametrize("name, expect", [("///", "has no letter or digit"), ("x" * 300, "300 characters long")])
def test_a_bad_run_name_is_refused(tmp_path, name, expect):
    with pytest.raises(SystemExit, match=expect):
        cli.main(["sweep", "--results", str(tmp_path), "--name", name, "--studies", "fp32_memory"])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("text, expect", [("not json", "is not JSON"), ("[1, 2]", "is a JSON list")])
def test_info_params_must_be_a_json_object(text, expect):
    with pytest.raises(SystemExit, match=expect):
        cli.main(["info", "--params", text])


def test_gpus_on_the_cpu_profile_are_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--gpus 7: the cpu profile runs on the CPU"):
        cli.main(["sweep", "--results", str(tmp_path), "--profile", "cpu", "--gpus", "7", "--studies", "fp32_memory"])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_disk_that_refuses_the_run_folder_ends_in_a_message(tmp_path, monkeypatch, code):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "run"))
    monkeypatch.setattr(sweep_module.RunFolder, "create", refuse)
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--results", str(tmp_path), "--direct", "--studies", "fp32_memory"])
    assert os.strerror(code) in str(e.value) and "nothing finished was changed" in str(e.value)


def test_results_that_is_a_file_ends_in_a_message_without_traceback(tmp_path):
    """Through the console entry point in a subprocess (the other command-line tests call cli.main
    in this process): a refusal is a message on stderr and exit code 1, never a traceback."""
    target = tmp_path / "afile"
    target.write_text("mine")
    p = subprocess.run([sys.executable, "-m", "workbench", "sweep", "--direct", "--results", str(target),
                        "--studies", "fp32_memory", "--set", "budgets=[1024]"], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == f"--results {target} is a file, not a folder; give the folder that holds the run folders"
    assert target.read_text() == "mine"
    with pytest.raises(SystemExit, match=f"--results {target} is a file, not a folder"):    # in process too
        cli.main(["report", "--no-sweep", "--results", str(target)])
    assert target.read_text() == "mine"


@pytest.mark.parametrize("text, expect", [("frames", "is not NAME=VALUE"), ("bogus=3", "is not NAME=VALUE"),
                                          ("frames=-2", "frames must be a positive integer")])
def test_a_malformed_limits_variable_is_named_at_the_door(monkeypatch, tmp_path, text, expect):
    monkeypatch.setenv(limits.LIMITS_ENV, text)
    with pytest.raises(SystemExit, match=expect):
        cli.main(["sweep", "--results", str(tmp_path), "--studies", "fp32_memory"])
