"""The report's answer tables built from `advise`: one row of advice per family, and per placement what
each study measured for a family (right on which paths, host time saved, bytes shipped, staging, the norm's
fp32 pool bytes), each column from the newest run that measured it."""
from __future__ import annotations

from pathlib import Path

from .advise import DESIGNS, advise, device_names, pct, study_rows
from .provenance import results_folder


# the placements an engine chooses between, in the answer table's order
ANSWER_PLACEMENTS = ("processor", "outer", "tower", "runner", "fold", "device")
NOT_MEASURED = "not measured"


def _verdict(row, prefix: str) -> str:
    """'right', 'WRONG (float32, ...)' or NOT_MEASURED over the matrix columns starting with ``prefix``."""
    cells = {c: str(v) for c, v in row.items() if str(c).startswith(prefix) and v == v}
    if not cells:
        return NOT_MEASURED
    wrong = [c[len(prefix):].strip("[]") or c for c, v in cells.items() if not v.startswith("ok")]
    return "right" if not wrong else "WRONG" + (f" ({', '.join(wrong)})" if prefix == "cudagraph" else "")


def placement_table(preset: str, mix: str, results: Path | str | None = None):
    """One row per placement for ``preset``'s family on ``mix``, each column from the newest run that
    measured it (GPU first; NOT_MEASURED where none did): right on eager / cudagraph / dp (correctness),
    host preprocessing per image and what it saves against the CPU processor, bytes shipped per image and
    time to embedding per image eager and on graphs (input_path), the cheapest staging design per replay
    and its share of the replay (cast_cost, at the largest budget it timed) and the norm's fp32 temporaries
    in the graph pool, eager against the cheapest fused kernel (fp32_memory, largest budget). ``attrs``:
    {column: (run, device)} of the run each column came from."""
    import pandas as pd

    from .checkpoints import resolve_config
    from .samples import mix_label
    from .studies.cast_cost.summary import table_at
    from .studies.correctness.summary import matrix
    from .studies.input_path.params import PLACEMENT_PAYLOAD
    from .studies.input_path.summary import breakdown

    cfg = resolve_config(preset)
    results = results_folder(results)
    out = pd.DataFrame({"placement": list(ANSWER_PLACEMENTS)}).set_index("placement")
    sources: dict[str, tuple[str, str]] = {}

    rows, run = study_rows(results, "correctness", "family", cfg.family)
    if rows is not None:
        m = matrix(rows).droplevel(0)
        for path in ("eager", "cudagraph", "dp"):
            out[path] = [_verdict(m.loc[p], path) if p in m.index else NOT_MEASURED for p in out.index]
        sources["correctness"] = (run.name, device_names(rows))
    rows, run = study_rows(results, "input_path", "preset", cfg.name,
                        lambda r: r["mix"].astype(str) == mix_label(mix))
    if rows is not None:
        b = breakdown(rows)
        b = b[b["mix"].astype(str) == mix_label(mix)]
        g, e = (b[b.path == p].set_index("placement") for p in ("cudagraph", "eager"))
        bytes_ = rows[rows.metric == "h2d_bytes"].groupby("payload").value.first()
        out["host ms/image (saves)"] = [f"{g.host_ms[p]:.1f} ({g.saves_ms[p]:+.1f} total)" if p in g.index else
                                        NOT_MEASURED for p in out.index]
        out["MB/image shipped"] = [f"{bytes_[PLACEMENT_PAYLOAD[p]] / 1e6:.2f}" if p in g.index and
                                   PLACEMENT_PAYLOAD.get(p) in bytes_ else NOT_MEASURED for p in out.index]
        out["request to embedding ms/image: eager / graph"] = [
            f"{e.total_ms[p]:.1f} / {g.total_ms[p]:.1f}" if p in g.index and p in e.index else NOT_MEASURED
            for p in out.index]
        sources["input_path"] = (run.name, device_names(rows))
    rows, run = study_rows(results, "cast_cost", "preset", cfg.name)
    if rows is not None:
        t = table_at(rows)
        t = t[t["budget"] == t["budget"].max()]
        t = t.assign(placement=t["design"].map(lambda d: DESIGNS.get(d, ("?",))[0]))
        st = t["staging_us"].astype(float)
        t = t[st.notna() & (st >= 0) & (st != float("inf"))]         # impossible times are no design's cost
        best = t.sort_values("staging_us").groupby("placement").first()
        out[f"staging us/replay (share), {int(t['budget'].max())} tokens"] = [
            f"{best.staging_us[p]:.1f} ({best.share_of_replay[p]:.3%}) {best.design[p]}/{best.norm[p]}"
            if p in best.index else NOT_MEASURED for p in out.index]
        sources["cast_cost"] = (run.name, device_names(rows))
    rows, run = study_rows(results, "fp32_memory", "preset", cfg.name)
    if rows is not None:
        t = rows[(rows.metric == "temp_bytes") & (rows.budget == rows.budget.max())]
        by = t.groupby(["placement", "norm"]).value.max()

        def pool(p):
            if p not in by.index.get_level_values(0):
                return NOT_MEASURED
            norms = by[p]
            if "eager" not in norms:
                return f"{norms.max() / 2**20:.0f} (no norm)"
            fused = norms.drop(labels=["eager", "identity"], errors="ignore")
            return (f"{norms.get('eager', float('nan')) / 2**20:.0f} / "
                    f"{fused.min() / 2**20 if len(fused) else float('nan'):.0f}")
        out["norm fp32 MiB: eager / fused"] = [pool(p) for p in out.index]
        sources["fp32_memory"] = (run.name, device_names(rows))
    out = out.reset_index()
    out.attrs["sources"] = sources
    return out


