"""The fp32_memory study's measurement: ``run(device, progress, **params)`` -> one tidy table."""
from __future__ import annotations


import pandas as pd
import torch

from ...attention import resolve_backend
from ...config import VisionConfig

from ...cuda_memory import captured_memory, eager_peak_bytes
from ...encoder import build_encoder
from ...memory_model import count_allocations, pool_model, trace_peak_bytes
from ...norms import make_norm
from ...towers.common import budget_padding, filling_grid
from .. import begin_run
from ..plotting import progress as show_progress
from ...results.tables import tidy
from ...dtypes import BY_NAME
from .params import METRICS, PARAMS, captured_config

OUT_DTYPE = torch.bfloat16


def _counted_trace(mod, cfg: VisionConfig, rows: int, in_dtype, out: bool, n_valid: bool):
    """The allocation trace of a real call of ``mod`` (on the meta device), ids renumbered from 0."""
    x = torch.empty(rows, cfg.patch_dim, dtype=in_dtype, device="meta")
    dst = torch.empty(rows, cfg.patch_dim, dtype=OUT_DTYPE, device="meta") if out else None
    nv = torch.tensor(rows, dtype=torch.int32, device="meta") if n_valid else None
    trace, _ = count_allocations(lambda: mod(x, OUT_DTYPE, out=dst, n_valid=nv))
    return _renumber(trace)


def _renumber(trace):
    ids: dict = {}
    return [(kind, ids.setdefault(k, len(ids)), nbytes) for kind, k, nbytes in trace]


# How each scope calls its norm: (out= given, n_valid given, inside the graph). The tower's first
# op reads the whole buffer and is told the valid rows; the runner writes the bf16 buffer through
# out=; the GPU preprocessor (placement device) normalizes the valid rows into a tensor of its own,
# before the encoder; placement fold's graph only casts the buffer to the tower dtype, which is
# what the identity norm does on that call.
CALLS = {"norm": (False, True, True), "runner": (True, False, False), "device": (False, False, False),
         "fold": (False, False, True)}
FOLD_CAST = "identity"


def _model_row(norm, cfg, rows, in_dtype, scope: str) -> dict:
    out, n_valid, in_graph = CALLS[scope]
    mod = make_norm(norm, cfg, check_values=False).to("meta")
    trace = mod.alloc_trace(rows, in_dtype, OUT_DTYPE, n_valid=n_valid, out=out)
    counted = _counted_trace(mod, cfg, rows, in_dtype, out, n_valid)
    pool = pool_model(trace)
    peak = trace_peak_bytes(trace)
    return dict(model_bytes=pool["pool_bytes"] if in_graph else 0, model_peak_bytes=pool["peak_bytes"],
                temp_bytes=peak["temp_peak_bytes"],
                counted_peak_bytes=trace_peak_bytes(counted)["peak_bytes"],
                trace_matches=_renumber(trace) == counted)


def _rel_error(measured: float, model: float) -> float:
    """measured / model - 1; 0 when both are 0 (a no-op cast allocates nothing), inf when only
    the model is 0."""
    if model == 0:
        return 0.0 if measured == 0 else float("inf")
    return measured / model - 1


def _tower_pool(enc, buf, meta, dev) -> dict:
    with torch.inference_mode():
        return captured_memory(lambda: enc.visual.forward_prepared(buf, meta), dev)




