"""Cast cost: what staging the graph input costs per replay, for each design an engine could choose.

A captured encoder graph reads its pixels from a static input buffer. Before every replay the
runner fills it with the batch's valid rows and pads the rest; then (in the tower placements) the
graph normalizes it. The designs, each with every norm implementation where it has a norm:

- ``bf16_buffer``  bf16 buffer: zero the padding + cast-copy uint8 into it; the tower's norm runs
                   over all rows (reading bf16): the engine before its buffer became uint8;
- ``uint8_buffer`` uint8 buffer: zero + copy; the norm over all rows (the engine today);
- ``uint8_valid``  uint8 buffer: copy only the valid rows; the norm skips padding via ``n_valid``;
- ``runner``       the runner normalizes the source rows straight into the bf16 buffer (valid rows
                   only, ``out=``) and zeroes the padding; no norm in the graph;
- ``fp32_buffer``  fp32 buffer holding CPU-normalized floats (the legacy path): zero + copy, then
                   the tower casts fp32 -> bf16 (its "norm" column is that cast).

Per (design, norm, budget, fill) it measures the copy part, the norm part and both together (CUDA:
graph replays on cold L2, median and p90; CPU: host time), the bytes each moves (workbench.memory_model
byte model), the byte floor at the copy ceiling measured in the same run, and the tower's own
replay at that budget, also measured in the same run, beside its FLOP floor (matmul + attention
FLOPs at the matmul rate measured in the run). Every design's output is checked against a
float64 reference before it is timed.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from ..ceilings import copy_ceiling_gbs, matmul_tflops
from ..config import PRESET_NAMES, REAL_PRESET_PER_FAMILY, TINY_PRESET_PER_FAMILY, VisionConfig
from ..checkpoints import resolve_config
from ..dtypes import dtype_name
from ..encoder import build_encoder
from ..floors import floor_us, flop_floor_us, tower_flops
from ..formatting import fmt_bytes, fmt_us
from ..norms import REAL_NORMS, make_norm, normalize_reference
from ..timing import time_us
from ..towers.common import budget_padding, filling_grid
from ..ulps import bf16_ulps
from . import Study, begin_run, register
from .footprint import Footprint, largest, largest_budget
from .params import Param, ParamSpec, ascending_unique, fractions
from .plotting import (is_cpu, labelled_runs, legend_below, legend_right, per_run, plain_log_ticks, run_label,
                       stamp_cpu)
from .plotting import progress as show_progress
from .tables import tidy, wide

DESIGNS = ("bf16_buffer", "uint8_buffer", "uint8_valid", "runner", "fp32_buffer")
LEGACY_NORM = "(cpu)"       # fp32_buffer: normalized on the CPU; its norm column is the tower's cast

PARAMS = ParamSpec(
    Param("presets", "list[str]", cpu=TINY_PRESET_PER_FAMILY, gpu=REAL_PRESET_PER_FAMILY,
          choices=PRESET_NAMES, model_folders=True,
          help="towers whose replay the staging is compared with (each its own cells)"),
    Param("depth", "int", cap="depth", cpu=None, optional=True, minimum=1,
          help="blocks of that tower (None: the preset's depth)"),
    Param("dtype", "str", cpu="bfloat16", choices=("bfloat16",), help="tower dtype (bf16, as served)"),
    Param("budgets", "list[int]", cap="budget_tokens", cpu=[16, 64], gpu=[256, 1024, 4096, 16384], minimum=1, rule=ascending_unique,
          help="graph budgets in merged tokens (4 pixel rows each)"),
    Param("fills", "list[float]", cpu=[0.25, 0.5, 0.75, 1.0], rule=fractions,
          help="valid rows / budget rows"),
    Param("designs", "list[str]", cpu=list(DESIGNS), choices=DESIGNS, help="staging designs"),
    Param("norms", "list[str]", cpu=["eager"], gpu=list(REAL_NORMS), choices=REAL_NORMS,
          help="norm implementations"),
    Param("reps", "int", cap="reps", cpu=5, gpu=30, minimum=1, help="timed repetitions per measurement"),
    Param("seed", "int", minimum=0, cap="seed", cpu=0),
    renamed={"preset": "presets"},
)

METRICS = {
    "copy_us": "us", "copy_p90_us": "us", "norm_us": "us", "norm_p90_us": "us",
    "staging_us": "us", "staging_p90_us": "us",
    "bytes": "bytes", "min_bytes": "bytes", "h2d_bytes": "bytes", "floor_us": "us", "ratio_to_floor": "x",
    "replay_us": "us", "share_of_replay": "fraction", "max_err_ulp": "ulp",
    "copy_gbs": "GB/s", "launch_us": "us", "matmul_tflops": "TFLOP/s", "replay_floor_us": "us",
}


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
    mod = make_norm(norm_name, cfg, check_values=False).to(dev)
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
        for norm in ([LEGACY_NORM] if design == "fp32_buffer" else norms):
            yield design, norm


def _tower_replay_us(cfg, dtype, dev, budget, reps, seed) -> float:
    """The tower's own time at ``budget`` (no input norm), as the runner replays it."""
    enc = build_encoder(cfg, placement="none", norm="eager", dtype=dtype, device=dev, seed=seed, check_inputs=False)
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
    replay = {}
    bar = show_progress(total=len(cells) * len(p["budgets"]) * len(p["fills"]) + len(p["budgets"]),
                        desc=f"cast_cost {p['preset']}", enabled=progress)
    for budget in p["budgets"]:
        replay[budget] = _tower_replay_us(cfg, dt, dev, budget, p["reps"], p["seed"])
        bar.update()
    for budget in p["budgets"]:
        big_n = budget * cfg.merge_unit
        for fill in p["fills"]:
            n = max(cfg.merge_unit, int(round(fill * budget)) * cfg.merge_unit)
            # one source per (budget, fill), shared by every design; its float64 reference on the device
            src_u8 = torch.randint(0, 256, (n, cfg.patch_dim), dtype=torch.uint8, generator=gen).to(dev)
            ref = normalize_reference(src_u8, cfg)
            src_f32, ref_bf16 = ref.float(), ref.to(torch.bfloat16)
            del ref
            for design, norm in cells:
                st = build_staging(design, norm, cfg, src_u8, src_f32, big_n, dt)
                with torch.inference_mode():
                    y = st.result()
                    err = int(bf16_ulps(y[:n].to(torch.bfloat16), ref_bf16).max())
                    t_copy = time_us(st.copy, dev, reps=p["reps"])
                    t_norm = time_us(st.norm, dev, reps=p["reps"])
                    t_all = time_us(lambda st=st: (st.copy(), st.norm()), dev, reps=p["reps"])
                total = st.copy_bytes + st.norm_bytes
                min_bytes = n * cfg.patch_dim * (1 + torch.empty((), dtype=dt).element_size())
                rows.append(dict(
                    study="cast_cost", preset=p["preset"], family=cfg.family, depth=cfg.depth, dtype=dtype_name(dt),
                    device=label, design=design, norm=norm, budget=budget, budget_rows=big_n, fill=fill,
                    valid_rows=n, copy_us=t_copy["p50_us"], copy_p90_us=t_copy["p90_us"], norm_us=t_norm["p50_us"],
                    norm_p90_us=t_norm["p90_us"], staging_us=t_all["p50_us"], staging_p90_us=t_all["p90_us"],
                    bytes=total, min_bytes=min_bytes, h2d_bytes=st.h2d_bytes, floor_us=floor_us(total, gbs),
                    ratio_to_floor=t_all["p50_us"] / floor_us(total, gbs), replay_us=replay[budget],
                    share_of_replay=t_all["p50_us"] / (t_all["p50_us"] + replay[budget]), max_err_ulp=err,
                    copy_gbs=gbs, launch_us=launch, matmul_tflops=tflops,
                    replay_floor_us=flop_floor_us(tower_flops(cfg, [big_n])["total"], tflops)))
                del st, y
                bar.update()
            del src_u8, src_f32, ref_bf16
    bar.close()
    return tidy(pd.DataFrame(rows), METRICS)


