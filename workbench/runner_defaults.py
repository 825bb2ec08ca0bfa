"""The runner `encode(path='cudagraph')` builds when none is given, kept on the encoder and grown
for larger batches (wired in by the package's ``__init__``: the encoder never imports the runner)."""
from __future__ import annotations

import warnings

from .preprocess import PatchBatch
from .runner import EncoderGraphRunner
from .runner_policy import default_budgets


def default_max_tokens(encoder, batch: PatchBatch) -> int:
    """Merged tokens the default budgets must cover for `batch`: its largest item, capped."""
    biggest = max(r // encoder.cfg.merge_unit for r in batch.item_rows)
    return min(biggest, EncoderGraphRunner.DEFAULT_MAX_BUDGET)


def default_for(encoder, batch: PatchBatch) -> EncoderGraphRunner:
    """Budgets covering the batch's largest item (powers of two from 64)."""
    return EncoderGraphRunner(encoder, budgets=default_budgets(default_max_tokens(encoder, batch)))


def default_runner(encoder, batch: PatchBatch) -> "EncoderGraphRunner":
    """The runner `encode(path='cudagraph')` uses without `runner=`: built for the first batch
    (`default_for`), kept, and rebuilt when a later batch has an item
    larger than its largest budget. Keeping the first batch's budgets would run every larger
    item eagerly (a miss) for the encoder's whole life, which only `runner.stats` shows.
    """
    current = getattr(encoder, "_default_runner", None)
    if current is None:
        encoder._default_runner = default_for(encoder, batch)
        return encoder._default_runner
    wanted = default_budgets(default_max_tokens(encoder, batch))
    if wanted[-1] <= current.budgets[-1]:
        return current
    # grow, never shrink: the budgets cover both the old batches and this one (default_budgets
    # are powers of two from 64, so `wanted` extends `current.budgets` when both are defaults)
    old = current.budgets
    biggest = max(r // encoder.cfg.merge_unit for r in batch.item_rows)
    # drop the old runner (its buffers and, on CUDA, its graph pool) before capturing again
    encoder._default_runner = current = None
    encoder._default_runner = default_for(encoder, batch)
    warnings.warn(f"the default cudagraph runner was rebuilt: an item of {biggest} merged tokens exceeds its "
                  f"largest budget {old[-1]}; budgets {old} -> {encoder._default_runner.budgets} (every budget "
                  f"was captured again). To capture once, pass runner=wb.EncoderGraphRunner(enc, "
                  f"budgets=[...]) with budgets covering your largest item.", stacklevel=4)
    return encoder._default_runner
