"""The report loses nothing and trusts nothing it reads.

- ``--out DIR`` replaces only a folder the report wrote (its marker); a folder of the user's own
  files (a saved copy of a report's page among them), the results folder, a run folder, a folder
  holding run folders or holding the results folder is refused, and stays as it was;
- one malformed meta.json (a field of the wrong type, deep nesting) is listed with its reason, and
  every other run still shows;
- every value that comes from a file is HTML-escaped (no planted markup reaches the page);
- the report reads a read-only results folder; a build that cannot write (read-only folder, full
  disk, a failure at any step) ends with ReportError and leaves the previous report and every run
  folder as they were.

Everything is built from small hand-made run folders under tmp_path with fake studies: no model
runs, and the project's own results/ is never read.
"""
from __future__ import annotations

import copy
import errno
import html
import json
import os
import re
import stat
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from workbench import provenance as prov
from workbench import report as rep
from workbench.results.meta import META_NAME, MetaError, RunMeta
from workbench.results.folder import RunLock, run_in_use
from workbench.studies import Summary
from workbench.results.tables import write_study_table

PLANT = "<img src=x onerror=alert(1)>"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64          # the report never decodes a figure
SVG = b"<svg xmlns='http://www.w3.org/2000/svg'/>"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def base_meta():
    meta = RunMeta.collect({"profile": "cpu", "device": "cpu", "mode": "direct", "studies": {"demo": {}}})
    return meta.finish().to_dict()


def long_table(device: str = "cpu: test", n: int = 3, **extra) -> pd.DataFrame:
    return pd.DataFrame({"size": list(range(n)), **extra, "device": device, "metric": "t_us",
                         "value": [float(i) + 0.5 for i in range(n)], "unit": "us"})


def make_run(root: Path, name: str, meta: dict | None, tables: dict | None = None,
             meta_text: str | None = None) -> Path:
    """``root/name`` with ``meta`` (or ``meta_text`` written as is) and ``tables`` (study ->
    DataFrame, or bytes written as is)."""
    run = root / name
    run.mkdir(parents=True)
    if meta_text is not None:
        (run / META_NAME).write_text(meta_text, encoding="utf-8")
    elif meta is not None:
        (run / META_NAME).write_text(json.dumps(meta), encoding="utf-8")
    for study, t in (tables or {}).items():
        if isinstance(t, pd.DataFrame):
            write_study_table(t, run / f"{study}.parquet")
        else:
            (run / f"{study}.parquet").write_bytes(t)
    return run


def fake_study(name: str, text: str | None = None, figure: str | None = None, table=None,
               caption: str = "key numbers"):
    """A study for the report alone: its summarize writes a tiny PNG/SVG pair (no matplotlib)."""

    def summarize(df: pd.DataFrame, out_dir: Path) -> Summary:
        out_dir = Path(out_dir)
        stem = figure or f"{name}_values"
        (out_dir / f"{stem}.png").write_bytes(PNG)
        (out_dir / f"{stem}.svg").write_bytes(SVG)
        return Summary(text=text or f"{name}: {df['run'].nunique()} run(s)",
                       figures=[out_dir / f"{stem}.png"],
                       tables=[(caption, table)] if table is not None else [])

    return SimpleNamespace(name=name, question=f"what {name} shows", summarize=summarize)


STUDIES = {"demo": fake_study("demo")}


def tree(root: Path) -> dict[str, bytes | str]:
    """Everything under ``root``: {relative path: bytes, or 'dir' / 'link -> target'}."""
    out: dict[str, bytes | str] = {}
    for here, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(here) / n
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = f"link -> {os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


@pytest.fixture
def results(tmp_path, base_meta):
    """A results folder with two finished runs (one a reference run) holding demo tables."""
    root = tmp_path / "results"
    make_run(root, "20300101T000000Z-abc1234-one", base_meta, {"demo": long_table()})
    make_run(root / "reference", "20300101T000001Z-abc1234-ref", base_meta | {"device": "NVIDIA H200"},
             {"demo": long_table("cuda: NVIDIA H200")})
    return root


