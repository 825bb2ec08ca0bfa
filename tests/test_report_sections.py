"""The report's per-study robustness and its extra sections, on tiny hand-made tables (no model runs).

- an unreadable table (truncated parquet, a broken schema) is skipped and named with its run in
  the study's section and in the Runs table, without blanking the study or failing the build;
- each study section names, one line each, the devices seen elsewhere for which it has no data;
- a table's own ``device`` column is kept; ``run``, ``reference`` and ``run_date`` are added;
- the committed norm bandwidth benchmark (``reference/*.json``) is drawn, PNG shown, SVG linked.
"""
from __future__ import annotations

import copy
import html
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from workbench import report as rep
from workbench.benchmarks.norm_bandwidth import BENCHMARK as NBW
from workbench.config import families
from workbench.results.meta import RunMeta
from workbench.results.folder import RunFolder
from workbench.studies import Study, Summary
from workbench.studies.params import ParamSpec
from workbench.studies.plotting import save_figure
from workbench.results.tables import write_study_table

REPO = Path(__file__).resolve().parent.parent
NORM_BW_JSON = REPO / "results" / "reference" / "norm_bw-h200-20261130.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def base_meta():
    return RunMeta.collect({"studies": {"demo": {}}})


def long_table(device: str, n: int = 3, metric: str = "staging_us") -> pd.DataFrame:
    return pd.DataFrame({"size": list(range(n)), "device": device, "metric": metric,
                         "value": [float(i) + 0.5 for i in range(n)], "unit": "us"})


def make_run(root: Path, meta: RunMeta, name: str, device: str, tables: dict, reference: bool = False,
             started: str | None = None) -> Path:
    """A finished run folder under ``root`` (or ``root/reference``) whose meta.json says
    ``device``; ``tables`` maps study -> DataFrame (written checked) or bytes (written as is)."""
    meta = copy.deepcopy(meta)
    meta.device = device
    if started:
        meta.started_at = started
    run_dir = RunFolder.create(root / "reference" if reference else root, name=name).path
    meta.write(run_dir)
    for study, t in tables.items():
        path = run_dir / f"{study}.parquet"
        if isinstance(t, pd.DataFrame):
            write_study_table(t, path)
        else:
            path.write_bytes(t)
    meta.finish().write(run_dir)
    return run_dir


def recording_study(name: str, seen: dict | None = None, svg: bool = True) -> Study:
    """A study whose summarize keeps the table it was given and saves one figure."""

    def summarize(table: pd.DataFrame, out_dir: Path) -> Summary:
        import matplotlib.pyplot as plt

        if seen is not None:
            seen[name] = table.copy()
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot(table["value"].to_numpy())
        if svg:
            figs = save_figure(fig, out_dir, f"{name}_values")[:1]     # PNG shown, SVG beside it
        else:
            figs = [Path(out_dir) / f"{name}_values.png"]
            fig.savefig(figs[0])
            plt.close(fig)
        return Summary(text=f"{name} finding from {table['run'].nunique()} run(s)", figures=figs)

    return Study(name=name, notebook=f"notebooks/{name}.ipynb", run=lambda **k: None,
                 summarize=summarize, params=ParamSpec(), question=f"what does {name} show")


def section(result, name):
    (s,) = [s for s in result.sections if s.name == name]
    return s


def benchmark(result, name):
    (b,) = [b for b in result.benchmarks if b.name == name]
    return b


def section_html(page: str, name: str) -> str:
    start = page.index(f'<h2 id="{name}">')
    end = page.index("<h2", start + 4)
    return page[start:end]


def row_of(page: str, run_name: str) -> str:
    """The run's row in the runs table (the key findings' table names runs too)."""
    runs = page[page.index('<h2 id="runs">'):]
    rows = [r for r in re.findall(r"<tr>.*?</tr>", runs, flags=re.S) if run_name in r]
    assert len(rows) == 1, rows
    return rows[0]


# --------------------------------------------------------------------------- unreadable tables


