"""workbench.compare and `python -m workbench compare`: every metric both runs hold, joined on the
parameter columns, with the ratio; timings flagged only beyond both runs' own spread; verdict
changes flagged. On small synthetic run folders and on two committed reference runs."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from workbench import cli
from workbench.compare import (CompareError, column_lines, compare_runs, compare_tables, resolve_run, spread_names,
                               summary_line)
from workbench.results.tables import write_study_table

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "results"


def run_folder(root: Path, name: str, started: str, rows: list[tuple], device: str = "NVIDIA H200") -> Path:
    """A run folder with meta.json and one 'lat' table: rows of (tokens, path, metric, value, unit)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"started_at": started}))
    t = pd.DataFrame(rows, columns=["tokens", "path", "metric", "value", "unit"])
    t.insert(2, "device", device)
    write_study_table(t, d / "lat.parquet")
    return d


@pytest.fixture
def two_runs(tmp_path):
    a = run_folder(tmp_path, "run-a", "2030-01-01T00:00:00Z", [
        (64, "graph", "p50_ms", 10.0, "ms"), (64, "graph", "p90_ms", 11.0, "ms"),      # moves past it
        (256, "graph", "p50_ms", 10.0, "ms"), (256, "graph", "p90_ms", 12.0, "ms"),    # within the spread
        (64, "eager", "p50_ms", 5.0, "ms"),                                            # no spread: not judged
        (64, "graph", "ok", 1.0, "bool"), (256, "graph", "ok", 1.0, "bool"),
        (64, "graph", "only_in_a", 1.0, "x")])
    b = run_folder(tmp_path, "run-b", "2030-01-02T00:00:00Z", [
        (64, "graph", "p50_ms", 15.0, "ms"), (64, "graph", "p90_ms", 16.0, "ms"),
        (256, "graph", "p50_ms", 11.0, "ms"), (256, "graph", "p90_ms", 12.5, "ms"),
        (64, "eager", "p50_ms", 50.0, "ms"),
        (64, "graph", "ok", 0.0, "bool"), (256, "graph", "ok", 1.0, "bool"),
        (1024, "graph", "p50_ms", 99.0, "ms")], device="NVIDIA H100")                # another cell
    return tmp_path, a, b


def row(df, tokens, path, metric):
    (r,) = df[(df["tokens"] == str(tokens)) & (df["path"] == path) & (df["metric"] == metric)].to_dict("records")
    return r


def test_every_shared_metric_with_its_ratio_and_flags(two_runs):
    root, a, b = two_runs
    df = compare_runs("run-a", "run-b", results=root)
    assert set(df["metric"]) == {"p50_ms", "p90_ms", "ok"}                 # only_in_a and 1024 left out
    assert len(df) == 7 and set(df["study"]) == {"lat"}
    assert list(df.columns[-6:]) == ["metric", "unit", "a", "b", "ratio", "flag"]
    assert "device" not in df.columns                                       # two devices, the same cells
    r = row(df, 64, "graph", "p50_ms")
    assert (r["a"], r["b"], r["ratio"], r["flag"]) == (10.0, 15.0, 1.5, "slower beyond spread")
    assert row(df, 256, "graph", "p50_ms")["flag"] == ""                   # 11 lies inside [10, 12]
    assert row(df, 64, "eager", "p50_ms")["flag"] == ""                    # 10x, but no spread to judge by
    assert row(df, 64, "graph", "ok")["flag"] == "verdict changed: ok -> WRONG"
    assert row(df, 256, "graph", "ok")["flag"] == ""
    assert summary_line(df) == ("7 metric values in both; 1 timing change beyond the runs' p10-p90 spread; "
                                "1 verdict change")
    back = compare_runs(b, a, results=root)                                 # folders work too
    assert row(back, 64, "graph", "p50_ms")["flag"] == "faster beyond spread"
    assert row(back, 64, "graph", "ok")["flag"] == "verdict changed: WRONG -> ok"


