"""Build ``results/report/index.html`` from the run folders under ``results/``.

The report only reads: each run folder holds ``meta.json`` (see workbench.provenance) and one
``<study>.parquet`` tidy long table per study it ran (workbench.studies.tables). Runs committed
under ``results/reference/`` (measured on GPU hosts) are shown beside local ones, marked as
reference and labelled by device. For every registered study, the tables of all runs are read with
`load_table`, concatenated (with ``run``, ``reference`` and ``run_date`` columns added, and
``device`` from meta.json only where a table has none) and handed to the study's summarize
function, which saves figures and writes the finding. A table that cannot be read or breaks the
table format is left out and named, with the reason, in its study's section and in the Runs table;
it does not blank the study. Each study section also says, one line per device, for which of the
devices seen in any run the study has no data.

The committed norm bandwidth benchmark (``results/reference/*.json`` with
``"benchmark": "norm_bandwidth"``) gets its own section: % of the SM-copy ceiling and p50 times
per implementation and row count, with a finding generated from the numbers. Nothing here runs a
model.

Nothing is lost to a report. A run folder's meta.json is read with
`workbench.provenance.load_meta`, which checks every field the report reads: a run whose
meta.json is unreadable or breaks that schema is listed with the reason and its tables are left
out, like an unreadable table; every other run still shows. Every value that comes from a file
(meta.json fields, folder names, table values, findings, figure names) is HTML-escaped, and
links are percent-encoded. Reading needs no write access to the results folder.

The report only replaces a folder it wrote itself: every report it builds holds a marker file
(``.workbench-report.json``) listing the files it wrote, and `check_report_dir` refuses any other
non-empty folder (a report folder written before the marker existed is accepted when it holds
only what the report writes: its index.html and figure files), the results folder, a run folder,
a folder inside a run folder or holding run folders, and any folder that holds the results
folder. The report is built in a temporary folder next to the target and swapped in at the end;
a build that fails, a read-only folder and a full disk leave the previous report and every run
folder as they were (`ReportError` says why and where).
"""
from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import stat
import traceback
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .provenance import META_NAME, MetaError, atomic_write_text, iso_utc, load_meta, results_root
from .runstate import open_failures, run_state

REPORT_DIRNAME = "report"
REFERENCE_DIRNAME = "reference"
NO_STUDY_MESSAGE = (
    "no study exists yet: no module in workbench/studies/ registers one, "
    "so there is nothing to sweep or summarize"
)


@dataclass
class Run:
    """One run folder and what it holds."""

    path: Path
    meta: dict[str, Any] | None
    tables: dict[str, Path] = field(default_factory=dict)   # study name -> parquet file
    reference: bool = False
    error: str | None = None                                   # meta.json unreadable
    table_devices: list[str] = field(default_factory=list)     # `device` values of its read tables

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def recorded(self) -> dict[str, Any]:
        """meta.json as a dict ({} where there is none). A Run made by `find_runs` holds a
        checked one (`load_meta`); the properties below also survive one that is not."""
        return self.meta if isinstance(self.meta, dict) else {}

    @property
    def shard(self) -> dict | None:
        """{index, count, group} for a shard of a sharded sweep (meta.json), else None."""
        params = self.recorded.get("params")
        sh = params.get("shard") if isinstance(params, dict) else None
        if not (isinstance(sh, dict) and isinstance(sh.get("group"), str) and sh["group"]):
            return None
        return sh if all(_is_int(sh.get(k)) for k in ("index", "count")) else None

    @property
    def logical_name(self) -> str:
        """What the studies call this run: the shard group for the shards of one sharded sweep
        (their tables are summarized as one run), else the folder name."""
        sh = self.shard
        return f"{sh['group']} ({sh['count']} shards)" if sh else self.name

    @property
    def device(self) -> str:
        """The device its tables were measured on (one name everywhere: the tables' own), or,
        before they are read, the host meta.json names ('2x NVIDIA H200' on a 2-GPU host)."""
        if self.table_devices:
            return ", ".join(self.table_devices)
        return str(self.recorded.get("device") or "unknown device")

    @property
    def git(self) -> str:
        g = self.recorded.get("git")
        g = g if isinstance(g, dict) else {}
        short = g.get("short") if isinstance(g.get("short"), str) else ""
        short = short or (g.get("sha") if isinstance(g.get("sha"), str) else "")[:7]
        if not short:
            return "no git"
        return short + ("+dirty" if g.get("dirty") is True else "")

    @property
    def started(self) -> str:
        return str(self.recorded.get("started_at") or "")

    @property
    def finished(self) -> bool:
        return bool(self.recorded.get("finished_at"))

    @property
    def duration_s(self) -> float | None:
        d = self.recorded.get("duration_s")
        return float(d) if _is_num(d) else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _listed(v: Any) -> list:
    return v if isinstance(v, list) else []


