"""The correctness study's measurement: ``run(device, progress, **params)`` -> one tidy table."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from ...checkpoints import resolve_config
from ...dtypes import dtype_name
from ...dtypes import resolve_dtype as dtype_of
from ...attention import resolve_backend
from ...dp import encode_dp
from ...encoder import PLACEMENT_TABLE, build_encoder
from ...formatting import device_label
from ...norm_kernels import reusing_launches
from ...norms import normalize_reference
from ...preprocess import Video, preprocess
from ...reference import cos_min, rel_err
from ...runner import EncoderGraphRunner
from ...samples import sample_images, sample_video
from .. import begin_run
from ..plotting import progress as show_progress
from ...results.tables import tidy
from ...vocabulary import NORM_FREE_PLACEMENTS as NORM_FREE  # a norm implementation does not matter there
from .summary import FORGETFUL_NORMS
from .params import BUFFER_NAMES, METRICS, PARAMS

# Relative-error tolerance per tower dtype. A right cell differs from the float64 reference only
# by rounding: fp32 ~1e-6 (24-bit mantissa, errors grow slowly with depth), bf16 ~1e-2 (8-bit
# mantissa: unit roundoff 2^-9 = 2e-3 per op, accumulated over blocks and the 5120-wide merger).
# A wrong normalization changes the input by O(1) relative (raw 0..255 vs ~N(0,1)), and the
# embedding by > 0.3 relative. The thresholds sit ~10x above the right cells' error, and one to
# two orders of magnitude below the wrong cells'.
# Placement fold is judged by the same bounds: it rounds the folded patch-embedding weights and
# bias to the tower dtype instead of the normalized pixels, so in bf16 its error sits a little
# above tower's, still an order below the bound and far below a wrong cell's.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


# A graph buffer narrower than the tower rounds what it holds: raw 0..255 are exact in bf16, but
# normalized floats (placements processor, runner, device, double) are rounded to bf16 there. Such a cell
# is judged at the precision of the narrowest float in its data path (see `cell_tolerance`).
PRECISION_ORDER = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def cell_tolerance(dtype: torch.dtype, buffer_dtype: str) -> float:
    buf = dtype_of(buffer_dtype) if buffer_dtype in BUFFER_NAMES else None
    if buf is None or not buf.is_floating_point:
        return TOLERANCE[dtype]
    return TOLERANCE[max(dtype, buf, key=PRECISION_ORDER.index)]


def study_items(max_pixels: int, video_frames: int = 4):
    """The study's inputs: the real photos (capped at max_pixels) and a short panning video."""
    photos = sample_images()
    side = int(np.sqrt(max_pixels))
    return [*photos.values(), Video(sample_video(video_frames, size=(side // 2, side // 2 + 28)))]


def _cells(placements, norms, paths, buffer_dtypes):
    for placement in placements:
        for norm in (["eager"] if placement in NORM_FREE else norms):
            for path in paths:
                bufs = buffer_dtypes if path == "cudagraph" else ["-"]
                for buf in bufs:
                    if buf != "-" and dtype_name(dtype_of(buf)) not in PLACEMENT_TABLE[placement].buffer_dtypes:
                        continue  # e.g. a uint8 buffer cannot hold normalized floats: not a configuration
                    yield placement, (norm if placement not in NORM_FREE else "(unused)"), path, buf


def _encode_dp_cells(specs: list[dict]) -> list[dict]:
    """Runs on every dp rank: encodes every (placement, norm) of each family's spec through the dp
    path (one group of ranks for all families: starting one costs seconds)."""
    import torch.distributed as dist

    device = f"cuda:{dist.get_rank()}" if dist.get_backend() == "nccl" else "cpu"
    results = []
    with reusing_launches():
        for spec in specs:
            out = {}
            for placement, norm in spec["cells"]:
                enc = _build(spec["cfg"], placement, norm, spec["dtype"], device, spec["seed"])
                batch = preprocess(spec["items"], enc.cfg, normalize=enc.input_kind == "normalized")
                out[(placement, norm)] = PATH_CALLS["dp"](enc, batch, spec, "-")[0].float().cpu()
            results.append(out)
    return results


def _encode_eager(enc, batch, p: dict, buf: str):
    return enc.encode(batch), {}


def _encode_graph(enc, batch, p: dict, buf: str):
    """The batch through a graph runner with the cell's buffer dtype, and what its replays did."""
    runner = EncoderGraphRunner(enc, budgets=list(p["budgets"]), buffer_dtype=dtype_of(buf), policy="always",
                                max_items=p["max_items"])
    out = runner.encode(batch)
    st = runner.stats_frame()
    return out, dict(backend=runner.backend, replays=int((~st.miss).sum()), misses=int(st.miss.sum()),
                     padded_rows=int(st.padded_rows.sum()))


def _encode_dp(enc, batch, p: dict, buf: str):
    """On one dp rank (`_encode_dp_cells`, started by `_dp_rows`): the whole batch, sharded and gathered."""
    return encode_dp(enc, batch), {}


# The path axis: each path is the call that runs it, picked here (the encoder runs only eager
# itself): callable(enc, batch, params, buffer_dtype) -> (embedding, extra columns).
PATH_CALLS = {"eager": _encode_eager, "cudagraph": _encode_graph, "dp": _encode_dp}


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Measure every cell; returns the tidy long table (metrics rel_err, cos_min, ok, ...).

    params: see PARAMS (defaults: the device's profile). families: preset names; depth: reduce
    every tower to this many blocks (real width kept); max_pixels caps the processor's image size;
    budgets/max_items configure the graph runner; dp_world_size ranks run the dp path (gloo on
    CPU, NCCL with one GPU per rank; skipped with a note when fewer GPUs are visible). hazard:
    also run the NaN padding / pool check.
    """
    s = begin_run(PARAMS, "correctness", device, params)
    # interpreted, the Triton norms meet the same photos through many encoders: each distinct launch runs once
    with reusing_launches():
        return _measure(s, progress)


def _measure(s, progress: bool) -> pd.DataFrame:
    (families, depth, dtype, placements, norms, paths, buffer_dtypes, max_pixels, budgets, max_items,
     dp_world_size, hazard, seed) = (s.params[k] for k in PARAMS.names)
    dev, dt = s.device, s.dtype
    tol = TOLERANCE[dt]
    rows, dp_cells = [], []
    for fam in families:
        base = resolve_config(fam, depth)    # the cap below the preset's floor lowers the floor too
        cfg = dataclasses.replace(base, max_pixels=max_pixels, min_pixels=min(base.min_pixels, max_pixels))
        items = study_items(max_pixels)
        raw = preprocess(items, cfg)
        nrm = preprocess(items, cfg, normalize=True)
        ref_enc = build_encoder(cfg, placement="processor", norm="eager", dtype=torch.float64, device=dev, seed=seed,
                                attn_backend="loop")  # exact per-sequence attention, no N^2 mask
        with torch.no_grad():
            ref = ref_enc.visual(normalize_reference(raw.pixels, cfg).to(dev), raw.grid_thw).cpu()
        del ref_enc
        # every encoder under test is built with attn_backend="auto": the attention it resolves to on this device
        common = dict(family=cfg.family, preset=fam, depth=cfg.depth, width=cfg.width, dtype=dtype_name(dt),
                      device=device_label(dev), attention=resolve_backend("auto", dev, dt, cfg.head_dim),
                      n_items=raw.n_items, n_rows=raw.n_rows, tolerance=tol)
        cells = list(_cells(placements, norms, [p for p in paths if p != "dp"], buffer_dtypes))
        key, enc = None, None
        for placement, norm, path, buf in show_progress(cells, desc=f"correctness {fam}", enabled=progress):
            if key != (placement, norm):     # a (placement, norm)'s cells come together: one encoder alive at a time
                enc = None                   # (the last one's memory back before the next is built)
                enc, key = _build(cfg, placement, norm, dt, dev, seed), (placement, norm)
            batch = nrm if enc.input_kind == "normalized" else raw
            out, extra = PATH_CALLS[path](enc, batch, s.params, buf)
            rows.append(_row(common, placement, norm, path, buf, out, ref, cell_tolerance(dt, buf), **extra))
        del enc
        if "dp" in paths:    # run after the loop, every family in one group of ranks
            dp_cells.append(dict(cfg=cfg, items=items, common=common, ref=ref))
        if hazard:
            rows += _hazard_rows(cfg, raw, nrm, placements, norms, dt, dev, seed, budgets, max_items, common)
        rows += _kernel_choice_rows(cfg, raw, norms, dt, dev, seed, common, ref)
    if dp_cells:
        rows += _dp_rows(dp_cells, placements, norms, dt, dev, seed, dp_world_size, tol)
    return tidy(pd.DataFrame(rows), METRICS)




def _row(common, placement, norm, path, buf, out, ref, tol, case="embedding", **extra):
    err = rel_err(out, ref)
    return dict(common, case=case, placement=placement, norm=norm, path=path, buffer_dtype=buf,
                tolerance=tol, rel_err=err, cos_min=cos_min(out, ref), ok=bool(np.isfinite(err) and err < tol),
                **extra)


def _build(cfg, placement, norm, dt, dev, seed):
    """An engine-like encoder (no input guards); norm-free placements get a stand-in they never call."""
    return build_encoder(cfg, placement=placement, norm="eager" if norm == "(unused)" else norm, dtype=dt,
                         device=dev, seed=seed, check_inputs=False)


def _dp_rows(families: list[dict], placements, norms, dt, dev, seed, world, tol):
    """The dp cells of every family (dicts of cfg, items, common, ref), in one group of ranks."""
    from ...launch import launch

    cells = sorted({(p, n) for p, n, _, _ in _cells(placements, norms, ["eager"], ["-"])})
    if dev.type == "cuda" and torch.cuda.device_count() < world:
        return [dict(f["common"], case="embedding", placement=p, norm=n, path="dp", buffer_dtype="-",
                     note=f"skipped: dp needs {world} GPUs, {torch.cuda.device_count()} visible")
                for f in families for p, n in cells]
    specs = [dict(cfg=f["cfg"], items=f["items"], cells=cells, dtype=dt, seed=seed) for f in families]
    backend = "nccl" if dev.type == "cuda" else "gloo"
    results = launch(_encode_dp_cells, world_size=world, backend=backend, args=(specs,))
    out = []
    for i, f in enumerate(families):
        for p, n in cells:
            emb = results[0][i][(p, n)]
            agree = all(torch.equal(r[i][(p, n)], emb) for r in results[1:])
            out.append(_row(f["common"], p, n, "dp", "-", emb, f["ref"], tol, backend=backend, ranks=world,
                            ranks_agree=agree))
    return out


# the placements whose graph replays the NaN hazard check poisons: tower always (its norm runs on
# the padding rows inside the graph), fold and device when the study runs them (the folded patch
# embedding, and normalized rows staged into the buffer, meet the same padding)
HAZARD_PLACEMENTS = ("tower", "fold", "device")


def _hazard_rows(cfg, raw, nrm, placements, norms, dt, dev, seed, budgets, max_items, common):
    """Under the graph runner: poison the pool and the padding rows with NaN, then check that no
    real row changes (bitwise) or stops being finite."""
    out = []
    chosen = [p for p in HAZARD_PLACEMENTS if p == "tower" or p in placements]
    # every placement meets the shared buffers (the rows the graph reads are the runner's, whoever normalized),
    # with one norm: on the NaN check's encoder where there is one, else on one built for it
    stale_norm = next((n for n in norms if n not in FORGETFUL_NORMS), norms[0])
    stale = {p: "(unused)" if p in NORM_FREE else stale_norm for p in placements}

    def stale_rows(enc, placement, norm):
        return _stale_rows(enc, nrm if enc.input_kind == "normalized" else raw, budgets, max_items, common,
                           placement, norm)

    for placement, norm in ((p, n) for p in chosen for n in (["(unused)"] if p in NORM_FREE else norms)):
        enc = _build(cfg, placement, norm, dt, dev, seed)
        runner = EncoderGraphRunner(enc, budgets=list(budgets), buffer_dtype=torch.bfloat16, max_items=max_items,
                                    policy="always")
        clean = runner.encode(raw).float().cpu()
        runner.poison_pool()
        poisoned = runner.encode(raw, pad_value=float("nan")).float().cpu()
        finite = bool(torch.isfinite(poisoned).all())
        changed = int((~(poisoned == clean).all(dim=1)).sum())
        diff = rel_err(poisoned, clean) if finite else float("nan")
        out.append(dict(common, case="nan_padding", placement=placement, norm=norm, path="cudagraph",
                        buffer_dtype="bfloat16", rel_err=diff, cos_min=cos_min(poisoned, clean) if finite else
                        float("nan"), ok=finite and changed == 0, rows_changed=changed, backend=runner.backend))
        if stale.get(placement) == norm:
            out += stale_rows(enc, placement, stale.pop(placement))
    for placement, norm in stale.items():
        out += stale_rows(_build(cfg, placement, norm, dt, dev, seed), placement, norm)
    return out


# the engine whose shared buffers the stale-rows check replays (one input buffer for every budget)
SHARED_BUFFER_ENGINE = "vllm-0.34"


def _stale_rows(enc, raw, budgets, max_items, common, placement, norm):
    """Under an engine policy with buffers shared across budgets: a small item replayed right after the buffer
    held a larger pack (another image's pixels, then NaN, in the rows past the item), with the padding written
    whole (what vLLM 0.34 requires of padding logic) and with only the valid rows written (a padding logic that
    skips the rest). A cell is right where no real row changes (bitwise) or stops being finite."""
    rows = raw.item_rows
    small, other = min(range(raw.n_items), key=lambda i: rows[i]), max(range(raw.n_items), key=lambda i: rows[i])
    one = raw.select([small])
    out = []
    for fill, padding in ((True, "whole buffer"), (False, "valid rows only")):
        runner = EncoderGraphRunner(enc, budgets=list(budgets), buffer_dtype=torch.bfloat16, max_items=max_items,
                                    policy="always", engine=SHARED_BUFFER_ENGINE, fill_padding=fill)
        clean = runner.encode(one).float().cpu()
        buf, pix = runner.input_buffer, raw.pixels[raw.item_slices[other]].to(runner.device)
        n = min(buf.shape[0], pix.shape[0])       # another image's rows, then NaN: what a larger pack left behind
        with torch.inference_mode():
            buf[:n].copy_(pix[:n])
            buf[n:].fill_(float("nan"))
            buf[rows[small] + (buf.shape[0] - rows[small]) // 2:].fill_(float("nan"))
        runner.reset_stats()
        stale = runner.encode(one).float().cpu()
        finite = bool(torch.isfinite(stale).all())
        changed = int((~(stale == clean).all(dim=1)).sum())
        replays = int((~runner.stats_frame().miss).sum())     # 0: the item ran eagerly, the check says nothing
        out.append(dict(common, case="stale_rows", replays=replays, placement=placement, norm=norm, path="cudagraph",
                        buffer_dtype="bfloat16", engine=SHARED_BUFFER_ENGINE, padding=padding,
                        rel_err=rel_err(stale, clean) if finite else float("nan"),
                        cos_min=cos_min(stale, clean) if finite else float("nan"), ok=finite and changed == 0,
                        rows_changed=changed, backend=runner.backend))
    return out


def _attention_kernel(enc, batch) -> str:
    """The attention kernel the eager path runs full attention with for ``batch``: dense cuDNN when
    every sequence has the same length of at least DENSE_MIN_ROWS rows (varlen backend), else the
    backend's own (flash varlen, masked SDPA or the per-sequence loop)."""
    from ...attention import use_dense

    meta = enc.visual.prepare_cached(batch.grid_thw)
    return "dense" if use_dense(enc.visual.kernels.backend, meta.dense_seqlen) else enc.visual.kernels.backend


def _kernel_choice_rows(cfg, raw, norms, dt, dev, seed, common, ref):
    """The same item encoded alone and inside the study's mixed batch (placement tower, eager): on
    CUDA a single image of at least DENSE_MIN_ROWS rows runs dense cuDNN attention and the mixed
    batch flash varlen, the choice graph and eager paths also make by packing. ``rel_err`` is item
    alone vs item in the batch: a kernel choice, shown beside the verdicts' tolerance; the item's
    own error against the float64 reference is ``rel_err_ref``."""
    norm = next((n for n in norms if n != "identity"), norms[0])
    enc = _build(cfg, "tower", norm, dt, dev, seed)
    with torch.no_grad():
        together = enc.encode(raw).float().cpu()
        firsts = np.cumsum([0] + cfg.item_tokens(raw.grid_thw)).tolist()
        out = []
        for i in range(raw.n_items):
            one = raw.select([i])
            alone = enc.encode(one).float().cpu()
            rows = slice(firsts[i], firsts[i + 1])
            out.append(dict(common, case="kernel_choice", placement="tower", norm=norm, path="eager",
                            buffer_dtype="-", item=i, kernels=f"{_attention_kernel(enc, one)} alone, "
                            f"{_attention_kernel(enc, raw)} in the batch",
                            rel_err=rel_err(alone, together[rows]), rel_err_ref=rel_err(alone, ref[rows]),
                            bit_equal=bool(torch.equal(alone, together[rows]))))
    return out