def test_p10_is_used_where_a_table_has_it(tmp_path):
    rows_a = [(64, "g", "staging_us", 10.0, "us"), (64, "g", "staging_p10_us", 9.0, "us"),
              (64, "g", "staging_p90_us", 11.0, "us")]
    rows_b = [(64, "g", "staging_us", 9.5, "us"), (64, "g", "staging_p10_us", 7.0, "us"),
              (64, "g", "staging_p90_us", 8.9, "us")]                # p90 8.9 < a's p10 9.0: faster
    run_folder(tmp_path, "a", "2030", rows_a)
    run_folder(tmp_path, "b", "2031", rows_b)
    df = compare_runs("a", "b", results=tmp_path)
    assert row(df, 64, "g", "staging_us")["flag"] == "faster beyond spread"
    assert spread_names("p50_ms") == ("p10_ms", "p90_ms")
    assert spread_names("staging_us") == ("staging_p10_us", "staging_p90_us")
    assert spread_names("staging_p90_us") is None and spread_names("bytes") is None


def test_latest_and_unknown_runs(two_runs):
    root, a, b = two_runs
    assert resolve_run("latest", root) == b
    (root / "reference").mkdir()
    newer = run_folder(root / "reference", "ref-c", "2030-01-03T00:00:00Z", [(64, "graph", "ok", 1.0, "bool")])
    assert resolve_run("latest", root) == newer and resolve_run("ref-c", root) == newer
    with pytest.raises(CompareError, match="no run folder with tables named 'nope'"):
        resolve_run("nope", root)