def row_of(page: str, run_name: str) -> str:
    import re

    rows = [r for r in re.findall(r"<tr>.*?</tr>", page, flags=re.S) if html.escape(run_name) in r]
    assert len(rows) == 1, rows
    return rows[0]


def section_runs(result) -> list[str]:
    (s,) = result.sections
    return s.runs



# --------------------------------------------------------------------------- 1. --out replaces only its own folder


def test_out_dir_of_user_files_is_refused_and_kept(results, tmp_path):
    mine = tmp_path / "my-files"
    (mine / "holiday").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (mine / "holiday" / "beach.png").write_bytes(PNG)
    before = tree(mine)
    with pytest.raises(rep.UnsafeOutDir) as e:
        rep.build_report(results, mine, studies=STUDIES)
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, rep.ReportError)
    assert str(mine) in msg and rep.REPORT_MARKER in msg and "--out" in msg
    assert tree(mine) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-files", "results"]   # no temp folder left


def cli_refusal(argv: list[str], capsys) -> str:
    """What ``python -m workbench`` says when it refuses: the exception's message (the CLI lets
    ReportError through today) or, once it turns that into a message and an exit code, stderr."""
    from workbench.__main__ import main

    try:
        rc = main(argv)
    except (ValueError, SystemExit) as e:
        return str(e)
    assert rc != 0
    return capsys.readouterr().err


def test_cli_no_sweep_out_of_user_files_leaves_them(results, tmp_path, capsys):
    mine = tmp_path / "docs"
    mine.mkdir()
    (mine / "thesis.tex").write_text("\\begin{document}")
    before = tree(mine)
    said = cli_refusal(["report", "--no-sweep", "--results", str(results), "--out", str(mine)], capsys)
    assert "refusing to write the report into" in said and str(mine) in said
    assert tree(mine) == before


def test_results_as_out_is_refused_and_every_run_stays(results, capsys):
    before = tree(results)
    with pytest.raises(rep.UnsafeOutDir, match="results folder itself"):
        rep.build_report(results, results, studies=STUDIES)
    said = cli_refusal(["report", "--no-sweep", "--results", str(results), "--out", str(results)], capsys)
    assert "results folder itself" in said
    assert tree(results) == before


def test_out_holding_the_results_folder_is_refused(results, tmp_path):
    before = tree(tmp_path)
    for out in (tmp_path, results.parent.parent):
        with pytest.raises(rep.UnsafeOutDir, match="holds the results folder"):
            rep.build_report(results, out, studies=STUDIES)
    assert tree(tmp_path) == before


def test_run_folders_and_folders_of_runs_are_refused(results, tmp_path):
    run = results / "20300101T000000Z-abc1234-one"
    before = tree(tmp_path)
    with pytest.raises(ValueError, match="run folder"):
        rep.build_report(results, run, studies=STUDIES)
    with pytest.raises(rep.UnsafeOutDir, match="inside the run folder"):
        rep.build_report(results, run / "report", studies=STUDIES)
    with pytest.raises(rep.UnsafeOutDir, match="holds no"):          # a folder of run folders: not marked
        rep.build_report(results, results / "reference", studies=STUDIES)
    tables_only = tmp_path / "elsewhere"                 # a run folder outside the results folder
    (tables_only / "by-hand").mkdir(parents=True)
    (tables_only / "by-hand" / "demo.parquet").write_bytes((run / "demo.parquet").read_bytes())
    before = tree(tmp_path)
    with pytest.raises(rep.UnsafeOutDir, match="holds no"):
        rep.build_report(results, tables_only, studies=STUDIES)
    a_file = tmp_path / "report.html"
    a_file.write_text("x")
    with pytest.raises(rep.UnsafeOutDir, match="is a file"):
        rep.build_report(results, a_file, studies=STUDIES)
    assert tree(tmp_path) == before | {"report.html": b"x"}


