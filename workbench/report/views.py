"""What the page shows, as data: per study a `View` per device of its newest and its older runs, each summarized
by the study, and the newest run against the one before; the committed benchmarks; the key findings."""
from __future__ import annotations

import fnmatch
import json
import re
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Mapping

from ..csvsafe import safe_csv
from ..files import read_regular
from ..provenance import is_cpu
from ..results import slug
from ..results import REFERENCE_DIRNAME, Run, TableProblem, file_problem, one_line, reference_files, study_table, why_unreadable

COMPARE_ROWS = 12                    # flagged rows shown per comparison (all of them in its CSV)
DIFF_CELLS = 8                       # changed verdict cells named per older run
KEY_FINDING_CHARS = 160              # a key finding: the finding's opening sentence, about this long
_slug = partial(slug, empty="x")


@dataclass
class View:
    """One summarize call: a device's newest run(s) ("newest", per family) or its older runs ("older")."""
    kind: str
    device: str
    runs: list[str]
    text: str = ""
    figures: list[str] = field(default_factory=list)    # paths relative to the report folder
    svgs: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)   # figure -> what it shows, which run
    groups: dict[str, str] = field(default_factory=dict)     # figure -> its group (a run, a tower of it)
    tables: list[tuple[str, Any, str]] = field(default_factory=list)   # (caption, DataFrame, CSV file)
    diffs: list[str] = field(default_factory=list)      # older views: verdicts against the newest
    error: str | None = None
    folded: bool = False
    errata: list[str] = field(default_factory=list)     # known problems of its runs (errata.json)


@dataclass
class Comparison:
    """The newest run of a study on one device against the run before it (workbench.compare)."""
    device: str
    newer: str
    older: str
    line: str                       # what changed, in one line
    table: Any = None               # DataFrame of the flagged rows (at most COMPARE_ROWS)
    csv: str = ""                   # every compared value, relative to the report folder
    flagged: int = 0


@dataclass
class StudySection:
    name: str
    question: str
    runs: list[str]
    text: str = ""                  # the lead view's finding (newest GPU run, else newest CPU run)
    figures: list[str] = field(default_factory=list)    # every view's, relative to the report folder
    error: str | None = None
    table_problems: list[str] = field(default_factory=list)   # "run X: table unreadable: ..."
    missing_devices: list[str] = field(default_factory=list)  # devices seen elsewhere, not here
    views: list[View] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    per_preset: bool = False        # its finding has a paragraph per tower (family): each is a key finding


@dataclass
class BenchmarkSection:
    """A registered benchmark and its committed result files, drawn (figures relative to the report folder)."""
    name: str
    title: str
    panels: list[Any] = field(default_factory=list)     # workbench.benchmarks.BenchmarkPanel
    note: str = ""                  # one line when there is nothing to show
    svgs: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)


def runs_words(runs: list[str]) -> str:
    return f"run{'s' if len(runs) > 1 else ''} {', '.join(runs)}"


