"""The page's first answers, each a table with its CSV: per family the configuration `workbench advise`
recommends for the phone photos mix (from the newest runs, named), and the newest engine audit."""
from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

ADVICE_MIX = "phone_photos"
ADVICE_INTRO = (f'Per family, "{ADVICE_MIX}" mix: the cheapest staging design right on every path, the time to '
                "embedding per image, the planner's budgets and padding against the engines' powers of two, and "
                "vLLM 0.33's --compilation-config, each from the newest run that measured it. Other mixes: "
                "<code>python -m workbench advise --preset P --mix M</code>.")
AUDIT_INTRO = ("Read statically by <code>python -m workbench audit</code>: per model class, where it normalizes, "
               "whether it captures its encoder in CUDA graphs, and the correctness matrix's verdict.")


EVIDENCE = re.compile(r"\s*\[([^,\]]+), ([^\]]+)\]$")     # Evidence.line's "[run, device]"
# the columns of the advice table and the study section each comes from
SOURCES = {"staging (run, device)": "cast_cost", "time to embedding, largest batch (run, device)": "encoder_latency"}


def family_presets() -> list[str]:
    """One real preset per family, the page's rows: the family's study preset, else its first real one."""
    from ..config import PRESETS, families

    out = []
    for family, spec in families().items():
        preset = spec.study_presets[1] or next((n for n, c in PRESETS.items() if c.family == family
                                                and not n.startswith("tiny-")), None)
        if preset is not None:
            out.append(preset)
    return out


def advice_frame(results_dir: Path):
    """One row per family's real preset: where to normalize, staging, budgets, padding, vLLM's options."""
    import pandas as pd

    from ..advise import advise

    rows = []
    for preset in family_presets():
        try:
            a = advise(preset, ADVICE_MIX, results_dir)
        except (ValueError, OSError) as e:
            rows.append({"preset": preset, "placement, norm, buffer": f"no advice: {e}"})
            continue
        rows.append({"preset": preset,
                     "placement, norm, buffer": ", ".join(a.choice) if a.choice else
                     "not measured: " + "; ".join(a.missing),
                     "staging (run, device)": a.staging.line(),
                     "time to embedding, largest batch (run, device)": _largest_batch(a.latency),
                     "planner budgets": str(a.budgets),
                     "items / graph": a.max_items, "padding, planner": f"{a.padding['planner']:.1%}",
                     "padding, powers of 2": f"{a.padding['engines']:.1%}",
                     "vLLM --compilation-config": json.dumps(a.compilation_config())})
    return pd.DataFrame(rows)


def _largest_batch(latency) -> str:
    """The advice's time to embedding of its largest batch (the page's column; advise prints them all)."""
    if latency is None:
        return ""
    if not latency.run:
        return latency.text
    return f"{latency.text.split('; ')[-1]} [{latency.run}, {latency.device}]"


# the placement table's columns and the study section each comes from
PLACEMENT_SOURCES = {"eager": "correctness", "cudagraph": "correctness", "dp": "correctness",
                     "host ms/image (saves)": "input_path", "MB/image shipped": "input_path",
                     "request to embedding ms/image: eager / graph": "input_path", "norm fp32 MiB: eager / fused":
                     "fp32_memory"}


def placement_frames(results_dir: Path) -> list:
    """Per family's preset (as `advice_frame`), `advise.placement_table` on the advice mix."""
    from ..advise import placement_table

    out = []
    for preset in family_presets():
        try:
            out.append((preset, placement_table(preset, ADVICE_MIX, results_dir)))
        except (ValueError, OSError, KeyError) as e:
            out.append((preset, str(e)))
    return out


