"""Policy auto's verdicts over encoder_latency run folders, one row per realistic cell and a count per run:
auto against the faster of eager and the engines' graphs (steady state and on the stream of new shapes), against
transformers, and its first call of a batch shape against its steady-state call.
``python tools/auto_verdicts.py RUN_DIR... [--within 0.05] [--csv out.csv]``; read-only."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from workbench.studies import load_table
from workbench.studies.encoder_latency.summary import BEST3, mix_table

BEST, HF = "auto / best of eager, engine graph", "auto / transformers"
FRESH, STREAM = f"fresh: {BEST}", f"fresh stream: {BEST}"     # the median batch's, the whole stream's


def cells(run: Path) -> pd.DataFrame:
    """mix_table of one run folder, with the run's name."""
    table = load_table(run / "encoder_latency.parquet")
    t = mix_table(table)
    if t.empty:
        return t
    t.insert(0, "run", run.name)
    return t


def verdicts(t: pd.DataFrame, within: float) -> pd.DataFrame:
    """Per run: cells, how many have auto within ``within`` of the better of eager and the engines' graphs
    (steady; new shapes: the median batch, the whole stream), the worst of each ratio, and how many have auto slower than transformers."""
    def per_run(g):
        row = {"cells": len(g)}
        for col, name in ((BEST, "within"), (BEST3, "within (planner too)"), (FRESH, "fresh within"),
                          (STREAM, "stream within")):
            if col in g:
                row[name] = int((g[col] <= 1 + within).sum())
                row[f"worst {col}"] = g[col].max()
        if HF in g:
            row["slower than transformers"] = int((g[HF] > 1).sum())
            row[f"worst {HF}"] = g[HF].max()
        if "auto first / steady call" in g:
            row["first / steady call"] = f"{g['auto first / steady call'].min():.2f}-{g['auto first / steady call'].max():.2f}"
        return pd.Series(row)
    return t.groupby("run", sort=False).apply(per_run, include_groups=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--within", type=float, default=0.05, help="the tolerance of 'within' (default 0.05: 5%%)")
    ap.add_argument("--csv", type=Path, help="also write every cell's row here")
    a = ap.parse_args(argv)
    if not 0 < a.within < 1:
        ap.error(f"--within must be in (0, 1), got {a.within}")
    missing = [str(r) for r in a.runs if not (r / "encoder_latency.parquet").is_file()]
    if missing:
        ap.error(f"no encoder_latency.parquet in: {', '.join(missing)}")
    t = pd.concat([cells(r) for r in a.runs], ignore_index=True)
    if t.empty:
        print("no realistic-batch cells in these runs")
        return 1
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    show = [c for c in ("run", "preset", "mix", "images", BEST, FRESH, HF, "auto first / steady call") if c in t]
    print(t[show].round(3).to_string(index=False))
    print()
    print(verdicts(t, a.within).round(3).to_string())
    if a.csv:
        t.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
