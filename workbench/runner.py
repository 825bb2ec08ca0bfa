"""Encoder CUDA-graph runner: fixed token budgets, an engine's packing, captured tower replays.

Budgets are in merged output tokens; the pixel buffer of a budget B holds 4*B rows. Packing follows
an engine policy (`engines`: ``engine="vllm-0.34"`` replays the whole batch once, largest item first,
and runs a batch no budget holds eagerly in one forward; without one, items are sorted smallest first
and packed greedily, each pack replaying the smallest budget that fits it, and a single item larger
than every budget runs eagerly: a miss). Before each replay the runner
copies the pack's pixels into the static buffer (a device-to-device copy, plus a cast when the
buffer dtype differs), zeroes the padding rows, and copies host-prepared metadata (rotary cos/sin,
cu_seqlens with repeated tails, window index) into the static metadata buffers. All budgets are
captured into one shared memory pool, largest first, over one input buffer (per budget where the
policy says so: vLLM 0.33); outputs are cloned out of the static
output buffer. `encode(batch, phases={})` also times each phase (plan, metadata, staging, replay,
copy_out: `PHASES`), synchronizing the device around each; without ``phases`` nothing is timed.

The runner captures `encoder.graph_forward`, the tower's `forward_prepared` called directly, as engines
do: what the outer model does before calling its tower (placement `outer`) does not happen here; a norm in
a helper its graph forward calls too (`outer_graph`, vLLM's Gemma-4), the model runner's own (`runner`)
and the tower's first op (`tower`) do, and what happened before the encoder was called: placement
`device` hands the runner rows the GPU preprocessor already normalized (`VisionEncoder.graph_input`), which
it stages like the CPU processor's (a float buffer); placement `fold` needs no norm (the patch embedding's
folded weights, refreshed before each replay when the parameters changed: `VisionTower.refresh_derived`).

Backends: ``cuda`` (torch.cuda.CUDAGraph capture and replay) and ``emulated`` (the same static
buffers, padding and call path, replayed eagerly: the placement bugs reproduce on a CPU).

Policies (`POLICIES`): ``always`` replays every pack that fits a budget, as the engines do;
``auto`` (the default) predicts from costs measured at construction (`PackCosts`) which packs run
eagerly and, on CUDA, races the candidate plans on real calls, one plan a call, keyed by a
`signature` that carries over to batches it has not seen (`runner_policy.race_call`; ``calibrate =
False`` keeps the prediction). Every pack's decision is in `stats`. On the emulated backend ``auto``
acts as ``always``: an emulated replay is eager work, its costs say nothing about a GPU graph.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from . import engines, limits
from .attention import use_dense
from .dtypes import dtype_name, names
from .encoder import BUFFER_DTYPES, VisionEncoder
from .norms import replaying
from .preprocess import PatchBatch
from .runner_policy import (PackCosts, PhaseClock, ReplayRecord, check_budgets, check_costs, check_pad_value,
                            default_budgets, prepare_plan, race_call, signature)
from .runner_policy import PHASES  # noqa: F401
from .caches import remember
from .towers.metadata import budget_padding

BACKENDS = ("auto", "cuda", "emulated")
POLICIES = ("auto", "always")
EXACT_CAPTURES = ("construction", "first_use")
DEFAULT_BUDGETS, DEFAULT_MAX_ITEMS = (64, 128, 256, 512, 1024), 16


@dataclass
class _Captured:
    budget: int
    pixels: torch.Tensor          # view of the shared static input buffer, [4*budget, 1176]
    meta: object                  # TowerMetadata with static device tensors
    out: torch.Tensor | None = None   # static output [budget, embed_width]
    graph: object = None          # torch.cuda.CUDAGraph for backend 'cuda'
    exact: dict = dataclasses.field(default_factory=dict)  # S -> exact-fit variant for S equal sequences


_CAPTURE_STREAMS: dict = {}


def capture_stream(device) -> "torch.cuda.Stream":
    """The one side stream per device on which every runner warms up and captures its graphs, so
    per-stream one-time allocations (the cuBLAS workspace) happen once, outside every graph pool."""
    dev = torch.device(device)
    key = dev.index if dev.index is not None else torch.cuda.current_device()
    if key not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[key] = torch.cuda.Stream(device=torch.device("cuda", key))
    return _CAPTURE_STREAMS[key]


class EncoderGraphRunner:
    """Captured encoder replays over fixed budgets.

    encoder: a wb.VisionEncoder; budgets: ascending merged-token budgets; buffer_dtype: dtype of
    the static pixel buffer (bf16, uint8 or fp32); max_items: the most attention sequences (images,
    or video frames) one replay holds; backend: 'cuda', 'emulated' or 'auto' (cuda when the
    encoder is on a CUDA device). Capture happens on construction (largest budget first).

    exact_fit: a pack of S equal sequences (images, or video frames, of one size) that fills a
    budget exactly, with at least `attention.DENSE_MIN_ROWS` rows each, replays an exact-fit graph
    over the same buffers whose full attention runs as one dense cuDNN batch, which a padded or
    mixed pack cannot use (faster than flash varlen at those sizes). The S = 1
    variant of every large enough budget is captured with the runner (``exact_capture``
    'construction', as a server wants: no capture while serving) or, with 'first_use', like every
    other S, by the first pack that needs it (a sweep that builds many short-lived runners skips
    the variants its items never use: each costs warm-up forwards and a capture). They share the
    pool (replays never overlap). Budgets chosen by the planner are item sizes, so single items
    often fit exactly.

    max_graphs: the most CUDA graphs the runner keeps captured, each budget's general graph and
    every exact-fit variant together (a positive integer, at least the number of budgets, within
    the ``graphs`` limit). Once it is reached, a pack that would need a new exact-fit variant
    replays its budget's general graph instead (correct, padded attention): a server seeing
    ever new equal-sequence packs captures no more than this.

    engine: an engine policy's name (`engines.ENGINES`, e.g. 'vllm-0.34') whose packing and buffer
    sharing the runner reproduces; without ``budgets``/``max_items``, its budget rule over 64 ..
    `DEFAULT_MAX_BUDGET` and its items per replay. fill_padding=False leaves the rows past a pack as
    an earlier replay wrote them (a padding logic that skips the rest of a shared buffer).

    costs: for policy 'auto', the `PackCosts` another runner measured over the same budgets of
    an encoder of the same tower (a study building one runner per placement measures them once:
    the placements differ by the input stage, microseconds against replays of milliseconds);
    None measures them at construction.
    """

    def __init__(self, encoder, budgets=None, buffer_dtype=torch.bfloat16,
                 max_items: int | None = None, backend: str = "auto", warmup: int = 2, exact_fit: bool = True,
                 policy: str = "auto", exact_capture: str = "construction", costs: PackCosts | None = None,
                 max_graphs: int = 256, engine=None, fill_padding: bool = True):
        if not isinstance(encoder, VisionEncoder):
            raise TypeError(f"encoder must be a wb.VisionEncoder (from wb.build_encoder), got {type(encoder).__name__}")
        self.encoder = encoder
        # the engine policy whose packing and buffers this runner reproduces (None: the workbench's own)
        self.engine = None if engine is None else engines.get(engine)
        if budgets is None:     # the engine's rule over the default range (per_length: lengths up to it), else 64..1024
            budgets = DEFAULT_BUDGETS if self.engine is None else self.engine.budgets(self.DEFAULT_MAX_BUDGET)
        if max_items is None:
            max_items = self.engine.max_items(budgets, self.DEFAULT_MAX_BUDGET) if self.engine else DEFAULT_MAX_ITEMS
        self.budgets, max_items = check_budgets(budgets, max_items)
        # 'per_length' (SGLang): graphs of exact batch lengths captured on first use, up to the budgets' largest
        self.per_length = self.engine is not None and self.engine.packing == "per_length"
        self.capacity = self.budgets[-1]
        if not isinstance(fill_padding, bool):
            raise ValueError(f"fill_padding must be True or False, got {fill_padding!r}")
        self.fill_padding = fill_padding
        warmup = limits.integer(warmup, "warmup", minimum=0, cap="reps")
        if buffer_dtype not in BUFFER_DTYPES:
            raise ValueError(f"buffer_dtype {buffer_dtype} is not supported; valid: {names(BUFFER_DTYPES)}")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; valid: {BACKENDS}")
        on_cuda = encoder.device.type == "cuda"
        if backend == "auto":
            backend = "cuda" if on_cuda else "emulated"
        if backend == "cuda" and not on_cuda:
            raise ValueError(f"backend 'cuda' needs the encoder on a CUDA device, it is on {encoder.device}; "
                             "use backend='emulated' (or 'auto')")
        if dtype_name(buffer_dtype) not in encoder.spec.buffer_dtypes:
            raise ValueError(f"placement {encoder.placement!r} fills the graph buffer with normalized floats "
                             f"(normalized by {encoder.spec.who}), which a {dtype_name(buffer_dtype)} buffer cannot "
                             f"hold; valid buffer dtypes for it: {', '.join(encoder.spec.buffer_dtypes)}")
        if not isinstance(exact_fit, bool):
            raise ValueError(f"exact_fit must be True or False, got {exact_fit!r}")
        if not isinstance(exact_capture, str) or exact_capture not in EXACT_CAPTURES:
            raise ValueError(f"unknown exact_capture {exact_capture!r}; valid: {EXACT_CAPTURES} (when the one-sequence "
                             f"exact-fit graph of each budget is captured)")
        self.max_graphs = limits.integer(max_graphs, "max_graphs", cap="graphs")
        if self.max_graphs < len(self.budgets):
            raise ValueError(f"max_graphs={max_graphs} is below the runner's {len(self.budgets)} budgets "
                             f"{self.budgets}: each budget's general graph counts; valid: {len(self.budgets)} to "
                             f"{limits.current().graphs:,}")
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; valid: {POLICIES} ('auto': replay a pack only where its "
                             f"graph is predicted faster than eager; 'always': replay every pack, as engines do)")
        self.buffer_dtype, self.max_items, self.backend, self.warmup = buffer_dtype, max_items, backend, warmup
        self.exact_fit = exact_fit
        self._host_meta: dict = {}
        self.stats: list[ReplayRecord] = []
        self.pool = None
        cfg = encoder.cfg
        self.tower = encoder.visual
        self.device = encoder.device
        # one input buffer shared by every budget (each budget's graph sees a leading view of it), unless
        # the engine policy gives each budget its own (vLLM 0.33)
        self.shared = self.engine is None or self.engine.shared_buffers
        self.input_buffer = torch.zeros(cfg.merge_unit * self.capacity if self.shared else 0, cfg.patch_dim,
                                        dtype=buffer_dtype, device=self.device)
        self.graphs: dict[int, _Captured] = {}
        if self.per_length:
            self.budgets, policy = [], "always"
        with torch.inference_mode():
            for b in reversed(self.budgets):
                self.graphs[b] = self._capture(b)
                if exact_capture == "construction":     # one sequence filling the budget
                    rows = self.graphs[b].pixels.shape[0]
                    self._pack_variant(self.graphs[b], rows, [rows])
        # the policy in force: 'auto' measures its costs on a real graph backend only (module docstring)
        self.policy = "always" if backend == "emulated" else policy
        if costs is not None:
            check_costs(costs, self.budgets)
        self.costs = None
        # 'auto' on CUDA races its candidate plans per batch signature on real calls (`runner_policy.race_call`)
        self.calibrate = self.backend == "cuda"
        self._races: dict = {}
        if self.policy == "auto":
            self.costs = PackCosts.measure(self) if costs is None else costs

    # ---- construction ------------------------------------------------------------------------
    # the largest budget a default runner (and an engine's rule without budgets) captures; larger items run eagerly
    DEFAULT_MAX_BUDGET = 16384

    def budget_metadata(self, grid_thw: torch.Tensor, budget: int, device):
        """The pack's metadata for `budget`'s static buffers (padded to this runner's max_items
        sequences and the budget's window segments), prepared now on ``device``: no cache, no
        pinning (`host_metadata` is the cached form the replays use)."""
        return self.tower.prepare(grid_thw, **budget_padding(self.encoder.cfg, budget, self.max_items), device=device)

    # host metadata of the most recent (grid, budget) packs kept for the next replay of the same shape
    HOST_META_CACHE = 64

    def host_metadata(self, grid_thw: torch.Tensor, budget: int):
        """The pack's metadata prepared on the host for `budget` (pinned when the runner is on CUDA,
        so the copy into the static buffers is asynchronous), remembered per (grid, budget): a
        repeated shape costs no host work beyond the copy."""
        def make():
            meta = self.budget_metadata(grid_thw, budget, "cpu")
            if self.device.type == "cuda":
                meta = dataclasses.replace(meta, **{k: v.pin_memory() for k, v in meta.tensors().items()})
            return meta

        return remember(self._host_meta, (tuple(map(tuple, grid_thw.tolist())), budget), self.HOST_META_CACHE, make)

    def forget_metadata(self) -> None:
        """Drop the host metadata remembered per (grid, budget): the next call prepares its own, as a new shape's does."""
        self._host_meta.clear()

    def fits_exactly(self, budget: int, n_rows: int, frames: list[int]) -> bool:
        """Whether a pack of ``n_rows`` rows of sequences ``frames`` replays an exact-fit graph of ``budget``: equal
        sequences filling it, dense attention for them (`use_dense`), exact_fit on, the variant captured or
        `max_graphs` not reached. Asked without capturing one."""
        cap, n = self.graphs[budget], len(frames)
        if not self.exact_fit or n_rows != budget * self.encoder.cfg.merge_unit or len(set(frames)) != 1:
            return False
        return n in cap.exact or (n_rows % n == 0 and use_dense(self.tower.kernels.backend, n_rows // n)
                                  and self.n_graphs() < self.max_graphs)

    def _exact_graph(self, cap: _Captured, n_seqs: int) -> "_Captured":
        """The exact-fit variant of `cap` for ``n_seqs`` equal sequences filling it, captured on first use (the
        caller, `_pack_variant`, asked `fits_exactly`)."""
        if n_seqs not in cap.exact:
            rows = cap.pixels.shape[0]
            with torch.inference_mode():
                cap.exact[n_seqs] = self._capture(cap.budget, share=cap, dense_seqlen=rows // n_seqs)
        return cap.exact[n_seqs]

    def n_graphs(self) -> int:
        """The graphs the runner holds: one per budget (all captured at construction, so while it runs
        the budgets not yet captured are counted ahead: a variant never takes their place), plus every
        exact-fit variant."""
        return len(self.budgets) + sum(len(c.exact) for c in self.graphs.values())

    def _capture(self, budget: int, share: "_Captured | None" = None, dense_seqlen: int | None = None) -> _Captured:
        rows = budget * self.encoder.cfg.merge_unit
        if share is None:
            pixels = self.input_buffer[:rows] if self.shared else self.input_buffer.new_zeros(rows, self.input_buffer.shape[1])
            cap = _Captured(budget, pixels, self.tower.prepare_capture(budget, self.max_items))
        else:  # an exact-fit variant reads the same static buffers
            cap = _Captured(budget, share.pixels, dataclasses.replace(share.meta, dense_seqlen=dense_seqlen))

        def run():
            return self.encoder.graph_forward(cap.pixels, cap.meta)

        if self.backend == "emulated":    # the first replay runs the forward and keeps its output as the static one
            cap.graph = run
            return cap
        stream = capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):  # compile Triton kernels, create cuBLAS handles outside the capture
                run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # captured on the stream that was warmed: cuBLAS keeps one workspace per (handle, stream),
        # allocated on first use; warmed on another stream, it would be allocated inside this
        # graph's pool during the capture and pin that pool's segment
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            cap.out = run()
        if self.pool is None:
            self.pool = graph.pool()
        cap.graph = graph
        return cap

    # ---- packing -----------------------------------------------------------------------------
    def plan(self, batch: PatchBatch) -> tuple[list[tuple[int, list[int]]], list[int]]:
        """Packs as (budget, item indices) and the indices of items that miss every budget, by the
        engine policy's packing (`engines.pack`; the workbench's greedy one without an engine); the
        items of a batch the policy runs eagerly in one forward count among the misses."""
        tokens = [r // self.encoder.cfg.merge_unit for r in batch.item_rows]
        packs, misses, spill = self.plan_batch(batch)
        return packs, misses + spill

    def plan_batch(self, batch: PatchBatch) -> tuple[list, list[int], list[int]]:
        """(packs, misses, spill): `engines.pack` under this runner's engine policy."""
        tokens = [r // self.encoder.cfg.merge_unit for r in batch.item_rows]
        capacity = [self.capacity] if self.per_length else self.budgets
        packs, misses, spill = engines.pack(self.engine, tokens, batch.grid_thw[:, 0].tolist(), capacity,
                                            self.max_items)
        if self.per_length and packs and packs[0][0] not in self.graphs and self.n_graphs() >= self.max_graphs:
            return [], [], list(range(batch.n_items))   # a new length, no room for its graph: eager
        return packs, misses, spill

    def graph(self, budget: int) -> _Captured:
        """The captured graph of ``budget``; under a 'per_length' policy a length met for the first time
        is captured now (into the same pool)."""
        if budget not in self.graphs:
            with torch.inference_mode():
                self.graphs[budget] = self._capture(budget)
            self.budgets = sorted(self.graphs)
        return self.graphs[budget]

    def _pack_variant(self, cap: _Captured, n_rows: int, frames: list[int]) -> "_Captured | None":
        """The exact-fit graph a pack replays (equal sequences filling its budget exactly: same
        buffers, dense attention), captured on first use; None: the budget's general graph.
        ``n_rows``: the pack's rows; ``frames``: its sequence lengths (`VisionTower.sequences`)."""
        return self._exact_graph(cap, len(frames)) if self.fits_exactly(cap.budget, n_rows, frames) else None

    @torch.inference_mode()
    def prepare(self, batch: PatchBatch) -> None:
        """Do now what `encode(batch)` would do once and a later call would find done: each pack's
        host metadata (cached per grid and budget) and the exact-fit graphs its packs use
        (captured). An `encode(batch)` after it replays at once, as a warm call does, so a caller
        that needs one encode, timed, does not pay a second one to warm up. Packs that policy
        'auto' would run eagerly are prepared too (their metadata is cheap, no graph is captured
        for them unless they fit exactly)."""
        batch = self.encoder.graph_input(batch)
        packs, _ = self.plan(batch)
        prepare_plan(self, batch, packs, eager=frozenset())

    # ---- replay ------------------------------------------------------------------------------
    def stage(self, cap: _Captured, pixels: torch.Tensor, pad_value: float = 0.0) -> None:
        """Fill the static input: valid rows (copy + cast, or the runner's normalization), padding rows."""
        check_pad_value(self.buffer_dtype, pad_value)
        n = pixels.shape[0]
        dst = cap.pixels
        if self.encoder.runner_norm is not None:
            self.encoder.runner_normalize(pixels, out_dtype=dst.dtype, out=dst[:n])
        else:
            dst[:n].copy_(pixels, non_blocking=True)
        if self.fill_padding:   # False: rows past the pack keep what an earlier replay left (the shared-buffer hazard)
            dst[n:].fill_(pad_value)

    def replay(self, cap: _Captured) -> torch.Tensor:
        # a replay runs no forward in Python: weights derived from the parameters (placement
        # fold's folded patch embedding) are refreshed here, in place, when the parameters changed
        self.tower.refresh_derived()
        if self.backend == "cuda":
            cap.graph.replay()
        else:
            with replaying(), torch.inference_mode():  # no host-side checks or autograd, as in a real replay
                out = cap.graph()
                cap.out = out if cap.out is None else cap.out.copy_(out)
        return cap.out

    @torch.inference_mode()
    def poison_pool(self) -> None:
        """Replay every budget on NaN inputs (NaN pixels where the buffer dtype can hold them, NaN
        rotary tables always), so that the memory the graphs write in the shared pool, and the
        static outputs, hold NaN. A later replay that reads memory it did not write shows it."""
        fill = float("nan") if self.buffer_dtype.is_floating_point else 255
        for cap in self.graphs.values():
            cap.pixels.fill_(fill)
            cap.meta.cos.fill_(float("nan"))
            cap.meta.sin.fill_(float("nan"))
            self.replay(cap)
            for variant in cap.exact.values():
                self.replay(variant)
        for cap in self.graphs.values():
            cap.pixels.zero_()

    @torch.inference_mode()
    def encode(self, batch: PatchBatch, pad_value: float = 0.0, phases: dict | None = None,
               policy: str | None = None) -> torch.Tensor:
        """Merged embeddings [N/4, embed_width] in item order (`VisionConfig.item_tokens` per item);
        appends ReplayRecords to `stats`.

        pad_value: what padding rows are filled with (0 as engines do; NaN for the hazard check).
        phases: a dict to add each phase's seconds to (keys `PHASES`, plus ``miss`` when an item
        misses every budget, ``eager`` when policy 'auto' runs a pack eagerly); the device is synchronized before
        and after each phase, so the times are wall times of finished work. None (the default)
        times nothing and never synchronizes.
        policy: 'always' replays every pack for this call whatever the runner's policy (one runner,
        both behaviours); None: the runner's."""
        batch = self.encoder.graph_input(batch)
        if policy not in (None, *POLICIES):
            raise ValueError(f"unknown policy {policy!r}; valid: {POLICIES} or None (the runner's, {self.policy!r})")
        costs = None if policy == "always" else self.costs
        check_pad_value(self.buffer_dtype, pad_value)  # before any replay, so a bad value leaves no partial stats
        phase = PhaseClock(phases, self.device)
        with phase("plan"):
            packs, misses, spill = self.plan_batch(batch)
        if spill:
            return self._spill(batch, phase)
        if costs is None or not packs:
            return self._run(batch, packs, misses, frozenset(), costs, pad_value, phase)
        if not self.calibrate:
            return self._run(batch, packs, misses, costs.eager_packs(batch, packs, self.encoder.cfg.merge_unit),
                             costs, pad_value, phase)
        return race_call(self, batch, packs, misses, costs, pad_value, phase)

    def settled(self, batch: PatchBatch) -> bool:
        """Whether a call of ``batch`` runs a plan already chosen: policy 'always', a prediction alone (not CUDA),
        or on CUDA the race of the batch's `signature` decided (until then each call times one candidate). The
        plan reads the grids only: the batch is not preprocessed for the question."""
        packs, _ = self.plan(batch)
        if self.costs is None or not packs or not self.calibrate:
            return True
        race = self._races.get(signature(batch, packs, self.encoder.cfg.merge_unit))
        return race is not None and race.chosen is not None

    def settle(self, batch: PatchBatch, limit: int = 64) -> int:
        """Encode ``batch`` until its plan is settled (`settled`), as a caller timing the steady state does first;
        the calls made (at most ``limit``)."""
        n = 0
        while n < limit and not self.settled(batch):
            self.encode(batch)
            n += 1
        return n

    def _run(self, batch: PatchBatch, packs, misses, eager: frozenset, costs: PackCosts | None, pad_value,
             phase: PhaseClock) -> torch.Tensor:
        """Replay the packs not in ``eager`` (positions in ``packs``), run those in it as one eager
        call and the misses one by one; records each in `stats`. The batch's rows go to the
        device in one copy (asynchronous from pinned memory); packs are gathered there."""
        unit = self.encoder.cfg.merge_unit
        with phase("staging"):
            dev = PatchBatch(batch.pixels.to(self.device, non_blocking=True), batch.grid_thw)
        slices, rows = batch.item_slices, batch.item_rows
        tokens = self.encoder.cfg.item_tokens(batch.grid_thw)
        with phase("copy_out"):
            out = torch.empty(sum(tokens), self.encoder.cfg.embed_width, dtype=self.encoder.dtype, device=self.device)
        eager_packs: list[ReplayRecord] = []
        eager_items: list[int] = []
        for k, (budget, idx) in enumerate(packs):
            with phase("plan"):
                grid, n_rows = batch.grid_thw[idx], sum(rows[i] for i in idx)
            predicted = {}
            if costs is not None:
                predicted = dict(graph_ms=costs.replay_ms[budget], eager_ms=costs.eager_ms(n_rows // unit))
            if k in eager:
                eager_packs.append(ReplayRecord(budget, len(idx), n_rows, 0, eager=True, **predicted))
                eager_items += idx
                continue
            cap = self.graph(budget)
            with phase("metadata"):
                cap.meta.copy_(self.host_metadata(grid, budget))
            with phase("staging"):
                consecutive = idx == list(range(idx[0], idx[0] + len(idx)))
                pixels = (dev.pixels[slices[idx[0]].start:slices[idx[-1]].stop] if consecutive else
                          torch.cat([dev.pixels[slices[i]] for i in idx]))
                self.stage(cap, pixels, pad_value)
            variant = self._pack_variant(cap, n_rows, self.tower.sequences(grid))
            exact = variant is not None
            with phase("replay"):
                result = self.replay(variant if exact else cap)
            with phase("copy_out"):
                batch.place_tokens(out, idx, result, tokens=tokens)
            self.stats.append(ReplayRecord(budget, len(idx), n_rows, budget * unit - n_rows, exact=exact,
                                           **predicted))
        if eager_items:
            # the packs sent eagerly run as one eager call over their items in batch order (the
            # whole batch when it is all of them: no gather, no scatter)
            with phase("eager"):
                items = sorted(eager_items)
                whole = len(items) == batch.n_items
                result = self.encoder.encode_eager(dev if whole else dev.select(items, copy=False))
                if whole:
                    out = result
                else:
                    batch.place_tokens(out, items, result, tokens=tokens)
            self.stats += eager_packs
        for i in misses:
            with phase("miss"):
                batch.place_tokens(out, [i], self.encoder.encode_eager(dev.select([i], copy=False)), tokens=tokens)
            self.stats.append(ReplayRecord(0, 1, rows[i], 0, miss=True))
        return out

    def _spill(self, batch: PatchBatch, phase: PhaseClock) -> torch.Tensor:
        """The whole batch in one eager forward, as an engine policy runs a batch no replay holds."""
        with phase("eager"):
            out = self.encoder.encode_eager(PatchBatch(batch.pixels.to(self.device, non_blocking=True),
                                                       batch.grid_thw))
        self.stats.append(ReplayRecord(0, batch.n_items, batch.n_rows, 0, miss=True, eager=True))
        return out

    # ---- summaries ---------------------------------------------------------------------------
    def stats_frame(self):
        """The per-replay records as a pandas DataFrame."""
        import pandas as pd
        return pd.DataFrame([dataclasses.asdict(r) for r in self.stats],
                            columns=[f.name for f in dataclasses.fields(ReplayRecord)])

    def reset_stats(self) -> None:
        self.stats.clear()

    def __repr__(self) -> str:
        return (f"EncoderGraphRunner(placement={self.encoder.placement!r}, budgets={self.budgets}, "
                f"buffer_dtype={self.buffer_dtype}, max_items={self.max_items}, backend={self.backend!r}, "
                f"policy={self.policy!r})")
