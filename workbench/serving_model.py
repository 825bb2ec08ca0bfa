"""A discrete-event model of one serving encoder under load, built from measured stage costs.

The model: requests, one image each, arrive as a Poisson process at ``rate`` images/s and pass,
in order, through three stations:

1. host preprocessing: ``workers`` parallel servers fed by one FIFO queue;
2. the host-to-device link: one FIFO server copying each image's payload;
3. the GPU: whenever it is free and images are waiting (their copy finished), it takes up to
   ``max_items`` of them, oldest first, as one batch taking ``sum of device_ms over the k images +
   encoder_ms(k)``; an image's time to embedding is its batch's finish time minus its arrival.

Assumptions: one image per request; FIFO everywhere; the GPU batches what is waiting and never
waits for a batch to fill; nothing is preempted; the stations work concurrently (a copy does not
hold a host worker, and copies overlap the GPU's compute, as on a separate stream); service times
are independent draws (`Stage`: fixed, resampled from measured samples, or exponential).

Method: the system is a feed-forward tandem of FIFO queues, so no event heap over the whole
system is needed (nor simpy, which is not installed): each station is an exact recursion over its
arrivals in order. A c-server FIFO queue is the Kiefer-Wolfowitz recursion, departure_i =
max(arrival_i, earliest free server) + service_i, with the servers' free times in a heap (c = 1
is Lindley's recursion); a station's departures, sorted, are the next one's arrivals; the
batching GPU is its own loop over batches. The results are validated (tests/test_serving_model.py)
against closed-form queueing results: the M/M/1 sojourn time (exponential with rate mu - lambda)
and the Erlang-C mean wait of M/M/c.
"""
from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

MAX_REQUESTS = 1_000_000     # requests of one simulate() call
MAX_WORKERS = 1024           # host preprocessing workers
MAX_ITEMS = 1 << 16          # images of one GPU batch (the length of an encoder_ms table)
GROWTH_LIMIT = 0.01          # latency rising faster than 1% of elapsed time: the queue is growing
DEFAULT_REQUESTS = 50_000
DEFAULT_LOADS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)   # latency_curve, x max_images_per_s
_CHUNK = 4096                # draws per refill of a random encoder time


def _real(value) -> float:
    """value as a float; nan for anything that is not a real number (a string, a bool, None)."""
    try:
        return math.nan if isinstance(value, (str, bytes, bool)) else float(value)
    except (TypeError, ValueError):
        return math.nan


def _ms(name: str, value) -> float:
    v = _real(value)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a service time in ms, a finite number >= 0, got {value!r}")
    return v


def _rate(value) -> float:
    v = _real(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"rate must be a positive finite number of images/s, got {value!r}")
    return v


def _integer(name: str, value, lo: int, hi: int, why: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}]{why}, got {value!r}")
    return int(value)


@dataclass(frozen=True, eq=False)
class Stage:
    """The service time of one item at one stage, in ms. Make one with `fixed`, `samples` (a
    measured distribution, drawn with replacement) or `exponential` (for tests and queueing theory)."""

    kind: str                 # "fixed" | "samples" | "exponential"
    mean_ms: float            # the fixed value, the exponential's mean, the samples' mean
    values: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.kind not in ("fixed", "samples", "exponential") or (self.kind == "samples") != (self.values is not None):
            raise ValueError(f"Stage kind must be 'fixed', 'exponential' or 'samples' (with values), got {self.kind!r}")
        _ms("mean_ms", self.mean_ms)

    @classmethod
    def fixed(cls, ms: float, name: str = "ms") -> Stage:
        return cls("fixed", _ms(name, ms))

    @classmethod
    def exponential(cls, mean_ms: float, name: str = "mean_ms") -> Stage:
        return cls("exponential", _ms(name, mean_ms))

    @classmethod
    def samples(cls, values: Sequence[float], name: str = "samples") -> Stage:
        try:
            arr = np.array(values, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a sequence of ms samples, got {values!r}") from None
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-D sequence of ms samples, got {values!r}")
        bad = arr[~(np.isfinite(arr) & (arr >= 0))]
        if bad.size:
            raise ValueError(f"{name}: every sample must be a service time in ms, a finite number >= 0, got {float(bad[0])!r}")
        arr.setflags(write=False)
        return cls("samples", float(arr.mean()), arr)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n independent service times (ms)."""
        if self.kind == "fixed":
            return np.full(n, self.mean_ms)
        if self.kind == "exponential":
            return rng.exponential(self.mean_ms, n)
        return self.values[rng.integers(0, self.values.size, n)]

    def stream(self, rng: np.random.Generator) -> Iterator[float]:
        """Service times one at a time (drawn in chunks), for the GPU's per-batch encoder times."""
        if self.kind == "fixed":
            return itertools.repeat(self.mean_ms)
        return (t for _ in itertools.count() for t in self.draw(rng, _CHUNK).tolist())


StageLike = Stage | float | Sequence[float]


def _stage(name: str, value: StageLike) -> Stage:
    """A Stage as is, a number as fixed, a sequence (or 1-D array) as measured samples."""
    if isinstance(value, Stage):
        return value
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)) and np.ndim(value) > 0:
        return Stage.samples(value, name)
    return Stage.fixed(value, name)


