"""transformers' own vision towers, built from our configs, as the parity reference.

Never used on a hot path: tests and the correctness study compare against these.
"""
from __future__ import annotations

import torch

from .config import VisionConfig


def hf_vision_model(cfg: VisionConfig, attn_implementation: str = "sdpa", dtype=torch.float32):
    """transformers' Qwen2-VL / Qwen2.5-VL vision model for `cfg` (random weights, eval mode)."""
    hfc = cfg.to_hf()
    hfc._attn_implementation = attn_implementation
    if cfg.family == "qwen2-vl":
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as M
    else:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as M
    return M(hfc).to(dtype).eval()


@torch.no_grad()
def hf_embeddings(model, pixels: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """Merged embeddings [N/4, out_hidden] from a transformers vision model."""
    out = model(pixels.to(model.dtype), grid_thw)
    return out.pooler_output if hasattr(out, "pooler_output") else out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (b is the reference)."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def cos_min(a: torch.Tensor, b: torch.Tensor) -> float:
    """Smallest row-wise cosine similarity between a and the reference b (float64)."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min())