def test_its_own_report_is_replaced_and_marked(results):
    out = results / "report"
    rep.build_report(results, studies={"demo": fake_study("demo", text="first")})
    marker = json.loads((out / rep.REPORT_MARKER).read_text())
    assert set(marker["files"]) == {p for p, v in tree(out).items() if v != "dir"} - {rep.REPORT_MARKER}
    assert rep.check_report_dir(out, results) == "report"
    rep.build_report(results, studies={"demo": fake_study("demo", text="second")})
    page = (out / "index.html").read_text()
    assert "<p>second</p>" in page and "<p>first</p>" not in page
    assert sorted(p.name for p in results.iterdir()) == ["20300101T000000Z-abc1234-one", "reference", "report"]


def test_a_file_added_to_or_changed_in_a_report_folder_is_not_replaced(results):
    out = results / "report"
    rep.build_report(results, studies=STUDIES)
    (out / "demo" / "my-annotations.txt").write_text("keep me")
    before = tree(out)
    with pytest.raises(rep.UnsafeOutDir, match="did not write") as e:
        rep.build_report(results, studies=STUDIES)
    assert "demo/my-annotations.txt" in str(e.value)
    assert tree(out) == before
    (out / "demo" / "my-annotations.txt").unlink()
    (out / "index.html").write_text((out / "index.html").read_text() + "<!-- my edit -->")
    with pytest.raises(rep.UnsafeOutDir, match="index.html"):
        rep.build_report(results, studies=STUDIES)
    (out / "index.html").unlink()
    rep.build_report(results, studies=STUDIES)          # only what it wrote: replaced
    assert (out / "index.html").is_file()


def test_a_saved_report_page_beside_the_users_figures_is_refused_and_kept(tmp_path, results):
    """Without the marker a folder is no report folder, whatever it holds: a copy of the report's
    page (its title and all) beside the user's own figures is not replaced."""
    out = tmp_path / "report"
    (out / "demo").mkdir(parents=True)
    (out / "index.html").write_text(f"<!doctype html><html><head><title>{rep.REPORT_TITLE}</title></head></html>")
    (out / "demo" / "a.png").write_bytes(PNG)
    (out / "my-plot.svg").write_bytes(SVG)
    before = tree(out)
    with pytest.raises(rep.UnsafeOutDir, match="holds no") as e:
        rep.check_report_dir(out, results)
    assert str(out) in str(e.value) and "new or empty folder" in str(e.value)
    with pytest.raises(rep.UnsafeOutDir, match="holds no"):
        rep.build_report(results, out, studies=STUDIES)
    assert tree(out) == before
    other = tmp_path / "site"                           # someone else's index.html
    other.mkdir()
    (other / "index.html").write_text("<title>My site</title>")
    with pytest.raises(rep.UnsafeOutDir, match="holds no"):
        rep.build_report(results, other, studies=STUDIES)
    assert (other / "index.html").read_text() == "<title>My site</title>"


