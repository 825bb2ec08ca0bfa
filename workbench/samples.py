"""Real photos shipped inside installed packages (nothing is downloaded), and image mixes.

Photos (RGB, size as HxW):
    astronaut     512x512   scikit-image  skimage.data.astronaut()
    chelsea       300x451   scikit-image  skimage.data.chelsea()
    coffee        400x600   scikit-image  skimage.data.coffee()
    rocket        427x640   scikit-image  skimage.data.rocket()
    grace_hopper  600x512   matplotlib    cbook.get_sample_data("grace_hopper.jpg")

Everything here is deterministic given its arguments (and `seed`).
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
from PIL import Image

__all__ = ["SAMPLE_NAMES", "MIX_NAMES", "sample_images", "sample_video", "image_mix", "random_images"]

SAMPLE_NAMES = ("astronaut", "chelsea", "coffee", "rocket", "grace_hopper")
MIX_NAMES = ("photos", "mixed", "noise")


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
    the photo is first upscaled (PIL bicubic) if it is too small to hold the whole pan.
    """
    if isinstance(n_frames, bool) or not isinstance(n_frames, int) or n_frames < 1:
        raise ValueError(f"n_frames={n_frames!r} must be a positive integer")
    h, w = (int(v) for v in size)
    if h < 1 or w < 1:
        raise ValueError(f"size={size!r} must be two positive sides (H, W)")
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    photo = sample_images([name])[name]
    span = w + step * (n_frames - 1)
    scale = max(1.0, h / photo.height, span / photo.width)
    if scale > 1.0:
        photo = photo.resize((max(span, round(photo.width * scale)), max(h, round(photo.height * scale))),
                             Image.Resampling.BICUBIC)
    arr = np.asarray(photo)
    y0 = (arr.shape[0] - h) // 2
    x0 = (arr.shape[1] - span) // 2
    frames = [arr[y0:y0 + h, x0 + i * step:x0 + i * step + w] for i in range(n_frames)]
    return np.ascontiguousarray(np.stack(frames))


def random_images(n: int, seed: int = 0, min_side: int = 16, max_side: int = 640) -> list[np.ndarray]:
    """n uniform-noise uint8 images, each [H, W, 3] with H, W drawn uniformly in [min_side, max_side]."""
    if n < 0 or min_side < 1 or max_side < min_side:
        raise ValueError(f"need n >= 0 and 1 <= min_side <= max_side, got n={n}, "
                         f"min_side={min_side}, max_side={max_side}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
        out.append(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
    return out


# (area in pixels, how many) bands for the "mixed" mix: near min_pixels (56*56 = 3136), a spread of
# ordinary sizes, and two above max_pixels (28*28*1280 = 1003520) that the processor scales down.
_MIXED_BANDS = ((2_000, 5_000, 3), (20_000, 120_000, 3), (150_000, 600_000, 3), (1_100_000, 2_000_000, 2))


def image_mix(name: str, seed: int = 0) -> list:
    """A named list of images:

    "photos": the real photos (RGB PIL images, their own sizes);
    "mixed":  11 RGB PIL images, real photos resized (bicubic, aspect ratio jittered by up to
              +-30 %) to areas of about 2k-5k px (near min_pixels, so they are upscaled),
              20k-120k, 150k-600k and 1.1M-2M px (above max_pixels);
    "noise":  random_images(8, seed): uint8 [H, W, 3] noise, sides 16..640.
    """
    if name == "photos":
        return list(sample_images().values())
    if name == "noise":
        return random_images(8, seed)
    if name != "mixed":
        raise ValueError(f"unknown image mix {name!r}; valid: {', '.join(MIX_NAMES)}")
    photos = list(sample_images().values())
    if not photos:
        raise FileNotFoundError("no sample photos are available for the 'mixed' mix")
    rng = np.random.default_rng(seed)
    out = []
    for lo, hi, count in _MIXED_BANDS:
        for _ in range(count):
            photo = photos[int(rng.integers(len(photos)))]
            area = float(rng.uniform(lo, hi))
            aspect = photo.width / photo.height * float(rng.uniform(0.7, 1.3))
            w = max(1, round(np.sqrt(area * aspect)))
            h = max(1, round(area / w))
            out.append(photo.resize((w, h), Image.Resampling.BICUBIC))
    return out
