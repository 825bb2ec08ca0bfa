"""A tower whose state dict speaks its checkpoint's names: its own tensor names renamed by patterns, and a fused
qkv tensor shown as the checkpoint's three q / k / v projections (views), translated both ways by state-dict
hooks, so `state_dict()` and `load_state_dict()` read and write checkpoint keys."""
from __future__ import annotations

import functools
import re

import torch
from torch import nn


class CheckpointNames:
    """``names``: (tower key pattern, checkpoint replacement), applied in order, the first match only; ``qkv``: the
    pattern of a renamed fused qkv tensor, its groups (the attention's prefix, the tensor kind: weight or bias);
    ``layouts``: (checkpoint name pattern, to the checkpoint's layout, back to the tower's) for a tensor the
    checkpoint stores in another element order (Gemma-4's patch projection): the state dict then holds a copy in
    the checkpoint's order, and only torch's ``load_state_dict`` writes it back (a copy_ into that entry would be
    lost)."""

    def __init__(self, names: tuple[tuple[str, str], ...], qkv: str, layouts: tuple = ()):
        self.names = names
        self.qkv = re.compile(qkv)
        self.layouts = tuple((re.compile(pattern), to_ckpt, from_ckpt) for pattern, to_ckpt, from_ckpt in layouts)

    def relaid(self, name: str, value: torch.Tensor, back: bool = False) -> torch.Tensor:
        """``value`` of checkpoint entry ``name`` in the checkpoint's element order (back: in the tower's)."""
        for pattern, to_ckpt, from_ckpt in self.layouts:
            if pattern.match(name):
                return from_ckpt(value) if back else to_ckpt(value)
        return value

    def entries(self, key: str, value: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The checkpoint's (name, tensor) entries of the tower's tensor ``key``: renamed, and a fused qkv tensor as
        its three row blocks (views)."""
        for pattern, name in self.names:
            if re.match(pattern, key):
                key = re.sub(pattern, name, key)
                break
        qkv = self.qkv.match(key)
        if qkv:
            return [(f"{qkv[1]}{p}_proj.{qkv[2]}", part) for p, part in zip("qkv", value.chunk(3))]
        return [(key, self.relaid(key, value))]

    def install(self, module: nn.Module) -> None:
        """The two hooks on ``module``: its state dict in the checkpoint's names, and loading from them."""
        # partials, not bound methods: torch marks the hooks it is given with an attribute; both pickle
        module.register_state_dict_post_hook(functools.partial(_to_checkpoint, self))
        module.register_load_state_dict_pre_hook(functools.partial(_from_checkpoint, self))


def _to_checkpoint(names: CheckpointNames, module, state_dict, prefix, local_metadata) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "input_norm.")]:
        value = state_dict.pop(key)
        for name, part in names.entries(key[len(prefix):], value):
            state_dict[prefix + name] = part


def _from_checkpoint(names: CheckpointNames, module, state_dict, prefix, *args) -> None:
    """torch's load_state_dict with the checkpoint's names: each entry back to the tower's key (q, k and v
    concatenated into qkv)."""
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for own, p in module.named_parameters():
        for i, (name, _) in enumerate(names.entries(own, p)):
            if prefix + name in state_dict:
                parts.setdefault(own, {})[i] = names.relaid(name, state_dict.pop(prefix + name), back=True)
    for own, got in parts.items():
        state_dict[prefix + own] = got[0] if len(got) == 1 else torch.cat([got[i] for i in sorted(got)])
