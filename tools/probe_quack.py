"""H200 probe (issue 33): quack's CuTe GEMMs with fused activation epilogues against what the
towers run today (cuBLAS through F.linear, GELU(tanh) in cuBLASLt's epilogue for Qwen3-VL, the
fused Triton silu_mul between the GEMMs of the gated MLPs), at the towers' MLP shapes.

Per family (qwen3-vl-8b: 1152 -> 4304, GELU tanh; qwen2.5-vl-7b: 1280 -> 3420 padded to 3456,
SwiGLU; glm-4.1v-9b: 1536 -> 4096, SwiGLU) and rows M in ROWS, bf16, random weights: the tower's
own MLP forward (the block's fused path) and quack's `gemm_act` (activation in the epilogue, no
pre-activation stored) then `gemm` with the bias; each output checked against a float32
reference before its time counts (median of REPS calls between CUDA events, cold L2). quack
autotunes on its first call per shape (timed apart: `tune_s`). Gated: quack pairs gate and up
columns interleaved ([g0, u0, g1, u1, ...]); the probe builds that layout once, as a load would.

`PYTHONPATH=$PWD:<quack and its CuTe libraries> python3 tools/probe_quack.py [seconds] [pinned]`; writes
$OUT/probe_quack.json when OUT is set. Stops starting new shapes after ``seconds`` (default 200).

``pinned``: quack's autotuner keys its choice by the operands' shapes, so a tower whose packs change
their rows every call would tune again on each new row count (how long: results/reference/README.md,
`probe_quack-h200-20261204.json`). This mode times what a tower could run instead: a few explicit
configs (`_pinned_configs`, no autotuning) at
16384 rows for ``gemm_act`` (the activation in the epilogue; quack's ``gemm`` takes no config, so the
down projection runs untuned, and, timed beside it, through cuBLAS), then the fastest config at other
row counts, odd ones included, each new count's first call timed apart (``first_s``: does a new row
count compile again?), and that config captured in a CUDA graph and replayed (``graph_ok``: the
replay's output equal to the eager call's).
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import workbench as wb
from workbench.reference import rel_err
from workbench.timing import cuda_event_ms

ROWS = (4096, 16384, 65536) if os.environ.get("PROBE_DEVICE", "cuda") == "cuda" else (64,)
REPS, WARMUP = 20, 3
FAMILIES = (("qwen3-vl-8b", "gelu_tanh_approx"), ("qwen2.5-vl-7b", "swiglu"), ("glm-4.1v-9b", "swiglu"))


def _key_context_vars() -> None:
    """quack fingerprints an epilogue's closure and refuses what it cannot key; with nvidia-cutlass-dsl
    4.8.1 that closure reaches the DSL's ``_LOC_TRANSFORMS`` ContextVar (debug locations, not math),
    which quack 0.6.5 has no key for (results/reference/README.md), and builtin types' method
    descriptors (``code.co_positions``) and the DSL's logger, which it has none for either. Keyed by
    their names here. (It reaches them only when the CuTe DSL is not under a ``site-packages`` folder,
    which quack keys by name as installed code: tools/h200_fa4.sh unpacks it there,
    and quack then runs without this.)"""
    import contextvars
    import logging
    import types

    from quack.gemm_runtime import identity

    plain = identity.semantic_value_key

    descriptors = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                   types.GetSetDescriptorType, types.MemberDescriptorType)

    def keyed(value, seen):
        if isinstance(value, contextvars.ContextVar):
            return ("contextvar", value.name)
        if isinstance(value, descriptors):       # a builtin type's method (``code.co_positions``): its name
            return ("descriptor", value.__objclass__.__qualname__, value.__name__)
        if isinstance(value, logging.Logger):     # the DSL's logger (``CUTE_DSL``): messages, not math
            return ("logger", value.name)
        return plain(value, seen)

    for mod in [m for name, m in sys.modules.items() if name.startswith("quack") and m is not None]:
        if getattr(mod, "semantic_value_key", None) is plain:
            mod.semantic_value_key = keyed


PINNED_ROWS = (4096, 5000, 23208, 65536)


def _pinned_configs():
    """Explicit configs from quack's SM90 search space (tile_m, tile_n, pingpong, cluster m x n, device
    capacity 9, no dynamic persistence, as its SM90 list has them), valid for the gated epilogue too
    (tile_n a multiple of 32): quack's SM90 default first."""
    from quack.gemm_config import GemmConfig
    return {f"{m}x{n}-{'pp' if pp else 'coop'}-c{cm}{cn}": GemmConfig(
                tile_m=m, tile_n=n, pingpong=pp, cluster_m=cm, cluster_n=cn, device_capacity=9,
                is_dynamic_persistent=False)
            for m, n, pp, cm, cn in ((128, 192, True, 2, 1), (256, 192, False, 2, 1), (256, 128, False, 1, 2),
                                     (128, 256, False, 2, 1), (128, 128, True, 1, 2))}


