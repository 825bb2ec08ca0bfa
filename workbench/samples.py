"""Real photos shipped inside installed packages (nothing is downloaded), and image mixes.

Photos (RGB, size as HxW):
    astronaut     512x512   scikit-image  skimage.data.astronaut()
    chelsea       300x451   scikit-image  skimage.data.chelsea()
    coffee        400x600   scikit-image  skimage.data.coffee()
    rocket        427x640   scikit-image  skimage.data.rocket()
    grace_hopper  600x512   matplotlib    cbook.get_sample_data("grace_hopper.jpg")

Image mixes: the named size distributions of data/image_mixes.toml, the photos ("photos") and a
folder of the user's own images ("folder:PATH": its images' sizes as shown, each file decoded once
by wb.preprocess's reader, `workbench.preprocess.load_image`).

Everything here is deterministic given its arguments (and `seed`) and, for a folder mix, the
folder's content.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from . import limits
from .files import file_kind

__all__ = ["SAMPLE_NAMES", "MIX_NAMES", "MIX_FILE", "FOLDER_PREFIX", "IMAGE_SUFFIXES", "sample_images",
           "sample_video", "random_images", "get_mix", "folder_mix_name", "check_image_folder", "with_folder",
           "mix_label", "mix_columns", "mix_entries", "mix_distribution", "mix_sizes", "mix_tokens", "image_mix"]

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


# ---------------------------------------------------------------------------------------------
# image-size mixes
# ---------------------------------------------------------------------------------------------
# The named size distributions live in data/image_mixes.toml (see data/README.md); the shipped
# photos are one more mix, "photos", built here from SAMPLE_NAMES at their own sizes.
MIX_FILE = Path(__file__).resolve().parent.parent / "data" / "image_mixes.toml"

_PHOTO_SIZES = {"astronaut": (512, 512), "chelsea": (300, 451), "coffee": (400, 600),
                "rocket": (427, 640), "grace_hopper": (600, 512)}
_PHOTO_SOURCES = {"astronaut": "scikit-image data.astronaut()", "chelsea": "scikit-image data.chelsea()",
                  "coffee": "scikit-image data.coffee()", "rocket": "scikit-image data.rocket()",
                  "grace_hopper": "matplotlib cbook.get_sample_data('grace_hopper.jpg')"}


@dataclass(frozen=True)
class MixEntry:
    """One size of a mix: `frames` is 1 for an image; `weight` is relative (not normalized)."""

    kind: str            # "image" or "video"
    frames: int
    height: int
    width: int
    weight: float
    source: str


@dataclass(frozen=True)
class Mix:
    name: str
    description: str
    weights: str                 # how the weights were chosen (an assumption)
    tokens: tuple[int, int]      # claimed merged-token range after the processor's resize
    entries: tuple[MixEntry, ...]
    # a folder mix only: the folder (absolute), each entry's files (relative to it, sorted) and
    # the content fingerprint "<images>-<hash of their names, pixel sizes and file sizes>"
    folder: str | None = None
    files: tuple[tuple[str, ...], ...] = ()
    fingerprint: str | None = None


@dataclass(frozen=True)
class MixItem:
    """One drawn item: what `mix_sizes` returns. `entry` is its index in the mix's entries."""

    kind: str            # "image" or "video"
    frames: int          # 1 for an image
    height: int
    width: int
    entry: int


