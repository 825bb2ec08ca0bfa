"""Encoder latency: eager vs CUDA-graph encode per model and token count, beside transformers' own
vision model with the same weights, and the FLOP floor.

Per (preset, merged tokens, images per call) cell, one batch of random uint8 pixels (``images``
images of ``tokens / images`` merged tokens each, grids [1, 2h, 2w] patches) is encoded three ways,
every call starting from pixels on the host, as a serving engine hands them over (in pinned memory
on CUDA, where engines batch multimodal inputs into pinned buffers; each path gets its input so):

- ``eager``        ``enc.encode(batch, path="eager")``: the outer model calls the tower (placement
                   ``tower``: the norm is the tower's first op);
- ``graph``        ``runner.encode(batch)`` with a runner whose only budget is exactly ``tokens``
                   (``max_items = images``, a uint8 input buffer as engines use today), so every
                   call is one full replay without padding; the
                   runner is captured once per cell, outside the timing. Its phases (plan,
                   metadata, staging, replay, copy_out; `workbench.runner.PHASES`) are timed in
                   separate calls with ``phases={}`` (the device synchronized around each phase),
                   so the p50/p90 of the graph path carry no phase synchronization;
- ``transformers`` transformers' own vision model (SDPA attention) with the same weights, same
                   dtype and device, fed the CPU-normalized float32 rows its processor produces.

Each time is the wall time of one call with the device synchronized before and after it
(`workbench.timing.cpu_time_us`), p50 and p90 after ``warmup`` calls, over ``min_reps`` to ``reps``
calls: until the median's 95% interval lies within 2% of it (``reps_n`` calls, ``p50_ci_lo_ms`` and
``p50_ci_hi_ms``; no interval below 6 calls). Beside them:
the floor, the tower's FLOPs (matmul + full-attention + window-attention blocks, counted by
`workbench.floors.tower_flops`) at the matmul rate measured in the same run
(`workbench.ceilings.matmul_tflops`: bf16 on CUDA, fp32 on a CPU), and each time as a multiple of it.

Realistic batches (``mixes`` x ``mix_items``): ``n`` items drawn from a named image mix
(`workbench.samples.image_mix(mix, n, seed, resized=True, cfg=cfg)`, drawn at the sizes the preset's
own processor gives), encoded
by transformers, eager, and three runners over the same batch: ``graph_engine``, the runner
reproducing the engine policy ``engine`` (`workbench.engines`; default the newest vLLM: its budget
rule over 64 .. ``engine_max_budget`` with the release's own cap, its packing, its buffers and
its default items per replay; the ``engine`` column names it) replaying every pack (policy ``always``);
``graph_planner``, `plan_budgets` for the mix's distribution with as many graphs, replaying every
pack; ``graph_auto``, the engine's budgets with policy ``auto`` (a pack replays only where that has
measured faster than eager: the runner's race of candidate plans, run out on the batch before it is
timed, ``explore_calls`` calls; its first call is ``first_ms``). Times are per image (p50 and p90 of
the call / n); beside them each runner's replays, padded rows, eager packs and misses, and every
output checked against eager before it is timed. Then ``fresh`` batches of the same mix and item
count, drawn with other seeds (shapes no call has seen, as a server meets them), each strategy
once on each, the strategies taking turns first, the device synchronized around every call:
``fresh_p50_image_ms``, the median batch's time per image (what the verdicts read: one host
hiccup moves a sum, not a median), and ``fresh_image_ms``, the whole stream's time per image
(policy auto keeps what it learned; no runner keeps host metadata from another strategy's
call). ``image_folder`` (an absolute path) adds a mix of your own images: the
folder's images, drawn by size and resized (`workbench.samples.get_mix`), its rows named
``folder:<its name>`` with the folder's ``fingerprint``.

Every cell is checked once before it is timed: the graph output against the eager output (bit-equal
or within the dtype's tolerance) and ours against transformers (row-wise cosine). A path whose
check fails is not timed: a latency is never reported for a wrong result (the failed check stays in
the table as ``ok`` = False).

Reading the numbers: the practical floor is the matmul FLOPs at the matmul rate plus the attention
FLOPs at the fastest attention kernel's rate for the cell's shapes, both measured in the run; at
small token counts launches and host work, not FLOPs, set the time (far above either floor). The
runner caches host metadata per grid and budget, so only a shape seen for the first time pays
``prepare_uncached_ms``; a repeated one pays the copy (``metadata_ms``). On a CPU the graph
backend is emulated (the same static buffers and call path, replayed eagerly): its differences
from eager are the runner's host overhead, not CUDA-graph gains.
"""
from __future__ import annotations

from .. import Study, register
from .params import PARAMS, footprint


STUDY = register(Study(
    name="encoder_latency",
    guess_s={"cpu": 72},
    order=5,
    notebook="notebooks/encoder_latency.ipynb",
    package=__name__,
    params=PARAMS,
    cells="presets",
    columns=("family", "preset", "path", "tokens", "images"),
    footprint=footprint,
    question="eager vs graph latency per model and token count, beside transformers' own vision model "
             "with the same weights, against the FLOP and practical floors, and where the time goes by kernel",
))
run, summarize = STUDY.run, STUDY.summarize
