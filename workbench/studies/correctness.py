"""Correctness study: which (family x placement x path x norm x buffer dtype) cells give the right
embedding, and does NaN in padding rows or in the graph pool leak into real rows.

Every cell builds the encoder exactly as an engine wires it (see workbench.encoder) and encodes
the same real photos and a short video; the reference is the same weights in float64, eager, on
pixels normalized in float64. Wrong cells come from the wiring alone: nothing here knows which
cells should fail. `ok` is rel_err below a per-dtype tolerance (TOLERANCE, justified there).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from ..config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY, VisionConfig
from ..checkpoints import resolve_config
from ..dtypes import dtype_name
from ..dtypes import resolve_dtype as dtype_of
from ..dp import encode_dp
from ..encoder import PATHS, PLACEMENT_TABLE, STUDY_PLACEMENTS, build_encoder
from ..formatting import device_label
from ..norms import NORMS, normalize_reference
from ..preprocess import Video, preprocess
from ..reference import cos_min, rel_err
from ..runner import EncoderGraphRunner
from ..samples import SAMPLE_NAMES, sample_images, sample_video
from . import Study, begin_run, register
from .footprint import Footprint, itemsize, largest, tower_bytes
from .params import Param, ParamSpec, ascending_unique
from .plotting import is_cpu, legend_right
from .plotting import progress as show_progress
from .tables import tidy, wide

# Relative-error tolerance per tower dtype. A right cell differs from the float64 reference only
# by rounding: fp32 ~1e-6 (24-bit mantissa, errors grow slowly with depth), bf16 ~1e-2 (8-bit
# mantissa: unit roundoff 2^-9 = 2e-3 per op, accumulated over blocks and the 5120-wide merger).
# A wrong normalization changes the input by O(1) relative (raw 0..255 vs ~N(0,1)), and the
# embedding by > 0.3 relative. The thresholds sit ~10x above the right cells' error, and one to
# two orders of magnitude below the wrong cells'.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}

# A graph buffer narrower than the tower rounds what it holds: raw 0..255 are exact in bf16, but
# normalized floats (placements processor, runner, double) are rounded to bf16 there. Such a cell
# is judged at the precision of the narrowest float in its data path (see `cell_tolerance`).
PRECISION_ORDER = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def cell_tolerance(dtype: torch.dtype, buffer_dtype: str) -> float:
    buf = dtype_of(buffer_dtype) if buffer_dtype in BUFFER_NAMES else None
    if buf is None or not buf.is_floating_point:
        return TOLERANCE[dtype]
    return TOLERANCE[max(dtype, buf, key=PRECISION_ORDER.index)]


# norm implementations do not matter where no device norm runs
NORM_FREE = tuple(n for n, p in PLACEMENT_TABLE.items() if p.norm_in is None)
BUFFER_NAMES = ("bfloat16", "uint8", "float32")
PATH_COLUMNS = ["eager", "cudagraph[bfloat16]", "cudagraph[uint8]", "cudagraph[float32]", "dp"]


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


def _encode_dp_cells(spec: dict) -> dict:
    """Runs on every dp rank: encodes every (placement, norm) of spec through the dp path."""
    import torch.distributed as dist

    device = f"cuda:{dist.get_rank()}" if dist.get_backend() == "nccl" else "cpu"
    out = {}
    for placement, norm in spec["cells"]:
        enc = _build(spec["cfg"], placement, norm, spec["dtype"], device, spec["seed"])
        batch = preprocess(spec["items"], enc.cfg, normalize=enc.input_kind == "normalized")
        out[(placement, norm)] = PATH_CALLS["dp"](enc, batch, spec, "-")[0].float().cpu()
    return out


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


PARAMS = ParamSpec(
    Param("families", "list[str]", cpu=TINY_PRESET_PER_FAMILY, gpu=REAL_PRESET_PER_FAMILY,
          choices=PRESET_NAMES, model_folders=True, help="presets (one tower each)"),
    Param("depth", "int", cap="depth", cpu=None, gpu=4, optional=True, minimum=1,
          help="blocks per tower, real width kept (None: the preset's depth)"),
    Param("dtype", "str", cpu="float32", gpu="bfloat16", choices=("float32", "bfloat16", "float16"),
          help="tower dtype"),
    Param("placements", "list[str]", cpu=list(STUDY_PLACEMENTS), choices=STUDY_PLACEMENTS,
          help="where normalization lives"),
    Param("norms", "list[str]", cpu=list(NORMS), choices=NORMS, help="norm implementations"),
    Param("paths", "list[str]", cpu=list(PATHS), choices=PATHS, help="execution paths"),
    Param("buffer_dtypes", "list[str]", cpu=["bfloat16", "uint8", "float32"],
          choices=("bfloat16", "uint8", "float32"), help="graph input buffer dtypes (cudagraph path)"),
    Param("max_pixels", "int", cap="frame_pixels", cpu=112 * 112, gpu=448 * 448, minimum=56 * 56, help="processor cap on image size"),
    Param("budgets", "list[int]", cap="budget_tokens", cpu=[16, 64], gpu=[64, 128, 256, 512, 1024], minimum=1,
          rule=ascending_unique, help="graph budgets in merged tokens"),
    Param("max_items", "int", cap="items", cpu=8, minimum=1, help="most sequences one replay holds"),
    Param("dp_world_size", "int", cap="world_size", cpu=2, minimum=1, help="ranks of the dp path"),
    Param("hazard", "bool", cpu=True, help="also poison pool and padding with NaN"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
    check=lambda p: _check_budgets_cover(p),
)

METRICS = {"rel_err": "relative", "cos_min": "cosine", "ok": "bool", "replays": "count", "misses": "count",
           "padded_rows": "rows", "rows_changed": "rows", "ranks_agree": "bool", "rel_err_ref": "relative",
           "bit_equal": "bool"}


def _check_budgets_cover(p: dict) -> None:
    small = [b for b in p["budgets"] if b < p["max_items"]]
    if small:
        raise ValueError(f"budgets {small} are smaller than max_items={p['max_items']}: a budget must hold one "
                         f"merged token per item; raise them or lower max_items")


def run(device: str = "auto", progress: bool = True, **params) -> pd.DataFrame:
    """Measure every cell; returns the tidy long table (metrics rel_err, cos_min, ok, ...).

    params: see PARAMS (defaults: the device's profile). families: preset names; depth: reduce
    every tower to this many blocks (real width kept); max_pixels caps the processor's image size;
    budgets/max_items configure the graph runner; dp_world_size ranks run the dp path (gloo on
    CPU, NCCL with one GPU per rank; skipped with a note when fewer GPUs are visible). hazard:
    also run the NaN padding / pool check.
    """
    s = begin_run(PARAMS, "correctness", device, params)
    (families, depth, dtype, placements, norms, paths, buffer_dtypes, max_pixels, budgets, max_items,
     dp_world_size, hazard, seed) = (s.params[k] for k in PARAMS.names)
    dev, dt = s.device, s.dtype
    tol = TOLERANCE[dt]
    rows = []
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
        common = dict(family=cfg.family, preset=fam, depth=cfg.depth, width=cfg.width, dtype=dtype_name(dt), device=device_label(dev), n_items=raw.n_items, n_rows=raw.n_rows, tolerance=tol)
        cells = list(_cells(placements, norms, [p for p in paths if p != "dp"], buffer_dtypes))
        encoders = {}
        for placement, norm, path, buf in show_progress(cells, desc=f"correctness {fam}", enabled=progress):
            key = (placement, norm)
            if key not in encoders:
                encoders[key] = _build(cfg, placement, norm, dt, dev, seed)
            enc = encoders[key]
            batch = nrm if enc.input_kind == "normalized" else raw
            out, extra = PATH_CALLS[path](enc, batch, s.params, buf)
            rows.append(_row(common, placement, norm, path, buf, out, ref, cell_tolerance(dt, buf), **extra))
        encoders.clear()
        if "dp" in paths:
            rows += _dp_rows(cfg, items, placements, norms, dt, dev, seed, dp_world_size, common, ref, tol)
        if hazard:
            rows += _hazard_rows(cfg, raw, norms, dt, dev, seed, budgets, max_items, common)
        rows += _kernel_choice_rows(cfg, raw, norms, dt, dev, seed, common, ref)
    return tidy(pd.DataFrame(rows), METRICS)


def _cells_wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (wide) from the long table; a wide frame passes through."""
    return wide(df) if "metric" in df.columns else df


def _row(common, placement, norm, path, buf, out, ref, tol, case="embedding", **extra):
    err = rel_err(out, ref)
    return dict(common, case=case, placement=placement, norm=norm, path=path, buffer_dtype=buf,
                tolerance=tol, rel_err=err, cos_min=cos_min(out, ref), ok=bool(np.isfinite(err) and err < tol),
                **extra)


def _build(cfg, placement, norm, dt, dev, seed):
    """An engine-like encoder (no input guards); norm-free placements get a stand-in they never call."""
    return build_encoder(cfg, placement=placement, norm="eager" if norm == "(unused)" else norm, dtype=dt,
                         device=dev, seed=seed, check_inputs=False)


def _dp_rows(cfg, items, placements, norms, dt, dev, seed, world, common, ref, tol):
    from ..launch import launch

    cells = sorted({(p, n) for p, n, _, _ in _cells(placements, norms, ["eager"], ["-"])})
    if dev.type == "cuda" and torch.cuda.device_count() < world:
        return [dict(common, case="embedding", placement=p, norm=n, path="dp", buffer_dtype="-",
                     note=f"skipped: dp needs {world} GPUs, {torch.cuda.device_count()} visible") for p, n in cells]
    spec = dict(cfg=cfg, items=items, cells=cells, dtype=dt, seed=seed)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    results = launch(_encode_dp_cells, world_size=world, backend=backend, args=(spec,))
    out = []
    for p, n in cells:
        emb = results[0][(p, n)]
        agree = all(torch.equal(r[(p, n)], emb) for r in results[1:])
        out.append(_row(common, p, n, "dp", "-", emb, ref, tol, backend=backend, ranks=world, ranks_agree=agree))
    return out


def _hazard_rows(cfg, raw, norms, dt, dev, seed, budgets, max_items, common):
    """Tower placement under the graph runner: poison the pool and the padding rows with NaN, then
    check that no real row changes (bitwise) or stops being finite."""
    out = []
    for norm in norms:
        enc = _build(cfg, "tower", norm, dt, dev, seed)
        runner = EncoderGraphRunner(enc, budgets=list(budgets), buffer_dtype=torch.bfloat16, max_items=max_items,
                                    policy="always")
        clean = runner.encode(raw).float().cpu()
        runner.poison_pool()
        poisoned = runner.encode(raw, pad_value=float("nan")).float().cpu()
        finite = bool(torch.isfinite(poisoned).all())
        changed = int((~(poisoned == clean).all(dim=1)).sum())
        diff = rel_err(poisoned, clean) if finite else float("nan")
        out.append(dict(common, case="nan_padding", placement="tower", norm=norm, path="cudagraph",
                        buffer_dtype="bfloat16", rel_err=diff, cos_min=cos_min(poisoned, clean) if finite else
                        float("nan"), ok=finite and changed == 0, rows_changed=changed, backend=runner.backend))
    return out


def _attention_kernel(enc, batch) -> str:
    """The attention kernel the eager path runs full attention with for ``batch``: dense cuDNN when
    every sequence has the same length of at least DENSE_MIN_ROWS rows (varlen backend), else the
    backend's own (flash varlen, masked SDPA or the per-sequence loop)."""
    from ..attention import use_dense

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
        unit = cfg.merge_unit
        out = []
        for i, sl in enumerate(raw.item_slices):
            one = raw.select([i])
            alone = enc.encode(one).float().cpu()
            rows = slice(sl.start // unit, sl.stop // unit)
            out.append(dict(common, case="kernel_choice", placement="tower", norm=norm, path="eager",
                            buffer_dtype="-", item=i, kernels=f"{_attention_kernel(enc, one)} alone, "
                            f"{_attention_kernel(enc, raw)} in the batch",
                            rel_err=rel_err(alone, together[rows]), rel_err_ref=rel_err(alone, ref[rows]),
                            bit_equal=bool(torch.equal(alone, together[rows]))))
    return out


# ---- presentation ---------------------------------------------------------------------------
def path_column(df: pd.DataFrame) -> pd.Series:
    return np.where(df.path == "cudagraph", "cudagraph[" + df.buffer_dtype.astype(str) + "]", df.path)


def path_label(column: str, cpu: bool) -> str:
    """A path column as a figure names it: on a CPU the graph runner is emulated, not a CUDA graph."""
    return column.replace("cudagraph", "emulated graph") if cpu else column


# `identity` is itself the bug it models (a forgotten normalization: cast only), so the matrix of
# placements is drawn over the real implementations and identity gets its own.
FORGETFUL_NORMS = ("identity",)


def _select_norms(df: pd.DataFrame, norms) -> pd.DataFrame:
    df = _cells_wide(df)
    d = df[(df.case == "embedding") & df.rel_err.notna()].copy()
    if norms is None:
        return d[~d.norm.isin(FORGETFUL_NORMS)]
    return d[d.norm.isin(list(norms) + ["(unused)"])]


def matrix(df: pd.DataFrame, norms=None) -> pd.DataFrame:
    """placement x path table per family: 'ok' / 'WRONG' (all norms agree) or 'mixed', worst rel_err.

    norms: the implementations to aggregate over (default: all but identity)."""
    d = _select_norms(df, norms)
    d["column"] = path_column(d)

    def cell(g):
        verdict = "ok" if g.ok.all() else ("WRONG" if (~g.ok).all() else "mixed")
        return f"{verdict} ({g.rel_err.max():.1e})"

    m = d.groupby(["family", "placement", "column"]).apply(cell, include_groups=False).unstack("column")
    cols = [c for c in PATH_COLUMNS if c in m.columns]
    order = [p for p in STUDY_PLACEMENTS if p in m.index.get_level_values("placement")]
    return m[cols].reindex(pd.MultiIndex.from_product([sorted(d.family.unique()), order]))


def style_matrix(m: pd.DataFrame):
    """The matrix as a coloured pandas Styler (green right, red wrong, amber mixed)."""
    def colour(v):
        if not isinstance(v, str):
            return ""
        if v.startswith("ok"):
            return "background-color: #c8e6c9"
        return "background-color: #ffcdd2" if v.startswith("WRONG") else "background-color: #ffe0b2"
    return m.style.map(colour)


def plot_matrix(df: pd.DataFrame, title: str | None = None, norms=None):
    """Placement x path grid per family: green = right for every norm, red = wrong for every norm,
    amber = depends on the norm; each cell shows the worst rel_err vs the float64 reference.

    norms: the implementations to aggregate over (default: all but identity)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    d = _select_norms(df, norms)
    d["column"] = path_column(d)
    fams = sorted(d.family.unique())
    fig, axes = plt.subplots(1, len(fams), figsize=(6.2 * len(fams), 4.6), squeeze=False)
    cmap = ListedColormap(["#ef9a9a", "#ffe082", "#a5d6a7"])  # wrong, mixed, right
    for ax, fam in zip(axes[0], fams):
        g = d[d.family == fam]
        worst = g.groupby(["placement", "column"]).rel_err.max().unstack("column")
        frac = g.groupby(["placement", "column"]).ok.mean().astype("float64").unstack("column")
        cols = [c for c in PATH_COLUMNS if c in worst.columns]
        rows = [p for p in STUDY_PLACEMENTS if p in worst.index]
        worst, frac = worst.reindex(index=rows, columns=cols), frac.reindex(index=rows, columns=cols)
        code = np.where(frac.isna(), np.nan, np.where(frac == 1, 2, np.where(frac == 0, 0, 1)))
        ax.imshow(np.ma.masked_invalid(code.astype(float)), cmap=cmap, vmin=0, vmax=2, aspect="auto")
        for i in range(len(rows)):
            for j in range(len(cols)):
                v = worst.iat[i, j]
                if pd.isna(v) or np.isnan(code[i, j]):
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=8, color="grey")
                    continue
                mark = {2: "ok", 0: "WRONG", 1: "mixed"}[int(code[i, j])]
                ax.text(j, i, f"{mark}\n{v:.1e}", ha="center", va="center", fontsize=8)
        # the path names of the tables, the buffer dtype on a line of its own (never overlapping)
        ax.set_xticks(range(len(cols)), [path_label(c, is_cpu(g)).replace("[", "\n[") for c in cols])
        ax.set_yticks(range(len(rows)), rows)
        devs = ", ".join(sorted(g.device.unique()))
        ax.set_title(f"{fam} ({g.dtype.iloc[0]}, {devs})", fontsize=10)
    shown = ", ".join(sorted(set(d.norm) - {"(unused)"}))
    fig.suptitle(title or "Correctness: placement x path")
    fig.text(0.5, -0.04, f"cell text: worst rel_err vs float64 eager over the norm implementations {shown}; "
             "n/a: a uint8 buffer cannot hold normalized input", ha="center", fontsize=8)
    fig.tight_layout()
    return fig


CONTROL_LABEL = "identity (no norm: control)"


def plot_rel_err(df: pd.DataFrame):
    """rel_err of every cell on a log scale, grouped by placement, one marker per path, with the
    tolerance line. The identity implementation (no normalization: a control, wrong wherever the
    device norm is relied on) is drawn apart as grey crosses, never mixed with the real norms."""
    import matplotlib.pyplot as plt

    df = _cells_wide(df)
    d = df[(df.case == "embedding") & df.rel_err.notna()].copy()
    d["column"] = path_column(d)
    cpu = is_cpu(d)
    control = d.norm.isin(FORGETFUL_NORMS)
    fig, ax = plt.subplots(figsize=(9, 4))
    places = [p for p in STUDY_PLACEMENTS if p in set(d.placement)]
    markers = dict(zip(PATH_COLUMNS, "osD^v"))
    series = [(col, g, markers.get(col, "o"), None, path_label(col, cpu)) for col, g in d[~control].groupby("column")]
    if control.any():
        series.append((None, d[control], "x", "0.35", CONTROL_LABEL))
    for k, (_, g, marker, color, label) in enumerate(series):
        x = [places.index(p) + 0.1 * (k - (len(series) - 1) / 2) for p in g.placement]
        ax.scatter(x, g.rel_err.clip(lower=1e-9), marker=marker, color=color, label=label, alpha=0.7)
    for tol in sorted(d.tolerance.unique()):
        ax.axhline(tol, color="k", ls="--", lw=0.8)
        ax.text(len(places) - 0.5, tol, f" tol {tol:g}", va="bottom", ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(places)), places)
    ax.set_ylabel("rel_err vs float64 reference")
    legend_right(ax, fontsize=8)
    ax.set_title(f"Every cell's relative error (all families and norms; {', '.join(sorted(d.device.unique()))})")
    return fig


def findings(df: pd.DataFrame) -> str:
    """A short written finding from the table."""
    df = _cells_wide(df)
    d = _select_norms(df, None)
    d["column"] = path_column(d)
    parts = []
    for (dev, dtype), g in d.groupby(["device", "dtype"]):
        wrong = g[~g.ok]
        right = sorted(set(g.placement) - set(wrong.placement), key=STUDY_PLACEMENTS.index)
        bad = []
        for p in [p for p in STUDY_PLACEMENTS if p in set(wrong.placement)]:
            cols = [c for c in PATH_COLUMNS if c in set(wrong[wrong.placement == p].column)]
            every = set(cols) == set(g[g.placement == p].column)
            bad.append(f"{p} (on every path)" if every else f"{p} (on {', '.join(cols)})")
        norms_used = sorted(set(g.norm) - {"(unused)"})
        worst_ok = g[g.ok].rel_err.max()
        best_bad = wrong.rel_err.min() if len(wrong) else float("nan")
        parts.append(f"On {dev} ({dtype} towers, {g.family.nunique()} families, norms {', '.join(norms_used)}; "
                     f"{len(g)} cells): right on every path: {', '.join(right) or 'none'}. "
                     f"Wrong: {'; '.join(bad) or 'none'}. Right cells stay below {worst_ok:.1e} relative error, "
                     f"wrong ones start at {best_bad:.2f}: the wiring, not rounding, decides.")
    # a bf16 graph buffer rounds what it holds: free for raw 0..255, not for normalized floats
    for (dev, dtype), g in d[(d.path == "cudagraph") & d.ok].groupby(["device", "dtype"]):
        if dtype == "bfloat16":
            continue
        raw_in = g[g.placement == "tower"].groupby("buffer_dtype").rel_err.max()
        norm_in = g[g.placement.isin(["processor", "runner"])].groupby("buffer_dtype").rel_err.max()
        if "bfloat16" in norm_in and "float32" in norm_in:
            parts.append(f"On {dev}, a bfloat16 graph buffer in a {dtype} tower costs precision only where it "
                         f"holds normalized floats (processor, runner): rel_err {norm_in['bfloat16']:.1e} vs "
                         f"{norm_in['float32']:.1e} with a float32 buffer; raw 0..255 pixels (placement tower) are exact "
                         f"in bf16 (rel_err {raw_in.get('bfloat16', float('nan')):.1e}, as eager).")
    ident = _select_norms(df, FORGETFUL_NORMS)
    ident = ident[ident.norm.isin(FORGETFUL_NORMS)]
    if len(ident):
        ok_places = sorted(set(ident[ident.ok].placement))
        parts.append("The identity implementation (a forgotten normalization, cast only) is wrong wherever the "
                     "device norm is relied on" + (f"; it is right only for {', '.join(ok_places)}, where the "
                                                   "processor already normalized" if ok_places else "") + ".")
    kc = df[df.case == "kernel_choice"] if "case" in df else df.iloc[0:0]
    for (dev, dtype), g in kc.groupby(["device", "dtype"]):
        tol = float(d[(d.device == dev) & (d.dtype == dtype)].tolerance.min()) if len(d) else float("nan")
        kinds = ", ".join(sorted(set(g.kernels)))
        parts.append(f"On {dev} ({dtype}), the same item encoded alone and inside the mixed batch (placement tower, "
                     f"eager; attention {kinds}): {int(g.bit_equal.astype(bool).sum())}/{len(g)} bit-equal, largest "
                     f"difference rel_err {g.rel_err.max():.1e} against a verdict tolerance of {tol:.0e}: the kernels "
                     f"a batch's shapes select (attention kernel, GEMM tiling by row count), not wiring; alone the "
                     f"item stays within {g.rel_err_ref.max():.1e} of float64.")
    hz = df[df.case == "nan_padding"]
    if len(hz):
        leaks = hz[~hz.ok.astype(bool)]
        parts.append(f"NaN hazard check ({len(hz)} runs: pool and padding rows poisoned with NaN before replay): "
                     + ("no real row changed in any run." if leaks.empty else
                        f"real rows changed in {len(leaks)} runs: {', '.join(leaks.norm)}."))
    return "\n\n".join(parts)


def _run_title(what: str, g: pd.DataFrame) -> str:
    from .plotting import run_label

    name = str(g["run"].iloc[0]) if "run" in g else "local"
    return f"{what}, run {name} ({run_label(g)})"


def matrix_figure(g: pd.DataFrame):
    """One run's placement x path matrix (devices are never pooled in one plot)."""
    return plot_matrix(g, title=_run_title("Correctness matrix", g))


def rel_err_figure(g: pd.DataFrame):
    fig = plot_rel_err(g)
    fig.axes[0].set_title(_run_title("Every cell's relative error", g), fontsize=10)
    return fig


def footprint(p, device: str) -> Footprint:
    """Every family's tower over the study's items (the photos and the video, each capped at
    max_pixels), twice for the float64 reference, and once per dp rank on a CPU."""
    items = len(SAMPLE_NAMES) + 1                        # the photos and a short video
    ranks = p["dp_world_size"] if device == "cpu" and "dp" in p["paths"] else 1

    def cell(name: str) -> Footprint:
        cfg = resolve_config(name, p["depth"])
        per_item = p["max_pixels"] // cfg.patch_size ** 2 * 2    # patch rows of one capped item, two frame pairs
        rows = max(per_item * items, max(p["budgets"]) * cfg.merge_unit)
        one = tower_bytes(cfg, rows, per_item, itemsize(p), device) + tower_bytes(cfg, rows, per_item, 8, device)
        return Footprint(one * ranks, f"{name}, {items} items of up to {p['max_pixels']:,} pixels")
    return largest(cell(name) for name in p["families"])

STUDY = register(Study(
    name="correctness",
    order=1,
    notebook="notebooks/correctness.ipynb",
    run=run,
    cells="families",
    params=PARAMS,
    prepare=_cells_wide,
    findings=findings,
    figures=(("correctness_matrix", matrix_figure, "Placement x path verdicts per family (green right for every "
              "norm, red wrong for every norm, amber norm-dependent), worst relative error in each cell"),
             ("correctness_rel_err", rel_err_figure, "Relative error of every cell against the float64 reference, "
              "by placement, with the tolerance; the identity norm (no normalization, a control expected to be wrong "
              "where the device norm is relied on) as grey crosses")),
    footprint=footprint,
    question="which (placement x path x family) cells give the right embedding; does NaN in padding/pool "
             "leak into real rows",
    # the dp path's ranks each take a GPU on CUDA (gloo processes on a CPU)
    gpus=lambda p, device: p["dp_world_size"] if device == "cuda" and "dp" in p["paths"] else 1,
))
