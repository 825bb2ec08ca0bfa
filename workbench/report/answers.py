"""The page's first answers, each a table with its CSV: per family the configuration `workbench advise`
recommends for the phone photos mix (from the newest runs, named), and the newest engine audit."""
from __future__ import annotations

import re
from pathlib import Path

from .. import engines
from .html import esc, fold, href

ADVICE_MIX = "phone_photos"
ADVICE_INTRO = (f'Per family, "{ADVICE_MIX}" mix: the cheapest staging design right on every path, the time to '
                "embedding per image, the graph budgets (the newest vLLM's default grid, or the planner's where it "
                "beats that grid on held-out draws) and that release's options, each from the newest run that "
                "measured it. Other mixes and releases: "
                "<code>python -m workbench advise --preset P --mix M</code>.")
AUDIT_INTRO = ("Read statically by <code>python -m workbench audit</code>: per model class, where it normalizes, "
               "whether it captures its encoder in CUDA graphs, and the correctness matrix's verdict.")
EVIDENCE = re.compile(r"\s*\[([^,\]]+), ([^\]]+)\]$")     # Evidence.line's "[run, device]"
# the study section each column of the advice and placement tables comes from ("staging ...": cast_cost)
SOURCES = {"time to embedding, largest batch (run, device)": "encoder_latency", "eager": "correctness",
           "cudagraph": "correctness", "dp": "correctness", "host ms/image (saves)": "input_path",
           "MB/image shipped": "input_path", "request to embedding ms/image: eager / graph": "input_path",
           "norm fp32 MiB: eager / fused": "fp32_memory"}


def _source(column: str) -> str | None:
    return SOURCES.get(column) or ("cast_cost" if column.startswith("staging") else None)


