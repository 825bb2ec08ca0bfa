"""One-call H200 probe: does Qwen3-VL's MLP pay for a GELU(tanh) fused into its fc1 GEMM?

The Qwen3-VL / Qwen3.5 block runs ``fc2(gelu_tanh(fc1(h)))``. Its residual sums and LayerNorms
are already fused (`workbench.fused.add_norm`); GELU(tanh) is one elementwise pass that reads
and writes the fc1 output (rows x 4304 in bf16), whose share of the tower's device time the
encoder latency runs record (`kernel_activation_ms`; results/reference/README.md). A Triton GEMM
cannot take it over (probe_gemm / probe_tma: cuBLAS is faster than any Triton GEMM tried). cuBLASLt can: its GELU-with-bias epilogue is the tanh
approximation, which is what this family's config asks for (``gelu_pytorch_tanh``), and torch
exposes it as ``torch._addmm_activation(bias, x, w.T, use_gelu=True)``. Whether torch takes the
cuBLASLt path (and so computes the tanh form) depends on the build and the shapes: on a CPU the
same call computes the exact (erf) GELU. So this probe checks what the call computes, then times it.

For qwen3-vl-8b's MLP (width 1152, mlp 4304) at 256, 1024, 4096, 16384 and 65536 rows (64 to
16384 merged tokens), bf16, as one CUDA-graph replay of LAYERS layers with distinct weights (L2
flushed before each replay, as `workbench.timing.graph_replay_us` does):

- ``separate``: F.linear(fc1) then F.gelu(approximate="tanh"), the tower's call;
- ``epilogue``: torch._addmm_activation(..., use_gelu=True);
- the whole MLP both ways (fc2 included), per layer.

Errors: each variant's fc1 activation against a float64 reference of the tanh form and of the erf
form (max abs error over max abs value). The two forms differ by about 5e-5 of the largest value,
below bf16's rounding, so which form the call computes is read in float32 (TF32 off:
``form_fp32``), where ``epilogue`` must sit at float32 rounding from tanh and about 5e-5 from
erf for the tower to use it; the bf16 errors show what the tower would see. Writes
$OUT/probe_gelu.json (or ./probe_gelu.json). Run on the device from the repo root: `PYTHONPATH=$PWD python3
tools/probe_gelu.py`. On a CPU it runs a small self-check of the error measure only (no timings).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

WIDTH, MLP = 1152, 4304          # qwen3-vl-8b (and -30b-a3b, -235b-a22b) vision_config
ROWS = (256, 1024, 4096, 16384, 65536)
LAYERS = 8


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((y.double() - ref).abs().max() / ref.abs().max()).item())


def references(x, w, b):
    """fc1 output through the tanh and the erf GELU, in float64."""
    pre = x.double() @ w.double().T + b.double()
    return F.gelu(pre, approximate="tanh"), F.gelu(pre)


def epilogue(x, w, b):
    return torch._addmm_activation(b, x, w.T, use_gelu=True)


def separate(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def errors(x, w, b) -> dict:
    tanh_ref, erf_ref = references(x, w, b)
    out = {}
    for name, fn in (("separate", separate), ("epilogue", epilogue)):
        y = fn(x, w, b)
        out[name] = {"vs_tanh": rel(y, tanh_ref), "vs_erf": rel(y, erf_ref)}
    out["tanh_vs_erf"] = rel(tanh_ref, erf_ref)
    return out


def selfcheck() -> dict:
    """CPU: the measure separates the two forms (what the call computes here is reported, not
    assumed)."""
    torch.manual_seed(0)
    x = torch.randn(64, WIDTH) * 2
    w = torch.randn(MLP, WIDTH) * WIDTH ** -0.5
    b = torch.randn(MLP) * 0.1
    e = errors(x, w, b)
    assert e["separate"]["vs_tanh"] < 1e-5 < e["separate"]["vs_erf"], e
    return e


def main() -> None:
    from workbench.timing import graph_replay_us

    dev, dt = torch.device("cuda"), torch.bfloat16
    res = {"env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()},
           "width": WIDTH, "mlp": MLP, "layers_per_replay": LAYERS, "rows": {}}
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    x32 = torch.randn(4096, WIDTH, device=dev) * 2
    res["form_fp32"] = errors(x32, torch.randn(MLP, WIDTH, device=dev) * WIDTH ** -0.5,
                              torch.randn(MLP, device=dev) * 0.1)
    print("float32:", json.dumps(res["form_fp32"]), flush=True)
    w1 = [(torch.randn(MLP, WIDTH, device=dev) * WIDTH ** -0.5).to(dt) for _ in range(LAYERS)]
    b1 = [(torch.randn(MLP, device=dev) * 0.1).to(dt) for _ in range(LAYERS)]
    w2 = [(torch.randn(WIDTH, MLP, device=dev) * MLP ** -0.5).to(dt) for _ in range(LAYERS)]
    b2 = [(torch.randn(WIDTH, device=dev) * 0.1).to(dt) for _ in range(LAYERS)]
    for rows in ROWS:
        x = (torch.randn(rows, WIDTH, device=dev) * 2).to(dt)
        row = {"errors": errors(x[:4096], w1[0], b1[0])}
        for name, act in (("separate", separate), ("epilogue", epilogue)):
            def fc1_act(act=act):
                for w, b in zip(w1, b1):
                    act(x, w, b)

            def mlp(act=act):
                for wa, ba, wb, bb in zip(w1, b1, w2, b2):
                    F.linear(act(x, wa, ba), wb, bb)
            row[name] = {"fc1_act_us": graph_replay_us(fc1_act, reps=20)["p50_us"] / LAYERS,
                         "mlp_us": graph_replay_us(mlp, reps=20)["p50_us"] / LAYERS}
        row["fc1_only_us"] = graph_replay_us(lambda: [F.linear(x, w, b) for w, b in zip(w1, b1)],
                                             reps=20)["p50_us"] / LAYERS
        row["mlp_epilogue_over_separate"] = row["epilogue"]["mlp_us"] / row["separate"]["mlp_us"]
        print(f"{rows} rows: MLP separate {row['separate']['mlp_us']:.1f} us, epilogue {row['epilogue']['mlp_us']:.1f} us "
              f"({row['mlp_epilogue_over_separate']:.3f}x); fc1 alone {row['fc1_only_us']:.1f} us; epilogue vs tanh "
              f"{row['errors']['epilogue']['vs_tanh']:.2e}, vs erf {row['errors']['epilogue']['vs_erf']:.2e}", flush=True)
        res["rows"][str(rows)] = row
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "probe_gelu.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print(json.dumps({"selfcheck (CPU, no timings)": selfcheck()}, indent=1))
        sys.exit(0)
    main()
