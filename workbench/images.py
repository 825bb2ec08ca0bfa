"""One image in, RGB uint8 out, as transformers' Qwen2-VL processor makes it: the checks made
from an image's type, dtype and shape, the conversion to RGB, the PIL bicubic resize to
`smart_resize`'s size (bilinear where the family's processor resamples so: Gemma-3), and
`load_image` for image files."""
from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from . import limits
from .files import NotRegularFile, open_regular

ACCEPTED_INPUTS = ("PIL.Image.Image", "numpy.ndarray uint8 [H, W, 3] (also [H, W], [H, W, 1], [H, W, 4])",
                   "torch.Tensor uint8 of the same shapes", "numpy/torch uint8 video [T, H, W, 3]",
                   "workbench.preprocess.Video(frames) (frames: a list of images, [T, H, W, C], "
                   "or grey [T, H, W])", "a list/tuple of any of these")

# Channel counts of a channels-last array: grey, RGB, RGBA. A 3-D array whose last axis is one of
# these is an image [H, W, C]; any other 3-D array is not, and may be grey video frames [T, H, W].
CHANNELS = (1, 3, 4)

# PIL modes that hold 8-bit samples and convert to RGB the way transformers' convert_to_rgb does.
_PIL_MODES = ("1", "L", "P", "RGB", "RGBA", "LA", "PA", "RGBX", "RGBa", "CMYK", "YCbCr")

# The largest aspect ratio (long side / short side) Qwen2-VL's smart_resize accepts.
MAX_ASPECT = 200