@dataclass(frozen=True)
class StageCosts:
    """The measured costs of one image's path. host_ms, h2d_ms, device_ms (per image): a `Stage`, a
    number (fixed) or a sequence of measured samples. encoder_ms (per batch): a table, one entry per
    batch size k = 1..max_items at index k-1, each a number or a `Stage`; or one number or Stage
    meaning the same time for every batch size. max_items defaults to the table's length (1 for a
    scalar). Everything is checked, and coerced to Stages, here."""

    host_ms: StageLike
    h2d_ms: StageLike
    device_ms: StageLike
    encoder_ms: StageLike | Sequence[float | Stage]
    workers: int = 1
    max_items: int | None = None

    def __post_init__(self):
        _integer("workers", self.workers, 1, MAX_WORKERS)
        for name in ("host_ms", "h2d_ms", "device_ms"):
            object.__setattr__(self, name, _stage(name, getattr(self, name)))
        enc, m = self.encoder_ms, self.max_items
        if m is not None:
            m = _integer("max_items", m, 1, MAX_ITEMS, " (MAX_ITEMS)")
        if isinstance(enc, Stage) or not isinstance(enc, (Sequence, np.ndarray)) or isinstance(enc, (str, bytes)):
            table = (_stage("encoder_ms", enc),) * (m or 1)
        else:
            n = len(enc)
            if n == 0 or n > MAX_ITEMS or (m is not None and n != m):
                raise ValueError(f"encoder_ms has {n} entries, it needs one per batch size 1..max_items "
                                 f"(max_items = {m if m is not None else 'its length'}, between 1 and {MAX_ITEMS})")
            table = tuple(_stage(f"encoder_ms[{i}]", e) for i, e in enumerate(enc))
        object.__setattr__(self, "encoder_ms", table)
        object.__setattr__(self, "max_items", len(table))


def capacities(costs: StageCosts) -> dict[str, float]:
    """Each station's saturation throughput in images/s (inf for a stage that costs nothing):
    host workers / host mean, 1 / h2d mean, and the GPU's best k / (device mean * k + encoder mean(k))."""
    def per_s(items, ms):
        return math.inf if ms <= 0 else 1000.0 * items / ms
    dev = costs.device_ms.mean_ms
    return {"host": per_s(costs.workers, costs.host_ms.mean_ms), "h2d": per_s(1, costs.h2d_ms.mean_ms),
            "gpu": max(per_s(k, dev * k + e.mean_ms) for k, e in enumerate(costs.encoder_ms, 1))}


def max_images_per_s(costs: StageCosts) -> float:
    """The highest sustainable arrival rate: the saturation throughput of the tandem, the bottleneck
    min(workers / host_mean, 1 / h2d_mean, max_k k / (device_mean*k + encoder_mean(k))), images/s.
    The GPU term is an upper bound; the greedy policy reaches it when k / time(k) is largest at
    k = max_items (a measured table normally is); `SimResult.stable` shows the rest."""
    return min(capacities(costs).values())


@dataclass(frozen=True, eq=False)
class SimResult:
    """One run. latencies_ms and arrivals_ms are the measured requests' (after the warm-up), in
    arrival order. throughput: their completions per second over their completion window.
    utilization: each station's busy fraction from t = 0 to the last completion. offered_load:
    rate / max_images_per_s. growth: how fast latency rises with arrival time (ms per ms, last
    quarter vs second quarter). stable: offered_load < 1 and growth <= GROWTH_LIMIT."""

    rate: float
    latencies_ms: np.ndarray
    arrivals_ms: np.ndarray
    p50_ms: float
    p99_ms: float
    mean_ms: float
    throughput: float
    utilization: dict[str, float]
    batch_sizes: np.ndarray
    offered_load: float
    growth: float
    stable: bool


def _fifo(arrivals: list[float], service: list[float], servers: int) -> list[float]:
    """Departure times of a FIFO queue with parallel servers (arrivals sorted): Kiefer-Wolfowitz."""
    free, out = [0.0] * servers, []
    for a, s in zip(arrivals, service):
        f = free[0]
        d = (a if a > f else f) + s
        heapq.heapreplace(free, d)
        out.append(d)
    return out


