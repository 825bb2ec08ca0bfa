"""The report's drawing cache (workbench.report.cache): a page built from the cache equals one drawn afresh, a
view is drawn again exactly where what it shows changed (a table's bytes, the code), a damaged entry is drawn
again and never used, a cache that cannot be written costs nothing but time, and the command's last line says
where the page is and what each stage took.

Each test draws the correctness study of one committed H200 run (a few figures) into a results folder under
tmp_path; the views are drawn in this process (SUMMARY_PROCESSES = 1) so that the draws can be counted."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench import report as rep
from workbench import studies
from workbench.report import cache as rcache
from workbench.results.tables import load_table, write_study_table

REPO = Path(__file__).resolve().parent.parent
REFERENCE_RUN = REPO / "results" / "reference" / "20261130T074611Z-2fedbe0-h200"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def results(tmp_path):
    """<tmp>/results/reference/<the H200 run> and a second run of the same table on an H100 (two devices: two
    views, each drawn on its own)."""
    root = tmp_path / "results"
    ref = root / "reference" / REFERENCE_RUN.name
    ref.mkdir(parents=True)
    for name in ("meta.json", "correctness.parquet"):
        shutil.copy(REFERENCE_RUN / name, ref / name)
    h100 = root / "20261201T000000Z-abc1234-h100"
    h100.mkdir()
    meta = json.loads((REFERENCE_RUN / "meta.json").read_text())
    meta["started_at"] = "2026-12-01T00:00:00.000Z"
    (h100 / "meta.json").write_text(json.dumps(meta))
    table = load_table(REFERENCE_RUN / "correctness.parquet")
    write_study_table(table.assign(device=H100), h100 / "correctness.parquet")
    return root


@pytest.fixture
def quick_answers(monkeypatch):
    """The answers stubbed (the advice's planner takes seconds a build); the first test keeps the real ones."""
    monkeypatch.setattr(rep, "answers_html", lambda results, csvs, studies: "<p>answers</p>")


@pytest.fixture
def draws(monkeypatch):
    """The views drawn (device, kind), counted in this process."""
    monkeypatch.setattr(rep, "SUMMARY_PROCESSES", 1)
    seen: list[tuple[str, str]] = []
    real = rep.draw_view

    def counted(study, rows, fig_dir):
        seen.append((str(rows["device"].iloc[0]), fig_dir.name.rsplit("-", 1)[1]))
        return real(study, rows, fig_dir)

    monkeypatch.setattr(rep, "draw_view", counted)
    return seen


STUDIES = {"correctness": studies.discover()["correctness"]}


def build(results: Path, out: Path, **kw) -> rep.ReportResult:
    lines: list[str] = []
    result = rep.build_report(results, out, studies=STUDIES, benchmarks={}, log=lines.append, **kw)
    result.lines = lines
    return result


def page(out: Path) -> str:
    return re.sub(r"Built [^<]*", "", (out / "index.html").read_text(encoding="utf-8"))


def files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name not in (rep.REPORT_MARKER, "index.html")}     # the page: `page`


def entries(results: Path) -> list[Path]:
    root = results.joinpath(*rcache.CACHE_DIR)
    return sorted(d for d in root.iterdir() if not d.name.startswith(".")) if root.is_dir() else []


def test_a_page_from_the_cache_equals_one_drawn_afresh(results, tmp_path, draws):
    cold = build(results, tmp_path / "cold")
    assert sorted(draws) == [(H100, "newest"), ("NVIDIA H200", "newest")] and not cold.problems
    assert any(f.endswith(".png") for f in files(tmp_path / "cold"))
    kept = entries(results)
    assert kept, "nothing kept"
    draws.clear()
    warm = build(results, tmp_path / "warm")
    assert draws == [] and any("from the cache" in line for line in warm.lines)
    assert page(tmp_path / "warm") == page(tmp_path / "cold")
    assert files(tmp_path / "warm") == files(tmp_path / "cold")       # every figure, SVG, CSV and copy
    marker = json.loads((tmp_path / "warm" / rep.REPORT_MARKER).read_text())
    assert set(marker["files"]) == set(files(tmp_path / "warm")) | {"index.html"}
    # --no-cache draws everything again, reads and writes nothing, and gives the same page
    fresh = build(results, tmp_path / "fresh", cache=False)
    assert len(draws) == 2 and page(tmp_path / "fresh") == page(tmp_path / "cold") and not fresh.problems
    assert {p: v for p, v in files(tmp_path / "fresh").items() if not p.endswith(".svg")} == \
        {p: v for p, v in files(tmp_path / "cold").items() if not p.endswith(".svg")}    # an SVG holds its date
    assert entries(results) == kept
    # the run folders are evidence: the cache lives beside them, never in them
    assert sorted(p.name for p in (results / "reference" / REFERENCE_RUN.name).iterdir()) == \
        ["correctness.parquet", "meta.json"]


def test_a_changed_table_draws_its_own_view_again_and_only_that(results, tmp_path, draws, quick_answers):
    build(results, tmp_path / "one")
    h100 = results / "20261201T000000Z-abc1234-h100" / "correctness.parquet"
    table = load_table(h100)
    table.loc[table["metric"] == "rel_err", "value"] *= 1.5             # new bytes, same shape
    h100.unlink()
    write_study_table(table, h100)
    draws.clear()
    build(results, tmp_path / "two")
    assert draws == [(H100, "newest")]
    draws.clear()
    again = build(results, tmp_path / "three", cache=False)
    assert page(tmp_path / "three") == page(tmp_path / "two") and not again.problems
    assert page(tmp_path / "two") != page(tmp_path / "one")