def main(limit_s: float, mode: str = "tuned") -> dict:
    from quack.gemm_interface import gemm, gemm_act

    if os.environ.get("PROBE_DEVICE", "cuda") == "cuda":
        _key_context_vars()

    t_start = time.perf_counter()
    dev = torch.device(os.environ.get("PROBE_DEVICE", "cuda"))      # cpu: a dry run of the probe's logic
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "cells": []}
    for preset, act in FAMILIES:
        cfg = wb.VisionConfig.preset(preset).reduced(1)
        tower = wb.build_encoder(cfg, placement="tower", norm="eager", dtype=dt, device=dev, seed=0).visual
        mlp_owner = tower.blocks[0]
        mlp = mlp_owner.mlp
        if act == "gelu_tanh_approx":
            w1, b1, w2, b2 = mlp.linear_fc1.weight, mlp.linear_fc1.bias, mlp.linear_fc2.weight, mlp.linear_fc2.bias

            def ours(x):
                return F.linear(torch._addmm_activation(b1, x, w1.t(), use_gelu=True), w2, b2)

            def ref(x):
                h = F.gelu(F.linear(x.float(), w1.float(), b1.float()), approximate="tanh")
                return F.linear(h, w2.float(), b2.float())
            B1, bias1 = w1.t(), b1
        else:
            gu, gub, dw, db = mlp.gate_up_weight, mlp.gate_up_bias, mlp.down_weight, mlp.down_proj.bias
            hp = dw.shape[1]
            w1 = torch.stack([gu[:hp], gu[hp:]], dim=1).reshape(2 * hp, -1)       # rows g0, u0, g1, u1...
            bias1 = None if gub is None else torch.stack([gub[:hp], gub[hp:]], dim=1).reshape(-1)
            B1, w2, b2 = w1.t(), dw, db

            def ours(x):
                return mlp.forward_fused(x)

            def ref(x):
                g = F.linear(x.float(), gu[:hp].float(), None if gub is None else gub[:hp].float())
                u = F.linear(x.float(), gu[hp:].float(), None if gub is None else gub[hp:].float())
                return F.linear(F.silu(g) * u, dw.float(), None if db is None else db.float())

        layout = {"B": B1, "bias": bias1, "name": "interleaved" if act == "swiglu" else "plain"}

        def quack(x, config=None, down="quack"):
            """quack's MLP: autotuned, or ``config`` pinned for gemm_act (its ``gemm`` takes no config: the
            down projection then runs untuned, ``tuned=False``, or through cuBLAS with ``down="cublas"``)."""
            if config is None:
                _, h = gemm_act(x, layout["B"], bias=layout["bias"], activation=act, store_preact=False)
                return gemm(h, w2.t(), bias=b2)
            _, h = gemm_act(x, layout["B"], bias=layout["bias"], activation=act, store_preact=False, config=config)
            return gemm(h, w2.t(), bias=b2, tuned=False) if down == "quack" else F.linear(h, w2, b2)

        if mode == "pinned":
            out["cells"] += _pinned(preset, act, cfg, w2, ours, ref, quack, dev, dt, t_start, limit_s)
            continue
        for m in ROWS:
            if time.perf_counter() - t_start > limit_s:
                out["stopped"] = f"time limit {limit_s} s before {preset} M={m}"
                return out
            x = torch.randn(m, cfg.width, device=dev, dtype=dt)
            cell = {"preset": preset, "activation": act, "rows": m, "width": cfg.width,
                    "hidden": int(w2.shape[1])}
            with torch.no_grad():
                r = ref(x)
                cell["ours_rel_err"] = rel_err(ours(x), r)
                t0 = time.perf_counter()
                try:
                    q = quack(x)
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    cell["tune_s"] = time.perf_counter() - t0
                    cell["quack_rel_err"] = rel_err(q, r)
                    if act == "swiglu" and cell["quack_rel_err"] > 2e-2 and layout["name"] == "interleaved":
                        layout.update(B=gu.t(), bias=gub, name="halves")      # [gate; up], as the tower keeps it
                        cell["quack_rel_err"] = rel_err(quack(x), r)
                    cell["layout"] = layout["name"]
                except Exception as e:  # noqa: BLE001 - recorded, the probe goes on
                    cell["quack_error"] = f"{type(e).__name__}: {e}"[:400]
                ok = cell.get("quack_rel_err", 1.0) < 2e-2
                for name, fn in (("ours", ours), ("quack", quack)):
                    if name == "quack" and not ok:
                        continue
                    if dev.type == "cuda":
                        ms = sorted(cuda_event_ms(lambda: fn(x), reps=REPS, warmup=WARMUP))
                        cell[f"{name}_ms"] = ms[len(ms) // 2]
                flops = 2 * m * cfg.width * int(w2.shape[1]) * (3 if act == "swiglu" else 2)
                for name in ("ours", "quack"):
                    if f"{name}_ms" in cell:
                        cell[f"{name}_tflops"] = flops / cell[f"{name}_ms"] / 1e9
            print(json.dumps(cell), flush=True)
            out["cells"].append(cell)
    return out


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _pinned(preset, act, cfg, w2, ours, ref, quack, dev, dt, t_start, limit_s) -> list[dict]:
    """``pinned`` mode for one MLP: every config of `_pinned_configs` at 16384 rows, then the fastest at
    PINNED_ROWS (first call timed apart) and in a CUDA graph."""
    cells, flops_per_row = [], 2 * cfg.width * int(w2.shape[1]) * (3 if act == "swiglu" else 2)

    def timed(fn, x, cell, name):
        ms = sorted(cuda_event_ms(lambda: fn(x), reps=REPS, warmup=WARMUP))
        cell[f"{name}_ms"] = ms[len(ms) // 2]
        cell[f"{name}_tflops"] = flops_per_row * x.shape[0] / cell[f"{name}_ms"] / 1e9

    best = None
    for rows, configs in [(16384, _pinned_configs())] + [(m, None) for m in PINNED_ROWS]:
        if configs is None:          # the other row counts: the fastest config at 16384 rows only
            if best is None:
                break
            configs = {best[0]: best[1]}
            sweep = False
        else:
            sweep = True
        for name, config in configs.items():
            if time.perf_counter() - t_start > limit_s:
                cells.append({"stopped": f"time limit before {preset} {name} M={rows}"})
                return cells
            x = torch.randn(rows, cfg.width, device=dev, dtype=dt)
            cell = {"preset": preset, "activation": act, "rows": rows, "config": name}
            with torch.no_grad():
                r = ref(x)
                try:
                    _sync(dev)
                    t0 = time.perf_counter()
                    q = quack(x, config)
                    _sync(dev)
                    cell["first_s"] = time.perf_counter() - t0
                    cell["quack_rel_err"] = rel_err(q, r)
                    cell["ours_rel_err"] = rel_err(ours(x), r)
                except Exception as e:  # noqa: BLE001 - recorded, the probe goes on
                    cell["quack_error"] = f"{type(e).__name__}: {e}"[:300]
                if cell.get("quack_rel_err", 1.0) < 2e-2 and dev.type == "cuda":
                    timed(lambda v: quack(v, config), x, cell, "quack")
                    timed(lambda v: quack(v, config, down="cublas"), x, cell, "quack_act_cublas_down")
                    timed(ours, x, cell, "ours")
                if cell.get("quack_rel_err", 1.0) < 2e-2:
                    if sweep and (best is None or cell.get("quack_ms", 0.0) < best[2]):
                        best = (name, config, cell.get("quack_ms", 0.0))
                    if not sweep and rows == PINNED_ROWS[1] and dev.type == "cuda":   # an odd row count in a graph
                        try:
                            g = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(g):
                                y = quack(x, config)
                            g.replay()
                            torch.cuda.synchronize()
                            cell["graph_ok"] = bool(torch.equal(y, quack(x, config)))
                        except Exception as e:  # noqa: BLE001
                            cell["graph_error"] = f"{type(e).__name__}: {e}"[:300]
            print(json.dumps(cell), flush=True)
            cells.append(cell)
    return cells


if __name__ == "__main__":
    res = main(float(sys.argv[1]) if len(sys.argv) > 1 else 200.0, sys.argv[2] if len(sys.argv) > 2 else "tuned")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe_quack.json"), "w") as f:
            json.dump(res, f, indent=1)
