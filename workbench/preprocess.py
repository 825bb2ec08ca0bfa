"""CPU preprocessing into the Qwen2-VL / Qwen2.5-VL flat patch layout, as uint8.

`preprocess(inputs, cfg)` turns images and videos into a `PatchBatch`: one row per
`patch_size x patch_size` patch (times `temporal_patch_size` frames), laid out exactly as the
transformers Qwen2-VL image processor lays it out, but kept as uint8 so that normalization can
run on the device (`normalize=True` gives the legacy CPU-normalized float32 rows instead).

Layout of one item (image or video), with P = patch_size, T = temporal_patch_size, m = merge_size:

* the item is resized (PIL bicubic, uint8 RGB) to `smart_resize(h, w, factor=P*m, ...)`;
* grid_thw = [t, gh, gw] with gh = H'/P, gw = W'/P, and t = 1 for an image, frames/T for a video;
* rows are ordered (t, block_row, block_col, inner_row, inner_col) where a block is the m x m
  group of patches that the merger later fuses into one token ("merge-block-major");
* columns are ordered (C, T, ph, pw); for a still image both temporal copies are identical.

Inputs (see `preprocess` for the full list): PIL images, HxWx3 uint8 numpy arrays or torch
tensors (channels last), and videos as [T, H, W, 3] uint8 arrays/tensors or `Video(frames)`
(which also takes grey frames as one [T, H, W] array). An image file: `load_image(path)` reads it
as the RGB image preprocess makes of the PIL image it opens, EXIF orientation applied.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from . import limits
from .files import NotRegularFile, open_regular

__all__ = ["PatchBatch", "Video", "smart_resize", "preprocess", "load_image", "ACCEPTED_INPUTS"]

ACCEPTED_INPUTS = ("PIL.Image.Image", "numpy.ndarray uint8 [H, W, 3] (also [H, W], [H, W, 1], [H, W, 4])",
                   "torch.Tensor uint8 of the same shapes", "numpy/torch uint8 video [T, H, W, 3]",
                   "workbench.preprocess.Video(frames) (frames: a list of images, [T, H, W, C], "
                   "or grey [T, H, W])", "a list/tuple of any of these")

# Channel counts of a channels-last array: grey, RGB, RGBA. A 3-D array whose last axis is one of
# these is an image [H, W, C]; any other 3-D array is not, and may be grey video frames [T, H, W].
_CHANNELS = (1, 3, 4)

# PIL modes that hold 8-bit samples and convert to RGB the way transformers' convert_to_rgb does.
_PIL_MODES = ("1", "L", "P", "RGB", "RGBA", "LA", "PA", "RGBX", "RGBa", "CMYK", "YCbCr")

# The largest aspect ratio (long side / short side) Qwen2-VL's smart_resize accepts.
MAX_ASPECT = 200


# ---------------------------------------------------------------------------------------------
# PatchBatch
# ---------------------------------------------------------------------------------------------
@dataclass
class PatchBatch:
    """Flat patch rows of one or more items plus their [t, h, w] patch grids.

    pixels:   [N, patch_dim] (uint8 normally; float32 when normalized on the CPU)
    grid_thw: int64 [k, 3], one row per item, positive entries, sum(t*h*w) == N
    """

    pixels: torch.Tensor
    grid_thw: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.pixels, torch.Tensor) or not isinstance(self.grid_thw, torch.Tensor):
            raise TypeError(f"PatchBatch needs torch tensors, got pixels={type(self.pixels).__name__}, "
                            f"grid_thw={type(self.grid_thw).__name__}")
        if self.pixels.dim() != 2:
            raise ValueError(f"pixels must be 2-D [N, patch_dim], got shape {tuple(self.pixels.shape)}")
        g = self.grid_thw
        if g.dtype != torch.int64 or g.dim() != 2 or g.shape[1] != 3 or g.shape[0] < 1:
            raise ValueError(f"grid_thw must be int64 [k, 3] with k >= 1, got dtype {g.dtype} "
                             f"shape {tuple(g.shape)}")
        if bool((g <= 0).any()):
            raise ValueError(f"grid_thw entries must be positive, got {g.tolist()}")
        total = int(g.prod(dim=1).sum())
        if total != self.pixels.shape[0]:
            raise ValueError(f"grid_thw {g.tolist()} adds up to {total} rows (sum of t*h*w) but pixels "
                             f"has {self.pixels.shape[0]} rows")

    @property
    def n_items(self) -> int:
        return self.grid_thw.shape[0]

    @property
    def n_rows(self) -> int:
        return self.pixels.shape[0]

    def n_merged_tokens(self, merge_unit: int = 4) -> int:
        """Tokens after the merger fuses `merge_unit` rows (merge_size**2) into one."""
        merge_unit = limits.integer(merge_unit, "merge_unit")
        if self.n_rows % merge_unit:
            raise ValueError(f"{self.n_rows} rows are not a multiple of merge_unit={merge_unit}")
        return self.n_rows // merge_unit

    @property
    def item_rows(self) -> list[int]:
        """Rows of each item (t*h*w), in order."""
        return [int(v) for v in self.grid_thw.prod(dim=1).tolist()]

    @property
    def item_slices(self) -> list[slice]:
        """Row slice of each item in `pixels`."""
        out, start = [], 0
        for n in self.item_rows:
            out.append(slice(start, start + n))
            start += n
        return out

    def place_tokens(self, out: torch.Tensor, indices: Sequence[int], packed: torch.Tensor,
                     merge_unit: int = 4) -> None:
        """Scatter `packed` (the merged tokens of items `indices`, concatenated in that order)
        into `out` ([N / merge_unit, ...], item order) at each item's token rows."""
        slices, start = self.item_slices, 0
        for i in indices:
            first, k = slices[i].start // merge_unit, self.item_rows[i] // merge_unit
            out[first: first + k] = packed[start: start + k]
            start += k

    def to(self, device: Any) -> "PatchBatch":
        """Both tensors on `device` (a no-op copy-free view when already there)."""
        return PatchBatch(self.pixels.to(device), self.grid_thw.to(device))

    def select(self, indices: Sequence[int], copy: bool = True) -> "PatchBatch":
        """A new batch of the items `indices` (repeats allowed, negative indices count from the
        end), in that order; rows are copied. With ``copy=False``, a run of consecutive items in
        ascending order is a view of this batch's rows instead (no host copy: a 4096-token image
        is 19 MB), which keeps pinned memory pinned; other selections are still copied."""
        idx = [int(i) for i in (indices.tolist() if isinstance(indices, torch.Tensor) else indices)]
        if not idx:
            raise ValueError("select() needs at least one index (a PatchBatch holds at least one item)")
        k = self.n_items
        bad = [i for i in idx if not -k <= i < k]
        if bad:
            raise ValueError(f"item indices {bad} are out of range for a batch of {k} items")
        idx = [i % k for i in idx]
        slices = self.item_slices
        if not copy and idx == list(range(idx[0], idx[0] + len(idx))):
            return PatchBatch(self.pixels[slices[idx[0]].start:slices[idx[-1]].stop], self.grid_thw[idx])
        pixels = torch.cat([self.pixels[slices[i]] for i in idx], dim=0)  # always a fresh tensor
        return PatchBatch(pixels, self.grid_thw[idx].clone())

    def split(self) -> list["PatchBatch"]:
        """One single-item batch per item (rows copied)."""
        return [self.select([i]) for i in range(self.n_items)]

    @classmethod
    def cat(cls, batches: Sequence["PatchBatch"]) -> "PatchBatch":
        """Items of all `batches`, in order."""
        batches = list(batches)
        if not batches:
            raise ValueError("PatchBatch.cat needs at least one batch")
        dims = {b.pixels.shape[1] for b in batches}
        dtypes = {b.pixels.dtype for b in batches}
        if len(dims) > 1 or len(dtypes) > 1:
            raise ValueError(f"cannot cat batches with different patch_dim {sorted(dims)} or "
                             f"dtypes {sorted(map(str, dtypes))}")
        return cls(torch.cat([b.pixels for b in batches], dim=0),
                   torch.cat([b.grid_thw for b in batches], dim=0))


