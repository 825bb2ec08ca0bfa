"""Where to preprocess, with interference in the answer: four placements of the preprocessing of one
serving encoder, composed from measured stage costs with `workbench.serving_model`.

- ``cpu_processor``: the host decodes, resizes, patchifies and normalizes (``threads`` host workers),
  float32 rows cross the link;
- ``device_norm``: the host decodes, resizes and patchifies into uint8 rows, which cross the link;
  the norm runs on the device (inside the encoder's time);
- ``gpu_preprocess``: the request's file crosses the link (its encoded bytes where the GPU decodes
  it, else the host decodes inside the preprocessor's measured time) and the whole preprocessing runs
  on the serving GPU beside the encoder; both slow each other down by the factors measured at the
  preprocessor's duty cycle, which is the arrival rate times its time per image;
- ``epd_second_gpu``: the same preprocessing on a second GPU (encode-prefill-decode disaggregation),
  without contention on the encoder, and uint8 rows sent to the serving GPU, *modelled*: the
  transfer at the measured host-to-device rate of those bytes (an upper bound where the GPUs share
  NVLink); rows of it carry ``modelled=True``.

The serving model's three stations become, per placement: the first station (host workers, or the
preprocessor as one server), the link, the batching GPU. For the GPU preprocessors the first station
runs before the link in the model and after it in reality: a tandem of FIFO queues keeps its total
service time in either order, and the link is the smallest stage.

`at_slo` gives, per placement and arrival rate, p99 time to embedding and the images per second served
within a p99 target (`images_per_s_at_slo`: the throughput where p99 meets it and the queue is stable,
else 0); `max_rate_at_slo` the highest arrival rate that meets it (bisection); `winners` the placement
with the lowest p99 among those that meet it at each rate, and `crossings` the rates where that changes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .serving_model import StageCosts, simulate

PLACEMENTS = ("cpu_processor", "device_norm", "gpu_preprocess", "epd_second_gpu")
MODELLED = ("epd_second_gpu",)
HOST_PLACEMENTS = ("cpu_processor", "device_norm")     # the host preprocesses: its workers matter
BISECTION_STEPS = 10


@dataclass(frozen=True)
class Stages:
    """Measured per-image costs of one (preset, mix, encoder path), in ms.

    decode_ms: the host's decode of one file (one thread); rows_fp32_ms, rows_uint8_ms: the host's
    resize + patchify (+ normalize) of one decoded image (one thread); link_ms: host-to-device time of
    one image's payload by name ("fp32_rows", "uint8_rows", "encoded"); preprocess_ms: the GPU
    preprocessor's time per image alone; gpu_decode: whether it decodes on the GPU; encoder_ms: the
    encoder alone per batch of k = 1..max images (index k - 1); slowdown: {duty: (preprocessor,
    encoder)} factors measured with the preprocessor at that duty cycle beside the encoder."""

    decode_ms: float
    rows_fp32_ms: float
    rows_uint8_ms: float
    link_ms: dict
    preprocess_ms: float
    gpu_decode: bool
    encoder_ms: tuple
    slowdown: dict

    def __post_init__(self):
        for d in self.slowdown:
            if not 0 < d <= 1:
                raise ValueError(f"slowdown measured at duty cycle {d!r}: outside (0, 1]")
        if not self.encoder_ms:
            raise ValueError("encoder_ms needs at least one batch size")


def slowdown_at(stages: Stages, duty: float) -> tuple[float, float]:
    """(preprocessor, encoder) slowdown factors at ``duty``: linear between the measured duty cycles,
    1 at duty 0 (nothing beside), the largest measured one held above it (a preprocessor past its own
    highest rate is busy all the time)."""
    pts = sorted(stages.slowdown.items())
    if not pts:
        return 1.0, 1.0
    duty = min(max(duty, 0.0), 1.0)
    prev_d, prev = 0.0, (1.0, 1.0)
    for d, s in pts:
        if duty <= d:
            f = (duty - prev_d) / (d - prev_d)
            return tuple(a + f * (b - a) for a, b in zip(prev, s))
        prev_d, prev = d, s
    return prev


def duty_at(stages: Stages, rate: float) -> float:
    """The GPU preprocessor's duty cycle at ``rate`` images/s: the fraction of time its work alone takes."""
    return min(1.0, rate * stages.preprocess_ms / 1e3)


def costs(stages: Stages, placement: str, rate: float, threads: int = 1) -> StageCosts:
    """The serving model's stage costs of ``placement`` at arrival ``rate`` (images/s; it sets the GPU
    preprocessor's duty cycle and so its contention) with ``threads`` host workers (host placements)."""
    enc = list(stages.encoder_ms)
    if placement in HOST_PLACEMENTS:
        fp32 = placement == "cpu_processor"
        host = stages.decode_ms + (stages.rows_fp32_ms if fp32 else stages.rows_uint8_ms)
        return StageCosts(host_ms=host, h2d_ms=stages.link_ms["fp32_rows" if fp32 else "uint8_rows"],
                          device_ms=0.0, encoder_ms=enc, workers=threads)
    link = stages.link_ms["encoded"] if stages.gpu_decode else 0.0
    if placement == "gpu_preprocess":
        pre, slow = slowdown_at(stages, duty_at(stages, rate))
        return StageCosts(host_ms=stages.preprocess_ms * pre, h2d_ms=link, device_ms=0.0,
                          encoder_ms=[e * slow for e in enc])
    if placement == "epd_second_gpu":
        return StageCosts(host_ms=stages.preprocess_ms + link, h2d_ms=stages.link_ms["uint8_rows"], device_ms=0.0,
                          encoder_ms=enc)
    raise ValueError(f"unknown placement {placement!r}; valid: {', '.join(PLACEMENTS)}")