def _table(df, sources=None) -> str:
    """An answer as an HTML table: each header linked to the study it comes from where ``sources`` names that
    study's run, each "... [run, device]" cell linked to its study, vLLM's options as code."""
    def head(c: str) -> str:
        if _source(c) not in (sources or {}):
            return f"<th>{esc(c)}</th>"
        run, device = sources[_source(c)]
        return f'<th><a href="#{_source(c)}" title="{esc(run)}, {esc(device)}">{esc(c)}</a></th>'

    def cell(column: str, v) -> str:
        text = "" if v != v else str(v)
        if column.startswith("vLLM"):
            return f"<td><code>{esc(text)}</code></td>"
        m = EVIDENCE.search(text)        # "... [run, device]": a link to the study it came from, the run in its title
        if m and _source(column):
            return (f'<td>{esc(text[:m.start()])} <a class="muted" href="#{_source(column)}" '
                    f'title="{esc(m[1])}, {esc(m[2])}">({esc(m[2])})</a></td>')
        return f"<td>{esc(text)}</td>"
    body = "".join("<tr>" + "".join(cell(c, v) for c, v in zip(df.columns, row)) + "</tr>"
                   for row in df.itertuples(index=False))
    return (f'<table class="answers"><thead><tr>{"".join(head(c) for c in df.columns)}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _placements_html(presets: list[str], results_dir: Path, csvs) -> str:
    """Each family's `advise_tables.placement_table` on the advice mix, folded under the advice: headers link to the
    study they come from, with the run in their title; the runs named below; each with its CSV."""
    from ..advise_tables import placement_table

    out, shown = [], 0
    for preset in presets:
        try:
            df = placement_table(preset, ADVICE_MIX, results_dir)
        except (ValueError, OSError, KeyError) as e:
            out.append(f'<p class="problem">{esc(preset)}: no placement table: {esc(e)}</p>')
            continue
        sources = df.attrs.get("sources", {})
        if not sources:
            out.append(f'<p class="muted">{esc(preset)} per placement: no run measured it yet (python -m '
                       f'workbench sweep --studies correctness,cast_cost,fp32_memory,input_path '
                       f'--set presets={esc(preset)}).</p>')
            continue
        shown += 1
        runs = " · ".join(f"{study}: {esc(run)} ({esc(dev)})" for study, (run, dev) in sources.items())
        out.append(f'<h4>{esc(preset)}, "{ADVICE_MIX}" mix</h4>{_table(df, sources)}<p class="muted">From '
                   f'{runs} · <a href="{href(csvs.write(df, "placements", preset))}">CSV</a></p>')
    if not out:
        return ""
    return fold("Per placement, each family: right on eager, graphs and dp; host time and bytes per image and what "
                 "they save against the CPU processor; staging per replay; the norm's fp32 pool bytes; request to "
                 f"embedding ({shown} of {len(presets)} families measured)", "".join(out), anchor="placements")


def _audit_html(results_dir: Path, csvs) -> str:
    """The newest saved engine audit: the classes that normalize on the device in a table, the others named."""
    import pandas as pd

    from ..audit import AUDIT_COLUMNS, audit_row, load_newest

    skipped: list[str] = []
    data = load_newest(results_dir, skipped)
    passed = (f'<p class="muted">Saved audits not shown: {esc("; ".join(skipped))}.</p>' if skipped else "")
    if data is None:
        return passed and f'<h2 id="audit">Engine audit</h2>{passed}'
    models = data["models"]
    audit = pd.DataFrame([audit_row(m) for m in models], columns=AUDIT_COLUMNS)
    # a class name defined in several files (a release's per-vendor copies) names its file
    twice = audit["model"].duplicated(keep=False)
    audit.loc[twice, "model"] = [f"{r} ({m.get('file')})" for r, m in zip(audit["model"][twice],
                                                                       (models[i] for i in audit.index[twice]))]
    csv = csvs.write(audit, "audit")
    device = audit[audit["device norm"] == "yes"]
    cpu = [str(m) for m in audit["model"][~audit.index.isin(device.index)]]
    tally = ", ".join(f"{n} in the {w}" for w, n in device["norm in"].value_counts().items())
    wrong = int(device["verdict"].str.startswith("WRONG").sum())
    title = f"{data.get('engine')} {data.get('version')} ({data.get('source')})"
    out = [f'<h2 id="audit">Engine audit: {esc(title)}</h2><p class="muted">{AUDIT_INTRO}</p>',
           f"<p>{len(audit)} model classes: {len(device)} normalize on the device ({esc(tally)}), "
           f"{len(cpu)} on the CPU; {wrong} in the silent-wrong cell (outer norm with encoder graphs).</p>",
           fold(f"The {len(device)} device-normalizing classes, each with its verdict",
                 f'{_table(device)}<p class="muted"><a href="{href(csv)}">CSV</a></p>')]
    if cpu:
        out.append(fold(f"The {len(cpu)} CPU-normalizing classes (right on every path)",
                         f'<p class="muted">{esc(", ".join(cpu))}.</p>'))
    return "".join(out) + passed


def answers_html(results_dir: Path, csvs, studies: bool) -> str:
    """Where to normalize each family and the engine options to take (where studies exist), then the engine
    audit; each table's CSV written through ``csvs``."""
    out = ""
    if studies:
        from ..advise_tables import advice_table, family_presets

        presets = family_presets()
        placements = _placements_html(presets, results_dir, csvs)
        advice = advice_table(presets, ADVICE_MIX, results_dir)
        measured = advice.pop("measured").astype(bool)
        csv = csvs.write(advice, "advice")                     # the commands that would measure it: CSV, advise
        shown = advice.replace(r": python -m workbench [^;]*", "", regex=True)
        pending = "; ".join(f"{esc(r['preset'])} ({esc(r['placement, norm, buffer'])})"
                            for _, r in shown[~measured].iterrows())       # one line, not a row of blanks
        out = ('<h2 id="advice">Where to normalize, and the engine options to take</h2>'
               f'<p class="muted">{ADVICE_INTRO} The engine modelled: '
               f'{esc(engines.get(engines.NEWEST).describe())}.</p>'
               f'{_table(shown[measured])}<p class="muted">'
               + (f"No run measured yet: {pending}. " if pending else "")
               + "The commands that measure what is missing: <code>python -m workbench advise --preset P</code> · "
               + f'<a href="{href(csv)}">CSV</a></p>{placements}')
    return out + _audit_html(results_dir, csvs)
