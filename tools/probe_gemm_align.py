"""One-call H200 probe for issue 33's aligned GEMMs: does padding the SwiGLU MLP's hidden width
(Qwen2.5-VL's 3420, not a multiple of 8) to a multiple of 64 when the tower is built
(`build_encoder(..., gemm_align=64)`, the default) make the tower faster without changing what it
computes?

(a) Correctness first. A full-width qwen2.5-vl-7b tower at depth DEPTH (bf16, random weights drawn
alike from one seed) built with gemm_align=64 and with gemm_align=1 encodes a batch of real
photos, on the plain-op path (fused=False) and on the fused path (fused='auto': the Triton block
kernels on CUDA). Both settings must agree within bf16 rounding (relative error below BF16_TOL)
and the padded one must be as close to a float32 tower as the unpadded one (the rule of
tests/test_cuda.py: within 1.25x + 1e-3). Timings follow only when that holds.

(b) Timings, eager (no graphs): `workbench.timing.cuda_event_ms`, each call between CUDA events
after an L2 flush (`timing.FLUSH_BYTES` overwritten), the median of REPS calls after WARMUP, at
4096 / 16384 / 65536 rows, for both settings:
- one block's MLP: its two GEMMs alone (gate|up as one matmul, as the fused path runs it; down)
  and the whole MLP (plain ops and fused kernels);
- the whole tower's `forward_prepared` (frames of 64 x 64 patches, so attention costs the same in
  both settings), plain and fused.
TFLOP/s count the real hidden width (2 x rows x width x hidden per matmul): the padding's extra
arithmetic counts as no work, which is what the floors mean (`workbench.floors`).

Run on the device from the repo root: `PYTHONPATH=$PWD python3 tools/probe_gemm_align.py`. It
writes $OUT/probe_gemm_align.json when OUT is set and ends with the same record as one JSON line.
Without CUDA (or with --cpu) it runs every step on a tiny tower with an unaligned width (90) in
float32 on the CPU, timed on the host clock: a check of the script, not numbers to keep.
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import workbench as wb
from workbench.reference import rel_err
from workbench.timing import FLUSH_BYTES, cpu_time_us, cuda_event_ms

PRESET, DEPTH = "qwen2.5-vl-7b", 4
ROWS = (4096, 16384, 65536)
FRAME_ROWS = 4096                # 64 x 64 patches per frame in the tower timings
ALIGNS = (64, 1)
FUSED = {"plain": False, "fused": "auto"}
BF16_TOL = 2e-2                  # relative error two bf16 towers of the same weights may differ by
REPS, WARMUP = 25, 5             # warm-up: cuBLAS heuristics, Triton compiles, the allocator settles
PHOTOS = ("chelsea", "coffee", "rocket")


@dataclasses.dataclass(frozen=True)
class Setup:
    """What one run measures: the tower config, its dtype and device, the row counts and reps."""

    cfg: wb.VisionConfig
    dtype: torch.dtype
    device: torch.device
    norm: str
    rows: tuple[int, ...]
    reps: int
    warmup: int


def gpu_setup() -> Setup:
    # photos capped at 448 x 448 px: the float32 reference attends through a dense masked SDPA
    cfg = dataclasses.replace(wb.VisionConfig.preset(PRESET, depth=DEPTH), max_pixels=448 * 448)
    return Setup(cfg, torch.bfloat16, torch.device("cuda"), "triton_rows", ROWS, REPS, WARMUP)


def cpu_setup() -> Setup:
    cfg = dataclasses.replace(wb.VisionConfig.preset("tiny-qwen2.5-vl"), mlp_hidden=90, max_pixels=112 * 112)
    return Setup(cfg, torch.float32, torch.device("cpu"), "eager", (256, 1024), 3, 1)


def encoder(s: Setup, gemm_align: int, fused, dtype=None):
    return wb.build_encoder(s.cfg, placement="tower", norm=s.norm, dtype=dtype or s.dtype, device=s.device,
                            seed=0, fused=fused, gemm_align=gemm_align)


# ---- (a) correctness ------------------------------------------------------------------------------

def check(s: Setup) -> dict:
    """Both settings on the photo batch, per path, against each other and a float32 tower."""
    batch = wb.preprocess([wb.sample_images(PHOTOS)[n] for n in PHOTOS], s.cfg)
    ref = encoder(s, 1, False, torch.float32).encode(batch).float()
    out = {"rows": batch.n_rows}
    for path, fused in FUSED.items():
        got = {a: encoder(s, a, fused).encode(batch).float() for a in ALIGNS}
        padded, plain = (rel_err(got[a], ref) for a in ALIGNS)
        between = rel_err(got[ALIGNS[0]], got[ALIGNS[1]])
        out[path] = {"rel_err_between": between, "rel_err_vs_fp32_align64": padded,
                     "rel_err_vs_fp32_align1": plain,
                     "ok": bool(between < BF16_TOL and padded <= 1.25 * plain + 1e-3)}
        print(f"check {path}: align 64 vs 1 {between:.2e}; vs float32: align 64 {padded:.2e}, "
              f"align 1 {plain:.2e}", flush=True)
    out["ok"] = all(out[p]["ok"] for p in FUSED)
    return out


# ---- (b) timings ----------------------------------------------------------------------------------

def median_ms(fn, s: Setup) -> float:
    """Median device time of ``fn()`` in ms: CUDA events after an L2 flush, or the host clock."""
    if s.device.type != "cuda":
        return cpu_time_us(fn, reps=s.reps, warmup=s.warmup)["p50_us"] / 1e3
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=s.device)
    return statistics.median(cuda_event_ms(fn, s.reps, warmup=s.warmup, before=lambda: flush.fill_(1)))


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def time_mlp(mlp, rows: int, s: Setup) -> dict:
    """One block's MLP at ``rows`` rows: its GEMMs alone and whole, ms and real-work TFLOP/s."""
    width, hidden = mlp.gate_proj.in_features, mlp.gate_proj.out_features
    gen = torch.Generator(device=s.device).manual_seed(rows)
    h = torch.randn(rows, width, generator=gen, device=s.device).to(s.dtype)
    act = torch.randn(rows, mlp.padded_hidden, generator=gen, device=s.device).to(s.dtype)
    matmul = 2 * rows * width * hidden                  # FLOPs of one of the three real matmuls
    calls = {"gate_up_gemm": (lambda: F.linear(h, mlp.gate_up_weight, mlp.gate_up_bias), 2 * matmul),
             "down_gemm": (lambda: F.linear(act, mlp.down_weight, mlp.down_proj.bias), matmul),
             "mlp_plain": (lambda: mlp(h), 3 * matmul),
             "mlp_fused": (lambda: mlp.forward_fused(h), 3 * matmul)}
    if s.device.type != "cuda":
        calls.pop("mlp_fused")                          # the fused kernels run on CUDA only
    out = {}
    for name, (fn, flops) in calls.items():
        ms = median_ms(fn, s)
        out[f"{name}_ms"], out[f"{name}_tflops"] = ms, tflops(flops, ms)
    return out


