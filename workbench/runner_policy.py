"""The host side of the encoder graph runner (`workbench.runner`): its budget rules (the
default runner's, the engines') and checks, the per-replay records, the costs policy 'auto'
decides from (`PackCosts`), and the clock of `encode`'s phases."""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass

import torch

from . import limits
from .budgets import Budgets
from .caches import remember
from .preprocess import PatchBatch
from .timing import collector_paused
from .towers.metadata import filling_grid
from .vocabulary import PHASES  # noqa: F401  (the phases of one runner encode call)


@dataclass
class ReplayRecord:
    """One replay (or one eager miss) of `EncoderGraphRunner.encode`."""

    budget: int            # merged tokens of the replayed budget; 0 for an eager miss
    items: int             # items packed into it
    valid_rows: int        # pixel rows that were real
    padded_rows: int       # pixel rows that were padding
    miss: bool = False     # True: the item was larger than every budget and ran eagerly
    exact: bool = False    # True: the budget's exact-fit graph ran (one image filling it, dense attention)
    eager: bool = False    # True: policy 'auto' ran the pack eagerly (predicted faster than its replay)
    graph_ms: float = math.nan   # policy 'auto': the predicted replay time of the budget
    eager_ms: float = math.nan   # policy 'auto': the predicted eager time of the pack


