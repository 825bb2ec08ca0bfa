"""Vision-encoder input-normalization workbench (Qwen2-VL / Qwen2.5-VL).

On a machine without CUDA, Triton kernels can only run in Triton's interpreter, so importing the
package sets TRITON_INTERPRET=1 there unless the variable is already set.
"""
import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")
from .config import PRESET_NAMES, VisionConfig
from .encoder import DTYPES, PATHS, PLACEMENTS, STUDY_PLACEMENTS, VisionEncoder, build_encoder
from .norms import NORMS, make_norm
from .preprocess import PatchBatch, Video, preprocess
from .runner import EncoderGraphRunner
from .samples import image_mix, random_images, sample_images, sample_video

__all__ = ["VisionConfig", "PRESET_NAMES", "PatchBatch", "Video", "preprocess", "NORMS", "make_norm",
           "PLACEMENTS", "STUDY_PLACEMENTS", "PATHS", "EncoderGraphRunner", "DTYPES", "VisionEncoder", "build_encoder",
           "sample_images", "sample_video", "image_mix", "random_images"]
