"""CPU preprocessing into the Qwen2-VL / Qwen2.5-VL flat patch layout, as uint8.

`preprocess(inputs, cfg)` turns images and videos into a `PatchBatch`: one row per
`patch_size x patch_size` patch (times `temporal_patch_size` frames), laid out exactly as the
transformers Qwen2-VL image processor lays it out, but kept as uint8 so that normalization can
run on the device (`normalize=True` gives the legacy CPU-normalized float32 rows instead).

Layout of one item (image or video), with P = patch_size, T = temporal_patch_size, m = merge_size:

* the item is resized (PIL bicubic, uint8 RGB) to `smart_resize(h, w, factor=P*m, ...)` (Pixtral's
  processor: its longest-edge rule, `images.target_size`; a family whose processor sizes its own
  way: `Family.resize`, with its filter, `Family.resample`: Gemma-3's fixed 896 x 896, bilinear);
* grid_thw = [t, gh, gw] with gh = H'/P, gw = W'/P, and t = 1 for an image, frames/T for a video;
* rows are ordered (t, block_row, block_col, inner_row, inner_col) where a block is the m x m
  group of patches that the merger later fuses into one token ("merge-block-major");
* columns are ordered (C, T, ph, pw); for a still image both temporal copies are identical.

Inputs (see `preprocess` for the full list): PIL images, HxWx3 uint8 numpy arrays or torch
tensors (channels last), and videos as [T, H, W, 3] uint8 arrays/tensors or `Video(frames)`
(which also takes grey frames as one [T, H, W] array). An image file: `load_image(path)` reads it
as the RGB image preprocess makes of the PIL image it opens, EXIF orientation applied.

One image's checks, RGB conversion and resize live in `workbench.images`; the rows, `PatchBatch`
and the patchify, in `workbench.patches`.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from . import limits
from .images import ACCEPTED_INPUTS, CHANNELS, MAX_ASPECT, check_image, check_uint8, smart_resize  # noqa: F401
from .images import load_image, rgb_resized, target_size  # noqa: F401
from .patches import PatchBatch, normalize_rows, patchify_array  # noqa: F401
from .devices import resolve_device
from .torch_images import frames_nchw, hwc_rgb, patchify, resize, torch_threads
from .torch_images import normalize as normalize_tv
from .vocabulary import PREPROCESS_BACKENDS, check_backend  # noqa: F401

__all__ = ["PatchBatch", "Video", "smart_resize", "preprocess", "load_image", "ACCEPTED_INPUTS"]


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
            if self.frames.ndim == 3 and shape[2] in CHANNELS:
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


def _check_video(video: Any, what: str) -> tuple[Sequence, int, int]:
    """(frames, H, W) of a video ([T, H, W, C] array/tensor or Video): frames is a sequence whose
    entries are images (views of the array, or the Video's list), checked from shapes only."""
    frames = video.frames if isinstance(video, Video) else video
    if isinstance(frames, (np.ndarray, torch.Tensor)):
        check_uint8(frames, what)
        shape = tuple(frames.shape)
        # grey frames [T, H, W] in a Video (Video has already rejected a last axis of 1/3/4): each
        # frame is then a 2-D grey image, converted exactly like one
        if not (len(shape) == 4 or (len(shape) == 3 and isinstance(video, Video))):
            raise ValueError(f"{what} has shape {shape}; a video array is [T, H, W, C]")
        if shape[0] == 0:
            raise ValueError(f"{what} has no frames (shape {shape})")
        if len(shape) == 4 and shape[3] not in CHANNELS and shape[1] in CHANNELS:
            # the per-frame error would suggest a per-frame transpose; the whole array needs one
            raise ValueError(f"{what} has shape {shape} with {shape[3]} channels; valid channel "
                             f"counts (last axis) are 1 (grey), 3 (RGB), 4 (RGBA) (it looks channels-first "
                             f"[T, C, H, W]: use x.transpose(0, 2, 3, 1) / x.permute(0, 2, 3, 1))")
        limits.check("frames", shape[0], f"{what} of {shape[0]} frames (shape {shape})")
        h, w = check_image(frames[0], f"{what} frame 0")   # every frame has frame 0's shape
        return frames, h, w
    limits.check("frames", len(frames), f"{what} of {len(frames)} frames")
    sizes = [check_image(f, f"{what} frame {i}") for i, f in enumerate(frames)]
    if len(set(sizes)) > 1:
        raise ValueError(f"{what} frames differ in size: {sorted(set(sizes))} (HxW); all frames must match")
    return frames, *sizes[0]


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
# preprocess
# ---------------------------------------------------------------------------------------------
def preprocess(images_or_videos: Any, cfg, normalize: bool = False, backend: str = "pil",
               threads: int | None = None, device: Any = None, pan_and_scan: bool = False) -> PatchBatch:
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
    200 is a ValueError); a family whose processor bounds each side instead (Pixtral,
    `VisionConfig.longest_edge`) gets its rule, `images.target_size`, and one whose processor pads
    its own way gets that (`Family.resize`; Kimi-K2.5: its navit_resize, then zeros at the bottom and
    right up to multiples of patch_size * merge_size); a family may cut a video into several items
    (`Family.video_chunks`; Kimi-K2.5: chunks of 4 frames). Video frames all get the size the rule
    gives for the frame size (transformers' video processor differs: torchvision resize and its own
    size rule).

    A family whose processor resamples otherwise says so (`Family.resample`; Gemma-3: bilinear, to
    its fixed size).

    pan_and_scan: Gemma-3's processor option (``do_pan_and_scan``, off by default there too): each
    image that is wide or tall enough is followed by its crops (`Family.crops`), each cut from the RGB
    image and resized as an image of its own, one item each (transformers' order: the image, then its
    crops row by row). A ValueError for a family whose processor has no such option.

    Returns uint8 pixels, or with `normalize=True` float32 pixels equal to transformers' default
    (rescale + normalize) output. grid_thw is [1, gh, gw] per image and [T/2, gh, gw] per video.

    backend (`PREPROCESS_BACKENDS`; every backend gives the same grids and row layout):
      * ``"pil"``: transformers' PIL processors, bit for bit (the colour rules and PIL resize above);
      * ``"torchvision"``: transformers' torchvision-backed processors (its default wherever
        torchvision is installed, and what vLLM runs), in torch alone: torch's native uint8
        antialiased bicubic on the CPU, its RGBA compositing and fused normalization
        (`workbench.torch_images`). Close to ``"pil"``, not equal (README, "Preprocessing
        backends", for the measured differences);
      * ``"cuda"``: the torchvision path on a device (``device``: 'auto'/None = CUDA where there is
        one, else the CPU, where it emulates the device's float arithmetic): the host hands the
        decoded uint8 image over and the device converts, resizes (float32, clamped and rounded),
        patchifies and, with ``normalize=True``, normalizes. The rows stay on that device.
    threads: host threads the backend may use (1 .. the cores this process may run on; None: the
    PIL backend one, the others torch's current intra-op count). The PIL backend resizes that many
    items at once; the torchvision one sets torch's intra-op threads for the call.

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
    backend = check_backend(backend)
    if threads is not None:
        threads = limits.within_cores(limits.integer(threads, "threads"), "threads")
    if not isinstance(pan_and_scan, bool):
        raise TypeError(f"pan_and_scan must be a bool, got {pan_and_scan!r}")
    if pan_and_scan and cfg.spec.crops(cfg, 1, 1) is None:
        raise ValueError(f"pan_and_scan=True: the {cfg.family} processor cuts no crops (Gemma-3's does)")
    if device is not None and backend != "cuda":
        raise ValueError(f"device={device!r} is for backend 'cuda' (the host backends run on the CPU); "
                         f"got backend {backend!r}")
    dev = resolve_device(device) if backend == "cuda" else torch.device("cpu")
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    # every item checked and sized from its shape first: no pixel is converted before the whole
    # batch is known to fit its caps
    plans = []
    for i, (kind, x) in enumerate(_items(images_or_videos)):
        what = f"{kind} {i}"
        crops = [None]                  # the whole image, then pan-and-scan's crops
        if kind == "image":
            frames, (h, w) = [x], check_image(x, what)
            chunks = [frames]
            if pan_and_scan:
                crops += cfg.spec.crops(cfg, h, w)
        else:
            frames, h, w = _check_video(x, what)
            if len(frames) % tp:
                raise ValueError(
                    f"{what} has {len(frames)} frames, not a multiple of temporal_patch_size={tp} "
                    f"(an odd frame count); drop the last frame or repeat it to make it even")
            chunks = [frames[r.start:r.stop] for r in cfg.spec.video_chunks(cfg, len(frames))]
        for crop in crops:
            ch, cw = (h, w) if crop is None else (crop[2] - crop[0], crop[3] - crop[1])
            sizes = cfg.spec.resize(cfg, kind, ch, cw)
            (th, tw), (ph, pw) = sizes if sizes is not None else (target_size(ch, cw, cfg),) * 2
            for chunk in chunks:
                grid = [1 if kind == "image" else len(chunk) // tp, ph // p, pw // p]
                limits.check("item_rows", math.prod(grid), f"patch rows of {what} ({len(chunk)} frame(s) of "
                                                           f"{ch}x{cw} resized to {th}x{tw}, grid t x h x w = {grid})")
                plans.append((i, kind, chunk, ((th, tw), (ph, pw)), grid, crop))
    total = limits.check("batch_rows", sum(math.prod(g) for *_, g, _ in plans),
                         f"patch rows of the batch ({len(plans)} items)")
    starts = np.cumsum([0] + [math.prod(g) for *_, g, _ in plans]).tolist()
    grid_thw = torch.tensor([g for *_, g, _ in plans], dtype=torch.int64)
    resample = cfg.spec.resample
    if backend == "pil":
        pixels = np.empty((total, cfg.patch_dim), np.uint8)

        def one(k: int) -> None:
            i, kind, frames, (size, padded), grid, crop = plans[k]
            resized = (np.empty if size == padded else np.zeros)((len(frames), *padded, 3), np.uint8)
            for j, frame in enumerate(frames):
                resized[j, :size[0], :size[1]] = rgb_resized(frame, size, i, _where(kind, j), resample, crop)
            patchify_array(resized, p, m, tp, pixels[starts[k]:starts[k + 1]])

        _each(one, len(plans), threads or 1)
        rows = torch.from_numpy(pixels)
        return PatchBatch(normalize_rows(rows, cfg) if normalize else rows, grid_thw)
    rows = torch.empty((total, cfg.patch_dim), dtype=torch.uint8, device=dev)
    with torch_threads(threads):
        for k, (i, kind, frames, (size, padded), grid, crop) in enumerate(plans):
            item = frames_nchw([_cropped(hwc_rgb(f, i, _where(kind, j)), crop) for j, f in enumerate(frames)], dev)
            item = resize(item, size, float_path=backend == "cuda", mode=resample)
            if size != padded:      # zeros at the bottom and right (Kimi-K2.5's processor)
                item = torch.nn.functional.pad(item, (0, padded[1] - size[1], 0, padded[0] - size[0]))
            patchify(item, p, m, tp, rows[starts[k]:starts[k + 1]])
        return PatchBatch(normalize_tv(rows, cfg) if normalize else rows, grid_thw)


def _cropped(frame: torch.Tensor, crop: tuple[int, int, int, int] | None) -> torch.Tensor:
    """[H, W, 3] -> the (top, left, bottom, right) part of it (a view), or the frame (None)."""
    return frame if crop is None else frame[crop[0]:crop[2], crop[1]:crop[3]]


def _where(kind: str, j: int) -> str:
    return "the image" if kind == "image" else f"frame {j} of the video"


def _each(fn, n: int, threads: int) -> None:
    """fn(0) .. fn(n - 1), on ``threads`` threads at once (PIL's resize releases the GIL)."""
    if threads == 1 or n == 1:
        for k in range(n):
            fn(k)
        return
    with ThreadPoolExecutor(min(threads, n)) as pool:
        for f in [pool.submit(fn, k) for k in range(n)]:
            f.result()
