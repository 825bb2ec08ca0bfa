"""Bandwidth of the device-side input normalization, uint8 pixel rows -> bf16, as CUDA-graph replays.

What is measured, and why:

* Correctness first, on fresh random uint8 rows: every norm in `workbench.norms.NORMS` (and every
  `ROWS_CONFIGS` tile of triton_rows), bf16 and fp32 output, against the float64
  `normalize_reference` (fp32: |error| <= 1e-6; bf16: at most 1 ulp from the reference rounded to
  bf16; identity: the plain cast). The output is poisoned with NaN first, so an element the
  kernel forgot shows up; with ``n_valid`` (0, a partial count, N) the rows past it must keep
  their poison bit for bit. A fast kernel that is wrong is not timed.
* The two copy ceilings: a Triton SM copy kernel captured in a CUDA graph and timed by replay,
  exactly like the norms (this is the floor the table compares with), and an eager
  ``dst.copy_(src)`` timed with CUDA events (reported for reference only: a captured ``copy_``
  runs well below an eager one, see `workbench.ceilings.sm_copy_bandwidth_gbs`).
* Each norm at ``--batch`` images of ``rows/batch`` rows (default 4x1024, 4x4096, 4x16384), the
  way the engines run it: inside a captured graph, cold L2 (a 256 MB buffer is overwritten
  before every replay), median of ``--reps`` replays. Effective bandwidth counts the minimum
  traffic, 3 bytes per element (read 1 uint8, write 2 bf16), so the eager path's fp32
  temporaries show up as lost bandwidth. "% floor" is the time the SM copy ceiling needs for
  those 3 bytes/element divided by the measured time.
* Every norm again with ``n_valid`` = 25% of the rows (a padded graph bucket): triton_rows skips
  whole padding tiles, the others still touch or launch for every row.
* A sweep of the triton_rows tile configurations; the best per size is reported.

Usage: ``python -m workbench.benchmarks.norm_bandwidth [--rows 4096 16384 65536] [--batch 4]
[--out FILE.json]``. Exit status: 0 ok, 1 a correctness check failed, 2 no CUDA device.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from workbench.config import PRESET_NAMES, VisionConfig
from workbench.ceilings import copy_bandwidth_gbs, sm_copy_bandwidth_gbs
from workbench.formatting import fmt_us
from workbench.norms import NORMS, ROWS_CONFIGS, make_norm, normalize_reference
from workbench.timing import graph_replay_us
from workbench.ulps import bf16_ulps

OUT_DTYPE = torch.bfloat16
CHECK_DTYPES = (torch.bfloat16, torch.float32)
FP32_ATOL = 1e-6   # fp32 rounding of scale, shift, product and sum: < 6e-7 for |y| < 4
CHECK_ROWS = 4133  # not a multiple of any tile height, so every kernel sees a partial tile


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.benchmarks.norm_bandwidth",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[4096, 16384, 65536],
                   help="total pixel rows per measurement (all images of the batch together)")
    p.add_argument("--batch", type=int, default=4,
                   help="images the rows are split into (labels only: the norm sees one "
                        "concatenated [N, patch_dim] tensor, as in the engines)")
    p.add_argument("--preset", default="qwen2.5-vl-7b", choices=PRESET_NAMES)
    p.add_argument("--reps", type=int, default=50, help="timed graph replays per measurement")
    p.add_argument("--valid-frac", type=float, default=0.25, help="n_valid / N for the padded runs")
    p.add_argument("--copy-bytes", type=int, default=1 << 30, help="buffer size of the copy ceilings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-sweep", action="store_true", help="skip the triton_rows config sweep")
    p.add_argument("--out", help="also write the JSON result to this file")
    return p.parse_args(argv)


# ---- correctness ---------------------------------------------------------------------------

def _compare(y: torch.Tensor, x: torch.Tensor, ref: torch.Tensor, name: str) -> tuple[bool, str]:
    """Whether the written rows y match the reference; a short detail string either way."""
    if torch.isnan(y).any():
        return False, f"{int(torch.isnan(y).sum())} elements not written (NaN poison left)"
    if name == "identity":
        ok = torch.equal(y, x.to(y.dtype))
        return ok, "plain cast" if ok else "differs from x.to(out_dtype)"
    if y.dtype == torch.bfloat16:
        ulps = int(bf16_ulps(y, ref.to(torch.bfloat16)).max()) if y.numel() else 0
        return ulps <= 1, f"max {ulps} bf16 ulp"
    err = float((y.double() - ref).abs().max()) if y.numel() else 0.0
    return err <= FP32_ATOL, f"max abs err {err:.2e}"


def check_norm(norm, x: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype) -> list[dict]:
    """All checks of one norm and out dtype; one record per check."""
    n = x.shape[0]
    poison = torch.full(x.shape, float("nan"), dtype=out_dtype, device=x.device)
    records = []
    out = poison.clone()
    y = norm(x, out_dtype, out=out)
    ok, detail = _compare(out, x, ref, norm.name)
    ok = ok and y is out
    records.append(dict(check="full", ok=ok, detail=detail))
    for n_valid in (0, max(1, n // 3) + 3, n):
        out = poison.clone()
        norm(x, out_dtype, out=out, n_valid=torch.tensor(n_valid, dtype=torch.int32, device=x.device))
        ok, detail = _compare(out[:n_valid], x[:n_valid], ref[:n_valid], norm.name)
        kept = torch.equal(out[n_valid:].view(torch.uint8), poison[n_valid:].view(torch.uint8))
        if not kept:
            detail += "; rows past n_valid were written"
        records.append(dict(check=f"n_valid={n_valid}", ok=ok and kept, detail=detail))
    return records


def check_all(cfg: VisionConfig, device: torch.device, seed: int) -> list[dict]:
    gen = torch.Generator(device=device)
    results = []
    variants = [(name, {}) for name in NORMS] + [("triton_rows", dict(c)) for c in ROWS_CONFIGS[1:]]
    for i, (name, rows_cfg) in enumerate(variants):
        norm = make_norm(name, cfg, **rows_cfg).to(device)
        for out_dtype in CHECK_DTYPES:
            gen.manual_seed(seed + i)
            x = torch.randint(0, 256, (CHECK_ROWS, cfg.patch_dim), dtype=torch.uint8, device=device,
                              generator=gen)
            ref = normalize_reference(x, cfg)
            for rec in check_norm(norm, x, ref, out_dtype):
                results.append(dict(norm=name, config=rows_cfg or None,
                                    out_dtype=str(out_dtype).replace("torch.", ""), **rec))
    return results


# ---- timing --------------------------------------------------------------------------------

def time_norm(norm, x: torch.Tensor, reps: int, n_valid: torch.Tensor | None = None) -> dict:
    if n_valid is None:
        return graph_replay_us(lambda: norm(x, OUT_DTYPE), reps=reps)
    out = torch.zeros(x.shape, dtype=OUT_DTYPE, device=x.device)
    return graph_replay_us(lambda: norm(x, OUT_DTYPE, out=out, n_valid=n_valid), reps=reps)


def _record(impl, config, label, n_rows, n_valid, t, cfg, floor_gbs) -> dict:
    model = make_norm(impl, cfg).traffic(n_rows, torch.uint8, OUT_DTYPE, n_valid=n_valid,
                                         out=n_valid is not None)
    floor_us = model["min_bytes"] / (floor_gbs * 1e3)
    return dict(impl=impl, config=config, rows=label, n_rows=n_rows, n_valid=n_valid,
                p50_us=t["p50_us"], p10_us=t["p10_us"], p90_us=t["p90_us"],
                gbs=model["min_bytes"] / (t["p50_us"] * 1e3), floor_us=floor_us,
                pct_floor=100.0 * floor_us / t["p50_us"], traffic_ratio=model["traffic_ratio"])


def _print_table(records: list[dict], full_p50: dict, name_of=lambda r: r["impl"]) -> None:
    head = (f"{'implementation':<24} {'rows':>9} {'N':>7} {'valid':>7} {'p50':>10} {'p10':>10} "
            f"{'p90':>10} {'GB/s':>7} {'% floor':>8} {'vs full':>8}")
    print(head)
    print("-" * len(head))
    for r in records:
        vs = ""
        if r["n_valid"] is not None and (r["impl"], r["n_rows"]) in full_p50:
            vs = f"{r['p50_us'] / full_p50[(r['impl'], r['n_rows'])]:.2f}x"
        valid = "" if r["n_valid"] is None else str(r["n_valid"])
        print(f"{name_of(r):<24} {r['rows']:>9} {r['n_rows']:>7} {valid:>7} {fmt_us(r['p50_us']):>10} "
              f"{fmt_us(r['p10_us']):>10} {fmt_us(r['p90_us']):>10} {r['gbs']:>7.0f} "
              f"{r['pct_floor']:>7.1f}% {vs:>8}")


def _cfg_name(c: dict) -> str:
    return f"{c['block_rows']}x{c['block_cols']}/w{c['num_warps']}"


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("norm_bandwidth: no CUDA device available; this benchmark only measures on a GPU "
              "and reports nothing without one", file=sys.stderr)
        return 2
    import triton  # only for the version string: the kernels import it themselves

    device = _device()
    cfg = VisionConfig.preset(args.preset)
    bad_rows = [n for n in args.rows if n <= 0 or n % args.batch]
    if bad_rows:
        print(f"--rows {bad_rows} must be positive multiples of --batch {args.batch}", file=sys.stderr)
        return 2
    started = time.time()
    result = dict(benchmark="norm_bandwidth", device=torch.cuda.get_device_name(device),
                  torch=torch.__version__, triton=triton.__version__, preset=cfg.name,
                  patch_dim=cfg.patch_dim, out_dtype="bfloat16", rows=args.rows, batch=args.batch,
                  reps=args.reps, seed=args.seed, bytes_per_element=3)
    print(f"# norm_bandwidth on {result['device']} (torch {torch.__version__}, triton "
          f"{triton.__version__}); preset {cfg.name}, patch_dim {cfg.patch_dim}; seed {args.seed}")

    # 1. correctness
    checks = check_all(cfg, device, args.seed)
    failed = [c for c in checks if not c["ok"]]
    result["correct"] = not failed
    result["correctness"] = checks
    print(f"\n## correctness: {len(checks) - len(failed)}/{len(checks)} checks pass "
          f"({CHECK_ROWS} rows; fp32 atol {FP32_ATOL:g}, bf16 <= 1 ulp, n_valid poison kept)")
    for c in failed:
        print(f"  FAIL {c['norm']} {c['config'] or ''} {c['out_dtype']} {c['check']}: {c['detail']}")
    broken = {(c["norm"], json.dumps(c["config"], sort_keys=True)) for c in failed}

    # 2. ceilings
    sm_gbs = sm_copy_bandwidth_gbs(device, n_bytes=args.copy_bytes)
    copy_gbs = copy_bandwidth_gbs(device, n_bytes=args.copy_bytes)
    result["sm_copy_gbs"], result["copy_gbs"] = sm_gbs, copy_gbs
    print(f"\n## copy ceilings ({args.copy_bytes / 2**20:.0f} MiB, read + write counted)")
    print(f"  Triton SM copy, graph replay: {sm_gbs:.0f} GB/s   <- the floor below")
    print(f"  eager copy_, CUDA events:     {copy_gbs:.0f} GB/s")

    # 3. every norm, full and padded
    gen = torch.Generator(device=device)
    records, sweep = [], []
    norms = {name: make_norm(name, cfg).to(device) for name in NORMS}
    for n_rows in args.rows:
        gen.manual_seed(args.seed + n_rows)
        x = torch.randint(0, 256, (n_rows, cfg.patch_dim), dtype=torch.uint8, device=device,
                          generator=gen)
        label = f"{args.batch}x{n_rows // args.batch}"
        n_valid = int(n_rows * args.valid_frac)
        nv = torch.tensor(n_valid, dtype=torch.int32, device=device)
        for name, norm in norms.items():
            if (name, json.dumps(None)) in broken:
                continue
            records.append(_record(name, None, label, n_rows, None, time_norm(norm, x, args.reps),
                                   cfg, sm_gbs))
        for name, norm in norms.items():
            if (name, json.dumps(None)) in broken:
                continue
            records.append(_record(name, None, label, n_rows, n_valid,
                                   time_norm(norm, x, args.reps, nv), cfg, sm_gbs))
        if not args.no_sweep:
            for c in ROWS_CONFIGS:
                key = json.dumps(None if c == ROWS_CONFIGS[0] else dict(c), sort_keys=True)
                if ("triton_rows", key) in broken:
                    continue
                norm = make_norm("triton_rows", cfg, **c).to(device)
                sweep.append(_record("triton_rows", dict(c), label, n_rows, None,
                                     time_norm(norm, x, args.reps), cfg, sm_gbs))
        del x
        torch.cuda.empty_cache()

    full_p50 = {(r["impl"], r["n_rows"]): r["p50_us"] for r in records if r["n_valid"] is None}
    print(f"\n## bf16 output, graph replays, cold L2, median of {args.reps} "
          f"(GB/s at 3 B/element; % floor = SM-copy time for 3 B/element / time; "
          f"padded rows: n_valid = {args.valid_frac:.0%}, GB/s and floor over the valid rows)")
    _print_table(records, full_p50)
    result["results"] = records

    if sweep:
        print("\n## triton_rows tile sweep (block_rows x block_cols / num_warps)")
        _print_table(sweep, {}, name_of=lambda r: f"triton_rows {_cfg_name(r['config'])}")
        best = {}
        for r in sweep:
            if r["n_rows"] not in best or r["p50_us"] < best[r["n_rows"]]["p50_us"]:
                best[r["n_rows"]] = r
        # overall: the config with the lowest total time over all sizes it was measured at
        totals = {}
        for r in sweep:
            totals.setdefault(_cfg_name(r["config"]), [r["config"], 0.0])[1] += r["p50_us"]
        overall = min(totals.values(), key=lambda v: v[1])[0]
        for n_rows, r in best.items():
            print(f"  best at N={n_rows}: {_cfg_name(r['config'])} {fmt_us(r['p50_us'])} "
                  f"({r['pct_floor']:.1f}% of floor)")
        print(f"  best overall (sum over sizes): {_cfg_name(overall)}; default is "
              f"{_cfg_name(ROWS_CONFIGS[0])}")
        result["rows_sweep"] = sweep
        result["best_rows_config"] = dict(overall=overall,
                                          per_size={str(k): v["config"] for k, v in best.items()})

    result["elapsed_s"] = round(time.time() - started, 1)
    line = json.dumps(result, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    print(line)
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
