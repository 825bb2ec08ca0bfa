"""One-call H200 probe of FlashAttention-4 as the towers' attention (issue 33): correctness first,
then rates against torch's flash varlen and cuDNN, then whole towers eager with each backend.

(a) Rates, bf16, 16 heads, head dims 72 / 80 / 128 (Qwen3-VL, Qwen2-VL/2.5-VL, GLM-4.1V): three
packs (two documents of 14628 + 8580 rows, five items of 576-3520 rows, one 12 MP photo of 47376
rows); `fa4` and `varlen` through `workbench.attention.varlen_attention` (what the towers call),
cuDNN dense attention per sequence as the third, and FA4's kernel alone (without the
zeroing of padding keys and values the workbench runs first); each the median of REPS calls between CUDA events
after an L2 flush (`timing.cuda_event_ms`), TFLOP/s = 4 x sum(S^2) x D x H / t. fa4 is also
captured in a CUDA graph and its replay timed. Every backend's output is checked against a float32
reference per sequence before its time counts.

(b) Towers, eager `forward_prepared`, full depth, random weights (seeded), bf16, fused kernels:
qwen3-vl-8b on two documents (3657 + 2145 tokens) and on one 12 MP photo (11844 tokens),
glm-4.1v-9b on two documents (4819 + 2772 tokens), qwen2.5-vl-7b on one 12.8 MP photo (15552
tokens), each with attn_backend 'fa4' and 'varlen'; the outputs of the two agree within bf16
rounding.

Run on the device from the repo root with FlashAttention-4 importable:
`PYTHONPATH=$PWD python3 tools/probe_fa4.py [PARTS [PRESETS [VARIANTS]]]`; writes $OUT/probe_fa4.json when
OUT is set. PARTS: 'rates', 'towers' or both (comma-separated, default both); PRESETS: the towers of (b)
to run (comma-separated, default all); VARIANTS: the towers' kernels, BACKEND or BACKEND+GEMM (default
'fa4,varlen'; 'fa4,fa4+quack' puts quack's gated GEMM against cuBLAS, both on FlashAttention-4). The
outputs of every variant are compared with the first.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import workbench as wb
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.attention import ATTN_BACKENDS, _fa4_func, dense_attention, fa4_problem, varlen_attention
from workbench.reference import rel_err
from workbench.timing import FLUSH_BYTES, cuda_event_ms
from workbench.vocabulary import GEMM_CHOICES

REPS, WARMUP = 20, 3
PACKS = {"two documents": [14628, 8580], "five items": [576, 1200, 2304, 3520, 900], "one photo": [47376]}
TOWERS = [("qwen3-vl-8b", "two documents", [[1, 106, 138], [1, 66, 130]]),
          ("qwen3-vl-8b", "12 MP photo", [[1, 188, 252]]),
          ("glm-4.1v-9b", "two documents", [[1, 158, 122], [1, 84, 132]]),
          ("qwen2.5-vl-7b", "12.8 MP photo", [[1, 216, 288]])]


def timed_ms(fn, reps=REPS):
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    return statistics.median(cuda_event_ms(fn, reps, warmup=WARMUP, before=lambda: flush.fill_(1)))


def rates(record):
    for d in (72, 80, 128):
        for name, sizes in PACKS.items():
            n, h = sum(sizes), 16
            g = torch.Generator(device="cuda").manual_seed(d + n)
            q, k, v = torch.randn(n, 3, h, d, device="cuda", dtype=torch.bfloat16, generator=g).unbind(1)
            cu = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
            b = cu.tolist()
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):        # float32 without an S x S matrix
                ref = torch.cat([F.scaled_dot_product_attention(*(t[x:y].transpose(0, 1)[None].float()
                                                                  for t in (q, k, v)))[0].transpose(0, 1)
                                 for x, y in zip(b, b[1:])])
            flops = 4 * sum(s * s for s in sizes) * d * h
            fns = {"fa4": lambda: varlen_attention(q, k, v, cu, max(sizes), "fa4"),
                   "fa4 kernel alone": lambda: _fa4_func()(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                           max_seqlen_q=max(sizes), max_seqlen_k=max(sizes))[0],
                   "varlen": lambda: varlen_attention(q, k, v, cu, max(sizes), "varlen"),
                   "cudnn per sequence": lambda: torch.cat([dense_attention(q[x:y], k[x:y], v[x:y], y - x)
                                                            for x, y in zip(b, b[1:])])}
            row = {"head_dim": d, "pack": name, "rows": sizes}
            for label, fn in fns.items():
                t0 = time.perf_counter()
                err = rel_err(fn(), ref)
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                ms = timed_ms(fn)
                row[label] = {"rel_err": err, "ms": ms, "tflops": flops / ms / 1e9, "first_call_s": first_s}
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fns["fa4"]()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = fns["fa4"]()
            graph.replay()
            torch.cuda.synchronize()
            ms = timed_ms(graph.replay)
            row["fa4 graph replay"] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_err": rel_err(out, ref)}
            print(json.dumps(row), flush=True)
            record["rates"].append(row)


def towers(record, presets=None, variants=("fa4", "varlen")):
    for preset, what, grids in TOWERS:
        if presets and preset not in presets:
            continue
        cfg = wb.VisionConfig.preset(preset)
        grid = torch.tensor(grids)
        gen = torch.Generator().manual_seed(5)
        px = torch.randint(0, 256, (int(grid.prod(1).sum()), cfg.patch_dim), dtype=torch.uint8, generator=gen)
        outs, row = {}, {"preset": preset, "batch": what, "tokens": [int(g.prod()) // 4 for g in grid]}
        for variant in variants:
            backend, _, gemm = variant.partition("+")
            enc = wb.build_encoder(cfg, placement="tower", norm="triton_rows", dtype=torch.bfloat16, device="cuda",
                                   seed=3, attn_backend=backend, gemm=gemm or "cublas")
            meta = enc.visual.prepare(grid)
            x = px.cuda()
            with torch.no_grad():
                outs[variant] = enc.visual.forward_prepared(x, meta).float()
                ms = timed_ms(lambda: enc.visual.forward_prepared(x, meta), reps=7)
            row[variant] = {"ms": ms, "kernels": str(enc.visual.kernels)}
            del enc
            torch.cuda.empty_cache()
        for variant in variants[1:]:
            row[f"{variant} vs {variants[0]} rel_err"] = rel_err(outs[variant], outs[variants[0]])
        print(json.dumps(row), flush=True)
        record["towers"].append(row)


def main(argv):
    parts = argv[0].split(",") if argv else ["rates", "towers"]
    presets = argv[1].split(",") if len(argv) > 1 else None
    variants = tuple(argv[2].split(",")) if len(argv) > 2 else ("fa4", "varlen")
    names = sorted({t[0] for t in TOWERS})
    unknown = sorted(set(parts) - {"rates", "towers"}) + sorted(set(presets or ()) - set(names))
    if unknown:
        raise SystemExit(f"unknown part or preset {unknown}: parts are rates, towers; presets {names}")
    # a variant the towers would refuse is refused here, before part (a) spends device time
    bad = [v for v in variants if v.partition("+")[0] not in ATTN_BACKENDS
           or v.partition("+")[2] not in ("",) + GEMM_CHOICES]
    if bad:
        raise SystemExit(f"unknown variant {bad}: BACKEND or BACKEND+GEMM, backends {ATTN_BACKENDS}, gemms {GEMM_CHOICES}")
    problem = fa4_problem("cuda", 72)
    if problem is not None:
        raise SystemExit(f"FlashAttention-4 {problem}")
    import flash_attn
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "flash_attn": getattr(flash_attn, "__version__", "?"), "rates": [], "towers": []}
    if "rates" in parts:
        rates(record)
    if "towers" in parts:
        towers(record, presets, variants)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe_fa4.json"), "w") as f:
            json.dump(record, f, indent=1)
    print(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:])