def family_presets() -> list[str]:
    """One real preset per family (`config.ANSWER_PRESETS`): the rows of the answer table."""
    from .config import ANSWER_PRESETS
    return list(ANSWER_PRESETS)


def _compact(text: str) -> str:
    """advise's sentence in a table's words (the column header says the rest): a row stays a few lines high."""
    for long, short in (("cheapest right design at ", "at "), ("engines' budgets", "engine"), ("planner's", "plan"),
                        ("transformers", "HF"), (" ms per image", " ms/img"), (" us per replay", " us/replay"),
                        (" items: ", ": "), (" item: ", ": ")):
        text = text.replace(long, short)
    return text


def _advice_row(preset: str, mix: str, results: Path) -> dict:
    """Where to normalize ``preset``, its staging, budgets, padding and vLLM's options (a problem in words);
    "measured": whether any run answered a part of it (placement, staging or time to embedding)."""
    try:
        a = advise(preset, mix, results)
    except (ValueError, OSError) as e:
        return {"preset": preset, "placement, norm, buffer": f"no advice: {e}", "measured": True}
    lat = a.latency       # its largest batch only (advise prints them all)
    return {"preset": preset, "measured": any(e is not None and e.run for e in (a.placement, a.staging, lat)),
            "placement, norm, buffer": ", ".join(a.choice) if a.choice else "not measured: " + "; ".join(
                m.replace(f" of {preset}", "") for m in a.missing),
            "staging (run, device)": _compact(a.staging.line()),
            "time to embedding, largest batch (run, device)": "" if lat is None else lat.text if not lat.run else
            f"{_compact(lat.text.split('; ')[-1])} [{lat.run}, {lat.device}]",
            "budgets": f"planner, {len(a.budgets)} graphs" if a.planned else f"{a.engine} grid",
            "padding (held out): grid / planner": f"{pct(a.padding['engines'])} / {pct(a.padding['planner'])}",
            "engine options (advise prints them whole)": a.options_line(compact=True)}


def advice_table(presets: list[str], mix: str, results: Path | str):
    """`advise` of each preset on ``mix`` as a table row (a problem in words), with a boolean "measured"."""
    import pandas as pd
    return pd.DataFrame([_advice_row(preset, mix, Path(results)) for preset in presets])