@dataclass
class PackCosts:
    """What policy 'auto' decides from, measured by the runner on its device at construction:
    each budget's replay (its general graph, host wall time with the device synchronized, as
    an encode call sees it) and the eager encode of one image of a few sizes (at most
    `EAGER_SIZES` of the budgets, spread from the smallest to the largest), interpolated
    linearly in tokens between them, flat below the smallest and along the last segment above
    the largest. Construction time is bounded: (1 + `REPS`) replays per budget and (1 + `REPS`)
    eager calls per measured size, so at most about 4 x (4 x the largest budget's eager time +
    the sum of the replay times), which `seconds` records."""

    replay_ms: dict[int, float]
    eager_tokens: tuple[int, ...]
    eager_points_ms: tuple[float, ...]
    seconds: float = 0.0

    EAGER_SIZES = 4
    REPS = 3

    def eager_ms(self, tokens: int) -> float:
        xs, ys = self.eager_tokens, self.eager_points_ms
        if tokens <= xs[0] or len(xs) == 1:
            return ys[0] if tokens <= xs[0] else ys[-1] * tokens / xs[-1]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if tokens <= x1:
                return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
        return ys[-1] + (ys[-1] - ys[-2]) * (tokens - xs[-1]) / (xs[-1] - xs[-2])

    def prefer_eager(self, budget: int, tokens: int) -> bool:
        """Whether a pack of ``tokens`` merged tokens runs faster eagerly than in ``budget``'s graph."""
        return self.eager_ms(tokens) < self.replay_ms[budget]

    def eager_packs(self, batch: PatchBatch, packs, merge_unit: int) -> frozenset:
        """The packs (positions in ``packs``, (budget, items) pairs) predicted faster eagerly than replayed."""
        rows = batch.item_rows
        return frozenset(k for k, (budget, idx) in enumerate(packs)
                         if self.prefer_eager(budget, sum(rows[i] for i in idx) // merge_unit))

    @classmethod
    @torch.inference_mode()
    def measure(cls, runner: "EncoderGraphRunner") -> "PackCosts":
        from .timing import cpu_time_us

        t0 = time.perf_counter()
        enc, cfg = runner.encoder, runner.encoder.cfg
        replay = {}
        for b, cap in runner.graphs.items():
            replay[b] = cpu_time_us(lambda: runner.replay(cap), reps=cls.REPS, warmup=1)["p50_us"] / 1e3
        budgets = runner.budgets
        k = min(cls.EAGER_SIZES, len(budgets))
        picks = sorted({budgets[round(i * (len(budgets) - 1) / max(1, k - 1))] for i in range(k)})
        # what the runner's eager calls receive (placement device: normalized rows)
        dtype = torch.uint8 if enc.spec.runner_input == "uint8" else torch.float32
        points = []
        for tokens in picks:
            # one image filling `tokens` (zeros are in range for either input kind)
            batch = PatchBatch(torch.zeros(tokens * cfg.merge_unit, cfg.patch_dim, dtype=dtype, device=runner.device),
                               filling_grid(cfg, tokens))
            points.append(cpu_time_us(lambda: enc.encode_eager(batch), reps=cls.REPS, warmup=1)["p50_us"] / 1e3)
        return cls(replay, tuple(picks), tuple(points), time.perf_counter() - t0)


def check_costs(costs, budgets: list[int]) -> None:
    """TypeError/ValueError unless ``costs`` is a PackCosts measured over exactly ``budgets``."""
    if not isinstance(costs, PackCosts):
        raise TypeError(f"costs must be the PackCosts of another runner (runner.costs) or None, got {type(costs).__name__}")
    if sorted(costs.replay_ms) != list(budgets):
        raise ValueError(f"costs were measured over budgets {sorted(costs.replay_ms)}, this runner has {list(budgets)}; "
                         "pass costs only between runners of the same budgets (or None to measure them)")


# the signatures whose plans policy 'auto' has raced, kept per runner for later calls
CHOICE_CACHE = 256


def signature(batch: PatchBatch, packs, merge_unit: int) -> tuple:
    """What policy 'auto' keys what it learns by, so that it carries over to batches it has not seen: per pack its
    budget, its merged tokens to a quarter octave and its attention sequences (images, video frames) to an octave.
    A pack's replay time is its budget's, and its eager time moves little within a quarter octave of tokens and an
    octave of sequences; the exact grids rarely repeat in serving."""
    rows, frames = batch.item_rows, batch.grid_thw[:, 0].tolist()
    return tuple((budget, round(4 * math.log2(max(1, sum(rows[i] for i in idx) // merge_unit))),
                  int(sum(frames[i] for i in idx)).bit_length()) for budget, idx in packs)


@dataclass
class Race:
    """Policy 'auto''s record of one `signature` on CUDA: the candidate plans ("predicted", from the `PackCosts`
    prediction of each call; "replay", every pack replayed; "eager", every pack run eagerly), timed on real calls,
    one plan a call, then the fastest (by its best call) kept. Once each has run, a candidate whose best call is
    more than `DROP` times the fastest's runs no more; the others run `ROUNDS` calls each. Exploring costs no extra
    work: each call runs one plan, whose output is the call's; only the device is synchronized around it to time it.
    A new signature takes plan "replay"'s calls from one of the same budgets (`sibling`), so a stream of new
    shapes does not replay each one again to learn what the budgets' graphs cost; not where a pack fits its
    budget exactly (``exact``: equal sequences filling it, whose exact-fit graph runs faster than the budget's
    general one), on either side."""

    names: tuple[str, ...]                  # the candidates, the prediction's first
    seconds: dict[str, list[float]]         # each candidate's timed calls
    chosen: str | None = None
    exact: bool = False                     # a pack of its first batch replays an exact-fit graph

    ROUNDS = 3
    DROP = 1.25

    @classmethod
    def of(cls, predicted: frozenset, n_packs: int, replay: list[float] = (), exact: bool = False) -> "Race":
        """The race for a signature whose first batch the costs predict ``predicted`` for (``n_packs`` packs);
        ``replay``: the calls of plan "replay" already timed on another signature of the same budgets (`sibling`),
        which carry over: replaying runs the budgets' graphs whatever the tokens, so only the other plans are timed
        (and one of them alone, where "replay" is then more than `DROP` from it). ``exact``: a pack of the batch
        fits its budget exactly (then ``replay`` must be empty: its graph is not the one those calls timed)."""
        if exact and replay:
            raise ValueError("a race whose batch replays an exact-fit graph times plan 'replay' itself: "
                             "pass no sibling's calls")
        plain = cls.plain(n_packs)
        first = next((n for n, plan in plain.items() if plan == predicted), "predicted")
        names = (first, *(n for n in plain if n != first))
        return cls(names, {n: list(replay) if n == "replay" else [] for n in names}, exact=exact)

    @staticmethod
    def sibling(races: dict, sig: tuple) -> list[float]:
        """The most timed calls of plan "replay" among the races of signatures with ``sig``'s pack budgets whose
        batches replayed the budgets' general graphs (no exact fit)."""
        budgets = tuple(p[0] for p in sig)
        return max((r.seconds["replay"] for s, r in races.items()
                    if tuple(p[0] for p in s) == budgets and not r.exact), key=len, default=[])

    def live(self) -> tuple[str, ...]:
        """The candidates still raced: all until each has run once, then those within `DROP` of the fastest."""
        if not all(self.seconds.values()):
            return self.names
        best = min(min(v) for v in self.seconds.values())
        return tuple(n for n in self.names if min(self.seconds[n]) <= self.DROP * best)

    def next(self) -> str:
        """The candidate to time on this call: the least timed of those still raced, in order."""
        return min(self.live(), key=lambda n: len(self.seconds[n]))

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name].append(seconds)
        live = self.live()
        if len(live) == 1 or all(len(self.seconds[n]) >= self.ROUNDS for n in live):
            self.chosen = min(live, key=lambda n: min(self.seconds[n]))

    @staticmethod
    def plain(n_packs: int) -> dict[str, frozenset]:
        """The candidates that are not the prediction: the packs (positions) each runs eagerly."""
        return {"replay": frozenset(), "eager": frozenset(range(n_packs))}

    @classmethod
    def plan(cls, name: str, predicted: frozenset, n_packs: int) -> frozenset:
        """The packs (positions) candidate ``name`` runs eagerly in a batch of ``n_packs`` packs."""
        return cls.plain(n_packs).get(name, predicted)


def race_call(runner, batch: PatchBatch, packs, misses, costs: PackCosts, pad_value, phase) -> torch.Tensor:
    """One call of policy 'auto' on CUDA: the plan its `signature`'s race chose, or while it races, the next
    candidate's, timed (the device synchronized around it; what the plan does once per shape done first, so that
    it is not counted against the plan: `prepare_plan`)."""
    unit = runner.encoder.cfg.merge_unit
    predicted = costs.eager_packs(batch, packs, unit)
    sig = signature(batch, packs, unit)
    race = remember(runner._races, sig, CHOICE_CACHE, lambda: _new_race(runner, batch, packs, predicted, sig))
    if race.chosen is not None:
        return runner._run(batch, packs, misses, Race.plan(race.chosen, predicted, len(packs)), costs, pad_value, phase)
    name = race.next()
    eager = Race.plan(name, predicted, len(packs))
    prepare_plan(runner, batch, packs, eager)
    with collector_paused():    # a full collector pass over a loaded model's heap would be charged to the plan
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        t0 = time.perf_counter()
        out = runner._run(batch, packs, misses, eager, costs, pad_value, phase)
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        race.add(name, time.perf_counter() - t0)
    return out


def _new_race(runner, batch: PatchBatch, packs, predicted: frozenset, sig: tuple) -> Race:
    """The race of a signature met for the first time: plan "replay"'s calls from a sibling of the same budgets,
    unless a pack of ``batch`` fits its budget exactly (its exact-fit graph is not what the sibling timed)."""
    rows = batch.item_rows
    exact = any(runner.fits_exactly(budget, sum(rows[i] for i in idx), runner.tower.sequences(batch.grid_thw[idx]))
                for budget, idx in packs)
    return Race.of(predicted, len(packs), [] if exact else Race.sibling(runner._races, sig), exact=exact)


def prepare_plan(runner, batch: PatchBatch, packs, eager: frozenset) -> None:
    """What the plan running the packs in ``eager`` eagerly and replaying the others does once per shape: the
    replayed packs' host metadata and exact-fit graphs, the eager items' tower metadata; only that (a pack run
    eagerly needs no replay metadata: on a new shape, preparing it would cost the call its host time).
    `EncoderGraphRunner.prepare` is the plan that replays every pack."""
    items = []
    for k, (budget, idx) in enumerate(packs):
        if k in eager:
            items += idx
            continue
        grid = batch.grid_thw[idx]
        runner.host_metadata(grid, budget)
        runner._pack_variant(runner.graph(budget), sum(batch.item_rows[i] for i in idx), runner.tower.sequences(grid))
    if items:
        runner.tower.prepare_cached(batch.grid_thw[sorted(items)])


def check_pad_value(buffer_dtype: torch.dtype, pad_value) -> None:
    """pad_value must be something the runner's input buffer can hold: any real number for a float buffer (NaN
    included: that is the hazard check), an integer 0..255 for a uint8 buffer. Checked up front, because `fill_`
    would otherwise fail mid-encode with a raw conversion error (NaN, 256) or silently wrap or truncate (-1 -> 255,
    0.5 -> 0)."""
    real = isinstance(pad_value, numbers.Real) and not isinstance(pad_value, bool)
    if buffer_dtype == torch.uint8:
        if not (real and math.isfinite(pad_value) and pad_value == int(pad_value) and 0 <= pad_value <= 255):
            raise ValueError(f"a uint8 buffer can only be padded with an integer 0..255, got {pad_value!r}; "
                             f"for a NaN padding check use buffer_dtype torch.float32 or torch.bfloat16")
    elif not real:
        raise ValueError(f"pad_value must be a real number (0 as engines pad; NaN for the hazard check), "
                         f"got {pad_value!r}")


def check_budgets(budgets, max_items) -> tuple[list[int], int]:
    """(budgets, max_items) as ints: budgets ascending and distinct (`Budgets.of`), max_items
    within the `items` cap, and no budget below it."""
    budgets = list(Budgets.of(budgets, ascending=True))
    max_items = limits.integer(max_items, "max_items", cap="items")
    small = [b for b in budgets if b < max_items]
    if small:
        raise ValueError(f"budgets {small} are smaller than max_items={max_items}: every item needs at least one "
                         f"merged token, so such a budget can never hold a full pack; raise them or lower max_items")
    return budgets, max_items


def default_budgets(max_tokens: int, smallest: int = 64) -> list[int]:
    """Powers of two from `smallest` up to the first one >= max_tokens (the default runner's budgets;
    `engines.EnginePolicy.budgets` gives each engine release's rule)."""
    max_tokens = limits.integer(max_tokens, "max_tokens", cap="budget_tokens")
    out = [limits.integer(smallest, "smallest", cap="budget_tokens")]
    while out[-1] < max_tokens:
        out.append(out[-1] * 2)
    return out


class PhaseClock:
    """``with clock("replay"): ...`` adds the seconds the block took to ``phases["replay"]``,
    synchronizing a CUDA device before and after it so that queued work is counted where it was
    issued. With ``phases=None`` every block is a plain pass-through: no clock, no sync."""

    __slots__ = ("phases", "device", "name", "t0")

    def __init__(self, phases: dict | None, device: torch.device):
        if phases is not None and not isinstance(phases, dict):
            raise TypeError(f"phases must be a dict (or None), got {type(phases).__name__}")
        self.phases = phases
        self.device = device if phases is not None and device.type == "cuda" else None
        self.name, self.t0 = None, 0.0

    def __call__(self, name: str) -> "PhaseClock":
        self.name = name
        return self

    def __enter__(self) -> None:
        if self.phases is not None:
            if self.device is not None:
                torch.cuda.synchronize(self.device)
            self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> bool:
        if self.phases is not None:
            if self.device is not None:
                torch.cuda.synchronize(self.device)
            self.phases[self.name] = self.phases.get(self.name, 0.0) + time.perf_counter() - self.t0
        return False