def _mapped(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


NO_META = ("no meta.json: the report cannot say what ran there or on which device, so its tables are "
           "not used (a run folder gets one from the sweep or from save_table)")


def _load_run(path: Path, reference: bool) -> Run:
    """One run folder. Its meta.json is read and checked with `load_meta`; a run whose meta.json
    is missing, unreadable or breaks the schema keeps ``meta`` None and says why in ``error``,
    and its tables are left out (named in that reason): without a usable meta.json the report
    cannot say what ran there or merge a shard."""
    if not (path / META_NAME).is_file():
        return Run(path=path, meta=None, tables={}, reference=reference, error=NO_META)
    tables = {p.stem: p for p in sorted(path.glob("*.parquet"))}
    try:
        meta = load_meta(path)
    except MetaError as e:
        error = _one_line(e.line, 600)
        if tables:
            error += f"; its tables ({', '.join(tables)}) are left out until it is fixed"
        return Run(path=path, meta=None, tables={}, reference=reference, error=error)
    return Run(path=path, meta=meta, tables=tables, reference=reference)


def find_runs(results_dir: Path | str | None = None) -> list[Run]:
    """Run folders directly under ``results_dir`` and under ``results_dir/reference/``; local runs
    first, each group oldest first. A folder without a meta.json (or with an unreadable one) is
    listed too, with the reason in ``error``, so the report never skips one silently."""
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    runs: list[Run] = []
    for base, reference in ((results_dir, False), (results_dir / REFERENCE_DIRNAME, True)):
        if not base.is_dir():
            continue
        try:
            children = sorted(base.iterdir())
        except OSError as e:
            raise ReportError(f"cannot list the results folder {base}: {e.strerror or e}") from e
        for child in children:
            if not child.is_dir() or child.name.startswith("."):
                continue
            if not reference and child.name in (REPORT_DIRNAME, REFERENCE_DIRNAME):
                continue
            if (child / META_NAME).is_file() or any(child.glob("*.parquet")):
                runs.append(_load_run(child, reference))
    runs.sort(key=lambda r: (r.reference, r.started, r.name))
    return runs


@dataclass
class TableProblem:
    """One run's table of one study that could not be read or breaks the table format."""

    run: str
    study: str
    reason: str

    @property
    def line(self) -> str:
        return f"run {self.run}: table unreadable: {self.reason}"

    def __str__(self) -> str:
        return f"{self.study}: {self.line}"


@dataclass
class StudySection:
    name: str
    question: str
    runs: list[str]
    text: str = ""
    figures: list[str] = field(default_factory=list)    # paths relative to the report folder
    error: str | None = None
    svgs: dict[str, str] = field(default_factory=dict)  # figure -> its SVG, where one was saved
    table_problems: list[str] = field(default_factory=list)   # "run X: table unreadable: ..."
    missing_devices: list[str] = field(default_factory=list)  # devices seen elsewhere, not here
    tables: list[tuple[str, str]] = field(default_factory=list)  # (caption, HTML) of key numbers


@dataclass
class BenchmarkPanel:
    """One committed benchmark file, drawn."""

    source: str                     # file name under results/reference/
    device: str = ""
    date: str = ""
    text: str = ""
    figures: list[str] = field(default_factory=list)
    svgs: dict[str, str] = field(default_factory=dict)
    error: str | None = None        # one line: why this file could not be shown


@dataclass
class BenchmarkSection:
    title: str
    panels: list[BenchmarkPanel] = field(default_factory=list)
    note: str = ""                  # one line when there is nothing to show


@dataclass
class ReportResult:
    index: Path
    runs: list[Run]
    sections: list[StudySection]
    no_study: bool
    table_problems: list[str] = field(default_factory=list)   # "<study>: run X: table unreadable: ..."
    bandwidth: BenchmarkSection | None = None

    @property
    def problems(self) -> list[str]:
        """Failed summaries (the CLI exits non-zero for these). Unreadable tables are in
        ``table_problems`` and benchmark files in ``bandwidth``; neither is counted here."""
        return [f"{s.name}: {s.error.splitlines()[-1]}" for s in self.sections if s.error]


# --------------------------------------------------------------------------- tables

_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})")


def _run_date(run: Run) -> str:
    m = _DATE.match(run.started.strip())
    return m.group(1) if m else ""


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _problem_reason(exc: BaseException, path: Path) -> str:
    """One line: what is wrong with the table at ``path`` (its folder left out; the run is named
    beside it)."""
    msg = str(exc) or type(exc).__name__
    if str(path) in msg:                          # TableError names the file: keep its name only
        msg = msg.replace(str(path), path.name)
    else:
        msg = f"{path.name}: {type(exc).__name__}: {msg}"
    return _one_line(msg)


def run_table(run: Run, study_name: str):
    """One run's table of one study, read and checked with `load_table`, with ``run``,
    ``reference`` and ``run_date`` columns added and ``device`` from meta.json where the table has
    none (a table's own device column is kept). Raises what `load_table` raises."""
    from .studies.tables import VALUE_COLUMNS, load_table

    df = load_table(run.tables[study_name])
    added = {"run": run.logical_name, "reference": bool(run.reference), "run_date": _run_date(run)}
    if "device" not in df.columns:
        added["device"] = run.device
    at = min((df.columns.get_loc(c) for c in VALUE_COLUMNS if c in df.columns), default=len(df.columns))
    for col, value in added.items():
        if col in df.columns:
            df[col] = value
        else:
            df.insert(at, col, value)
            at += 1
    return df


def _second_in_group(seen: dict[tuple[str, str], str], run: Run, study: str) -> str | None:
    """None for the first table of ``study`` in ``run``'s logical run (noted in ``seen``); for a
    later shard of the same group that holds it again, why that table is not used."""
    first = seen.setdefault((run.logical_name, study), run.name)
    if first == run.name:
        return None
    return (f"{run.logical_name} already has a {study} table from shard folder {first}; a shard group holds "
            "each study once")


def load_tables(runs: list[Run], study_names) -> tuple[dict[tuple[str, str], Any], list[TableProblem]]:
    """Every run's table of each study in ``study_names``: {(run name, study): DataFrame}, and
    the tables that could not be read (any exception: a truncated parquet, a broken schema)."""
    loaded: dict[tuple[str, str], Any] = {}
    problems: list[TableProblem] = []
    names = set(study_names)
    seen: dict[tuple[str, str], str] = {}      # (logical run, study) -> the folder it came from
    for run in runs:
        for study, path in run.tables.items():
            if study not in names:
                continue
            again = _second_in_group(seen, run, study)
            if again:
                problems.append(TableProblem(run=run.name, study=study, reason=again))
                continue
            try:
                loaded[(run.name, study)] = run_table(run, study)
            except Exception as e:  # noqa: BLE001 - one bad file must not blank the report
                problems.append(TableProblem(run=run.name, study=study, reason=_problem_reason(e, path)))
    return loaded, problems


