"""Rerun studies at a reference run's recorded parameters (on CUDA, or $DEV) and compare every timing-free
metric with the reference table: `OUT=dir python tools/verify_reference.py STUDY:RUN[:KEY=JSON...] ...`."""
import json, os, sys, time
from pathlib import Path
import numpy as np
import pandas as pd
from workbench.compare import param_columns, recorded
from workbench.studies import discover, load_table

TIMING_UNITS = {"ms", "us", "s", "GB/s", "TFLOP/s", "x"}
TIMING_NAMES = ("share_of_replay", "speedup", "x_floor", "x_practical", "ratio_to_floor", "_ms", "_us", "model_error",
                "reps_n")
out = Path(os.environ["OUT"])
studies = discover()
report = {}
for spec in sys.argv[1:]:
    name, run, *over = spec.split(":")
    ref_dir = Path("results/reference") / run
    params = dict(json.load(open(ref_dir / "meta.json"))["params"]["studies"][name])
    params.pop("device", None)
    for kv in over:
        k, v = kv.split("=", 1)
        params[k] = json.loads(v)
    t0 = time.time()
    new = studies[name].run(device=os.environ.get("DEV", "cuda"), progress=False, **params)
    secs = time.time() - t0
    new.to_parquet(out / f"{name}.parquet")
    ref = load_table(ref_dir / f"{name}.parquet")
    keep = lambda t: t[~t.unit.isin(TIMING_UNITS) & ~t.metric.str.contains("|".join(TIMING_NAMES))]
    a, b = keep(ref), keep(new)
    if name == "padding_waste" and "budget_set" in a:          # planner_time budgets come from measured times
        a, b = a[a.budget_set != "planner_time"], b[b.budget_set != "planner_time"]
    # compare's keys (no device, no attention: a rerun with another backend is compared cell by cell), and the metric
    keys = [c for c in param_columns(a) if c in b.columns] + ["metric"]
    ka = a.assign(**{c: a[c].astype(str) for c in keys}).set_index(keys)["value"]
    kb = b.assign(**{c: b[c].astype(str) for c in keys}).set_index(keys)["value"]
    ka = ka[~ka.index.duplicated()]; kb = kb[~kb.index.duplicated()]
    common = ka.index.intersection(kb.index)
    va, vb = ka.loc[common].astype(float).to_numpy(), kb.loc[common].astype(float).to_numpy()
    same = (va == vb) | (np.isnan(va) & np.isnan(vb))
    diff = common[~same]
    bymetric = pd.Series([i[keys.index("metric")] for i in diff]).value_counts().to_dict() if len(diff) else {}
    worst = []
    for i in list(diff)[:8]:
        worst.append((dict(zip(keys, i)), float(ka.loc[i]), float(kb.loc[i])))
    report[name] = dict(seconds=round(secs, 1), attention_ref=recorded(ref, "attention"), attention_new=recorded(new, "attention"),
                        compared=int(len(common)), equal=int(same.sum()),
                        only_ref=int(len(ka.index.difference(kb.index))), only_new=int(len(kb.index.difference(ka.index))),
                        differing_by_metric=bymetric, examples=worst)
    print(name, json.dumps({k: v for k, v in report[name].items() if k != "examples"}), flush=True)
    for e in worst[:4]:
        print("   ", e, flush=True)
json.dump(report, open(out / "verify.json", "w"), indent=1, default=str)
