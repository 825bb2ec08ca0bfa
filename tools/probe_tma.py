"""One-call H200 probe: does a TMA-fed, persistent Triton GEMM (Hopper wgmma, tiles loaded by the
tensor-memory accelerator, optionally warp-specialized) reach cuBLAS on the 7B towers' linear layers,
so that the MLP activation can ride in its epilogue? And how fast can the rotary pass go?

`tools/probe_gemm.py` showed that a pointer-based Triton GEMM loses to cuBLAS everywhere (1.2-1.8x),
so fusing the activation into it does not pay. This probe repeats the question with TMA descriptors:

- per shape (qkv, proj, MLP in / out of both 7B presets) at 256, 4096 and 16384 rows, a CUDA-graph
  replay of 32 layers with 32 distinct weights (weights stream from HBM; L2 flushed before each):
  ``cublas`` (F.linear with bias, the tower's call) against each TMA tile configuration;
- MLP-in with its activation: F.linear + the fused QuickGELU / SiLU-mul kernel (what the tower runs)
  against one TMA GEMM with the activation in its epilogue (SiLU-mul reads the gate and up tiles of
  the packed gate|up weight and writes only the product);
- rotary: the two kernels of `workbench.fused.rotary_` (per (row, head) pair; row-tiled, cos/sin
  loaded once per row for every head, bit-equal), from 256 to 16384 rows (writes probe_rotary.json).

Every variant is checked against an fp32 reference (max relative error) and, for the epilogues,
against the tower's unfused output (fraction of bit-equal elements; the GEMM's summation order
need not be cuBLAS's). Writes $OUT/probe_tma.json. Run on the device
from the repo root: ``PYTHONPATH=$PWD python3 tools/probe_tma.py``; with TRITON_INTERPRET=1 on a CPU
it runs a tiny self-check (no timings). ``tools/probe_tma.py rotary`` times only the two rotary kernels
of `workbench.fused` from 256 to 16384 rows (where `ROTARY_ROWS_MIN` should sit).

Its runs on the H200 (2026-11-30, Triton 3.6; results/reference/probe_tma-h200-20261130.json and,
with this version of the script, probe_tma-h200-20261130-run2.json):
- The best TMA tile per shape took 1.09-1.72x / 1.06-1.74x cuBLAS's time at 256 rows (first /
  second run), 1.06-1.32x / 1.11-1.31x at 4096 rows and 0.996-1.08x / 0.97-1.12x at 16384 rows. It
  beat cuBLAS only on MLP-out at 16384 rows: by 0.3-0.4% in the first run, and for qwen2-vl-7b's
  fc2 by 2.9% in the second.
- With the activation in its epilogue, MLP-in took 0.965-1.06x / 0.985-1.09x the time of F.linear
  plus the separate activation pass. In the first run: qwen2.5-vl-7b gate|up + SiLU-mul 522.1 vs
  534.9 us at 16384 rows and 129.8 vs 134.5 at 4096; qwen2-vl-7b fc1 + QuickGELU 428.6 vs 419.5
  and 104.2 vs 98.6. Every configuration gave the same bits as the unfused path (its fp32 sums
  happened to round alike), except one: the warp-specialized configuration with two accumulators
  returned NaN in some elements at 256 rows, in both runs.
- The row-tiled rotary kernel (then written in this script, now `workbench.fused`) was bit-equal
  to the tower's and took 48.0 instead of 66.0 us at 16384 rows, 13.3 instead of 15.8 at 4096,
  but 3.5 instead of 2.9 us at 256 rows; `probe_rotary-h200-20261130.json` has both kernels of
  `workbench.fused` from 256 rows (the row-tiled one is faster from 1024).

So fusing the activation into a Triton GEMM does not remove the elementwise time that keeps the
encoder above 1.25x of its practical floor; the rotary kernel went into workbench.fused."""
import json
import os
import sys
import time

import workbench.triton_support  # noqa: F401,E402  (TRITON_INTERPRET on a machine without CUDA)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402


