"""Real photos shipped inside installed packages (nothing is downloaded), a video panned over
one, and uniform-noise images.

Photos (RGB, size as HxW):
    astronaut     512x512   scikit-image  skimage.data.astronaut()
    chelsea       300x451   scikit-image  skimage.data.chelsea()
    coffee        400x600   scikit-image  skimage.data.coffee()
    rocket        427x640   scikit-image  skimage.data.rocket()
    grace_hopper  600x512   matplotlib    cbook.get_sample_data("grace_hopper.jpg")
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
from PIL import Image

from . import limits


SAMPLE_NAMES = ("astronaut", "chelsea", "coffee", "rocket", "grace_hopper")


def _load_skimage(name: str) -> np.ndarray:
    from skimage import data
    return getattr(data, name)()


def _load_grace_hopper() -> np.ndarray:
    from matplotlib import cbook
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        return np.asarray(Image.open(f).convert("RGB"))


_LOADERS = {
    "astronaut": lambda: _load_skimage("astronaut"),
    "chelsea": lambda: _load_skimage("chelsea"),
    "coffee": lambda: _load_skimage("coffee"),
    "rocket": lambda: _load_skimage("rocket"),
    "grace_hopper": _load_grace_hopper,
}


@functools.lru_cache(maxsize=None)
def _load(name: str) -> np.ndarray | Exception:
    """The photo as a read-only HxWx3 uint8 array, or the exception that stopped loading it."""
    try:
        arr = np.ascontiguousarray(_LOADERS[name](), dtype=np.uint8)
    except Exception as e:  # a package without the file: report it, do not crash the caller
        return e
    if arr.ndim != 3 or arr.shape[2] != 3:
        return ValueError(f"{name} loaded with shape {arr.shape}, expected HxWx3")
    arr.setflags(write=False)
    return arr


def sample_images(names=None) -> dict[str, Image.Image]:
    """{name: RGB PIL image} for `names` (default: every sample in SAMPLE_NAMES that loads).

    An unknown name is a ValueError listing the valid ones. With names=None a sample whose file is
    missing from the installed packages is skipped with a warning listing it and why; a missing
    sample that was asked for by name is a FileNotFoundError.
    """
    asked = names is not None
    if names is None:
        names = SAMPLE_NAMES
    elif isinstance(names, str):
        names = [names]
    names = list(names)
    unknown = [n for n in names if n not in _LOADERS]
    if unknown:
        raise ValueError(f"unknown sample image(s) {unknown}; valid: {', '.join(SAMPLE_NAMES)}")
    out, missing = {}, {}
    for n in names:
        arr = _load(n)
        if isinstance(arr, Exception):
            missing[n] = f"{type(arr).__name__}: {arr}"
        else:
            out[n] = Image.fromarray(arr.copy())
    if missing:
        listing = "; ".join(f"{k} ({v})" for k, v in missing.items())
        if asked:
            raise FileNotFoundError(f"sample image(s) not available in the installed packages: {listing}")
        warnings.warn(f"skipping sample image(s) missing from the installed packages: {listing}",
                      stacklevel=2)
    return out


def sample_video(n_frames: int = 4, size: tuple[int, int] = (224, 308), name: str = "coffee",
                 step: int = 8) -> np.ndarray:
    """A pan over a real photo: uint8 [n_frames, H, W, 3] with (H, W) = size.

    Frame i is the HxW crop at row offset (centred) and column offset x0 + i*step of photo `name`;
    the photo is first upscaled (PIL bicubic) if it is too small to hold the whole pan. Capped
    (workbench.limits): n_frames by `frames`, H*W and the upscaled photo by `input_pixels`, the
    whole clip by `total_pixels`.
    """
    n_frames = limits.integer(n_frames, "n_frames", cap="frames")
    if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2:
        raise ValueError(f"size={size!r} must be two positive sides (H, W)")
    h, w = (limits.integer(v, f"size[{i}]") for i, v in enumerate(size))
    step = limits.integer(step, "step", minimum=0)
    limits.check("input_pixels", h * w, f"sample_video frames of {h}x{w} (HxW) pixels")
    limits.check("total_pixels", n_frames * h * w, f"sample_video of {n_frames} frames of {h}x{w} pixels")
    photo = sample_images([name])[name]
    span = w + step * (n_frames - 1)
    scale = max(1.0, h / photo.height, span / photo.width)
    if scale > 1.0:
        up_w, up_h = max(span, round(photo.width * scale)), max(h, round(photo.height * scale))
        # a long pan (a large step) upscales the photo a lot: its size is checked first
        limits.check("input_pixels", up_w * up_h, f"sample_video's pan over {name} (size={size}, step={step}, "
                                                  f"{n_frames} frames): pixels of the upscaled photo")
        photo = photo.resize((up_w, up_h), Image.Resampling.BICUBIC)
    arr = np.asarray(photo)
    y0 = (arr.shape[0] - h) // 2
    x0 = (arr.shape[1] - span) // 2
    frames = [arr[y0:y0 + h, x0 + i * step:x0 + i * step + w] for i in range(n_frames)]
    return np.ascontiguousarray(np.stack(frames))


def random_images(n: int, seed: int = 0, min_side: int = 16, max_side: int = 640) -> list[np.ndarray]:
    """n uniform-noise uint8 images, each [H, W, 3] with H, W drawn uniformly in [min_side, max_side]."""
    n = limits.integer(n, "n", minimum=0, cap="items")
    seed = limits.seed(seed)
    min_side = limits.integer(min_side, "min_side")
    max_side = limits.integer(max_side, "max_side")
    if max_side < min_side:
        raise ValueError(f"need min_side <= max_side, got min_side={min_side}, max_side={max_side}")
    limits.check("input_pixels", max_side * max_side, f"random_images of up to {max_side}x{max_side} pixels")
    limits.check("total_pixels", n * max_side * max_side, f"random_images: {n} images of up to "
                                                          f"{max_side}x{max_side} pixels")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
        out.append(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
    return out
