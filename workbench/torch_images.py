"""One image in, RGB uint8 out, the way transformers' torchvision-backed processors make it, in
torch alone (torchvision itself need not be installed): the backends ``torchvision`` and ``cuda``
of `workbench.preprocess`.

transformers 5 picks its torchvision backend wherever torchvision is installed, and that is what
vLLM runs (``use_fast=True``). Its steps, per image, and what each is here:

* a PIL image is converted to RGB as the PIL processors convert it (`images.decoded_rgb`); a grey
  array or tensor has its channel repeated and an RGBA one is composited on white in float32
  (levels / 255, then ``rgb * a + (1 - a)``, then back to uint8 by ``x * (256 - 0.001)``
  truncated: torchvision's ``to_dtype`` with scaling), which is not quite the PIL backends'
  rounding. transformers makes a channels-first tensor of it; here the frames stay channels last
  in memory and are viewed channels first (`frames_nchw`): the resize gives the same values on
  either layout and is faster on this one;
* the resize is torch's antialiased bicubic interpolation (``align_corners=False``; bilinear for a
  family whose processor resamples so, Gemma-3). On the CPU
  torchvision hands the uint8 image to torch's native uint8 kernel (fixed-point, close to PIL's);
  on any other device it computes in float32, clamps to 0..255 and rounds. The two differ by
  several levels on many values of a photo (README, "Preprocessing backends"), so the ``cuda``
  backend (float path) and the ``torchvision`` backend (native path) are different processors;
* rescale and normalize are fused: ``(x - mean / rescale) / (std / rescale)`` in float32;
* the patchify is a reshape and permute into the Qwen2-VL row layout (`workbench.patches`).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .images import decoded_rgb

# torchvision's to_dtype(float -> uint8, scale=True) multiplies by 255 + 1 - eps and truncates
_TO_UINT8 = 255 + 1.0 - 1e-3


def hwc_rgb(x: Any, index: int, where: str) -> torch.Tensor:
    """One checked image or frame -> uint8 [H, W, 3] tensor (channels last, as decoded: the
    resize kernel is fastest on that layout and gives the same values on any), on the device it
    came on (a CUDA tensor stays there; everything else is on the CPU)."""
    if isinstance(x, (Image.Image, np.ndarray)):
        # a PIL image's pixels read without a second copy (np.array would copy Pillow's bytes
        # again); read-only arrays are only read here
        arr = np.asarray(decoded_rgb(x, index, where)) if isinstance(x, Image.Image) \
            else np.ascontiguousarray(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(arr)
    else:
        t = x.detach()
    t = t[..., None] if t.dim() == 2 else t
    if t.shape[2] == 1:
        return t.expand(-1, -1, 3)
    if t.shape[2] == 4:
        f = t.to(torch.float32).mul_(1.0 / 255)
        f = f[..., :3] * f[..., 3:] + (1 - f[..., 3:])
        return f.mul(_TO_UINT8).to(torch.uint8)
    return t


def frames_nchw(frames: list[torch.Tensor], device) -> torch.Tensor:
    """[H, W, 3] frames -> one uint8 [F, 3, H, W] tensor on ``device``, channels last in memory
    (a permuted view of the stacked frames: no transposing copy)."""
    x = frames[0][None] if len(frames) == 1 else torch.stack(frames)
    return x.to(device).permute(0, 3, 1, 2)


def resize(images: torch.Tensor, size: tuple[int, int], float_path: bool | None = None,
           mode: str = "bicubic") -> torch.Tensor:
    """uint8 [B, 3, H, W] (any memory layout) -> uint8 [B, 3, *size], antialiased bicubic (or ``mode``
    "bilinear": Gemma-3's processor) as torchvision resizes: the native uint8 kernel on the CPU, float32
    then clamp and round elsewhere; unchanged when the size already matches. float_path=True takes the
    float32 path on the CPU too (the ``cuda`` backend emulated on a machine without a GPU); None: as
    torchvision chooses for the device."""
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    if mode not in ("bicubic", "bilinear"):
        raise ValueError(f"unknown resize mode {mode!r}; valid: 'bicubic', 'bilinear'")
    kw = dict(size=list(size), mode=mode, align_corners=False, antialias=True)
    if images.device.type == "cpu" and not float_path:
        return F.interpolate(images, **kw)
    out = F.interpolate(images.to(torch.float32), **kw)
    return out.clamp_(min=0, max=255).round_().to(torch.uint8)


def patchify(frames: torch.Tensor, p: int, m: int, tp: int, out: torch.Tensor) -> None:
    """uint8 [F, C, H, W] (F = 1 for a still image, else a multiple of tp) -> its rows, written
    into out [F/tp * gh * gw, C*tp*p*p] in the layout `workbench.patches.patchify_array` gives (one
    strided copy, whatever the frames' memory layout)."""
    f, c, h, w = frames.shape
    gh, gw = h // p, w // p
    dst = out.view(max(1, f // tp), gh // m, gw // m, m, m, c, tp, p, p)
    if f == 1:  # every temporal copy of a still image is the frame itself: one strided copy
        # into the first, then contiguous patch copies into the others (twice as fast as one
        # expanded copy)
        x = frames.reshape(1, c, gh // m, m, p, gw // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)
        dst[:, :, :, :, :, :, 0].copy_(x)
        for t in range(1, tp):
            dst[:, :, :, :, :, :, t].copy_(dst[:, :, :, :, :, :, 0])
    else:
        dst.copy_(frames.reshape(f // tp, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8))


def normalize(rows: torch.Tensor, cfg) -> torch.Tensor:
    """uint8 rows -> float32 rows normalized as the torchvision backend normalizes: rescale folded
    into the mean and std (``mean / rescale``, ``std / rescale`` in float32), then subtract and
    divide per channel in float32."""
    c = cfg.in_channels
    mean = torch.tensor(cfg.image_mean, device=rows.device) * (1.0 / cfg.rescale_factor)
    std = torch.tensor(cfg.image_std, device=rows.device) * (1.0 / cfg.rescale_factor)
    x = rows.to(torch.float32).view(rows.shape[0], c, -1)
    return x.sub_(mean[:, None]).div_(std[:, None]).view(rows.shape)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside the block (None: left as they are)."""
    if n is None or n == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
