"""The contention study's measurement: ``run(device, progress, **params)`` -> one tidy table."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import torch
from PIL import Image

from ... import engines
from ...budgets import Budgets
from ...checkpoints import resolve_config
from ...contention_model import (HOST_PLACEMENTS, MODELLED, Stages, at_slo, check_slo, crossings, gpu_share, host_cores,
                                 max_rate_at_slo, winners, winning_span)
from ...decode import decode_gpu, decode_host, decode_host_many, encode, gpu_decoder, pixel_diff
from ...dtypes import dtype_name
from ...encoder import build_encoder
from ...interference import NvmlSampler, PreprocessWork, aggressor, alone, beside_run, median_ms
from ...planner import plan_budgets
from ...preprocess import preprocess
from ...results.tables import tidy
from ...runner import EncoderGraphRunner
from ...samples import image_mix, mix_columns
from ...timing import cpu_time_us
from ...torch_images import hwc_rgb
from .. import begin_run
from ..plotting import progress as show_progress
from .params import METRICS, PARAMS, SLO_FACTOR, check_cores, mix_format

EXT = {"jpeg": "jpg", "png": "png"}


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Measure decode, interference and the serving answer for every (preset, mix); the tidy long table.

    params: see PARAMS (defaults: the device's profile)."""
    s = begin_run(PARAMS, "contention", device, params)
    check_cores(s.params["threads"])
    return s.per_preset(lambda s: _measure(s, progress))


def _fit(im: Image.Image, side: int | None) -> Image.Image:
    """``im`` scaled down (PIL bicubic) so that its long side is at most ``side`` (None: as is)."""
    if side is None or max(im.size) <= side:
        return im
    s = side / max(im.size)
    return im.resize((max(1, round(im.size[0] * s)), max(1, round(im.size[1] * s))), Image.Resampling.BICUBIC)


def _sync(dev: torch.device):
    """Wait for this thread's current stream only (a device-wide sync would wait for the preprocessor's too)."""
    if dev.type == "cuda":
        return lambda: torch.cuda.current_stream(dev).synchronize()
    return lambda: None


def _ms(fn, reps: int) -> float:
    return cpu_time_us(fn, reps=reps, warmup=1)["p50_us"] / 1e3


def _measure(s, progress: bool) -> pd.DataFrame:
    dev, p, dt = s.device, s.params, s.dtype
    cfg = resolve_config(p["preset"], p["depth"])
    enc = build_encoder(cfg, placement="tower", norm=p["norm"], dtype=dt, device=dev, seed=p["seed"],
                        check_inputs=False)
    base = dict(study="contention", preset=p["preset"], family=cfg.family, depth=cfg.depth, dtype=dtype_name(dt),
                device=s.label, emulated=dev.type != "cuda", norm=p["norm"], attention=enc.visual.kernels.backend)
    bar = show_progress(total=len(p["mixes"]) * 3, desc=f"contention {p['preset']}", enabled=progress)
    rows: list[dict] = []
    for mix in p["mixes"]:
        m = dict(base, **mix_columns(mix))
        images = [_fit(im, p["max_side"]) for im in image_mix(mix, p["n_items"], seed=p["seed"])]
        fmt = mix_format(mix)
        files = {}
        for q in (p["jpeg_qualities"] if fmt == "jpeg" else [None]):
            label = f"jpeg-q{q}" if q is not None else "png"
            files[label] = [encode(im, fmt, q, name=f"{mix}-{i}-{label}.{EXT[fmt]}") for i, im in enumerate(images)]
            rows += _decode_rows(dict(m, encoding=label, part="decode"), files[label], images, dev, p)
        bar.update()
        label, items = next(iter(files.items()))
        stages, inter = _interference(dict(m, encoding=label, part="interference"), items, cfg, enc, dev, p, mix)
        rows += inter
        bar.update()
        for path, st in stages.items():
            rows += _serving(dict(m, encoding=label, part="serving", path=path), st, p)
        bar.update()
    bar.close()
    out = pd.DataFrame(rows)
    for col in ("decoder", "path", "beside", "placement", "from_placement", "to_placement", "note"):
        if col in out:
            out[col] = out[col].fillna("-")
    return tidy(out, METRICS)


def _decode_rows(m: dict, items, images, dev, p) -> list[dict]:
    """Host decode per image at each thread count, the pixels against the source, nvJPEG where it runs."""
    reps = p["reps"]
    n = len(items)
    host = [decode_host(e) for e in items]
    worst = [pixel_diff(h, np.asarray(im.convert("RGB"))) for h, im in zip(host, images)]
    sizes = dict(encoded_bytes=statistics.fmean(e.n_bytes for e in items),
                 decoded_bytes=statistics.fmean(h.nbytes for h in host))
    out = [dict(m, decoder="host", **sizes, source_max_abs_diff=max(w[0] for w in worst),
                source_mean_abs_diff=statistics.fmean(w[1] for w in worst))]
    for t in p["threads"]:
        out.append(dict(m, decoder="host", threads=float(t), available=True,
                        decode_ms=_ms(lambda t=t: decode_host_many(items, t), reps) / n))
    ok, why = gpu_decoder(dev)
    if ok and items[0].fmt == "jpeg":
        gpu = decode_gpu(items, dev)
        diffs = [pixel_diff(g, h) for g, h in zip(gpu, host)]
        out.append(dict(m, decoder="nvjpeg", threads=1.0, available=True,
                        decode_ms=_ms(lambda: decode_gpu(items, dev), reps) / n,
                        max_abs_diff=max(d[0] for d in diffs), mean_abs_diff=statistics.fmean(d[1] for d in diffs)))
    else:
        out.append(dict(m, decoder="nvjpeg", threads=1.0, available=False,
                        note=why if not ok else "PNG: no GPU decoder (decoded on the host)"))
    return out