def test_an_empty_or_new_out_dir_is_used(results, tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        result = rep.build_report(results, out, studies=STUDIES)
        assert result.index == out / "index.html" and result.index.is_file()


def test_leftovers_of_a_killed_build_are_cleared_and_foreign_ones_kept(results):
    killed = results / ".report.building-999999-0123abcd"      # its process is gone
    killed.mkdir()
    (killed / rep.REPORT_MARKER).write_text('{"files": null}')
    (killed / "half.png").write_bytes(PNG)
    foreign = results / ".report.building-999998-deadbeef"    # the name, but not the report's
    foreign.mkdir()
    (foreign / "keep.txt").write_text("keep")
    busy = results / f".report.building-{os.getpid()}-0000aaaa"   # another build, working in it now
    busy.mkdir()
    (busy / rep.REPORT_MARKER).write_text('{"files": null}')
    unmarked = results / ".report.old"                  # a page and a figure, no marker: not the report's
    unmarked.mkdir()
    (unmarked / "index.html").write_text("<title>Workbench report</title>")
    (unmarked / "a.png").write_bytes(PNG)
    rep.build_report(results, studies=STUDIES)
    assert not killed.exists() and (unmarked / "a.png").is_file()
    assert (foreign / "keep.txt").read_text() == "keep" and (busy / rep.REPORT_MARKER).is_file()


# --------------------------------------------------------------------------- 2. malformed meta.json

BAD_META = {
    "params-int": ({"params": 3}, "params is a number (3), not an object"),
    "git-str": ({"git": "x"}, "git is a string ('x'), not an object"),
    "failures-str": ({"failures": "abc"}, "failures is a string ('abc'), not a list"),
    "resumed-int": ({"resumed": [1]}, "resumed[0] is a number (1), not an object"),
    "shard-markup": ({"params": {"shard": {"index": PLANT, "count": 2, "group": "g"}}},
                     "params.shard.index is a string"),
    "shard-range": ({"params": {"shard": {"index": 2, "count": 2, "group": "g"}}}, "0 <= I < N"),
    "shard-nogroup": ({"params": {"shard": {"index": 0, "count": 2}}}, "params.shard.group is missing"),
    "placement-list": ({"placement": []}, "placement is an array, not an object"),
    "placement-entry": ({"placement": {"demo": {"gpu": [0], "seconds": "x"}}}, "placement.demo.gpu is an array"),
    "duration-str": ({"duration_s": "x"}, "duration_s is a string ('x'), not a finite number"),
    "git-dirty": ({"git": {"sha": "a" * 40, "dirty": "yes"}}, "git.dirty is a string"),
    "studies-list": ({"params": {"studies": {"demo": [1]}}}, "params.studies.demo is an array"),
    "seconds-str": ({"study_seconds": {"demo": "fast"}}, "study_seconds.demo is a string"),
    "warnings-int": ({"warnings": [1]}, "warnings[0] is a number"),
    "started-int": ({"started_at": 5}, "started_at is a number"),
    "device-obj": ({"device": {"name": "x"}}, "device is an object"),
    "nested": ({"packages": json.loads("[" * 40 + "]" * 40)}, "nests more than"),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_run_meta_names_the_file_and_the_field(tmp_path, base_meta, case):
    bad, reason = BAD_META[case]
    run = make_run(tmp_path, "run", copy.deepcopy(base_meta) | bad)
    with pytest.raises(MetaError) as e:
        RunMeta.from_json(run)
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith(str(run / "meta.json") + ": ") and reason in str(e.value)
    assert e.value.path == run / "meta.json" and reason in e.value.line
    with pytest.raises(MetaError, match=re.escape(reason)):
        RunMeta.from_dict(copy.deepcopy(base_meta) | bad)
    with pytest.raises(FileExistsError, match="finished run"):     # a finished run stays, however broken
        RunMeta().write(run)


def test_run_meta_accepts_what_a_sweep_writes(tmp_path, base_meta):
    meta = copy.deepcopy(base_meta)
    meta["params"] |= {"shard": {"index": 1, "count": 2, "group": "g"}, "gpus": [0, 1]}
    meta |= {"failures": [], "warnings": ["w"], "study_seconds": {"demo": 1.5},
             "placement": {"demo": {"gpu": "0", "seconds": 1.5, "threads": "16"}},
             "resumed": [{"at": "2030-01-01T00:00:00Z", "studies": ["demo"], "git": "abc1234", "dirty": False,
                          "note": "n", "stages": {"demo": ["table"]}, "failures": [], "warnings": [],
                          "study_seconds": {"demo": 2}, "placement": {}, "finished_at": "2030"}]}
    assert RunMeta.from_dict(meta).to_dict() == meta
    run = make_run(tmp_path, "run", meta)
    assert RunMeta.from_json(run).to_dict() == meta


@pytest.mark.parametrize("text, reason", [
    ('{"device": ', "unreadable meta.json: not valid JSON"),
    ("[1, 2]", "it does not hold an object"),
    ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    (b"\xff\xfe{}", "unreadable meta.json"),
])
def test_run_meta_unreadable_files(tmp_path, text, reason):
    run = tmp_path / "run"
    run.mkdir()
    if isinstance(text, bytes):
        (run / "meta.json").write_bytes(text)
    else:
        (run / "meta.json").write_text(text)
    with pytest.raises(ValueError) as e:                # a MetaError is a ValueError
        RunMeta.from_json(run)
    assert isinstance(e.value, MetaError)
    assert str(e.value).startswith(str(run / "meta.json")) and reason in e.value.line


def test_run_meta_of_a_folder_without_one(tmp_path):
    with pytest.raises(MetaError, match="no such file") as e:
        RunMeta.from_json(tmp_path)
    assert str(e.value).startswith(str(tmp_path / "meta.json"))


def test_each_bad_meta_is_listed_with_its_reason_and_the_rest_still_shows(tmp_path, base_meta):
    root = tmp_path / "results"
    good = make_run(root, "20300101T000000Z-abc1234-good", base_meta, {"demo": long_table()})
    bad = {}
    for i, case in enumerate(sorted(BAD_META)):
        meta = copy.deepcopy(base_meta) | BAD_META[case][0]
        bad[case] = make_run(root, f"20300102T0000{i:02d}Z-abc1234-{case}", meta, {"demo": long_table()})
    deep = make_run(root, "20300103T000000Z-abc1234-deep", None, {"demo": long_table()},
                    meta_text='{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")

    result = rep.build_report(root, studies=STUDIES)
    by_name = {r.name: r for r in result.runs}
    assert by_name[good.name].error is None
    (section,) = result.sections
    assert section.error is None and section.runs == [good.name]       # bad runs' tables left out
    page = result.index.read_text(encoding="utf-8")
    assert "<p>demo: 1 run(s)</p>" in page
    for case, run in [*bad.items(), ("deep", deep)]:
        r = by_name[run.name]
        reason = BAD_META[case][1] if case in BAD_META else "nested too deeply"
        assert not r.tables and reason in r.error and "left out" in r.error
        assert r.error.startswith(("invalid meta.json", "unreadable meta.json"))
        assert html.escape(reason) in row_of(page, run.name)
        assert f"<li>{html.escape(run.name)}: {html.escape(r.error)}</li>" in page
    assert "unreadable" not in row_of(page, good.name) and "finished" in row_of(page, good.name)
    assert result.problems == []


# --------------------------------------------------------------------------- 3. everything from a file is escaped


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, list]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))