@triton.jit
def _tma_gemm(a_desc, w_desc, c_desc, b_ptr, M, N, K, HP,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
              PROGS: tl.constexpr, ACT: tl.constexpr, WS: tl.constexpr):
    # c[M, N] = act(a[M, K] @ w[N, K]^T + b); ACT 0: none, 1: QuickGELU, 2: SiLU(gate) * up with
    # gate = rows [0, HP) of w and up = rows [HP, 2 HP) (N = HP)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    tiles = num_m * num_n
    for tile in tl.range(pid, tiles, PROGS, warp_specialize=WS):
        width = GROUP * num_n
        first_m = (tile // width) * GROUP
        size_m = tl.minimum(num_m - first_m, GROUP)
        pid_m = first_m + (tile % width) % size_m
        pid_n = (tile % width) // size_m
        om = pid_m * BM
        on = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc2 = tl.zeros((BM, BN), dtype=tl.float32)
        for kk in range(k_tiles):
            ok = kk * BK
            a = a_desc.load([om, ok])
            acc = tl.dot(a, w_desc.load([on, ok]).T, acc)
            if ACT == 2:
                acc2 = tl.dot(a, w_desc.load([HP + on, ok]).T, acc2)
        rn = on + tl.arange(0, BN)
        nm = rn < N
        y = (acc + tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :]).to(c_desc.dtype)
        if ACT == 1:   # the unfused QuickGELU's three roundings on the rounded linear output
            xf = y.to(tl.float32)
            s = (1.0 / (1.0 + tl.exp(-((1.702 * xf).to(c_desc.dtype).to(tl.float32))))).to(c_desc.dtype)
            y = (xf * s.to(tl.float32)).to(c_desc.dtype)
        if ACT == 2:
            g = y.to(tl.float32)
            u = (acc2 + tl.load(b_ptr + HP + rn, mask=nm, other=0.0).to(tl.float32)[None, :]).to(c_desc.dtype)
            sg = (g / (1.0 + tl.exp(-g))).to(c_desc.dtype).to(tl.float32)
            y = (sg * u.to(tl.float32)).to(c_desc.dtype)
        c_desc.store([om, on], y)


def _alloc(size, align, stream):  # scratch for device-side descriptors, if the compiler asks for any
    return torch.empty(size, dtype=torch.int8, device="cuda")


def tma_gemm(x, w, b, cfg, act=0, out=None, sms=132):
    """act(x @ w^T + b) with TMA tiles; act 2 takes w = [gate; up] (2*HP rows) and returns HP columns."""
    bm, bn, bk, warps, stages, persistent, ws = cfg
    M, K = x.shape
    N = w.shape[0] // 2 if act == 2 else w.shape[0]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    progs = min(sms, tiles) if persistent else tiles
    _tma_gemm[(progs,)](TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                        TensorDescriptor.from_tensor(out, [bm, bn]), b, M, N, K, N,
                        BM=bm, BN=bn, BK=bk, GROUP=8, PROGS=progs, ACT=act, WS=ws,
                        num_warps=warps, num_stages=stages, enable_fp_fusion=False)
    return out


def cfg_name(cfg):
    bm, bn, bk, warps, stages, persistent, ws = cfg
    return f"tma[{bm}x{bn}x{bk},w{warps},st{stages}{',p' if persistent else ''}{',ws' if ws else ''}]"


SHAPES = {   # (K, N) of nn.Linear(K, N) per block; gate_up is the packed [gate; up] weight
    "qwen2-vl-7b": {"qkv": (1280, 3840), "proj": (1280, 1280), "fc1": (1280, 5120), "fc2": (5120, 1280)},
    "qwen2.5-vl-7b": {"qkv": (1280, 3840), "proj": (1280, 1280), "gate_up": (1280, 6912), "down": (3456, 1280)},
}
SMALL = [(64, 64, 64, 4, 4, False, False), (64, 128, 64, 4, 4, False, False), (64, 64, 128, 4, 3, False, False),
         (64, 128, 128, 4, 3, False, False), (128, 64, 64, 4, 4, False, False), (64, 64, 64, 4, 4, True, False),
         (64, 128, 64, 4, 4, True, True)]