def _outside_peak(norm, cfg, baseline, p, n_rows, dev, scope: str) -> int:
    """Peak allocated bytes of one eager call of the norm as ``scope`` (runner, device) calls it,
    outside any graph (CUDA)."""
    mod = make_norm(norm, cfg, check_values=False).to(dev)
    src = baseline[p["buffer_dtypes"][0]][0].to(torch.uint8)
    dst = torch.empty(n_rows, cfg.patch_dim, dtype=OUT_DTYPE, device=dev) if CALLS[scope][0] else None
    mod(src, OUT_DTYPE, out=dst)      # warm (compiles)
    return eager_peak_bytes(lambda: mod(src, OUT_DTYPE, out=dst), dev)["peak_bytes"]


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Model (every device) and measure (CUDA) every cell; returns the tidy long table."""
    return begin_run(PARAMS, "fp32_memory", device, params).per_preset(lambda s: _measure(s, progress))


def _measure(s, progress: bool) -> pd.DataFrame:
    """One preset's cells (``s.params["preset"]``)."""
    dev, p, label = s.device, s.params, s.label
    cfg = captured_config(p)
    cuda = dev.type == "cuda"
    common = dict(study="fp32_memory", preset=p["preset"], family=cfg.family, depth=cfg.depth,
                  dtype="bfloat16", device=label,     # the towers' attention (attn_backend="auto") on this device
                  attention=resolve_backend("auto", dev, OUT_DTYPE, cfg.head_dim))
    rows = []
    cells = [(b, buf, n) for b in p["budgets"] for buf in p["buffer_dtypes"] for n in p["norms"]]
    bar = show_progress(total=len(cells) + len(p["budgets"]) * (1 + len(p["buffer_dtypes"])), desc=f"fp32_memory {p['preset']}",
                        enabled=progress)
    for budget in p["budgets"]:
        n_rows = budget * cfg.merge_unit
        geo = dict(budget=budget, budget_rows=n_rows)
        baseline, meta = {}, None
        if cuda:
            plain = build_encoder(cfg, placement="none", norm="eager", dtype=OUT_DTYPE, device=dev,
                                  seed=p["seed"], check_inputs=False)
            meta = plain.visual.prepare(filling_grid(cfg, budget), **budget_padding(cfg, budget, 1), device=dev)
            gen = torch.Generator(device=dev).manual_seed(p["seed"])
            pixels = torch.randint(0, 256, (n_rows, cfg.patch_dim), dtype=torch.uint8, device=dev, generator=gen)
            for buf_name in p["buffer_dtypes"]:
                buf = pixels.to(BY_NAME[buf_name])
                baseline[buf_name] = (buf, _tower_pool(plain, buf, meta, dev))
                bar.update()
            del plain
        for buf_name in p["buffer_dtypes"]:
            in_dtype = BY_NAME[buf_name]
            for norm in p["norms"]:
                r = dict(common, **geo, scope="norm", placement="tower", buffer_dtype=buf_name, norm=norm,
                         **_model_row(norm, cfg, n_rows, in_dtype, "norm"))
                if cuda:
                    mod = make_norm(norm, cfg, check_values=False).to(dev)
                    buf = baseline[buf_name][0]
                    nv = torch.tensor(n_rows, dtype=torch.int32, device=dev)
                    m = captured_memory(lambda: mod(buf, OUT_DTYPE, n_valid=nv), dev)
                    r.update(pool_bytes=m["pool_bytes"], peak_bytes=m["peak_bytes"],
                             model_error=_rel_error(m["pool_bytes"], r["model_bytes"]))
                    enc = build_encoder(cfg, placement="tower", norm=norm, dtype=OUT_DTYPE, device=dev,
                                        seed=p["seed"], check_inputs=False)
                    t = _tower_pool(enc, buf, meta, dev)
                    base_t = baseline[buf_name][1]
                    rows.append(dict(common, **geo, scope="tower", placement="tower", buffer_dtype=buf_name,
                                     norm=norm, pool_bytes=t["pool_bytes"] - base_t["pool_bytes"],
                                     peak_bytes=t["peak_bytes"] - base_t["peak_bytes"]))
                    del enc
                rows.append(r)
                bar.update()
        # runner placement: the norm writes the bf16 buffer through out=, outside the graph;
        # device placement: the GPU preprocessor's norm makes a bf16 tensor of its own, before the
        # encoder (the graph then stages it: a copy, no norm in the pool)
        for scope in ("runner", "device"):
            for norm in p["norms"]:
                r = dict(common, **geo, scope=scope, placement=scope, buffer_dtype="bfloat16", norm=norm,
                         **_model_row(norm, cfg, n_rows, torch.uint8, scope))
                if cuda:
                    r.update(pool_bytes=0, peak_bytes=_outside_peak(norm, cfg, baseline, p, n_rows, dev, scope))
                rows.append(r)
        # fold placement: no norm at all; the graph casts its buffer to the tower dtype (a bf16 copy
        # of a uint8 buffer, nothing for a bf16 one), no fp32 temporary
        for buf_name in p["buffer_dtypes"]:
            r = dict(common, **geo, scope="fold", placement="fold", buffer_dtype=buf_name, norm="(unused)",
                     **_model_row(FOLD_CAST, cfg, n_rows, BY_NAME[buf_name], "fold"))
            if cuda:
                buf = baseline[buf_name][0]
                m = captured_memory(lambda: buf.to(OUT_DTYPE), dev)
                r.update(pool_bytes=m["pool_bytes"], peak_bytes=m["peak_bytes"],
                         model_error=_rel_error(m["pool_bytes"], r["model_bytes"]))
            rows.append(r)
        bar.update()
        baseline.clear()
        if cuda:
            torch.cuda.empty_cache()
    bar.close()
    return tidy(pd.DataFrame(rows), METRICS)