def test_markup_planted_everywhere_reaches_the_page_escaped(tmp_path, base_meta):
    root = tmp_path / f"results{PLANT}"
    meta = copy.deepcopy(base_meta)
    meta |= {"started_at": PLANT, "finished_at": PLANT, "device": PLANT,
             "git": {"sha": PLANT, "short": PLANT, "dirty": True},
             "params": {"profile": PLANT, "device": PLANT, "mode": PLANT, "studies": {PLANT: {}},
                        "shard": {"index": 0, "count": 1, "group": PLANT}},
             "failures": [PLANT], "warnings": [PLANT],
             "resumed": [{"at": PLANT, "studies": [PLANT], "git": PLANT, "dirty": True, "note": PLANT}],
             "placement": {PLANT: {"gpu": PLANT, "seconds": 1.0, "threads": PLANT}},
             "study_seconds": {PLANT: 1.0}}
    assert RunMeta.from_dict(meta).to_dict() == meta
    planted = make_run(root, f"20300101T000000Z-{PLANT}", meta,
                       {"demo": long_table(PLANT, label=PLANT), PLANT: b"not parquet"})
    unfinished = make_run(root, f"20300101T000001Z-{PLANT}-open", base_meta | {"finished_at": None},
                          {PLANT: long_table()})
    bad_shard = make_run(root, f"20300101T000002Z-{PLANT}-shard",
                         base_meta | {"params": {"shard": {"index": PLANT, "count": PLANT, "group": PLANT}}})
    (root / f"20300101T000003Z-{PLANT}-nometa").mkdir()
    (root / f"20300101T000003Z-{PLANT}-nometa" / "demo.parquet").write_bytes(b"x")
    for run in (planted, unfinished):
        (run / f"{PLANT}.html").write_text("notebook")   # linked from the tables column
    key_numbers = pd.DataFrame({PLANT: [PLANT, "b"], "value": [1.0, 2.5]})
    studies = {"demo": fake_study("demo", text=f"{PLANT}\n\n{PLANT} again", figure=f"fig-{PLANT}",
                                  table=key_numbers, caption=PLANT),
               PLANT: fake_study(PLANT, figure=f"{PLANT}_values")}

    result = rep.build_report(root, studies=studies)
    page = result.index.read_text(encoding="utf-8")
    assert PLANT not in page and "<img src=x" not in page
    assert html.escape(PLANT) in page
    for name in (planted.name, unfinished.name, bad_shard.name):
        assert html.escape(name) in page
    assert html.escape("params.shard.index is a string ('<img src=x onerror=alert(1)>'), not an integer") in page
    parser = _Tags()
    parser.feed(page)
    for tag, attrs in parser.tags:
        assert tag in {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "code",
                       "strong", "em", "a", "span", "table", "thead", "tbody", "tr", "th", "td", "ul",
                       "li", "figure", "img", "figcaption", "pre", "div", "details", "summary"}, tag
        for key, value in attrs:
            assert not key.startswith("on") and key in {"lang", "charset", "href", "src", "alt", "class",
                                                        "id", "title", "border", "style"}, (tag, key)
            if key in ("href", "src"):
                assert "<" not in value and ":" not in value, value   # a path, never a scheme
    srcs = [dict(a)["src"] for t, a in parser.tags if t == "img"]
    assert len(srcs) == 2
    from urllib.parse import unquote
    for src in srcs:                                   # the encoded links still find their files
        assert (result.index.parent / unquote(src)).is_file()


