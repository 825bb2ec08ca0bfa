"""The committed benchmarks (``results/reference/*.json``), drawn by the benchmarks that registered
themselves (workbench.benchmarks; this module names none), and the key findings: the opening of
each study's and benchmark's newest finding per device."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..files import read_regular
from .runs import REFERENCE_DIRNAME, _one_line, _why
from .views import StudySection, _figure_runs, _figures_in, _runs_words, _slug, is_cpu


@dataclass
class BenchmarkSection:
    """A registered benchmark (workbench.benchmarks) and its committed result files, drawn;
    each panel's ``figures`` are paths relative to the report folder."""

    name: str
    title: str
    panels: list[Any] = field(default_factory=list)     # workbench.benchmarks.BenchmarkPanel
    note: str = ""                  # one line when there is nothing to show
    svgs: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)


def benchmark_sections(results_dir: Path | str, out_dir: Path,
                       benchmarks: Mapping[str, Any] | None = None) -> list[BenchmarkSection]:
    """Every registered benchmark (`workbench.benchmarks.discover`) with its committed result
    files: each ``<results_dir>/reference/*.json`` whose object has ``"benchmark": <name>`` is
    drawn by that benchmark's summarize into ``<out_dir>/<name>/``; a file named like the
    benchmark's ``files`` that is not JSON shows its error there."""
    import fnmatch

    from ..benchmarks import BenchmarkPanel, discover

    benchmarks = discover() if benchmarks is None else benchmarks
    ref = Path(results_dir) / REFERENCE_DIRNAME
    files = sorted(ref.glob("*.json")) if ref.is_dir() else []
    out_dir = Path(out_dir).resolve()
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
                what = own.get(Path(f).name) or f"{bench.title}: {_figure_runs(f, _slug(Path(path).stem), [])[0]}"
                sec.captions[f] = (f"{what}; {panel.device or 'unknown device'}, {panel.date}, from "
                                   f"{REFERENCE_DIRNAME}/{panel.source}.")
            sec.panels.append(panel)
        if not sec.panels:
            sec.note = bench.missing
        sections.append(sec)
    return sections


KEY_FINDING_CHARS = 300              # a key finding: the finding's opening sentences, about this long


def _first_paragraph(text: str) -> str:
    """The finding's first paragraph, cut after the sentence that passes KEY_FINDING_CHARS (the
    whole finding is in its section)."""
    first = next((p.strip() for p in text.split("\n\n") if p.strip()), "")
    if len(first) <= KEY_FINDING_CHARS:
        return first
    ends = [m.end() for m in re.finditer(r"[.:;] (?=[A-Z(])", first)]
    cut = next((e for e in ends if e >= KEY_FINDING_CHARS * 3 // 4), None)
    if cut is None or cut > 2 * KEY_FINDING_CHARS:
        cut = first.rfind(" ", 0, KEY_FINDING_CHARS) + 1 or KEY_FINDING_CHARS
    return first[:cut].rstrip(" ;:") + " …"



def key_findings(sections: list[StudySection], benchmarks: list[BenchmarkSection] = ()) -> dict[str, list[tuple[str, str, str]]]:
    """{device: [(section anchor, source, first paragraph of its newest finding)]}, GPUs first
    (each in the order its sections come), CPUs after."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for s in sections:
        for v in s.views:
            if v.kind != "newest" or v.error:
                continue
            # one paragraph per tower where the study measures each on its own (one per family)
            paragraphs = [p for p in v.text.split("\n\n") if p.strip()] if s.per_preset else [v.text]
            # a tower's paragraph names its own run: no list of the view's runs before it
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