def _runner(enc, cfg, mix: str, n: int):
    """The planner's budgets for ``mix`` holding ``n`` items, policy auto, a uint8 buffer where the tower
    takes one (as input_path's graph cells)."""
    planned = plan_budgets(mix, max_graphs=4, cfg=cfg)
    items = max(n, engines.get(engines.NEWEST).max_items(planned))
    buf = torch.uint8 if "uint8" in enc.spec.buffer_dtypes else torch.bfloat16
    return EncoderGraphRunner(enc, budgets=list(Budgets.of(planned).holding(items)), buffer_dtype=buf,
                              max_items=items, policy="auto", exact_capture="first_use")


def _link_ms(x: torch.Tensor, dev, reps: int) -> float:
    """One host-to-device copy of ``x`` from pinned memory (a CPU run: a host copy)."""
    if dev.type != "cuda":
        return _ms(lambda: x.clone(), reps)
    src = x.pin_memory()
    return _ms(lambda: src.to(dev, non_blocking=True), reps)


def _host_stages(items, cfg, dev, reps: int) -> dict:
    """Per image on one host thread: decode, rows (uint8 and normalized float32), and each payload's link."""
    n = len(items)
    decoded = [decode_host(e) for e in items]
    rows_u8 = [preprocess(d, cfg, backend="torchvision", threads=1).pixels for d in decoded]
    rows_f32 = [preprocess(d, cfg, backend="torchvision", threads=1, normalize=True).pixels for d in decoded]
    enc_bytes = [torch.frombuffer(bytearray(e.data), dtype=torch.uint8) for e in items]
    mean = statistics.fmean
    return dict(
        decode_ms=mean(_ms(lambda e=e: decode_host(e), reps) for e in items),
        rows_uint8_ms=mean(_ms(lambda d=d: preprocess(d, cfg, backend="torchvision", threads=1), reps)
                           for d in decoded),
        rows_fp32_ms=mean(_ms(lambda d=d: preprocess(d, cfg, backend="torchvision", threads=1, normalize=True), reps)
                          for d in decoded),
        link_ms={"fp32_rows": mean(_link_ms(r, dev, reps) for r in rows_f32),
                 "uint8_rows": mean(_link_ms(r, dev, reps) for r in rows_u8),
                 "encoded": mean(_link_ms(b, dev, reps) for b in enc_bytes)},
        n=n)


