"""The least time the GPU profile's defaults ask of the two studies that time whole realistic batches
(encoder_latency's realistic cells and input_path's encoder cells): the timed forwards alone, each at
the fewest calls the defaults allow, each at the committed H200 runs' per-image eager time of its
preset, mix and item count. No build, capture, race, check or host work is counted, so a real run
takes longer; where this floor is over a time goal, no speed-up of the harness reaches the goal at
these defaults.

    python tools/sweep_floor.py [--runs GLOB] [--profile gpu|gpu-full] [--set STUDY.KEY=JSON ...]     # default: results/reference/*

``--set`` asks what other defaults would ask (``--set input_path.n_items=4 --set 'encoder_latency.mixes=["documents"]'``),
checked by the study's own declaration.

Per-image times come from encoder_latency's realistic cells (path eager, ``image_p50_ms``) of the
newest matching run per preset; input_path's "photos" (not a latency mix) from the newest
input_path run's ``encoder_ms``. A preset or mix without a measured time is listed, not guessed.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workbench.studies import ParamError, discover, load_table, wide  # noqa: E402
from workbench.studies.encoder_latency.summary import mix_cells  # noqa: E402

LATENCY_STRATEGIES = 5      # transformers, eager, the engines' graphs, the planner's graphs, policy auto


def latency_calls(p: dict) -> int:
    """Batch calls one realistic cell makes at the fewest repetitions: per strategy a check call, the
    warm-up and min_reps timed calls, then one call per batch of new shapes."""
    return LATENCY_STRATEGIES * (1 + p["warmup"] + p["min_reps"] + p["fresh"])


def input_path_calls(p: dict) -> int:
    """Image forwards per image of a mix at the fewest repetitions: per (placement, path) each image alone
    and the whole draw, each one warm-up call and min_reps timed calls."""
    return len(p["placements"]) * len(p["paths"]) * 2 * (1 + p["min_reps"])


def per_image_ms(runs: list[Path], device: str = "NVIDIA H200") -> dict[tuple[str, str, int], float]:
    """{(preset, mix, items): eager ms per image on ``device``} from encoder_latency runs (newest first wins),
    and {(preset, "photos", 1): ...} from input_path runs; rows of other devices are left out."""
    out: dict[tuple[str, str, int], float] = {}
    for run in sorted(runs, key=lambda r: r.name, reverse=True):
        lat = run / "encoder_latency.parquet"
        if lat.exists():
            t = load_table(lat)
            w = wide(mix_cells(t[t.device == device]))
            for r in w[w.path == "eager"].itertuples() if len(w) else ():
                out.setdefault((r.preset, r.mix, int(r.images)), float(r.image_p50_ms))
        ip = run / "input_path.parquet"
        if ip.exists():
            t = load_table(ip)
            w = wide(t[t.device == device])
            if "encoder_ms" in w:
                for (preset, mix), ms in w[w.encoder_ms.notna()].groupby(["preset", "mix"]).encoder_ms.mean().items():
                    out.setdefault((preset, mix, 1), float(ms))
    return out


def floors(ms: dict, lat: dict, ip: dict) -> tuple[pd.DataFrame, list[str]]:
    """Seconds per (study, preset) at these parameters, and what had no measured time."""
    rows, missing = [], []
    for preset in lat["presets"]:
        need = [(m, k) for m in lat["mixes"] for k in lat["mix_items"]]
        got = [ms[preset, m, k] * k * latency_calls(lat) / 1e3 for m, k in need if (preset, m, k) in ms]
        missing += [f"encoder_latency {preset} {m} x{k}" for m, k in need if (preset, m, k) not in ms]
        if got:
            rows.append(("encoder_latency", preset, sum(got), len(got), len(need)))
    for preset in ip["presets"]:
        got = [ms[preset, m, 1] * ip["n_items"] * input_path_calls(ip) / 1e3 for m in ip["mixes"] if (preset, m, 1) in ms]
        missing += [f"input_path {preset} {m}" for m in ip["mixes"] if (preset, m, 1) not in ms]
        if got:
            rows.append(("input_path", preset, sum(got), len(got), len(ip["mixes"])))
    return pd.DataFrame(rows, columns=["study", "preset", "floor_s", "cells_timed", "cells"]), missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="results/reference/*", help="run folders with the per-image times")
    ap.add_argument("--device", default="NVIDIA H200", help="the device whose per-image times count (default: %(default)s)")
    ap.add_argument("--profile", choices=("gpu", "gpu-full"), default="gpu",
                    help="whose defaults: gpu (the decision set) or gpu-full (default: %(default)s)")
    ap.add_argument("--set", action="append", default=[], metavar="STUDY.KEY=JSON",
                    help="another value of a study's GPU default (encoder_latency or input_path)")
    a = ap.parse_args(argv)
    runs = [Path(p) for p in glob.glob(a.runs) if Path(p).is_dir()]
    studies = discover()
    over: dict[str, dict] = {"encoder_latency": {}, "input_path": {}}
    for item in a.set:
        key, _, value = item.partition("=")
        study, _, name = key.partition(".")
        if study not in over or not name or not value:
            ap.error(f"--set {item!r}: give encoder_latency.KEY=JSON or input_path.KEY=JSON")
        try:
            over[study][name] = json.loads(value)
        except ValueError:
            over[study][name] = value          # a bare string, as sweep --set takes it
    try:
        lat, ip = (studies[n].resolve(a.profile, over[n]) for n in ("encoder_latency", "input_path"))
    except ParamError as e:
        ap.error(str(e))
    table, missing = floors(per_image_ms(runs, a.device), lat, ip)
    print(f"per realistic latency cell: {latency_calls(lat)} batch calls; per input_path image: "
          f"{input_path_calls(ip)} forwards, {ip['n_items']} images per mix")
    print(table.round(1).to_string(index=False))
    for study, g in table.groupby("study"):
        print(f"{study}: at least {g.floor_s.sum() / 60:.1f} min of timed forwards over {len(g)} presets on {a.device}")
    if missing:
        print(f"no measured per-image time (not counted): {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