@pytest.mark.slow
def test_changed_code_draws_everything_again(results, tmp_path, draws, quick_answers, monkeypatch):
    build(results, tmp_path / "one")
    draws.clear()
    real = rcache.code_digest
    monkeypatch.setattr(rcache, "code_digest", lambda: real() + "an edit")
    build(results, tmp_path / "two")
    assert sorted(draws) == [(H100, "newest"), ("NVIDIA H200", "newest")]


def test_the_code_digest_covers_every_file_of_the_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "studies" / "__pycache__").mkdir(parents=True)
    (package / "studies" / "summary.py").write_text("A = 1\n")
    (package / "page.css").write_text("p {}\n")
    first = rcache.code_digest(package)
    (package / "studies" / "__pycache__" / "summary.cpython-311.pyc").write_bytes(b"compiled")
    assert rcache.code_digest(package) == first                      # compiled files are not the code
    (package / "studies" / "summary.py").write_text("A = 2\n")
    second = rcache.code_digest(package)
    assert second != first
    (package / "studies" / "other.py").write_text("")
    assert rcache.code_digest(package) not in (first, second)
    assert rcache.code_digest() == rcache.code_digest()              # the package itself: stable


@pytest.mark.slow
def test_a_damaged_entry_is_drawn_again_never_used(results, tmp_path, draws, quick_answers):
    build(results, tmp_path / "cold")
    views = [d for d in entries(results) if any((d / rcache.FILES).rglob("*.png"))]
    assert len(views) == 2
    png = next((views[0] / rcache.FILES).rglob("*.png"))
    png.write_bytes(png.read_bytes()[:-10] + b"x" * 10)              # same size, other bytes
    (views[1] / rcache.ENTRY).write_text('{"format": ')              # cut short
    draws.clear()
    build(results, tmp_path / "warm")
    assert len(draws) == 2
    assert set(files(tmp_path / "warm")) == set(files(tmp_path / "cold"))
    assert page(tmp_path / "warm") == page(tmp_path / "cold")
    draws.clear()
    build(results, tmp_path / "again")                               # the redrawn entries were kept again
    assert draws == []
    assert {p: v for p, v in files(tmp_path / "again").items() if not p.endswith(".svg")} == \
        {p: v for p, v in files(tmp_path / "cold").items() if not p.endswith(".svg")}


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_costs_only_time(results, tmp_path, draws, quick_answers):
    (results / ".cache").write_text("a file where the cache folder would go")
    first = build(results, tmp_path / "one")
    assert not first.problems and len(draws) == 2
    assert sum("could not be written" in line for line in first.lines) == 1, first.lines
    build(results, tmp_path / "two")
    assert len(draws) == 4 and page(tmp_path / "two") == page(tmp_path / "one")
    assert (results / ".cache").read_text() == "a file where the cache folder would go"


def test_the_frame_digest_tells_content_apart():
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": [0.5, np.nan]})
    d = rcache.frame_digest
    assert d(df) == d(df.copy()) == d(pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": [0.5, np.nan]}))
    assert d(df) != d(df.assign(c=[0.5, 0.25]))
    assert d(df) != d(df.assign(a=[1.0, 2.0]))                                   # the dtype
    assert d(df) != d(df[["b", "a", "c"]])                                       # the column order
    assert d(df) != d(df.rename(columns={"a": "A"}))
    assert d(df.assign(o=pd.Series([1, "1"], dtype=object))) != d(df.assign(o=pd.Series(["1", "1"], dtype=object)))
    tagged = df.copy()
    tagged.attrs["source"] = "elsewhere"
    assert d(tagged) != d(df)
    assert d(df) != d(df.iloc[::-1])                                             # the index, the order


def test_prune_keeps_the_cache_small_and_this_builds_entries(tmp_path):
    cache = rcache.DrawCache(tmp_path / "cache", salt="s")
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(b"x" * 1000)
    keys = [cache.key("entry", i) for i in range(4)]
    for i, key in enumerate(keys):                                   # used in this order, long ago
        assert cache.put(key, {"i": i}, src, ["f.bin"]) is None
        os.utime(cache.root / key / rcache.ENTRY, (1_000_000 + i, 1_000_000 + i))
    size = sum(p.stat().st_size for p in (cache.root / keys[0]).rglob("*") if p.is_file())
    (cache.root / ".tmp-999999999-0123abcd").mkdir()                 # a killed build's: no such process
    later = rcache.DrawCache(cache.root, salt="s")
    assert later.get(keys[0], tmp_path / "out") == (True, {"i": 0})    # the oldest, used by this build: kept
    later.prune(max_bytes=2 * size + size // 2)
    assert sorted(p.name for p in cache.root.iterdir()) == sorted([keys[0], keys[3]])
    assert (tmp_path / "out" / "f.bin").read_bytes() == b"x" * 1000


def test_the_last_line_says_where_the_page_is_and_what_each_stage_took(tmp_path, capsys, monkeypatch):
    from workbench.cli import main

    monkeypatch.setenv("WORKBENCH_SETUP_SECONDS", "7")
    assert main(["report", "--no-sweep", "--no-cache", "--results", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    index = tmp_path / "report" / "index.html"
    assert str(index) in last and index.is_file()
    assert re.search(r"\(set-up 7 s, no sweep \(--no-sweep\), page \d+ s\)$", last), last
    assert not (tmp_path / ".cache").exists()
