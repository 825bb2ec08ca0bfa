"""How long padding_waste takes on a GPU, from a committed run's replay table: a cost model.

padding_waste's GPU time is dominated by forwards of the tower: every captured budget costs its
warm-ups and its capture, every drawn item a replay in the budget its pack lands in, every mix one
eager reference over its items. This script counts those forwards as the study issues them (the
default GPU grid: every mix, the four budget sets, max_items 1 and 16) and prices each at the
replay time of its budget in a committed padding_waste run of the same preset (log-log
interpolated; a forward of an exact-fit graph at 1/1.5 of it, from the cuDNN vs flash varlen
ratio in results/reference/README.md). Host work, the norm timings and Python are left out.

    PYTHONPATH=$PWD python3 tools/padding_cost.py RUN_FOLDER [--n-items 16] [--before | --unshared]

The study as it is: the sets of a mix that give the same runner budgets for the same max_items share
one runner and its measurement (a step of no forward). ``--unshared``: before that (c2ed01e), one
runner per set; ``--before``: the study as it was at commit 074da98 (every runner warmed twice per
budget and captured its exact-fit graphs with it; every cell encoded twice). How close the model came to the
H200 runs it was checked against is in results/reference/README.md (Wall times).
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.budgets import Budgets
from workbench.config import VisionConfig
from workbench.preprocess import preprocess
from workbench.samples import MIX_NAMES, image_mix, mix_distribution
from workbench.studies.padding_waste.params import BUDGET_SETS
from workbench.studies.padding_waste.measure import budget_sets

EXACT_SPEEDUP = 1.5        # dense cuDNN over flash varlen from 4096 rows (results/reference/README.md)
LADDER_REPLAYS = 7         # per budget of the replay table: warm-up + 5 reps, and its edge case


def step_seconds(table: pd.DataFrame, preset: str, n_items: int, before: bool, shared: bool = True) -> list[float]:
    """Modelled seconds of each progress step of the study for ``preset`` (the replay table's
    budgets, then one per mix x budget set x max_items)."""
    cfg = VisionConfig.preset(preset)
    r = table[(table.case == "replay") & (table.metric == "replay_ms") & (table.preset == preset)]
    if r.empty:
        raise SystemExit(f"the run has no replay table for {preset!r}; presets in it: {sorted(table.preset.unique())}")
    bs, secs = r.budget.to_numpy(float), r.value.to_numpy(float) / 1e3
    lat = {int(b): s * 1e3 for b, s in zip(bs, secs)}

    def fwd(b: float) -> float:
        return float(np.exp(np.interp(np.log(b), np.log(bs), np.log(secs))))

    capture = 6 if before else 3            # (2 warm-ups + capture) x (general + exact) vs 2 + 1, general only
    steps = [(capture + LADDER_REPLAYS) * fwd(b) for b in bs]
    for mix in MIX_NAMES:
        dist = dict(mix_distribution(mix, cfg))
        # the sets the run compared (a run from before a set was added prices without it)
        sets = budget_sets(dist, [s for s in BUDGET_SETS if s in set(table.budget_set.dropna())], latency=lat)
        batch = preprocess(image_mix(mix, n_items, seed=0, resized=True, cfg=cfg), cfg)
        tokens = [int(np.prod(g)) // cfg.merge_unit for g in batch.grid_thw.tolist()]
        reference = sum(fwd(t) for t in tokens)              # the mix's eager reference, in its first step
        seen = set()
        for name, budgets in sets.items():
            for m in (1, 16):
                rb = list(Budgets.of(budgets).holding(m))
                if shared and not before and (tuple(rb), m) in seen:
                    steps.append(0.0)                         # the runner of an earlier set of this mix
                    continue
                seen.add((tuple(rb), m))
                if before:
                    cap = sum(6 * fwd(b) for b in rb)
                else:                                         # 1 warm-up + capture; exact-fit graphs where used
                    exact = sum(2 * fwd(b) / EXACT_SPEEDUP for b in rb if b >= 256) \
                        if name.startswith("planner") and m == 1 else 0.0
                    cap = sum(2 * fwd(b) for b in rb) + exact
                encode = sum(fwd(next((b for b in rb if b >= t), t)) for t in tokens)
                steps.append(cap + (2 if before else 1) * encode + reference)
                reference = 0.0
    return steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run folder holding padding_waste.parquet")
    ap.add_argument("--n-items", type=int, default=16)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--before", action="store_true", help="the study as it was at commit 074da98")
    how.add_argument("--unshared", action="store_true", help="one runner per set, as before c2ed01e")
    args = ap.parse_args(argv)
    table = pd.read_parquet(args.run / "padding_waste.parquet")
    for preset in table.preset.unique():
        c = np.cumsum(step_seconds(table, preset, args.n_items, args.before, not args.unshared))
        print(f"{preset}: {len(c)} steps, {c[-1]:.0f} s modelled ({c[-1] / 60:.1f} min); after step k: "
              + ", ".join(f"{k} {c[k - 1]:.0f} s" for k in (17, 22, 24, 52) if k <= len(c)))


if __name__ == "__main__":
    main(sys.argv[1:])
