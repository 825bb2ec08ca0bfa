"""Input path: what normalizing on the device saves, from the request to the embedding.

The other studies measure what the normalization costs on the device. This one follows an image
the whole way, per placement, on images drawn at full size from a mix (as a request brings them):

- ``host_ms``: the host's preprocessing per image, per backend (``pil``: transformers' PIL
  processor; ``torchvision``: its torchvision one, what vLLM runs) and thread count. The
  ``processor`` placement normalizes there too (float32 rows); ``fold``, ``tower`` and ``runner``
  stop at uint8 rows; ``device`` only hands over the decoded image (JPEG decoding, the same for
  every placement, is left out: the images arrive decoded);
- ``h2d_bytes``, ``h2d_ms``: each payload per image over the host-to-device link, pinned and
  pageable: fp32 / bf16 / uint8 rows, uint8 rows of one frame (a still image's rows carry it twice),
  the resized image, the decoded image;
- ``device_ms``: the device-side preprocessing of ``device`` (resize and patchify, part
  ``resize_patchify``), and the norm kernel alone on the rows (part ``normalize``: inside the
  encoder's time, shown apart);
- ``encoder_ms``: the encoder per image (eager, and graphs with the planner's budgets for the mix,
  policy auto), its norm included where the placement puts it;
- ``total_ms``: request to embedding per image, host + link + device preprocessing + encoder;
- at load, a discrete-event model of one serving encoder fed with the stage costs measured here
  (`workbench.serving_model`): Poisson arrivals, ``workers`` host processes, one link, one GPU
  batching what is waiting: ``p50_ms`` and ``p99_ms`` per arrival ``rate``, and the highest
  sustainable rate ``max_images_per_s``.

A CPU run times the host as it is and emulates the device side on the CPU (column ``emulated``):
its link is a host copy and its device work host arithmetic, a smoke test of the path only.
"""
from __future__ import annotations

from .. import Study, register
from .params import PARAMS, footprint


STUDY = register(Study(
    name="input_path",
    guess_s={"cpu": 38},
    order=6,
    notebook="notebooks/input_path.ipynb",
    package=__name__,
    params=PARAMS,
    cells="presets",
    columns=("family", "preset", "path", "placement", "backend", "mix"),
    per_preset=True,
    footprint=footprint,
    question="what each placement saves and costs from request to embedding: host preprocessing, bytes and "
             "host-to-device time, device-side work, encoder; and at load",
))
run, summarize = STUDY.run, STUDY.summarize