def test_a_truncated_parquet_is_named_and_does_not_blank_the_report(tmp_path, base_meta):
    good = make_run(tmp_path, base_meta, "good", "cpu: test", {"demo": long_table("cpu: test")})
    full = (good / "demo.parquet").read_bytes()
    bad = make_run(tmp_path, base_meta, "bad", "cpu: test", {"demo": full[: len(full) // 2]})

    result = rep.build_report(tmp_path, studies={"demo": recording_study("demo")})
    s = section(result, "demo")
    assert s.error is None and s.text == "demo finding from 1 run(s)"
    assert s.runs == [good.name] and len(s.figures) == 1
    assert len(s.table_problems) == 1
    assert s.table_problems[0].startswith(f"run {bad.name}: table unreadable: ")
    assert "unreadable parquet" in s.table_problems[0]
    assert len(result.table_problems) == 1 and bad.name in result.table_problems[0]
    assert result.problems == []                          # the CLI exit code is unaffected

    page = result.index.read_text(encoding="utf-8")
    sec = section_html(page, "demo")
    assert "<p>demo finding from 1 run(s)</p>" in sec and "<img" in sec
    assert html.escape(f"run {bad.name}: table unreadable: ") in sec
    assert "table unreadable" in row_of(page, bad.name)
    assert "unreadable" not in row_of(page, good.name)


def test_a_table_missing_the_unit_column_is_listed_with_the_column(tmp_path, base_meta):
    good = make_run(tmp_path, base_meta, "good", "cpu: test", {"demo": long_table("cpu: test")})
    bad = make_run(tmp_path, base_meta, "nounit", "cpu: test", {})
    long_table("cpu: test").drop(columns="unit").to_parquet(bad / "demo.parquet", index=False)

    result = rep.build_report(tmp_path, studies={"demo": recording_study("demo")})
    (line,) = section(result, "demo").table_problems
    assert line.startswith(f"run {bad.name}: table unreadable:") and "'unit'" in line
    assert "\n" not in line and str(bad) not in line           # one line, no long folder path
    assert section(result, "demo").runs == [good.name]
    page = result.index.read_text(encoding="utf-8")
    assert html.escape(line) in section_html(page, "demo")
    assert html.escape("'unit'") in row_of(page, bad.name)     # the reason is in the row's tooltip


def test_a_study_whose_only_table_is_unreadable_says_so(tmp_path, base_meta):
    bad = make_run(tmp_path, base_meta, "bad", "cpu: test", {"demo": b"not a parquet file"})
    called = {}
    result = rep.build_report(tmp_path, studies={"demo": recording_study("demo", seen=called)})
    s = section(result, "demo")
    assert not called and s.error is None and s.figures == []
    assert "could be read" in s.text and s.table_problems[0].startswith(f"run {bad.name}:")


# --------------------------------------------------------------------------- devices


def test_no_data_line_for_a_device_seen_only_in_another_study(tmp_path, base_meta):
    make_run(tmp_path, base_meta, "cpu", "cpu: test",
             {"alpha": long_table("cpu: test"), "beta": long_table("cpu: test")})
    make_run(tmp_path, base_meta, "gpu", "NVIDIA H200", {"alpha": long_table("cuda: NVIDIA H200")},
             reference=True)
    make_run(tmp_path, base_meta, "idle", "NVIDIA A100", {})        # no table: its meta device counts

    result = rep.build_report(tmp_path, studies={"alpha": recording_study("alpha"),
                                                 "beta": recording_study("beta")})
    assert section(result, "beta").missing_devices == ["NVIDIA A100", "cuda: NVIDIA H200"]
    assert section(result, "alpha").missing_devices == ["NVIDIA A100"]
    page = result.index.read_text(encoding="utf-8")
    beta = section_html(page, "beta")
    assert '<p class="muted">No beta data for cuda: NVIDIA H200.</p>' in beta
    assert '<p class="muted">No beta data for NVIDIA A100.</p>' in beta
    assert "No beta data for cpu: test" not in beta
    alpha = section_html(page, "alpha")
    assert "No alpha data for cuda: NVIDIA H200" not in alpha and "No alpha data for NVIDIA H200" not in alpha
    # the meta device of a run that has a table is not a separate device
    assert "NVIDIA H200." not in beta.replace("cuda: NVIDIA H200.", "")


def test_the_tables_own_device_column_is_kept(tmp_path, base_meta):
    run = make_run(tmp_path, base_meta, "gpu", "2x NVIDIA H200",
                   {"demo": long_table("cuda: NVIDIA H200")}, reference=True,
                   started="2026-11-30T04:28:27.307Z")
    seen: dict = {}
    rep.build_report(tmp_path, studies={"demo": recording_study("demo", seen=seen)})
    table = seen["demo"]
    assert set(table["device"]) == {"cuda: NVIDIA H200"}
    assert set(table["run"]) == {run.name} and table["reference"].tolist() == [True] * 3
    assert set(table["run_date"]) == {"2026-11-30"}
    assert list(table.columns[-3:]) == ["metric", "value", "unit"]       # still schema order

    runs = rep.find_runs(tmp_path)
    direct = rep.study_table("demo", runs)
    assert set(direct["device"]) == {"cuda: NVIDIA H200"}


def test_run_date_is_empty_without_a_start_time(tmp_path, base_meta):
    make_run(tmp_path, base_meta, "x", "cpu: test", {"demo": long_table("cpu: test")}, started="?")
    table = rep.study_table("demo", rep.find_runs(tmp_path))
    assert set(table["run_date"]) == {""}


# --------------------------------------------------------------------------- figures


def test_svg_is_linked_only_where_it_was_saved(tmp_path, base_meta):
    make_run(tmp_path, base_meta, "cpu", "cpu: test",
             {"withsvg": long_table("cpu: test"), "pngonly": long_table("cpu: test")})
    result = rep.build_report(tmp_path, studies={"withsvg": recording_study("withsvg"),
                                                 "pngonly": recording_study("pngonly", svg=False)})
    out = result.index.parent
    page = result.index.read_text(encoding="utf-8")
    with_svg = section_html(page, "withsvg")
    (src,) = re.findall(r'<img src="([^"]+)"', with_svg)
    (svg,) = re.findall(r'<figcaption>[^<]* · <a href="([^"]+)">SVG</a></figcaption>', with_svg)
    assert svg == str(Path(src).with_suffix(".svg").as_posix()) and (out / svg).is_file()
    assert (out / src).read_bytes()[:8] == PNG_MAGIC
    png_only = section_html(page, "pngonly")
    assert ">SVG</a>" not in png_only and "<img" in png_only
    # every figure has a caption: what it shows and which run
    (caption,) = re.findall(r"<figcaption>([^<]*)</figcaption>", png_only)
    run = result.runs[0].name
    assert caption.startswith("pngonly: values, cpu: test, from run ") and html.escape(run) in caption


# --------------------------------------------------------------------------- norm bandwidth


def test_norm_bandwidth_section_from_the_committed_json(tmp_path):
    (tmp_path / "reference").mkdir()
    shutil.copy(NORM_BW_JSON, tmp_path / "reference" / NORM_BW_JSON.name)
    (tmp_path / "reference" / "notes.json").write_text('{"benchmark": "other"}')   # ignored

    result = rep.build_report(tmp_path, studies={})
    out = result.index.parent
    page = result.index.read_text(encoding="utf-8")
    start = page.index(f">{NBW.title}</h2>")
    sec = page[start:page.index('<h2 id="runs">Runs</h2>')]
    srcs = re.findall(r'<img src="([^"]+)"', sec)
    assert len(srcs) == 2 and all(s.startswith("norm_bandwidth/") for s in srcs)
    for src in srcs:
        f = out / src
        assert f.is_file() and f.stat().st_size > 1000 and f.read_bytes()[:8] == PNG_MAGIC
        assert f'<a href="{Path(src).with_suffix(".svg").as_posix()}">SVG</a>' in sec
        assert (out / Path(src).with_suffix(".svg")).is_file()

    caps = re.findall(r"<figcaption>([^<]*) · <a", sec)          # what each figure shows, from which file
    assert len(caps) == 2 and all("NVIDIA H200" in c and NORM_BW_JSON.name in c for c in caps)
    assert any("SM-copy ceiling" in c for c in caps) and any("byte floor" in c for c in caps)

    (panel,) = benchmark(result, NBW.name).panels
    assert panel.error is None and panel.device == "NVIDIA H200" and panel.date == "2026-11-30"
    doc = json.loads(NORM_BW_JSON.read_text())
    full = [r for r in doc["results"] if r["n_valid"] is None]
    biggest = max(r["n_rows"] for r in full)
    best = max((r for r in full if r["n_rows"] == biggest), key=lambda r: r["pct_floor"])
    eager = next(r for r in full if r["n_rows"] == biggest and r["impl"] == "eager")
    assert "NVIDIA H200" in panel.text and best["impl"] in panel.text
    assert f"{best['pct_floor']:.1f}%" in panel.text and f"eager reaches {eager['pct_floor']:.1f}%" in panel.text
    assert "launch" in panel.text                                        # 4x1024 is far from the ceiling
    assert html.escape(panel.text.split("\n\n")[0]) in sec
    assert result.problems == []


def test_norm_bandwidth_bad_files_show_an_error_line(tmp_path):
    ref = tmp_path / "reference"
    ref.mkdir()
    (ref / "norm_bw-broken-20261201.json").write_text('{"benchmark": "norm_bandwidth", ')
    (ref / "norm_bw-empty-20261202.json").write_text('{"benchmark": "norm_bandwidth", "device": "X"}')
    result = rep.build_report(tmp_path, studies={})
    errors = [p.error for p in benchmark(result, NBW.name).panels]
    assert len(errors) == 2 and all(errors)
    assert "unreadable JSON" in errors[0] and "results" in errors[1]
    page = result.index.read_text(encoding="utf-8")
    for e in errors:
        assert f'<p class="problem">{html.escape(e)}</p>' in page
    assert result.problems == []


def test_no_norm_bandwidth_json_is_one_line(tmp_path):
    result = rep.build_report(tmp_path, studies={})
    assert benchmark(result, NBW.name).panels == [] and benchmark(result, NBW.name).note
    page = result.index.read_text(encoding="utf-8")
    assert "No committed norm bandwidth benchmark" in page
    assert not (result.index.parent / "norm_bandwidth").exists()


# --------------------------------------------------------------------------- newest first, folded, shareable


def naming_study(name: str = "demo", table_rows: int = 0) -> Study:
    """A study whose finding names the runs it was given and saves one figure per run (named
    ``<name>_values_<run>``, as the studies name theirs); with ``table_rows``, a key-number table."""

    def summarize(table: pd.DataFrame, out_dir: Path) -> Summary:
        import matplotlib.pyplot as plt

        figs = []
        for run, g in table.groupby("run"):
            fig, ax = plt.subplots(figsize=(2, 2))
            ax.plot(g["value"].to_numpy(), marker="o")
            figs += save_figure(fig, out_dir, f"{name}_values_{run}")[:1]
        tables = []
        if table_rows:
            tables.append(("Key numbers", pd.DataFrame({"size": range(table_rows),
                                                        "value_us": [1.5 * i for i in range(table_rows)]})))
        runs = ", ".join(sorted(table["run"].unique()))
        return Summary(text=f"{name} on {', '.join(sorted(table['device'].unique()))} from {runs}.",
                       figures=figs, tables=tables)

    return Study(name=name, notebook=f"notebooks/{name}.ipynb", run=lambda **k: None,
                 summarize=summarize, params=ParamSpec(), question=f"what does {name} show")


def verdict_table(device: str, ok: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"placement": [f"p{i}" for i in range(len(ok))], "device": device, "metric": "ok",
                         "value": ok, "unit": "bool"})


@pytest.fixture
def three_runs(tmp_path, base_meta):
    """An old and a new H200 run (reference) and a newer CPU run, each with a verdict table."""
    old = make_run(tmp_path, base_meta, "old", "NVIDIA H200", {"demo": verdict_table("NVIDIA H200", [1, 1, 0])},
                   reference=True, started="2030-01-01T00:00:00.000Z")
    new = make_run(tmp_path, base_meta, "new", "NVIDIA H200", {"demo": verdict_table("NVIDIA H200", [1, 0, 0])},
                   reference=True, started="2030-01-02T00:00:00.000Z")
    same = make_run(tmp_path, base_meta, "same", "NVIDIA H200", {"demo": verdict_table("NVIDIA H200", [1, 0, 0])},
                    reference=True, started="2030-01-01T12:00:00.000Z")
    cpu = make_run(tmp_path, base_meta, "cpu", "cpu: test", {"demo": verdict_table("cpu: test", [1, 1, 1])},
                   started="2030-01-03T00:00:00.000Z")
    return tmp_path, old, same, new, cpu


def test_newest_run_per_device_first_older_and_cpu_runs_folded(three_runs):
    root, old, same, new, cpu = three_runs
    result = rep.build_report(root, studies={"demo": naming_study()})
    s = section(result, "demo")
    assert [(v.device, v.kind, v.folded, v.runs) for v in s.views] == [
        ("NVIDIA H200", "newest", False, [new.name]),
        ("NVIDIA H200", "older", True, [same.name, old.name]),           # newest first
        ("cpu: test", "newest", True, [cpu.name])]                       # the CPU after the GPU, folded
    assert s.text == f"demo on NVIDIA H200 from {new.name}."

    page = result.index.read_text(encoding="utf-8")
    keys = page[page.index('id="key-findings"'):page.index('<h2 id="demo">')]
    assert keys.index("NVIDIA H200") < keys.index("cpu: test")           # key findings: GPU first
    assert f"demo on NVIDIA H200 from {new.name}." in keys
    assert "<details>" in keys[keys.index("cpu: test") - 80:]            # the CPU's key finding folded
    sec = section_html(page, "demo")
    open_part = sec[:sec.index("<details")]
    assert f"<p>demo on NVIDIA H200 from {new.name}.</p>" in open_part
    assert f"_values_{new.name}" in open_part                             # the newest figure shown
    for run in (old, same, cpu):                                          # the others only when unfolded
        assert f"_values_{run.name}" not in open_part and f"_values_{run.name}" in sec
    folded = re.findall(r"<details.*?</details>", sec, flags=re.S)
    assert any(f"_values_{old.name}" in d for d in folded) and any(f"_values_{cpu.name}" in d for d in folded)


def test_older_runs_are_summarized_as_verdict_changes(three_runs):
    root, old, same, new, cpu = three_runs
    result = rep.build_report(root, studies={"demo": naming_study()})
    (older,) = [v for v in section(result, "demo").views if v.kind == "older"]
    by_run = {line.split(":")[0]: line for line in older.diffs}
    assert by_run[same.name] == f"{same.name}: unchanged (3 verdicts shared with {new.name})"
    assert by_run[old.name].startswith(f"{old.name}: 1 of 3 verdicts differ from {new.name}: ")
    assert "placement=p1" in by_run[old.name] and "WRONG -> ok" not in by_run[old.name]
    assert "ok [placement=p1]: ok -> WRONG" in by_run[old.name]
    page = result.index.read_text(encoding="utf-8")
    assert html.escape(by_run[same.name]) in section_html(page, "demo")
    # and the newest against the run before it, with every value in a CSV
    (cmp,) = section(result, "demo").comparisons
    assert (cmp.newer, cmp.older) == (new.name, same.name) and "0 verdict changes" in cmp.line
    assert (result.index.parent / cmp.csv).is_file()


def test_the_newest_run_is_compared_with_an_earlier_run_that_shares_values(three_runs, base_meta):
    """A run between them that measured other cells (another tower) shares no value with the
    newest: the comparison skips it for the newest earlier run that does, and says nothing where
    none does."""
    root, old, same, new, cpu = three_runs
    other = verdict_table("NVIDIA H200", [1, 1]).assign(placement=["q0", "q1"])
    between = make_run(root, base_meta, "other-tower", "NVIDIA H200", {"demo": other}, reference=True,
                       started="2030-01-01T18:00:00.000Z")
    result = rep.build_report(root, studies={"demo": naming_study()})
    (cmp,) = section(result, "demo").comparisons
    assert (cmp.newer, cmp.older) == (new.name, same.name) and between.name not in cmp.line
    assert cmp.line.startswith(f"{new.name} against {same.name}: 3 metric values in both")
    lone = root / "lone"
    make_run(lone, base_meta, "a", "NVIDIA H200", {"demo": verdict_table("NVIDIA H200", [1])},
             started="2030-01-01T00:00:00.000Z")
    make_run(lone, base_meta, "b", "NVIDIA H200", {"demo": other}, started="2030-01-02T00:00:00.000Z")
    result = rep.build_report(lone, studies={"demo": naming_study()})
    assert section(result, "demo").comparisons == []

def test_a_csv_beside_every_table(tmp_path, base_meta):
    make_run(tmp_path, base_meta, "gpu", "NVIDIA H200", {"demo": long_table("NVIDIA H200")})
    result = rep.build_report(tmp_path, studies={"demo": naming_study(table_rows=3)})
    out = result.index.parent
    page = result.index.read_text(encoding="utf-8")
    tables = page.count("<table")
    csvs = re.findall(r'<a href="([^"/]+\.csv)">CSV', page)
    assert tables == 3 and len(csvs) == 3                        # the advice, the key numbers and the runs
    for csv in csvs:
        assert (out / csv).is_file() and (out / csv).parent == result.index.parent   # beside the page
    advice = pd.read_csv(out / csvs[0])
    assert "engine options (advise prints them whole)" in advice and len(advice) == len(families())      # a row per family
    assert page.count("per placement: no run measured it yet") == len(families())   # no table without a run
    key = pd.read_csv(out / csvs[1])
    assert key.columns.tolist() == ["size", "value_us"] and key["value_us"].tolist() == [0.0, 1.5, 3.0]
    runs = pd.read_csv(out / csvs[2])
    assert runs["run"].tolist() == [r.name for r in result.runs] and "device" in runs


def _references(page: str) -> list[tuple[str, str, str]]:
    """(tag, attribute, value) of every href and src on a page."""
    from html.parser import HTMLParser

    refs = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            refs.extend((tag, k, v) for k, v in attrs if k in ("href", "src") and v is not None)

    P().feed(page)
    return refs


def test_nothing_links_out_of_the_report_folder_and_no_script_comes_from_outside(tmp_path, base_meta):
    from urllib.parse import unquote, urlsplit

    run = make_run(tmp_path, base_meta, "gpu", "NVIDIA H200", {"demo": long_table("NVIDIA H200")})
    (run / "demo.html").write_text(
        '<html><head><script src="https://cdnjs.cloudflare.com/require.min.js"></script>'
        '<link rel="stylesheet" href="https://cdn.example/x.css"><script>var x = 1;</script></head>'
        "<body><p>executed notebook</p><img src='data:image/png;base64,AAAA'></body></html>")
    (tmp_path / "reference").mkdir(exist_ok=True)
    shutil.copy(NORM_BW_JSON, tmp_path / "reference" / NORM_BW_JSON.name)
    result = rep.build_report(tmp_path, studies={"demo": naming_study(table_rows=2)})
    out = result.index.parent.resolve()
    pages = [result.index] + sorted(out.rglob("*.html"))
    assert any(p.name == "demo.html" for p in pages)                   # the notebook's page, copied in
    for page_path in pages:
        page = page_path.read_text(encoding="utf-8")
        assert "<script" not in page.lower(), page_path                   # no script at all, so none from outside
        for tag, attr, value in _references(page):
            if value.startswith("#") or value.startswith("data:"):
                continue
            parts = urlsplit(value)
            assert not parts.scheme and not parts.netloc, (page_path, value)
            target = (page_path.parent / unquote(parts.path)).resolve()
            assert out in target.parents and target.is_file(), (page_path, value)
    main = result.index.read_text(encoding="utf-8")
    assert "executed notebook" not in main and 'href="runs/' in main
    assert "executed notebook" in (out / rep.RUNS_DIRNAME / run.name / "demo.html").read_text()


def test_the_report_discovers_benchmarks_and_names_none(tmp_path):
    from workbench import benchmarks

    source = Path(rep.__file__).read_text(encoding="utf-8")
    assert "norm_bandwidth" not in source and "norm_bw" not in source
    assert NBW.name in benchmarks.discover()

    def summarize(path, doc, out_dir):
        return benchmarks.BenchmarkPanel(source=path.name, device=doc["device"], date="2030-01-01",
                                         text=f"{doc['device']} did {doc['value']}.")

    fake = benchmarks.Benchmark(name="fake_bench", title="Fake bench", summarize=summarize, files="fake-*.json")
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "fake-1.json").write_text('{"benchmark": "fake_bench", "device": "GPU X", "value": 3}')
    (tmp_path / "reference" / "fake-2.json").write_text('{"benchmark": ')
    result = rep.build_report(tmp_path, studies={}, benchmarks={"fake_bench": fake})
    b = benchmark(result, "fake_bench")
    assert [p.source for p in b.panels] == ["fake-1.json", "fake-2.json"]
    assert b.panels[0].text == "GPU X did 3." and "unreadable JSON" in b.panels[1].error
    page = result.index.read_text(encoding="utf-8")
    assert '<h2 id="fake_bench">Fake bench</h2>' in page and "GPU X did 3." in page


def test_the_benchmark_summary_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, workbench.benchmarks as b; b.discover(); "
            "import workbench.benchmarks.norm_bandwidth.summary; assert 'torch' not in sys.modules, 'torch'")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_a_real_notebook_export_loses_its_cdn_scripts():
    """nbconvert's HTML template loads require.js and MathJax from a CDN; the copy in the report
    loads nothing from outside its folder."""
    nbconvert = pytest.importorskip("nbconvert")
    import nbformat

    body, _ = nbconvert.HTMLExporter().from_notebook_node(
        nbformat.read(str(REPO / "notebooks" / "cast_cost.ipynb"), as_version=4))
    assert re.search(r"<script[^>]*src=\"https?://", body)            # what the export holds
    out = rep.localize_html(body)
    assert "<script" not in out.lower()
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", out, flags=re.I)
    assert not re.search(r"@import|url\(\s*[\"']?(?:https?:)?//", out, flags=re.I)
    assert "cast_cost" in out                                          # the notebook itself is kept