# --------------------------------------------------------------------------- 4. read-only results, failed writes

_READONLY: list[str] = []          # folders the audit hook below makes read-only
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITE_EVENTS = {"os.mkdir": (0,), "os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1),
                 "os.link": (1,), "os.symlink": (1,), "os.chmod": (0,), "os.truncate": (0,),
                 "os.utime": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (0, 1)}


def _readonly_hook(event: str, args: tuple) -> None:
    """Any write under a folder in _READONLY fails as on a read-only file system (EROFS): the
    simulation for a root user, whom chmod does not stop."""
    if not _READONLY:
        return
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        paths = [path] if writing else []
    elif event in _WRITE_EVENTS:
        paths = [args[i] for i in _WRITE_EVENTS[event]]
    else:
        return
    for p in paths:
        if isinstance(p, int) or p is None:
            continue
        full = os.path.abspath(os.fsdecode(p))
        if any(full == r or full.startswith(r + os.sep) for r in _READONLY):
            raise OSError(errno.EROFS, "Read-only file system", full)


sys.addaudithook(_readonly_hook)


@pytest.fixture
def readonly():
    def make(path: Path) -> None:
        _READONLY.append(os.path.abspath(path))
    yield make
    _READONLY.clear()


def test_the_simulation_blocks_writes(tmp_path, readonly):
    readonly(tmp_path)
    with pytest.raises(OSError, match="Read-only"):
        (tmp_path / "x").write_text("x")
    with pytest.raises(OSError, match="Read-only"):
        RunLock(tmp_path).acquire()
    assert not (tmp_path / "x").exists()


