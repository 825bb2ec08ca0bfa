"""The contention study's figures, key numbers and findings, from its tables (never runs a model)."""
from __future__ import annotations

import pandas as pd

from .. import Summarizer
from ..plotting import is_cpu, labelled_runs, legend_below, panel_grid, per_run, run_label, stamp_cpu
from ...contention_model import PLACEMENTS
from ...results.tables import wide

SIDES = (("encoder_slowdown", "encoder", "-o"), ("preprocess_slowdown", "preprocessor", "--s"))


def _part(table: pd.DataFrame, part: str) -> pd.DataFrame:
    w = wide(table)
    return w[w.part == part] if "part" in w else w.iloc[:0]


def decoding(table: pd.DataFrame) -> pd.DataFrame:
    """The decode rows, one per (run, device, preset, mix, encoding, decoder, threads), with the columns that
    hold a value."""
    w = _part(table, "decode")
    drop = [c for c in ("study", "part", "path", "beside", "duty", "placement", "images") if c in w]
    return w.drop(columns=drop).dropna(axis=1, how="all").reset_index(drop=True)


def slowdowns(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, device, preset, mix, path, beside, duty): each side's time alone and contended
    (ms per call) and the slowdown."""
    w = _part(table, "interference")
    if w.empty or "encoder_slowdown" not in w:
        return pd.DataFrame()
    keys = [c for c in ("run", "reference", "device", "preset", "mix", "path", "beside", "duty") if c in w]
    d = w[w.encoder_slowdown.notna()]
    cols = ["encoder_ms_contended", "preprocess_ms_contended", "encoder_slowdown", "preprocess_slowdown",
            "duty_measured", "gpu_util", "gpu_mem_bytes"]
    return d[keys + [c for c in cols if c in d]].sort_values(keys).reset_index(drop=True)


def serving_best(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, device, preset, mix, path, placement): the highest rate meeting the p99 target at
    the most host threads the run modelled, the host cores and GPU share there, and its winning span."""
    w = _part(table, "serving")
    if w.empty or "max_images_per_s_at_slo" not in w:
        return pd.DataFrame()
    d = w[w.max_images_per_s_at_slo.notna()]
    keys = [c for c in ("run", "reference", "device", "preset", "mix", "path") if c in d]
    d = d.sort_values("threads").groupby(keys + ["placement"], sort=False).tail(1)
    d = d.assign(order=d.placement.map({p: i for i, p in enumerate(PLACEMENTS)})).sort_values(keys + ["order"])
    cols = ["threads", "slo_ms", "max_images_per_s_at_slo", "host_cores", "gpu_share", "wins_from_rate",
            "wins_to_rate", "modelled"]
    return d[keys + ["placement"] + [c for c in cols if c in d]].reset_index(drop=True)


def plot_slowdown(g: pd.DataFrame):
    """Slowdown of each side against the preprocessor's duty cycle, per mix and encoder path: the
    encoder (solid) and the preprocessor (dashed), same process and another process."""
    d = slowdowns(g)
    if d.empty:
        return None
    panels = list(d.groupby(["mix", "path"], sort=False))
    fig, axes = panel_grid(len(panels), 2, 5.6)
    colors = {"same_process": "C0", "other_process": "C3"}
    for ax, ((mix, path), p) in zip(axes.flat, panels):
        for beside, b in p.groupby("beside", sort=False):
            b = b.sort_values("duty")
            for col, side, style in SIDES:
                ax.plot(b.duty, b[col], style, ms=4, color=colors.get(beside, "k"), label=f"{side}, {beside}")
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("preprocessor duty cycle (fraction of time busy)")
        ax.set_ylabel("time contended / alone")
        ax.set_title(f"{mix}, encoder {path}", fontsize=9)
        if is_cpu(g):
            stamp_cpu(ax)
    fig.suptitle(f"What each side takes from the other ({run_label(g)})", fontsize=10)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels(), ncol=4)
    return fig


