"""The page's first answers, each a table with its CSV: per family the configuration `workbench advise`
recommends for the phone photos mix (from the newest runs, named), and the newest engine audit."""
from __future__ import annotations

import json
from html import escape
from pathlib import Path

ADVICE_MIX = "phone_photos"
ADVICE_INTRO = (f'Per family, for the "{ADVICE_MIX}" mix: the placement, norm and graph buffer of the cheapest '
                "staging design the newest correctness run found right on every path, the time to embedding per "
                "image the newest latency run measured on the mix, the planner's budgets "
                "against the engines' powers of two (padding share of replayed rows), and vLLM 0.33's "
                "--compilation-config. Other mixes and folders: <code>python -m workbench advise --preset P "
                "--mix M</code>.")
AUDIT_INTRO = ("Read statically by <code>python -m workbench audit</code>: per model class, whether it normalizes "
               "on the device, where, whether it captures its encoder in CUDA graphs, and the correctness matrix's "
               "verdict.")


def advice_frame(results_dir: Path):
    """One row per family's real preset: where to normalize, staging, budgets, padding, vLLM's options."""
    import pandas as pd

    from ..advise import advise
    from ..config import REAL_PRESET_PER_FAMILY

    rows = []
    for preset in REAL_PRESET_PER_FAMILY:
        try:
            a = advise(preset, ADVICE_MIX, results_dir)
        except (ValueError, OSError) as e:
            rows.append({"preset": preset, "placement, norm, buffer": f"no advice: {e}"})
            continue
        rows.append({"preset": preset,
                     "placement, norm, buffer": ", ".join(a.choice) if a.choice else
                     "not measured: " + "; ".join(a.missing),
                     "staging (run, device)": a.staging.line(),
                     "time to embedding (run, device)": a.latency.line() if a.latency else "",
                     "planner budgets": str(a.budgets),
                     "items per graph": a.max_items, "padding: planner": f"{a.padding['planner']:.1%}",
                     "padding: engines' powers of two": f"{a.padding['engines']:.1%}",
                     "vLLM --compilation-config": json.dumps(a.compilation_config())})
    return pd.DataFrame(rows)


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


def answers_html(advice, advice_csv: str, audit, audit_csv: str, audit_title: str) -> str:
    def table(df, csv: str) -> str:
        head = "".join(f"<th>{escape(str(c))}</th>" for c in df.columns)
        def cell(column: str, v) -> str:
            text = escape("" if v != v else str(v))
            return f"<td><code>{text}</code></td>" if column.startswith("vLLM") else f"<td>{text}</td>"
        body = "".join("<tr>" + "".join(cell(c, v) for c, v in zip(df.columns, row)) + "</tr>"
                       for row in df.itertuples(index=False))
        return (f'<table class="answers"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
                f'<p class="muted"><a href="{escape(csv)}">CSV</a></p>')

    out = []
    if advice is not None:
        out += ['<h2 id="advice">Where to normalize, and the engine options to take</h2>',
                f'<p class="muted">{ADVICE_INTRO}</p>', table(advice, advice_csv)]
    if audit is not None:            # the classes that normalize on the device in the table; the others named
        device = audit[audit["device norm"] == "yes"] if len(audit) else audit
        cpu = [str(m) for m in audit["model"][~audit.index.isin(device.index)]] if len(audit) else []
        out += [f'<h2 id="audit">Engine audit: {escape(audit_title)}</h2>', f'<p class="muted">{AUDIT_INTRO}</p>',
                table(device, audit_csv)]
        if cpu:
            out.append(f'<p class="muted">{len(cpu)} more class{"es" * (len(cpu) > 1)} capture their encoder and '
                       f'normalize on the CPU (right on every path): {escape(", ".join(cpu))}.</p>')
    return "".join(out)
