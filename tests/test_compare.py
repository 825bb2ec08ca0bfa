"""workbench.compare and `python -m workbench compare`: every metric both runs hold, joined on the
parameter columns, with the ratio; timings flagged only beyond both runs' own spread; verdict
changes flagged. On small synthetic run folders and on two committed reference runs."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from workbench import cli
from workbench.compare import CompareError, compare_runs, resolve_run, spread_names, summary_line
from workbench.studies.tables import write_study_table

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