def study_table(study_name: str, runs: list[Run], problems: list[TableProblem] | None = None,
                loaded: Mapping[tuple[str, str], Any] | None = None):
    """All runs' readable tables for one study, concatenated (see `run_table` for the columns
    added); None when there is none. A table that cannot be read is skipped and, where
    ``problems`` is given, recorded there. ``loaded`` (from `load_tables`) avoids reading twice."""
    import pandas as pd

    frames = []
    seen: dict[tuple[str, str], str] = {}
    for run in runs:
        path = run.tables.get(study_name)
        if path is None:
            continue
        again = _second_in_group(seen, run, study_name)
        if again:                       # two shards of one run measured this study: keep the first
            if problems is not None:
                problems.append(TableProblem(run=run.name, study=study_name, reason=again))
            continue
        if loaded is not None and (run.name, study_name) in loaded:
            frames.append(loaded[(run.name, study_name)])
            continue
        try:
            frames.append(run_table(run, study_name))
        except Exception as e:  # noqa: BLE001 - skip it, say why
            if problems is not None:
                problems.append(TableProblem(run=run.name, study=study_name,
                                             reason=_problem_reason(e, path)))
    return pd.concat(frames, ignore_index=True) if frames else None


def note_table_devices(runs: list[Run], loaded: Mapping[tuple[str, str], Any]) -> None:
    """Set each run's ``table_devices``: the ``device`` values of its loaded tables."""
    for run in runs:
        run.table_devices = sorted({str(d) for (name, _), df in loaded.items() if name == run.name
                                    for d in df["device"].dropna().unique()})


def known_devices(runs: list[Run]) -> set[str]:
    """The devices seen anywhere: each run's ``device`` (its tables' devices once
    `note_table_devices` ran; the meta.json device of a run with no readable table)."""
    devices: set[str] = set()
    for run in runs:
        if run.table_devices:
            devices.update(run.table_devices)
        elif run.recorded.get("device"):
            devices.add(str(run.recorded["device"]))
    return devices


# --------------------------------------------------------------------------- figures


def _figures_in(paths, base: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """Figure files (absolute or relative to ``base``) as paths relative to ``root`` (files saved
    outside it are copied into ``base``), the PNG of a PNG/SVG pair shown and its SVG linked."""
    rels: list[str] = []
    for fig in paths:
        fig = Path(fig)
        if not fig.is_absolute():
            fig = base / fig
        try:
            rel = fig.resolve().relative_to(root)
        except ValueError:                       # saved elsewhere: copy it (and its SVG) in
            shutil.copy2(fig, base / fig.name)
            svg = fig.with_suffix(".svg")
            if fig.suffix.lower() != ".svg" and svg.is_file() and not (base / svg.name).exists():
                shutil.copy2(svg, base / svg.name)
            rel = (base / fig.name).relative_to(root)
        if rel.as_posix() not in rels:
            rels.append(rel.as_posix())
    shown = [r for r in rels if not (r.lower().endswith(".svg")
                                     and any(o != r and Path(o).with_suffix("").as_posix()
                                             == Path(r).with_suffix("").as_posix() for o in rels))]
    svgs = {}
    for r in shown:
        svg = Path(r).with_suffix(".svg")
        if not r.lower().endswith(".svg") and (root / svg).is_file():
            svgs[r] = svg.as_posix()
    return shown, svgs


# --------------------------------------------------------------------------- studies


def _summarize(study: Any, runs: list[Run], out_dir: Path,
               loaded: Mapping[tuple[str, str], Any] | None = None,
               devices: set[str] | None = None) -> StudySection:
    from .studies import Summary

    holders = list(dict.fromkeys(r.logical_name for r in runs if study.name in r.tables))
    section = StudySection(name=study.name, question=getattr(study, "question", ""), runs=[])
    devices = set(devices or ())
    if not holders:
        section.text = "No run holds a table for this study yet (make sweep)."
        section.missing_devices = sorted(devices)
        return section
    try:
        problems: list[TableProblem] = []
        table = study_table(study.name, runs, problems=problems, loaded=loaded)
        section.table_problems = [p.line for p in problems]
        if table is None:
            section.text = "No table of this study could be read."
            section.missing_devices = sorted(devices)
            return section
        present = set(table["run"].astype(str))
        section.runs = [name for name in holders if name in present]
        if "device" in table.columns:
            section.missing_devices = sorted(devices - {str(d) for d in table["device"].dropna().unique()})
        out_dir = out_dir.resolve()
        fig_dir = out_dir / study.name
        fig_dir.mkdir(parents=True, exist_ok=True)
        result = study.summarize(table, fig_dir)
        if isinstance(result, str):
            result = Summary(text=result)
        section.text = result.text
        section.tables = [(caption, _table_html(df)) for caption, df in getattr(result, "tables", [])]
        section.figures, section.svgs = _figures_in(result.figures, fig_dir, out_dir)
    except Exception:  # noqa: BLE001 - one broken study must not hide the others
        section.error = traceback.format_exc()
    return section


# --------------------------------------------------------------------------- norm bandwidth

NORM_BW_BENCHMARK = "norm_bandwidth"
NORM_BW_TITLE = "Norm bandwidth (committed benchmark)"
NORM_BW_DIRNAME = "norm_bandwidth"
LAUNCH_BOUND_PCT = 50.0      # below this share of the copy ceiling a call is launch/latency bound


def _benchmark_date(doc: Mapping[str, Any], path: Path) -> str:
    if doc.get("date"):
        return str(doc["date"])
    m = re.search(r"(?<!\d)(\d{4})(\d{2})(\d{2})(?!\d)", path.stem)
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}" if m else "undated"