# ---- presentation ---------------------------------------------------------------------------

def cell_name(design: str, norm: str) -> str:
    return design if norm == LEGACY_NORM else f"{design} / {norm}"


def table_at(table: pd.DataFrame, fill: float = 0.75) -> pd.DataFrame:
    """One row per (device, budget, design, norm) at ``fill``: the closing table of the study."""
    w = wide(table)
    w = w[np.isclose(w.fill, fill)]
    cols = ["run", "reference", "device", "family", "preset", "budget", "design", "norm", "staging_us", "staging_p90_us", "copy_us", "norm_us", "bytes",
            "floor_us", "ratio_to_floor", "share_of_replay", "replay_us", "max_err_ulp"]
    cols = [c for c in cols if c in w]
    return w[cols].sort_values([c for c in ("run", "device", "budget", "staging_us") if c in cols]).reset_index(
        drop=True)


def _at_fill(w: pd.DataFrame, fill: float) -> tuple[pd.DataFrame, float]:
    """The rows of ``w`` at the measured fill closest to ``fill``, and that fill."""
    fills = np.sort(w.fill.unique())
    at = float(fills[np.argmin(np.abs(fills - fill))])
    return w[np.isclose(w.fill, at)], at


def plot_staging(g: pd.DataFrame, fill: float = 0.75):
    """Per budget: each design's staging time (copy + norm) at ``fill`` (or the closest fill
    measured), log time axis. On a GPU with its byte floor and its multiple of it beside each bar
    and p90 whiskers; a CPU run (host times, a smoke test) is stamped and has neither floor nor
    whiskers (a shared host's p90 is scheduling noise, up to 100x its p50)."""
    import matplotlib.pyplot as plt

    w = wide(g)
    if w.empty:
        return None
    w, fill = _at_fill(w, fill)
    cpu = is_cpu(w)
    budgets = sorted(w.budget.unique())
    n_cells = w.groupby("budget").size().max()
    ncols = min(2, len(budgets))
    nrows = -(-len(budgets) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.2 * ncols, (1.6 + 0.36 * n_cells) * nrows), squeeze=False)
    for ax in axes.flat[len(budgets):]:
        ax.set_visible(False)
    for ax, budget in zip(axes.flat, budgets):
        d = w[w.budget == budget].sort_values("staging_us")
        names = [cell_name(a, b) for a, b in zip(d.design, d.norm)]
        y = np.arange(len(d))
        ax.barh(y, d.staging_us, color="#90caf9",
                label="copy + norm (p50 host time)" if cpu else "copy + norm, one graph (p50)")
        if not cpu:
            ax.scatter(d.floor_us, y, marker="|", s=300, color="k", label="byte floor (bytes / copy ceiling)",
                       zorder=3)
            ax.errorbar(d.staging_us, y, xerr=[np.zeros(len(d)), (d.staging_p90_us - d.staging_us).clip(lower=0)],
                        fmt="none", ecolor="#1565c0", capsize=2, label="p90")
        for yi, (t, r) in enumerate(zip(d.staging_us, d.ratio_to_floor)):
            ax.text(t * 1.08, yi, fmt_us(t) if cpu else f"{fmt_us(t)} ({r:.1f}x floor)", va="center", fontsize=7)
        ax.set_yticks(y, names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        ax.set_xlabel("input staging per replay (us, log)")
        tower = fmt_us(d.replay_us.iloc[0])
        ax.set_title(f"budget {budget} tokens ({budget * 4} rows), {fill:.0%} valid\n"
                     + (f"tower forward {tower} (host)" if cpu else f"tower replay {tower}"), fontsize=9)
        ax.set_xlim(right=ax.get_xlim()[1] * 6)
        if cpu:
            stamp_cpu(ax)
    fig.suptitle(f"Cast cost: staging the graph input ({run_label(g)})", fontsize=11)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels())
    return fig


