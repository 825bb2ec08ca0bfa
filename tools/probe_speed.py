"""One-call H200 probe for the encoder-speed work: a kernel-level profile of the eager towers and
their graph replay times, then attention kernels on the vision shapes (flash varlen, SDPA's cuDNN,
flash and memory-efficient backends; dense SDPA with a key-padding mask). Run on the device from
the repo root: `PYTHONPATH=$PWD python3 tools/probe_speed.py` (writes $OUT/probe.json).
Its first run (before the fused kernels) found the numbers quoted in workbench/attention.py and
workbench/towers/qwen2_5_vl.py."""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.varlen import varlen_attn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
import workbench as wb  # noqa: E402
from workbench.timing import cuda_event_ms  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
res = {"env": {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
               "gpu": torch.cuda.get_device_name()}}
dev = torch.device("cuda")
H, D = 16, 80


def bench(fn, reps=20, warm=3):
    ts = sorted(cuda_event_ms(fn, reps, warmup=warm, sync_each=True))
    return ts[len(ts) // 2]


def cu(sizes):
    o = [0]
    for s in sizes:
        o.append(o[-1] + s)
    return torch.tensor(o, dtype=torch.int32, device=dev)


def ref_attn(q, k, v, offs):
    out = torch.zeros_like(q)
    for s, e in zip(offs[:-1], offs[1:]):
        out[s:e] = F.scaled_dot_product_attention(q[s:e].transpose(0, 1).float(), k[s:e].transpose(0, 1).float(),
                                                  v[s:e].transpose(0, 1).float()).transpose(0, 1).to(q.dtype)
    return out


def b_varlen(q, k, v, c, m):
    return varlen_attn(q, k, v, c, c, m, m)


def b_cudnn_varlen(q, k, v, c, m):
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, c, c, m, m, False, 0.0, False, False)[0]


def b_flash_direct(q, k, v, c, m):
    return torch.ops.aten._flash_attention_forward(q, k, v, c, c, m, m, 0.0, False, False)[0]


BACKENDS = {"varlen": b_varlen, "flash_direct": b_flash_direct}

# ---------------------------------------------------------------- tower profile