def _norm_bw_records(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The full-size records (``n_valid`` null) with the keys the figures need, checked."""
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise ValueError("no 'results' list of measurements")
    out = []
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise ValueError(f"results[{i}] is not an object")
        if r.get("n_valid") is not None:
            continue
        missing = [k for k in ("impl", "n_rows", "p50_us", "floor_us", "pct_floor") if r.get(k) is None]
        if missing:
            raise ValueError(f"results[{i}] lacks {missing}")
        rec = dict(r)
        for k in ("p50_us", "floor_us", "pct_floor"):
            rec[k] = float(r[k])
            if not math.isfinite(rec[k]):
                raise ValueError(f"results[{i}].{k} is not a finite number: {r[k]!r}")
        rec["n_rows"] = int(r["n_rows"])
        rec["rows"] = str(r.get("rows") or r["n_rows"])
        rec["impl"] = str(r["impl"])
        out.append(rec)
    if not out:
        raise ValueError("no full-size measurement (every record has n_valid set)")
    return out


def _norm_bw_figures(recs, device: str, date: str, sm_copy_gbs: float | None, out_dir: Path, stem: str):
    import matplotlib.pyplot as plt

    from .studies.plotting import save_figure

    sizes = sorted({(r["n_rows"], r["rows"]) for r in recs})
    labels = [label for _, label in sizes]
    impls = list(dict.fromkeys(r["impl"] for r in recs))
    by = {(r["impl"], r["n_rows"]): r for r in recs}
    x = list(range(len(sizes)))
    width = 0.8 / max(len(impls), 1)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(sizes) + 3), 4.2))
    top = 100.0
    for i, impl in enumerate(impls):
        xs, ys = [], []
        for j, (n, _) in enumerate(sizes):
            r = by.get((impl, n))
            if r is not None:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(r["pct_floor"])
        bars = ax.bar(xs, ys, width=width * 0.92, label=impl)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
        top = max([top, *ys])
    ceiling = (f"SM-copy ceiling ({sm_copy_gbs:.0f} GB/s)" if sm_copy_gbs is not None
               else "SM-copy ceiling")
    ax.axhline(100.0, color="black", linestyle="--", linewidth=1, label=ceiling)
    ax.set_xticks(x, labels)
    ax.set_xlabel("pixel rows (images x rows per image)")
    ax.set_ylabel("% of copy ceiling (higher is better)")
    ax.set_ylim(0, top * 1.15)
    ax.set_title(f"Norm bandwidth, uint8 rows -> bf16, on {device} ({date})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    paths += save_figure(fig, out_dir, f"{stem}_pct")

    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(sizes) + 3), 3.6))
    for impl in impls:
        pts = [(j, by[(impl, n)]["p50_us"]) for j, (n, _) in enumerate(sizes) if (impl, n) in by]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    floors = [(j, next(r["floor_us"] for r in recs if r["n_rows"] == n)) for j, (n, _) in enumerate(sizes)]
    ax.plot([p[0] for p in floors], [p[1] for p in floors], color="black", marker="_", markersize=18,
            linestyle=":", linewidth=1, label="byte floor")
    ax.set_yscale("log")
    ax.set_xticks(x, labels)
    ax.set_xlabel("pixel rows (images x rows per image)")
    ax.set_ylabel("p50 time per call (µs, lower is better)")
    ax.set_title(f"Norm p50 time on {device} ({date})", fontsize=10)
    ax.margins(x=0.08)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", which="both", alpha=0.3)
    paths += save_figure(fig, out_dir, f"{stem}_p50")
    return paths


def norm_bandwidth_finding(recs, device: str, date: str) -> str:
    """Two or three sentences from the full-size records: the implementation closest to the copy
    ceiling at the largest row count, eager's share there, and the smallest size's best share
    (launch-bound where it is low)."""
    sizes = sorted({(r["n_rows"], r["rows"]) for r in recs})
    (n_big, big), (n_small, small) = sizes[-1], sizes[0]
    at_big = [r for r in recs if r["n_rows"] == n_big]
    best = max(at_big, key=lambda r: r["pct_floor"])
    s1 = (f"On {device} ({date}), {best['impl']} comes closest to the SM-copy ceiling at {big} rows: "
          f"{best['pct_floor']:.1f}% ({best['p50_us']:.1f} µs against a {best['floor_us']:.1f} µs byte floor)")
    eager = next((r for r in at_big if r["impl"] == "eager"), None)
    if eager is not None and eager is not best:
        s1 += f"; eager reaches {eager['pct_floor']:.1f}% there ({eager['p50_us']:.1f} µs)."
    else:
        s1 += "."
    parts = [s1]
    if n_small != n_big:
        sb = max((r for r in recs if r["n_rows"] == n_small), key=lambda r: r["pct_floor"])
        if sb["pct_floor"] < LAUNCH_BOUND_PCT:
            parts.append(f"At {small} rows the best is {sb['impl']} at only {sb['pct_floor']:.1f}% "
                         f"({sb['p50_us']:.1f} µs against {sb['floor_us']:.1f} µs): a call that small is "
                         f"bound by launch and latency, not by memory bandwidth.")
        else:
            parts.append(f"Even at {small} rows the best, {sb['impl']}, reaches {sb['pct_floor']:.1f}% "
                         f"of the ceiling.")
    return " ".join(parts)


def _norm_bw_panel(path: Path, doc: Mapping[str, Any], out_dir: Path) -> BenchmarkPanel:
    device = str(doc.get("device") or "unknown device")
    date = _benchmark_date(doc, path)
    panel = BenchmarkPanel(source=path.name, device=device, date=date)
    try:
        recs = _norm_bw_records(doc)
        sm = doc.get("sm_copy_gbs")
        sm = float(sm) if isinstance(sm, (int, float)) and not isinstance(sm, bool) else None
        fig_dir = out_dir / NORM_BW_DIRNAME
        from .studies.plotting import slug

        paths = _norm_bw_figures(recs, device, date, sm, fig_dir, slug(path.stem))
        panel.figures, panel.svgs = _figures_in(paths, fig_dir, out_dir)
        text = norm_bandwidth_finding(recs, device, date)
        versions = ", ".join(f"{k} {doc[k]}" for k in ("torch", "triton") if doc.get(k))
        copy = doc.get("copy_gbs")
        extra = []
        if sm is not None:
            extra.append(f"SM-copy ceiling {sm:.0f} GB/s")
        if isinstance(copy, (int, float)) and not isinstance(copy, bool):
            extra.append(f"eager copy_ {float(copy):.0f} GB/s (for reference)")
        if versions:
            extra.append(versions)
        panel.text = text + ("\n\n" + "; ".join(extra) + "." if extra else "")
    except Exception as e:  # noqa: BLE001 - a bad file shows an error line, not a failed report
        panel.error = _one_line(f"{path.name}: {type(e).__name__}: {e}")
    return panel


def norm_bandwidth_section(results_dir: Path | str, out_dir: Path) -> BenchmarkSection:
    """The committed norm bandwidth benchmark(s): every ``<results_dir>/reference/*.json`` whose
    object has ``"benchmark": "norm_bandwidth"``, drawn into ``<out_dir>/norm_bandwidth/``."""
    section = BenchmarkSection(title=NORM_BW_TITLE)
    ref = Path(results_dir) / REFERENCE_DIRNAME
    files = sorted(ref.glob("*.json")) if ref.is_dir() else []
    out_dir = Path(out_dir).resolve()
    for path in files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:       # cannot tell what it holds: say so
            section.panels.append(BenchmarkPanel(
                source=path.name, error=_one_line(f"{path.name}: unreadable JSON ({e})")))
            continue
        if not isinstance(doc, dict) or doc.get("benchmark") != NORM_BW_BENCHMARK:
            continue
        section.panels.append(_norm_bw_panel(path, doc, out_dir))
    if not section.panels:
        section.note = (f"No committed norm bandwidth benchmark: no {REFERENCE_DIRNAME}/*.json with "
                        f'"benchmark": "{NORM_BW_BENCHMARK}" under {results_dir}.')
    return section


# --------------------------------------------------------------------------- build


def _study_rank(study: Any) -> tuple[float, str]:
    """Sections in the order the studies declare (`Study.order`), then by name."""
    return (getattr(study, "order", math.inf), study.name)


# --------------------------------------------------------------------------- the report folder

REPORT_MARKER = ".workbench-report.json"      # in every report folder the report builds
REPORT_TITLE = "Workbench report"             # the <title> of index.html, then and now
FIGURE_SUFFIXES = (".png", ".svg")            # what a report folder holds besides index.html
_LEFTOVER = r"\.{name}\.(?:building|old)-\d+-[0-9a-f]{{8}}"
_SHOW_AT_MOST = 5


class ReportError(RuntimeError):
    """The report could not be built where asked. The message names the folder and says what to
    do; the previous report there (if any) and every run folder are as they were."""


class UnsafeOutDir(ReportError, ValueError):
    """A folder the report will not write into: replacing it could lose something the report did
    not write (see `check_report_dir`)."""


def _token() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _looks_like_run(d: Path) -> bool:
    try:
        return (d / META_NAME).is_file() or any(d.glob("*.parquet"))
    except OSError:
        return False


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOW_AT_MOST])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _SHOW_AT_MOST else "")


def _walk_files(root: Path) -> tuple[dict[str, int], list[str]]:
    """{relative path: size} of the regular files under ``root``, and what else is there (links,
    special files, folders that cannot be read), relative to ``root``."""
    files: dict[str, int] = {}
    other: list[str] = []

    def unreadable(e: OSError) -> None:
        other.append(os.path.relpath(e.filename, root) if e.filename else str(e))

    for here, dirs, names in os.walk(root, onerror=unreadable, followlinks=False):
        rel_here = Path(os.path.relpath(here, root))
        for d in list(dirs):
            if os.path.islink(os.path.join(here, d)):
                other.append((rel_here / d).as_posix())
                dirs.remove(d)
        for n in names:
            full = os.path.join(here, n)
            rel = (rel_here / n).as_posix()
            try:
                st = os.lstat(full)
            except OSError:
                other.append(rel)
                continue
            if stat.S_ISREG(st.st_mode):
                files[rel] = st.st_size
            else:
                other.append(rel)
    return files, other


def _read_marker(folder: Path) -> dict | None:
    try:
        doc = json.loads((folder / REPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _legacy_index(folder: Path) -> bool:
    """Whether ``folder/index.html`` is a page this report wrote (its title)."""
    try:
        with open(folder / "index.html", "rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    return f"<title>{REPORT_TITLE}</title>".encode() in head


def _foreign_in_report(folder: Path) -> list[str] | None:
    """What in the report folder ``folder`` the report did not write: for a marked folder, every
    file its marker does not list with that size (and anything that is not a plain file); for an
    unmarked one written before the marker existed, anything but index.html and figure files.
    None when ``folder`` is neither."""
    files, other = _walk_files(folder)
    if (folder / REPORT_MARKER).is_file():
        marker = _read_marker(folder)
        written = marker.get("files") if marker else None
        if not isinstance(written, dict):
            return [f"{REPORT_MARKER} (unreadable, or it lists no files)"]
        files.pop(REPORT_MARKER, None)
        return other + [rel for rel, size in files.items() if written.get(rel) != size]
    if not _legacy_index(folder):
        return None
    return other + [rel for rel in files
                    if rel != "index.html" and not rel.lower().endswith(FIGURE_SUFFIXES)]


def check_report_dir(out_dir: Path | str, results_dir: Path | str | None = None) -> str:
    """Whether the report may be written to ``out_dir`` (replacing it as a whole): returns
    ``"new"`` (it does not exist), ``"empty"``, ``"report"`` (a report folder with the marker,
    holding only the files it lists) or ``"legacy"`` (a report folder written before the
    marker existed: index.html with the report's title and figure files only). Raises
    UnsafeOutDir, naming the folder, saying why and what to do, for anything else: the results
    folder itself, a folder that holds it, a run folder, a folder inside a run folder or
    holding run folders, a file, or a non-empty folder with anything the report did not write.
    """
    out_dir = Path(out_dir)
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out, results = out_dir.resolve(), results_dir.resolve()
    todo = ("Pass --out with a new or empty folder, or with a folder the report wrote "
            f"(one with {REPORT_MARKER} in it).")

    def refuse(why: str) -> UnsafeOutDir:
        return UnsafeOutDir(f"refusing to write the report into {out_dir}: {why}. {todo}")

    if out == results:
        raise refuse("it is the results folder itself; the report replaces its whole folder, which "
                     "would delete every run folder in it")
    if out in results.parents:
        raise refuse(f"it holds the results folder {results_dir}; the report replaces its whole "
                     "folder, which would delete every run folder in it")
    if out.is_dir() and _looks_like_run(out):
        raise refuse("it is a run folder (it holds a meta.json or tables), not a report folder")
    if results in out.parents:
        for above in out.parents:
            if above == results:
                break
            if _looks_like_run(above):
                raise refuse(f"it is inside the run folder {above}; a run folder holds results only")
    if not out.exists():
        if out_dir.is_symlink():
            raise refuse("it is a link to a folder that does not exist")
        return "new"
    if not out.is_dir():
        raise refuse("it is a file, not a folder")
    try:
        entries = sorted(out.iterdir())
    except OSError as e:
        raise refuse(f"it cannot be listed ({e.strerror or e})") from e
    if not entries:
        return "empty"
    runs = [c.name for c in entries if c.is_dir() and not c.is_symlink() and _looks_like_run(c)]
    ref = out / REFERENCE_DIRNAME
    if ref.is_dir() and not ref.is_symlink():
        try:
            runs += [f"{REFERENCE_DIRNAME}/{c.name}" for c in sorted(ref.iterdir())
                     if c.is_dir() and _looks_like_run(c)]
        except OSError:
            pass
    if runs:
        raise refuse(f"it holds run folders ({_some(runs)}); the report replaces its whole folder, "
                     "which would delete them")
    foreign = _foreign_in_report(out)
    if foreign is None:
        raise refuse(f"it is not empty ({_some([e.name for e in entries])}) and holds no {REPORT_MARKER}, "
                     "so it is not a folder the report wrote, and the report replaces its whole "
                     "folder")
    if foreign:
        raise refuse(f"it is a report folder, but holds files the report did not write or that "
                     f"changed since ({_some(foreign)}), which replacing it would delete; move them "
                     "out first")
    return "report" if (out / REPORT_MARKER).is_file() else "legacy"


def _write_marker(folder: Path, results_dir: Path, files: dict[str, int] | None) -> None:
    doc = {"written_by": "python -m workbench report (workbench.report.build_report)",
           "built_at": iso_utc(timespec="seconds"),
           "results": str(results_dir),
           "note": ("The report replaces this whole folder each time it is built, after checking "
                    "that it holds only the files listed here; keep nothing else in it."),
           "files": files}
    atomic_write_text(folder / REPORT_MARKER, json.dumps(doc, indent=1) + "\n")


class _FolderLock:
    """An exclusive flock on a folder (its own descriptor), held while the block runs; a folder
    that cannot be opened is not locked (the lock only orders concurrent builds)."""

    def __init__(self, folder: Path, wait: bool = True):
        self.folder, self.wait, self.fd, self.held = folder, wait, None, False

    def __enter__(self) -> "_FolderLock":
        import fcntl

        try:
            self.fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            self.held = True
        except OSError:
            pass
        return self

    def __exit__(self, *exc) -> bool:
        if self.fd is not None:
            os.close(self.fd)                # closing drops the flock
            self.fd = None
        return False


def _remove_leftovers(out: Path) -> None:
    """Folders that builds into ``out`` killed mid-way left beside it (``.<name>.building-*``,
    ``.<name>.old-*``, and an older version's ``.<name>.old``), where no build holds them and
    they are the report's own (its marker; for the older version's, a report page and figures
    only). Anything else is left alone."""
    pattern = re.compile(_LEFTOVER.format(name=re.escape(out.name)))
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return
    for d in siblings:
        legacy = d.name == f".{out.name}.old"
        if not (legacy or pattern.fullmatch(d.name)) or d.is_symlink() or not d.is_dir():
            continue
        with _FolderLock(d, wait=False) as lock:
            if not lock.held:
                continue
            # a build writes its marker only once it holds its folder's lock
            ours = _foreign_in_report(d) == [] if legacy else (d / REPORT_MARKER).is_file()
            if ours:
                shutil.rmtree(d, ignore_errors=True)


def _swap_in(tmp: Path, out_dir: Path, results_dir: Path) -> None:
    """Replace ``out_dir`` with the finished report in ``tmp``: checked again right before, the old
    folder moved aside, the new one moved in, the old one removed. If moving the new one in fails,
    the old one is moved back."""
    out = out_dir.resolve()
    with _FolderLock(out.parent):            # one build at a time swaps into this folder
        check_report_dir(out_dir, results_dir)
        backup = None
        if out.exists():
            backup = out.with_name(f".{out.name}.old-{_token()}")
            os.rename(out, backup)
        try:
            os.rename(tmp, out)
        except BaseException as e:
            if backup is not None:
                try:
                    os.rename(backup, out)
                except OSError as e2:
                    raise ReportError(
                        f"cannot write the report to {out_dir}: {e}; and the previous report could not "
                        f"be moved back ({e2.strerror or e2}): it is at {backup}") from e
            raise
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
        _remove_leftovers(out)


def _write_failure(out_dir: Path, e: OSError) -> str:
    import errno

    why = e.strerror or str(e) or type(e).__name__
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        hint = "free some disk space, or pass --out DIR on another disk"
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "the folder is not writable: pass --out DIR to write the report somewhere writable"
    else:
        hint = "pass --out DIR to write the report elsewhere"
    return (f"cannot write the report to {out_dir}: {why}{where}; {hint}. The previous report there "
            f"(if any) and every run folder are unchanged.")


def _build_into(tmp: Path, runs: list[Run], studies: Mapping[str, Any], results_dir: Path,
                out_dir: Path) -> tuple[list[StudySection], BenchmarkSection, list[TableProblem]]:
    """The whole report, written into the empty folder ``tmp`` (links computed for ``out_dir``),
    its marker written last, listing every file."""
    _write_marker(tmp, results_dir, files=None)     # ours from the start, for the cleanup
    loaded, problems = load_tables(runs, studies)
    note_table_devices(runs, loaded)
    devices = known_devices(runs)
    sections = [_summarize(s, runs, tmp, loaded=loaded, devices=devices)
                for s in sorted(studies.values(), key=_study_rank)]
    bandwidth = norm_bandwidth_section(results_dir, tmp)
    by_run: dict[str, list[str]] = {}
    for p in problems:
        by_run.setdefault(p.run, []).append(f"{p.study}: {p.reason}")
    page = render_html(runs, sections, no_study=not studies, results_dir=results_dir,
                       out_dir=out_dir, bandwidth=bandwidth, table_problems=by_run)
    atomic_write_text(tmp / "index.html", page)
    files, _ = _walk_files(tmp)
    files.pop(REPORT_MARKER, None)
    _write_marker(tmp, results_dir, files=files)
    return sections, bandwidth, problems


def build_report(results_dir: Path | str | None = None, out_dir: Path | str | None = None,
                 studies: Mapping[str, Any] | None = None) -> ReportResult:
    """Write ``<out_dir>/index.html`` (default ``<results_dir>/report``) and return what it shows.

    ``studies`` defaults to the registry (``workbench.studies.discover()``). ``out_dir`` is
    replaced as a whole, so it must be new, empty, or a folder the report wrote
    (`check_report_dir`; UnsafeOutDir otherwise, before anything is read or written). The
    report is built in a temporary folder beside it and swapped in at the end: a failure at
    any step (ReportError for a folder that cannot be written, a full disk) leaves the previous
    report and every run folder as they were. Only reads the results folder.
    """
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out_dir = Path(out_dir) if out_dir is not None else results_dir / REPORT_DIRNAME
    check_report_dir(out_dir, results_dir)
    if studies is None:
        from .studies import discover

        studies = discover()
    runs = find_runs(results_dir)

    out = out_dir.resolve()
    tmp = out.with_name(f".{out.name}.building-{_token()}")
    made = False
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        made = True
        with _FolderLock(tmp, wait=False):        # another build's cleanup leaves it alone
            sections, bandwidth, problems = _build_into(tmp, runs, studies, results_dir, out_dir)
            _swap_in(tmp, out_dir, results_dir)
        made = False
    except OSError as e:
        raise ReportError(_write_failure(out_dir, e)) from e
    finally:
        if made:
            shutil.rmtree(tmp, ignore_errors=True)
    return ReportResult(index=out_dir / "index.html", runs=runs, sections=sections,
                        no_study=not studies, table_problems=[str(p) for p in problems],
                        bandwidth=bandwidth)


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem;
       color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9rem; width: 100%; }
th, td { text-align: left; padding: 0.3rem 0.6rem; border-bottom: 1px solid #eee; vertical-align: top; }
th { background: #f5f5f7; }
.notice { background: #fff8e1; border: 1px solid #f0c36d; padding: 0.8rem 1rem; border-radius: 4px; }
.ref { background: #e8f0fe; border-radius: 3px; padding: 0 0.3rem; font-size: 0.8rem; }
.muted { color: #6e6e73; font-size: 0.85rem; }
.problem { color: #a50e0e; font-size: 0.85rem; }
figcaption { font-size: 0.8rem; }
pre.error { background: #fdecea; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
code { background: #f5f5f7; padding: 0 0.2rem; }
.tablebox { overflow-x: auto; margin: 1rem 0; } .caption { font-weight: 600; margin-bottom: 0.3rem; }
table.data { font-size: 0.8rem; width: auto; } table.data td { text-align: right; white-space: nowrap; }
.toc { font-size: 0.9rem; }
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _href(rel: str) -> str:
    """A relative link for an attribute: percent-encoded (a folder name holding ``:``, ``#``,
    ``?`` or markup stays a path, never a scheme or a fragment), then HTML-escaped."""
    return _e(urllib.parse.quote(rel, safe="/"))


def _rel_link(target: Path, out_dir: Path) -> str | None:
    try:
        return Path(os.path.relpath(target.resolve(), out_dir.resolve())).as_posix()
    except ValueError:
        return None


def _table_link(r: Run, study: str, out_dir: Path) -> str:
    """The study's name, linked to the run's HTML export of its executed notebook when there is one."""
    page = r.path / f"{study}.html"
    link = _rel_link(page, out_dir) if page.is_file() else None
    return f'<a href="{_href(link)}">{_e(study)}</a>' if link else _e(study)


def _unfinished(r: Run) -> str:
    from .provenance import run_in_use

    if run_in_use(r.path):
        return "in progress"
    left = run_state(r.path, r.recorded).describe_left()
    return (f"interrupted (left: {_e(left)}): finish it with <code>python -m workbench sweep --resume "
            f"{_e(r.name)}</code> (make report resumes it when the code is the same)")


def _runs_table(runs: list[Run], out_dir: Path,
                table_problems: Mapping[str, list[str]] | None = None) -> str:
    if not runs:
        return "<p>No run folder found yet (a run folder holds a <code>meta.json</code>).</p>"
    table_problems = table_problems or {}
    rows = []
    for r in runs:
        # the run's meta.json (provenance, parameters) opens readably in a browser; a folder would not
        meta = r.path / META_NAME
        link = _rel_link(meta if meta.is_file() else r.path, out_dir)
        name = f'<a href="{_href(link)}">{_e(r.name)}</a>' if link else _e(r.name)
        if r.reference:
            name += ' <span class="ref">reference</span>'
        if r.error:
            status = f"<span class='problem'>{_e(r.error)}</span>"
        else:
            status = "finished" if r.finished else _unfinished(r)
            if r.shard:
                status += (f", shard {_e(r.shard['index'])}/{_e(r.shard['count'])} "
                           f"of {_e(r.shard['group'])}")
            placement = _mapped(r.recorded.get("placement"))
            if placement:
                status += ", " + _e("; ".join(f"{k} on GPU {_mapped(v).get('gpu')} ({_mapped(v).get('seconds')} s)"
                                              for k, v in placement.items()))
            resumed = [_mapped(x) for x in _listed(r.recorded.get("resumed"))]
            if resumed:
                parts = "; ".join(f"{', '.join(map(str, _listed(x.get('studies'))))} at {x.get('at') or '?'}"
                                  for x in resumed)
                status += f", resumed ({_e(parts)})"
            failures = open_failures(r.recorded)
            if failures:
                status = (f"<span class='problem'>{status}, {len(failures)} failed</span> (reasons below; re-run "
                          f"them with <code>python -m workbench sweep --resume {_e(r.name)}</code>)")
        bad = table_problems.get(r.name) or []
        if bad:
            status += (f", <span class='problem' title='{_e('; '.join(bad))}'>{len(bad)} "
                       f"table{'s' if len(bad) > 1 else ''} unreadable</span>")
        dur = f"{r.duration_s:.1f} s" if r.duration_s is not None else ""
        tables = ", ".join(_table_link(r, t, out_dir) for t in r.tables) or '<span class="muted">none</span>'
        rows.append(
            f"<tr><td>{name}</td><td>{_e(r.device)}</td><td><code>{_e(r.git)}</code></td>"
            f"<td>{_e(r.started)}</td><td>{dur}</td><td>{status}</td><td>{tables}</td></tr>")
    problems = [f"<li>{_e(r.name)}: {_e(r.error)}</li>" for r in runs if r.error]
    problems += [f"<li>{_e(name)}: {_e(line)}</li>" for name, lines in table_problems.items() for line in lines]
    listing = ("<p class='problem'>Run folders and tables the report could not use:</p><ul class='problem'>"
               + "".join(problems) + "</ul>") if problems else ""
    failed = [f"<li>{_e(r.name)}: {_e(f)}</li>" for r in runs if not r.error for f in open_failures(r.recorded)]
    if failed:   # the reason on the page, not only in a tooltip
        listing += "<p class='problem'>Studies that failed in a run:</p><ul class='problem'>" + "".join(failed) + "</ul>"
    warned = [f"<li>{_e(r.name)}: {_e(w)}</li>" for r in runs
              for w in [*_listed(r.recorded.get("warnings")),
                        *(w for x in _listed(r.recorded.get("resumed")) for w in _listed(_mapped(x).get("warnings")))]]
    if warned:
        listing += "<p>Warnings a run recorded:</p><ul>" + "".join(warned) + "</ul>"
    return ("<table><thead><tr><th>run</th><th>device</th><th>git</th><th>started (UTC)</th>"
            "<th>duration</th><th>status</th><th>tables</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>" + listing)


def _paragraphs(text: str) -> str:
    parts = [p.strip() for p in text.split("\n\n") if p.strip()]
    return "".join(f"<p>{_e(p)}</p>" for p in parts)


def _table_html(df) -> str:
    """A small DataFrame as an HTML table: three significant digits, n/a for missing values."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        return v
    return df.to_html(index=False, border=0, classes="data", na_rep="n/a", formatters={
        c: fmt for c in df.columns if df[c].dtype.kind == "f"}, escape=True)


def _figure_html(src: str, alt: str, svg: str | None = None) -> str:
    cap = f'<figcaption><a href="{_href(svg)}">SVG</a></figcaption>' if svg else ""
    return f'<figure><img src="{_href(src)}" alt="{_e(alt)}">{cap}</figure>'


def _section_html(s: StudySection) -> str:
    out = [f'<h2 id="{_e(s.name)}">{_e(s.name)}</h2>']
    if s.question:
        out.append(f"<p><em>{_e(s.question)}</em></p>")
    if s.error:
        out.append(f'<p>The summary failed:</p><pre class="error">{_e(s.error)}</pre>')
    out.append(_paragraphs(s.text))
    for caption, table in s.tables:
        out.append(f'<div class="tablebox"><p class="caption">{_e(caption)}</p>{table}</div>')
    for fig in s.figures:
        out.append(_figure_html(fig, f"{s.name} figure", s.svgs.get(fig)))
    for line in s.table_problems:
        out.append(f'<p class="problem">{_e(line)}</p>')
    for dev in s.missing_devices:
        out.append(f'<p class="muted">No {_e(s.name)} data for {_e(dev)}.</p>')
    if s.runs:
        out.append(f'<p class="muted">From runs: {_e(", ".join(s.runs))}</p>')
    return "\n".join(out)


def _benchmark_html(b: BenchmarkSection) -> str:
    out = [f'<h2 id="{_e(NORM_BW_DIRNAME)}">{_e(b.title)}</h2>']
    if b.note:
        out.append(f'<p class="muted">{_e(b.note)}</p>')
    many = len(b.panels) > 1
    for p in b.panels:
        if many:
            out.append(f"<h3>{_e(p.device or p.source)}{', ' + _e(p.date) if p.date else ''}</h3>")
        if p.error:
            out.append(f'<p class="problem">{_e(p.error)}</p>')
        out.append(_paragraphs(p.text))
        for fig in p.figures:
            out.append(_figure_html(fig, f"norm bandwidth, {p.device}", p.svgs.get(fig)))
        if not p.error:
            out.append(f'<p class="muted">From <code>{_e(REFERENCE_DIRNAME)}/{_e(p.source)}</code>.</p>')
    return "\n".join(out)


def render_html(runs: list[Run], sections: list[StudySection], no_study: bool,
                results_dir: Path, out_dir: Path, bandwidth: BenchmarkSection | None = None,
                table_problems: Mapping[str, list[str]] | None = None) -> str:
    now = iso_utc(timespec="seconds")
    body = [
        "<h1>Vision-encoder input-normalization workbench: report</h1>",
        f'<p class="muted">Built {_e(now)} from <code>{_e(results_dir)}</code>: '
        f"{len(runs)} run folder(s), {sum(r.reference for r in runs)} of them reference runs.</p>",
    ]
    if no_study:
        body.append(f'<p class="notice"><strong>{_e(NO_STUDY_MESSAGE[0].upper() + NO_STUDY_MESSAGE[1:])}.</strong> '
                    "Study modules register themselves in <code>workbench/studies/</code>; "
                    "once one exists, <code>make report</code> runs it and summarizes it here.</p>")
    toc = [f'<a href="#{_href(s.name)}">{_e(s.name)}</a>' for s in sections]
    if bandwidth is not None:
        toc.append(f'<a href="#{_e(NORM_BW_DIRNAME)}">norm bandwidth</a>')
    toc.append('<a href="#runs">runs</a>')
    body.append(f'<p class="toc">Sections: {" · ".join(toc)}</p>')
    for s in sections:
        body.append(_section_html(s))
    if bandwidth is not None:
        body.append(_benchmark_html(bandwidth))
    body.append('<h2 id="runs">Runs</h2>')
    body.append(_runs_table(runs, out_dir, table_problems))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{REPORT_TITLE}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
