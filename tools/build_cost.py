"""Host time of the tower builds a study makes for one preset, at the GPU profile's defaults, built on the CPU
(where construction and the seeded draws happen on every device): correctness (the float64 reference, one encoder
per placement and norm, the NaN-hazard and kernel-choice encoders), fp32_memory (a plain tower per budget and a
tower per budget, buffer and norm) and input_path (the full tower per placement). ``python tools/build_cost.py PRESET...``; compare two commits by running it on
each. A model of what the builds cost a GPU sweep, not a GPU measurement."""
from __future__ import annotations

import sys
import time

import torch

from workbench.checkpoints import resolve_config
from workbench.encoder import build_encoder
from workbench.vocabulary import NORM_FREE_PLACEMENTS, NORM_NAMES, STUDY_PLACEMENTS


def correctness_builds(preset: str, depth: int | None = 4, placements=STUDY_PLACEMENTS, norms=NORM_NAMES):
    cfg = resolve_config(preset, depth)
    yield cfg, "processor", "eager", torch.float64
    for placement in placements:
        for norm in (["eager"] if placement in NORM_FREE_PLACEMENTS else norms):
            yield cfg, placement, norm, torch.bfloat16
    hazard = [p for p in ("tower", "fold", "device") if p == "tower" or p in placements]
    for placement in hazard:
        for norm in (["eager"] if placement in NORM_FREE_PLACEMENTS else norms):
            yield cfg, placement, norm, torch.bfloat16
    for placement in (p for p in placements if p not in hazard):      # the stale-rows check's own encoders
        yield cfg, placement, "eager", torch.bfloat16
    yield cfg, "tower", "eager", torch.bfloat16


def fp32_memory_builds(preset: str):
    cfg = resolve_config(preset, 2)
    for _budget in range(3):
        yield cfg, "none", "eager", torch.bfloat16
        for _buffer in range(2):
            for norm in NORM_NAMES:
                yield cfg, "tower", norm, torch.bfloat16


def input_path_builds(preset: str):
    from workbench.studies.input_path.params import INPUT_PLACEMENTS
    cfg = resolve_config(preset)
    for placement in INPUT_PLACEMENTS:
        yield cfg, placement, "eager", torch.bfloat16


def main(presets: list[str]) -> None:
    torch.set_num_threads(2)
    for preset in presets:
        for study, builds in (("correctness", correctness_builds), ("fp32_memory", fp32_memory_builds),
                              ("input_path", input_path_builds)):
            t0, n = time.perf_counter(), 0
            for cfg, placement, norm, dtype in builds(preset):
                norm = "eager" if norm.startswith("triton") else norm    # the norm's kernel is not what is timed
                build_encoder(cfg, placement=placement, norm=norm, dtype=dtype, device="cpu", seed=0,
                              check_inputs=False)
                n += 1
            print(f"{preset:24s} {study:12s} {n:3d} builds {time.perf_counter() - t0:7.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["qwen3-vl-8b", "glm-4.1v-9b"])
