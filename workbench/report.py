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

The report is built in a temporary folder next to the target and swapped in at the end, so a
failed build leaves the previous report in place.
"""
from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .provenance import META_NAME, atomic_write_text, results_root, utc_now

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
    def shard(self) -> dict | None:
        """{index, count, group} for a shard of a sharded sweep (meta.json), else None."""
        sh = ((self.meta or {}).get("params") or {}).get("shard")
        return sh if isinstance(sh, dict) and sh.get("group") else None

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
        return str((self.meta or {}).get("device") or "unknown device")

    @property
    def git(self) -> str:
        g = (self.meta or {}).get("git") or {}
        short = g.get("short") or (g.get("sha") or "")[:7]
        if not short:
            return "no git"
        return short + ("+dirty" if g.get("dirty") else "")

    @property
    def started(self) -> str:
        return str((self.meta or {}).get("started_at") or "")

    @property
    def finished(self) -> bool:
        return bool((self.meta or {}).get("finished_at"))

    @property
    def duration_s(self) -> float | None:
        d = (self.meta or {}).get("duration_s")
        return float(d) if isinstance(d, (int, float)) else None


NO_META = ("no meta.json: the report cannot say what ran there or on which device, so its tables are "
           "not used (a run folder gets one from the sweep or from save_table)")


def _load_run(path: Path, reference: bool) -> Run:
    meta: dict[str, Any] | None = None
    error = None
    if not (path / META_NAME).is_file():
        return Run(path=path, meta=None, tables={}, reference=reference, error=NO_META)
    try:
        with open(path / META_NAME, encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            meta, error = None, "unreadable meta.json: it does not hold an object"
    except (OSError, ValueError) as e:
        error = f"unreadable meta.json: {e}"
    tables = {p.stem: p for p in sorted(path.glob("*.parquet"))}
    return Run(path=path, meta=meta, tables=tables, reference=reference, error=error)


def find_runs(results_dir: Path | str | None = None) -> list[Run]:
    """Run folders directly under ``results_dir`` and under ``results_dir/reference/``; local runs
    first, each group oldest first. A folder without a meta.json (or with an unreadable one) is
    listed too, with the reason in ``error``, so the report never skips one silently."""
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    runs: list[Run] = []
    for base, reference in ((results_dir, False), (results_dir / REFERENCE_DIRNAME, True)):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
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
    m = _DATE.match(str((run.meta or {}).get("started_at") or "").strip())
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
        elif (run.meta or {}).get("device"):
            devices.add(str(run.meta["device"]))
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


# the order of the design brief's study table; a study not listed goes after them, by name
STUDY_ORDER = ("correctness", "cast_cost", "padding_waste", "fp32_memory", "encoder_latency")


def _study_rank(name: str) -> tuple[int, str]:
    return (STUDY_ORDER.index(name) if name in STUDY_ORDER else len(STUDY_ORDER), name)


def build_report(results_dir: Path | str | None = None, out_dir: Path | str | None = None,
                 studies: Mapping[str, Any] | None = None) -> ReportResult:
    """Write ``<out_dir>/index.html`` (default ``<results_dir>/report``) and return what it shows.

    ``studies`` defaults to the registry (``workbench.studies.discover()``).
    """
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out_dir = Path(out_dir) if out_dir is not None else results_dir / REPORT_DIRNAME
    if (out_dir / META_NAME).exists():
        raise ValueError(f"{out_dir} holds a meta.json: it is a run folder, not a report folder")
    if studies is None:
        from .studies import discover

        studies = discover()
    runs = find_runs(results_dir)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        loaded, problems = load_tables(runs, studies)
        note_table_devices(runs, loaded)
        devices = known_devices(runs)
        sections = [_summarize(s, runs, tmp, loaded=loaded, devices=devices)
                    for _, s in sorted(studies.items(), key=lambda kv: _study_rank(kv[0]))]
        bandwidth = norm_bandwidth_section(results_dir, tmp)
        by_run: dict[str, list[str]] = {}
        for p in problems:
            by_run.setdefault(p.run, []).append(f"{p.study}: {p.reason}")
        page = render_html(runs, sections, no_study=not studies, results_dir=results_dir,
                           out_dir=out_dir, bandwidth=bandwidth, table_problems=by_run)
        atomic_write_text(tmp / "index.html", page)
        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out_dir.exists():
            out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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


def _rel_link(target: Path, out_dir: Path) -> str | None:
    try:
        return Path(os.path.relpath(target.resolve(), out_dir.resolve())).as_posix()
    except ValueError:
        return None


def _table_link(r: Run, study: str, out_dir: Path) -> str:
    """The study's name, linked to the run's HTML export of its executed notebook when there is one."""
    page = r.path / f"{study}.html"
    link = _rel_link(page, out_dir) if page.is_file() else None
    return f'<a href="{_e(link)}">{_e(study)}</a>' if link else _e(study)


def _unfinished(r: Run) -> str:
    from .provenance import run_in_use

    if run_in_use(r.path):
        return "in progress"
    return (f"interrupted: finish it with <code>python -m workbench sweep --resume {_e(r.name)}</code> "
            "(make report resumes it when the code is the same)")


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
        name = f'<a href="{_e(link)}">{_e(r.name)}</a>' if link else _e(r.name)
        if r.reference:
            name += ' <span class="ref">reference</span>'
        if r.error:
            status = f"<span class='problem'>{_e(r.error)}</span>"
        else:
            status = "finished" if r.finished else _unfinished(r)
            if r.shard:
                status += f", shard {r.shard['index']}/{r.shard['count']} of {_e(r.shard['group'])}"
            placement = (r.meta or {}).get("placement") or {}
            if placement:
                status += ", " + _e("; ".join(f"{k} on GPU {v.get('gpu')} ({v.get('seconds')} s)"
                                              for k, v in placement.items()))
            resumed = (r.meta or {}).get("resumed") or []
            if resumed:
                parts = "; ".join(f"{', '.join(x.get('studies', []))} at {x.get('at', '?')}" for x in resumed)
                status += f", resumed ({_e(parts)})"
            failures = (r.meta or {}).get("failures") or []
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
    failed = [f"<li>{_e(r.name)}: {_e(f)}</li>" for r in runs for f in ((r.meta or {}).get("failures") or [])]
    if failed:   # the reason on the page, not only in a tooltip
        listing += "<p class='problem'>Studies that failed in a run:</p><ul class='problem'>" + "".join(failed) + "</ul>"
    warned = [f"<li>{_e(r.name)}: {_e(w)}</li>" for r in runs for w in ((r.meta or {}).get("warnings") or [])]
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
    cap = f'<figcaption><a href="{_e(svg)}">SVG</a></figcaption>' if svg else ""
    return f'<figure><img src="{_e(src)}" alt="{_e(alt)}">{cap}</figure>'


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
    now = utc_now().isoformat(timespec="seconds").replace("+00:00", "Z")
    body = [
        "<h1>Vision-encoder input-normalization workbench: report</h1>",
        f'<p class="muted">Built {_e(now)} from <code>{_e(results_dir)}</code>: '
        f"{len(runs)} run folder(s), {sum(r.reference for r in runs)} of them reference runs.</p>",
    ]
    if no_study:
        body.append(f'<p class="notice"><strong>{_e(NO_STUDY_MESSAGE[0].upper() + NO_STUDY_MESSAGE[1:])}.</strong> '
                    "Study modules register themselves in <code>workbench/studies/</code>; "
                    "once one exists, <code>make report</code> runs it and summarizes it here.</p>")
    toc = [f'<a href="#{_e(s.name)}">{_e(s.name)}</a>' for s in sections]
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
            "<title>Workbench report</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
