"""A run's state is read back from its folder, and `sweep --resume` finishes whatever is left, down
to the executed notebook, its HTML and the figures; a finished run is a record that a resume never
rewrites. Every case here was a way to lose or freeze a run.

The sweeps here run the stub study of tests/stub_study.py (the `stubs` fixture): what is checked
is the sweep's stages and records, which do not depend on what a study measures; the one real
end-to-end sweep (real studies, killed and resumed) is in tests/test_sweep_faults.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench import cli
from workbench import provenance as prov
from workbench.results.meta import RunMeta
from workbench.results.folder import STAGES, RunFolder, notebook_done
from workbench.studies.plotting import PROGRESS_ENV
from workbench.sweep import interrupted_run

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "results" / "reference"
SMALL = ["--studies", "stub_a", "--set", "sizes=[3,5]"]


def _sweep(results: Path, *extra: str) -> Path:
    assert cli.main(["sweep", "--results", str(results), *SMALL, *extra]) == 0
    (run,) = [d for d in results.iterdir() if d.is_dir()]
    return run


def _unfinish(run: Path) -> None:
    """What a SIGKILL between the last table and the sweep's end leaves: meta.json unfinished."""
    meta = json.loads((run / "meta.json").read_text())
    meta["finished_at"] = meta["duration_s"] = None
    for key in ("failures", "warnings", "study_seconds"):
        meta.pop(key, None)
    (run / "meta.json").write_text(json.dumps(meta))


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_run_killed_after_its_last_table_is_finished_by_resume(stubs, tmp_path, capsys):
    run = _sweep(tmp_path, "--direct")
    table = (run / "stub_a.parquet").read_bytes()
    shutil.rmtree(run / "figures")
    _unfinish(run)
    state = RunFolder(run).state(RunMeta.from_json(run))
    assert not state.finished and state.left == {"stub_a": ["figures"]}
    assert interrupted_run(tmp_path, "cpu") in (run, None)   # None where the tree is dirty
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name]) == 0
    assert "stub_a (figures)" in capsys.readouterr().out
    meta = RunMeta.from_json(run)
    assert meta.finished_at and meta.failures == [] and meta.resumed[-1]["stages"] == {"stub_a": ["figures"]}
    assert RunFolder(run).state(meta).left == {}
    assert (run / "stub_a.parquet").read_bytes() == table           # the table was not measured again
    assert sorted(json.loads((run / "figures" / ".stub_a.drawn").read_text())) == sorted(
        p.name for p in (run / "figures").iterdir() if not p.name.startswith("."))
    assert interrupted_run(tmp_path, "cpu") is None                       # make report sweeps again, not resumes
    assert not (run / ".lock").exists()


def test_an_unfinished_run_with_nothing_left_is_recorded_as_finished(stubs, tmp_path):
    run = _sweep(tmp_path, "--direct")
    _unfinish(run)
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name]) == 0
    meta = RunMeta.from_json(run)
    assert meta.finished_at and meta.resumed is None


@pytest.mark.slow
def test_a_notebook_that_raised_after_saving_its_table_is_executed_again_on_the_recorded_table(stubs, tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "1")          # the sweep sets it for its kernels; keep ours as it was
    run = _sweep(tmp_path)
    nb = run / "stub_a.ipynb"
    assert notebook_done(nb)
    table = (run / "stub_a.parquet").stat()
    doc = json.loads(nb.read_text())
    doc["metadata"]["papermill"]["exception"] = True      # as papermill records a cell that raised
    nb.write_text(json.dumps(doc))
    (run / "stub_a.html").unlink()
    shutil.rmtree(run / "figures")
    _unfinish(run)
    assert RunFolder(run).state(RunMeta.from_json(run)).left == {"stub_a": ["notebook", "html", "figures"]}
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name]) == 0
    assert notebook_done(nb) and "loaded, not measured again" in nb.read_text()
    after = (run / "stub_a.parquet").stat()
    assert (after.st_ino, after.st_mtime_ns) == (table.st_ino, table.st_mtime_ns)
    assert (run / "stub_a.html").is_file() and (run / "figures" / ".stub_a.drawn").is_file()
    assert RunFolder(run).state(RunMeta.from_json(run)).left == {}


def test_a_finished_reference_run_is_refused_and_left_untouched(tmp_path):
    ref = REFERENCE / "20261130T094859Z-0f3eede-h200"   # finished; its plan names padding_waste, which has no table
    run = tmp_path / ref.name
    shutil.copytree(ref, run)
    before = _files(run)
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name])
    msg = str(e.value)
    assert "finished at 2026-11-30T09:56:03.616Z" in msg and "padding_waste (table" in msg and "--resume-finished" in msg
    assert _files(run) == before and not (run / ".lock").exists()


def test_resume_finished_keeps_every_recorded_field_and_appends_itself(stubs, tmp_path):
    run = _sweep(tmp_path, "--direct")
    (run / "stub_a.parquet").unlink()
    before = RunMeta.from_json(run).to_dict()
    with pytest.raises(SystemExit, match="--resume-finished"):
        cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name])
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name, "--resume-finished"]) == 0
    after = RunMeta.from_json(run).to_dict()
    assert {k: v for k, v in after.items() if k != "resumed"} == before
    (entry,) = after["resumed"]
    assert entry["studies"] == ["stub_a"] and entry["failures"] == [] and entry["finished_at"]
    assert (run / "stub_a.parquet").is_file() and not (run / ".lock").exists()


