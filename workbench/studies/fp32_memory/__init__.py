"""fp32 memory: the bytes normalization parks in the CUDA-graph memory pool, measured and modelled.

Three scopes per (norm implementation, budget, graph buffer dtype):

- ``norm``   the norm captured alone, as the tower calls it (input: the graph buffer's dtype, output
             bf16, ``n_valid`` given, no ``out=``). Measured on CUDA (reserved bytes of its fresh
             graph pool, peak allocated bytes); modelled everywhere: the allocation trace derived
             from the implementation (`workbench.norms.InputNorm.alloc_trace`) replayed through a
             model of torch's caching allocator (`PoolModel`), and the trace itself checked
             against one counted from a real call with a dispatch mode on the ``meta`` device, so a
             16384-token budget is sized without memory. The measurement counts the segments
             of the graph's own pool (see `workbench.cuda_memory.captured_memory`).
- ``tower``  placement tower: the tower (``depth`` blocks) captured with the norm as its first op,
             minus the same tower with the norm removed (it then only casts its input): what the
             norm adds to the pool once the tower's own allocations can reuse the freed
             temporaries. Measured on CUDA only; a negative difference (the pool with the
             norm came out smaller) is allocator segment rounding: nothing measurable added.
- ``runner`` placement runner: the norm runs before the graph, writing the bf16 buffer through
             ``out=``; the pool holds no norm. Its temporaries are transient, outside the pool:
             peak allocated bytes of one call, measured (CUDA) and modelled.
- ``device`` placement device: the GPU preprocessor's norm makes a bf16 tensor of the valid rows
             before the encoder is called (out of place, no ``n_valid``); the graph then only
             stages it. Nothing in the pool; a transient peak outside it, as for ``runner``.
- ``fold``   placement fold: no norm at all; the graph's first op casts its buffer to the tower
             dtype (a bf16 copy of a uint8 buffer, nothing for a bf16 one), which is the trace of
             the identity norm on that call: no fp32 temporary. Modelled, and on CUDA the cast
             captured alone.

``temp_bytes`` is the temporary memory alone: the peak of the allocations freed before the call
returns (for eager: two fp32 copies of the rows, 8 bytes/element).
"""
from __future__ import annotations

from .. import Study, register
from .params import PARAMS, footprint


STUDY = register(Study(
    name="fp32_memory",
    guess_s={"cpu": 11},
    order=4,
    notebook="notebooks/fp32_memory.ipynb",
    package=__name__,
    params=PARAMS,
    cells="presets",
    columns=("family", "preset", "placement", "budget", "norm", "buffer_dtype"),
    per_preset=True,
    footprint=footprint,
    question="graph-pool / peak bytes attributable to normalization, measured and modelled",
))
run, summarize = STUDY.run, STUDY.summarize
