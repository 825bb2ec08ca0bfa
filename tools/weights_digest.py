"""A digest of every parameter and buffer of the towers `build_encoder` gives, to check that a change to how towers
are built leaves their weights bit for bit the same: ``python tools/weights_digest.py OUT.json`` on two commits
(a worktree each), then compare the two files. Covers the tiny preset of every family and three real presets at
depth 1, in float32, bfloat16 and float64, placements tower, fold, processor and runner, seeds 0 and 1 (288
builds, about a minute on 2 cores)."""
from __future__ import annotations

import hashlib
import json
import sys

import torch

from workbench.checkpoints import resolve_config
from workbench.config import TINY_PRESET_PER_FAMILY
from workbench.encoder import build_encoder

REAL = ("qwen2.5-vl-7b", "glm-ocr-0.9b", "kimi-k2.5-1t")


def digest(enc) -> str:
    enc.visual.refresh_derived()          # placement fold's derived weights, made from the parameters
    h = hashlib.sha256()
    for name, t in sorted([*enc.state_dict().items(), *enc.visual.named_buffers()], key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def main(out: str) -> None:
    torch.set_num_threads(2)
    found = {}
    for preset in [*TINY_PRESET_PER_FAMILY, *REAL]:
        cfg = resolve_config(preset, 1 if preset in REAL else None)
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            for placement in ("tower", "fold", "processor", "runner"):
                for seed in (0, 1):
                    enc = build_encoder(cfg, placement=placement, norm="eager", dtype=dtype, device="cpu",
                                        seed=seed, check_inputs=False)
                    found[f"{preset}|{dtype}|{placement}|{seed}"] = digest(enc)
    with open(out, "w") as f:
        json.dump(found, f, indent=0)
    print(f"{len(found)} builds -> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "weights_digest.json")
