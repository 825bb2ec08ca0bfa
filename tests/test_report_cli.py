"""Provenance (meta.json, run folders, atomic tables), the HTML report, and the command line.

Every results folder here lives under pytest's tmp_path; nothing is written under results/. The
slow parts (one small correctness run in this process, one `sweep --direct` in a subprocess) are
module-scoped fixtures shared by the tests that read them.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import html
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest

from workbench import provenance as prov
from workbench import report as rep
from workbench import studies
from workbench.results.meta import RunMeta
from workbench.results.folder import RunFolder, RunLock, run_in_use
import workbench.studies.correctness.summary  # noqa: F401  (binds correctness.summary)

REPO = Path(__file__).resolve().parent.parent
REFERENCE_RUN = REPO / "results" / "reference" / "20261130T074611Z-2fedbe0-h200"   # H200: correctness and more
CLI_TIMEOUT_S = 300
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _now():
    return dt.datetime.now(dt.timezone.utc)


def _parse(ts: str) -> dt.datetime:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


def cli(*args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """The console entry point in a subprocess (what a user runs)."""
    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def main_in_process(capsys, *args) -> tuple[int, str, str]:
    """``workbench.cli.main(args)`` in this process, ending as the console entry point ends:
    (exit code, stdout, stderr). A SystemExit with a message is printed to stderr with exit code 1,
    as the interpreter does (test_cli_help_is_instant_and_a_bad_flag_shows_the_subcommands_usage and
    tests/test_sweep_inputs.py check that path through a real subprocess); any other exception
    escapes and fails the test, as a traceback would."""
    from workbench.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
    out, err = capsys.readouterr()
    return (0 if code is None else code), out, err


def run_folders(results: Path) -> list[Path]:
    return sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []


# =========================================================================== provenance


def test_collect_meta_records_git_packages_device_and_start():
    before = _now()
    meta = prov.collect_meta({"alpha": 1, "families": ["tiny-qwen2-vl"]})
    after = _now()

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    git = meta["git"]
    assert git["sha"] == head and re.fullmatch(r"[0-9a-f]{40}", git["sha"])
    assert git["short"] == head[:7]
    assert isinstance(git["dirty"], bool)
    assert Path(git["root"]).resolve() == REPO

    for name in ("torch", "numpy", "pandas", "pyarrow"):
        assert meta["packages"][name] == metadata.version(name)
    assert isinstance(meta["device"], str) and meta["device"]
    assert meta["device"] == meta["torch"]["device"]
    import torch
    if not torch.cuda.is_available():
        assert meta["device"].startswith("cpu")

    assert meta["started_at"].endswith("Z")
    started = _parse(meta["started_at"])
    assert before - dt.timedelta(seconds=1) <= started <= after + dt.timedelta(seconds=1)
    assert meta["finished_at"] is None and meta["duration_s"] is None
    assert meta["params"] == {"alpha": 1, "families": ["tiny-qwen2-vl"]}
    json.dumps(meta, default=str)  # serializable as written


def test_git_info_outside_a_repository_is_recorded_not_raised(tmp_path):
    info = prov.git_info(tmp_path)
    assert info["sha"] is None and info["dirty"] is None and info["error"]


def test_finish_meta_adds_end_time_and_duration():
    meta = RunMeta.collect()
    meta.started_at = prov.iso_utc(prov.utc_now() - dt.timedelta(seconds=2.5))
    out = meta.finish()
    assert out is meta
    assert meta.finished_at.endswith("Z")
    assert _parse(meta.finished_at) >= _parse(meta.started_at)
    assert 2.5 <= meta.duration_s < 10


def test_write_meta_protects_a_finished_run(tmp_path):
    meta = RunMeta.collect({"n": 1})
    path = meta.write(tmp_path)
    assert path == tmp_path / "meta.json"
    assert RunMeta.from_json(tmp_path).params == {"n": 1}

    meta.params["n"] = 2                          # unfinished: may be replaced
    meta.write(tmp_path)
    assert RunMeta.from_json(tmp_path).params == {"n": 2}

    meta.finish().write(tmp_path)
    finished_text = path.read_text()
    assert json.loads(finished_text)["finished_at"]

    with pytest.raises(FileExistsError, match="finished run"):
        dataclasses.replace(meta, params={"n": 3}).write(tmp_path)
    with pytest.raises(FileExistsError):
        RunMeta.collect({"n": 4}).write(tmp_path)   # even an unfinished one
    assert path.read_text() == finished_text

    dataclasses.replace(meta, params={"n": 5}).write(tmp_path, overwrite=True)
    assert RunMeta.from_json(tmp_path).params == {"n": 5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]   # no temporary left


def test_write_meta_is_atomic(tmp_path, monkeypatch):
    RunMeta(started_at="x", params={"v": "old"}).write(tmp_path)
    old_text = (tmp_path / "meta.json").read_text()

    def broken_replace(src, dst):
        raise OSError("disk went away")

    monkeypatch.setattr(prov.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk went away"):
        RunMeta(started_at="x", params={"v": "new"}).write(tmp_path)
    monkeypatch.undo()
    assert (tmp_path / "meta.json").read_text() == old_text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_write_meta_serializes_paths_dtypes_and_numpy_scalars(tmp_path):
    import numpy as np
    import torch

    RunMeta(extra={"p": Path("a/b"), "d": torch.bfloat16, "x": np.float32(1.5), "t": (1, 2)}).write(tmp_path)
    back = RunMeta.from_json(tmp_path).extra
    assert back["p"] == "a/b" and back["d"] == "torch.bfloat16" and back["x"] == 1.5
    assert back["t"] == [1, 2]


def test_new_run_dir_names_and_never_reuses_a_folder(tmp_path, monkeypatch):
    fixed = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    monkeypatch.setattr(prov, "utc_now", lambda: fixed)
    short = prov.git_info()["short"]

    d = RunFolder.create(tmp_path / "res", name="my run/1").path
    assert d.parent == tmp_path / "res" and d.is_dir() and not any(d.iterdir())
    assert d.name == f"20300102T030405Z-{short}-my-run-1"
    (d / "meta.json").write_text("{}")
    # the same second and name again: a new folder, the first one untouched
    again = RunFolder.create(tmp_path / "res", name="my run/1").path
    assert again.name == f"20300102T030405Z-{short}-my-run-1-2" and not any(again.iterdir())
    assert (d / "meta.json").read_text() == "{}"
    with pytest.raises(ValueError):
        RunFolder.create(tmp_path / "res", name="///")


def test_concurrent_new_run_dirs_of_the_same_name_are_all_distinct(tmp_path, monkeypatch):
    """Eight processes ask for the same name in the same second: eight folders."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    with ctx.Pool(8) as pool:
        names = pool.starmap(_new_run_dir_at_fixed_time, [(str(tmp_path),)] * 8)
    assert len(set(names)) == 8 and sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def _new_run_dir_at_fixed_time(root):
    prov.utc_now = lambda: dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    return RunFolder.create(root, name="same").path.name


