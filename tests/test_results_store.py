"""The results store (`workbench.results`) owns the run folders: every reader asks it, and what it refuses it refuses
once for all of them. A table of someone else's format, a saved audit of the wrong shape, a link or a FIFO in a run
folder: listed with the reason and left out, while the page, the advice and compare go on with the rest."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from workbench import results as store
from workbench.audit import load_newest, saved_problem
from workbench.results import META_NAME, RunFolder, RunMeta

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "results" / "reference"
# two committed GPU runs of encoder_latency, one preset each (copied, never touched in place)
RUN_A = "20261205T155432Z-47bc1f8-h200-fa4-race-mistral-small-3.1-24b"
RUN_B = "20261205T155558Z-47bc1f8-h200-fa4-race-kimi-k2.5-1t"


def _copy_runs(tmp_path: Path, *names: str) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    for n in names:
        shutil.copytree(REFERENCE / n, results / n)
    return results


def _drop_column(run: Path, study: str, column: str) -> None:
    path = run / f"{study}.parquet"
    pd.read_parquet(path).drop(columns=[column]).to_parquet(path, index=False)


def test_a_table_without_a_column_its_study_reads_is_listed_and_the_rest_still_load(tmp_path):
    from workbench.studies import discover
    results = _copy_runs(tmp_path, RUN_A, RUN_B)
    _drop_column(results / RUN_B, "encoder_latency", "preset")
    runs = store.find_runs(results)
    studies = discover()
    loaded, problems = store.load_tables(runs, ["encoder_latency"],
                                         required={n: s.columns for n, s in studies.items()})
    assert set(loaded) == {(RUN_A, "encoder_latency")}
    (p,) = problems
    assert p.run == RUN_B and "lacks the column(s) ['preset']" in p.line
    # without the requirement the table loads (the store checks what its caller needs, nothing invented)
    assert len(store.load_tables(runs, ["encoder_latency"])[0]) == 2


def test_advice_passes_over_a_table_that_lacks_a_column_and_uses_an_older_run(tmp_path):
    from workbench.advise import study_rows
    results = _copy_runs(tmp_path, RUN_B)
    newer = results / RUN_B.replace("20261205T155558Z", "20261206T000000Z")
    shutil.copytree(results / RUN_B, newer)
    _drop_column(newer, "encoder_latency", "images")
    rows, run = study_rows(results, "encoder_latency", "preset", "kimi-k2.5-1t")
    assert run == results / RUN_B and len(rows) and "images" in rows


@pytest.mark.slow
def test_the_page_shows_the_good_run_and_names_the_bad_table(tmp_path):
    from workbench.report import build_report
    results = _copy_runs(tmp_path, RUN_A, RUN_B)
    _drop_column(results / RUN_B, "encoder_latency", "preset")
    result = build_report(results, tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "lacks the column(s) [&#x27;preset&#x27;]" in page or "lacks the column(s) ['preset']" in page
    section = next(s for s in result.sections if s.name == "encoder_latency")
    assert not section.error and "mistral-small-3.1-24b" in page


@pytest.mark.parametrize("data, why", [
    ({"engine": "vllm", "version": "9.9", "source": "x", "models": "not a list"}, "'models' is str"),
    ({"engine": "vllm", "version": "9.9", "source": "x", "models": [{"model": ["A"]}]}, "models[0].model is list"),
    ({"engine": "vllm", "version": "9.9", "source": "x",
      "models": [{"model": "A", "file": "a.py", "device_norm": True, "encoder_graphs": True, "verdict": "ok",
                  "norm_in": [["outer"]]}]}, "models[0].norm_in is list, not a list of strings"),
    ([1, 2], "not an object"),
])
def test_a_saved_audit_of_the_wrong_shape_is_passed_over_with_its_reason(tmp_path, data, why):
    results = tmp_path / "results"
    (results / "reference" / "audits").mkdir(parents=True)
    shutil.copy(REFERENCE / "audits" / "vllm-0.34.0.json", results / "reference" / "audits")
    (results / "audits").mkdir()
    (results / "audits" / "vllm-9.9.json").write_text(json.dumps(data))
    assert why in (saved_problem(data) or "")
    skipped: list[str] = []
    got = load_newest(results, skipped)
    assert got["version"] == "0.34.0"
    assert len(skipped) == 1 and skipped[0].startswith("vllm-9.9.json: ") and why in skipped[0]


def test_absurdly_nested_audit_json_is_passed_over_not_a_crash(tmp_path):
    results = tmp_path / "results"
    (results / "audits").mkdir(parents=True)
    (results / "audits" / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    skipped: list[str] = []
    assert load_newest(results, skipped) is None and "unreadable" in skipped[0]


def test_links_and_fifos_in_a_run_folder_are_never_read(tmp_path):
    results = _copy_runs(tmp_path, RUN_A)
    run = results / RUN_A
    outside = tmp_path / "elsewhere.parquet"
    shutil.move(run / "encoder_latency.parquet", outside)
    os.symlink(outside, run / "encoder_latency.parquet")
    assert store.table_file(run, "encoder_latency") is None and store.read_table(run, "encoder_latency") is None
    assert store.newest_rows(results, "encoder_latency", "preset", "mistral-small-3.1-24b") == (None, None)
    os.unlink(run / "encoder_latency.parquet")
    os.mkfifo(run / "encoder_latency.parquet")
    assert store.read_table(run, "encoder_latency") is None         # returns at once: a FIFO is not opened
    (problem,) = store.load_tables(store.find_runs(results), ["encoder_latency"])[1] or [None]
    assert problem is None or "FIFO" in problem.line
    # a linked meta.json makes no run folder for the queries
    os.unlink(run / "encoder_latency.parquet")
    shutil.move(run / META_NAME, tmp_path / META_NAME)
    os.symlink(tmp_path / META_NAME, run / META_NAME)
    assert store.run_folders(results) == []


def test_an_oversized_or_malformed_meta_json_is_refused_by_the_one_reader(tmp_path):
    run = RunFolder.create(tmp_path / "results", name="x")
    (run.path / META_NAME).write_bytes(b"{" + b" " * (17 << 20) + b"}")
    with pytest.raises(store.MetaError, match="larger than"):
        run.meta()
    (run.path / META_NAME).write_text('{"params": {"studies": 3}}')
    with pytest.raises(store.MetaError, match="params.studies is a number"):
        run.meta()
    assert list(store.timings([tmp_path / "results"], "cpu")) == []     # counted as nothing, not a crash


def test_a_finished_table_is_never_replaced_and_two_writers_never_share_a_folder(tmp_path):
    run = RunFolder.create(tmp_path / "results", name="x")
    table = pd.DataFrame({"device": ["cpu"], "metric": ["m"], "value": [1.0], "unit": ["ms"]})
    run.write_table("s", table)
    with pytest.raises(FileExistsError):
        run.write_table("s", table.assign(value=2.0))
    assert store.read_table(run.path, "s").value.iloc[0] == 1.0
    first, second = run.lock(), run.lock()
    assert first.acquire() and not second.acquire()
    first.release()
    assert second.acquire()
    second.release(remove=True)


def test_save_table_writes_a_record_once_and_leaves_a_sweeps_record_alone(tmp_path):
    table = pd.DataFrame({"device": ["cpu"], "metric": ["m"], "value": [1.0], "unit": ["ms"]})
    path = store.save_table("s", table, results_root=tmp_path / "results")
    meta = RunMeta.from_json(path.parent)
    assert meta.params["mode"] == "interactive" and meta.finished_at
    sweep = RunFolder.create(tmp_path / "results", name="sweep")
    RunMeta.collect({"mode": "direct", "studies": {"s": {}}}).write(sweep.path)
    before = (sweep.path / META_NAME).read_bytes()
    store.save_table("s", table, sweep.path, params={"a": 1})
    assert (sweep.path / META_NAME).read_bytes() == before


def test_resolve_run_names_what_it_tried(tmp_path):
    results = _copy_runs(tmp_path, RUN_A)
    assert store.resolve_run(RUN_A, results) == results / RUN_A
    assert store.resolve_run("latest", results) == results / RUN_A
    with pytest.raises(store.RunNotFound, match="tried"):
        store.resolve_run("nope", results)