def test_run_in_use_reads_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert not run_in_use(run) and not (run / ".lock").exists()     # no lock file: not in use
    lock = RunLock(run)
    assert lock.acquire()
    try:
        assert run_in_use(run)
    finally:
        lock.release()
    assert not run_in_use(run)


def test_a_read_only_results_folder_is_reported(results, tmp_path, base_meta, readonly):
    open_run = make_run(results, "20300101T000002Z-abc1234-open", base_meta | {"finished_at": None},
                        {"demo": long_table()})
    held_run = make_run(results, "20300101T000003Z-abc1234-held", base_meta | {"finished_at": None})
    lock = RunLock(held_run)
    assert lock.acquire()
    try:
        before = tree(results)
        readonly(results)
        result = rep.build_report(results, tmp_path / "out", studies=STUDIES)
        page = result.index.read_text()
        assert "interrupted" in row_of(page, open_run.name) and "in progress" in row_of(page, held_run.name)
        assert section_runs(result) == ["20300101T000000Z-abc1234-one", open_run.name, "20300101T000001Z-abc1234-ref"]
        with pytest.raises(rep.ReportError) as e:         # its default out dir is inside it
            rep.build_report(results, studies=STUDIES)
        assert str(results / "report") in str(e.value) and "not writable" in str(e.value)
        assert "--out" in str(e.value) and not isinstance(e.value, ValueError)
        _READONLY.clear()
        assert tree(results) == before
    finally:
        lock.release()


def test_a_read_only_report_folder_keeps_the_previous_report(results, readonly):
    out = results / "report"
    rep.build_report(results, studies={"demo": fake_study("demo", text="old")})
    before = tree(results)
    readonly(results)
    with pytest.raises(rep.ReportError, match="Read-only file system"):
        rep.build_report(results, studies={"demo": fake_study("demo", text="new")})
    _READONLY.clear()
    assert tree(results) == before and "<p>old</p>" in (out / "index.html").read_text()


_CHMOD_SCRIPT = """
import sys
from pathlib import Path
from workbench import report as rep
results, out = Path(sys.argv[1]), Path(sys.argv[2])
page = rep.build_report(results, out, studies={}).index.read_text()
assert "finished" in page and "20300101T000000Z-abc1234-one" in page, page
try:
    rep.build_report(results, studies={})
except rep.ReportError as e:
    assert "not writable" in str(e) and str(results / "report") in str(e), e
    print("refused:", e)
else:
    sys.exit("wrote a report into a read-only folder")
"""


def _without_dac_override(read_only: Path) -> list[str] | None:
    """A command prefix that runs a process as this root user but without the capabilities that
    let root ignore file permissions (so chmod holds: ``read_only`` is not writable in it), where
    setpriv can do that; else None."""
    import shutil
    import subprocess

    setpriv = shutil.which("setpriv")
    if not setpriv:
        return None
    caps = "-dac_override,-dac_read_search,-fowner"
    prefix = [setpriv, "--bounding-set", caps, "--inh-caps", caps]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import os, sys; sys.exit(os.access(sys.argv[1], os.W_OK))",
                            str(read_only)], capture_output=True)
    return prefix if probe.returncode == 0 else None


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_chmod_read_only_results_folder(results, tmp_path):
    """The real thing: the results folder made read-only with chmod. Where chmod does not stop
    this user (root), the build runs in a process without root's permission override (setpriv);
    where neither is possible the simulated read-only tests above stand in."""
    import subprocess

    modes = {p: p.stat().st_mode for p in [results, *results.rglob("*")]}
    try:
        for p in sorted(modes, key=lambda p: -len(p.parts)):
            p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
        before = tree(results)
        if not os.access(results, os.W_OK):
            result = rep.build_report(results, tmp_path / "out", studies=STUDIES)
            assert "finished" in result.index.read_text()
            with pytest.raises(rep.ReportError, match="not writable"):
                rep.build_report(results, studies=STUDIES)
        else:
            prefix = _without_dac_override(results)
            if prefix is None:
                pytest.skip("chmod does not stop this user and setpriv cannot drop the override")
            p = subprocess.run([*prefix, sys.executable, "-c", _CHMOD_SCRIPT, str(results), str(tmp_path / "out")],
                               capture_output=True, text=True, timeout=300,
                               cwd=Path(__file__).resolve().parents[1])
            assert p.returncode == 0, p.stdout + p.stderr
            assert "refused:" in p.stdout and (tmp_path / "out" / "index.html").is_file()
        assert tree(results) == before
    finally:
        for p, m in modes.items():
            p.chmod(stat.S_IMODE(m))