def _interference(m: dict, items, cfg, enc, dev, p, mix: str):
    """The encoder and the preprocessor alone and side by side; ({path: Stages}, rows)."""
    reps, n = p["reps"], len(items)
    sync = _sync(dev)
    gpu_ok = gpu_decoder(dev)[0] and items[0].fmt == "jpeg"
    work = PreprocessWork(tuple(items), p["preset"], p["depth"], str(dev), gpu_decode=gpu_ok)
    work.setup()
    pre_alone = alone(work, work.sync, reps)
    host = _host_stages(items, cfg, dev, reps)
    decoded = [hwc_rgb(decode_host(e), i, e.name) for i, e in enumerate(items)]
    batch = preprocess(decoded, cfg, backend="cuda", device=dev)
    singles = [batch.select([i]) for i in range(n)]
    rows, calls, enc_alone = [], {}, {}
    for path in p["paths"]:
        runner = _runner(enc, cfg, mix, n) if path == "cudagraph" else None

        def call(b, runner=runner, path=path):
            return enc.encode(b, path=path, runner=runner) if runner is not None else enc.encode(b)
        with torch.inference_mode():
            for b in (*singles, batch) if runner is not None else ():     # graphs captured, policy auto settled
                runner.settle(b)
            one = statistics.fmean(median_ms(alone(lambda b=b: call(b), sync, reps)) for b in singles)
            whole = median_ms(alone(lambda: call(batch), sync, reps))
        calls[path], enc_alone[path] = (lambda call=call: call(batch)), (one, whole)
        rows.append(dict(m, path=path, images=1.0, encoder_ms_alone=one))
        if n > 1:
            rows.append(dict(m, path=path, images=float(n), encoder_ms_alone=whole))
    pre_ms = median_ms(pre_alone)
    rows.append(dict(m, images=float(n), preprocess_ms_alone=pre_ms, decoder="nvjpeg" if gpu_ok else "host"))
    slow: dict[str, dict[float, tuple]] = {path: {} for path in p["paths"]}
    sampler = NvmlSampler(dev.index or 0) if dev.type == "cuda" else None
    for beside in p["beside"]:
        side = aggressor(beside, work)
        try:
            for duty in p["duty_cycles"]:
                for path in p["paths"]:
                    with torch.inference_mode():
                        r = beside_run(calls[path], sync, side, duty, reps, pre_ms / 1e3, sampler=sampler)
                    e_ms, a_ms = median_ms(r["victim_s"]), median_ms(r["aggressor_s"])
                    whole = enc_alone[path][1]
                    extra = {k: r[k] for k in ("gpu_util", "gpu_mem_bytes") if k in r}
                    rows.append(dict(m, path=path, beside=beside, duty=duty, images=float(n),
                                     encoder_ms_contended=e_ms, preprocess_ms_contended=a_ms,
                                     encoder_slowdown=e_ms / whole, preprocess_slowdown=a_ms / pre_ms,
                                     duty_measured=r["aggressor_busy_s"] / r["window_s"], **extra))
                    # the serving answer takes the same-process slowdowns (an engine's GPU processor runs there)
                    if beside == "same_process" or "same_process" not in p["beside"]:
                        slow[path][duty] = (a_ms / pre_ms, e_ms / whole)
        finally:
            side.close()
    stages = {}
    for path in p["paths"]:
        one, whole = enc_alone[path]
        table = [one + (whole - one) * (k - 1) / (n - 1) if n > 1 else one for k in range(1, n + 1)]
        stages[path] = Stages(decode_ms=host["decode_ms"], rows_fp32_ms=host["rows_fp32_ms"],
                              rows_uint8_ms=host["rows_uint8_ms"], link_ms=host["link_ms"],
                              preprocess_ms=pre_ms / n, gpu_decode=gpu_ok, encoder_ms=tuple(max(t, 1e-6) for t in table),
                              slowdown=slow[path])
    first = stages[p["paths"][0]]
    rows.append(dict(m, decoder="host", threads=1.0, placement="cpu_processor", host_ms=first.decode_ms +
                     first.rows_fp32_ms, link_ms=first.link_ms["fp32_rows"]))
    rows.append(dict(m, decoder="host", threads=1.0, placement="device_norm", host_ms=first.decode_ms +
                     first.rows_uint8_ms, link_ms=first.link_ms["uint8_rows"]))
    return stages, rows


def _serving(m: dict, st: Stages, p) -> list[dict]:
    """The serving model per placement and arrival rate at each host thread count (the host placements'
    workers; the GPU placements do not depend on it: simulated once, at the fewest), the highest rate
    meeting the target, and at the most threads the winner's span and the crossings."""
    n = len(st.encoder_ms)
    capacity = 1e3 * n / st.encoder_ms[-1]               # the encoder's highest rate alone, full batches
    # None: a multiple of the encoder's slowest measured call alone (on a busy host one image can take longer than two)
    slo = p["slo_ms"] if p["slo_ms"] is not None else SLO_FACTOR * max(st.encoder_ms)
    check_slo(slo, st, f" ({m['preset']}, {m['mix']}, encoder {m['path']})")
    rates = [f * capacity for f in p["loads"]]
    sim = dict(n_requests=p["sim_requests"], seed=p["seed"])
    fewest, most = p["threads"][0], p["threads"][-1]
    out, curves = [], {}
    for threads in p["threads"]:
        t = dict(m, threads=float(threads), slo_ms=slo)
        places = [pl for pl in p["placements"] if threads == fewest or pl in HOST_PLACEMENTS]
        curves[threads] = at_slo(st, rates, slo, threads, placements=places, **sim)
        for r, load in zip(curves[threads], p["loads"] * len(places)):
            out.append(dict(t, placement=r["placement"], rate=r["rate"], load=load, modelled=r["placement"] in MODELLED,
                            p99_ms=r["p99_ms"], stable=r["stable"], images_per_s_at_slo=r["images_per_s_at_slo"]))
    every = [r for r in curves[most] if r["placement"] in HOST_PLACEMENTS] + \
            [r for r in curves[fewest] if r["placement"] not in HOST_PLACEMENTS]
    win = winners(every)
    for threads in p["threads"]:
        t = dict(m, threads=float(threads), slo_ms=slo)
        for pl in [pl for pl in p["placements"] if threads == fewest or pl in HOST_PLACEMENTS]:
            top = max_rate_at_slo(st, pl, slo, hi=2 * max(rates), threads=threads, **sim)
            span = winning_span(win, pl) if threads == most or pl not in HOST_PLACEMENTS else (math.nan, math.nan)
            out.append(dict(t, placement=pl, modelled=pl in MODELLED, max_images_per_s_at_slo=top,
                            host_cores=host_cores(st, pl, top), gpu_share=gpu_share(st, pl, top),
                            wins_from_rate=span[0], wins_to_rate=span[1]))
    for c in crossings(win):
        out.append(dict(m, threads=float(most), slo_ms=slo, from_placement=c["from_placement"],
                        to_placement=c["to_placement"], crossing_rate=c["rate"]))
    return out
