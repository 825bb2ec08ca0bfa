"""The cast_cost study's measurement: ``run(device, progress, **params)`` -> one tidy table."""
from __future__ import annotations

import dataclasses

import pandas as pd
import torch

from ...ceilings import copy_ceiling_gbs, matmul_tflops
from ...config import VisionConfig
from ...dtypes import dtype_name
from ...encoder import build_encoder
from ...floors import floor_us, flop_floor_us, tower_flops
from ...norms import make_norm, normalize_reference
from ...timing import time_us
from ...towers.common import budget_padding, filling_grid
from ...ulps import bf16_ulps
from .. import begin_run
from ..plotting import progress as show_progress
from ...results.tables import tidy
from .params import DESIGNS, METRICS, NO_NORM, PARAMS

@dataclasses.dataclass
class Staging:
    """One design wired to static buffers: ``copy()`` fills the graph buffer, ``norm()`` is what
    the graph then does to it; ``result()`` is the tower's bf16 input (valid rows first)."""

    copy: object
    norm: object
    result: object
    copy_bytes: int
    norm_bytes: int
    h2d_bytes: int
    raw: bool = False     # the tower's input is the raw pixel values (fold: its weights normalize)


def build_staging(design: str, norm_name: str, cfg: VisionConfig, src_u8: torch.Tensor, src_f32: torch.Tensor,
                  budget_rows: int, out_dtype: torch.dtype) -> Staging:
    """Static buffers and callables for one (design, norm) at one budget; graph-safe callables.

    src_u8: [n, patch_dim] uint8 valid rows on the device (what arrives from the host);
    src_f32: the same rows CPU-normalized (float32), for the legacy design."""
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; valid: {DESIGNS}")
    dev, d = src_u8.device, cfg.patch_dim
    n, big_n = src_u8.shape[0], budget_rows
    pad = big_n - n
    o = torch.empty((), dtype=out_dtype).element_size()
    nv = torch.tensor(n, dtype=torch.int32, device=dev)
    if design == "fp32_buffer":
        buf = torch.zeros(big_n, d, dtype=torch.float32, device=dev)
        res = {}

        def copy():
            buf[:n].copy_(src_f32)
            buf[n:].zero_()

        def norm():
            res["y"] = buf.to(out_dtype)           # the tower's patch-embed input cast
            return res["y"]
        return Staging(copy, norm, lambda: (copy(), norm())[-1], copy_bytes=n * d * 8 + pad * d * 4,
                       norm_bytes=big_n * d * (4 + o), h2d_bytes=n * d * 4)
    if design == "fold":
        # uint8 buffer: copy the valid rows, zero the padding; the graph's only input op is the
        # cast to the tower dtype (the folded patch embedding normalizes): no norm
        buf = torch.zeros(big_n, d, dtype=torch.uint8, device=dev)

        def copy():
            buf[:n].copy_(src_u8)
            buf[n:].zero_()

        def norm():
            return buf.to(out_dtype)
        return Staging(copy, norm, lambda: (copy(), norm())[-1], copy_bytes=n * d * 2 + pad * d,
                       norm_bytes=big_n * d * (1 + o), h2d_bytes=n * d, raw=True)
    mod = make_norm(norm_name, cfg, check_values=False).to(dev)
    if design == "device":
        # the GPU preprocessor normalizes the valid rows into a tensor of its own before the
        # encoder; the runner then copies them into the bf16 buffer and zeroes the padding
        buf = torch.zeros(big_n, d, dtype=out_dtype, device=dev)
        res = {}

        def norm():
            res["y"] = mod(src_u8, out_dtype)

        def copy():
            buf[:n].copy_(res["y"])
            buf[n:].zero_()
        norm()
        nb = mod.traffic(n, torch.uint8, out_dtype)["bytes"]
        return Staging(copy, norm, lambda: (norm(), copy(), buf)[-1], copy_bytes=n * d * 2 * o + pad * d * o,
                       norm_bytes=nb, h2d_bytes=n * d)
    if design == "runner":
        buf = torch.zeros(big_n, d, dtype=out_dtype, device=dev)

        def norm():
            mod(src_u8, out_dtype, out=buf[:n])

        def copy():
            buf[n:].zero_()
        nb = mod.traffic(n, torch.uint8, out_dtype, out=True)["bytes"]
        return Staging(copy, norm, lambda: (norm(), copy(), buf)[-1], copy_bytes=pad * d * o, norm_bytes=nb,
                       h2d_bytes=n * d)
    buf_dtype = out_dtype if design == "bf16_buffer" else torch.uint8
    buf = torch.zeros(big_n, d, dtype=buf_dtype, device=dev)
    b = buf.element_size()
    if design == "uint8_valid":
        def copy():
            buf[:n].copy_(src_u8)

        def norm():
            return mod(buf, out_dtype, n_valid=nv)
        nb = mod.traffic(big_n, torch.uint8, out_dtype, n_valid=n)["bytes"]
        return Staging(copy, norm, lambda: (copy(), norm())[-1], copy_bytes=n * d * 2, norm_bytes=nb,
                       h2d_bytes=n * d)

    def copy():
        buf[:n].copy_(src_u8)                       # a cast-copy when the buffer is bf16
        buf[n:].zero_()

    def norm():
        return mod(buf, out_dtype)
    nb = mod.traffic(big_n, buf_dtype, out_dtype)["bytes"]
    return Staging(copy, norm, lambda: (copy(), norm())[-1], copy_bytes=n * d * (1 + b) + pad * d * b,
                   norm_bytes=nb, h2d_bytes=n * d)