def _posint(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _parse_mix(name: str, table, where: str) -> Mix:
    def bad(msg):
        return ValueError(f"{where}: mix {name!r}: {msg}")

    if not isinstance(table, dict):
        raise bad("is not a table")
    for key in ("description", "weights"):
        if not isinstance(table.get(key), str) or not table[key].strip():
            raise bad(f"needs a non-empty string {key!r}")
    tokens = table.get("tokens")
    if (not isinstance(tokens, list) or len(tokens) != 2 or not all(_posint(t) for t in tokens)
            or tokens[0] > tokens[1]):
        raise bad(f"tokens must be [lo, hi], two positive integers with lo <= hi, got {tokens!r}")
    raw = table.get("entries")
    if not isinstance(raw, list) or not raw:
        raise bad("needs at least one [[entries]] item")
    entries = []
    for i, e in enumerate(raw):
        unknown = set(e) - {"frames", "height", "width", "weight", "source"}
        if unknown:
            raise bad(f"entry {i} has unknown key(s) {sorted(unknown)}")
        for key in ("height", "width"):
            if not _posint(e.get(key)):
                raise bad(f"entry {i}: {key} must be a positive integer, got {e.get(key)!r}")
        w = e.get("weight")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise bad(f"entry {i}: weight must be a finite number > 0, got {w!r}")
        if not isinstance(e.get("source"), str) or not e["source"].strip():
            raise bad(f"entry {i}: needs a non-empty string 'source' (where the numbers come from)")
        frames = e.get("frames")
        if frames is not None and not _posint(frames):
            raise bad(f"entry {i}: frames must be a positive integer, got {frames!r}")
        entries.append(MixEntry("image" if frames is None else "video", 1 if frames is None else frames,
                                e["height"], e["width"], float(w), e["source"]))
    return Mix(name, table["description"], table["weights"], (tokens[0], tokens[1]), tuple(entries))


@functools.lru_cache(maxsize=None)
def _file_mixes() -> dict[str, Mix]:
    if not MIX_FILE.is_file():
        raise FileNotFoundError(f"the image-mix file {MIX_FILE} is missing (it lives in the repository's data/ "
                                f"folder, which an installed wheel does not carry); only the 'photos' mix works")
    with open(MIX_FILE, "rb") as f:
        data = tomllib.load(f)
    if "photos" in data:
        raise ValueError(f"{MIX_FILE}: the name 'photos' is reserved for the shipped sample photos")
    return {name: _parse_mix(name, table, str(MIX_FILE)) for name, table in data.items()}


def _photos_mix() -> Mix:
    entries = tuple(MixEntry("image", 1, h, w, 1.0, f"{_PHOTO_SOURCES[n]}, {h}x{w} (HxW)")
                    for n, (h, w) in ((n, _PHOTO_SIZES[n]) for n in SAMPLE_NAMES))
    return Mix("photos", "The real sample photos shipped in scikit-image and matplotlib, at their own sizes",
               "equal weights", (0, 0), entries)


def _mix_names() -> tuple[str, ...]:
    try:
        return tuple(_file_mixes()) + ("photos",)
    except FileNotFoundError:
        return ("photos",)


MIX_NAMES: tuple[str, ...] = _mix_names()


# ---- a folder of the user's own images ----------------------------------------------------------
FOLDER_PREFIX = "folder:"
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


def folder_mix_name(path) -> str:
    """The mix name of a folder of images: ``folder:`` and its absolute path (``~`` expanded)."""
    return FOLDER_PREFIX + os.path.abspath(os.path.expanduser(str(path)))


def _folder_valid() -> str:
    return f"a folder of image files ({', '.join(IMAGE_SUFFIXES)}), sub-folders included, hidden ones skipped"


def _image_files(folder: str) -> tuple[tuple[tuple[str, int, int], ...], list[str]]:
    """(listing, skipped) of the files under ``folder`` with an image suffix: listing holds
    (relative POSIX path, bytes, mtime in ns) of each regular file or symbolic link to one
    (wherever it points), sorted; skipped holds "relative path (what it is)" of the others (named
    pipes, sockets, devices, broken links), which are never opened: opening a pipe waits for a
    writer. LimitError past the ``folder_images`` cap (counting stops there)."""
    cap = limits.current().folder_images
    found, skipped = [], []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            if f.startswith(".") or os.path.splitext(f)[1].lower() not in IMAGE_SUFFIXES:
                continue
            path = os.path.join(root, f)
            rel = Path(path).relative_to(folder).as_posix()
            kind = file_kind(path)
            if kind:
                skipped.append(f"{rel} ({kind})")
                continue
            st = os.stat(path)
            found.append((rel, st.st_size, st.st_mtime_ns))
            if len(found) > cap:
                limits.check("folder_images", len(found), f"image folder {folder!r} holds too many image files "
                                                          f"(counting stopped at {len(found):,})")
    return tuple(sorted(found)), sorted(skipped)


def _listed(items: list, most: int = 5) -> str:
    return "; ".join(map(str, items[:most])) + (" ..." if len(items) > most else "")


def _refusal(folder: str, errors: list[Exception], n_files: int) -> ValueError:
    """One error for the files of ``folder`` that wb.preprocess's reader refused, each named with
    why. A LimitError when every refusal is one: raising the caps is then the whole fix."""
    kind = limits.LimitError if all(isinstance(e, limits.LimitError) for e in errors) else ValueError
    return kind(f"image folder {folder!r}: {len(errors)} of {n_files} image file(s) cannot be read as "
                f"wb.preprocess reads images (fix or remove them): {_listed(errors)}")


@functools.lru_cache(maxsize=8)
def _read_folder(folder: str, listing: tuple) -> tuple[Mix, tuple[str, int, int]]:
    """The folder's mix, and its largest image (path, height, width). Every file is decoded once,
    by wb.preprocess's reader (`load_image`): the sizes are those it shows (EXIF orientation
    applied, wherever the file keeps it), and a file it refuses (a mode, a cap, a truncated or
    corrupt file) refuses the folder here, naming the file, before any run starts: skipping it
    would change the mix the user asked for. Keyed by the listing, so a changed file is read
    again (a refusal is not cached)."""
    from .preprocess import load_image
    sizes: dict[tuple[int, int], list[str]] = {}
    refused: list[Exception] = []
    digest = hashlib.sha256()
    for rel, nbytes, _ in listing:
        try:
            w, h = load_image(os.path.join(folder, rel)).size
        except (ValueError, OSError) as e:       # OSError: unreadable (permissions), gone since listed
            refused.append(e)
            continue
        sizes.setdefault((h, w), []).append(rel)
        digest.update(f"{rel}\0{h}x{w}\0{nbytes}\n".encode())
    if refused:
        raise _refusal(folder, refused, len(listing))
    count = sum(len(f) for f in sizes.values())
    entries = tuple(MixEntry("image", 1, h, w, float(len(f)), f"{len(f)} image(s) of the folder, e.g. {f[0]}")
                    for (h, w), f in sorted(sizes.items()))
    mix = Mix(FOLDER_PREFIX + folder, f"{count} images of the folder {folder}",
              "the number of the folder's images of each size", (0, 0), entries, folder=folder,
              files=tuple(tuple(f) for _, f in sorted(sizes.items())),
              fingerprint=f"{count}-{digest.hexdigest()[:12]}")
    (h, w), f = max(sizes.items(), key=lambda kv: kv[0][0] * kv[0][1])
    return _with_token_range(mix), (f[0], h, w)


def _folder_mix(path: str) -> Mix:
    """The mix of a folder's images (one entry per size, weighted by its number of images).
    ValueError naming the folder for one that is missing, not a folder or without an image file,
    and naming the files wb.preprocess's reader refuses; LimitError for too many files or too
    large an image. Entries that are not regular files are skipped with a warning naming them."""
    if not path:
        raise ValueError(f"image mix {FOLDER_PREFIX!r} names no folder; valid: {FOLDER_PREFIX}PATH with PATH "
                         f"{_folder_valid()}")
    folder = folder_mix_name(path)[len(FOLDER_PREFIX):]
    if not os.path.exists(folder):
        raise ValueError(f"image folder {folder!r} does not exist; valid: {_folder_valid()}")
    if not os.path.isdir(folder):
        raise ValueError(f"image folder {folder!r} is a file, not a folder; valid: {_folder_valid()}")
    listing, skipped = _image_files(folder)
    if skipped:
        warnings.warn(f"image folder {folder!r}: skipping {len(skipped)} entry(ies) that are not regular files "
                      f"(never opened): {_listed(skipped)}", stacklevel=3)
    if not listing:
        raise ValueError(f"image folder {folder!r} holds no readable image (0 file(s) with an image suffix"
                         + (f"; skipped: {_listed(skipped)}" if skipped else "") + f"); valid: {_folder_valid()}")
    mix, (rel, h, w) = _read_folder(folder, listing)
    # the listing may have been read under higher caps (limits.raised): the largest image again
    limits.check("input_pixels", h * w, f"{os.path.join(folder, rel)}: an image of {h}x{w} (HxW) pixels")
    return mix


def check_image_folder(path: str) -> None:
    """A study parameter's rule: ``path`` is an absolute path (``~`` allowed) to a folder that
    `get_mix` reads as a mix, every image decoded in full, so that a truncated or refused file is
    named before a run folder exists; ValueError otherwise. A relative path is refused: a sweep's
    notebooks run in the project root, not where the command was typed."""
    if not os.path.isabs(os.path.expanduser(path)):
        raise ValueError(f"a relative path; give the whole path (e.g. {os.path.abspath(path)!r}): a sweep's "
                         f"notebooks run in the project root")
    _folder_mix(path)


def with_folder(mixes, folder: str | None) -> list[str]:
    """``mixes`` followed by the mix of the image folder ``folder`` (`folder_mix_name`), if given."""
    return list(mixes) + ([folder_mix_name(folder)] if folder else [])


def mix_label(name: str) -> str:
    """How tables and figures name a mix: a folder mix by its folder's own name
    (``folder:<name>``), every other mix by its name."""
    if not name.startswith(FOLDER_PREFIX):
        return name
    path = os.path.normpath(name[len(FOLDER_PREFIX):])
    return FOLDER_PREFIX + (os.path.basename(path) or path)


def mix_columns(name: str) -> dict:
    """A study row's columns naming mix ``name``: ``mix`` (its `mix_label`) and, for a folder mix,
    ``fingerprint`` (its content: runs on the same images compare wherever the folder lies)."""
    if not name.startswith(FOLDER_PREFIX):
        return {"mix": name}
    return {"mix": mix_label(name), "fingerprint": get_mix(name).fingerprint}


def _with_token_range(mix: Mix) -> Mix:
    """``mix`` with its claimed token range computed: its entries' own under the default resize."""
    toks = [_entry_tokens(e, _geometry(None)) for e in mix.entries]
    return dataclasses.replace(mix, tokens=(min(toks), max(toks)))


def get_mix(name: str) -> Mix:
    """The mix ``name`` (entries, description, claimed token range): a name of MIX_NAMES, or
    ``folder:PATH``, the images of a folder (sub-folders too) at their sizes as shown, each size
    weighted by its number of images: every file is decoded once by wb.preprocess's reader
    (`load_image`), and one it refuses refuses the folder, naming the file; entries that are not
    regular files (named pipes, sockets, devices, broken links) are skipped with a warning.
    ValueError naming the valid ones. For "photos" and folders the claimed range is
    computed (their own sizes under the default resize)."""
    if isinstance(name, str) and name.startswith(FOLDER_PREFIX):
        return _folder_mix(name[len(FOLDER_PREFIX):])
    if name == "photos":
        return _with_token_range(_photos_mix())
    if not isinstance(name, str) or name not in MIX_NAMES:
        raise ValueError(f"unknown image mix {name!r}; valid: {', '.join(MIX_NAMES)}, or {FOLDER_PREFIX}PATH with "
                         f"PATH {_folder_valid()}")
    return _file_mixes()[name]


def _geometry(cfg):
    """(patch, merge, temporal, min_pixels, max_pixels) of cfg (VisionConfig, preset name or None:
    the Qwen2-VL geometry every preset shares)."""
    from .config import VisionConfig
    cfg = VisionConfig.coerce(cfg, default=VisionConfig.preset("qwen2-vl-7b"))
    return cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size, cfg.min_pixels, cfg.max_pixels


def _target_size(e, geo) -> tuple[int, int]:
    from .preprocess import smart_resize
    p, m, _, lo, hi = geo
    return smart_resize(e.height, e.width, p * m, lo, hi)


def _entry_tokens(e, geo) -> int:
    """Merged tokens of one item as wb.preprocess makes them: every image / video frame is resized
    to smart_resize(h, w); grid [frames / T (1 for an image), H'/P, W'/P]; tokens = t*gh*gw / m^2."""
    p, m, tp, _, _ = geo
    h, w = _target_size(e, geo)
    if e.kind == "video" and e.frames % tp:
        raise ValueError(f"a video entry of {e.frames} frames is not a multiple of temporal_patch_size={tp}")
    t = 1 if e.kind == "image" else e.frames // tp
    return t * (h // (p * m)) * (w // (p * m))


def mix_entries(name: str, cfg=None) -> list[dict]:
    """One record per size of mix ``name``: kind, frames, height, width, weight (for a folder, its
    number of images of that size) and tokens (merged tokens after the resize, cfg as in
    mix_distribution)."""
    geo = _geometry(cfg)
    return [dict(kind=e.kind, frames=e.frames, height=e.height, width=e.width, weight=e.weight,
                 tokens=_entry_tokens(e, geo)) for e in get_mix(name).entries]


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
    geo = _geometry(cfg)
    mix = get_mix(name)
    return [_entry_tokens(mix.entries[it.entry], geo) for it in mix_sizes(name, n, seed)]


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
        items = [MixItem("image", 1, *_PHOTO_SIZES[k], SAMPLE_NAMES.index(k)) for k in photos]
    else:
        items = mix_sizes(name, n, seed)
    from .preprocess import Video  # torch is imported only when a video is made
    geo = _geometry(cfg)
    names = list(photos)
    # every item is made at its drawn (or resized) size: the sizes are checked before any is made
    sizes = [_target_size(it, geo) if resized else (it.height, it.width) for it in items]
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
            out.append(_folder_image(os.path.join(mix.folder, files[k % len(files)]), h, w))
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


def _folder_image(path: str, h: int, w: int) -> Image.Image:
    """The image file as wb.preprocess's reader gives it (`load_image`: RGB, EXIF orientation
    applied), resized (PIL bicubic) to h x w; a JPEG is decoded at the smallest scale that still
    holds h x w (PIL draft). ValueError naming the file where it is refused."""
    from .preprocess import load_image
    img = load_image(path, reduce_to=(h, w))
    return img if img.size == (w, h) else img.resize((w, h), Image.Resampling.BICUBIC)