def test_a_finished_table_is_never_overwritten(tmp_path):
    path = studies.write_study_table(_demo_table(), tmp_path / "t.parquet")
    with pytest.raises(FileExistsError, match="never overwritten"):
        studies.write_study_table(_demo_table(5.0), path)
    pd.testing.assert_frame_equal(pd.read_parquet(path), _demo_table())
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]      # no temporary file left


def test_run_lock_is_exclusive_and_released_when_its_holder_dies(tmp_path):
    import subprocess
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from workbench.results.folder import RunLock
lock = RunLock({str(run)!r}); assert lock.acquire(); print('held', flush=True); time.sleep(60)"""],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_in_use(run)
        assert not RunLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()
    assert not run_in_use(run)            # SIGKILL released it


def test_write_study_table_round_trips_through_parquet_in_schema_order(tmp_path):
    df = pd.DataFrame({
        "metric": ["rel_err", "rel_err", "ok"],
        "family": ["qwen2-vl", "qwen2.5-vl", "qwen2-vl"],
        "n": [1, 2, 3],
        "device": ["cpu: x"] * 3,
        "value": [1e-7, float("nan"), 0.0],
        "unit": ["relative", "relative", "bool"],
    }, index=[10, 20, 30])
    path = studies.write_study_table(df, tmp_path / "sub" / "t.parquet")
    assert path == tmp_path / "sub" / "t.parquet"
    back = pd.read_parquet(path)
    assert list(back.columns) == ["family", "n", "device", "metric", "value", "unit"]   # no index stored
    pd.testing.assert_frame_equal(back, studies.check_table(df), check_dtype=False)
    assert back["n"].dtype.kind == "i" and back["value"].dtype == float
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.parquet"]


def _demo_table(value=1.0):
    return pd.DataFrame({"norm": ["eager", "triton_rows"], "device": ["cpu: test", "cpu: test"],
                         "metric": ["norm_us", "norm_us"], "value": [value, 2.0], "unit": ["us", "us"]})


def _no_figures(table, out_dir):
    """A summarize for a study given `_demo_table` instead of its own table."""
    return studies.Summary(text=f"{len(table)} rows", figures=[])


def test_save_table_interactive_makes_its_own_run_folder(tmp_path):
    df = _demo_table()
    path = studies.save_table("demo", df, run_dir=None, params={"families": ["a"]}, results_root=tmp_path)
    run_dir = path.parent
    assert path.name == "demo.parquet" and run_dir.parent == tmp_path
    assert run_dir.name.endswith("-demo-interactive")
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)
    meta = RunMeta.from_json(run_dir).to_dict()
    assert meta["finished_at"] and meta["duration_s"] is not None
    assert meta["params"] == {"studies": {"demo": {"families": ["a"]}}, "mode": "interactive"}
    assert meta["git"]["sha"]

    with pytest.raises(FileExistsError):
        studies.save_table("demo", _demo_table(9.0), run_dir=run_dir)
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)   # the table is untouched

    # a second interactive save goes to a new folder, never into the first one
    other = studies.save_table("demo2", df, run_dir=None, results_root=tmp_path)
    assert other.parent != run_dir


def test_save_table_refuses_a_table_that_breaks_the_schema_and_writes_nothing(tmp_path):
    bad = _demo_table().drop(columns="unit")
    with pytest.raises(studies.TableError, match="unit"):
        studies.save_table("demo", bad, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "demo.parquet").exists()


def test_save_table_interactive_defaults_to_the_project_results_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)                       # as in JupyterLab, cwd = notebooks/
    monkeypatch.setattr(prov, "REPO_ROOT", tmp_path / "project")
    monkeypatch.delenv(prov.RESULTS_ENV, raising=False)
    path = studies.save_table("demo", _demo_table(), run_dir=None)
    assert path.parent.parent == tmp_path / "project" / "results"


def test_save_table_into_a_sweeps_run_dir_leaves_its_meta_alone(tmp_path):
    run_dir = RunFolder.create(tmp_path, name="sweep").path
    RunMeta.collect({"profile": "cpu", "mode": "papermill", "studies": {"demo": {"a": 1}}}).write(run_dir)
    before = (run_dir / "meta.json").read_text()
    path = studies.save_table("demo", _demo_table(), run_dir=run_dir, params={"a": 1})
    assert path == run_dir / "demo.parquet"
    assert sorted(p.name for p in run_dir.iterdir()) == ["demo.parquet", "meta.json"]
    assert (run_dir / "meta.json").read_text() == before          # the sweep finishes its own meta


def test_papermill_by_hand_into_a_run_dir_gets_provenance(tmp_path):
    """README recipe: `papermill ... -p run_dir results/my-run` for two studies: one meta.json
    that records both studies' parameters, and the report reads the folder."""
    run_dir = tmp_path / "my-run"
    studies.save_table("demo", _demo_table(), run_dir=run_dir, params={"a": 1, "device": "cpu"})
    meta = RunMeta.from_json(run_dir).to_dict()
    assert meta["params"] == {"studies": {"demo": {"a": 1, "device": "cpu"}}, "mode": "notebook"}
    assert meta["finished_at"] and meta["git"]["sha"]
    studies.save_table("demo2", _demo_table(), run_dir=run_dir, params={"b": 2})
    assert set(RunMeta.from_json(run_dir).to_dict()["params"]["studies"]) == {"demo", "demo2"}
    runs = rep.find_runs(tmp_path)
    assert [r.name for r in runs] == ["my-run"] and runs[0].error is None and set(runs[0].tables) == {
        "demo", "demo2"}