LARGE = [(128, 256, 64, 8, 3, True, False), (128, 256, 64, 8, 4, False, False), (128, 128, 64, 4, 4, True, False),
         (128, 128, 64, 8, 4, True, True), (128, 256, 64, 8, 3, True, True), (256, 128, 64, 8, 3, True, False)]
LAYERS = 32


def selfcheck():
    torch.manual_seed(0)
    for M, N, K, act in [(40, 48, 96, 0), (40, 48, 96, 1), (40, 48, 96, 2)]:
        x, w, b = torch.randn(M, K), torch.randn(2 * N if act == 2 else N, K), torch.randn(2 * N if act == 2 else N)
        lin = x @ w.T + b
        ref = lin if act == 0 else lin * torch.sigmoid(1.702 * lin) if act == 1 else F.silu(lin[:, :N]) * lin[:, N:]
        got = tma_gemm(x, w, b, (16, 16, 32, 4, 1, True, False), act=act, sms=2)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        print(f"selfcheck tma {M}x{N}x{K} act {act}: max rel err {err:.2e}")
        assert err < 1e-5, err
    from workbench import fused as fk
    qkv = torch.randn(7, 3, 3, 10).to(torch.bfloat16)
    cos, sin = torch.randn(7, 10), torch.randn(7, 10)
    fk.ROTARY_ROWS_MIN = 8
    ref = fk.rotary_(qkv.clone(), cos, sin)
    fk.ROTARY_ROWS_MIN = 1
    got = fk.rotary_(qkv.clone(), cos, sin)
    print("selfcheck: both rotary kernels give the same bits:", bool(torch.equal(got, ref)))
    assert torch.equal(got, ref)


def layers_us(ws, bs, step):
    """Per-layer device time of ``step(w, b)`` over the LAYERS weights, as one graph replay."""
    from workbench.timing import graph_replay_us
    return graph_replay_us(lambda: [step(w, b) for w, b in zip(ws, bs)], reps=15)["p50_us"] / LAYERS


def layer_weights(N, K, dev, dt):
    return ([torch.randn(N, K, device=dev, dtype=dt) * K ** -0.5 for _ in range(LAYERS)],
            [torch.randn(N, device=dev, dtype=dt) * 0.1 for _ in range(LAYERS)])


def rel(y, ref):
    return float(((y.float() - ref).abs().max() / ref.abs().max()).item())


def rotary_only():
    """Both rotary kernels of workbench.fused (forced through ROTARY_ROWS_MIN) from 256 to 16384 rows."""
    from workbench import fused as fk
    from workbench.timing import graph_replay_us
    res = {}
    for rows in (256, 512, 1024, 2048, 4096, 16384):
        qkv = torch.randn(rows, 3, 16, 80, device="cuda", dtype=torch.bfloat16)
        ang = torch.rand(rows, 40, device="cuda") * 6.28
        cos, sin = torch.cat([ang.cos()] * 2, -1).contiguous(), torch.cat([ang.sin()] * 2, -1).contiguous()
        bufs = [qkv.clone() for _ in range(LAYERS)]
        entry = {}
        for kernel, bound in (("pairs", rows + 1), ("tiled", 1)):
            fk.ROTARY_ROWS_MIN = bound
            entry[kernel + "_us"] = graph_replay_us(lambda: [fk.rotary_(q, cos, sin) for q in bufs],
                                                    reps=15)["p50_us"] / LAYERS
        print(f"rotary {rows} rows: {entry}", flush=True)
        res[str(rows)] = entry
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_rotary.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "layers_per_replay": LAYERS, "rows": res}, f, indent=1)