def plot_fill(g: pd.DataFrame, budget: int | None = None):
    """Staging time vs fill level at one budget (default: the largest), one line per cell: which
    designs pay for padding and which only for valid rows (a CPU run stamped as a smoke test)."""
    import matplotlib.pyplot as plt

    w = wide(g)
    if w.empty:
        return None
    budget = budget or int(w.budget.max())
    d = w[w.budget == budget]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    styles = {"eager": ("-", "o"), "triton_channel": (":", "s"), "triton_flat": ("-.", "^"),
              "triton_rows": ("--", "D"), LEGACY_NORM: ("-", "x")}
    colors = {design: f"C{i}" for i, design in enumerate(DESIGNS)}
    for (design, norm), c in d.groupby(["design", "norm"], sort=False):
        c = c.sort_values("fill")
        ls, marker = styles.get(norm, ("-", "o"))
        ax.plot(c.fill * 100, c.staging_us, ls=ls, marker=marker, color=colors.get(design, "k"), ms=4,
                label=cell_name(design, norm))
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("valid rows (% of the budget)")
    ax.set_ylabel("input staging per replay (us, log)")
    ax.set_title(f"Staging vs fill, budget {budget} tokens ({run_label(g)})", fontsize=10)
    legend_right(ax, ncol=2, title="colour: design, line: norm", title_fontsize=7)
    if is_cpu(d):
        stamp_cpu(ax)
    return fig


def key_numbers(table: pd.DataFrame, fill: float = 0.75) -> dict[str, pd.DataFrame]:
    """Per device, the designs (rows, cheapest first at the largest budget) x budgets: staging
    p50 in us, its ratio to the byte floor, and the bytes moved (MiB), at ``fill``."""
    out = {}
    for dev, g in labelled_runs(table_at(table, fill), by_preset=True):
        g = g.assign(cell=[cell_name(a, b) for a, b in zip(g.design, g.norm)])
        parts = {}
        for budget, b in g.groupby("budget"):
            b = b.set_index("cell")
            parts[f"{budget} tok: us"] = b.staging_us
            if not str(b.device.iloc[0]).startswith("cpu"):     # a CPU has no byte floor to compare with
                parts[f"{budget} tok: x floor"] = b.ratio_to_floor
            parts[f"{budget} tok: MiB"] = b["bytes"] / 2**20
        t = pd.DataFrame(parts)
        last = [c for c in t.columns if c.endswith(": us")][-1]
        out[dev] = t.sort_values(last).reset_index(names="design / norm")
    return out