@dataclass
class Video:
    """A video given as a sequence of frames (each anything `preprocess` takes as an image, all
    the same size), or as one uint8 array/tensor [T, H, W, C], or [T, H, W] for grey frames.
    Wrapping frames in `Video` is what tells `preprocess` that a list of images is one video
    rather than a batch.

    A 3-D array is read as grey frames [T, H, W] only when its last axis is not a channel count
    (1, 3, 4): [30, 40, 3] is far more likely one RGB image than 30 frames 3 pixels wide, so that
    shape is an error with advice for both readings instead of a guess."""

    frames: Any

    def __post_init__(self) -> None:
        if isinstance(self.frames, (np.ndarray, torch.Tensor)):
            shape = tuple(self.frames.shape)
            if self.frames.ndim == 3 and shape[2] in _CHANNELS:
                raise ValueError(
                    f"Video frames as one array must be [T, H, W, C], got shape {shape}, which reads as one "
                    f"[H, W, C] image (last axis {shape[2]}); pass an image without Video(...), or, if these "
                    f"are {shape[0]} grey frames of {shape[1]}x{shape[2]} pixels, use Video(x[..., None])")
            if self.frames.ndim not in (3, 4):
                raise ValueError(f"Video frames as one array must be [T, H, W, C] (or [T, H, W] for grey "
                                 f"frames), got shape {shape}")
        elif isinstance(self.frames, (list, tuple)):
            self.frames = list(self.frames)
        else:
            raise TypeError(f"Video(frames) takes a list/tuple of frames or a [T, H, W, C] uint8 "
                            f"array/tensor, got {type(self.frames).__name__}")
        if len(self.frames) == 0:
            raise ValueError("Video has no frames")


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
def _composite_on_white(arr: np.ndarray) -> np.ndarray:
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


