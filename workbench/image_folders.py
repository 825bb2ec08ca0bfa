"""A folder of the user's own images as a mix ("folder:PATH"): its image files listed, each
decoded once by wb.preprocess's reader (`workbench.images.load_image`), and their sizes as shown."""
from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path

from PIL import Image

from . import limits
from .files import file_kind
from .mixes import Mix, MixEntry, with_token_range


FOLDER_PREFIX = "folder:"
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
# what a folder mix's PATH must be, as the errors that refuse one say
VALID_FOLDER = f"a folder of image files ({', '.join(IMAGE_SUFFIXES)}), sub-folders included, hidden ones skipped"


def folder_mix_name(path) -> str:
    """The mix name of a folder of images: ``folder:`` and its absolute path (``~`` expanded)."""
    return FOLDER_PREFIX + os.path.abspath(os.path.expanduser(str(path)))


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
    from .images import load_image
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
    return with_token_range(mix), (f[0], h, w)


def folder_mix(path: str) -> Mix:
    """The mix of a folder's images (one entry per size, weighted by its number of images).
    ValueError naming the folder for one that is missing, not a folder or without an image file,
    and naming the files wb.preprocess's reader refuses; LimitError for too many files or too
    large an image. Entries that are not regular files are skipped with a warning naming them."""
    if not path:
        raise ValueError(f"image mix {FOLDER_PREFIX!r} names no folder; valid: {FOLDER_PREFIX}PATH with PATH "
                         f"{VALID_FOLDER}")
    folder = folder_mix_name(path)[len(FOLDER_PREFIX):]
    if not os.path.exists(folder):
        raise ValueError(f"image folder {folder!r} does not exist; valid: {VALID_FOLDER}")
    if not os.path.isdir(folder):
        raise ValueError(f"image folder {folder!r} is a file, not a folder; valid: {VALID_FOLDER}")
    listing, skipped = _image_files(folder)
    if skipped:
        warnings.warn(f"image folder {folder!r}: skipping {len(skipped)} entry(ies) that are not regular files "
                      f"(never opened): {_listed(skipped)}", stacklevel=3)
    if not listing:
        raise ValueError(f"image folder {folder!r} holds no readable image (0 file(s) with an image suffix"
                         + (f"; skipped: {_listed(skipped)}" if skipped else "") + f"); valid: {VALID_FOLDER}")
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
    folder_mix(path)


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


def folder_image(path: str, h: int, w: int) -> Image.Image:
    """The image file as wb.preprocess's reader gives it (`load_image`: RGB, EXIF orientation
    applied), resized (PIL bicubic) to h x w; a JPEG is decoded at the smallest scale that still
    holds h x w (PIL draft). ValueError naming the file where it is refused."""
    from .images import load_image
    img = load_image(path, reduce_to=(h, w))
    return img if img.size == (w, h) else img.resize((w, h), Image.Resampling.BICUBIC)
