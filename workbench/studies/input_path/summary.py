"""The input_path study's figures, key numbers and findings, from its tables (never runs a model)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import Summarizer
from ..plotting import is_cpu, labelled_runs, legend_below, panel_grid, per_run, run_label, stamp_cpu
from ...results.tables import wide
from .params import INPUT_PLACEMENTS, PAYLOADS

SEGMENTS = (("host_ms", "host preprocessing", "#90caf9"), ("h2d_ms", "host to device", "#ffcc80"),
            ("device_pre_ms", "device resize + patchify", "#a5d6a7"), ("norm_ms", "device norm (in the encoder)",
                                                                       "#ef9a9a"),
            ("encoder_rest_ms", "encoder", "#b39ddb"))


def _order(values) -> list[str]:
    return [p for p in INPUT_PLACEMENTS if p in set(values)] + sorted(set(values) - set(INPUT_PLACEMENTS))


def breakdown(table: pd.DataFrame, backend: str = "torchvision", threads: int = 1) -> pd.DataFrame:
    """One row per (run, device, preset, mix, placement, path): the request-to-embedding parts per
    image at one host (backend, threads; the device placement's host part is its decode) and the
    link the run had (pinned on a GPU), with the saving against the processor placement."""
    w = wide(table)
    if w.empty or "total_ms" not in w:
        return pd.DataFrame()
    keys = [c for c in ("run", "reference", "device", "family", "preset", "mix") if c in w]
    tot = w[w.total_ms.notna()]
    backends = set(tot.backend)
    # the host backend asked for, else any host one; a run of the GPU preprocessor alone has only "cuda"
    use = backend if backend in backends else min(backends - {"cuda"} or backends)
    tot = tot[((tot.backend == use) | (tot.placement == "device")) & (tot.threads == threads)]
    tot = tot[tot.pinned == ("pinned" if "pinned" in set(tot.pinned) else "pageable")]
    enc = w[w.encoder_ms.notna()][keys + ["placement", "path", "encoder_ms"]] if "encoder_ms" in w else None
    dev = w[w.device_ms.notna()] if "device_ms" in w else w.iloc[:0]
    pre = dev[dev.part == "resize_patchify"][keys + ["device_ms"]].rename(columns={"device_ms": "device_pre_ms"})
    nrm = dev[dev.part == "normalize"][keys + ["placement", "device_ms"]].rename(columns={"device_ms": "norm_ms"})
    out = tot[keys + ["placement", "path", "backend", "pinned", "host_ms", "h2d_ms", "total_ms"]]
    out = out.merge(enc, on=keys + ["placement", "path"], how="left").merge(nrm, on=keys + ["placement"], how="left")
    out = out.merge(pre, on=keys, how="left")
    out["norm_ms"] = out.norm_ms.fillna(0.0)
    out["device_pre_ms"] = np.where(out.placement == "device", out.device_pre_ms, 0.0)
    out["encoder_rest_ms"] = (out.encoder_ms - out.norm_ms).clip(lower=0)
    ref = out[out.placement == "processor"][keys + ["path", "total_ms"]].rename(columns={"total_ms": "processor_ms"})
    out = out.merge(ref, on=keys + ["path"], how="left")
    out["saves_ms"] = out.processor_ms - out.total_ms
    return out.drop(columns=["processor_ms"])


def _finish(fig, axes, title: str, ncol: int, fontsize: int):
    """The figure's title, layout and one legend below it (the first panel's entries)."""
    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels(), ncol=ncol)
    return fig


def plot_breakdown(g: pd.DataFrame):
    """The main figure: per mix and path, a stacked bar per placement: host preprocessing, host to
    device, device-side preprocessing, the device norm and the rest of the encoder, per image."""

    b = breakdown(g)
    if b.empty:
        return None
    panels = list(b.groupby(["mix", "path"], sort=False))
    fig, axes = panel_grid(len(panels), 2, 7.4)
    for ax, ((mix, path), d) in zip(axes.flat, panels):
        d = d.set_index("placement").loc[_order(d.placement)]
        y = np.arange(len(d))
        left = np.zeros(len(d))
        for col, name, color in SEGMENTS:
            v = d[col].fillna(0).to_numpy()
            ax.barh(y, v, left=left, color=color, label=name)
            left += v
        for yi, (t, s) in enumerate(zip(d.total_ms, d.saves_ms)):
            note = f"{t:.3g} ms" + (f" (saves {s:.3g})" if np.isfinite(s) and abs(s) > 0 else "")
            ax.text(left[yi] * 1.02, yi, note, va="center", fontsize=7)
        ax.set_yticks(y, d.index, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(right=left.max() * 1.45)
        ax.set_xlabel("ms per image, request to embedding")
        ax.set_title(f"{mix}, encoder {path}, host: {d.backend.iloc[0]} 1 thread, {d.pinned.iloc[0]} memory",
                     fontsize=9)
        if is_cpu(g):
            stamp_cpu(ax)
    return _finish(fig, axes, f"Input path per placement ({run_label(g)})", ncol=5, fontsize=11)


def plot_load(g: pd.DataFrame):
    """Time to embedding (p50 solid, p99 dashed) against arrival rate per placement, one panel per
    (mix, host workers), the encoder on graphs where the run has them."""

    w = wide(g)
    if "p99_ms" not in w:
        return None
    w = w[w.p99_ms.notna()]
    path = "cudagraph" if "cudagraph" in set(w.path) else w.path.iloc[0]
    w = w[w.path == path]
    panels = list(w.groupby(["mix", "workers"], sort=False))
    fig, axes = panel_grid(len(panels), 3, 5.2)
    colors = {p: f"C{i}" for i, p in enumerate(INPUT_PLACEMENTS)}
    for ax, ((mix, workers), d) in zip(axes.flat, panels):
        for pl in _order(d.placement):
            c = d[d.placement == pl].sort_values("rate")
            ax.plot(c.rate, c.p50_ms, "-o", ms=3, color=colors.get(pl, "k"), label=f"{pl} p50")
            ax.plot(c.rate, c.p99_ms, "--", color=colors.get(pl, "k"), label=f"{pl} p99")
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate (images/s)")
        ax.set_ylabel("time to embedding (ms, log)")
        ax.set_title(f"{mix}, {int(workers)} host worker{'s' if workers != 1 else ''}, encoder {path}", fontsize=9)
        if is_cpu(g):
            stamp_cpu(ax)
    labels = axes.flat[0].get_legend_handles_labels()[1]
    return _finish(fig, axes, f"At load: one serving encoder, modelled from the measured stages ({run_label(g)})",
                   ncol=min(6, len(labels)), fontsize=10)


def plot_link(g: pd.DataFrame):
    """Bytes and host-to-device time per image of each payload (pinned and pageable)."""
    import matplotlib.pyplot as plt

    w = wide(g)
    if "h2d_bytes" not in w:
        return None
    w = w[w.h2d_bytes.notna()]
    mixes = list(w.mix.unique())
    fig, axes = plt.subplots(1, len(mixes), figsize=(6.4 * len(mixes), 3.4), squeeze=False)
    for ax, mix in zip(axes.flat, mixes):
        d = w[w.mix == mix]
        order = [p for p in PAYLOADS if p in set(d.payload)]
        y = np.arange(len(order))
        for i, (pin, c) in enumerate(d.groupby("pinned")):
            c = c.set_index("payload").loc[order]
            ax.barh(y + 0.4 * i - 0.2, c.h2d_ms, height=0.38, label=f"{pin} memory")
        mib = d.groupby("payload").h2d_bytes.first() / 2**20      # the same bytes either way
        ax.set_yticks(y, [f"{p} ({mib[p]:.3g} MiB)" for p in order], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("host to device per image (ms)")
        ax.set_title(mix, fontsize=9)
        if is_cpu(g):
            stamp_cpu(ax)
    return _finish(fig, axes, f"What crosses the link per image ({run_label(g)})", ncol=2, fontsize=10)


def key_numbers(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per run: one row per (preset, mix, path, placement): ms per image of each part, the total,
    what it saves against the processor placement, and the highest sustainable rate at the most
    host workers the run modelled."""
    out = {}
    b = breakdown(table)
    if b.empty:
        return out
    w = wide(table)
    cap = w[w.max_images_per_s.notna()] if "max_images_per_s" in w else w.iloc[:0]
    for dev, g in labelled_runs(b, by_preset=True):
        keys = [c for c in ("preset", "mix", "path", "placement") if c in g]
        t = g[keys + ["host_ms", "h2d_ms", "device_pre_ms", "encoder_ms", "norm_ms", "total_ms", "saves_ms"]]
        if len(cap):
            c = cap[cap.device.isin(set(g.device)) & (cap.workers == cap.workers.max())]
            c = c[["preset", "mix", "path", "placement", "max_images_per_s"]].drop_duplicates(keys)
            t = t.merge(c, on=keys, how="left")
        out[dev] = t.reset_index(drop=True)
    return out