def _gpu(ready: list[float], costs: StageCosts, rng: np.random.Generator):
    """Finish times of the batching GPU (ready sorted), the batch sizes and the busy time."""
    n, m = len(ready), costs.max_items
    if m == 1:                                                   # no batching: one FIFO server
        t = costs.device_ms.draw(rng, n) + costs.encoder_ms[0].draw(rng, n)
        return _fifo(ready, t.tolist(), 1), [1] * n, float(t.sum())
    streams = [e.stream(rng) for e in costs.encoder_ms]
    fixed_dev = costs.device_ms.mean_ms if costs.device_ms.kind == "fixed" else None
    dev = None if fixed_dev is not None else costs.device_ms.draw(rng, n).tolist()
    finish, sizes, free, busy, i = [0.0] * n, [], 0.0, 0.0, 0
    while i < n:
        r = ready[i]
        start = r if r > free else free
        j = bisect_right(ready, start, i + 1, min(i + m, n))     # everything waiting, up to max_items
        k = j - i
        t = (fixed_dev * k if dev is None else sum(dev[i:j])) + next(streams[k - 1])
        free, busy = start + t, busy + t
        finish[i:j] = [free] * k
        sizes.append(k)
        i = j
    return finish, sizes, busy


def simulate(costs: StageCosts, rate: float, n_requests: int = DEFAULT_REQUESTS, seed: int = 0,
             warmup: int | None = None) -> SimResult:
    """Serve n_requests Poisson arrivals at `rate` images/s; the first `warmup` (default a tenth)
    are simulated but not measured. Same seed, same result."""
    if not isinstance(costs, StageCosts):
        raise TypeError(f"costs must be a StageCosts, got {type(costs).__name__}")
    rate = _rate(rate)
    n = _integer("n_requests", n_requests, 1, MAX_REQUESTS, f" (MAX_REQUESTS = {MAX_REQUESTS})")
    w = n // 10 if warmup is None else _integer("warmup", warmup, 0, n - 1, f" (below n_requests = {n})")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1000.0 / rate, n))
    host = costs.host_ms.draw(rng, n)
    host_done = np.array(_fifo(arrivals.tolist(), host.tolist(), costs.workers))
    order = np.argsort(host_done, kind="stable")                 # the link serves in order of host completion
    link = costs.h2d_ms.draw(rng, n)
    finish, sizes, gpu_busy = _gpu(_fifo(host_done[order].tolist(), link.tolist(), 1), costs, rng)
    done = np.empty(n)
    done[order] = finish
    lat, arr, fin = (done - arrivals)[w:], arrivals[w:], done[w:]
    span = float(fin.max() - fin.min())
    horizon = float(done.max()) or 1.0
    q = lat.size // 4
    growth = math.nan
    if q:
        dt = arr[-q:].mean() - arr[q:2 * q].mean()
        growth = float((lat[-q:].mean() - lat[q:2 * q].mean()) / dt) if dt > 0 else math.nan
    load = rate / max_images_per_s(costs)
    p50, p99 = np.percentile(lat, [50, 99])
    return SimResult(
        rate=rate, latencies_ms=lat, arrivals_ms=arr, p50_ms=float(p50), p99_ms=float(p99),
        mean_ms=float(lat.mean()), throughput=1000.0 * (lat.size - 1) / span if span > 0 else math.nan,
        utilization={"host": float(host.sum()) / (costs.workers * horizon), "h2d": float(link.sum()) / horizon,
                     "gpu": gpu_busy / horizon},
        batch_sizes=np.array(sizes), offered_load=load, growth=growth,
        stable=bool(load < 1 and not growth > GROWTH_LIMIT))


def latency_curve(costs: StageCosts, rates: Sequence[float] | None = None, n_requests: int = DEFAULT_REQUESTS,
                  seed: int = 0) -> list[dict]:
    """Latency against arrival rate: one row per rate (default DEFAULT_LOADS x max_images_per_s) with
    rate, load (x max_images_per_s), p50_ms, p99_ms, mean_ms, throughput and stable. Every rate uses
    the same seed, so the arrivals are one draw rescaled (common random numbers: smooth curves)."""
    cap = max_images_per_s(costs)
    if rates is None:
        if not math.isfinite(cap):
            raise ValueError("every stage costs 0 ms, so max_images_per_s is inf and there are no default rates: pass rates")
        rates = [f * cap for f in DEFAULT_LOADS]
    rates = [_rate(r) for r in rates]
    _integer("n_requests", n_requests, 1, MAX_REQUESTS, f" (MAX_REQUESTS = {MAX_REQUESTS})")
    rows = []
    for r in rates:
        res = simulate(costs, r, n_requests, seed)
        rows.append({"rate": r, "load": r / cap, "p50_ms": res.p50_ms, "p99_ms": res.p99_ms, "mean_ms": res.mean_ms,
                     "throughput": res.throughput, "stable": res.stable})
    return rows
