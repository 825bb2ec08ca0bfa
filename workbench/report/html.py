"""The page, rendered at the end from the views: every value from a file HTML-escaped, every link
percent-encoded."""
from __future__ import annotations

import html
import re
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from ..provenance import is_cpu, iso_utc
from ..results import RunFolder, run_in_use
from ..notebook_path import strip_loading_styles
from ..results import ERRATA_NAME, REFERENCE_DIRNAME, Run
from .views import COMPARE_ROWS, BenchmarkSection, StudySection, View, runs_words, key_findings

NO_STUDY_MESSAGE = ("no study exists yet: no module in workbench/studies/ registers one, "
                    "so there is nothing to sweep or summarize")
CPU_NOTE = ("CPU smoke test: its verdicts, memory models and planner padding hold on any machine; its "
            "timings are not measurements")
SHOWN_FIGURES = 2                    # figures of a view's first group shown; the rest are folded
TABLE_OPEN_ROWS = 8                  # a key-number table with more rows than this starts folded
CSS = Path(__file__).with_name("page.css")     # package data (pyproject.toml), read at each render
REPORT_TITLE = "Workbench report"             # the <title> of index.html


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def href(rel: str) -> str:
    """A relative link for an attribute: percent-encoded (always a path, never a scheme), then HTML-escaped."""
    return esc(urllib.parse.quote(rel, safe="/"))


def _link(rel: str | None, text: str) -> str:
    return f'<a href="{href(rel)}">{esc(text)}</a>' if rel else esc(text)


def _n(count: int, thing: str) -> str:
    """'1 run', '2 runs', '0 runs'."""
    return f"{count} {thing}{'s' * (count != 1)}"


def _items(lines: list[str]) -> str:
    return "".join(f"<li>{esc(line)}</li>" for line in lines)


def _paragraphs(text: str) -> str:
    return "".join(f"<p>{esc(p.strip())}</p>" for p in text.split("\n\n") if p.strip())


def fold(summary: str, body: str, cls: str = "fold", anchor: str = "") -> str:
    """``body`` folded under ``summary`` (both HTML already), ``anchor`` its id where given."""
    anchor = f' id="{anchor}"' if anchor else ""
    return f'<details class="{cls}"{anchor}><summary>{summary}</summary>{body}</details>'


def newest_first(runs: list[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.started, r.name), reverse=True)


def _status(r: Run, bad: list[str]) -> str:
    """The status cell of a run: why it is unusable, or finished/unfinished with what it records."""
    odd = [n for n in r.skipped if n.endswith(".ipynb")]     # its stages are read from its notebooks
    if r.error:
        status = f"<span class='problem'>{esc(r.error)}</span>"
    else:
        if r.meta.finished_at:
            status = "finished"
        elif run_in_use(r.path):
            status = "in progress"
        elif odd:
            status = f"interrupted (its stages are not read: {esc(', '.join(odd))}: not a regular file)"
        else:
            status = (f"interrupted (left: {esc(RunFolder(r.path).state(r.meta).describe_left())}): finish it with "
                      f"<code>python -m workbench sweep --resume {esc(r.name)}</code> (make report resumes it "
                      "when the code is the same)")
        if r.shard:
            status += f", shard {esc(r.shard['index'])}/{esc(r.shard['count'])} of {esc(r.shard['group'])}"
        if r.meta.placement:
            status += ", " + esc("; ".join(f"{k} on GPU {v.get('gpu')} ({v.get('seconds')} s)"
                                          for k, v in r.meta.placement.items()))
        if r.meta.resumed:
            parts = "; ".join(f"{', '.join(x.get('studies') or [])} at {x.get('at') or '?'}" for x in r.meta.resumed)
            status += f", resumed ({esc(parts)})"
        failures = r.meta.open_failures()
        if failures:
            status = (f"<span class='problem'>{status}, {len(failures)} failed</span> (reasons below; re-run "
                      f"them with <code>python -m workbench sweep --resume {esc(r.name)}</code>)")
    if r.skipped:
        status += f", <span class='problem'>{_n(len(r.skipped), 'file')} not read (below)</span>"
    if bad:
        status += f", <span class='problem' title='{esc('; '.join(bad))}'>{_n(len(bad), 'table')} unreadable</span>"
    return status