# ---------------------------------------------------------------------------------------------
# smart_resize
# ---------------------------------------------------------------------------------------------
def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """The Qwen2-VL target size for an image of `height` x `width` pixels.

    Each side is rounded to the nearest multiple of `factor` (Python `round`, half to even). If the
    area then exceeds `max_pixels`, both sides are scaled by sqrt(area / max_pixels) and floored to
    a multiple of `factor` (never below `factor`); if it is below `min_pixels`, both sides are
    scaled up by sqrt(min_pixels / area) and ceiled. An aspect ratio above 200 is a ValueError.
    Gives the same numbers as transformers' Qwen2-VL `smart_resize`.
    """
    for name, v in (("height", height), ("width", width), ("factor", factor),
                    ("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"smart_resize: {name}={v!r} must be a positive integer")
    if min_pixels > max_pixels:
        raise ValueError(f"smart_resize: min_pixels={min_pixels} exceeds max_pixels={max_pixels}")
    height, width = int(height), int(width)
    _check_aspect(height, width)
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        scale = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    return h, w


def longest_edge_resize(height: int, width: int, factor: int, longest_edge: int) -> tuple[int, int]:
    """Pixtral's target size (transformers' `get_resize_output_image_size` with the patch size its
    PixtralProcessor passes, patch_size * spatial_merge_size): an image larger than a
    `longest_edge` box is shrunk by max(h, w) / longest_edge, each side floored; then each side is
    rounded up to a multiple of `factor`. Small images are not enlarged; no aspect limit (a side
    that shrinks to 0 pixels is a ValueError: the processor would resize to nothing)."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
    if height < 1 or width < 1:
        raise ValueError(f"image shrinks to {height}x{width} pixels inside a {longest_edge} px box: one side is "
                         f"more than {longest_edge} times the other")
    return -(-height // factor) * factor, -(-width // factor) * factor


def target_size(height: int, width: int, cfg) -> tuple[int, int]:
    """The size ``cfg``'s processor resizes an image or frame of `height` x `width` to: the
    longest-edge rule where the family bounds each side (`VisionConfig.longest_edge`, its box side
    capped at isqrt(max_pixels)), else `smart_resize` with factor patch_size * merge_size."""
    factor = cfg.patch_size * cfg.merge_size
    if cfg.longest_edge:
        return longest_edge_resize(height, width, factor, min(cfg.longest_edge, math.isqrt(cfg.max_pixels)))
    return smart_resize(height, width, factor, cfg.min_pixels, cfg.max_pixels)


def _check_aspect(height: int, width: int) -> None:
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT:
        raise ValueError(f"image of {height}x{width} (HxW) has aspect ratio {ratio:.1f}; "
                         f"Qwen2-VL accepts at most {MAX_ASPECT}")


# ---------------------------------------------------------------------------------------------
# input checks (from shapes and metadata only) and conversion (one frame at a time)
# ---------------------------------------------------------------------------------------------
# Every item is checked from its shape before any pixel is converted, so that an input too large
# for its caps fails before it costs memory, and conversion then holds one full-size frame at a
# time: each frame is made RGB and resized on its own, straight into the item's resized array.
def composite_on_white(arr: np.ndarray) -> np.ndarray:
    """HxWx4 uint8 -> HxWx3 uint8, alpha-blended onto white, rounded half to even (the float64
    arithmetic transformers uses for arrays). Blended a band of rows at a time: the float64
    temporaries of a whole large frame would be many times its size."""
    out = np.empty((*arr.shape[:2], 3), np.uint8)
    step = max(1, (1 << 20) // arr.shape[1])
    for r in range(0, arr.shape[0], step):
        band = arr[r:r + step]
        a = band[..., 3:4] / 255.0
        out[r:r + step] = np.round(a * band[..., :3] + (1.0 - a) * 255.0)
    return out


def _check_pil(img: Image.Image, what: str) -> tuple[int, int]:
    """(H, W) of a PIL image whose mode preprocess takes (nothing is decoded)."""
    if img.mode not in _PIL_MODES:
        raise ValueError(f"PIL image mode {img.mode!r} is not supported (not 8 bits per sample); valid "
                         f"modes: {', '.join(_PIL_MODES)}. Convert it to 8-bit RGB yourself first "
                         f"(e.g. scale 16-bit/float data to 0..255 and use Image.fromarray(uint8_array))")
    w, h = img.size
    return h, w


def _pil_rgb(img: Image.Image) -> Image.Image:
    """The RGB image transformers' convert_to_rgb makes (transparency composited on white)."""
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def check_uint8(x: Any, what: str) -> None:
    """A numpy array or torch tensor must hold uint8 (checked from its dtype, nothing copied)."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool:
            raise ValueError(f"{what} has dtype bool (torch.bool); images must be uint8 0..255 "
                             f"(for a mask use mask.to(torch.uint8) * 255)")
        if x.dtype != torch.uint8:
            raise ValueError(f"{what} is a torch tensor of dtype {x.dtype}; pass uint8 0..255"
                             + (" (for floats in 0..1 use (x * 255).round().to(torch.uint8))"
                                if x.is_floating_point() else ""))
        return
    if x.dtype == np.uint8:
        return
    if x.dtype == np.bool_:
        raise ValueError(f"{what} has dtype bool; images must be uint8 0..255 "
                         f"(for a mask use mask.astype(np.uint8) * 255)")
    hint = (" (for floats in 0..1 use (x * 255).round().astype(np.uint8))"
            if np.issubdtype(x.dtype, np.floating) else "")
    raise ValueError(f"{what} has dtype {x.dtype}; pass uint8 0..255{hint}")


def _check_array_image(x: Any, what: str) -> tuple[int, int]:
    """(H, W) of an image array/tensor (HxW, HxWx1, HxWx3, HxWx4, uint8, channels last)."""
    check_uint8(x, what)
    shape = tuple(x.shape)
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3:
        raise ValueError(f"{what} has shape {tuple(x.shape)}; an image is [H, W], [H, W, 1], "
                         f"[H, W, 3] or [H, W, 4] (channels last)")
    h, w, c = shape
    if c not in CHANNELS:
        raise ValueError(f"{what} has shape {shape} with {c} channels; valid channel "
                         f"counts (last axis) are 1 (grey), 3 (RGB), 4 (RGBA)" + _layout_hint(shape))
    return h, w


def _layout_hint(shape: tuple[int, ...]) -> str:
    """Advice for a 3-D array [a, b, c] whose last axis is not a channel count. Each suggestion
    must give the intended pixels when followed, so the readings are spelled out: a channels-first
    image (only when `a` is a channel count; for 4 say that alpha is composited on white, since
    a [4, H, W] array may just as well be 4 grey frames, and transposing those would silently make
    an RGBA image of them), and grey video frames [T, H, W], which `Video(x)` takes as they are."""
    a = shape[0]
    first = {1: "grey", 3: "RGB", 4: "RGBA"}
    parts = []
    if a in first:
        parts.append(f"a channels-first {first[a]} image [C, H, W]: use x.transpose(1, 2, 0) / x.permute(1, 2, 0)"
                     + (", and its alpha is composited on white" if a == 4 else ""))
    parts.append(f"{a} grey video frames [T, H, W]: wrap it as Video(x)")
    return " (if it is " + "; if it is ".join(parts) + ")"


def check_image(x: Any, what: str) -> tuple[int, int]:
    """(H, W) of one image or frame, every check made from its type, dtype and shape."""
    if isinstance(x, Image.Image):
        h, w = _check_pil(x, what)
    elif isinstance(x, (np.ndarray, torch.Tensor)):
        h, w = _check_array_image(x, what)
    else:
        raise TypeError(f"{what} has unsupported type {type(x).__module__}.{type(x).__name__}; accepted: "
                        + "; ".join(ACCEPTED_INPUTS))
    if h == 0 or w == 0:
        raise ValueError(f"{what} has zero size: {h}x{w} (HxW)")
    limits.check("input_pixels", h * w, f"{what} of {h}x{w} (HxW) pixels")
    return h, w


def _loaded_pil(x: Image.Image, index: int, where: str) -> Image.Image:
    """``x`` with its pixels decoded: a truncated or corrupt file fails here, on first decode,
    with a ValueError naming the item."""
    try:
        x.load()
    except MemoryError:
        raise
    except Exception as e:
        raise ValueError(f"item {index}: {where} could not be decoded ({type(e).__name__}: {e}); the "
                         f"file is truncated or corrupt: re-encode it or leave the item out") from e
    return x


def decoded_rgb(x: Image.Image, index: int, where: str) -> Image.Image:
    """A PIL image item decoded (a truncated or corrupt file is a ValueError naming item
    ``index`` and ``where`` in it) and made RGB as transformers' convert_to_rgb makes it."""
    return _pil_rgb(_loaded_pil(x, index, where))


# the processors' resampling filters by name (`Family.resample`)
RESAMPLING = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}


def rgb_resized(x: Any, size: tuple[int, int], index: int, where: str, resample: str = "bicubic",
                crop: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """One checked image or frame (`check_image`) -> HxWx3 uint8 at `size` (H, W), PIL ``resample``
    (a key of RESAMPLING; bicubic by default, Gemma-3's processor bilinear); ``crop`` (top, left,
    bottom, right): that part of the RGB image only (Gemma-3's pan-and-scan crops). ``index`` and
    ``where`` name it in an error."""
    h, w = size
    filt = RESAMPLING[resample]
    if isinstance(x, Image.Image):
        rgb = decoded_rgb(x, index, where)
        if crop is not None:
            top, left, bottom, right = crop
            rgb = rgb.crop((left, top, right, bottom))
        return np.asarray(rgb if rgb.size == (w, h) else rgb.resize((w, h), filt))
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    elif arr.shape[2] == 4:
        arr = composite_on_white(arr)
    if crop is not None:
        top, left, bottom, right = crop
        arr = arr[top:bottom, left:right]
    if arr.shape[:2] == (h, w):
        return arr
    return np.asarray(Image.fromarray(np.ascontiguousarray(arr)).resize((w, h), filt))


# ---------------------------------------------------------------------------------------------
# image files
# ---------------------------------------------------------------------------------------------
# Every path that reads an image file (a folder mix, its check before a sweep) reads it here, so
# the pixels and sizes it sees are the ones preprocess makes of the PIL image the file opens as.
def _open_regular(name: str):
    """``name`` opened for binary reading where it is a regular file or a link to one
    (`workbench.files.open_regular`); otherwise nothing is opened: FileNotFoundError for a missing
    path, ValueError naming what it is."""
    try:
        return open_regular(name)
    except NotRegularFile as e:
        raise ValueError(f"{name}: {e.kind}, not an image file; valid: a regular file or a symbolic link to "
                         f"one") from None


def _open_pil(f, name: str) -> Image.Image:
    """The PIL image of the open file ``f`` (header only), or ValueError naming the file."""
    try:
        return Image.open(f)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - PIL raises many types for a file it cannot identify
        # UnidentifiedImageError's own message only repeats the file's name
        why = type(e).__name__ if isinstance(e, UnidentifiedImageError) else f"{type(e).__name__}: {e}"
        raise ValueError(f"{name}: not an image file PIL can open ({why})") from e


def _check_header(img: Image.Image, name: str) -> None:
    """The checks preprocess makes of a PIL image (mode, pixel cap, aspect ratio), from the
    file's header, each message behind the file's name."""
    try:
        h, w = _check_pil(img, name)
        _check_aspect(h, w)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    limits.check("input_pixels", h * w, f"{name}: an image of {h}x{w} (HxW) pixels")


def _decoded(img: Image.Image, name: str) -> Image.Image:
    """``img`` decoded in full and turned as its EXIF orientation says. The orientation is read
    after decoding: a PNG may keep its EXIF chunk after the pixel data, which PIL reads only then."""
    try:
        img.load()  # a truncated or corrupt file fails here, on first decode
        return ImageOps.exif_transpose(img)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - PIL raises many types for a file it cannot decode
        raise ValueError(f"{name} could not be decoded ({type(e).__name__}: {e}); the file is truncated or "
                         f"corrupt: re-encode it or leave it out") from e


def load_image(path, reduce_to: tuple[int, int] | None = None) -> Image.Image:
    """The image file ``path`` as the RGB PIL image `preprocess` makes of it: the same modes
    refused with the same message, transparency composited onto white the same way, and its EXIF
    orientation applied, from wherever the file keeps it (as transformers' ``load_image`` does), so
    its size (W, H) is the size as shown.

    Refused, the message naming the file: a path that is not a regular file (or a link to one),
    with nothing opened (ValueError; FileNotFoundError where it is missing); a file PIL cannot
    open, a mode preprocess refuses ("I", "I;16", "F", ...) or an aspect ratio above MAX_ASPECT
    (ValueError); more pixels than the ``input_pixels`` cap (LimitError, from the header, before
    any decoding); a truncated or corrupt file (ValueError: every pixel is decoded here).

    reduce_to: (H, W) the caller will resize the image to. A JPEG is then decoded at the
    smallest of its scales (1, 1/2, 1/4, 1/8) that still holds that size either way up (PIL
    draft): several times faster for a phone photo, with pixels that differ from a full decode's.
    None: the full image.
    """
    name = os.fspath(path)
    with _open_regular(name) as f, warnings.catch_warnings():
        # the input_pixels cap is the guard against huge images; PIL's own warning would repeat it
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img = _open_pil(f, name)
        _check_header(img, name)
        if reduce_to is not None:
            # square, since whether the image is turned is known only once it is decoded
            img.draft(None, (max(reduce_to),) * 2)
        img = _decoded(img, name)
    return _pil_rgb(img)


