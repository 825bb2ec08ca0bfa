"""A tower's random weights, as checkpoints hold them, and what makes building the same tower again cheap: the host
draws of a seed kept for the next tower of the same parameters (`host_draws`), torch's default initialization
skipped where every parameter is written next (`skipped_default_init`); the cache is `workbench.caches.remember`,
bounded by `caches.host_cache_bytes`."""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..caches import host_cache_bytes, remember


# norm scales: drawn around 1, as trained checkpoints hold them (every other parameter around 0);
# "norm.weight" ends the names of the newer families' merger, deepstack and post-conv norms,
# "ln_pre.weight" Pixtral's norm after the patch embedding
_UNIT_WEIGHTS = ("norm1.weight", "norm2.weight", "ln_q.weight", "norm.weight", "ln_pre.weight")


@torch.no_grad()
def init_checkpoint_like(module: nn.Module, seed: int, std: float = 0.02, on_device: bool = False) -> None:
    """Checkpoint-like random weights for a tower, ours or transformers' (same parameter names):
    norm weights 1 + N(0, 0.1), everything else N(0, std); the input norm's constants untouched.

    on_device=False draws every value in fp32 on the host and copies it in (rounded into the
    parameter's dtype): the same weights on every device, what `build_encoder` gives. on_device=True
    draws in place with a generator on the parameters' device, in their dtype: other values for the
    same seed, but a real tower's ~0.7e9 parameters are drawn where they live, not one by one on
    the host (what the latency study needs before every preset)."""
    params = [(n, p) for n, p in module.named_parameters() if not n.startswith("input_norm.")]
    if on_device:
        gen = torch.Generator(device=params[0][1].device).manual_seed(seed)
        for name, p in params:
            if name.endswith(_UNIT_WEIGHTS):
                p.normal_(1.0, 0.1, generator=gen)
            else:
                p.normal_(0.0, std, generator=gen)
        return
    for (name, p), value in zip(params, host_draws([(n, tuple(p.shape)) for n, p in params], seed, std)):
        p.copy_(value)


@contextlib.contextmanager
def skipped_default_init():
    """Module constructors inside skip torch's default initialization (``torch.nn.init``'s in-place initializers do
    nothing), for a tower whose every parameter is written next (`init_checkpoint_like`, a checkpoint's load): that
    initialization draws each parameter one by one on the host, as long as the draw that replaces it. Buffers and
    tensors made otherwise (``torch.zeros``, a norm's constants) are unaffected. Not thread-safe: it swaps module
    attributes of ``torch.nn.init`` while it lasts."""
    init = torch.nn.init
    saved = {n: getattr(init, n) for n in dir(init) if n.endswith("_") and not n.startswith("_")
             and callable(getattr(init, n))}
    for n in saved:
        setattr(init, n, _leave)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


def _leave(tensor, *args, **kwargs):
    return tensor


# the host draws of the latest towers (`host_draws`): a sweep builds one tower again and again (a cell per
# placement, norm, budget or buffer), and drawing it costs more than building it; bounded in entries and bytes
DRAW_CACHE_ENTRIES = 2
DRAW_CACHE_BYTES = host_cache_bytes()
_DRAWS: dict = {}


def host_draws(shapes: list[tuple[str, tuple[int, ...]]], seed: int, std: float = 0.02) -> list[torch.Tensor]:
    """The fp32 values `init_checkpoint_like` copies into the parameters ``shapes`` ((name, shape), in order):
    drawn once per (shapes, seed, std) and kept while they are among the `DRAW_CACHE_ENTRIES` latest and within
    `DRAW_CACHE_BYTES` in all, so that the next tower of the same parameters copies them instead of drawing
    again (the same values: a copy into any dtype rounds them as before). Read-only: never written in place."""
    def draw() -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        out = []
        for name, shape in shapes:
            r = torch.randn(shape, generator=gen, dtype=torch.float32)
            out.append(1.0 + 0.1 * r if name.endswith(_UNIT_WEIGHTS) else std * r)
        return out

    return remember(_DRAWS, (seed, std, tuple(shapes)), DRAW_CACHE_ENTRIES, draw, DRAW_CACHE_BYTES)
