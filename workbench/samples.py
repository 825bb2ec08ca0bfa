"""Image mixes as inputs: `get_mix` for a mix name (a size distribution of data/image_mixes.toml,
the sample photos "photos", or a folder of the user's own images "folder:PATH"), the merged-token
distribution of a mix, and items drawn from it as real images and videos (`image_mix`).

The parts live below, their public names importable from here too: the sample photos in
`workbench.photos`, the mix records and the mix file in `workbench.mixes`, a folder mix in
`workbench.image_folders`.

Everything here is deterministic given its arguments (and `seed`) and, for a folder mix, the
folder's content.
"""
from __future__ import annotations

import os

import numpy as np
from PIL import Image

from . import limits
from .image_folders import FOLDER_PREFIX, VALID_FOLDER, folder_image, folder_mix
from .image_folders import IMAGE_SUFFIXES, check_image_folder, folder_mix_name, mix_label, with_folder  # noqa: F401
from .mixes import (MIX_NAMES, PHOTO_SIZES, Mix, MixItem, entry_tokens, file_mixes, photos_mix, processed_size,
                    token_geometry)
from .mixes import MIX_FILE, MixEntry  # noqa: F401
from .photos import SAMPLE_NAMES, sample_images, sample_video
from .photos import random_images  # noqa: F401

__all__ = ["SAMPLE_NAMES", "MIX_NAMES", "MIX_FILE", "FOLDER_PREFIX", "IMAGE_SUFFIXES", "sample_images",
           "sample_video", "random_images", "get_mix", "folder_mix_name", "check_image_folder", "with_folder",
           "mix_label", "mix_columns", "mix_entries", "mix_distribution", "mix_sizes", "mix_tokens", "image_mix"]


def mix_columns(name: str) -> dict:
    """A study row's columns naming mix ``name``: ``mix`` (its `mix_label`) and, for a folder mix,
    ``fingerprint`` (its content: runs on the same images compare wherever the folder lies)."""
    if not name.startswith(FOLDER_PREFIX):
        return {"mix": name}
    return {"mix": mix_label(name), "fingerprint": get_mix(name).fingerprint}


def get_mix(name: str) -> Mix:
    """The mix ``name`` (entries, description, claimed token range): a name of MIX_NAMES, or
    ``folder:PATH``, the images of a folder (sub-folders too) at their sizes as shown, each size
    weighted by its number of images: every file is decoded once by wb.preprocess's reader
    (`load_image`), and one it refuses refuses the folder, naming the file; entries that are not
    regular files (named pipes, sockets, devices, broken links) are skipped with a warning.
    ValueError naming the valid ones. For "photos" and folders the claimed range is
    computed (their own sizes under the default resize)."""
    if isinstance(name, str) and name.startswith(FOLDER_PREFIX):
        return folder_mix(name[len(FOLDER_PREFIX):])
    if name == "photos":
        return photos_mix()
    if not isinstance(name, str) or name not in MIX_NAMES:
        raise ValueError(f"unknown image mix {name!r}; valid: {', '.join(MIX_NAMES)}, or {FOLDER_PREFIX}PATH with "
                         f"PATH {VALID_FOLDER}")
    return file_mixes()[name]


def mix_entries(name: str, cfg=None) -> list[dict]:
    """One record per size of mix ``name``: kind, frames, height, width, weight (for a folder, its
    number of images of that size) and tokens (merged tokens after the resize, cfg as in
    mix_distribution)."""
    geo = token_geometry(cfg)
    return [dict(kind=e.kind, frames=e.frames, height=e.height, width=e.width, weight=e.weight,
                 tokens=entry_tokens(e, geo)) for e in get_mix(name).entries]


def mix_distribution(name: str, cfg=None) -> list[tuple[int, float]]:
    """The exact distribution of merged tokens per item of mix `name`: [(tokens, probability)],
    ascending distinct token counts, probabilities summing to 1 (weights normalized; entries that
    land on the same count are added).

    Token counts come from the resize wb.preprocess applies (smart_resize with factor
    patch_size * merge_size and cfg's min/max pixels, per frame for videos), with cfg's patch,
    merge and temporal sizes: cfg is a wb.VisionConfig, a preset name, or None (the Qwen2-VL
    geometry, which every preset shares)."""
    entries = mix_entries(name, cfg)
    acc: dict[int, float] = {}
    total = sum(e["weight"] for e in entries)
    for e in entries:
        acc[e["tokens"]] = acc.get(e["tokens"], 0.0) + e["weight"] / total
    return sorted(acc.items())


def mix_sizes(name: str, n: int, seed: int = 0) -> list[MixItem]:
    """n items drawn from mix `name` by weight (numpy default_rng(seed), with replacement), as
    MixItem(kind, frames, height, width, entry) records; deterministic given (name, n, seed).
    n: at most the `draws` cap (records only: image_mix, which makes pixels, caps n by `items`);
    seed: an integer 0..limits.seed."""
    mix = get_mix(name)
    n = limits.integer(n, "n", minimum=0, cap="draws")
    seed = limits.seed(seed)
    w = np.array([e.weight for e in mix.entries], dtype=np.float64)
    idx = np.random.default_rng(seed).choice(len(w), size=n, p=w / w.sum())
    return [MixItem(mix.entries[i].kind, mix.entries[i].frames, mix.entries[i].height, mix.entries[i].width,
                    int(i)) for i in idx]


def mix_tokens(name: str, n: int, seed: int = 0, cfg=None) -> list[int]:
    """Merged tokens of the n items `mix_sizes(name, n, seed)` draws (cfg as in mix_distribution)."""
    geo = token_geometry(cfg)
    mix = get_mix(name)
    return [entry_tokens(mix.entries[it.entry], geo) for it in mix_sizes(name, n, seed)]


