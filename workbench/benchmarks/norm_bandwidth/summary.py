"""The norm bandwidth benchmark's summary: its committed result files drawn, and its finding.

Reads what ``python -m workbench.benchmarks.norm_bandwidth --out FILE.json`` wrote (committed
under ``results/reference/``): % of the SM-copy ceiling and p50 times per implementation and row
count, and two or three sentences generated from the numbers. Imports no torch: the report loads
it through the benchmark registry (`workbench.benchmarks.discover`).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

from .. import BenchmarkPanel

LAUNCH_BOUND_PCT = 50.0      # below this share of the copy ceiling a call is launch/latency bound


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def benchmark_date(doc: Mapping[str, Any], path: Path) -> str:
    """The file's ``date``, else the YYYYMMDD in its name, else 'undated'."""
    if doc.get("date"):
        return str(doc["date"])
    m = re.search(r"(?<!\d)(\d{4})(\d{2})(\d{2})(?!\d)", path.stem)
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}" if m else "undated"


def records(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
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


def figures(recs, device: str, date: str, sm_copy_gbs: float | None, out_dir: Path, stem: str) -> list[Path]:
    """% of the copy ceiling (bars) and p50 time against the byte floor (lines), PNG and SVG each;
    legends beside the axes, never over the bars or the 100% line. On a CPU (a smoke test, stamped)
    neither the ceiling nor the floor is drawn: the bars then show the p50 times."""
    import matplotlib.pyplot as plt

    from ...studies.plotting import cpu_device, legend_right, plain_log_ticks, save_figure, stamp_cpu

    cpu = cpu_device(device)
    sizes = sorted({(r["n_rows"], r["rows"]) for r in recs})
    labels = [label for _, label in sizes]
    impls = list(dict.fromkeys(r["impl"] for r in recs))
    by = {(r["impl"], r["n_rows"]): r for r in recs}
    x = list(range(len(sizes)))
    width = 0.8 / max(len(impls), 1)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(sizes) + 3), 4.2))
    key = "p50_us" if cpu else "pct_floor"
    top = 0.0 if cpu else 100.0
    for i, impl in enumerate(impls):
        xs, ys = [], []
        for j, (n, _) in enumerate(sizes):
            r = by.get((impl, n))
            if r is not None:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(r[key])
        bars = ax.bar(xs, ys, width=width * 0.92, label=impl)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
        top = max([top, *ys])
    if not cpu:
        ceiling = (f"SM-copy ceiling ({sm_copy_gbs:.0f} GB/s)" if sm_copy_gbs is not None
                   else "SM-copy ceiling")
        ax.axhline(100.0, color="black", linestyle="--", linewidth=1, label=ceiling)
    ax.set_xticks(x, labels)
    ax.set_xlabel("pixel rows (images x rows per image)")
    ax.set_ylabel("p50 time per call (µs, host)" if cpu else "% of copy ceiling (higher is better)")
    ax.set_ylim(0, top * 1.15)
    ax.set_title(f"Norm bandwidth, uint8 rows -> bf16, on {device} ({date})", fontsize=10)
    legend_right(ax, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if cpu:
        stamp_cpu(ax)
    paths += save_figure(fig, out_dir, f"{stem}_pct")

    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(sizes) + 3), 3.6))
    for impl in impls:
        pts = [(j, by[(impl, n)]["p50_us"]) for j, (n, _) in enumerate(sizes) if (impl, n) in by]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    if not cpu:
        floors = [(j, next(r["floor_us"] for r in recs if r["n_rows"] == n)) for j, (n, _) in enumerate(sizes)]
        ax.plot([p[0] for p in floors], [p[1] for p in floors], color="black", marker="_", markersize=18,
                linestyle=":", linewidth=1, label="byte floor")
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xticks(x, labels)
    ax.set_xlabel("pixel rows (images x rows per image)")
    ax.set_ylabel("p50 time per call (µs, lower is better)")
    ax.set_title(f"Norm p50 time on {device} ({date})", fontsize=10)
    ax.margins(x=0.08)
    legend_right(ax, fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    if cpu:
        stamp_cpu(ax)
    paths += save_figure(fig, out_dir, f"{stem}_p50")
    return paths


def finding(recs, device: str, date: str) -> str:
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


def summarize(path: Path, doc: Mapping[str, Any], out_dir: Path) -> BenchmarkPanel:
    """One committed result file as a panel: figures saved into ``out_dir``, the finding, the
    ceilings and versions it was measured with; a file that breaks the format gets ``error``."""
    from ...studies.plotting import slug

    device = str(doc.get("device") or "unknown device")
    date = benchmark_date(doc, path)
    panel = BenchmarkPanel(source=path.name, device=device, date=date)
    try:
        recs = records(doc)
        sm = doc.get("sm_copy_gbs")
        sm = float(sm) if isinstance(sm, (int, float)) and not isinstance(sm, bool) else None
        panel.figures = figures(recs, device, date, sm, Path(out_dir), slug(path.stem))
        what = {"_pct": "share of the SM-copy ceiling per implementation and row count (higher is better)",
                "_p50": "p50 time per call against the byte floor (log scale, lower is better)"}
        panel.captions = {f.name: f"Norm bandwidth, uint8 rows -> bf16: {text}" for f in panel.figures
                          for end, text in what.items() if f.stem.endswith(end)}
        text = finding(recs, device, date)
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