def test_a_full_disk_keeps_the_previous_report(results, tmp_path, monkeypatch):
    out = tmp_path / "report"
    rep.build_report(results, out, studies={"demo": fake_study("demo", text="old")})
    before, runs = tree(tmp_path / "report"), tree(results)
    real_replace = os.replace

    def full(src, dst, *a, **k):
        if Path(dst).name == "index.html":
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(rep.ReportError, match="No space left on device") as e:
        rep.build_report(results, out, studies={"demo": fake_study("demo", text="new")})
    assert str(out) in str(e.value) and "disk space" in str(e.value)
    assert tree(out) == before and tree(results) == runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "results"]      # no temp folder left


def test_a_failed_swap_puts_the_previous_report_back(results, tmp_path, monkeypatch):
    out = tmp_path / "report"
    rep.build_report(results, out, studies={"demo": fake_study("demo", text="old")})
    before = tree(out)
    real_rename = os.rename

    def failing(src, dst, *a, **k):
        if Path(src).name.startswith(".report.building-"):
            raise OSError(errno.EIO, "Input/output error", str(src))
        return real_rename(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(rep.ReportError, match="Input/output error"):
        rep.build_report(results, out, studies={"demo": fake_study("demo", text="new")})
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "results"]


def test_when_even_the_way_back_fails_the_previous_report_is_named(results, tmp_path, monkeypatch):
    out = tmp_path / "report"
    rep.build_report(results, out, studies={"demo": fake_study("demo", text="old")})
    before = tree(out)
    real_rename = os.rename

    def failing(src, dst, *a, **k):
        if Path(src).name.startswith((".report.building-", ".report.old-")):
            raise OSError(errno.EIO, "Input/output error", str(src))
        return real_rename(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(rep.ReportError, match="could not be moved back") as e:
        rep.build_report(results, out, studies={"demo": fake_study("demo", text="new")})
    (backup,) = [p for p in tmp_path.iterdir() if p.name.startswith(".report.old-")]
    assert str(backup) in str(e.value) and tree(backup) == before       # nothing lost: it is there


def test_an_interrupted_build_keeps_the_previous_report(results, tmp_path):
    out = tmp_path / "report"
    rep.build_report(results, out, studies={"demo": fake_study("demo", text="old")})
    before = tree(out)

    def interrupted(df, out_dir):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rep.build_report(results, out, studies={"demo": SimpleNamespace(name="demo", summarize=interrupted)})
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "results"]


def test_a_run_records_the_hosts_load_at_its_start_and_end(monkeypatch):
    """A loaded host inflates every CPU timing, so the record says how loaded it was."""
    loads = iter([(3.0, 2.0, 1.0), (5.5, 2.5, 1.25)])
    monkeypatch.setattr(prov.os, "getloadavg", lambda: next(loads))
    meta = RunMeta.collect({})
    assert meta.extra["load_avg"] == {"start": [3.0, 2.0, 1.0]}
    meta.finish()
    assert meta.extra["load_avg"] == {"start": [3.0, 2.0, 1.0], "end": [5.5, 2.5, 1.25]}
    assert RunMeta.from_dict(json.loads(meta.to_json())) == meta