def check_rates(rates: Sequence[float]) -> list[float]:
    """Arrival rates: positive finite numbers of images/s."""
    out = []
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (math.isfinite(r) and r > 0):
            raise ValueError(f"arrival rate {r!r} is not a positive number of images/s; valid: rates > 0")
        out.append(float(r))
    return out


def check_slo(slo_ms: float, stages: Stages, what: str = "") -> float:
    """``slo_ms`` if one image's encoder time alone is below it; else ValueError: no placement can meet it."""
    own = stages.encoder_ms[0]
    if not (isinstance(slo_ms, (int, float)) and math.isfinite(slo_ms) and slo_ms > own):
        raise ValueError(f"slo_ms={slo_ms!r}{what} is not above the encoder's own time for one image, {own:.4g} ms: "
                         f"no placement can meet it; valid: slo_ms > {own:.4g}, or None (a multiple of the "
                         f"encoder's batch time)")
    return float(slo_ms)


def served(stages: Stages, placement: str, rate: float, slo_ms: float, threads: int = 1, n_requests: int = 20000,
           seed: int = 0) -> dict:
    """One simulated arrival rate: p99_ms, stable, throughput and images_per_s_at_slo."""
    res = simulate(costs(stages, placement, rate, threads), rate, n_requests, seed)
    ok = res.stable and res.p99_ms <= slo_ms
    return dict(p99_ms=res.p99_ms, stable=res.stable, meets_slo=ok,
                images_per_s_at_slo=res.throughput if ok and math.isfinite(res.throughput) else 0.0)


def at_slo(stages: Stages, rates: Sequence[float], slo_ms: float, threads: int = 1, n_requests: int = 20000,
           seed: int = 0, placements: Sequence[str] = PLACEMENTS) -> list[dict]:
    """One row per (placement, rate): placement, rate, p99_ms, stable, meets_slo, images_per_s_at_slo."""
    check_slo(slo_ms, stages)
    return [dict(placement=p, rate=r, **served(stages, p, r, slo_ms, threads, n_requests, seed))
            for p in placements for r in check_rates(rates)]


def max_rate_at_slo(stages: Stages, placement: str, slo_ms: float, hi: float, threads: int = 1,
                    n_requests: int = 20000, seed: int = 0) -> float:
    """The highest arrival rate (images/s) at which ``placement`` meets the p99 target, searched in (0, hi]
    by bisection (0 where even hi / 2**steps misses it)."""
    lo, top = 0.0, hi
    if served(stages, placement, top, slo_ms, threads, n_requests, seed)["meets_slo"]:
        return top
    for _ in range(BISECTION_STEPS):
        mid = (lo + top) / 2
        if served(stages, placement, mid, slo_ms, threads, n_requests, seed)["meets_slo"]:
            lo = mid
        else:
            top = mid
    return lo


def winners(rows: Sequence[dict]) -> dict[float, str | None]:
    """{rate: the placement with the lowest p99 among those meeting the target there (None: none does)}."""
    out: dict[float, str | None] = {}
    for r in sorted({row["rate"] for row in rows}):
        ok = [row for row in rows if row["rate"] == r and row["meets_slo"]]
        out[r] = min(ok, key=lambda row: row["p99_ms"])["placement"] if ok else None
    return out


def crossings(win: dict[float, str | None]) -> list[dict]:
    """Where the winner changes between consecutive rates: from_placement, to_placement, rate (the midpoint
    of the two rates; a placement's last winning rate and the next are both in ``win``)."""
    rates = sorted(win)
    return [dict(from_placement=win[a] or "none", to_placement=win[b] or "none", rate=(a + b) / 2)
            for a, b in zip(rates, rates[1:]) if win[a] != win[b]]


def winning_span(win: dict[float, str | None], placement: str) -> tuple[float, float]:
    """(first, last) rate at which ``placement`` wins; (nan, nan) where it never does."""
    mine = [r for r, p in sorted(win.items()) if p == placement]
    return (mine[0], mine[-1]) if mine else (math.nan, math.nan)


def gpu_share(stages: Stages, placement: str, rate: float) -> float:
    """The fraction of the serving GPU's time the preprocessing takes at ``rate`` (0 for the host
    placements and for the second GPU's)."""
    if placement != "gpu_preprocess":
        return 0.0
    pre = slowdown_at(stages, duty_at(stages, rate))[0]
    return min(1.0, rate * stages.preprocess_ms * pre / 1e3)


def host_cores(stages: Stages, placement: str, rate: float) -> float:
    """Host cores busy at ``rate``: the host preprocessing's time per image times the rate for the host
    placements; the one thread that feeds a GPU preprocessor, plus its host decode where the GPU does not
    decode (inside its measured time: counted whole here, an upper bound)."""
    if placement in HOST_PLACEMENTS:
        rows = stages.rows_fp32_ms if placement == "cpu_processor" else stages.rows_uint8_ms
        return rate * (stages.decode_ms + rows) / 1e3
    return 1.0 if stages.gpu_decode else max(1.0, rate * stages.decode_ms / 1e3)
