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

# the SwiGLU MLPs' gate/up kernel (`workbench.quack_gemm`): torch's matmuls, quack-kernels' gated GEMM, or
# auto (quack where it runs: installed, Hopper, bf16/fp16, fused kernels on, a tower with SwiGLU MLPs)
GEMM_CHOICES = ("auto", "cublas", "quack")

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

    norm_in: what normalizes on the device, "device" (the GPU preprocessor, before the encoder),
    "outer" (the outer model, on its eager path only), "outer_graph" (the outer model, in a helper its
    encoder-graph forward calls too, so the graph captures the norm), "tower", "runner", or "fold"
    (nothing runs: the normalization is folded into the patch embedding's weights), or None (nothing on
    the device); input_kind: what the encoder takes,
    "uint8" (raw pixels) or "normalized" (the CPU processor's float32); runner_input: what the
    graph runner (and `VisionEncoder.encode_eager`) receive, the encoder's input_kind unless a
    step before the paths changes it (placement device: normalized floats); buffer_dtypes: names
    of the graph input buffers that can hold what the runner stages (a uint8 buffer cannot hold
    normalized floats); study_only: a deliberate misconfiguration."""

    name: str
    who: str
    norm_in: str | None
    input_kind: str
    buffer_dtypes: tuple[str, ...]
    study_only: bool = False
    runner_input: str | None = None

    def __post_init__(self) -> None:
        if self.runner_input is None:
            object.__setattr__(self, "runner_input", self.input_kind)

    @property
    def runs_norm(self) -> bool:
        """Whether a norm implementation (`norm=` of build_encoder) runs anywhere on the device."""
        return self.norm_in not in (None, "fold")


PLACEMENT_TABLE: dict[str, Placement] = {p.name: p for p in (
    Placement("processor", "the CPU processor", None, "normalized", FLOAT_BUFFERS),
    Placement("fold", "the patch embedding's weights and bias (folded in: no norm kernel)", "fold", "uint8",
              BUFFER_DTYPES),
    Placement("device", "the GPU preprocessor, before the encoder: resize, patchify and normalize on the device",
              "device", "uint8", FLOAT_BUFFERS, runner_input="normalized"),
    Placement("outer", "the outer model, before it calls the tower", "outer", "uint8", BUFFER_DTYPES),
    Placement("outer_graph", "the outer model, in the helper its eager path and its encoder-graph forward both call "
              "(vLLM's Gemma-4: `_embed_patches`)", "outer_graph", "uint8", BUFFER_DTYPES),
    Placement("tower", "the tower's first op", "tower", "uint8", BUFFER_DTYPES),
    Placement("runner", "the encoder runner, into the graph buffer", "runner", "uint8", FLOAT_BUFFERS),
    Placement("none", "nobody", None, "uint8", BUFFER_DTYPES),
    Placement("double", "the CPU processor and the tower (a misconfiguration)", "tower", "normalized",
              FLOAT_BUFFERS, study_only=True),
)}
PLACEMENTS = tuple(n for n, p in PLACEMENT_TABLE.items() if not p.study_only)
STUDY_PLACEMENTS = tuple(PLACEMENT_TABLE)
# placements where the norm implementation does not matter: none runs (the studies run one cell)
NORM_FREE_PLACEMENTS = tuple(n for n, p in PLACEMENT_TABLE.items() if not p.runs_norm)


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
