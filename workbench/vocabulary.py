"""The names every layer agrees on, without torch: norms, placements, encoder paths, dtypes.

A study's parameter declaration, the command line and the report need these names; the modules
that implement them (`workbench.norms`, `workbench.encoder`, `workbench.dtypes`) import them from
here and check at import that their tables hold exactly these names. So ``--help`` and a refused
``--set`` answer without importing torch, and there is one door per name: `check_norm_name`,
`check_placement`.
"""
from __future__ import annotations

from dataclasses import dataclass

# the input norms (workbench.norms.NORMS, in that order); identity only casts: it models a
# forgotten normalization, not a design to measure
NORM_NAMES = ("eager", "triton_channel", "triton_flat", "triton_rows", "identity")
REAL_NORMS = tuple(n for n in NORM_NAMES if n != "identity")

# dtype names tables, parameters and messages use
BUFFER_DTYPES = ("bfloat16", "uint8", "float32")            # graph input buffers the runner takes
TOWER_DTYPES = ("float32", "bfloat16", "float16", "float64")
FLOAT_BUFFERS = tuple(d for d in BUFFER_DTYPES if d != "uint8")

# the phases of one runner encode call, as its stats name them
PHASES = ("plan", "metadata", "staging", "replay", "copy_out")

# how a batch reaches the tower: eager on the encoder, a graph runner's replay, data-parallel ranks
PATHS = ("eager", "cudagraph", "dp")

# how wb.preprocess resizes and patchifies: transformers' PIL processors, its torchvision-backed
# ones (the default of transformers 5 and what vLLM runs), torchvision's path on the GPU
PREPROCESS_BACKENDS = ("pil", "torchvision", "cuda")


@dataclass(frozen=True)
class Placement:
    """Where normalization lives, as one row of `PLACEMENT_TABLE`: the encoder wires itself from
    it, the graph runner checks its buffer dtype against it, the studies enumerate cells with it.

    norm_in: the module that normalizes on the device ("outer", "tower", "runner") or None;
    input_kind: what the encoder takes, "uint8" (raw pixels) or "normalized" (the CPU
    processor's float32); buffer_dtypes: names of the graph input buffers that can hold that input
    (a uint8 buffer cannot hold normalized floats); study_only: a deliberate misconfiguration."""

    name: str
    who: str
    norm_in: str | None
    input_kind: str
    buffer_dtypes: tuple[str, ...]
    study_only: bool = False


PLACEMENT_TABLE: dict[str, Placement] = {p.name: p for p in (
    Placement("processor", "the CPU processor", None, "normalized", FLOAT_BUFFERS),
    Placement("outer", "the outer model, before it calls the tower", "outer", "uint8", BUFFER_DTYPES),
    Placement("tower", "the tower's first op", "tower", "uint8", BUFFER_DTYPES),
    Placement("runner", "the encoder runner, into the graph buffer", "runner", "uint8", FLOAT_BUFFERS),
    Placement("none", "nobody", None, "uint8", BUFFER_DTYPES),
    Placement("double", "the CPU processor and the tower (a misconfiguration)", "tower", "normalized",
              FLOAT_BUFFERS, study_only=True),
)}
PLACEMENTS = tuple(n for n, p in PLACEMENT_TABLE.items() if not p.study_only)
STUDY_PLACEMENTS = tuple(PLACEMENT_TABLE)
NORM_FREE_PLACEMENTS = tuple(n for n, p in PLACEMENT_TABLE.items() if p.norm_in is None)


def check_norm_name(name) -> str:
    """``name`` if it is one of NORM_NAMES, else ValueError naming it and the valid ones (the one
    check every entry point uses)."""
    if not isinstance(name, str) or name not in NORM_NAMES:
        raise ValueError(f"unknown norm {name!r}; valid norms: {', '.join(NORM_NAMES)}")
    return name


def check_placement(name) -> Placement:
    """The table row of placement ``name``, or ValueError naming it and the valid ones."""
    if not isinstance(name, str) or name not in PLACEMENT_TABLE:
        raise ValueError(f"unknown placement {name!r}; valid: {PLACEMENTS} (and the study case 'double')")
    return PLACEMENT_TABLE[name]


def check_backend(name) -> str:
    """``name`` if it is one of PREPROCESS_BACKENDS, else ValueError naming it and the valid ones."""
    if not isinstance(name, str) or name not in PREPROCESS_BACKENDS:
        raise ValueError(f"unknown preprocessing backend {name!r}; valid: {', '.join(PREPROCESS_BACKENDS)}")
    return name