def test_results_land_in_the_project_results_whatever_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(prov.RESULTS_ENV, raising=False)
    assert prov.results_root() == REPO / "results"
    monkeypatch.setenv(prov.RESULTS_ENV, str(tmp_path / "elsewhere"))
    assert prov.results_root() == tmp_path / "elsewhere"
    path = studies.save_table("demo", _demo_table(), run_dir=None)
    assert path.parent.parent == tmp_path / "elsewhere"
    code, out, err = main_in_process(capsys, "report", "--no-sweep")      # cwd: tmp_path
    assert code == 0, err
    assert (tmp_path / "elsewhere" / "report" / "index.html").is_file()
    assert not (tmp_path / "results").exists()


def test_cli_help_is_instant_and_a_bad_flag_shows_the_subcommands_usage():
    """The console entry point itself, in a subprocess: --help exits 0, a bad flag exits 2 with
    the subcommand's usage. The other command-line tests call cli.main in this process."""
    p = cli("--help")
    assert p.returncode == 0 and "usage: python -m workbench" in p.stdout and "Traceback" not in p.stderr
    p = cli("sweep", "--bogus")
    assert p.returncode == 2 and "usage: python -m workbench sweep" in p.stderr and "--bogus" in p.stderr
    assert "Traceback" not in p.stderr
    # instant, whatever the machine's load: neither the entry point nor --help imports torch
    code = ("import sys, workbench.__main__\n"
            "try:\n    workbench.__main__.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True).returncode == 0


# =========================================================================== report


@pytest.fixture(scope="module")
def cpu_table():
    from workbench.studies import correctness

    return correctness.run(families=["tiny-qwen2-vl"], norms=["eager"], paths=["eager", "cudagraph"],
                           buffer_dtypes=["bfloat16"], hazard=True, progress=False)


def _make_run(root: Path, table: pd.DataFrame, name: str = "cpu") -> Path:
    meta = RunMeta.collect({"studies": {"correctness": {"families": ["tiny-qwen2-vl"]}}})
    run_dir = RunFolder.create(root, name=name).path
    meta.write(run_dir)
    studies.write_study_table(table, run_dir / "correctness.parquet")
    meta.finish().write(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def results_with_runs(tmp_path_factory, cpu_table):
    """<tmp>/<local cpu run>/ and <tmp>/reference/<the H200 reference run>/ (its meta.json and
    correctness table only, so the correctness section is what these tests read)."""
    root = tmp_path_factory.mktemp("results")
    local = _make_run(root, cpu_table)
    ref = root / "reference" / REFERENCE_RUN.name
    ref.mkdir(parents=True)
    for name in ("meta.json", "correctness.parquet"):
        shutil.copy(REFERENCE_RUN / name, ref / name)
    return root, local


@pytest.fixture(scope="module")
def built(results_with_runs):
    root, local = results_with_runs
    result = rep.build_report(root)
    return root, local, result


def _row_of(page: str, run_name: str) -> str:
    """The run's row in the runs table (the answer tables name runs in their headers' titles)."""
    runs = page[page.index('<h2 id="runs">'):]
    rows = [r for r in re.findall(r"<tr>.*?</tr>", runs, flags=re.S) if run_name in r]
    assert len(rows) == 1, rows
    return rows[0]


def test_report_shows_both_devices_and_marks_the_reference(built):
    root, local, result = built
    index = root / "report" / "index.html"
    assert result.index == index and index.is_file()
    page = index.read_text(encoding="utf-8")
    assert not result.problems and not result.no_study

    names = [r.name for r in result.runs]
    assert names == [local.name, REFERENCE_RUN.name]       # local first, report/ not a run
    assert [r.reference for r in result.runs] == [False, True]

    # one device name for a run everywhere: the one its tables carry (not the host's "2x ...")
    local_device = pd.read_parquet(local / "correctness.parquet").device.iloc[0]
    ref_device = pd.read_parquet(REFERENCE_RUN / "correctness.parquet").device.iloc[0]
    assert ref_device == "NVIDIA H200" and local_device.startswith("cpu")
    assert RunMeta.from_json(REFERENCE_RUN).to_dict()["device"] == "2x NVIDIA H200"
    assert [r.device for r in result.runs] == [local_device, ref_device]
    assert html.escape(local_device) in page and html.escape(ref_device) in page
    assert "2x NVIDIA H200" not in _row_of(page, REFERENCE_RUN.name)

    ref_row, local_row = _row_of(page, REFERENCE_RUN.name), _row_of(page, local.name)
    assert 'class="ref">reference<' in ref_row and "H200" in ref_row
    assert 'class="ref"' not in local_row and html.escape(local_device) in local_row
    assert "finished" in ref_row and "finished" in local_row and "correctness" in local_row
    assert "1 of them reference runs" in page
    assert not (root / ".report.building").exists() and not (root / ".report.old").exists()


def test_report_contains_the_written_finding(built):
    from workbench.studies import correctness

    root, local, result = built
    page = (root / "report" / "index.html").read_text(encoding="utf-8")
    (section,) = [s for s in result.sections if s.name == "correctness"]
    assert section.error is None
    assert sorted(section.runs) == sorted([local.name, REFERENCE_RUN.name])
    table = rep.study_table("correctness", result.runs)
    ref_device = pd.read_parquet(REFERENCE_RUN / "correctness.parquet").device.iloc[0]
    local_device = pd.read_parquet(local / "correctness.parquet").device.iloc[0]
    assert "H200" in ref_device and local_device.startswith("cpu")
    # newest first: the GPU's view leads (open), the CPU smoke test comes after it, folded
    assert [(v.device, v.kind, v.folded) for v in section.views] == [
        (ref_device, "newest", False), (local_device, "newest", True)]
    for view, device in zip(section.views, (ref_device, local_device)):
        rows = table[table["device"] == device]
        expected = correctness.summary.findings(rows)
        assert view.text == expected
        paragraphs = [p.strip() for p in expected.split("\n\n") if p.strip()]
        assert len(paragraphs) == rows.dtype.nunique()          # one per tower dtype, each its own device
        for p in paragraphs:
            assert p.startswith(f"On {device} (") and f"<p>{html.escape(p)}</p>" in page
    assert section.text == section.views[0].text
    # the reference run's verdicts: the placements right on every path, outer wrong under the graph runner
    ref_text = section.views[0].text
    assert f"On {ref_device} (bfloat16 towers): right on every path: processor, tower, runner." in ref_text
    assert "Wrong: outer on cudagraph[" in ref_text and "NaN hazard: no real row changed" in ref_text
    # The CPU's marketing name may hold parentheses ("Intel(R) Xeon(R)"): match it literally.
    assert f"On {local_device} (float32 towers)" in section.views[1].text
    from workbench.results.tables import wide
    hazard = wide(table[(table["device"] == local_device) & (table["case"] == "nan_padding")])
    assert len(hazard) and f"no real row changed in {len(hazard)} poisoned runs" in section.views[1].text


def test_report_figures_exist_on_disk(built):
    root, local, result = built
    report_dir = root / "report"
    page = (report_dir / "index.html").read_text(encoding="utf-8")
    srcs = [html.unescape(s) for s in re.findall(r'<img src="([^"]+)"', page)]
    (section,) = [s for s in result.sections if s.name == "correctness"]
    assert srcs == section.figures and len(srcs) == 4        # per run: the matrix and the rel_err plot
    for src in srcs:
        assert not Path(src).is_absolute() and ".." not in Path(src).parts
        f = report_dir / src
        assert f.is_file() and f.stat().st_size > 1000
        assert f.read_bytes()[:8] == PNG_MAGIC
    names = {Path(s).name for s in srcs}
    assert f"correctness_matrix_{local.name}.png" in names
    assert f"correctness_matrix_{REFERENCE_RUN.name}.png" in names
    assert f"correctness_rel_err_{local.name}.png" in names
    assert f"correctness_rel_err_{REFERENCE_RUN.name}.png" in names
    for src in srcs:                                          # every PNG has its SVG beside it
        assert (report_dir / src).with_suffix(".svg").is_file()


def test_report_rebuild_replaces_the_old_one_and_ignores_report_folder(built, tmp_path):
    root, local, _ = built
    out = tmp_path / "elsewhere"
    result = rep.build_report(root, out, studies={})       # no study: a notice, no sections
    assert result.no_study and [r.name for r in result.runs] == [local.name, REFERENCE_RUN.name]
    page = (out / "index.html").read_text()
    assert "no study exists yet" in page.lower()
    # a run's link opens a copy of its meta.json inside the report folder
    for r in result.runs:
        link = re.search(rf'<a href="([^"]+)">{re.escape(r.name)}</a>', page).group(1)
        assert not link.startswith(("/", "..")) and ".." not in Path(link).parts   # inside the folder
        assert (out / link).read_bytes() == (r.path / "meta.json").read_bytes()      # a copy


def test_report_refuses_to_write_into_a_run_folder(built):
    root, local, _ = built
    before = sorted(p.name for p in local.iterdir())
    with pytest.raises(ValueError, match="run folder"):
        rep.build_report(root, local)
    assert sorted(p.name for p in local.iterdir()) == before


def test_report_survives_a_corrupt_meta_json(tmp_path, cpu_table):
    good = _make_run(tmp_path, cpu_table.head(3), name="good")
    bad = tmp_path / "20300101T000000Z-deadbee-broken"
    bad.mkdir()
    (bad / "meta.json").write_text('{"started_at": "2030-01-01T00:00:00Z", "device": ', encoding="utf-8")
    listy = tmp_path / "20300101T000001Z-deadbee-list"
    listy.mkdir()
    (listy / "meta.json").write_text("[1, 2]", encoding="utf-8")
    (tmp_path / "not-a-run").mkdir()                      # no meta.json and no table: not a run folder
    tables_only = tmp_path / "papermill-by-hand"            # tables but no meta.json: listed, not used
    tables_only.mkdir()
    shutil.copy(good / "correctness.parquet", tables_only / "correctness.parquet")

    result = rep.build_report(tmp_path, studies={})
    by_name = {r.name: r for r in result.runs}
    assert set(by_name) == {good.name, bad.name, listy.name, tables_only.name}
    assert "no meta.json" in by_name[tables_only.name].error and by_name[tables_only.name].tables == {}
    assert not by_name[bad.name].tables and "unreadable meta.json" in by_name[bad.name].error
    assert not by_name[listy.name].tables and "does not hold an object" in by_name[listy.name].error
    assert by_name[good.name].error is None

    page = result.index.read_text(encoding="utf-8")
    for r in (bad, listy):
        row = _row_of(page, r.name)
        assert "unreadable meta.json" in row and "unknown device" in row
    assert "unreadable" not in _row_of(page, good.name)
    assert f"<li>{tables_only.name}: no meta.json" in page      # listed with the reason, visibly


def _boom(table, out_dir):
    raise RuntimeError("summarize exploded on purpose")


def test_a_failing_summary_is_shown_and_does_not_hide_the_rest(tmp_path, cpu_table):
    """report.py: 'one broken study must not hide the others' -- the error is shown in the
    study's section, the page is still built (replacing the old one), the run table is complete,
    and the other studies' findings are there."""
    results = tmp_path / "results"
    run_dir = _make_run(results, cpu_table.head(6))   # two whole cells (3 metrics each)
    shutil.copy(run_dir / "correctness.parquet", run_dir / "other.parquet")
    good = studies.discover()["correctness"]
    other = dataclasses.replace(good, name="other", summarize=lambda table, out_dir: "other finding")
    out = results / "report"
    rep.build_report(results, studies={"correctness": good, "other": other})
    assert "<img" in (out / "index.html").read_text()

    result = rep.build_report(results, studies={
        "correctness": dataclasses.replace(good, summarize=_boom), "other": other})
    assert result.problems == ["correctness: RuntimeError: summarize exploded on purpose"]
    assert [s.name for s in result.sections if s.error] == ["correctness"]
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "The summary failed" in page and "summarize exploded on purpose" in page
    assert '<pre class="error">' in page and "Traceback" in page
    assert "<p>other finding</p>" in page
    assert "<img" not in page                    # the new page shows no stale figure
    assert run_dir.name in _row_of(page, run_dir.name)


def test_a_failed_build_leaves_the_previous_report_intact(built, tmp_path, monkeypatch):
    """report.py: 'a failed build leaves the previous report in place'."""
    root, _, _ = built
    good = studies.discover()["correctness"]
    quick = {"correctness": dataclasses.replace(good, summarize=lambda t, d: "first build")}
    out = tmp_path / "report"
    rep.build_report(root, out, studies=quick)
    old_page = (out / "index.html").read_bytes()
    assert b"first build" in old_page

    def broken_render(*a, **k):
        raise RuntimeError("render failed")

    monkeypatch.setattr(rep, "render_html", broken_render)
    with pytest.raises(RuntimeError, match="render failed"):
        rep.build_report(root, out, studies={"correctness": dataclasses.replace(
            good, summarize=lambda t, d: "second build")})
    assert (out / "index.html").read_bytes() == old_page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]   # no .building / .old left


def test_cli_report_exits_non_zero_when_a_summary_fails(built, tmp_path, monkeypatch, capsys):
    from workbench.cli import main

    root, _, _ = built
    good = studies.discover()["correctness"]
    monkeypatch.setitem(studies.STUDIES, "correctness", dataclasses.replace(good, summarize=_boom))
    rc = main(["report", "--no-sweep", "--results", str(root), "--out", str(tmp_path / "r")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "summary failed for correctness: RuntimeError: summarize exploded on purpose" in err
    assert "summarize exploded on purpose" in (tmp_path / "r" / "index.html").read_text()


# =========================================================================== command line


def test_cli_help(capsys):
    code, out, err = main_in_process(capsys, "--help")
    assert code == 0, err
    for word in ("report", "sweep", "info"):
        assert word in out


def test_cli_info_prints_json_with_a_device(capsys):
    code, out, err = main_in_process(capsys, "info", "--params", '{"k": [1, 2]}')
    assert code == 0, err
    meta = json.loads(out)
    assert isinstance(meta["device"], str) and meta["device"]
    assert meta["params"] == {"k": [1, 2]}
    assert meta["git"]["sha"] and meta["packages"]["torch"]
    assert meta["started_at"] and meta["finished_at"] is None


def test_cli_report_no_sweep_on_an_empty_folder(tmp_path, capsys):
    code, out, err = main_in_process(capsys, "report", "--no-sweep", "--results", tmp_path)
    assert code == 0, err
    index = tmp_path / "report" / "index.html"
    assert index.is_file()
    assert "0 run folder(s)" in out and str(index) in out
    assert "No run folder found yet" in index.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]   # no run folder made


SWEEP_SETS = ["--set", 'families=["tiny-qwen2-vl"]', "--set", 'norms=["eager"]',
              "--set", 'paths=["eager","cudagraph"]', "--set", 'buffer_dtypes=["uint8"]']


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    results = tmp_path_factory.mktemp("sweep")
    p = cli("sweep", "--direct", "--results", results, "--studies", "correctness", *SWEEP_SETS)
    return results, p


def test_cli_sweep_writes_a_finished_run_folder(sweep):
    results, p = sweep
    assert p.returncode == 0, p.stdout + p.stderr
    (run_dir,) = run_folders(results)
    assert run_dir.name.endswith("-cpu") or run_dir.name.endswith("-gpu")
    assert str(run_dir) in p.stdout and "0 failure(s)" in p.stdout
    assert sorted(f.name for f in run_dir.iterdir()) == ["correctness.parquet", "figures", "meta.json"]
    figs = sorted(f.name for f in (run_dir / "figures").iterdir())
    assert f"correctness_matrix_{run_dir.name}.png" in figs and f"correctness_matrix_{run_dir.name}.svg" in figs

    meta = RunMeta.from_json(run_dir).to_dict()
    assert meta["finished_at"] and meta["duration_s"] > 0 and meta["failures"] == []
    params = meta["params"]
    assert params["mode"] == "direct" and params["profile"] in ("cpu", "gpu")
    c = params["studies"]["correctness"]
    assert c["families"] == ["tiny-qwen2-vl"] and c["norms"] == ["eager"]
    assert c["paths"] == ["eager", "cudagraph"] and c["buffer_dtypes"] == ["uint8"]
    assert "max_pixels" in c                                 # the profile's defaults are kept
    assert meta["git"]["sha"] and meta["device"]


def test_cli_sweep_table_has_the_expected_verdicts(sweep):
    results, p = sweep
    assert p.returncode == 0, p.stdout + p.stderr
    (run_dir,) = run_folders(results)
    df = studies.wide(studies.load_table(run_dir / "correctness.parquet"))
    for col in ("family", "placement", "path", "norm", "buffer_dtype", "rel_err", "cos_min", "ok"):
        assert col in df.columns
    emb = df[df.case == "embedding"]
    assert set(emb.family) == {"qwen2-vl"}
    assert set(emb.path) == {"eager", "cudagraph"}
    assert set(emb[emb.path == "cudagraph"].buffer_dtype) == {"uint8"}
    assert set(emb.norm) <= {"eager", "(unused)"}

    def verdicts(placement, path):
        cells = emb[(emb.placement == placement) & (emb.path == path)]
        assert len(cells), (placement, path)
        return set(cells.ok)

    assert verdicts("outer", "eager") == {True}
    assert verdicts("outer", "cudagraph") == {False}
    assert verdicts("tower", "eager") == {True}
    assert verdicts("tower", "cudagraph") == {True}
    assert verdicts("none", "eager") == {False}
    assert verdicts("none", "cudagraph") == {False}
    ok = emb[emb.ok]
    assert (ok.rel_err < ok.tolerance).all() and (emb[~emb.ok].rel_err > 0.3).all()


def _assert_no_run_folder(results: Path):
    assert run_folders(results) == [], [sorted(p.iterdir()) for p in run_folders(results)]


@pytest.mark.parametrize("args, message", [
    (["--studies", "no_such_study"], "unknown studies ['no_such_study']"),
    (["--studies", "correctness", "--set", "families"], "--set expects KEY=VALUE"),
    (["--studies", "correctness", "--set", "=1"], "--set expects KEY=VALUE"),
    (["--studies", "correctness", "--set", "no_such_param=1"], "no_such_param"),
    (["--studies", "correctness", "--set", "nostudy.families=[]"], "unknown studies ['nostudy']"),
    (["--studies", "correctness", "--set", "depth=abc"], "depth='abc' is not an integer"),
    (["--studies", "correctness", "--set", 'placements=["bogus"]'], "placements='bogus' is not a valid choice"),
    (["--studies", "correctness", "--set", 'families=["no-such-family"]'], "qwen2.5-vl-7b"),
    (["--studies", "cast_cost", "--set", "hazard=false"], "no selected study takes ['hazard']"),
    (["--studies", "correctness", "--set", "correctness.budgets=[4]"], "smaller than max_items=8"),
    (["--studies", "correctness", "--set", "budgets=[64, 32]"], "strictly ascending"),
    (["--studies", "cast_cost", "--set", "fills=[0, 0.5]"], "(0, 1]"),
    (["--studies", "cast_cost", "--set", "correctness.depth=2"], "does not run"),
], ids=["unknown-study", "set-without-equals", "set-without-key", "set-unknown-key",
        "set-unknown-study", "not-an-int", "bad-choice", "bad-family", "param-of-no-selected-study",
        "cross-check", "not-ascending", "bad-fraction", "study-not-selected"])
def test_cli_sweep_bad_arguments_fail_before_any_run_folder(tmp_path, capsys, args, message):
    code, out, err = main_in_process(capsys, "sweep", "--direct", "--results", tmp_path, *args)
    assert code != 0
    assert message in err, err
    assert "Traceback" not in err
    _assert_no_run_folder(tmp_path)


def test_cli_sweep_records_the_coerced_values_that_ran(tmp_path, monkeypatch):
    """A scalar for a list and a comma-separated string become lists; meta.json records what ran."""
    from workbench import cli as cli_module
    from workbench.sweep import run_sweep

    seen = {}

    def fake_run(device="auto", progress=True, **params):
        seen.update(params)
        return _demo_table()

    study = studies.discover()["cast_cost"]
    # the demo table is not cast_cost's: its figures would fail to draw, a failure the run records
    monkeypatch.setitem(studies.STUDIES, "cast_cost", dataclasses.replace(study, run=fake_run, summarize=_no_figures))
    args = cli_module.build_parser().parse_args(
        ["sweep", "--direct", "--results", str(tmp_path), "--studies", "cast_cost", "--profile", "cpu",
         "--set", "budgets=16", "--set", "norms=eager,triton_rows", "--set", "reps=3"])
    result = run_sweep(cli_module.sweep_plan(args, studies.discover()))
    run_dir, failures = result.run_dir, result.failures
    assert failures == []
    assert seen["budgets"] == [16] and seen["norms"] == ["eager", "triton_rows"] and seen["reps"] == 3
    recorded = RunMeta.from_json(run_dir).to_dict()["params"]["studies"]["cast_cost"]
    assert recorded == seen


def test_cli_sweep_a_failing_study_is_recorded_as_failed(tmp_path, monkeypatch):
    """A study that fails while it runs: the run folder then holds no table and its meta.json lists
    the failure; the exit code is non-zero; the other studies still run."""
    from workbench import cli as cli_module

    def broken(device="auto", progress=True, **params):
        raise RuntimeError("no-such-family: the kernel broke")

    study = studies.discover()["cast_cost"]
    monkeypatch.setitem(studies.STUDIES, "cast_cost", dataclasses.replace(study, run=broken))
    fine = studies.discover()["fp32_memory"]
    monkeypatch.setitem(studies.STUDIES, "fp32_memory",
                        dataclasses.replace(fine, run=lambda device="auto", progress=True, **p: _demo_table(),
                                            summarize=_no_figures))
    args = cli_module.build_parser().parse_args(
        ["sweep", "--direct", "--results", str(tmp_path), "--studies", "cast_cost,fp32_memory"])
    assert cli_module.COMMANDS[args.command](args) == 1
    (run_dir,) = run_folders(tmp_path)
    assert not (run_dir / "cast_cost.parquet").exists() and (run_dir / "fp32_memory.parquet").exists()
    meta = RunMeta.from_json(run_dir).to_dict()
    assert len(meta["failures"]) == 1 and meta["failures"][0].startswith("cast_cost: ")
    assert "no-such-family" in meta["failures"][0]
    page = rep.build_report(tmp_path, studies={}).index.read_text()
    assert "Studies that failed in a run:" in page and "no-such-family: the kernel broke" in page   # visible
    assert "interrupted" in page or "--resume" in page                  # and how to finish it


def test_cli_help_lists_every_study_parameter_with_its_defaults(capsys):
    code, out, err = main_in_process(capsys, "sweep", "--help")
    assert code == 0, err
    for name, study in studies.discover().items():
        assert f"{name}:" in out
        for param in study.params:
            assert f"  {param.name} (" in out


def test_notebook_parameters_cells_match_the_declarations(capsys):
    code, out, err = main_in_process(capsys, "notebooks", "--check")
    assert code == 0, out + err
    assert "0 out of step" in out