def _cells(designs, norms):
    for design in designs:
        for norm in ([NO_NORM[design]] if design in NO_NORM else norms):
            yield design, norm


def _tower_replay_us(enc, cfg, dtype, dev, budget, reps) -> float:
    """The tower's own time at ``budget`` (``enc``: placement none, no input norm), as the runner replays it."""
    rows = budget * cfg.merge_unit
    meta = enc.visual.prepare(filling_grid(cfg, budget), **budget_padding(cfg, budget, 1), device=dev)
    x = torch.randint(0, 256, (rows, cfg.patch_dim), device=dev).to(dtype)
    with torch.inference_mode():
        t = time_us(lambda: enc.visual.forward_prepared(x, meta), dev, reps=max(3, reps // 3))
    return t["p50_us"]


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Measure every (preset, design, norm, budget, fill) cell; returns the tidy long table.

    params: see PARAMS (defaults: the device's profile)."""
    return begin_run(PARAMS, "cast_cost", device, params).per_preset(lambda s: _measure(s, progress))


def _measure(s, progress: bool) -> pd.DataFrame:
    """One preset's cells (``s.params["preset"]``)."""
    dev, p, dt, cfg, label = s.device, s.params, s.dtype, s.config(), s.label
    gbs = copy_ceiling_gbs(dev)
    # what one tiny kernel costs as a graph replay: the latency below which no staging can go
    tiny = torch.zeros(1, device=dev)
    launch = time_us(lambda: tiny.add_(1), dev, reps=p["reps"])["p50_us"]
    tflops = matmul_tflops(dev)
    gen = torch.Generator().manual_seed(p["seed"])
    rows: list[dict] = []
    cells = list(_cells(p["designs"], p["norms"]))
    reps = dict(reps=p["reps"], min_reps=p["min_reps"])      # each staging time: until its median is known
    replay = {}
    bar = show_progress(total=len(cells) * len(p["budgets"]) * len(p["fills"]) + len(p["budgets"]),
                        desc=f"cast_cost {p['preset']}", enabled=progress)
    enc = build_encoder(cfg, placement="none", norm="eager", dtype=dt, device=dev, seed=p["seed"], check_inputs=False)
    attention = enc.visual.kernels.backend        # the replay's attention, recorded with every row
    for budget in p["budgets"]:                  # one tower, built once, replayed at every budget
        replay[budget] = _tower_replay_us(enc, cfg, dt, dev, budget, p["reps"])
        bar.update()
    del enc
    for budget in p["budgets"]:
        big_n = budget * cfg.merge_unit
        for fill in p["fills"]:
            n = max(cfg.merge_unit, int(round(fill * budget)) * cfg.merge_unit)
            # one source per (budget, fill), shared by every design; its float64 reference on the device
            src_u8 = torch.randint(0, 256, (n, cfg.patch_dim), dtype=torch.uint8, generator=gen).to(dev)
            ref = normalize_reference(src_u8, cfg)
            src_f32, ref_bf16, raw_bf16 = ref.float(), ref.to(torch.bfloat16), src_u8.to(torch.bfloat16)
            del ref
            for design, norm in cells:
                st = build_staging(design, norm, cfg, src_u8, src_f32, big_n, dt)
                with torch.inference_mode():
                    y = st.result()
                    err = int(bf16_ulps(y[:n].to(torch.bfloat16), raw_bf16 if st.raw else ref_bf16).max())
                    t_copy = time_us(st.copy, dev, **reps)
                    t_norm = time_us(st.norm, dev, **reps)
                    t_all = time_us(lambda st=st: (st.copy(), st.norm()), dev, **reps)
                total = st.copy_bytes + st.norm_bytes
                min_bytes = n * cfg.patch_dim * (1 + torch.empty((), dtype=dt).element_size())
                rows.append(dict(
                    study="cast_cost", preset=p["preset"], family=cfg.family, depth=cfg.depth, dtype=dtype_name(dt),
                    device=label, attention=attention, design=design, norm=norm, budget=budget, budget_rows=big_n, fill=fill,
                    valid_rows=n, copy_us=t_copy["p50_us"], copy_p90_us=t_copy["p90_us"], norm_us=t_norm["p50_us"],
                    norm_p90_us=t_norm["p90_us"], staging_us=t_all["p50_us"], staging_p90_us=t_all["p90_us"],
                    staging_reps_n=t_all["reps"], staging_ci_lo_us=t_all["ci_lo_us"], staging_ci_hi_us=t_all["ci_hi_us"],
                    bytes=total, min_bytes=min_bytes, h2d_bytes=st.h2d_bytes, floor_us=floor_us(total, gbs),
                    ratio_to_floor=t_all["p50_us"] / floor_us(total, gbs), replay_us=replay[budget],
                    share_of_replay=t_all["p50_us"] / (t_all["p50_us"] + replay[budget]), max_err_ulp=err,
                    copy_gbs=gbs, launch_us=launch, matmul_tflops=tflops,
                    replay_floor_us=flop_floor_us(tower_flops(cfg, [big_n])["total"], tflops)))
                del st, y
                bar.update()
            del src_u8, src_f32, ref_bf16, raw_bf16
    bar.close()
    return tidy(pd.DataFrame(rows), METRICS)
