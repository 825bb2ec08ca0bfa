"""Build ``results/report/index.html`` from the run folders under ``results/``.

The report only reads: each run folder holds ``meta.json`` (see workbench.provenance) and one
``<study>.parquet`` tidy table per study it ran. Runs committed under ``results/reference/``
(measured on GPU hosts) are shown beside local ones, marked as reference and labelled by device.
For every registered study, the tables of all runs are concatenated (with ``run``, ``device`` and
``reference`` columns added) and handed to the study's summarize function, which saves figures
and writes the finding. Nothing here runs a model.

The report is built in a temporary folder next to the target and swapped in at the end, so a
failed build leaves the previous report in place.
"""
from __future__ import annotations

import html
import json
import os
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .provenance import META_NAME, atomic_write_text, utc_now

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

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def device(self) -> str:
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


def _load_run(path: Path, reference: bool) -> Run:
    meta: dict[str, Any] | None = None
    error = None
    try:
        with open(path / META_NAME, encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            meta, error = None, "meta.json does not hold an object"
    except (OSError, ValueError) as e:
        error = f"unreadable meta.json: {e}"
    tables = {p.stem: p for p in sorted(path.glob("*.parquet"))}
    return Run(path=path, meta=meta, tables=tables, reference=reference, error=error)


def find_runs(results_dir: Path | str = "results") -> list[Run]:
    """Run folders (those holding a meta.json) directly under ``results_dir`` and under
    ``results_dir/reference/``; local runs first, each group oldest first."""
    results_dir = Path(results_dir)
    runs: list[Run] = []
    for base, reference in ((results_dir, False), (results_dir / REFERENCE_DIRNAME, True)):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if not child.is_dir() or child.name.startswith("."):
                continue
            if not reference and child.name in (REPORT_DIRNAME, REFERENCE_DIRNAME):
                continue
            if (child / META_NAME).is_file():
                runs.append(_load_run(child, reference))
    runs.sort(key=lambda r: (r.reference, r.started, r.name))
    return runs


@dataclass
class StudySection:
    name: str
    question: str
    runs: list[str]
    text: str = ""
    figures: list[str] = field(default_factory=list)    # paths relative to the report folder
    error: str | None = None


@dataclass
class ReportResult:
    index: Path
    runs: list[Run]
    sections: list[StudySection]
    no_study: bool

    @property
    def problems(self) -> list[str]:
        return [f"{s.name}: {s.error.splitlines()[-1]}" for s in self.sections if s.error]


def study_table(study_name: str, runs: list[Run]):
    """All runs' tables for one study, concatenated, with run/device/reference columns."""
    import pandas as pd

    frames = []
    for run in runs:
        path = run.tables.get(study_name)
        if path is None:
            continue
        df = pd.read_parquet(path)
        df["run"] = run.name
        df["device"] = run.device
        df["reference"] = run.reference
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else None


def _summarize(study: Any, runs: list[Run], out_dir: Path) -> StudySection:
    from .studies import Summary

    used = [r.name for r in runs if study.name in r.tables]
    section = StudySection(name=study.name, question=getattr(study, "question", ""), runs=used)
    if not used:
        section.text = "No run holds a table for this study yet (make sweep)."
        return section
    try:
        table = study_table(study.name, runs)
        out_dir = out_dir.resolve()
        fig_dir = out_dir / study.name
        fig_dir.mkdir(parents=True, exist_ok=True)
        result = study.summarize(table, fig_dir)
        if isinstance(result, str):
            result = Summary(text=result)
        section.text = result.text
        for fig in result.figures:
            fig = Path(fig)
            if not fig.is_absolute():
                fig = fig_dir / fig
            try:
                rel = fig.resolve().relative_to(out_dir)
            except ValueError:                       # saved elsewhere: copy it in
                shutil.copy2(fig, fig_dir / fig.name)
                rel = (fig_dir / fig.name).relative_to(out_dir)
            section.figures.append(rel.as_posix())
    except Exception:  # noqa: BLE001 - one broken study must not hide the others
        section.error = traceback.format_exc()
    return section


def build_report(results_dir: Path | str = "results", out_dir: Path | str | None = None,
                 studies: Mapping[str, Any] | None = None) -> ReportResult:
    """Write ``<out_dir>/index.html`` (default ``<results_dir>/report``) and return what it shows.

    ``studies`` defaults to the registry (``workbench.studies.discover()``).
    """
    results_dir = Path(results_dir)
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
        sections = [_summarize(s, runs, tmp) for _, s in sorted(studies.items())]
        page = render_html(runs, sections, no_study=not studies, results_dir=results_dir,
                           out_dir=out_dir)
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
                        no_study=not studies)


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
pre.error { background: #fdecea; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
code { background: #f5f5f7; padding: 0 0.2rem; }
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _rel_link(target: Path, out_dir: Path) -> str | None:
    try:
        return Path(os.path.relpath(target.resolve(), out_dir.resolve())).as_posix()
    except ValueError:
        return None


def _runs_table(runs: list[Run], out_dir: Path) -> str:
    if not runs:
        return "<p>No run folder found yet (a run folder holds a <code>meta.json</code>).</p>"
    rows = []
    for r in runs:
        link = _rel_link(r.path, out_dir)
        name = f'<a href="{_e(link)}/">{_e(r.name)}</a>' if link else _e(r.name)
        if r.reference:
            name += ' <span class="ref">reference</span>'
        if r.error:
            status = f"<span title='{_e(r.error)}'>unreadable meta.json</span>"
        else:
            status = "finished" if r.finished else "unfinished"
            failures = (r.meta or {}).get("failures") or []
            if failures:
                status = (f"<span title='{_e('; '.join(map(str, failures)))}'>{status}, "
                          f"{len(failures)} failed</span>")
        dur = f"{r.duration_s:.1f} s" if r.duration_s is not None else ""
        tables = ", ".join(_e(t) for t in r.tables) or '<span class="muted">none</span>'
        rows.append(
            f"<tr><td>{name}</td><td>{_e(r.device)}</td><td><code>{_e(r.git)}</code></td>"
            f"<td>{_e(r.started)}</td><td>{dur}</td><td>{status}</td><td>{tables}</td></tr>")
    return ("<table><thead><tr><th>run</th><th>device</th><th>git</th><th>started (UTC)</th>"
            "<th>duration</th><th>status</th><th>tables</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _paragraphs(text: str) -> str:
    parts = [p.strip() for p in text.split("\n\n") if p.strip()]
    return "".join(f"<p>{_e(p)}</p>" for p in parts)


def _section_html(s: StudySection) -> str:
    out = [f'<h2 id="{_e(s.name)}">{_e(s.name)}</h2>']
    if s.question:
        out.append(f"<p><em>{_e(s.question)}</em></p>")
    if s.error:
        out.append(f'<p>The summary failed:</p><pre class="error">{_e(s.error)}</pre>')
    out.append(_paragraphs(s.text))
    for fig in s.figures:
        out.append(f'<figure><img src="{_e(fig)}" alt="{_e(s.name)} figure"></figure>')
    if s.runs:
        out.append(f'<p class="muted">From runs: {_e(", ".join(s.runs))}</p>')
    return "\n".join(out)


def render_html(runs: list[Run], sections: list[StudySection], no_study: bool,
                results_dir: Path, out_dir: Path) -> str:
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
    for s in sections:
        body.append(_section_html(s))
    body.append("<h2>Runs</h2>")
    body.append(_runs_table(runs, out_dir))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>Workbench report</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