def _check_uint8(x: Any, what: str) -> None:
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
    _check_uint8(x, what)
    shape = tuple(x.shape)
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3:
        raise ValueError(f"{what} has shape {tuple(x.shape)}; an image is [H, W], [H, W, 1], "
                         f"[H, W, 3] or [H, W, 4] (channels last)")
    h, w, c = shape
    if c not in _CHANNELS:
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


def _check_image(x: Any, what: str) -> tuple[int, int]:
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


def _check_video(video: Any, what: str) -> tuple[Sequence, int, int]:
    """(frames, H, W) of a video ([T, H, W, C] array/tensor or Video): frames is a sequence whose
    entries are images (views of the array, or the Video's list), checked from shapes only."""
    frames = video.frames if isinstance(video, Video) else video
    if isinstance(frames, (np.ndarray, torch.Tensor)):
        _check_uint8(frames, what)
        shape = tuple(frames.shape)
        # grey frames [T, H, W] in a Video (Video has already rejected a last axis of 1/3/4): each
        # frame is then a 2-D grey image, converted exactly like one
        if not (len(shape) == 4 or (len(shape) == 3 and isinstance(video, Video))):
            raise ValueError(f"{what} has shape {shape}; a video array is [T, H, W, C]")
        if shape[0] == 0:
            raise ValueError(f"{what} has no frames (shape {shape})")
        if len(shape) == 4 and shape[3] not in _CHANNELS and shape[1] in _CHANNELS:
            # the per-frame error would suggest a per-frame transpose; the whole array needs one
            raise ValueError(f"{what} has shape {shape} with {shape[3]} channels; valid channel "
                             f"counts (last axis) are 1 (grey), 3 (RGB), 4 (RGBA) (it looks channels-first "
                             f"[T, C, H, W]: use x.transpose(0, 2, 3, 1) / x.permute(0, 2, 3, 1))")
        limits.check("frames", shape[0], f"{what} of {shape[0]} frames (shape {shape})")
        h, w = _check_image(frames[0], f"{what} frame 0")   # every frame has frame 0's shape
        return frames, h, w
    limits.check("frames", len(frames), f"{what} of {len(frames)} frames")
    sizes = [_check_image(f, f"{what} frame {i}") for i, f in enumerate(frames)]
    if len(set(sizes)) > 1:
        raise ValueError(f"{what} frames differ in size: {sorted(set(sizes))} (HxW); all frames must match")
    return frames, *sizes[0]


def _rgb_resized(x: Any, size: tuple[int, int], index: int, where: str) -> np.ndarray:
    """One checked image or frame -> HxWx3 uint8 at `size` (H, W), PIL bicubic."""
    h, w = size
    if isinstance(x, Image.Image):
        try:
            x.load()  # a truncated or corrupt file fails here, on first decode
        except MemoryError:
            raise
        except Exception as e:
            raise ValueError(f"item {index}: {where} could not be decoded ({type(e).__name__}: {e}); the "
                             f"file is truncated or corrupt: re-encode it or leave the item out") from e
        rgb = _pil_rgb(x)
        return np.asarray(rgb if rgb.size == (w, h) else rgb.resize((w, h), Image.Resampling.BICUBIC))
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    elif arr.shape[2] == 4:
        arr = _composite_on_white(arr)
    if arr.shape[:2] == (h, w):
        return arr
    return np.asarray(Image.fromarray(np.ascontiguousarray(arr)).resize((w, h), Image.Resampling.BICUBIC))