def plot_serving(g: pd.DataFrame):
    """Images per second served within the p99 target against arrival rate, per placement (host placements
    at the most threads the run modelled), per mix; the encoder on graphs where the run has them."""
    w = _part(g, "serving")
    if w.empty or "images_per_s_at_slo" not in w:
        return None
    w = w[w.images_per_s_at_slo.notna()]
    path = "cudagraph" if "cudagraph" in set(w.path) else w.path.iloc[0]
    w = w[w.path == path]
    most = w.threads.max()
    w = w[(w.threads == most) | ~w.placement.isin(("cpu_processor", "device_norm"))]
    panels = list(w.groupby("mix", sort=False))
    fig, axes = panel_grid(len(panels), 2, 5.6)
    for ax, (mix, d) in zip(axes.flat, panels):
        for i, pl in enumerate(p for p in PLACEMENTS if p in set(d.placement)):
            c = d[d.placement == pl].sort_values("rate")
            label = f"{pl}{' (modelled)' if pl == 'epd_second_gpu' else ''}"
            ax.plot(c.rate, c.images_per_s_at_slo, marker="o", ms=3, color=f"C{i}", label=label,
                    ls=":" if pl == "epd_second_gpu" else "-")
        top = d.rate.max()
        ax.plot([0, top], [0, top], color="0.7", lw=0.8, label="all served")
        ax.set_xlabel("arrival rate (images/s)")
        ax.set_ylabel("images/s within the p99 target")
        slo = d.slo_ms.dropna()
        ax.set_title(f"{mix}, encoder {path}, p99 target {slo.iloc[0]:.3g} ms, host threads {int(most)}"
                     if len(slo) else f"{mix}, encoder {path}", fontsize=9)
        if is_cpu(g):
            stamp_cpu(ax)
    fig.suptitle(f"The serving answer with interference in it ({run_label(g)})", fontsize=10)
    fig.tight_layout()
    legend_below(fig, *axes.flat[0].get_legend_handles_labels(), ncol=5)
    return fig


def key_numbers(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per run and preset: per (mix, path, placement) the highest rate at the p99 target, the host cores and
    GPU share it takes there, and the encoder's slowdown beside a preprocessor busy all the time."""
    out = {}
    best = serving_best(table)
    slow = slowdowns(table)
    if best.empty:
        return out
    for dev, g in labelled_runs(best, by_preset=True):
        t = g[[c for c in ("mix", "path", "placement", "max_images_per_s_at_slo", "host_cores", "gpu_share",
                           "wins_from_rate", "wins_to_rate") if c in g]]
        if not slow.empty:
            s = slow[slow.device.isin(set(g.device)) & slow.preset.isin(set(g.preset))]
            s = s[s.duty == s.duty.max()].pivot_table(index=["mix", "path"], columns="beside",
                                                        values="encoder_slowdown").add_prefix("encoder x, ")
            t = t.merge(s.reset_index(), on=["mix", "path"], how="left")
        out[dev] = t.reset_index(drop=True)
    return out


def findings(table: pd.DataFrame) -> str:
    """Per run and preset: the encoder's slowdown at the highest duty, and which placement serves the most."""
    best = serving_best(table)
    if best.empty:
        return "No serving rows: nothing to conclude."
    slow = slowdowns(table)
    return per_run(best.merge(slow, on=[c for c in ("run", "reference", "device", "preset", "mix", "path")
                                        if c in best and c in slow], how="left")
                   if not slow.empty else best, _run_finding, by_preset=True)


def _run_finding(dev: str, g: pd.DataFrame) -> str:
    lines = []
    for (mix, path), d in g.groupby(["mix", "path"], sort=False):
        top = d.sort_values("max_images_per_s_at_slo", ascending=False).drop_duplicates("placement")
        win = top.iloc[0]
        line = (f"{mix}, encoder {path}: {win.placement} serves the most within the p99 target "
                f"({win.max_images_per_s_at_slo:.3g} images/s")
        if "encoder_slowdown" in d and d.encoder_slowdown.notna().any():
            hi = d[d.duty == d.duty.max()]
            worst = hi.sort_values("encoder_slowdown").iloc[-1]
            line += (f"); a preprocessor beside it at duty {worst.duty:g} ({worst.beside}) slows the encoder "
                     f"x{worst.encoder_slowdown:.2f}.")
        else:
            line += ")."
        lines.append(line)
    if is_cpu(g):
        lines.append("CPU run: threads stand in for streams, a smoke test of the harness.")
    return f"On {dev}: " + " ".join(lines)


# (stem, plot, caption): a new figure is one function above and one line here
FIGURES = (("contention_slowdown", plot_slowdown, "Encoder and preprocessor time contended / alone against the "
            "preprocessor's duty cycle, in the same process (a stream of its own) and in another process"),
           ("contention_serving", plot_serving, "Images per second within the p99 target against arrival rate, "
            "per placement, modelled from the stage costs and slowdowns measured in the run"))

summarize = Summarizer(findings=findings, figures=FIGURES, key_numbers=key_numbers,
                       key_caption="On {device}: per placement the highest arrival rate meeting the p99 target "
                                   "(images/s), the host cores and GPU share it takes there, the rates where it "
                                   "wins, and the encoder's slowdown beside a preprocessor at the highest duty",
                       per_preset=True)