def main():
    from workbench.fused import quick_gelu, silu_mul

    dev = torch.device("cuda")
    dt = torch.bfloat16
    triton.set_allocator(_alloc)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res = {"env": {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name(),
                   "sms": sms}, "layers_per_replay": LAYERS, "rows": {}, "epilogue": {}}
    out_dir = os.environ.get("OUT", "/tmp")

    def save():
        with open(os.path.join(out_dir, "probe_tma.json"), "w") as f:
            json.dump(res, f, indent=1)

    torch.manual_seed(0)
    t0 = time.time()
    for rows, cfgs in ((256, SMALL), (4096, LARGE), (16384, LARGE)):
        for preset, shapes in SHAPES.items():
            for lin, (K, N) in shapes.items():
                if preset == "qwen2.5-vl-7b" and lin in ("qkv", "proj"):
                    continue   # the same shapes as qwen2-vl-7b
                key = f"{preset}/{lin}/{rows}"
                x = torch.randn(rows, K, device=dev, dtype=dt)
                ws, bs = layer_weights(N, K, dev, dt)
                ref = x.float() @ ws[0].float().T + bs[0].float()
                out = torch.empty(rows, N, device=dev, dtype=dt)
                row = {"flops": 2 * rows * K * N, "weight_bytes": 2 * K * N,
                       "cublas": {"us": layers_us(ws, bs, lambda w, b: F.linear(x, w, b)),
                                  "err": rel(F.linear(x, ws[0], bs[0]), ref)}}
                for cfg in cfgs:
                    try:
                        e = rel(tma_gemm(x, ws[0], bs[0], cfg, sms=sms), ref)
                        row[cfg_name(cfg)] = {"err": e, "us": layers_us(
                            ws, bs, lambda w, b, cfg=cfg: tma_gemm(x, w, b, cfg, out=out, sms=sms))}
                    except Exception as ex:  # noqa: BLE001 - a config that does not compile or fit: record why
                        row[cfg_name(cfg)] = {"error": f"{type(ex).__name__}: {str(ex)[:300]}"}
                best = min((v["us"], k) for k, v in row.items() if isinstance(v, dict) and "us" in v)
                row["best"] = best[1]
                print(f"[{time.time() - t0:.0f}s] {key}: cublas {row['cublas']['us']:.1f} us, best {best[1]} "
                      f"{best[0]:.1f} us ({row['flops'] / best[0] / 1e6:.0f} TFLOP/s)", flush=True)
                res["rows"][key] = row
                save()
    # MLP-in with its activation, as the tower runs it vs one TMA GEMM with the activation in the epilogue
    for rows in (256, 4096, 16384):
        for preset, (K, N), act in (("qwen2-vl-7b", (1280, 5120), 1), ("qwen2.5-vl-7b", (1280, 6912), 2)):
            key = f"{preset}/mlp_in+act/{rows}"
            x = torch.randn(rows, K, device=dev, dtype=dt)
            ws, bs = layer_weights(N, K, dev, dt)
            actf = quick_gelu if act == 1 else silu_mul
            unfused = actf(F.linear(x, ws[0], bs[0]))
            lin = x.float() @ ws[0].float().T + bs[0].float()
            ref = lin * torch.sigmoid(1.702 * lin) if act == 1 else F.silu(lin[:, :N // 2]) * lin[:, N // 2:]
            row = {"cublas+act": {"us": layers_us(ws, bs, lambda w, b: actf(F.linear(x, w, b))),
                                  "err": rel(unfused, ref)}}
            out = torch.empty_like(unfused)
            for cfg in (SMALL if rows == 256 else LARGE):
                try:
                    y = tma_gemm(x, ws[0], bs[0], cfg, act=act, sms=sms)
                    row[cfg_name(cfg) + "+act"] = {
                        "us": layers_us(ws, bs, lambda w, b, cfg=cfg: tma_gemm(x, w, b, cfg, act=act, out=out, sms=sms)),
                        "err": rel(y, ref), "bit_equal_to_unfused": float((y == unfused).float().mean().item())}
                except Exception as ex:  # noqa: BLE001
                    row[cfg_name(cfg) + "+act"] = {"error": f"{type(ex).__name__}: {str(ex)[:300]}"}
            best = min((v["us"], k) for k, v in row.items() if "us" in v)
            row["best"] = best[1]
            print(f"[{time.time() - t0:.0f}s] {key}: cublas+act {row['cublas+act']['us']:.1f} us, best {best[1]} "
                  f"{best[0]:.1f} us", flush=True)
            res["epilogue"][key] = row
            save()
    rotary_only()

if __name__ == "__main__":
    if not torch.cuda.is_available():
        selfcheck()
        sys.exit(0)
    rotary_only() if sys.argv[1:] == ["rotary"] else main()
