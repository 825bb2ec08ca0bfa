"""The input_path study's measurement: ``run(device, progress, **params)`` -> one tidy table."""
from __future__ import annotations

import math
import statistics

import pandas as pd
import torch
from PIL import Image

from ...checkpoints import resolve_config
from ...dtypes import dtype_name
from ...encoder import build_encoder
from ...norms import make_norm
from ...planner import plan_budgets
from ...preprocess import preprocess
from ...budgets import Budgets
from ... import engines
from ...runner import EncoderGraphRunner
from ...samples import image_mix, mix_columns, with_folder
from ...serving_model import StageCosts, latency_curve, max_images_per_s
from ...timing import cpu_time_us
from ...torch_images import hwc_rgb
from ...torch_images import normalize as normalize_tv
from .. import begin_run
from ..plotting import progress as show_progress
from ...results.tables import tidy
from .params import METRICS, PARAMS, PAYLOADS, PLACEMENT_PAYLOAD, check_cores

# what the host does for each placement before it ships the image
HOST_WORK = {"processor": "rows_fp32", "device": "decode"}      # every other placement: uint8 rows
NA = float("nan")


def host_work(placement: str) -> str:
    return HOST_WORK.get(placement, "rows_uint8")


def _ms(fn, reps: int) -> float:
    """Median host wall time of ``fn()`` in ms over ``reps`` calls after one warm-up, the device
    synchronized around each (`workbench.timing.cpu_time_us`)."""
    return cpu_time_us(fn, reps=reps, warmup=1)["p50_us"] / 1e3


def _known(fns, reps: int, min_reps: int) -> dict:
    """Each of ``fns`` timed between ``min_reps`` and ``reps`` calls, until its median is known
    (`cpu_time_us(min_reps=)`); what the encoder rows record of them: the mean median in ms, the
    mean count, and the widest 95% interval of a median as a fraction of it (nan below 6 calls)."""
    ts = [cpu_time_us(f, reps=reps, warmup=1, min_reps=min_reps) for f in fns]
    rel = [max(t["p50_us"] - t["ci_lo_us"], t["ci_hi_us"] - t["p50_us"]) / t["p50_us"] if t["p50_us"] > 0
           else math.nan for t in ts]
    return dict(ms=statistics.fmean(t["p50_us"] for t in ts) / 1e3, reps=statistics.fmean(t["reps"] for t in ts),
                ci_rel=max(rel) if rel and not any(math.isnan(r) for r in rel) else NA)


def _payloads(img, cfg) -> dict[str, torch.Tensor]:
    """The host tensors of one image that could cross the link, by payload name (one
    preprocessing call: the other forms are views, casts and the normalization of its rows)."""
    batch = preprocess(img, cfg, backend="torchvision")
    raw, (_, gh, gw) = batch.pixels, batch.grid_thw[0].tolist()
    per = cfg.patch_size ** 2
    frame = raw.view(raw.shape[0], cfg.in_channels, cfg.temporal_patch_size, per)[:, :, 0].contiguous()
    decoded = hwc_rgb(img, 0, "the image").contiguous()
    resized = torch.empty((gh * cfg.patch_size, gw * cfg.patch_size, 3), dtype=torch.uint8)
    norm = normalize_tv(raw, cfg)      # what backend torchvision's normalize=True gives
    return {"fp32_rows": norm, "bf16_rows": norm.to(torch.bfloat16), "uint8_rows": raw, "uint8_frame": frame,
            "resized_image": resized, "decoded_image": decoded}


