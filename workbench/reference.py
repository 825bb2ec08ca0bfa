"""transformers' own vision towers, built from our configs, as the parity reference.

Never used on a hot path: tests and the correctness study compare against these.
"""
from __future__ import annotations

import math

import torch

from .config import VisionConfig


def hf_vision_model(cfg: VisionConfig, attn_implementation: str = "sdpa", dtype=torch.float32):
    """transformers' vision model of `cfg`'s family for `cfg` (random weights, eval mode): the
    class its family names (`Family.hf_class`), e.g. Qwen2VisionTransformerPretrainedModel,
    Qwen3VLVisionModel, Glm4vVisionModel."""
    hfc = cfg.to_hf()
    hfc._attn_implementation = attn_implementation
    return cfg.spec.hf_model_class()(hfc).to(dtype).eval()


def _family_of(model):
    from .config import families
    name = type(model).__name__
    for fam in families().values():
        if name == fam.hf_class[1] or name in fam.hf_class_aliases:
            return fam
    raise TypeError(f"{name} is not the vision model of a registered family "
                    f"({', '.join(f.hf_class[1] for f in families().values())})")


@torch.no_grad()
def hf_embeddings(model, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """Merged embeddings [N/4, embed_width] from a transformers vision model, in the form our
    towers return them (Qwen3-VL: the deepstack features concatenated after the merged tokens)."""
    return _family_of(model).hf_embeddings(model, pixels.to(model.dtype), grid_thw)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (b is the reference), on the host: the same value wherever the
    tensors were made (what a table records)."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def cos_min(a: torch.Tensor, b: torch.Tensor) -> float:
    """Smallest row-wise cosine similarity between a and the reference b (float64, on the host)."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min())


CHUNK_ELEMENTS = 1 << 25     # float64 rows converted at a time on the device (256 MiB per tensor)


def errors_in_place(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(`rel_err`, `cos_min`) of a against the reference b, computed where the tensors are, in float64
    over chunks of rows: for checks whose values are not recorded (a pass or fail), without copying a
    wide output (Qwen3-VL's 16,384-wide rows: 1.75 GB in float64 for 4 documents) to the host. Equal to
    the host's values up to float64 rounding of the sums' order."""
    rows = max(1, CHUNK_ELEMENTS // (math.prod(a.shape[1:]) or 1))
    diff2 = ref2 = 0.0
    cos = float("inf")
    for i in range(0, a.shape[0], rows):
        x, y = a[i:i + rows].detach().double(), b[i:i + rows].detach().double()
        diff2 += float((x - y).square().sum())
        ref2 += float(y.square().sum())
        if x.shape[0]:
            cos = min(cos, float(torch.nn.functional.cosine_similarity(x, y, dim=-1).min()))
    return diff2 ** 0.5 / max(ref2 ** 0.5, 1e-300), cos