def findings(table: pd.DataFrame, fill: float = 0.75) -> str:
    """The finding per device: the cheapest correct design per budget and what the others cost."""
    w = wide(table)
    return per_run(w, lambda dev, g: _run_finding(dev, g, fill), by_preset=True)


def _run_finding(dev: str, g: pd.DataFrame, fill: float) -> str:
    at = g[np.isclose(g.fill, fill)]
    if at.empty:
        at = g[g.fill == g.fill.max()]
    ok = at[at.max_err_ulp <= 1]
    pct = int(round(at["fill"].iloc[0] * 100))
    text = (f"On {dev} ({pct}% valid rows; copy ceiling {g.copy_gbs.iloc[0]:.0f} GB/s measured in the run; "
            f"{len(ok)}/{len(at)} design outputs within 1 bf16 ulp of float64, checked before timing). "
            "Cheapest correct design per budget: ")
    best_per = []
    for budget, b in ok.groupby("budget"):
        r = b.sort_values("staging_us").iloc[0]
        best_per.append(f"{budget} tokens: {cell_name(r.design, r.norm)}, {fmt_us(r.staging_us)} "
                        f"({r.ratio_to_floor:.2f}x its byte floor, {fmt_bytes(r['bytes'])}, "
                        f"{r.share_of_replay:.2%} of the replay)")
    text += "; ".join(best_per) + "."
    top = ok[ok.budget == ok.budget.max()]
    best = top.sort_values("staging_us").iloc[0]

    def cost(mask, what):
        c = top[mask]
        if c.empty:
            return None
        r = c.sort_values("staging_us").iloc[0]
        return (f"{what} ({cell_name(r.design, r.norm)}) +{fmt_us(r.staging_us - best.staging_us)} and "
                f"+{fmt_bytes(r['bytes'] - best['bytes'])} per replay")
    costs = [cost(top.design == "uint8_buffer", "the engines' uint8 buffer over all rows"),
             cost(top.design == "bf16_buffer", "a bf16 buffer (cast every replay)"),
             cost(top.design == "fp32_buffer", "the legacy fp32 buffer"),
             cost(top.norm == "eager", "an eager fp32 norm")]
    costs = [c for c in costs if c]
    if costs:
        text += (f" Against it at {int(best.budget)} tokens (one image per replay): " + "; ".join(costs) + ".")
    if "replay_floor_us" in g:
        r = top.sort_values("staging_us").iloc[0]
        text += (f" The tower replay itself ({fmt_us(r.replay_us)} at {int(r.budget)} tokens) runs at "
                 f"{r.replay_us / r.replay_floor_us:.1f}x its FLOP floor ({g.matmul_tflops.iloc[0]:.3g} "
                 "TFLOP/s measured), so the input's share would grow by that factor in a tower at its floor.")
    if "launch_us" in g:
        text += (f" One tiny kernel replayed alone takes {fmt_us(g.launch_us.iloc[0])} here: the smallest "
                 "budgets are bound by that latency, not by bytes.")
    if str(dev).startswith("cpu"):
        text += (" CPU times are host times on cache-resident data: a smoke test of the wiring, not of "
                 "bandwidth (ratios below 1x the DRAM floor are the caches).")
    return text


def footprint(p, device: str) -> Footprint:
    """The largest budget: its source rows, their float64 reference, the eager norm's fp32
    temporaries, a bf16 buffer and output; and the tower replayed over the full budget."""
    return largest(largest_budget(resolve_config(preset, p["depth"]), p, 1 + 8 + 8 + 2 + 2, device, preset)
                   for preset in p["presets"])

STUDY = register(Study(
    name="cast_cost",
    order=2,
    notebook="notebooks/cast_cost.ipynb",
    run=run,
    cells="presets",
    per_preset=True,
    findings=findings,
    figures=(("cast_cost", plot_staging, "Staging time per replay of each input design (copy + norm) per budget, "
              "beside its byte floor (GPU runs; a CPU run is a stamped smoke test without floors)"),
             ("cast_cost_fill", plot_fill, "Staging time against the share of valid rows at one budget: which designs "
              "pay for padding")),
    key_numbers=key_numbers,
    key_caption="Staging per replay at 75% valid rows on {device} (copy + norm in one graph, p50; x floor = time / "
                "(bytes moved / copy ceiling))",
    params=PARAMS,
    footprint=footprint,
    question="per-replay input staging cost for each graph buffer dtype vs the byte floor and vs the tower's "
             "own time",
))