def time_tower(tower, rows: int, s: Setup) -> float:
    """Median ms of the tower's device forward over ``rows`` rows of frames of FRAME_ROWS rows."""
    side = int(min(rows, FRAME_ROWS) ** 0.5)
    grid = torch.tensor([[1, side, side]] * (rows // (side * side)))
    meta = tower.prepare(grid)
    pixels = torch.randint(0, 256, (rows, s.cfg.patch_dim), dtype=torch.uint8, device=s.device)
    return median_ms(lambda: tower.forward_prepared(pixels, meta), s)


def timings(s: Setup) -> dict:
    towers = {(a, p): encoder(s, a, f).visual for a in ALIGNS for p, f in FUSED.items()}
    out = {}
    for rows in s.rows:
        row = {}
        for a in ALIGNS:
            r = time_mlp(towers[a, "plain"].blocks[0].mlp, rows, s)
            for p in FUSED:
                r[f"tower_{p}_ms"] = time_tower(towers[a, p], rows, s)
            row[f"align{a}"] = r
        row["speedup"] = {k[:-3]: row["align1"][k] / row["align64"][k] for k in row["align64"] if k.endswith("_ms")}
        out[str(rows)] = row
        print(f"{rows} rows: " + "; ".join(
            f"{k} align64 {row['align64'][k + '_ms']:.3f} ms vs align1 {row['align1'][k + '_ms']:.3f} ms "
            f"({v:.2f}x)" + (f", {row['align64'][k + '_tflops']:.0f} vs {row['align1'][k + '_tflops']:.0f} TFLOP/s"
                             if k + "_tflops" in row["align64"] else "")
            for k, v in row["speedup"].items()), flush=True)
    return out


def run(s: Setup) -> dict:
    mlp = encoder(s, ALIGNS[0], False).visual.blocks[0].mlp
    record = {"probe": "gemm_align", "preset": s.cfg.name, "dtype": str(s.dtype).removeprefix("torch."),
              "device": torch.cuda.get_device_name() if s.device.type == "cuda" else "cpu",
              "torch": torch.__version__, "hidden": mlp.gate_proj.out_features, "padded_hidden": mlp.padded_hidden,
              "reps": s.reps, "warmup": s.warmup}
    with torch.inference_mode():
        record["check"] = check(s)
        if record["check"]["ok"]:           # a time of a wrong result means nothing
            record["rows"] = timings(s)
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the tiny CPU run (the default without CUDA)")
    args = ap.parse_args(argv)
    record = run(cpu_setup() if args.cpu or not torch.cuda.is_available() else gpu_setup())
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe_gemm_align.json"), "w") as f:
            json.dump(record, f, indent=1)
    print(json.dumps(record))
    return 0 if record["check"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