def _runs_table(runs: list[Run], table_problems: Mapping[str, list[str]],
                links: Mapping[tuple[str, str], str], csv: str) -> str:
    """Every run folder, newest first, folded; what could not be used, failed or warned stays visible below."""
    if not runs:
        return "<p>No run folder found yet (a run folder holds a <code>meta.json</code>).</p>"
    rows = []
    for r in newest_first(runs):
        name = _link(links.get((r.name, "meta.json")), r.name)      # its copied meta.json
        name += ' <span class="ref">reference</span>' if r.reference else ""
        dur = f"{r.meta.duration_s:.1f} s" if r.meta.duration_s is not None else ""
        tables = ", ".join(_link(links.get((r.name, t)), t) for t in r.tables) or '<span class="muted">none</span>'
        rows.append(f"<tr><td>{name}</td><td>{esc(r.device)}</td><td><code>{esc(r.meta.git_label)}</code></td>"
                    f"<td>{esc(r.started)}</td><td>{dur}</td><td>{_status(r, table_problems.get(r.name) or [])}"
                    f"</td><td>{tables}</td></tr>")
    problems = [f"{r.name}: {r.error}" for r in runs if r.error]
    problems += [f"{r.name}: {n}: {why}; not read or copied" for r in runs for n, why in r.skipped.items()]
    problems += [f"{name}: {line}" for name, lines in table_problems.items() for line in lines]
    failed = [f"{r.name}: {f}" for r in runs if not r.error for f in r.meta.open_failures()]
    listing = "".join(f"<p class='problem'>{head}</p><ul class='problem'>{_items(lines)}</ul>" for head, lines in (
        ("Run folders and tables the report could not use:", problems), ("Studies that failed in a run:", failed))
        if lines)
    warned = [f"{r.name}: {w}" for r in runs for w in r.meta.all_warnings()]
    if warned:                       # not problems of the page: one click away
        listing += (f"<details class='fold'><summary>Warnings runs recorded ({len(warned)})</summary>"
                    f"<ul>{_items(warned)}</ul></details>")
    summary = (f"{_n(len(runs), 'run folder')} ({sum(r.reference for r in runs)} reference), "
               "newest first: device, commit, status, tables (each run's name opens its meta.json)")
    head = "".join(f"<th>{h}</th>" for h in ("run", "device", "git", "started (UTC)", "duration", "status", "tables"))
    return fold(f'{esc(summary)} · <a href="{href(csv)}">CSV</a>',
                 f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>") + listing


def _table_html(df) -> str:
    """A small DataFrame as an HTML table: three significant digits, n/a for missing values."""
    def fmt(v):
        return (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}") if isinstance(v, float) else v

    return df.to_html(index=False, border=0, classes="data", na_rep="n/a", escape=True,
                      formatters={c: fmt for c in df.columns if df[c].dtype.kind == "f"})


def _figures_html(figs: list[str], svgs: Mapping[str, str], captions: Mapping[str, str], alt: str) -> str:
    """Each figure: its PNG (a link to itself at full size), its caption and its SVG where one was saved."""
    out = []
    for f in figs:
        bits = [esc(captions[f])] if captions.get(f) else []
        bits += [f'<a href="{href(svgs[f])}">SVG</a>'] if svgs.get(f) else []
        cap = f"<figcaption>{' · '.join(bits)}</figcaption>" if bits else ""
        out.append(f'<figure><a href="{href(f)}"><img src="{href(f)}" alt="{esc(alt)}"></a>{cap}</figure>')
    return f'<div class="figs">{"".join(out)}</div>' if figs else ""


def _tables_html(tables: list[tuple[str, Any, str]]) -> str:
    out = []
    for caption, df, csv in tables:
        head = f'<span class="caption">{esc(caption)}</span> · <a href="{href(csv)}">CSV</a>'
        if len(df) > TABLE_OPEN_ROWS or len(tables) > 1:
            out.append(fold(head, _table_html(df), "tablebox"))
        else:
            out.append(f'<div class="tablebox"><p>{head}</p>{_table_html(df)}</div>')
    if len(tables) > 1:     # one per tower or run: one fold holding each table's own fold
        return fold(f'<span class="caption">Key numbers: {len(tables)} tables (one per tower or run), each with its '
                     "CSV</span>", "".join(out), "tablebox")
    return "".join(out)


def view_body(name: str, v: View) -> str:
    """A view's error, errata, finding, tables and figures (the first group's shown, the other groups folded)."""
    out = [f'<p>The summary failed:</p><pre class="error">{esc(v.error)}</pre>'] if v.error else []
    # folded to its red line: the page shows every known problem, a click its words
    out += [fold(f"<b>Known problem</b> (found after the run; reference/{ERRATA_NAME})", esc(note), "errata")
            for note in v.errata]
    groups: dict[str, list[str]] = {}
    for f in v.figures:
        groups.setdefault(v.groups.get(f, ""), []).append(f)
    (_, first), *rest = list(groups.items()) or [("", [])]
    alt = f"{name} figure"
    # shown: the lead paragraph, the tables, the first SHOWN_FIGURES figures; the rest one click away
    paras = [p for p in v.text.split("\n\n") if p.strip()]
    opening = re.search(r"^.{120,320}?[.;] (?=[A-Z])", paras[0], flags=re.S) if paras else None
    if opening:                      # the lead's opening sentence shown, the whole paragraph folded with the rest
        paras = [opening[0].rstrip(" ;")] + paras
    out += [_paragraphs("\n\n".join(paras[:1])), _tables_html(v.tables),
            _figures_html(first[:SHOWN_FIGURES], v.svgs, v.captions, alt)]
    more, figs = paras[1:], first[SHOWN_FIGURES:]
    parts = [_n(len(more), "more paragraph") if more else "", _n(len(figs), "more figure") if figs else ""]
    hidden = _paragraphs("\n\n".join(more)) + _figures_html(figs, v.svgs, v.captions, alt)
    if rest:                         # the other groups (runs, towers): in the same fold, a heading each
        hidden += "".join(f"<h4>{esc(label or 'the other runs')} ({len(figs)})</h4>"
                          f"{_figures_html(figs, v.svgs, v.captions, alt)}" for label, figs in rest)
        labels = ", ".join(label or "the other runs" for label, _ in rest)
        labels = f": {labels}" if len(labels) <= 60 else " (towers or runs)"     # long lists inside only
        parts.append(f"figures of {_n(len(rest), 'other group')}{labels}")
    what = ", ".join(x for x in parts if x)
    if what:
        out.append(fold(esc(what[:1].upper() + what[1:]), hidden))
    return "".join(out)


def _view_html(name: str, v: View) -> str:
    if v.kind == "older":
        changed = sum(1 for d in v.diffs if " verdicts differ from " in d)
        diffs = (f"<p class='muted'>Against the newest:</p><ul class='diffs'>{_items(v.diffs)}</ul>"
                 if v.diffs else "")
        what = (f"{changed} of {len(v.diffs)} with verdicts that differ from the newest; " if v.diffs else "")
        return fold(f"Older runs on {esc(v.device)}: {len(v.runs)} ({esc(what)}their verdicts, findings and figures)",
                     f"<p class='muted'>{esc(runs_words(v.runs))}</p>{diffs}{view_body(name, v)}")
    head = f"{esc(v.device)}: newest {esc(runs_words(v.runs))}"
    short = f"{esc(v.device)}: newest run{'s' * (len(v.runs) > 1)} ({len(v.runs)})"
    if v.folded:
        return fold(f'<span class="cpu">CPU</span> {head}. {esc(CPU_NOTE)}.', view_body(name, v))
    note = f"<p class='muted'>{esc(CPU_NOTE)}.</p>" if is_cpu(v.device) else ""
    return f'<h3 title="{esc(runs_words(v.runs))}">{short}</h3>{note}{view_body(name, v)}'


def _section_html(s: StudySection) -> str:
    out = [f'<h2 id="{esc(s.name)}">{esc(s.name)}</h2>']
    out += [f"<p><em>{esc(s.question)}</em></p>"] if s.question else []
    if s.error and not any(v.error for v in s.views):
        out.append(f'<p>The summary failed:</p><pre class="error">{esc(s.error)}</pre>')
    out += [_view_html(s.name, v) for v in s.views] or [_paragraphs(s.text)]
    # one line: the runs behind the section and the newest run against the one before it
    heads = [f"from {_n(len(s.runs), 'run')}"] if s.runs else []
    bodies = [f"<p>{esc(', '.join(s.runs))}</p>"] if s.runs else []
    flagged = []
    for c in s.comparisons:
        heads.append(f"compared on {esc(c.device)} with the run before: {_n(c.flagged, 'flagged value')} "
                     f'(<a href="{href(c.csv)}">CSV of every value</a>)')
        bodies.append(f"<p>{esc(c.device)}: {esc(c.line)}</p>")
        if c.table is not None:       # set where values were flagged
            first = f" (first {COMPARE_ROWS})" if c.flagged > COMPARE_ROWS else ""
            flagged.append(fold(f'The {_n(c.flagged, "flagged value")}{first}',
                                 f'<div class="tablebox">{_table_html(c.table)}</div>'))
    out += [f'<p class="problem">{esc(line)}</p>' for line in s.table_problems]
    out += [f'<p class="muted">No {esc(s.name)} data for {esc(dev)}.</p>' for dev in s.missing_devices]
    if heads:
        line = " · ".join(heads)
        out.append(f"<details class='muted'><summary>{line[:1].upper() + line[1:]}</summary>{''.join(bodies)}"
                   "</details>")
    out += flagged
    return "\n".join(out)


def _benchmark_html(b: BenchmarkSection) -> str:
    out = [f'<h2 id="{esc(b.name)}">{esc(b.title)}</h2>']
    out += [f'<p class="muted">{esc(b.note)}</p>'] if b.note else []
    for p in b.panels:
        if len(b.panels) > 1:
            out.append(f"<h3>{esc(p.device or p.source)}{', ' + esc(p.date) if p.date else ''}</h3>")
        if p.error:
            out.append(f'<p class="problem">{esc(p.error)}</p>')
        out.append(_paragraphs(p.text))
        if p.figures:                # a committed benchmark: its figures one click away
            out.append(fold(_n(len(p.figures), "figure"),
                             _figures_html(p.figures, b.svgs, b.captions, f"{b.title}, {p.device}")))
        if not p.error:
            out.append(f'<p class="muted">From <code>{esc(REFERENCE_DIRNAME)}/{esc(p.source)}</code>.</p>')
    return "\n".join(out)


def _key_findings_html(keys: Mapping[str, list[tuple[str, str, str]]]) -> str:
    """One list per device (the CPU's folded beside a GPU's): each study's newest finding in a sentence."""
    if not keys:
        return ""
    out = []
    gpu = any(not is_cpu(d) for d in keys)
    for dev, items in keys.items():
        lis = "".join(f'<li><a href="#{href(anchor)}">{esc(anchor)}</a>: {esc(text)}'
                      + (f' <span class="muted">({esc(src)})</span>' if src else "") + "</li>"
                      for anchor, src, text in items)
        if is_cpu(dev) and gpu:
            out.append(f'<details><summary><span class="cpu">CPU</span> {esc(dev)}: {esc(CPU_NOTE)}.</summary>'
                       f"<ul>{lis}</ul></details>")
        else:
            out.append(f"<h3>{esc(dev)}</h3><ul>{lis}</ul>")
    n = sum(len(items) for items in keys.values())
    return fold(f'<span class="caption">Key findings: the newest run per device, one sentence each ({n}, each linked '
                 "to its study)</span>", "".join(out), "keys", "key-findings")


def render_html(runs: list[Run], sections: list[StudySection], no_study: bool, results_dir: Path,
                benchmarks: list[BenchmarkSection], table_problems: Mapping[str, list[str]],
                links: Mapping[tuple[str, str], str], runs_csv: str, notes: list[str], answers: str = "") -> str:
    """The page. ``notes``: what the whole page lacks and why (a broken errata file), shown first. Its style
    elements pass the notebook copies' check (notebook_path.strip_loading_styles): the page claims nothing loads from
    elsewhere, and page.css is a file anyone may edit."""
    body = [
        "<h1>Vision-encoder input-normalization workbench: report</h1>",
        f'<p class="muted">Built {esc(iso_utc(timespec="seconds"))} from <code>{esc(results_dir)}</code>: '
        f"{len(runs)} run folder(s), {sum(r.reference for r in runs)} of them reference runs. "
        "Newest run per device first; older runs and CPU smoke tests are folded. This folder holds "
        "everything the page links, so it can be zipped and shared.</p>",
        *(f'<p class="problem">{esc(n)}</p>' for n in notes),
    ]
    if no_study:
        body.append(f'<p class="notice"><strong>{esc(NO_STUDY_MESSAGE[0].upper() + NO_STUDY_MESSAGE[1:])}.</strong> '
                    "Study modules register themselves in <code>workbench/studies/</code>; "
                    "once one exists, <code>make report</code> runs it and summarizes it here.</p>")
    toc = ['<a href="#advice">where to normalize</a>'] if 'id="advice"' in answers else []
    toc += ['<a href="#audit">engine audit</a>'] if 'id="audit"' in answers else []
    toc += ['<a href="#key-findings">key findings</a>'] if sections or benchmarks else []
    toc += [f'<a href="#{href(s.name)}">{esc(s.name)}</a>' for s in sections]
    toc += [f'<a href="#{href(b.name)}">{esc(b.name.replace("_", " "))}</a>' for b in benchmarks]
    toc.append('<a href="#runs">runs</a>')
    body.append(f'<p class="toc">Sections: {" · ".join(toc)}</p>')
    body.append(answers)             # the answers first: what to configure, and the engine's own code
    body.append(_key_findings_html(key_findings(sections, benchmarks)))
    body += [_section_html(s) for s in sections] + [_benchmark_html(b) for b in benchmarks]
    body += ['<h2 id="runs">Runs</h2>', _runs_table(runs, table_problems, links, runs_csv)]
    page = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{REPORT_TITLE}</title><style>\n{CSS.read_text(encoding='utf-8')}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    return strip_loading_styles(page)     # every style element, the page's own CSS too, loads nothing
