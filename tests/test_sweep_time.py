"""Know before you start: a sweep prints its predicted wall time, and --max-minutes refuses (or with
--fit trims the repetitions of) a plan that would not fit, before any run folder exists."""
from __future__ import annotations

import json

import pytest

from workbench import cli
from workbench.studies import discover
from workbench.sweep import SweepPlan, plan_time


def _timed_run(results, study: str, seconds: float, params: dict, profile: str = "cpu"):
    run = results / f"20260101T000000Z-abc1234-{profile}"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"params": {"profile": profile, "studies": {study: params}},
                                               "study_seconds": {study: seconds}}))


def _plan(tmp_path, **kw):
    study = discover()["cast_cost"]
    params = {"cast_cost": study.resolve("cpu", {})}
    return study, params, SweepPlan(studies=(study,), params=params, profile="cpu", results=tmp_path, name="cpu", **kw)


def test_the_prediction_comes_from_the_newest_timed_run(tmp_path, capsys):
    study, params, plan = _plan(tmp_path)
    _timed_run(tmp_path, "cast_cost", 600.0, params["cast_cost"])
    assert plan_time(plan) == params
    out = capsys.readouterr().out
    assert "sweep: predicted cast_cost 600 s" in out and "about 10.0 min" in out and "a guess" not in out



def test_a_prediction_from_a_run_of_other_settings_says_which(tmp_path, capsys):
    study, params, plan = _plan(tmp_path)
    _timed_run(tmp_path, "cast_cost", 600.0, {**params["cast_cost"], "reps": 3, "seed": 7})
    plan_time(plan)
    out = capsys.readouterr().out
    assert "cast_cost 600 s" in out and f"from a run with other settings: reps 3 (here {params['cast_cost']['reps']})" in out
    assert "seed 7 (here 0)" in out and "a guess" not in out

def test_over_the_limit_is_refused_and_fit_trims_the_repetitions(tmp_path, capsys):
    study, params, plan = _plan(tmp_path, max_minutes=5)
    _timed_run(tmp_path, "cast_cost", 600.0, params["cast_cost"])
    with pytest.raises(SystemExit, match=r"predicted 10.0 min, over --max-minutes 5; .* --fit"):
        plan_time(plan)
    _, _, fit = _plan(tmp_path, max_minutes=5, fit=True)
    got = plan_time(fit)
    assert got["cast_cost"]["reps"] == params["cast_cost"]["reps"] // 2
    assert got["cast_cost"]["min_reps"] == min(params["cast_cost"]["min_reps"], got["cast_cost"]["reps"])
    assert {k: v for k, v in got["cast_cost"].items() if k not in ("reps", "min_reps")} == \
        {k: v for k, v in params["cast_cost"].items() if k not in ("reps", "min_reps")}
    assert "--fit: repetitions trimmed" in capsys.readouterr().out
    _, _, tight = _plan(tmp_path, max_minutes=0.01, fit=True)
    with pytest.raises(SystemExit, match="even at the fewest repetitions"):
        plan_time(tight)


@pytest.mark.parametrize("argv, says", [
    (["--max-minutes", "0"], "'0' is not a number of minutes > 0"),
    (["--max-minutes", "soon"], "'soon' is not a number of minutes > 0"),
    (["--max-minutes", "inf"], "'inf' is not a number of minutes > 0"),
])
def test_bad_limits_are_named(argv, says, capsys):
    with pytest.raises(SystemExit):
        cli.main(["sweep", *argv])
    assert says in capsys.readouterr().err


def test_fit_alone_and_with_a_resume_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="--fit trims the repetitions to fit --max-minutes N"):
        cli.main(["sweep", "--fit", "--results", str(tmp_path)])
    with pytest.raises(SystemExit, match="--max-minutes cannot change a run being finished"):
        cli.main(["sweep", "--resume", "x", "--max-minutes", "3", "--results", str(tmp_path)])


def test_a_sweep_that_would_not_fit_leaves_no_run_folder(stubs, tmp_path, capsys):
    with pytest.raises(SystemExit, match="over --max-minutes 0.001"):
        cli.main(["sweep", "--direct", "--studies", "stub_a", "--max-minutes", "0.001", "--results", str(tmp_path)])
    assert "untimed: a guess" in capsys.readouterr().out
    assert not [p for p in tmp_path.iterdir() if (p / "meta.json").exists()]
    assert cli.main(["sweep", "--direct", "--studies", "stub_a", "--max-minutes", "5", "--results", str(tmp_path)]) == 0


def test_a_cell_timed_alone_takes_its_own_seconds_and_each_cell_is_printed(tmp_path, capsys):
    """A run of one preset measured that preset's cell: the prediction takes its seconds instead of scaling
    another run's by tower FLOPs (one of other settings does not count), and prints every cell."""
    study = discover()["cast_cost"]
    both = study.resolve("cpu", {"presets": ["tiny-qwen2-vl", "tiny-qwen3-vl"]})
    plan = SweepPlan(studies=(study,), params={"cast_cost": both}, profile="cpu", results=tmp_path, name="cpu")

    def timed(stamp: str, seconds: float, params: dict):
        run = tmp_path / f"{stamp}-abc1234-cpu"
        run.mkdir()
        (run / "meta.json").write_text(json.dumps({"params": {"profile": "cpu", "studies": {"cast_cost": params}},
                                                   "study_seconds": {"cast_cost": seconds}}))

    timed("20260103T000000Z", 100.0, both)                                              # the newest: both
    timed("20260102T000000Z", 7.0, {**both, "presets": ["tiny-qwen3-vl"]})              # one, same settings
    timed("20260101T000000Z", 1.0, {**both, "presets": ["tiny-qwen2-vl"], "reps": 1})    # one, other settings
    plan_time(plan)
    out = capsys.readouterr().out
    cells = dict(part.rsplit(" ", 2)[0:2] for part in out.splitlines()[1].split(": ", 1)[1].split(", "))
    assert cells["tiny-qwen3-vl"] == "7"                     # its own run, not its FLOPs' share of 100 s
    assert 1 < float(cells["tiny-qwen2-vl"]) < 100           # its FLOPs' share of the newest run
    assert "(2 cells, 1 timed alone)" in out


def test_a_plan_whose_every_cell_was_timed_alone_rests_on_nothing_else(tmp_path, capsys):
    study = discover()["cast_cost"]
    plan_params = study.resolve("cpu", {"presets": ["tiny-qwen2-vl"]})
    plan = SweepPlan(studies=(study,), params={"cast_cost": plan_params}, profile="cpu", results=tmp_path, name="cpu")
    for stamp, seconds, params in (("20260102T000000Z", 5.0, {**plan_params, "reps": 1}),   # newest: other settings
                                   ("20260101T000000Z", 9.0, plan_params)):                 # this cell, alone
        run = tmp_path / f"{stamp}-abc1234-cpu"
        run.mkdir()
        (run / "meta.json").write_text(json.dumps({"params": {"profile": "cpu", "studies": {"cast_cost": params}},
                                                   "study_seconds": {"cast_cost": seconds}}))
    plan_time(plan)
    out = capsys.readouterr().out
    assert "cast_cost 9 s (1 cell, 1 timed alone)" in out and "other settings" not in out
