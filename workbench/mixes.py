"""The named image-size mixes: their records (`Mix`, `MixEntry`, `MixItem`), the mixes of
data/image_mixes.toml (`file_mixes`) and the "photos" mix (`photos_mix`, the photos at
`PHOTO_SIZES`), and the merged tokens an entry makes after the processor's resize
(`token_geometry`, `processed_size`, `entry_tokens`, `with_token_range`)."""
from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .photos import SAMPLE_NAMES


# The named size distributions live in data/image_mixes.toml (see data/README.md); the shipped
# photos are one more mix, "photos", built here from SAMPLE_NAMES at their own sizes.
MIX_FILE = Path(__file__).resolve().parent.parent / "data" / "image_mixes.toml"

# the shipped photos' own sizes (H, W)
PHOTO_SIZES = {"astronaut": (512, 512), "chelsea": (300, 451), "coffee": (400, 600),
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
def file_mixes() -> dict[str, Mix]:
    """The mixes of MIX_FILE by name, each checked (ValueError naming the mix and the entry);
    FileNotFoundError where the file is missing."""
    if not MIX_FILE.is_file():
        raise FileNotFoundError(f"the image-mix file {MIX_FILE} is missing (it lives in the repository's data/ "
                                f"folder, which an installed wheel does not carry); only the 'photos' mix works")
    with open(MIX_FILE, "rb") as f:
        data = tomllib.load(f)
    if "photos" in data:
        raise ValueError(f"{MIX_FILE}: the name 'photos' is reserved for the shipped sample photos")
    return {name: _parse_mix(name, table, str(MIX_FILE)) for name, table in data.items()}


def photos_mix() -> Mix:
    """The "photos" mix: the shipped sample photos at their own sizes, equal weights, its token
    range computed (`with_token_range`)."""
    entries = tuple(MixEntry("image", 1, h, w, 1.0, f"{_PHOTO_SOURCES[n]}, {h}x{w} (HxW)")
                    for n, (h, w) in ((n, PHOTO_SIZES[n]) for n in SAMPLE_NAMES))
    return with_token_range(Mix("photos", "The real sample photos shipped in scikit-image and matplotlib, at "
                                "their own sizes", "equal weights", (0, 0), entries))


def _mix_names() -> tuple[str, ...]:
    try:
        return tuple(file_mixes()) + ("photos",)
    except FileNotFoundError:
        return ("photos",)


MIX_NAMES: tuple[str, ...] = _mix_names()


def with_token_range(mix: Mix) -> Mix:
    """``mix`` with its claimed token range computed: its entries' own under the default resize."""
    toks = [entry_tokens(e, token_geometry(None)) for e in mix.entries]
    return dataclasses.replace(mix, tokens=(min(toks), max(toks)))


def token_geometry(cfg):
    """cfg (VisionConfig, preset name or None: the Qwen2-VL geometry every Qwen preset shares) as
    the VisionConfig whose patch, merge and temporal sizes and resize rule count the tokens."""
    from .config import VisionConfig
    return VisionConfig.coerce(cfg, default=VisionConfig.preset("qwen2-vl-7b"))


def processed_size(e, geo, padded: bool = False) -> tuple[int, int]:
    """The size wb.preprocess resizes item ``e`` (a `MixEntry` or `MixItem`) to under ``geo`` (a
    `token_geometry`): `Family.resize` where the family's processor sizes its own way, else
    `images.target_size`. ``padded``: the size its patches cover (Kimi-K2.5 pads the resized image
    with zeros to a multiple of patch_size * merge_size)."""
    from .images import target_size
    sizes = geo.spec.resize(geo, e.kind, e.height, e.width)
    return target_size(e.height, e.width, geo) if sizes is None else sizes[padded]


def entry_tokens(e, geo) -> int:
    """Merged tokens of one item ``e`` (a `MixEntry` or `MixItem`) under ``geo`` (a
    `token_geometry`) as wb.preprocess makes them: every image / video frame is resized to the
    processor's size and padded where it pads (`processed_size`); grid [frames / T (1 for an
    image), H'/P, W'/P]; tokens = t*gh*gw / m^2."""
    p, m, tp = geo.patch_size, geo.merge_size, geo.temporal_patch_size
    h, w = processed_size(e, geo, padded=True)
    if e.kind == "video" and e.frames % tp:
        raise ValueError(f"a video entry of {e.frames} frames is not a multiple of temporal_patch_size={tp}")
    t = 1 if e.kind == "image" else e.frames // tp
    return t * (h // (p * m)) * (w // (p * m))
