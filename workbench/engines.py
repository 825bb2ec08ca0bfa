"""Serving engines' encoder CUDA graphs as named, versioned data.

An `EnginePolicy` says how one engine release captures and replays its vision encoder: the rule that
makes its token budgets and the cap on them, how a batch is packed into replays (several replays
smallest first; one replay of the whole batch, largest item first; one graph per exact sequence
length, captured when first met), what runs eagerly, whether the budgets share one set of input and
output buffers, the graph input dtype, where its own normalization runs, and the names of its
options. `EncoderGraphRunner(enc, engine=...)` reproduces a policy; the studies' engine cells take one
by name (`NEWEST`, the newest vLLM, by default) and record it in their rows; `advise` prints its
options. The next release is a new entry in `ENGINES`, not new code, unless it brings a new rule.

Every entry names the release it was read from (`source`): budgets, packing and option names are
that release's, checked against its own config and runner source (`advise --engine-source`).
Merged output tokens throughout, as the engines count budgets.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from . import limits
from .budgets import Budgets

BUDGET_RULES = ("pow2", "dense", "exact_length")
# the smallest budget the engines capture by default (vLLM: 64 merged tokens for the Qwen towers): the least a cap
# on the largest budget can be
SMALLEST_BUDGET = 64
PACKINGS = ("greedy_smallest_first", "one_replay_largest_first", "per_length")


def pow2_budgets(smallest: int, largest: int) -> list[int]:
    """Doubling from ``smallest`` while below ``largest``, which is always appended (vLLM up to 0.33)."""
    out = [smallest]
    while out[-1] * 2 < largest:
        out.append(out[-1] * 2)
    return sorted({*out, largest})


# the dense grid's second segment: every multiple of this many tokens up to `_LINEAR_END`
_LINEAR_STEP, _LINEAR_END, _QUARTER_END = 128, 2560, 1024


def dense_budgets(smallest: int, largest: int) -> list[int]:
    """vLLM 0.34's grid from ``smallest`` to ``largest`` (both kept): quarter-octave points below
    1024 (b, 1.25b, 1.5b, 1.75b for b a power of two), every multiple of 128 from 1024 to 2560, then
    1/8-octave steps rounded up to a multiple of 128. A replay pads at most a quarter of its budget
    below 1024 and at most an eighth above (the rounding to 128 stretches some 1/8-octave steps)."""
    points = {smallest, largest}
    base = 1
    while base < min(largest, _QUARTER_END):
        points |= {p for p in (base + k * (base // 4) for k in range(4)) if smallest <= p <= largest}
        base *= 2
    points |= {p for p in range(_QUARTER_END, min(largest, _LINEAR_END) + 1, _LINEAR_STEP) if p >= smallest}
    p = _LINEAR_END
    while p < largest:
        p = -(-int(p * 2 ** (1 / 8)) // _LINEAR_STEP) * _LINEAR_STEP
        if smallest <= p <= largest:
            points.add(p)
    return sorted(points)


def item_multiple_budgets(item_tokens: int, largest: int) -> list[int]:
    """vLLM 0.34's budgets for a path whose items all have ``item_tokens`` tokens (one fixed-size
    image each, Gemma-3's): every item count up to 16, then 1/8-octave steps of counts, up to the
    most items ``largest`` holds, times ``item_tokens``: up to 16 items fill their budget exactly."""
    most = max(1, largest // item_tokens)
    counts = {c for c in range(1, 17) if c <= most} | {most}
    c = 16
    while c < most:
        c = math.ceil(c * 2 ** (1 / 8))
        counts.add(min(c, most))
    return [c * item_tokens for c in sorted(counts)]


@dataclass(frozen=True)
class EngineOptions:
    """How a user sets the policy's knobs in that release: option names by role (``enable``,
    ``budgets``, ``max_items``, ``cap``; None where the release has none), the file that declares
    them (relative to the package root), and how they are passed."""

    enable: str
    budgets: str | None
    max_items: str | None
    cap: str | None
    declared_in: str
    passed_as: str                   # "compilation-config" (vLLM's --compilation-config JSON) or "env"

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.enable, self.budgets, self.max_items, self.cap) if n)


@dataclass(frozen=True)
class EnginePolicy:
    """One engine release's encoder-graph behaviour (see the module docstring)."""

    name: str                        # "vllm-0.34": the key of `ENGINES`
    engine: str                      # "vLLM", "SGLang"
    version: str
    released: str                    # ISO date of the release
    budget_rule: str                 # `BUDGET_RULES`
    default_cap: int | None          # the largest auto-generated budget (None: the model's largest)
    packing: str                     # `PACKINGS`
    eager: str                       # what runs eagerly, in the engine's words
    shared_buffers: bool             # one max-size input/output buffer set serves every budget
    input_dtype: str                 # the graph's pixel input buffer
    norm_site: str                   # where the engine's own norm runs relative to the graph
    options: EngineOptions
    source: str                      # the files the policy was read from
    placements: tuple[str, ...] = ("tower", "processor")   # the workbench placements the release can apply
    defer: bool = False              # greedy packing closes a pack early where an item alone outweighs it
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        """A policy made by hand (`dataclasses.replace`, or a new entry) names a rule and a packing the code
        has, and a cap that is a budget: an unknown one would run as some other rule, silently."""
        for what, value, valid in (("budget_rule", self.budget_rule, BUDGET_RULES),
                                   ("packing", self.packing, PACKINGS)):
            if value not in valid:
                raise ValueError(f"engine policy {self.name!r}: {what}={value!r} is not one the runner has; "
                                 f"valid: {', '.join(valid)}")
        if self.default_cap is not None:    # no cap looked up: the entries are made as the module imports
            limits.integer(self.default_cap, f"engine policy {self.name!r}: default_cap")

    def budgets(self, largest: int, smallest: int = SMALLEST_BUDGET, cap: int | None = None) -> list[int]:
        """The budgets this release captures for a model whose budget range is ``smallest`` ..
        ``largest`` merged tokens (vLLM: 64 for the Qwen towers; the largest is the scheduler's
        token budget), with ``cap`` (default: the release's) on the largest. For an engine that
        captures one graph per exact length as it meets them (`packing` 'per_length'): the largest
        length it captures, alone."""
        smallest = limits.integer(smallest, "smallest", cap="budget_tokens")
        largest = limits.integer(largest, "largest", cap="budget_tokens")
        if smallest > largest:
            raise ValueError(f"smallest budget {smallest} is above the largest {largest}; give smallest <= largest")
        cap = self.default_cap if cap is None else cap
        if cap is not None:
            cap = limits.integer(cap, "cap", cap="budget_tokens")
            if cap < smallest:
                raise ValueError(f"{self.name}: a budget cap of {cap} merged tokens is below the smallest budget "
                                 f"{smallest}; valid caps: {smallest}..{limits.current().budget_tokens:,}")
            largest = min(largest, cap)
        if self.budget_rule == "pow2":
            return pow2_budgets(smallest, largest)
        if self.budget_rule == "dense":
            return dense_budgets(smallest, largest)
        return [largest]

    def max_items(self, budgets, largest: int | None = None, smallest: int = SMALLEST_BUDGET) -> int:
        """Items (attention sequences) one replay holds by default: the model's budget range
        ``largest`` / ``smallest`` (before any cap; default the budgets' largest), at most the
        smallest budget (vLLM: a replay's every item needs one output token)."""
        b = Budgets.of(budgets)
        top = b[-1] if largest is None else limits.integer(largest, "largest", cap="budget_tokens")
        return max(1, min(top // limits.integer(smallest, "smallest", cap="budget_tokens"), b[0]))

    def describe(self) -> str:
        """One line: the rule, the packing, the buffers."""
        cap = f", capped at {self.default_cap}" if self.default_cap else ""
        return (f"{self.engine} {self.version}: budgets {self.budget_rule}{cap}; {self.packing.replace('_', ' ')}; "
                f"{'shared' if self.shared_buffers else 'per-budget'} {self.input_dtype} input buffers; "
                f"eager: {self.eager}")


_VLLM_33_OPTIONS = EngineOptions("cudagraph_mm_encoder", "encoder_cudagraph_token_budgets",
                                 "encoder_cudagraph_max_vision_items_per_batch", None,
                                 "vllm/config/compilation.py", "compilation-config")

ENGINES: dict[str, EnginePolicy] = {p.name: p for p in (
    EnginePolicy(
        name="vllm-0.33", engine="vLLM", version="0.33.0", released="2026-11-01",
        budget_rule="pow2", default_cap=None, packing="greedy_smallest_first",
        eager="an item larger than every budget, alone", shared_buffers=False, input_dtype="uint8",
        norm_site="inside the graph (the tower's first op), on every row of the budget",
        options=_VLLM_33_OPTIONS,
        source="vllm 0.33.0 wheel: vllm/v1/worker/encoder_cudagraph.py, vllm/config/compilation.py",
        defer=True),
    EnginePolicy(
        name="vllm-0.34", engine="vLLM", version="0.34.0", released="2026-11-16",
        budget_rule="dense", default_cap=5120, packing="one_replay_largest_first",
        eager="a batch above the largest budget or with more items than a replay holds, in one forward",
        shared_buffers=True, input_dtype="uint8",
        norm_site="inside the graph (the tower's first op, or Gemma-4's patch helper), on every row of the budget",
        options=EngineOptions("cudagraph_mm_encoder", "encoder_cudagraph_token_budgets",
                              "encoder_cudagraph_max_vision_items_per_batch", "encoder_cudagraph_max_token_budget",
                              "vllm/config/compilation.py", "compilation-config"),
        source="vllm 0.34.0 wheel: vllm/v1/worker/encoder_cudagraph.py, vllm/config/compilation.py",
        notes=("fixed-size items (Gemma-3) get item-multiple budgets: every count to 16, then 1/8-octave steps",)),
    EnginePolicy(
        name="sglang-0.5.23", engine="SGLang", version="0.5.23", released="2026-11",
        budget_rule="exact_length", default_cap=None, packing="per_length",
        eager="the patch embedding and the norm, before the graph; nothing is padded",
        shared_buffers=False, input_dtype="bfloat16",
        norm_site="outside the graph: eager, before the patch embedding (GPU processor by default)",
        options=EngineOptions("SGLANG_VIT_ENABLE_CUDA_GRAPH", None, None, None,
                              "python/sglang/srt/environ.py", "env"),
        source="sglang 0.5.23: python/sglang/srt/multimodal/vit_cuda_graph_runner.py, srt/environ.py",
        placements=("device", "processor")),
)}
NEWEST = "vllm-0.34"      # the default engine of every study's engine cells and of `advise`


def get(name) -> EnginePolicy:
    """The policy named ``name`` (an `EnginePolicy` passes as it is); ValueError naming the valid ones."""
    if isinstance(name, EnginePolicy):
        return name
    if not isinstance(name, str) or name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid: {', '.join(ENGINES)} (engine-version, as in "
                         f"{NEWEST!r}, the newest vLLM)")
    return ENGINES[name]


def with_cap(engine, cap: int | None) -> EnginePolicy:
    """``engine``'s policy with its budget cap option set to ``cap`` (None: the release's own); ValueError
    where the release has no such option, naming those that do, or where the cap is below the smallest budget."""
    policy = get(engine)
    if cap is None:
        return policy
    cap = check_cap(cap)      # "4096", NaN, inf, 0, 63: named before any use
    if policy.options.cap is None:
        having = [n for n, p in ENGINES.items() if p.options.cap]
        raise ValueError(f"{policy.name} has no budget cap option (it captures up to the model's largest budget); "
                         f"releases with one: {', '.join(having)}")
    return dataclasses.replace(policy, default_cap=cap)


def check_cap(cap, what: str = "engine_cap") -> int:
    """``cap`` as an int where it can cap the largest budget: a whole number from SMALLEST_BUDGET to the limit
    ``budget_tokens``; ValueError (LimitError above the limit) naming ``what``, the value and that range."""
    valid = (f"valid caps: whole numbers {SMALLEST_BUDGET}..{limits.current().budget_tokens:,} (merged tokens, from "
             f"the smallest budget to the limit 'budget_tokens')")
    if not limits.is_integer(cap):
        raise ValueError(f"{what}={cap!r} is not a whole number of merged tokens; {valid}")
    if cap < SMALLEST_BUDGET:
        raise ValueError(f"{what}={cap!r} is below the smallest budget {SMALLEST_BUDGET}; {valid}")
    try:
        return limits.check("budget_tokens", int(cap), f"{what}={int(cap)}")
    except limits.LimitError as e:
        raise limits.LimitError(f"{e}; {valid}") from None


def pack(policy: EnginePolicy | None, tokens: list[int], frames: list[int], budgets, max_items: int):
    """How ``policy`` packs a batch of items (``tokens`` merged tokens and ``frames`` attention
    sequences each) into ``budgets``: (packs, misses, spill). packs: (budget, item indices in the order
    their rows are laid out); misses: items run eagerly one by one; spill: items run eagerly in one
    forward (the whole batch, where one replay cannot hold it). For 'per_length' each pack's budget
    is its exact token count (captured on first use by the runner). ``policy`` None: the workbench's
    own runner (greedy, smallest first, no deferring)."""
    n = len(tokens)
    if policy is None or policy.packing == "greedy_smallest_first":
        return _pack_greedy(tokens, frames, budgets, max_items, defer=policy is not None and policy.defer)
    if n == 0:
        return [], [], []
    order = sorted(range(n), key=lambda i: (-tokens[i], i))      # largest first, ties in batch order
    total = sum(tokens)
    if sum(frames) > max_items:
        return [], [], list(range(n))
    if policy.packing == "per_length":
        return ([(total, order)], [], []) if total <= budgets[-1] else ([], [], list(range(n)))
    budget = next((b for b in budgets if b >= total), None)
    return ([(budget, order)], [], []) if budget is not None else ([], [], list(range(n)))


def _fitting(budgets, tokens: int) -> int:
    return next(b for b in budgets if b >= tokens)


def _pack_greedy(tokens, frames, budgets, max_items, defer: bool = False):
    """Items smallest first, packed greedily; each pack replays the smallest budget holding it; an
    item larger than every budget (or with more frames than a replay holds) misses. ``defer`` (vLLM
    0.33): a pack is also closed before an item whose budget alone is at least the pack's and
    whose joining would cost more than replaying the two apart."""
    largest = budgets[-1]
    packs, misses, cur, cur_tok, cur_seq = [], [], [], 0, 0
    for i in sorted(range(len(tokens)), key=lambda i: (tokens[i], i)):
        if tokens[i] > largest or frames[i] > max_items:
            misses.append(i)
            continue
        split = defer and cur and cur_tok + tokens[i] <= largest and (
            _fitting(budgets, cur_tok) + _fitting(budgets, tokens[i]) < _fitting(budgets, cur_tok + tokens[i])
            and _fitting(budgets, tokens[i]) >= _fitting(budgets, cur_tok))
        if cur and (split or cur_tok + tokens[i] > largest or cur_seq + frames[i] > max_items):
            packs.append(cur)
            cur, cur_tok, cur_seq = [], 0, 0
        cur.append(i)
        cur_tok += tokens[i]
        cur_seq += frames[i]
    if cur:
        packs.append(cur)
    # batch order inside a pack: its rows are gathered as runs
    return [(_fitting(budgets, sum(tokens[i] for i in p)), sorted(p)) for p in packs], misses, []