def placements_html(frames: list[tuple[str, object, str]]) -> str:
    """Each family's per-placement table, folded under the advice: headers link to the study they come
    from, with the run in their title; the runs named below; each with its CSV."""
    out = []
    for preset, df, csv in frames:
        if isinstance(df, str):
            out.append(f'<p class="problem">{escape(preset)}: no placement table: {escape(df)}</p>')
            continue
        sources = df.attrs.get("sources", {})
        if not sources:
            out.append(f'<p class="muted">{escape(preset)} per placement: no run measured it yet (python -m '
                       f'workbench sweep --studies correctness,cast_cost,fp32_memory,input_path '
                       f'--set presets={escape(preset)}).</p>')
            continue

        def head(c: str) -> str:
            study = PLACEMENT_SOURCES.get(c) or ("cast_cost" if c.startswith("staging") else None)
            if study not in sources:
                return f"<th>{escape(c)}</th>"
            run, device = sources[study]
            return f'<th><a href="#{study}" title="{escape(run)}, {escape(device)}">{escape(c)}</a></th>'
        body = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>"
                       for row in df.itertuples(index=False))
        runs = " · ".join(f"{study}: {escape(run)} ({escape(dev)})" for study, (run, dev) in sources.items())
        out.append(f'<h4>{escape(preset)}, "{ADVICE_MIX}" mix</h4><table class="answers"><thead><tr>'
                   f'{"".join(head(c) for c in df.columns)}</tr></thead><tbody>{body}</tbody></table>'
                   f'<p class="muted">From {runs} · <a href="{escape(csv)}">CSV</a></p>')
    if not out:
        return ""
    shown = sum(1 for _, df, _ in frames if not isinstance(df, str) and df.attrs.get("sources"))
    return ('<details class="fold" id="placements"><summary>Per placement, each family: right on eager, graphs and '
            "dp; host time and bytes per image and what they save against the CPU processor; staging per replay; "
            f"the norm's fp32 pool bytes; request to embedding ({shown} of {len(frames)} families measured)"
            f"</summary>{''.join(out)}</details>")


def audit_frame(results_dir: Path):
    """(the newest saved engine audit as a table, its title) or (None, '') where none was saved."""
    import pandas as pd

    from ..audit import load_newest

    data = load_newest(results_dir)
    if data is None:
        return None, ""
    rows = [{"model": m.get("model"), "device norm": "yes" if m.get("device_norm") else "no",
             "norm in": ", ".join(m.get("norm_in") or []) or "-",
             "encoder graphs": "yes" if m.get("encoder_graphs") else "no", "verdict": m.get("verdict")}
            for m in data["models"] if isinstance(m, dict)]
    return pd.DataFrame(rows), f"{data.get('engine')} {data.get('version')} ({data.get('source')})"


def answers_html(advice, advice_csv: str, audit, audit_csv: str, audit_title: str, placements: str = "") -> str:
    def table(df, csv: str) -> str:
        head = "".join(f"<th>{escape(str(c))}</th>" for c in df.columns)
        def cell(column: str, v) -> str:
            text = "" if v != v else str(v)
            if column.startswith("vLLM"):
                return f"<td><code>{escape(text)}</code></td>"
            m = EVIDENCE.search(text)        # "... [run, device]": a link to the study it came from, the run in its title
            if m and column in SOURCES:
                text = (f'{escape(text[:m.start()])} <a class="muted" href="#{SOURCES[column]}" '
                        f'title="{escape(m[1])}, {escape(m[2])}">({escape(m[2])})</a>')
                return f"<td>{text}</td>"
            return f"<td>{escape(text)}</td>"
        body = "".join("<tr>" + "".join(cell(c, v) for c, v in zip(df.columns, row)) + "</tr>"
                       for row in df.itertuples(index=False))
        return (f'<table class="answers"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
                f'<p class="muted"><a href="{escape(csv)}">CSV</a></p>')

    out = []
    if advice is not None:
        out += ['<h2 id="advice">Where to normalize, and the engine options to take</h2>',
                f'<p class="muted">{ADVICE_INTRO}</p>', table(advice, advice_csv), placements]
    if audit is not None:            # the classes that normalize on the device in the table; the others named
        device = audit[audit["device norm"] == "yes"] if len(audit) else audit
        cpu = [str(m) for m in audit["model"][~audit.index.isin(device.index)]] if len(audit) else []
        where = device["norm in"].value_counts() if len(device) else {}
        tally = ", ".join(f"{n} in the {w}" for w, n in where.items())
        wrong = int(device["verdict"].str.startswith("WRONG").sum()) if len(device) else 0
        out += [f'<h2 id="audit">Engine audit: {escape(audit_title)}</h2>', f'<p class="muted">{AUDIT_INTRO}</p>',
                f"<p>{len(audit)} model classes: {len(device)} normalize on the device ({escape(tally)}), "
                f"{len(cpu)} on the CPU; {wrong} in the silent-wrong cell (outer norm with encoder graphs).</p>",
                f'<details class="fold"><summary>The {len(device)} device-normalizing classes, each with its verdict'
                f'</summary>{table(device, audit_csv)}</details>']
        if cpu:
            out.append(f'<details class="fold"><summary>The {len(cpu)} CPU-normalizing classes (right on every '
                       f'path)</summary><p class="muted">{escape(", ".join(cpu))}.</p></details>')
    return "".join(out)