def _figures_in(paths, base: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    """Figures (absolute or under ``base``) relative to ``root``, PNG shown and SVG linked; ValueError for a bad one."""
    rels: list[str] = []
    for fig in map(Path, paths):
        fig = fig if fig.is_absolute() else base / fig
        fig = fig.parent.resolve() / fig.name            # its folder's real place; the file itself not followed
        if file_problem(fig) or root not in fig.parents:
            raise ValueError(f"figure {fig} is missing, outside the report folder or not a regular file "
                             "(a link, a folder...): not shown")
        rel = fig.relative_to(root).as_posix()
        if rel not in rels:
            rels.append(rel)
    stems = {Path(r).with_suffix("").as_posix() for r in rels if not r.lower().endswith(".svg")}
    shown = [r for r in rels if not (r.lower().endswith(".svg") and Path(r).with_suffix("").as_posix() in stems)]
    svgs = {r: Path(r).with_suffix(".svg").as_posix() for r in shown
            if not r.lower().endswith(".svg") and file_problem(root / Path(r).with_suffix(".svg")) is None}
    return shown, svgs


def _figure_runs(fig: str, study: str, runs: list[str]) -> tuple[str, str | None]:
    """(what the figure shows, the run it belongs to) from its file name ``<stem>_<run>``."""
    stem = Path(fig).stem
    run = next((r for r in sorted(runs, key=len, reverse=True) if stem.endswith("_" + _slug(r))), None)
    if run is not None:
        stem = stem.removesuffix("_" + _slug(run))
    stem = stem.removeprefix(study)
    return " ".join(stem.replace("_", " ").replace("-", " ").split()), run


def _runs_newest_first(g, starts: Mapping[str, str]) -> list[str]:
    return sorted(map(str, g["run"].unique()), key=lambda r: (starts.get(r, ""), r), reverse=True)


def _verdict_diffs(study: str, older, newest, starts: Mapping[str, str]) -> list[str]:
    """One line per older run: its verdicts against the newest run's, "unchanged" or the cells that changed."""
    from ..compare import CompareError, compare_tables, verdict_changes

    if not (older["unit"] == "bool").any():
        return []
    ref = ", ".join(_runs_newest_first(newest, starts))
    lines = []
    for run in _runs_newest_first(older, starts):
        rows = older[older["run"].astype(str) == run]
        try:
            cmp = compare_tables(rows[rows["unit"] == "bool"], newest[newest["unit"] == "bool"], study=study)
        except CompareError as e:
            lines.append(f"{run}: not compared with {ref} ({e})")
            continue
        changed = verdict_changes(cmp) if len(cmp) else []
        if not len(cmp):
            lines.append(f"{run}: no verdict in common with {ref}")
        elif not changed:
            lines.append(f"{run}: unchanged ({len(cmp)} verdicts shared with {ref})")
        else:
            more = len(changed) - DIFF_CELLS
            more = f"; and {more} more (in the comparison CSV)" if more > 0 else ""
            lines.append(f"{run}: {len(changed)} of {len(cmp)} verdicts differ from {ref}: "
                         + "; ".join(changed[:DIFF_CELLS]) + more)
    return lines


@dataclass
class Csvs:
    """CSV files written beside the page, one per table shown, each name used once; every text cell neutralized
    against a spreadsheet running it as a formula (workbench.csvsafe), since the cells come from run folders."""
    root: Path
    used: set[str] = field(default_factory=set)

    def write(self, df, *parts: str) -> str:
        base = "-".join(_slug(str(p))[:48] for p in parts if str(p)) or "table"
        name, i = f"{base}.csv", 2
        while name in self.used:
            name, i = f"{base}-{i}.csv", i + 1
        self.used.add(name)
        safe_csv(df, self.root / name)
        return name


@dataclass
class Drawn:
    """What a study's summarize gave for one view, from the process that drew it or from the cache: its Summary
    (figures relative to the view's folder where they lie in it) and the files it wrote there, or its traceback."""
    summary: Any = None
    files: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def cacheable(self) -> bool:
        """Whether the entry holds all it drew: no failure, every figure in the view's folder."""
        return self.error is None and all(isinstance(f, str) and not f.startswith("/") and ".." not in f.split("/")
                                          for f in self.summary.figures)


def draw_view(study: Any, rows, fig_dir: Path) -> Drawn:
    """The study's summarize on a view's rows, its figures saved in ``fig_dir``: the only part of a section that
    draws (what a forked process does, what the cache keeps)."""
    from ..studies import Summary
    from .cache import files_under

    try:
        fig_dir.mkdir(parents=True, exist_ok=True)
        before = files_under(fig_dir)
        result = study.summarize(rows.reset_index(drop=True), fig_dir)
        result = Summary(text=result) if isinstance(result, str) else result
        figures = []
        for f in result.figures:
            f = Path(f)
            if f.is_absolute() and fig_dir in f.parents:
                f = f.relative_to(fig_dir)
            figures.append(f.as_posix())
        summary = Summary(text=result.text, figures=figures, tables=list(result.tables),
                          captions=dict(getattr(result, "captions", {})), groups=dict(getattr(result, "groups", {})))
        return Drawn(summary=summary, files=sorted(files_under(fig_dir) - before))
    except Exception:  # noqa: BLE001 - one view failing leaves the others
        return Drawn(error=traceback.format_exc())


def _apply_drawn(study: Any, view: View, drawn: Drawn, fig_dir: Path, out_dir: Path,
                 by_run: Mapping[str, Run], csvs: Csvs) -> None:
    """A view filled from what its summarize gave: its tables' CSVs written, each figure captioned (what it shows,
    device, run, start)."""
    if drawn.error:
        view.error = drawn.error
        return
    try:
        result = drawn.summary
        view.text = result.text
        view.tables = [(caption, df, csvs.write(df, study.name, view.device, view.kind, caption))
                       for caption, df in result.tables]
        view.figures, view.svgs = _figures_in(result.figures, fig_dir, out_dir)
        view.groups = {f: result.groups[Path(f).name] for f in view.figures if Path(f).name in result.groups}
        for f in view.figures:
            what, run = _figure_runs(f, study.name, view.runs)
            shows = result.captions.get(Path(f).name)         # what the study says it shows
            title = shows.rstrip(". ") if shows else f"{study.name}{': ' + what if what else ''}"
            if run is None:
                view.captions[f] = f"{title}, {view.device}, from {runs_words(view.runs)}."
                continue
            r = by_run[run]
            when = f", started {r.started[:16].replace('T', ' ')} UTC" if r.started else ""
            ref = ", reference run" if r.reference else ""
            cpu = " CPU smoke test: timings here are not measurements." if is_cpu(view.device) else ""
            view.captions[f] = f"{title}, {view.device}, run {run}{when}{ref}.{cpu}"
    except Exception:  # noqa: BLE001 - one view failing leaves the others
        view.error = traceback.format_exc()


def _compare(study: str, device: str, g, starts: Mapping[str, str]):
    """(the newest run on ``device`` against the newest earlier run sharing a value with it, every compared value)
    or None; the caller writes the values' CSV. A parameter column one of the two lacks is named in the line, the
    column saying which run has it (compare.column_lines); two runs too unlike to match are skipped, as one sharing
    nothing is."""
    from ..compare import CompareError, column_lines, compare_tables, summary_line

    newer, *order = _runs_newest_first(g, starts)
    for older in order:
        try:
            cmp = compare_tables(g[g["run"].astype(str) == older], g[g["run"].astype(str) == newer], study=study,
                                 names=(older, newer))
        except CompareError:
            continue
        if len(cmp):
            break
    else:
        return None
    differ = column_lines(cmp.attrs.get("columns_differ") or [])
    cmp = cmp.rename(columns={"a": older, "b": newer})
    flagged = cmp[cmp["flag"] != ""]
    c = Comparison(device=device, newer=newer, older=older, line=f"{newer} against {older}: {summary_line(cmp)}."
                   + "".join(f" {line[:1].upper() + line[1:]}." for line in differ), flagged=len(flagged))
    if len(flagged):
        show = flagged.drop(columns=["study"]).head(COMPARE_ROWS)
        c.table = show[[col for col in show.columns if not show[col].astype(str).isin(["", "-"]).all()]]
    return c, cmp


@dataclass
class SectionPlan:
    """A study's section before anything is drawn: its views in page order, each with the rows its summarize gets
    and the folder its figures go to (`draw_view`), and what `section_extras` compares."""
    study: Any
    section: StudySection
    table: Any = None                 # None: the section's text says why there is nothing to draw
    starts: dict[str, str] = field(default_factory=dict)
    by_run: dict[str, Run] = field(default_factory=dict)
    newest: Any = None                # mask of the table's newest rows per device (and family)
    order: list[str] = field(default_factory=list)          # devices, GPUs first
    views: list[tuple[View, Any, Path]] = field(default_factory=list)


def plan_section(study: Any, runs: list[Run], out_dir: Path, loaded: Mapping[tuple[str, str], Any],
                 problems: list[TableProblem], devices: set[str],
                 errata: Mapping[str, Mapping[str, str]]) -> SectionPlan:
    """A study's section to draw: per device a view of its newest run(s) and one of its older runs."""
    section = StudySection(name=study.name, question=getattr(study, "question", ""), runs=[],
                           per_preset=bool(getattr(study, "per_preset", False)), missing_devices=sorted(devices))
    plan = SectionPlan(study=study, section=section)
    if not any(study.name in r.tables for r in runs):
        section.text = "No run holds a table for this study yet (make sweep)."
        return plan
    try:
        table = study_table(study.name, runs, loaded=loaded)
        section.table_problems = [p.line for p in problems]
        if table is None:
            section.text = "No table of this study could be read."
            return plan
        section.runs = list(dict.fromkeys(table["run"].astype(str)))      # in the runs' order, as concatenated
        section.missing_devices = sorted(devices - {str(d) for d in table["device"].dropna().unique()})
        # logical run name -> its latest start time (a shard group's: its last shard's)
        starts = {r.logical_name: r.started for r in sorted(runs, key=lambda r: r.started)}
        keys = ["device"] + (["family"] if "family" in table.columns else [])     # newest: per device and family
        rank = table["run"].astype(str).map(lambda r: (starts.get(r, ""), r))
        newest = rank == rank.groupby([table[k] for k in keys], dropna=False, sort=False).transform("max")
        latest = {str(dev): max(starts.get(str(r), "") for r in g["run"].unique())
                  for dev, g in table.groupby("device", dropna=True, sort=False)}
        order = sorted(sorted(latest, key=lambda d: (latest[d], d), reverse=True), key=is_cpu)   # GPUs first
        for dev in order:
            on_dev = table["device"].astype(str) == dev
            for kind, rows in (("newest", table[on_dev & newest]), ("older", table[on_dev & ~newest])):
                if not len(rows):
                    continue
                view = View(kind=kind, device=dev, runs=_runs_newest_first(rows, starts),
                            folded=kind == "older" or (is_cpu(dev) and not is_cpu(order[0])))
                view.errata = [f"{run}: {errata[run][study.name]}" for run in view.runs
                               if study.name in errata.get(run, {})]
                plan.views.append((view, rows, out_dir / study.name / f"{_slug(dev)}-{kind}"))
        plan.table, plan.newest, plan.order = table, newest, order
        plan.starts = {r: s for r, s in starts.items() if r in set(section.runs)}
        plan.by_run = {r.logical_name: r for r in runs}
    except Exception:  # noqa: BLE001 - one broken study must not hide the others
        section.error = traceback.format_exc()
        plan.table, plan.views = None, []
    return plan


def section_extras(plan: SectionPlan) -> tuple[dict[int, list[str]], list]:
    """What a section compares: {view index: an older view's verdicts against the newest} and per device (GPUs
    first) the newest run against the one before it, as (Comparison, every compared value)."""
    table, name = plan.table, plan.study.name
    diffs = {}
    for i, (view, rows, _) in enumerate(plan.views):
        if view.kind == "older":
            on_dev = table["device"].astype(str) == view.device
            diffs[i] = _verdict_diffs(name, rows, table[on_dev & plan.newest], plan.starts)
    comparisons = [c for dev in plan.order
                   if (c := _compare(name, dev, table[table["device"].astype(str) == dev], plan.starts)) is not None]
    return diffs, comparisons


def finish_section(plan: SectionPlan, drawn: list[Drawn], extras: tuple | str, out_dir: Path,
                   csvs: Csvs) -> StudySection:
    """The section from its views' drawings and ``extras`` (`section_extras`, or the traceback of its failure), the
    CSVs written in page order: per device its views' tables, then its comparison."""
    section = plan.section
    if plan.table is None:
        return section
    try:
        diffs, comparisons = ({}, []) if isinstance(extras, str) else extras
        by_device = {c.device: (c, cmp) for c, cmp in comparisons}
        for dev in plan.order:
            for i, (view, _, fig_dir) in enumerate(plan.views):
                if view.device == dev:
                    view.diffs = diffs.get(i, [])
                    _apply_drawn(plan.study, view, drawn[i], fig_dir, out_dir, plan.by_run, csvs)
                    section.views.append(view)
            if dev in by_device:
                c, cmp = by_device[dev]
                c.csv = csvs.write(cmp, "compare", plan.study.name, dev)
                section.comparisons.append(c)
        section.error = next((v.error for v in section.views if v.error), None)
        section.text = next((v.text for v in section.views if not v.error), "")
        section.figures = [f for v in section.views for f in v.figures]
        if isinstance(extras, str):
            section.error = extras
    except Exception:  # noqa: BLE001 - one broken study must not hide the others
        section.error = traceback.format_exc()
    return section


def summarize(study: Any, runs: list[Run], out_dir: Path, loaded: Mapping[tuple[str, str], Any],
              problems: list[TableProblem], devices: set[str], csvs: Csvs,
              errata: Mapping[str, Mapping[str, str]]) -> StudySection:
    """A study's section, drawn here: `plan_section`, `draw_view` for each view, `section_extras`,
    `finish_section` (the report does the same, its views drawn side by side and kept in its cache)."""
    plan = plan_section(study, runs, out_dir, loaded, problems, devices, errata)
    drawn = [draw_view(study, rows, fig_dir) for _, rows, fig_dir in plan.views]
    try:
        extras = section_extras(plan) if plan.table is not None else ({}, [])
    except Exception:  # noqa: BLE001
        extras = traceback.format_exc()
    return finish_section(plan, drawn, extras, out_dir, csvs)


def benchmark_sections(results_dir: Path | str, out_dir: Path,
                       benchmarks: Mapping[str, Any] | None = None) -> list[BenchmarkSection]:
    """Each ``reference/*.json`` holding ``"benchmark": <name>`` drawn by that benchmark into ``<out_dir>/<name>/``."""
    from ..benchmarks import BenchmarkPanel, discover

    benchmarks = discover() if benchmarks is None else benchmarks
    files = reference_files(results_dir)
    sections = []
    for bench in sorted(benchmarks.values(), key=lambda b: (b.order, b.name)):
        sec = BenchmarkSection(name=bench.name, title=bench.title)
        for path in files:
            try:
                doc = json.loads(read_regular(path).decode("utf-8"))
            except (OSError, ValueError, RecursionError) as e:   # cannot tell what it holds: say so
                if fnmatch.fnmatch(path.name, bench.files):
                    sec.panels.append(BenchmarkPanel(
                        source=path.name, error=one_line(f"{path.name}: unreadable JSON ({why_unreadable(e)})")))
                continue
            if not isinstance(doc, dict) or doc.get("benchmark") != bench.name:
                continue
            fig_dir = out_dir / _slug(bench.name)
            panel = bench.summarize(path, doc, fig_dir)
            try:
                panel.figures, svgs = _figures_in(panel.figures, fig_dir, out_dir)
            except (OSError, ValueError) as e:
                panel.figures, svgs, panel.error = [], {}, one_line(f"{path.name}: {why_unreadable(e)}")
            sec.svgs.update(svgs)
            for f in panel.figures:
                what = panel.captions.get(Path(f).name) or f"{bench.title}: {_figure_runs(f, _slug(path.stem), [])[0]}"
                sec.captions[f] = (f"{what}; {panel.device or 'unknown device'}, {panel.date}, from "
                                   f"{REFERENCE_DIRNAME}/{panel.source}.")
            sec.panels.append(panel)
        sec.note = "" if sec.panels else bench.missing
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
    """{device: [(section anchor, source, opening of its newest finding)]}, GPUs first (per tower if per_preset)."""
    found = [(v.device, s.name, "" if s.per_preset else runs_words(v.runs), p)
             for s in sections for v in s.views if v.kind == "newest" and not v.error
             for p in ([p for p in v.text.split("\n\n") if p.strip()] if s.per_preset else [v.text])]
    found += [(p.device, b.name, f"{REFERENCE_DIRNAME}/{p.source}", p.text)
              for b in benchmarks for p in b.panels if not p.error]
    out: dict[str, list[tuple[str, str, str]]] = {}
    for device, anchor, source, text in found:
        if first := _first_paragraph(text):
            out.setdefault(device, []).append((anchor, source, first))
    return dict(sorted(out.items(), key=lambda kv: is_cpu(kv[0])))