def _h2d_ms(x: torch.Tensor, dev: torch.device, pinned: bool, reps: int) -> float:
    """One host-to-device copy of ``x`` (a CPU run emulates the link with a host copy)."""
    if dev.type != "cuda":
        return _ms(lambda: x.clone(), reps)
    src = x.pin_memory() if pinned else x
    return _ms(lambda: src.to(dev, non_blocking=pinned), reps)


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Measure every (preset, mix, placement) path; returns the tidy long table.

    params: see PARAMS (defaults: the device's profile)."""
    s = begin_run(PARAMS, "input_path", device, params)
    check_cores(s.params["threads"])
    s.params["mixes"] = with_folder(s.params["mixes"], s.params["image_folder"])
    return s.per_preset(lambda s: _measure(s, progress))


def _measure(s, progress: bool) -> pd.DataFrame:
    dev, p, dt, label = s.device, s.params, s.dtype, s.label
    cfg = resolve_config(p["preset"], p["depth"])
    emulated = dev.type != "cuda"
    base = dict(study="input_path", preset=p["preset"], family=cfg.family, depth=cfg.depth, dtype=dtype_name(dt),
                device=label, emulated=emulated, norm=p["norm"])
    pinned_set = (False, True) if dev.type == "cuda" else (False,)
    bar = show_progress(total=len(p["mixes"]) * (2 + len(p["placements"]) * len(p["paths"])),
                        desc=f"input_path {p['preset']}", enabled=progress)
    rows: list[dict] = []
    # engines check no input values: the timed paths do not either (the other studies alike)
    encoders = {pl: build_encoder(cfg, placement=pl, norm=p["norm"], dtype=dt, device=dev, seed=p["seed"],
                                  check_inputs=False)
                for pl in p["placements"]}
    base["attention"] = next(iter(encoders.values())).visual.kernels.backend
    for mix in p["mixes"]:
        images = [_fit(im, p["max_side"]) for im in image_mix(mix, p["n_items"], seed=p["seed"])]
        m = dict(base, **mix_columns(mix))
        n = len(images)
        # ---- host: per image, per (work, backend, threads) ----------------------------------
        host: dict[tuple, list[float]] = {}
        works = sorted({host_work(pl) for pl in p["placements"]})
        for work in works:
            # one image per call: PIL's threads (items resized at once) cannot help it, so PIL at 1 thread
            combos = [("cuda", 1)] if work == "decode" else [(b, t) for b in p["backends"] for t in p["threads"]
                                                              if b != "pil" or t == min(p["threads"])]
            for backend, threads in combos:
                if work == "decode":
                    fns = [lambda im=im: hwc_rgb(im, 0, "the image").contiguous() for im in images]
                else:
                    fns = [lambda im=im: preprocess(im, cfg, backend=backend, threads=threads,
                                                    normalize=work == "rows_fp32") for im in images]
                # each image is a sample of its own: a few repetitions each (the median) are enough
                host[work, backend, threads] = [_ms(f, min(p["reps"], 3)) for f in fns]
        bar.update()
        # ---- the link and the device-side preprocessing, per image ---------------------------
        link: dict[tuple, float] = {}
        per_image = [_payloads(im, cfg) for im in images]
        for payload in PAYLOADS:
            sizes = [pi[payload].numel() * pi[payload].element_size() for pi in per_image]
            for pinned in pinned_set:
                ms = [_h2d_ms(pi[payload], dev, pinned, p["reps"]) for pi in per_image]
                link[payload, pinned] = statistics.fmean(ms)
                rows.append(dict(m, payload=payload, pinned=pinned, h2d_bytes=statistics.fmean(sizes),
                                 h2d_ms=link[payload, pinned]))
        on_dev = [pi["decoded_image"].to(dev) for pi in per_image]
        dev_pre = statistics.fmean(_ms(lambda x=x: preprocess(x, cfg, backend="cuda", device=dev), p["reps"])
                                   for x in on_dev)
        rows.append(dict(m, placement="device", part="resize_patchify", device_ms=dev_pre))
        norm = make_norm(p["norm"], cfg).to(dev)
        uint8_rows = [pi["uint8_rows"].to(dev) for pi in per_image]
        norm_ms = statistics.fmean(_ms(lambda r=r: norm(r, dt), p["reps"]) for r in uint8_rows)
        for pl in p["placements"]:
            if encoders[pl].spec.runs_norm:
                rows.append(dict(m, placement=pl, part="normalize", device_ms=norm_ms))
        bar.update()
        # ---- the encoder, per placement and path ----------------------------------------------
        batches = {"rows_fp32": preprocess(images, cfg, backend="torchvision", normalize=True).to(dev),
                   "rows_uint8": preprocess(images, cfg, backend="torchvision").to(dev),
                   "decode": preprocess(on_dev, cfg, backend="cuda", device=dev)}
        tokens = batches["rows_uint8"].n_rows // cfg.merge_unit / n
        costs = None     # policy auto's costs: measured by the mix's first runner, shared by the others
        for pl in p["placements"]:
            enc, batch = encoders[pl], batches[host_work(pl)]
            for path in p["paths"]:
                runner = _runner(enc, cfg, mix, n, costs) if path == "cudagraph" else None
                costs = runner.costs if runner is not None and costs is None else costs
                one = [batch.select([i]) for i in range(n)]

                def call(b, runner=runner, path=path, enc=enc):
                    return enc.encode(b, path=path, runner=runner) if runner is not None else enc.encode(b)
                with torch.inference_mode():
                    for b in (*one, batch) if runner is not None else ():   # policy auto's races run before timing
                        runner.settle(b)
                    single = _known([lambda b=b: call(b) for b in one], p["reps"], p["min_reps"])
                    # one image drawn: the whole draw is that image's call, its row the single image's
                    whole = _known([lambda: call(batch)], p["reps"], p["min_reps"]) if n > 1 else single
                enc_ms = single["ms"]
                table = _batch_table(enc_ms, whole["ms"], n)
                rows.append(dict(m, placement=pl, path=path, k=1.0, encoder_ms=enc_ms, tokens_per_image=tokens,
                                 timed_reps=single["reps"], ci_rel=single["ci_rel"]))
                if n == 1:      # k = n = 1: one row holds both (two would measure the same cell twice)
                    rows[-1]["batch_ms"] = whole["ms"]
                else:
                    rows.append(dict(m, placement=pl, path=path, k=float(n), batch_ms=whole["ms"],
                                     timed_reps=whole["reps"], ci_rel=whole["ci_rel"]))
                rows += _totals(m, pl, path, host, link, dev_pre, enc_ms, pinned_set)
                rows += _load(m, p, pl, path, host, link, dev_pre, table, pinned_set)
                runner = None
                bar.update()
    bar.close()
    out = pd.DataFrame(rows)
    for col in ("placement", "payload", "part", "path", "backend"):
        if col in out:
            out[col] = out[col].fillna("-")
    if "pinned" in out:
        out["pinned"] = out["pinned"].map(lambda v: "-" if v is None or v != v else ("pinned" if v else "pageable"))
    return tidy(out, METRICS)


def _fit(im, side):
    """``im`` scaled down (PIL bicubic) so that its long side is at most ``side`` (None: as is)."""
    if side is None or max(im.size) <= side:
        return im
    s = side / max(im.size)
    return im.resize((max(1, round(im.size[0] * s)), max(1, round(im.size[1] * s))), Image.Resampling.BICUBIC)


def _runner(enc, cfg, mix: str, n: int, costs=None):
    """The planner's budgets for ``mix`` holding ``n`` items, policy auto, the placement's buffer
    (uint8 where it can hold the input, else bf16); exact-fit graphs captured by the first pack
    that needs one (in the timed calls' warm-up), policy auto's ``costs`` shared between the
    placements' runners (one tower, the same budgets) where given."""
    planned = plan_budgets(mix, max_graphs=4, cfg=cfg)
    items = max(n, engines.get(engines.NEWEST).max_items(planned))
    buf = torch.uint8 if "uint8" in enc.spec.buffer_dtypes else torch.bfloat16
    return EncoderGraphRunner(enc, budgets=list(Budgets.of(planned).holding(items)), buffer_dtype=buf,
                              max_items=items, policy="auto", exact_capture="first_use", costs=costs)


def _batch_table(one_ms: float, k_ms: float, n: int) -> list[float]:
    """Encoder time per batch of k = 1..n images, linear between the measured k = 1 (mean single
    image) and k = n (the whole draw): a + b k through both points."""
    if n == 1:
        return [one_ms]
    b = (k_ms - one_ms) / (n - 1)
    return [max(one_ms + b * (k - 1), 1e-6) for k in range(1, n + 1)]


def _totals(m, pl, path, host, link, dev_pre, enc_ms, pinned_set) -> list[dict]:
    """Request to embedding per image: host + link + device preprocessing + encoder, for each
    host (backend, threads) the placement's host work was timed at and each kind of host memory."""
    out, payload = [], PLACEMENT_PAYLOAD[pl]
    for (work, backend, threads), times in host.items():
        if work != host_work(pl):
            continue
        h = statistics.fmean(times)
        for pinned in pinned_set:
            out.append(dict(m, placement=pl, path=path, backend=backend, threads=float(threads), pinned=pinned,
                            payload=payload, host_ms=h, h2d_ms=link[payload, pinned],
                            total_ms=h + link[payload, pinned] + (dev_pre if pl == "device" else 0.0) + enc_ms))
    return out


def _load(m, p, pl, path, host, link, dev_pre, table, pinned_set) -> list[dict]:
    """The serving model at each worker count: max sustainable rate and p50 / p99 per load. Each worker's host
    time is the one timed at the fewest threads asked for (1 unless ``threads`` leaves it out; the rows say it)."""
    backend = "torchvision" if "torchvision" in p["backends"] else p["backends"][0]
    fewest = min(p["threads"])
    key = ("decode", "cuda", 1) if host_work(pl) == "decode" else (host_work(pl), backend, fewest)
    if key not in host:
        raise RuntimeError(f"input_path: no host time for {key} to serve placement {pl!r} from (timed: "
                           f"{sorted(host)})")
    pinned = pinned_set[-1]
    out = []
    for workers in p["workers"]:
        costs = StageCosts(host_ms=host[key], h2d_ms=link[PLACEMENT_PAYLOAD[pl], pinned],
                           device_ms=dev_pre if pl == "device" else 0.0, encoder_ms=table, workers=workers)
        cap = max_images_per_s(costs)
        common = dict(m, placement=pl, path=path, backend=key[1], workers=float(workers), pinned=pinned,
                      threads=float(key[2]))
        out.append(dict(common, max_images_per_s=cap))
        if not math.isfinite(cap):
            continue
        for r in latency_curve(costs, [f * cap for f in p["loads"]], n_requests=p["sim_requests"], seed=p["seed"]):
            out.append(dict(common, load=r["load"], rate=r["rate"], p50_ms=r["p50_ms"], p99_ms=r["p99_ms"],
                            stable=r["stable"]))
    return out