prof_rows = []
replay = []
for preset in ("qwen2-vl-7b", "qwen2.5-vl-7b"):
    enc = wb.build_encoder(preset, placement="tower", norm="triton_rows", dtype=torch.bfloat16, device="cuda")
    cfg = enc.cfg
    for tokens in (64, 1024, 4096):
        rows = tokens * 4
        grid = torch.tensor([[1, 2 * int(tokens ** 0.5), 2 * int(tokens ** 0.5)]]) if int(tokens ** 0.5) ** 2 == tokens \
            else torch.tensor([[1, 2, rows // 2]])
        pix = torch.randint(0, 256, (rows, cfg.patch_dim), dtype=torch.uint8, device=dev)
        tower = enc.visual
        with torch.inference_mode():
            t0 = time.perf_counter(); meta = tower.prepare(grid); torch.cuda.synchronize()
            prep_ms = (time.perf_counter() - t0) * 1e3
            for _ in range(2):
                tower.forward_prepared(pix, meta)
            torch.cuda.synchronize()
            eager_ms = bench(lambda: tower.forward_prepared(pix, meta), reps=5)
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                tower.forward_prepared(pix, meta)
                torch.cuda.synchronize()
            ka = p.key_averages()
            kern = [{"name": e.key[:160], "count": e.count, "us": e.device_time_total} for e in ka
                    if e.device_time_total > 0]
            kern.sort(key=lambda r: -r["us"])
            prof_rows.append({"preset": preset, "tokens": tokens, "eager_ms": eager_ms, "prepare_ms": prep_ms,
                              "kernels": kern[:60], "n_kernels": sum(r["count"] for r in kern),
                              "device_us": sum(r["us"] for r in kern)})
            runner = wb.EncoderGraphRunner(enc, budgets=[tokens], buffer_dtype=torch.uint8, max_items=1)
            capd = runner.graphs[tokens]
            capd.pixels.copy_(pix)
            capd.meta.copy_(runner.budget_metadata(grid, tokens, "cpu"))
            rms = bench(lambda c=capd: c.graph.replay(), reps=10)
            replay.append({"preset": preset, "tokens": tokens, "replay_ms": rms, "eager_ms": eager_ms})
            print(preset, tokens, "eager", round(eager_ms, 2), "replay", round(rms, 2), "prep", round(prep_ms, 2),
                  "kernels", prof_rows[-1]["n_kernels"], flush=True)
            del runner, capd
    del enc
    torch.cuda.empty_cache()
res["profile"] = prof_rows
res["replay"] = replay
json.dump(res, open(os.path.join(OUT, "probe.json"), "w"), indent=1)
# ---------------------------------------------------------------- attention
att = []
shapes = [("full", 256, 256), ("full", 1024, 1024), ("full", 4096, 4096), ("full", 16384, 16384),
          ("window", 1024, 64), ("window", 4096, 64), ("window", 16384, 64), ("packed4", 4096, 1024)]
for kind, n, seq in shapes:
    sizes = [seq] * (n // seq)
    c = cu(sizes)
    offs = c.tolist()
    g = torch.Generator(device=dev).manual_seed(n)
    qkv = torch.randn(n, 3, H, D, device=dev, dtype=torch.bfloat16, generator=g)
    q, k, v = qkv.unbind(1)
    ref = ref_attn(q, k, v, offs) if n <= 4096 else None
    flops = 4 * sum(s * s for s in sizes) * H * D
    row = {"kind": kind, "rows": n, "seq": seq}
    for name, fn in BACKENDS.items():
        try:
            o = fn(q, k, v, c, seq)
            err = None if ref is None else ((o.float() - ref.float()).norm() / ref.float().norm()).item()
            ms = bench(lambda: fn(q, k, v, c, seq))
            row[name] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_err": err}
        except Exception as e:  # noqa: BLE001
            row[name] = {"error": repr(e)[:300]}
    # dense SDPA backends where all sequences are equal: [B, H, S, D]
    for bk in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            B = n // seq
            q4, k4, v4 = (t.reshape(B, seq, H, D).transpose(1, 2) for t in (q, k, v))
            with sdpa_kernel(getattr(SDPBackend, bk)):
                f = lambda: F.scaled_dot_product_attention(q4, k4, v4)
                ms = bench(f)
            row["sdpa_" + bk.lower()] = {"ms": ms, "tflops": flops / ms / 1e9}
        except Exception as e:  # noqa: BLE001
            row["sdpa_" + bk.lower()] = {"error": repr(e)[:300]}
    att.append(row)
    print(kind, n, seq, {k2: (round(v2["tflops"], 1) if "tflops" in v2 else v2.get("error", "")[:80])
                         for k2, v2 in row.items() if isinstance(v2, dict)}, flush=True)
res["attention"] = att


# dense SDPA (cuDNN) over a padded budget with a key-padding mask, under capture with changing n_valid
mres = {}
for n in (1024, 4096, 16384):
    for bk in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            qkv = torch.randn(n, 3, H, D, device=dev, dtype=torch.bfloat16)
            q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.unbind(1))
            nvalid = torch.tensor(n, device=dev)
            keymask = torch.empty(1, 1, 1, n, dtype=torch.bool, device=dev)
            def f():
                torch.lt(torch.arange(n, device=dev), nvalid, out=keymask.view(-1))
                with sdpa_kernel(getattr(SDPBackend, bk)):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=keymask)
            ms = bench(f)
            o = f()
            r = F.scaled_dot_product_attention(q, k, v)
            err = ((o.float() - r.float()).norm() / r.float().norm()).item()
            mres[f"{bk}_{n}"] = {"ms": ms, "tflops": 4 * n * n * H * D / ms / 1e9, "err_full": err}
        except Exception as e:  # noqa: BLE001
            mres[f"{bk}_{n}"] = {"error": repr(e)[:200]}
        print("mask", bk, n, mres[f"{bk}_{n}"], flush=True)
res["mask"] = mres
with open(os.path.join(OUT, "probe.json"), "w") as f:
    json.dump(res, f, indent=1)

for r in prof_rows:
    print("==", r["preset"], r["tokens"], "kernels", r["n_kernels"], "device ms", round(r["device_us"] / 1e3, 2))
    for k in r["kernels"][:14]:
        print(f"   {k['us'] / 1e3:8.2f} ms  x{k['count']:5d}  {k['name'][:110]}")
