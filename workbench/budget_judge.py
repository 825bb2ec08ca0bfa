"""Budgets judged out of sample, against an engine release's own default grid.

A budget set fitted to a mix's sizes pads nothing on those very sizes: that says nothing about the
traffic it will serve. Here the planner (`planner.plan_budgets`) is fitted on one draw of a traffic
around the mix (`samples.traffic_tokens`: the mix's kinds at sizes scattered around its own) and
judged on other draws, and on draws of the other mixes, beside the engine's default grid
(`engines.EnginePolicy.budgets`), at an equal number of graphs and at equal pool memory (with one
input buffer set shared by every budget, as vLLM 0.34 captures them, the pool is sized by the
largest budget: the planner keeps the engine's largest, and items above it run eagerly under both).

Traffic reaches the encoder as batches: vLLM 0.34 replays a whole batch in the smallest budget
holding its tokens, and runs a batch above the largest budget eagerly (the eager tail). A draw is
judged (and the planner fitted) as batches of each size in ``batches`` (`BATCHES`: one, two and four
items, as a server meets them from light to moderate load), so budgets fitted to single items are not
mistaken for budgets that hold the batches. Scores per set: ``padded_frac``, padding among replayed
rows; ``eager_frac``, batches run eagerly; ``rows_ratio``, rows the tower runs per batch (padded
budgets, eager batches at their own size) over the rows the batches hold: the padding's cost in
tower work, the eager tail counted at its size.
"""
from __future__ import annotations

import numpy as np

from . import engines, limits
from .budgets import Budgets
from .planner import plan_budgets

DRAW_ITEMS = 512        # items in the draw the planner is fitted on, and in each held-out draw
HELD_OUT = 6            # held-out draws of the mix
SPREAD = 0.25           # log-scale jitter of each side around the mix's sizes
SETS = ("engine default", "planner, equal graphs", "planner, equal pool", "planner, fewest graphs")
NEAR = 0.005            # rows per batch within this of the equal-graphs set: as good, with fewer graphs
BATCHES = (1, 2, 4)     # items per batch the encoder meets