def findings(table: pd.DataFrame) -> str:
    """Per run: what moving the normalization off the host saves per image, and the fastest path."""
    return per_run(breakdown(table), _run_finding, by_preset=True)


def _run_finding(dev: str, g: pd.DataFrame) -> str:
    lines = []
    for (mix, path), d in g.groupby(["mix", "path"], sort=False):
        best = d.sort_values("total_ms").iloc[0]
        lines.append(f"{mix}, encoder {path}: fastest {best.placement}, {best.total_ms:.3g} ms per image"
                     + (f", {best.saves_ms:.3g} ms less than the CPU processor." if np.isfinite(best.saves_ms)
                        else "."))
    if is_cpu(g):
        lines.append("CPU run: the device side is emulated on the host, a smoke test.")
    return f"On {dev}: " + " ".join(lines)


# (stem, plot, caption): a new figure is one function above and one line here
FIGURES = (("input_path", plot_breakdown, "Request to embedding per image, by placement: host preprocessing, host to "
            "device, device preprocessing, the device norm and the encoder"),
           ("input_path_load", plot_load, "Time to embedding p50 / p99 against arrival rate, modelled from the "
            "stage costs measured in the run"),
           ("input_path_link", plot_link, "Bytes and host-to-device time per image of each payload"))

summarize = Summarizer(findings=findings, figures=FIGURES, key_numbers=key_numbers,
                       key_caption="Per image on {device}: host (torchvision backend, 1 thread), link, device "
                                   "preprocessing, encoder (its device norm shown apart), total, saving against "
                                   "the processor placement (ms), and the highest sustainable rate (images/s)",
                       per_preset=True)