def test_a_run_that_finished_with_failures_resumes_and_keeps_its_record(stubs, tmp_path):
    run = _sweep(tmp_path, "--direct")
    (run / "stub_a.parquet").unlink()
    meta = RunMeta.from_json(run)
    meta.failures = ["stub_a: RuntimeError: out of memory (simulated)"]
    meta.write(run, overwrite=True)
    assert meta.open_failures() == meta.failures
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name]) == 0
    after = RunMeta.from_json(run)
    assert after.failures == meta.failures and after.finished_at == meta.finished_at
    assert after.open_failures() == []                      # the resume mended it, and says so in its entry


def test_resume_of_a_garbage_meta_json_names_the_file(tmp_path):
    run = tmp_path / "20261130T000000Z-abcdef0-cpu"
    run.mkdir()
    (run / "meta.json").write_text("{not json")
    with pytest.raises(SystemExit) as e:
        cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name])
    assert "--resume" in str(e.value) and "meta.json" in str(e.value)
    assert not (run / ".lock").exists()


@pytest.mark.slow
def test_every_stage_has_a_file_that_says_it_is_done(stubs, tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "1")
    run = _sweep(tmp_path)
    state = RunFolder(run).state(RunMeta.from_json(run))
    assert not state.direct and set(state.studies["stub_a"]) == set(STAGES)
    assert state.left == {}


def test_the_report_shows_what_an_interrupted_run_lacks_and_no_mended_failure(stubs, tmp_path):
    from workbench.report import build_report
    run = _sweep(tmp_path, "--direct")
    shutil.rmtree(run / "figures")
    _unfinish(run)
    page = build_report(tmp_path).index.read_text()
    assert "interrupted (left: stub_a (figures))" in page
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name]) == 0
    meta = RunMeta.from_json(run)
    meta.failures = ["stub_a: RuntimeError: simulated"]
    meta.write(run, overwrite=True)
    assert "1 failed" in build_report(tmp_path).index.read_text()
    (run / "stub_a.parquet").unlink()
    assert cli.main(["sweep", "--results", str(tmp_path), "--resume", run.name]) == 0
    page = build_report(tmp_path).index.read_text()
    assert "1 failed" not in page and "simulated" not in page


def test_report_refuses_a_user_folder_before_sweeping(stubs, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--results", str(tmp_path / "results"), "--out", str(mine), "--studies", "stub_a"])
    assert "refusing to write the report into" in str(e.value) and "notes.txt" in str(e.value)
    assert (mine / "notes.txt").read_text() == "keep me" and not (tmp_path / "results").exists()


def _fake_default_run(root: Path, sha: str, profile: str = "cpu") -> Path:
    """A finished default sweep of commit ``sha`` whose every stage has its file."""
    from workbench.studies import discover
    studies = discover()
    run = root / f"20261130T000000Z-{sha[:7]}-{profile}"
    run.mkdir(parents=True)
    meta = RunMeta.collect({"profile": profile, "device": "cpu", "mode": "papermill",
                            "studies": {n: s.resolve(profile) for n, s in studies.items()}})
    meta.git = {"sha": sha, "short": sha[:7], "dirty": False}
    meta.failures = []
    meta.finish().write(run)
    for n in studies:
        (run / f"{n}.parquet").write_bytes(b"")
        (run / f"{n}.ipynb").write_text(json.dumps({"metadata": {"papermill": {"end_time": "x", "exception": None}}}))
        (run / f"{n}.html").write_text("<html></html>")
        (run / "figures").mkdir(exist_ok=True)
        (run / "figures" / f".{n}.drawn").write_text("[]")
    return run


def test_make_report_reuses_the_finished_default_sweep_of_this_commit(tmp_path, monkeypatch, capsys):
    from workbench import sweep
    sha = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setattr(prov, "git_info", lambda root=None: {"sha": sha, "short": sha[:7], "dirty": False})
    run = _fake_default_run(tmp_path, sha)
    from workbench.studies import discover
    assert sweep.reusable_run(tmp_path, "cpu", "cpu", discover()) == run
    assert sweep.reusable_run(tmp_path, "cpu", "gpu", discover()) is None          # another profile
    monkeypatch.setattr(cli, "_sweep", lambda *a, **k: pytest.fail("make report swept instead of reusing"))
    cli.main(["report", "--results", str(tmp_path), "--profile", "cpu"])
    assert f"reusing {run.name}" in capsys.readouterr().out
    (run / "figures" / ".fp32_memory.drawn").unlink()                              # a stage missing: not reusable
    assert sweep.reusable_run(tmp_path, "cpu", "cpu", discover()) is None
    assert RunMeta.from_json(run).plan["fp32_memory"]
    other = _fake_default_run(tmp_path / "b", sha)
    m = RunMeta.from_json(other)
    m.plan["fp32_memory"]["budgets"] = [1024]                                       # not the default plan
    m.write(other, overwrite=True)
    assert sweep.reusable_run(tmp_path / "b", "cpu", "cpu", discover()) is None