def _items(inputs: Any) -> list[tuple[str, Any]]:
    """Split the top-level input into ('image'|'video', obj) items."""
    def kind(x: Any) -> str:
        if isinstance(x, Video):
            return "video"
        if isinstance(x, (np.ndarray, torch.Tensor)) and x.ndim == 4:
            return "video"
        return "image"

    if isinstance(inputs, (list, tuple)):
        if len(inputs) == 0:
            raise ValueError("preprocess got an empty list; pass at least one image or video")
        limits.check("items", len(inputs), f"a list of {len(inputs)} items")
        for i, x in enumerate(inputs):
            if isinstance(x, (list, tuple)):
                raise TypeError(f"item {i} is a nested {type(x).__name__}; wrap the frames of a video "
                                f"in Video(frames), accepted: " + "; ".join(ACCEPTED_INPUTS))
        return [(kind(x), x) for x in inputs]
    return [(kind(inputs), inputs)]


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


# ---------------------------------------------------------------------------------------------
# patchify / normalize
# ---------------------------------------------------------------------------------------------
def _patchify(frames: np.ndarray, p: int, m: int, tp: int, out: np.ndarray) -> None:
    """[F, H, W, C] uint8 (F a multiple of tp, or 1 for a still image) -> its rows
    out [F/tp * gh * gw, C*tp*p*p] (written in place: the batch's rows are allocated once)."""
    f, h, w, c = frames.shape
    gh, gw = h // p, w // p
    gt = max(1, f // tp)
    # out viewed as (t, block_row, block_col, inner_row, inner_col, C, T, ph, pw)
    dst = out.reshape(gt, gh // m, gw // m, m, m, c, tp, p, p)
    if f == 1:  # a still image: both temporal copies are the frame itself
        x = frames.reshape(1, gh // m, m, p, gw // m, m, p, c).transpose(0, 1, 4, 2, 5, 7, 3, 6)
        dst[...] = x[:, :, :, :, :, :, None]
    else:
        dst[...] = frames.reshape(gt, tp, gh // m, m, p, gw // m, m, p, c).transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)


def _normalize_lut(cfg) -> np.ndarray:
    """[C, 256] float32: the transformers value of every uint8 level per channel: rescale in float64
    and cast to float32 (as its `rescale` does), then (x - mean) / std in float32."""
    levels = (np.arange(256, dtype=np.float64) * cfg.rescale_factor).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None]
    std = np.asarray(cfg.image_std, dtype=np.float32)[:, None]
    return (levels[None, :] - mean) / std


def normalize_rows(pixels: torch.Tensor, cfg) -> torch.Tensor:
    """uint8 [N, patch_dim] rows -> float32 rows normalized exactly as transformers' CPU processor
    (bit-identical: every output is a per-channel lookup of the uint8 level)."""
    if pixels.dtype != torch.uint8:
        raise ValueError(f"normalize_rows takes uint8 rows, got {pixels.dtype}")
    lut = torch.from_numpy(_normalize_lut(cfg))
    per = cfg.temporal_patch_size * cfg.patch_size ** 2
    channel = torch.arange(pixels.shape[1]) // per  # channel of column j is j // (T*P*P)
    return lut[channel[None, :], pixels.cpu().long()]


# ---------------------------------------------------------------------------------------------
# preprocess
# ---------------------------------------------------------------------------------------------
def preprocess(images_or_videos: Any, cfg, normalize: bool = False) -> PatchBatch:
    """Images and/or videos -> `PatchBatch` in the transformers Qwen2-VL layout (module docstring).

    cfg: a VisionConfig or a preset name (as `build_encoder` takes).

    Accepted inputs: one item or a list/tuple of items, where an item is
      * an image: a PIL.Image, or a uint8 numpy array / torch tensor, channels last, shaped
        [H, W, 3] (RGB), [H, W] or [H, W, 1] (grey), or [H, W, 4] (RGBA);
      * a video: a uint8 numpy array / torch tensor [T, H, W, C] (C as for images), or
        `Video(frames)` with such an array, grey frames [T, H, W] (when W is not 1, 3 or 4), or a
        list of images (all the same size). A plain 3-D array is always an image, and a plain list of images is a
        batch of images, never a video. T must be a multiple of cfg.temporal_patch_size (2):
        an odd frame count is a ValueError, drop the last frame or repeat it yourself.
    Colour conversions, chosen to give the same pixels as transformers' `convert_to_rgb`:
      * grey (2-D arrays, [H, W, 1], PIL "L"/"1") becomes RGB by repeating the channel;
      * transparency is composited onto a white background: for arrays [H, W, 4] in float64,
        a*rgb + (1-a)*255 with a = alpha/255, rounded half-to-even; for PIL images with an alpha
        band or a "transparency" entry (RGBA, LA, PA, P with transparency) via PIL's
        `alpha_composite` on white (the two paths agree on all 256 x 256 (value, alpha) pairs);
      * other 8-bit PIL modes (P, CMYK, YCbCr, RGBX, ...) use `Image.convert("RGB")`;
        16-bit / float PIL modes ("I", "I;16", "F") are a ValueError.
    Every item is resized with PIL bicubic to smart_resize(h, w, patch_size * merge_size,
    cfg.min_pixels, cfg.max_pixels) (small images are upscaled; a side of 0 or an aspect ratio above
    200 is a ValueError). Video frames all get the size smart_resize gives for the frame size
    (transformers' video processor differs: torchvision resize and its own size rule).

    Returns uint8 pixels, or with `normalize=True` float32 pixels equal to transformers' default
    (rescale + normalize) output. grid_thw is [1, gh, gw] per image and [T/2, gh, gw] per video.

    Caps (workbench.limits), all checked from shapes before any pixel is converted: items per call
    (`items`), frames per video (`frames`), pixels of each decoded image or frame (`input_pixels`),
    patch rows of each item after resizing (`item_rows`) and of the batch (`batch_rows`). A PIL
    image whose file is truncated or corrupt is a ValueError naming the item.
    """
    from .config import VisionConfig
    cfg = VisionConfig.coerce(cfg)  # a preset name, as build_encoder takes
    if cfg.in_channels != 3:
        raise ValueError(f"preprocess makes RGB rows; cfg.in_channels={cfg.in_channels} "
                         f"is not supported (must be 3)")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {normalize!r}")
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    factor = p * m
    # every item checked and sized from its shape first: no pixel is converted before the whole
    # batch is known to fit its caps
    plans = []
    for i, (kind, x) in enumerate(_items(images_or_videos)):
        what = f"{kind} {i}"
        if kind == "image":
            frames, (h, w) = [x], _check_image(x, what)
        else:
            frames, h, w = _check_video(x, what)
            if len(frames) % tp:
                raise ValueError(
                    f"{what} has {len(frames)} frames, not a multiple of temporal_patch_size={tp} "
                    f"(an odd frame count); drop the last frame or repeat it to make it even")
        th, tw = smart_resize(h, w, factor, cfg.min_pixels, cfg.max_pixels)
        grid = [1 if kind == "image" else len(frames) // tp, th // p, tw // p]
        limits.check("item_rows", math.prod(grid), f"patch rows of {what} ({len(frames)} frame(s) of {h}x{w} "
                                                   f"resized to {th}x{tw}, grid t x h x w = {grid})")
        plans.append((i, kind, frames, (th, tw), grid))
    total = limits.check("batch_rows", sum(math.prod(g) for *_, g in plans),
                         f"patch rows of the batch ({len(plans)} items)")
    pixels, start = np.empty((total, cfg.patch_dim), np.uint8), 0
    for i, kind, frames, size, grid in plans:
        resized = np.empty((len(frames), *size, 3), np.uint8)
        for j, frame in enumerate(frames):
            resized[j] = _rgb_resized(frame, size, i, "the image" if kind == "image" else f"frame {j} of the video")
        _patchify(resized, p, m, tp, pixels[start:start + math.prod(grid)])
        start += math.prod(grid)
    batch = PatchBatch(torch.from_numpy(pixels), torch.tensor([g for *_, g in plans], dtype=torch.int64))
    if normalize:
        batch = PatchBatch(normalize_rows(batch.pixels, cfg), batch.grid_thw)
    return batch