def requests(tokens: list[int], batches=BATCHES) -> np.ndarray:
    """Merged tokens per batch: for each size k in ``batches``, the draw's items in consecutive groups of k."""
    t = np.asarray(tokens, dtype=np.int64)
    parts = [t[:len(t) // k * k].reshape(-1, k).sum(axis=1) for k in batches]
    return np.concatenate(parts) if parts else t[:0]


def judge(req: np.ndarray, budgets, exact: bool = False) -> dict:
    """How ``budgets`` serve batches of ``req`` merged tokens each (module docstring); ``exact``: a graph per
    exact length up to the largest budget (SGLang's), so nothing is padded."""
    req = np.asarray(req, dtype=np.int64)
    b = np.asarray(Budgets.of(budgets), dtype=np.int64)
    pos = np.searchsorted(b, req, side="left")
    hit = req <= b[-1] if exact else pos < b.size
    used = req if exact else np.where(hit, b[np.minimum(pos, b.size - 1)], req)
    replayed = used[hit].sum()
    return dict(padded_frac=float((used[hit] - req[hit]).sum() / replayed) if replayed else float("nan"),
                eager_frac=float(1 - hit.mean()) if len(req) else float("nan"),
                rows_ratio=float(used.sum() / req.sum()) if req.sum() else float("nan"))


def candidate_sets(fit: np.ndarray, policy: engines.EnginePolicy, largest: int, cfg,
                   validation: np.ndarray | None = None) -> dict[str, list[int]]:
    """The engine's default grid and the planner's sets fitted on ``fit`` (merged tokens per batch): as many
    graphs as the grid; the same under the grid's largest budget (equal pool); and the fewest graphs whose rows
    per request on ``validation`` (a draw apart from the fitted and the judged ones) come within `NEAR` of the
    equal-graphs set's, since a graph per size the draw happened to hold serves the next draw no better."""
    grid = policy.budgets(largest)
    fit = [t for t in fit.tolist() if t <= limits.current().budget_tokens] or [grid[-1]]   # above: eager anyway
    capped = [t for t in fit if t <= grid[-1]] or [grid[-1]]
    equal = plan_budgets(fit, len(grid), cfg=cfg)
    out = {"engine default": grid, "planner, equal graphs": equal,
           "planner, equal pool": plan_budgets(capped, len(grid), cfg=cfg)}
    if validation is not None:
        target = judge(validation, equal)["rows_ratio"] + NEAR
        out["planner, fewest graphs"] = next(
            (s for g in range(1, len(equal)) if judge(validation, s := plan_budgets(fit, g, cfg=cfg))["rows_ratio"]
             <= target), equal)
    return out


def out_of_sample(mix: str, cfg, engine=engines.NEWEST, largest: int = 16384, batches=BATCHES,
                  seed: int = 0, held_out: int = HELD_OUT, n: int = DRAW_ITEMS):
    """One row per (budget set, sample): 'fitted draw' (the planner's own), 'held-out draws' (the
    mean over ``held_out`` other draws of the mix) and 'other mixes' (the mean over one draw of each
    other named mix); columns budgets_n, largest_budget and the `judge` scores. ``attrs['sets']``: the
    budget sets."""
    import pandas as pd

    from .samples import MIX_NAMES, takes, traffic_tokens

    policy = engines.get(engine)

    def draw(name: str, s: int) -> np.ndarray:
        return requests(traffic_tokens(name, n, s, cfg, SPREAD), batches)

    fit = draw(mix, seed)
    sets = candidate_sets(fit, policy, largest, cfg, draw(mix, seed + 1 + held_out))   # validation: apart
    samples = {"fitted draw": [fit], "held-out draws": [draw(mix, seed + 1 + k) for k in range(held_out)],
               "other mixes": [draw(m, seed + 1) for m in MIX_NAMES if m != mix and takes(m, cfg)]}
    rows = []
    for name, budgets in sets.items():
        for sample, draws in samples.items():
            exact = name == "engine default" and policy.packing == "per_length"
            scores = pd.DataFrame([judge(d, budgets, exact) for d in draws]).mean()
            rows.append(dict(set=name, sample=sample, budgets_n=len(budgets), largest_budget=budgets[-1],
                             **scores.to_dict()))
    out = pd.DataFrame(rows)
    out.attrs.update(sets=sets, engine=policy.name, mix=mix, batches=tuple(batches))
    return out


def verdict(table) -> tuple[str | None, str]:
    """(the planner set that beats the engine's default on the held-out draws in rows per request, or None;
    a sentence saying by how much, or that none does). Of the sets within `NEAR` of the best, the fewest graphs."""
    held = table[table["sample"] == "held-out draws"].set_index("set")
    base = held.loc["engine default", "rows_ratio"]
    planned = held.drop(index="engine default")
    near = planned[planned["rows_ratio"] <= planned["rows_ratio"].min() + NEAR]
    best = near.sort_values(["budgets_n", "rows_ratio"]).index[0]
    gain = 1 - held.loc[best, "rows_ratio"] / base
    engine = table.attrs.get("engine", "the engine")
    if gain > 0:
        return best, (f"{best} ({int(held.loc[best, 'budgets_n'])}): {gain:.1%} fewer tower rows per batch than "
                      f"{engine}'s default grid ({int(held.loc['engine default', 'budgets_n'])} graphs) on held-out "
                      f"draws (eager {held.loc[best, 'eager_frac']:.1%} of batches vs "
                      f"{held.loc['engine default', 'eager_frac']:.1%})")
    said = f"no planned set beats {engine}'s default grid in tower rows on held-out draws: keep the engine's budgets"
    tail = held.loc["engine default", "eager_frac"] - held.loc["planner, equal graphs", "eager_frac"]
    if tail >= 0.05:    # rows cannot weigh an eager tail against replays: that is the latency study's time
        said += (f"; the grid runs {held.loc['engine default', 'eager_frac']:.0%} of batches eagerly, which the "
                 f"planner's equal graphs replay (largest budget {int(held.loc['planner, equal graphs', 'largest_budget'])}"
                 f", padding {held.loc['planner, equal graphs', 'padded_frac']:.1%}): whether that pays is graph "
                 f"against eager time at those sizes ('eager above the cap', where a run measured it)")
    return None, said