def takes(name: str, cfg) -> bool:
    """Whether the tower of ``cfg`` (a `token_geometry` argument) takes every item of mix ``name`` (a family
    whose tower takes images only takes no mix with video in it)."""
    geo = token_geometry(cfg)
    return geo.spec.takes_video or all(e.kind == "image" for e in get_mix(name).entries)


def traffic_tokens(name: str, n: int, seed: int = 0, cfg=None, spread: float = 0.25) -> list[int]:
    """Merged tokens of n requests of a traffic that scatters around mix ``name``: each drawn item
    (`mix_sizes`) has its height and width scaled by exp(u), u uniform in [-spread, spread] drawn
    apart per side (another seed, another traffic of the same kinds), before the processor's resize.
    A planner judged on such draws meets sizes it was not fitted to, as a server does."""
    import dataclasses
    import math

    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not 0 <= spread <= 2:
        raise ValueError(f"spread must be a number in [0, 2] (log-scale jitter of each side), got {spread!r}")
    geo = token_geometry(cfg)
    mix = get_mix(name)
    draws = mix_sizes(name, n, seed)
    u = np.random.default_rng([limits.seed(seed), 1]).uniform(-spread, spread, size=(len(draws), 2))
    return [entry_tokens(dataclasses.replace(mix.entries[it.entry], height=max(1, round(it.height * math.exp(a))),
                                              width=max(1, round(it.width * math.exp(b)))), geo)
            for it, (a, b) in zip(draws, u.tolist())]


def image_mix(name: str, n: int | None = None, seed: int = 0, resized: bool = False, cfg=None) -> list:
    """The items `mix_sizes(name, n, seed)` draws, as real inputs for wb.preprocess:

    * images: RGB PIL images whose content is a real sample photo (item i uses the i-th shipped
      photo, cycling), resized with PIL bicubic to the drawn height x width; for a folder mix, the
      folder's own images of the drawn size (as shown: EXIF orientation applied), used in turn;
    * video clips: wb.Video holding uint8 [frames, H, W, 3], a pan over a sample photo
      (`sample_video`).

    resized=True draws every item directly at the size the preprocessor of ``cfg`` (a VisionConfig
    or preset name; None: the Qwen2-VL geometry) resizes it to: wb.preprocess with that config then
    gives the very same grid_thw (each family's patch size and pixel bounds differ), and
    far less memory is used (a 12 MP phone photo is 4032 x 3024 x 3 bytes = 36 MB as uint8; its
    resized copy about 3 MB). The pixels differ from resizing the full-size item (one resize
    instead of two).

    n=None: for "photos", every photo once at its own size, in SAMPLE_NAMES order (photos missing
    from the installed packages are skipped with a warning); for the other mixes a ValueError,
    since their full-size items are large: give n. An unknown name is a ValueError naming the
    valid ones.
    """
    mix = get_mix(name)
    if not isinstance(resized, bool):
        raise TypeError(f"resized must be a bool, got {resized!r}")
    if n is None and name != "photos":
        raise ValueError(f"image_mix({name!r}) needs n (how many items to draw); only 'photos' "
                         f"has a default (every photo once)")
    if n is not None:  # checked before any photo is loaded
        n = limits.integer(n, "n", minimum=0, cap="items")
        seed = limits.seed(seed)
    photos = sample_images() if mix.folder is None else {}
    if mix.folder is None and not photos:
        raise FileNotFoundError("no sample photos are available in the installed packages")
    if n is None:
        items = [MixItem("image", 1, *PHOTO_SIZES[k], SAMPLE_NAMES.index(k)) for k in photos]
    else:
        items = mix_sizes(name, n, seed)
    from .preprocess import Video  # torch is imported only when a video is made
    geo = token_geometry(cfg)
    names = list(photos)
    # every item is made at its drawn (or resized) size: the sizes are checked before any is made
    sizes = [processed_size(it, geo) if resized else (it.height, it.width) for it in items]
    for it, (h, w) in zip(items, sizes):
        limits.check("input_pixels", h * w, f"image_mix({name!r}) item of {h}x{w} (HxW) pixels")
        limits.check("frames", it.frames, f"image_mix({name!r}) video of {it.frames} frames")
    limits.check("total_pixels", sum(it.frames * h * w for it, (h, w) in zip(items, sizes)),
                 f"image_mix({name!r}, n={n}, resized={resized}): pixels of all {len(items)} items")
    out = []
    used: dict[int, int] = {}      # a folder mix: items drawn so far per entry (its files in turn)
    for i, (it, (h, w)) in enumerate(zip(items, sizes)):
        if mix.folder is not None:
            k = used[it.entry] = used.get(it.entry, -1) + 1
            files = mix.files[it.entry]
            out.append(folder_image(os.path.join(mix.folder, files[k % len(files)]), h, w))
            continue
        if name == "photos" and n is None:
            photo = photos[names[i]]
        elif name == "photos":
            photo = photos.get(SAMPLE_NAMES[it.entry])
            if photo is None:  # that photo is missing from the installed packages
                photo = photos[names[i % len(names)]]
        else:
            photo = photos[names[i % len(names)]]
        if it.kind == "video":
            frames = sample_video(it.frames, size=(h, w), name=names[i % len(names)], step=8)
            out.append(Video(frames))
        elif photo.size == (w, h):
            out.append(photo.copy())
        else:
            out.append(photo.resize((w, h), Image.Resampling.BICUBIC))
    return out
