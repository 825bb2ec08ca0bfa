"""Budgets judged out of sample, against an engine release's own default grid.

A budget set fitted to a mix's sizes pads nothing on those very sizes: that says nothing about the
traffic it will serve. Here the planner (`planner.plan_budgets`) is fitted on one draw of a traffic
around the mix (`samples.traffic_tokens`: the mix's kinds at sizes scattered around its own) and
judged on other draws, and on draws of the other mixes, beside the engine's default grid
(`engines.EnginePolicy.budgets`), at an equal number of graphs and at equal pool memory (with one
input buffer set shared by every budget, as vLLM 0.34 captures them, the pool is sized by the
largest budget: the planner keeps the engine's largest, and items above it run eagerly under both).

A request of ``per_replay`` items replays the smallest budget holding its tokens, as vLLM 0.34
packs a batch; a request above the largest budget runs eagerly (the eager tail). Scores per set:
``padded_frac``, padding among replayed rows; ``eager_frac``, requests run eagerly; ``rows_ratio``,
rows the tower runs per request (padded budgets, eager requests at their own size) over the rows
the requests hold: the padding's cost in tower work, the eager tail counted at its size.
"""
from __future__ import annotations

import numpy as np

from . import engines
from .budgets import Budgets
from .planner import plan_budgets

DRAW_ITEMS = 512        # requests in the draw the planner is fitted on, and in each held-out draw
HELD_OUT = 6            # held-out draws of the mix
SPREAD = 0.25           # log-scale jitter of each side around the mix's sizes
SETS = ("engine default", "planner, equal graphs", "planner, equal pool")


def requests(tokens: list[int], per_replay: int) -> np.ndarray:
    """Merged tokens per request of ``per_replay`` consecutive items."""
    t = np.asarray(tokens, dtype=np.int64)
    k = len(t) // per_replay * per_replay
    return t[:k].reshape(-1, per_replay).sum(axis=1) if k else t[:0]


def judge(tokens: list[int], budgets, per_replay: int = 1, exact: bool = False) -> dict:
    """How ``budgets`` serve ``tokens`` in requests of ``per_replay`` items (module docstring); ``exact``: a
    graph per exact length up to the largest budget (SGLang's), so nothing is padded."""
    req = requests(tokens, per_replay)
    b = np.asarray(Budgets.of(budgets), dtype=np.int64)
    pos = np.searchsorted(b, req, side="left")
    hit = req <= b[-1] if exact else pos < b.size
    used = req if exact else np.where(hit, b[np.minimum(pos, b.size - 1)], req)
    replayed = used[hit].sum()
    return dict(padded_frac=float((used[hit] - req[hit]).sum() / replayed) if replayed else float("nan"),
                eager_frac=float(1 - hit.mean()) if len(req) else float("nan"),
                rows_ratio=float(used.sum() / req.sum()) if req.sum() else float("nan"))


def candidate_sets(fit: list[int], policy: engines.EnginePolicy, largest: int, cfg) -> dict[str, list[int]]:
    """The engine's default grid and the planner's two sets fitted on ``fit`` (merged tokens per item)."""
    grid = policy.budgets(largest)
    capped = [t for t in fit if t <= grid[-1]] or [grid[-1]]
    return {"engine default": grid,
            "planner, equal graphs": plan_budgets(fit, len(grid), cfg=cfg),
            "planner, equal pool": plan_budgets(capped, len(grid), cfg=cfg)}


def out_of_sample(mix: str, cfg, engine=engines.NEWEST, largest: int = 16384, per_replay: int = 1,
                  seed: int = 0, held_out: int = HELD_OUT, n: int = DRAW_ITEMS):
    """One row per (budget set, sample): 'fitted draw' (the planner's own), 'held-out draws' (the
    mean over ``held_out`` other draws of the mix) and 'other mixes' (the mean over one draw of each
    other named mix); columns budgets_n, largest_budget and the `judge` scores. ``attrs['sets']``: the
    budget sets."""
    import pandas as pd

    from .samples import MIX_NAMES, traffic_tokens

    policy = engines.get(engine)
    fit = traffic_tokens(mix, n, seed, cfg, SPREAD)
    sets = candidate_sets(fit, policy, largest, cfg)
    samples = {"fitted draw": [fit],
               "held-out draws": [traffic_tokens(mix, n, seed + 1 + k, cfg, SPREAD) for k in range(held_out)],
               "other mixes": [traffic_tokens(m, n, seed + 1, cfg, SPREAD) for m in MIX_NAMES if m != mix]}
    rows = []
    for name, budgets in sets.items():
        for sample, draws in samples.items():
            exact = name == "engine default" and policy.packing == "per_length"
            scores = pd.DataFrame([judge(d, budgets, per_replay, exact) for d in draws]).mean()
            rows.append(dict(set=name, sample=sample, budgets_n=len(budgets), largest_budget=budgets[-1],
                             **scores.to_dict()))
    out = pd.DataFrame(rows)
    out.attrs.update(sets=sets, engine=policy.name, mix=mix, per_replay=per_replay)
    return out


def verdict(table) -> tuple[str | None, str]:
    """(the planner set that beats the engine's default on the held-out draws in rows per request, or None;
    a sentence saying by how much, or that none does)."""
    held = table[table["sample"] == "held-out draws"].set_index("set")
    base = held.loc["engine default", "rows_ratio"]
    best = held.drop(index="engine default")["rows_ratio"].idxmin()
    gain = 1 - held.loc[best, "rows_ratio"] / base
    engine = table.attrs.get("engine", "the engine")
    if gain > 0:
        return best, (f"{best}: {gain:.1%} fewer tower rows per request than {engine}'s default grid on held-out "
                      f"draws (eager {held.loc[best, 'eager_frac']:.1%} of requests vs "
                      f"{held.loc['engine default', 'eager_frac']:.1%})")
    said = f"no planned set beats {engine}'s default grid in tower rows on held-out draws: keep the engine's budgets"
    tail = held.loc["engine default", "eager_frac"] - held.loc["planner, equal graphs", "eager_frac"]
    if tail >= 0.05:    # rows cannot weigh an eager tail against replays: that is the latency study's time
        said += (f"; the grid runs {held.loc['engine default', 'eager_frac']:.0%} of requests eagerly, which the "
                 f"planner's equal graphs replay (largest budget {int(held.loc['planner, equal graphs', 'largest_budget'])}"
                 f", padding {held.loc['planner, equal graphs', 'padded_frac']:.1%}): whether that pays is graph "
                 f"against eager time at those sizes ('eager above the cap', where a run measured it)")
    return None, said
