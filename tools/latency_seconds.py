"""Where an encoder_latency run's seconds went, per preset: the rate probes, the builds, the runners' captures,
each cell (since the study records cell_s), and within the cells the calls it timed (p50 x the calls each path
made: check, warm-up, timed, auto's race, the stream of new shapes) against the rest (first calls, captures,
compiles, preprocessing). ``python tools/latency_seconds.py RUN_DIR...``; read-only. The timed calls are an
estimate (each call taken at its path's p50); everything else is what the run recorded."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from workbench.studies import load_table, wide


def accounting(run: Path) -> pd.DataFrame:
    """One row per preset: seconds by where they went, and the study's own total (meta.json)."""
    meta = json.loads((run / "meta.json").read_text())
    params = meta["params"]["studies"]["encoder_latency"]
    total = (meta.get("study_seconds") or {}).get("encoder_latency")
    w = wide(load_table(run / "encoder_latency.parquet"))
    warm = params.get("warmup", 0)
    rows = []
    for preset, g in w.groupby("preset", sort=False):
        eager = g[g.path == "eager"]
        row = {"run": run.name, "preset": preset, "study_s": total}
        row["rates_s"] = eager["rates_s"].max() if "rates_s" in g else float("nan")
        row["build_s"] = eager["build_s"].max() if "build_s" in g else float("nan")
        mix = g[g.case == "mix"]
        if "runner_s" in g and len(mix):
            per_mix = mix[mix.path == "graph_planner"].groupby("mix").runner_s.first()
            row["runners_s"] = mix[mix.path == "graph_engine"].runner_s.max() + per_mix.sum()
        calls = 1 + warm + g.get("reps_n", pd.Series(params.get("reps", 0), index=g.index)).fillna(0)
        calls = calls + g.get("explore_calls", 0 * calls).fillna(0) + g.get("fresh_batches", 0 * calls).fillna(0)
        row["timed_calls_s"] = float((calls * g.p50_ms).sum() / 1e3)
        if "cell_s" in g:
            row["cells_s"] = float(eager.cell_s.sum())
            row["cells_other_s"] = row["cells_s"] - row["timed_calls_s"]
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    runs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not runs or any(not (r / "encoder_latency.parquet").is_file() for r in runs):
        print("usage: python tools/latency_seconds.py RUN_DIR... (each with an encoder_latency.parquet)",
              file=sys.stderr)
        return 2
    t = pd.concat([accounting(r) for r in runs], ignore_index=True)
    pd.set_option("display.width", 220)
    pd.set_option("display.max_columns", 20)
    print(t.round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