def test_a_summary_that_says_what_its_figures_show_is_quoted_in_the_caption(tmp_path, base_meta):
    """The studies' Summary does not carry captions yet; where one does ({file name: words}), the
    report uses its words and adds the run."""
    study = naming_study()
    inner = study.summarize

    def summarize(table, out_dir):
        s = inner(table, out_dir)
        s.captions = {Path(f).name: "Values per size, one line per run" for f in s.figures}
        return s

    run = make_run(tmp_path, base_meta, "gpu", "NVIDIA H200", {"demo": long_table("NVIDIA H200")})
    result = rep.build_report(tmp_path, studies={"demo": Study(
        name="demo", notebook="notebooks/demo.ipynb", run=lambda **k: None, summarize=summarize,
        params=ParamSpec())})
    (view,) = section(result, "demo").views
    (caption,) = view.captions.values()
    assert caption.startswith(f"Values per size, one line per run, NVIDIA H200, run {run.name}")


def test_figures_of_other_runs_or_towers_are_folded_under_their_group():
    """A view whose figures fall in several groups (the towers of a per-preset study, the runs of a
    view) shows the first group's figures and folds the other groups in one fold, each under its name; key tables of
    several towers sit in one fold."""
    v = rep.View(kind="newest", device="NVIDIA H200", runs=["a", "b"],
                 figures=["s/x-one_a.png", "s/y-one_a.png", "s/x-two_b.png"],
                 groups={"s/x-one_a.png": "fam1, one: run a", "s/y-one_a.png": "fam1, one: run a",
                         "s/x-two_b.png": "fam2, two: run b"},
                 tables=[("first", pd.DataFrame({"n": [1]}), "t1.csv"),
                         ("second", pd.DataFrame({"n": [2]}), "t2.csv")])
    page = rep.view_body("s", v)
    shown = page.split("igures of")[0]
    assert "x-one_a.png" in shown and "y-one_a.png" in shown and "x-two_b.png" not in shown
    assert re.search(r'<details class="fold"><summary>Figures of 1 other group: fam2, two: run b</summary>'
                     r'<h4>fam2, two: run b \(1\)</h4>.*x-two_b\.png', page)
    assert page.index("t1.csv") > page.index("Key numbers: 2 tables")       # inside the fold
    one = rep.View(kind="newest", device="d", runs=["a"], figures=["s/x_a.png"], groups={"s/x_a.png": "run a"})
    assert "<details" not in rep.view_body("s", one)                        # one group: nothing folded


