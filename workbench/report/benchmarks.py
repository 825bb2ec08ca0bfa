"""The committed benchmarks (``results/reference/*.json``), drawn by the benchmarks that registered
themselves (workbench.benchmarks; this module names none), and the key findings: the opening of each
study's and benchmark's newest finding per device."""
from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import read_regular
from .runs import REFERENCE_DIRNAME, _one_line, _why
from .views import StudySection, _figure_runs, _figures_in, _runs_words, _slug, is_cpu

KEY_FINDING_CHARS = 300              # a key finding: the finding's opening sentences, about this long


@dataclass
class BenchmarkSection:
    """A registered benchmark and its committed result files, drawn (figures relative to the report folder)."""

    name: str
    title: str
    panels: list[Any] = field(default_factory=list)     # workbench.benchmarks.BenchmarkPanel
    note: str = ""                  # one line when there is nothing to show
    svgs: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)


def benchmark_sections(results_dir: Path | str, out_dir: Path,
                       benchmarks: Mapping[str, Any] | None = None) -> list[BenchmarkSection]:
    """Each ``<results_dir>/reference/*.json`` holding ``"benchmark": <name>`` drawn by that benchmark's
    summarize into ``<out_dir>/<name>/``; a file named like its ``files`` that is not JSON shows its error."""
    from ..benchmarks import BenchmarkPanel, discover

    benchmarks = discover() if benchmarks is None else benchmarks
    ref = Path(results_dir) / REFERENCE_DIRNAME
    files = sorted(ref.glob("*.json")) if ref.is_dir() else []
    sections = []
    for bench in sorted(benchmarks.values(), key=lambda b: (b.order, b.name)):
        sec = BenchmarkSection(name=bench.name, title=bench.title)
        for path in files:
            try:
                doc = json.loads(read_regular(path).decode("utf-8"))
            except (OSError, ValueError, RecursionError) as e:   # cannot tell what it holds: say so
                if fnmatch.fnmatch(path.name, bench.files):
                    sec.panels.append(BenchmarkPanel(
                        source=path.name, error=_one_line(f"{path.name}: unreadable JSON ({_why(e)})")))
                continue
            if not isinstance(doc, dict) or doc.get("benchmark") != bench.name:
                continue
            fig_dir = out_dir / _slug(bench.name)
            panel = bench.summarize(path, doc, fig_dir)
            try:
                panel.figures, svgs = _figures_in(panel.figures, fig_dir, out_dir)
            except (OSError, ValueError) as e:
                panel.figures, svgs, panel.error = [], {}, _one_line(f"{path.name}: {_why(e)}")
            sec.svgs.update(svgs)
            own = getattr(panel, "captions", None) or {}
            for f in panel.figures:
                what = own.get(Path(f).name) or f"{bench.title}: {_figure_runs(f, _slug(path.stem), [])[0]}"
                sec.captions[f] = (f"{what}; {panel.device or 'unknown device'}, {panel.date}, from "
                                   f"{REFERENCE_DIRNAME}/{panel.source}.")
            sec.panels.append(panel)
        if not sec.panels:
            sec.note = bench.missing
        sections.append(sec)
    return sections


def _first_paragraph(text: str) -> str:
    """The first paragraph, cut after the sentence that passes KEY_FINDING_CHARS."""
    first = next((p.strip() for p in text.split("\n\n") if p.strip()), "")
    if len(first) <= KEY_FINDING_CHARS:
        return first
    ends = [m.end() for m in re.finditer(r"[.:;] (?=[A-Z(])", first)]
    cut = next((e for e in ends if e >= KEY_FINDING_CHARS * 3 // 4), None)
    if cut is None or cut > 2 * KEY_FINDING_CHARS:
        cut = first.rfind(" ", 0, KEY_FINDING_CHARS) + 1 or KEY_FINDING_CHARS
    return first[:cut].rstrip(" ;:") + " …"


def key_findings(sections: list[StudySection],
                 benchmarks: list[BenchmarkSection] = ()) -> dict[str, list[tuple[str, str, str]]]:
    """{device: [(section anchor, source, opening of its newest finding)]}, GPUs first, CPUs after."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for s in sections:
        for v in (v for v in s.views if v.kind == "newest" and not v.error):
            # a per-preset study: one paragraph per tower, each naming its own run
            paragraphs = [p for p in v.text.split("\n\n") if p.strip()] if s.per_preset else [v.text]
            source = "" if s.per_preset else _runs_words(v.runs)
            for p in paragraphs:
                if _first_paragraph(p):
                    out.setdefault(v.device, []).append((s.name, source, _first_paragraph(p)))
    for b in benchmarks:
        for p in b.panels:
            if not p.error and _first_paragraph(p.text):
                out.setdefault(p.device, []).append((b.name, f"{REFERENCE_DIRNAME}/{p.source}",
                                                     _first_paragraph(p.text)))
    return dict(sorted(out.items(), key=lambda kv: is_cpu(kv[0])))
