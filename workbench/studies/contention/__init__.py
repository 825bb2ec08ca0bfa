"""Contention: what preprocessing on the serving GPU takes from the encoder, and where to preprocess.

Requests arrive as files. This study follows them from their bytes, in three parts:

- **decode** (``part="decode"``): each mix's images as the files a request brings, JPEG at each of
  ``jpeg_qualities`` for photos, PNG for screenshots, documents and charts (`workbench.decode`,
  made in-process from the workbench's own images), decoded on the host by Pillow on ``threads``
  threads and on the GPU by nvJPEG where torchvision and CUDA are present (``decoder``); ``decode_ms``
  per image, the files' ``encoded_bytes``, the decoded pixels against the source
  (``source_max_abs_diff``: 0 for a PNG) and nvJPEG's against Pillow's (``max_abs_diff``, in levels:
  the two decoders round differently). A decoder that cannot run here is a row with
  ``available=False``, never a time;
- **interference** (``part="interference"``): the encoder (the preset's tower on each of ``paths``,
  eager and graphs) timed on one batch of the mix alone and while a preprocessor (decode, resize,
  patchify, normalize: `workbench.preprocess` with its ``cuda`` backend) runs beside it at each duty
  cycle (`workbench.interference`), on a thread and CUDA stream of its own or in another process
  (``beside``); ``encoder_ms_alone``, ``encoder_ms_contended``, ``preprocess_ms_alone``,
  ``preprocess_ms_contended`` per call of ``images`` images, their ratios (``encoder_slowdown``,
  ``preprocess_slowdown``), the duty the preprocessor kept (``duty_measured``), and on a GPU NVML's
  ``gpu_util`` and ``gpu_mem_bytes`` meanwhile;
- **serving** (``part="serving"``): per placement (`workbench.contention_model`: ``cpu_processor``,
  ``device_norm``, ``gpu_preprocess`` with the measured slowdowns at the duty its arrival rate sets,
  ``epd_second_gpu`` modelled), `workbench.serving_model` at each arrival ``rate``: ``p99_ms`` and
  ``images_per_s_at_slo`` (the throughput where p99 meets ``slo_ms``, else 0); per placement the
  highest rate meeting it (``max_images_per_s_at_slo``), the host cores and GPU share it takes there,
  and the rates where it starts and stops winning (``wins_from_rate``, ``wins_to_rate``: lowest p99
  among those meeting the target); ``crossing_rate`` where the winner changes.

The encoder is built with ``placement="tower"`` for every placement (uint8 rows in, its norm inside):
the processor placement's float rows would only skip that norm, a small part of the encoder's time.
A CPU run times everything on the host (the GPU side emulated, column ``emulated``), threads for
streams: a smoke test of the harness, labelled by its ``device`` column.
"""
from __future__ import annotations

from .. import Study, register
from .params import PARAMS, footprint


STUDY = register(Study(
    name="contention",
    guess_s={"cpu": 30, "gpu": 180},
    order=7,
    notebook="notebooks/contention.ipynb",
    package=__name__,
    params=PARAMS,
    cells="presets",
    columns=("family", "preset", "mix", "part", "path", "beside", "duty", "placement", "rate"),
    per_preset=True,
    footprint=footprint,
    question="what preprocessing beside the encoder takes from it (decode, interference by duty cycle, same "
             "process or another), and which placement serves the most images at a p99 target",
))
run, summarize = STUDY.run, STUDY.summarize