def test_a_per_preset_study_gives_a_key_finding_per_tower():
    text = "On fam1, one: right.\n\nOn fam2, two: also right."
    view = rep.View(kind="newest", device="NVIDIA H200", runs=["a", "b"], text=text)
    per = rep.StudySection(name="cast_cost", question="", runs=["a", "b"], views=[view], per_preset=True)
    whole = rep.StudySection(name="correctness", question="", runs=["a", "b"], views=[view])
    keys = rep.key_findings([per, whole])["NVIDIA H200"]
    assert [(k[0], k[2]) for k in keys] == [("cast_cost", "On fam1, one: right."),
                                            ("cast_cost", "On fam2, two: also right."),
                                            ("correctness", "On fam1, one: right.")]
    assert keys[0][1] == "" and keys[2][1]                  # a tower's paragraph names its own run


def test_a_known_problem_of_a_committed_run_is_shown_in_its_view(tmp_path, base_meta):
    """reference/errata.json notes a problem found after a run was measured (the run itself is a
    record and stays as it is): the views holding that run and study carry it; a broken errata file
    is left out without blanking the report."""
    run = make_run(tmp_path, base_meta, "h200", "NVIDIA H200", {"demo": long_table("NVIDIA H200")}, reference=True)
    other = make_run(tmp_path, base_meta, "cpu", "cpu: test", {"demo": long_table("cpu: test")})
    errata = tmp_path / "reference" / "errata.json"
    errata.write_text(json.dumps({run.name: {"demo": "its second cell is <wrong>"}, other.name: {"else": "x"}}))
    page = rep.build_report(tmp_path, studies={"demo": recording_study("demo")}).index.read_text()
    demo = section_html(page, "demo")
    assert demo.count('class="errata"') == 1 and f"{run.name}: its second cell is &lt;wrong&gt;" in demo
    errata.write_text("{not json")
    logged = []
    page = rep.build_report(tmp_path, studies={"demo": recording_study("demo")}, log=logged.append).index.read_text()
    assert 'class="errata"' not in page and "demo finding" in page
    assert any("errata.json: not used" in line for line in logged)