def test_cli_compare(two_runs, capsys):
    root, a, b = two_runs
    out_csv = root / "all.csv"
    assert cli.main(["compare", "run-a", "run-b", "--results", str(root), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "lat: 7 metric values in both; 1 timing change" in text
    assert "slower beyond spread" in text and "verdict changed: ok -> WRONG" in text
    assert len(pd.read_csv(out_csv)) == 7
    with pytest.raises(SystemExit, match="compare: no run folder with tables named 'zzz'"):
        cli.main(["compare", "run-a", "zzz", "--results", str(root)])


def test_runs_with_other_attention_backends_compare_cell_by_cell_and_say_so(tmp_path, capsys):
    """FlashAttention-4 against torch's flash: the attention column is not part of a cell, and the summary
    names each run's backend (an older run that recorded none says so)."""
    rows = [(64, "graph", "p50_ms", 10.0, "ms"), (64, "graph", "p90_ms", 10.5, "ms")]
    a = run_folder(tmp_path, "varlen", "2030-01-01T00:00:00Z", rows)
    b = run_folder(tmp_path, "fa4", "2030-01-02T00:00:00Z", [(t, p, m, v / 2, u) for t, p, m, v, u in rows])
    old = run_folder(tmp_path, "old", "2029-01-01T00:00:00Z", rows)
    for run, backend in ((a, "varlen"), (b, "fa4")):
        t = pd.read_parquet(run / "lat.parquet").assign(attention=backend)
        (run / "lat.parquet").unlink()
        write_study_table(t[["tokens", "path", "device", "attention", "metric", "value", "unit"]], run / "lat.parquet")
    df = compare_runs("varlen", "fa4", results=tmp_path)
    assert "attention" not in df.columns and len(df) == 2
    assert row(df, 64, "graph", "p50_ms")["flag"] == "faster beyond spread"
    assert cli.main(["compare", "varlen", "fa4", "--results", str(tmp_path)]) == 0
    assert "; attention a: varlen, b: fa4" in capsys.readouterr().out
    assert cli.main(["compare", "old", "fa4", "--results", str(tmp_path)]) == 0
    assert "; attention a: not recorded, b: fa4" in capsys.readouterr().out
    assert cli.main(["compare", "fa4", "fa4", "--results", str(tmp_path)]) == 0
    assert "; attention a:" not in capsys.readouterr().out
    assert old.exists()


def test_runs_with_other_mlp_gemms_compare_cell_by_cell_and_say_so(tmp_path, capsys):
    """quack's gated GEMM against cuBLAS: the gemm column is not part of a cell either, and the summary names
    each run's MLP GEMM where they differ (not the attention, which both share)."""
    rows = [(64, "graph", "p50_ms", 10.0, "ms"), (64, "graph", "p90_ms", 10.5, "ms")]
    for name, gemm, scale in (("cublas", "cublas", 1.0), ("quack", "quack", 0.9)):
        run = run_folder(tmp_path, name, f"2030-01-0{1 + (gemm == 'quack')}T00:00:00Z",
                         [(t, p, m, v * scale, u) for t, p, m, v, u in rows])
        t = pd.read_parquet(run / "lat.parquet").assign(attention="fa4", gemm=gemm)
        (run / "lat.parquet").unlink()
        write_study_table(t[["tokens", "path", "device", "attention", "gemm", "metric", "value", "unit"]],
                          run / "lat.parquet")
    df = compare_runs("cublas", "quack", results=tmp_path)
    assert "gemm" not in df.columns and len(df) == 2
    assert cli.main(["compare", "cublas", "quack", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "; MLP gemm a: cublas, b: quack" in out and "attention a:" not in out


def test_two_committed_reference_runs():
    """The correctness table of 20261130T143728Z equals 20261130T133302Z's value for value
    (results/reference/README.md): every shared value has ratio 1 (or no ratio at 0) and no flag."""
    a, b = "20261130T133302Z-9712f8c-h200x2", "20261130T143728Z-2d2877b-h200"
    df = compare_runs(a, b, results=REFERENCE)
    corr = df[df["study"] == "correctness"]
    assert len(corr) == 876
    same = (corr["a"] == corr["b"]) | (corr["a"].isna() & corr["b"].isna())     # NaN: a cell not measured
    assert same.all() and (corr["flag"] == "").all()
    lat = df[df["study"] == "encoder_latency"]
    assert len(lat) > 0 and set(lat["preset"]) == {"qwen2-vl-7b", "qwen2.5-vl-7b"}
    assert not lat["flag"].str.startswith("verdict").any()
    flagged = lat[lat["flag"] != ""]
    assert set(flagged["flag"]) <= {"slower beyond spread", "faster beyond spread"}
    assert set(flagged["unit"]) == {"ms"}


# --------------------------------------------------------------------------- unlike things (issue 64, item 6)

def custom_run(root: Path, name: str, table: pd.DataFrame, study: str = "lat") -> Path:
    """A run folder holding ``table`` (checked) as its ``study`` table."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "meta.json").write_text(json.dumps({"started_at": name}))
    write_study_table(table, d / f"{study}.parquet")
    return d


def frame(rows: list[tuple], columns: list[str]) -> pd.DataFrame:
    t = pd.DataFrame(rows, columns=columns + ["metric", "value", "unit"])
    t.insert(len(columns), "device", "GPU")
    return t


def test_a_metric_whose_unit_differs_is_not_comparable_and_never_ratioed(tmp_path, capsys):
    custom_run(tmp_path, "a", frame([(64, "p50_ms", 10.0, "ms"), (64, "p90_ms", 11.0, "ms"),
                                     (64, "bytes", 5.0, "MB"), (64, "ok", 1.0, "bool")], ["tokens"]))
    custom_run(tmp_path, "b", frame([(64, "p50_ms", 10.0, "s"), (64, "p90_ms", 11.0, "ms"),
                                     (64, "bytes", 5000.0, "kB"), (64, "ok", 0.0, "count")], ["tokens"]))
    df = compare_runs("a", "b", results=tmp_path)
    unlike = df[df["metric"].isin(["p50_ms", "bytes", "ok"])].set_index("metric")
    assert unlike["ratio"].isna().all()                                   # never a ratio across units
    assert unlike.loc["bytes", "flag"] == "not comparable: unit MB in a, kB in b"
    assert unlike.loc["p50_ms", "flag"] == "not comparable: unit ms in a, s in b"   # no spread judged either
    assert unlike.loc["ok", "flag"] == "not comparable: unit bool in a, count in b"  # nor a verdict change
    assert unlike.loc["bytes", "unit"] == "MB (a), kB (b)"
    same = df[df["metric"] == "p90_ms"].iloc[0]
    assert (same["ratio"], same["flag"], same["unit"]) == (1.0, "", "ms")
    line = summary_line(df)
    assert "3 not comparable, never ratioed (units differ: " in line
    assert "bytes: MB (a), kB (b)" in line and "p50_ms: ms (a), s (b)" in line and "0 verdict changes" in line
    out_csv = tmp_path / "all.csv"
    assert cli.main(["compare", "a", "b", "--results", str(tmp_path), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "not comparable: unit MB in a, kB in b" in text and "3 not comparable" in text   # shown unasked
    back = pd.read_csv(out_csv).set_index("metric")
    assert back.loc["bytes", "flag"] == "not comparable: unit MB in a, kB in b" and pd.isna(back.loc["bytes", "ratio"])


@pytest.mark.parametrize("side", ["a", "b"])
def test_a_parameter_column_one_run_lacks_never_collapses_rows(tmp_path, capsys, side):
    """b (or a) records ``mix`` (two values per cell), the other does not: every row of the run that has it is
    kept, matched with the other run's cell on the common columns, its value in a column naming that run, and
    the difference is said: which column, which run lacks it, the values the other has."""
    plain = frame([(64, "graph", "p50_ms", 10.0, "ms"), (256, "graph", "p50_ms", 20.0, "ms")], ["tokens", "path"])
    mixed = frame([(64, "graph", "docs", "p50_ms", 11.0, "ms"), (64, "graph", "photos", "p50_ms", 30.0, "ms"),
                   (256, "graph", "docs", "p50_ms", 21.0, "ms")], ["tokens", "path", "mix"])
    other = "a" if side == "b" else "b"
    custom_run(tmp_path, side, mixed)
    custom_run(tmp_path, other, plain)
    df = compare_runs("a", "b", results=tmp_path)
    label = f"mix ({side} only)"
    assert len(df) == 3 and label in df.columns and "mix" not in df.columns      # nothing collapsed
    assert sorted(zip(df["tokens"], df[label])) == [("256", "docs"), ("64", "docs"), ("64", "photos")]
    mixed_vals = dict(zip(df[label] + df["tokens"], df[side]))
    assert mixed_vals == {"docs64": 11.0, "photos64": 30.0, "docs256": 21.0}
    assert set(df[df["tokens"] == "64"][other]) == {10.0}                         # the plain cell, each time
    (d,) = df.attrs["columns_differ"]["lat"]
    assert (d["column"], d["has"], d["lacks"], d["values"]) == ("mix", side, other, "'docs', 'photos'")
    assert cli.main(["compare", "a", "b", "--results", str(tmp_path), "--all"]) == 0
    out = capsys.readouterr().out
    assert (f"lat: parameter column 'mix' is in {side} only ({side}'s values: 'docs', 'photos'); {other} lacks it, "
            "so rows are matched on the common columns only (tokens, path)") in out
    assert "3 metric values in both" in out and "photos" in out


def test_parameter_columns_on_both_sides_and_a_column_without_values(tmp_path):
    """a records ``x``, b records ``y``: each a row meets each b row of its cell (both columns kept); a column
    a table holds with no value in any row (the report's concatenated tables) is one it lacks."""
    a = frame([(1, "u", "m", 1.0, "ms"), (1, "v", "m", 2.0, "ms")], ["tokens", "x"]).assign(y=None)
    b = frame([(1, "p", "m", 4.0, "ms"), (1, "q", "m", 8.0, "ms")], ["tokens", "y"])
    df = compare_tables(a[["tokens", "x", "y", "device", "metric", "value", "unit"]], b, study="s")
    assert len(df) == 4 and {"x (a only)", "y (b only)"} <= set(df.columns)
    assert sorted(df["ratio"]) == [2.0, 4.0, 4.0, 8.0]                 # b over a, every pair
    assert [d["column"] for d in df.attrs["columns_differ"]] == ["x", "y"]
    assert column_lines(df.attrs["columns_differ"])[1].startswith(
        "parameter column 'y' is in b only (b's values: 'p', 'q'); a lacks it")
    same = compare_tables(b, b, study="s")                       # the same columns: nothing to say
    assert same.attrs["columns_differ"] == [] and len(same) == 2


def test_a_match_too_loose_to_pair_is_refused(tmp_path, monkeypatch):
    from workbench import compare

    monkeypatch.setattr(compare, "MAX_PAIRS", 3)
    custom_run(tmp_path, "a", frame([(1, i, "m", 1.0, "ms") for i in range(2)], ["tokens", "x"]))
    custom_run(tmp_path, "b", frame([(1, i, "m", 1.0, "ms") for i in range(2)], ["tokens", "y"]))
    with pytest.raises(SystemExit, match=r"compare: lat: the parameter columns differ \(x in a only; y in b "
                                         r"only\) and matching on the common ones \(tokens\) would pair 4 rows"):
        cli.main(["compare", "a", "b", "--results", str(tmp_path)])


def test_a_spread_in_another_unit_is_no_spread(tmp_path):
    custom_run(tmp_path, "a", frame([(1, "p50_ms", 10.0, "ms"), (1, "p90_ms", 11.0, "ms")], ["tokens"]))
    custom_run(tmp_path, "b", frame([(1, "p50_ms", 15.0, "ms"), (1, "p90_ms", 0.016, "s")], ["tokens"]))
    df = compare_runs("a", "b", results=tmp_path).set_index("metric")
    assert df.loc["p50_ms", "flag"] == "slower beyond spread"        # judged by a's p90 alone (b's is in s)
    assert df.loc["p90_ms", "flag"].startswith("not comparable")


def _parquet(df: pd.DataFrame) -> bytes:
    import io
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


GOOD = {"tokens": [1], "device": ["GPU"], "metric": ["m"], "value": [1.0], "unit": ["ms"]}
BAD_TABLES = {
    "not parquet": (b"PAR1 this is not a parquet file", "unreadable parquet"),
    "empty file": (b"", "unreadable parquet"),
    "truncated": (_parquet(pd.DataFrame(GOOD))[:-9], "unreadable parquet"),
    "no metric": (_parquet(pd.DataFrame(GOOD).drop(columns="metric")), "missing column(s) ['metric']"),
    "no value": (_parquet(pd.DataFrame(GOOD).drop(columns="value")), "missing column(s) ['value']"),
    "no unit": (_parquet(pd.DataFrame(GOOD).drop(columns="unit")), "missing column(s) ['unit']"),
    "numeric metric": (_parquet(pd.DataFrame(GOOD | {"metric": [7]})),
                       "column 'metric' holds int64 values (first: '7'), not text"),
    "numeric unit": (_parquet(pd.DataFrame(GOOD | {"unit": [1.5]})), "column 'unit' holds float64 values"),
    "date value": (_parquet(pd.DataFrame(GOOD | {"value": pd.to_datetime(["2030-01-01"])})),
                   "column 'value' holds datetime64"),
    "list parameter": (_parquet(pd.DataFrame(GOOD | {"tokens": [[1, 2]]})), "parameter column 'tokens' holds"),
    "dict parameter": (_parquet(pd.DataFrame(GOOD | {"tokens": [{"k": 1}]})), "parameter column 'tokens' holds"),
    "no rows": (_parquet(pd.DataFrame(GOOD).iloc[:0]), "no rows"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_a_table_that_cannot_be_read_is_an_error_naming_the_file_and_what_is_wrong(tmp_path, case):
    data, why = BAD_TABLES[case]
    custom_run(tmp_path, "a", frame([(1, "m", 1.0, "ms")], ["tokens"]))
    custom_run(tmp_path, "a", frame([(1, "m", 1.0, "ms")], ["tokens"]), study="other")
    b = custom_run(tmp_path, "b", frame([(1, "m", 1.0, "ms")], ["tokens"]), study="other")
    (b / "lat.parquet").write_bytes(data)
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "a", "b", "--results", str(tmp_path)])
    msg = str(e.value.code)
    assert msg.startswith(f"compare: cannot compare the table {b / 'lat.parquet'}: "), msg
    assert why in msg and msg.endswith("; compare the other studies with --studies other"), msg
    assert cli.main(["compare", "a", "b", "--results", str(tmp_path), "--studies", "other"]) == 0


def test_a_corrupt_table_gives_no_traceback_from_the_command(tmp_path):
    import os
    import subprocess
    import sys

    custom_run(tmp_path, "a", frame([(1, "m", 1.0, "ms")], ["tokens"]))
    b = custom_run(tmp_path, "b", frame([(1, "m", 1.0, "ms")], ["tokens"]))
    (b / "lat.parquet").write_bytes(_parquet(pd.DataFrame(GOOD | {"tokens": [[1, 2]]})))
    p = subprocess.run([sys.executable, "-m", "workbench", "compare", "a", "b", "--results", str(tmp_path)],
                       capture_output=True, text=True, cwd=REPO, env=os.environ | {"PYTHONPATH": str(REPO)},
                       timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"compare: cannot compare the table {b / 'lat.parquet'}: parameter column 'tokens' holds" in p.stderr


def test_a_metric_of_text_values_is_left_out_and_named_not_an_error(tmp_path, capsys):
    """A value column of text ("fast", or "2.0", which the table checker would parse) is no measurement to ratio:
    compare leaves that metric out and says so, and compares the rest (issue 64)."""
    custom_run(tmp_path, "a", frame([(1, "m", 1.0, "ms")], ["tokens"]))
    b = custom_run(tmp_path, "b", frame([(1, "m", 1.0, "ms")], ["tokens"]))
    (b / "lat.parquet").write_bytes(_parquet(pd.DataFrame(GOOD | {"value": ["fast"]})))
    assert cli.main(["compare", "a", "b", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "lat: left out metric 'm' of b: str values, not numbers (first: 'fast'): only numbers are compared" in out
