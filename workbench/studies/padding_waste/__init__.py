"""Padding waste: what fixed CUDA-graph budgets spend on padding rows, and a planner that spends less.

A graph runner replays the smallest captured budget that fits each pack of items; the rows between
the pack and the budget are padding. The engines capture powers of two from 64 and never measure
what that costs. For each image mix (data/image_mixes.toml) and budget set, this study measures:

- **padding**: padded fraction of rows, exactly from the mix's distribution for single items, and
  through the real runner (`EncoderGraphRunner`: CUDA graphs on a GPU, emulated on a CPU) on items
  drawn from the mix, single (``max_items=1``) and packed; replays per image and graph misses (a
  video's frames each count as one sequence, so a video misses every ``max_items=1`` graph);
- **norm time on padding**: the tower placement normalizes every row of the budget; an
  ``n_valid``-aware norm (Triton norms skip padding tiles; the eager norm over the valid rows
  only, as placement ``runner`` does) does not. Both are measured per budget at 0, 50 and 100 %
  valid rows (graph replays on CUDA, host time on the CPU) and read per replay by linear
  interpolation in the valid fraction;
- **tower FLOPs on padding**, counted from the config (`workbench.floors.tower_flops`): the
  matmuls run over every row; attention costs nothing on padding rows with the kernels that
  leave rows past ``cu_seqlens[-1]`` out (``varlen``, ``loop``), and the whole square with the
  dense ``masked`` backend;
- **time**: the replay of each budget, full and partly filled (an item one token larger than
  the next smaller power of two), against the full smaller budget and against eager for that
  item; the expected replay time of each set (single items, from the replay table) and the
  measured `runner.encode` time per image on the drawn items;
- **pool**: the graph pool each set needs, modelled (`workbench.planner.graph_pool_bytes`) and,
  on CUDA, measured from the allocator's segments of the runner's pool: ``pool_bytes`` right
  after construction (every budget's general graph: what the model models), and
  ``pool_used_bytes`` once the runner is prepared for the drawn items, which also holds the
  exact-fit graphs they use (captured then here: `EncoderGraphRunner(exact_capture="first_use")`,
  `EncoderGraphRunner.prepare`).

Cost on a GPU: full attention makes a long item expensive (a 12 MP photo is one sequence of
more than ten thousand tokens on Qwen3-VL; its replay times on the H200 are in
results/reference/README.md), and every runner cell captures its set's budgets and encodes the
drawn items; sets of a mix that give the same budgets for the same ``max_items`` (the planner's two
often agree) share one runner and its measurement. So the runners here skip what a sweep of short-lived runners
does not need: the replay-table runner captures no exact-fit graphs (it replays the general
ones), the cells' runners warm up once per budget (the table's runner has already compiled every
kernel and warmed the capture stream) and capture exact-fit graphs only where a pack uses them,
and `EncoderGraphRunner.prepare` readies the drawn items (host metadata, those graphs), so the
timed encode is also the checked one instead of a second pass. ``n_items`` sets the rest of the
cost.

Your own images: ``image_folder`` (an absolute path) adds one more mix, ``folder:<its name>``: the
folder's images (sub-folders too) at their own sizes, each size weighted by its number of images
(`workbench.samples.get_mix`); the runner gets the real images, resized. Every row of that mix
carries the folder's ``fingerprint`` (image count and a hash of names and sizes), and the
``sizes`` rows (every mix's sizes, tokens and shares; for the folder its path and image counts)
draw the size distribution.

Budget sets: ``pow2`` (vLLM 0.33's powers of two from 64 up to the largest item), ``vllm-0.34``
(that release's dense grid up to its 5120-token cap, replayed with its packing: the whole batch in one
replay, largest item first, or eagerly in one forward above the cap: `workbench.engines`), ``geometric``
(a denser ladder, ratio sqrt 2), ``planner`` (`wb.plan_budgets`: the fewest expected padded tokens
with as many graphs as pow2) and ``planner_time`` (the same, minimizing expected replay time from
the replay table measured in this run).
"""
from __future__ import annotations

from .. import Study, register
from .params import PARAMS, footprint


STUDY = register(Study(
    name="padding_waste",
    guess_s={"cpu": 67},
    order=3,
    notebook="notebooks/padding_waste.ipynb",
    package=__name__,
    params=PARAMS,
    cells="presets",
    columns=("family", "preset", "budget_set", "case", "mix"),
    per_preset=True,
    footprint=footprint,
    question="for a budget set and an image mix, padded rows, norm and tower work spent on them",
))
run, summarize = STUDY.run, STUDY.summarize