# --------------------------------------------------------------------------- studies side by side


def test_studies_summarized_side_by_side_give_the_serial_page_and_a_dead_process_costs_nothing(
        tmp_path, base_meta, monkeypatch):
    """The report summarizes its studies in forked processes where it has several cores: the page, its
    CSVs and figures equal a one-process build, and a study whose process dies is summarized here instead."""
    import dataclasses
    import os

    from workbench.limits import cpu_count

    if cpu_count() < 2 or not hasattr(os, "fork"):
        pytest.skip("one core, or no fork: the studies are summarized one after the other anyway")
    parent = os.getpid()
    dying = recording_study("dying")
    inner = dying.summarize

    def die_in_a_child(table, out_dir):
        if os.getpid() != parent:
            os._exit(9)                 # as a process killed for memory would: no exception, no result
        return inner(table, out_dir)

    dying = dataclasses.replace(dying, summarize=die_in_a_child)
    alpha = recording_study("alpha")

    def where_alpha_ran(table, out_dir, inner=alpha.summarize):
        with open(tmp_path / "alpha.pids", "a") as f:       # the serial build's line, then the other's
            f.write(f"{os.getpid()}\n")
        return inner(table, out_dir)

    alpha = dataclasses.replace(alpha, summarize=where_alpha_ran)
    studies = {s.name: s for s in (alpha, recording_study("beta"), dying)}
    tables = {name: long_table("cpu: test", n=4 + i) for i, name in enumerate(studies)}
    make_run(tmp_path, base_meta, "one", "cpu: test", tables)

    def build(out: str, processes: int):
        monkeypatch.setattr(rep, "SUMMARY_PROCESSES", processes)
        return rep.build_report(tmp_path, out_dir=tmp_path / out, studies=studies, benchmarks={}, log=lambda m: None)

    serial, side = build("serial", 1), build("side", 8)
    assert [s.name for s in side.sections] == ["alpha", "beta", "dying"] and not side.problems
    ran = [int(pid) for pid in (tmp_path / "alpha.pids").read_text().split()]
    assert len(ran) == 2 and ran[0] == parent != ran[1], ran      # the side-by-side build did fork
    assert section(side, "dying").text == "dying finding from 1 run(s)"
    page = lambda r: re.sub(r"Built [^<]*", "", r.index.read_text(encoding="utf-8"))  # noqa: E731
    assert page(side) == page(serial)
    files = lambda d: sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())  # noqa: E731
    assert files(tmp_path / "side") == files(tmp_path / "serial")
    for rel in files(tmp_path / "serial"):
        if rel.endswith((".csv", ".png")):
            assert (tmp_path / "side" / rel).read_bytes() == (tmp_path / "serial" / rel).read_bytes(), rel
