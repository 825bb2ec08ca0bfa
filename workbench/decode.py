"""Encoded images: requests as they arrive (JPEG or PNG bytes), checked, and decoded on the host
(Pillow, one or several threads) or on the GPU (nvJPEG, through torchvision, where both are present).

A serving engine receives files, not pixels: decoding is the first stage of the path from request to
embedding, and it runs wherever the engine puts it. `encode` makes the bytes of a test request from a
workbench image (PIL's encoders; JPEG at a chosen quality, PNG lossless), `check_encoded` reads a
file's header and refuses what the serving path cannot take, naming the file and the valid choices,
before any pixel is decoded: a 0-byte file, bytes that are neither JPEG nor PNG, a CMYK or 16-bit
image, more pixels than the ``input_pixels`` cap (`workbench.limits`). A file truncated or corrupt
past its header fails when decoded (`decode_host`), again naming it. `keep_decodable` applies the
same checks to a mix and skips the bad files with a warning that names each.

`decode_host` gives HxWx3 uint8 arrays (Pillow's libjpeg / zlib; what a CPU processor decodes);
`decode_host_many` decodes a list on ``threads`` threads (Pillow releases the GIL while it decodes).
`decode_gpu` gives [H, W, 3] uint8 CUDA tensors from nvJPEG, for JPEG only (PNG has no GPU decoder
here); `gpu_decoder` says whether it can run and, where it cannot, why. nvJPEG and libjpeg round
their inverse DCTs and upsample chroma differently: their pixels differ by a few levels
(`pixel_diff` records it; nothing here pretends they agree).
"""
from __future__ import annotations

import io
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from . import limits
from .images import decoded_rgb

FORMATS = ("jpeg", "png")
# the image modes the serving path decodes: 8 bits per sample, grey or colour (PNG also palette and alpha)
VALID_MODES = {"jpeg": ("L", "RGB"), "png": ("1", "L", "LA", "P", "PA", "RGB", "RGBA")}
PIL_FORMAT = {"JPEG": "jpeg", "PNG": "png"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Encoded:
    """One request's image file: its name (for every error), bytes, format ("jpeg" | "png"), JPEG
    quality (None for PNG) and size in pixels."""

    name: str
    data: bytes
    fmt: str
    quality: int | None
    height: int
    width: int

    @property
    def n_bytes(self) -> int:
        return len(self.data)


def encode(image: Image.Image | np.ndarray, fmt: str, quality: int | None = None, name: str = "image") -> Encoded:
    """``image`` (RGB PIL image or HxWx3 uint8 array) as the bytes of a ``fmt`` file: JPEG at ``quality``
    (1..100, 4:2:0 chroma as cameras write it), PNG lossless (zlib level 6, Pillow's default)."""
    fmt = check_format(fmt)
    img = Image.fromarray(np.ascontiguousarray(image)) if isinstance(image, np.ndarray) else image
    buf = io.BytesIO()
    if fmt == "jpeg":
        img.convert("RGB").save(buf, format="JPEG", quality=check_quality(quality), subsampling="4:2:0")
    else:
        if quality is not None:
            raise ValueError(f"{name}: a PNG has no quality (lossless), got quality={quality!r}; give None")
        img.save(buf, format="PNG", compress_level=6)
    w, h = img.size
    return Encoded(name, buf.getvalue(), fmt, quality if fmt == "jpeg" else None, h, w)


def check_format(fmt: Any) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; valid: {', '.join(FORMATS)}")
    return fmt


def check_quality(quality: Any) -> int:
    """A JPEG quality: an integer 1..100."""
    if not limits.is_integer(quality) or not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality {quality!r} is not an integer in 1..100; valid: 1..100 (cameras and "
                         "browsers write 75..95)")
    return int(quality)


def _png_depth(data: bytes) -> int | None:
    """The bit depth in a PNG's IHDR chunk (Pillow opens a 16-bit RGB PNG as 8-bit RGB without a word)."""
    return data[24] if data[:8] == PNG_SIGNATURE and len(data) > 25 and data[12:16] == b"IHDR" else None


def check_encoded(data: bytes, name: str) -> tuple[str, int, int]:
    """(format, H, W) of the file ``data``, from its header alone; ValueError naming ``name`` where the
    serving path cannot take it (LimitError, a ValueError, above the ``input_pixels`` cap)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name}: expected the file's bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise ValueError(f"{name}: 0 bytes, an empty file; valid: a JPEG or PNG file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)   # the pixel cap below says it
            img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        cap = limits.current().input_pixels
        raise limits.LimitError(f"{name}: more pixels than Pillow opens at all, far above the cap of {cap:,} "
                                f"(limit 'input_pixels'); valid: images of at most {cap:,} pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"{name}: not a JPEG or PNG file Pillow can read ({type(e).__name__}); valid formats: "
                         f"{', '.join(FORMATS)}") from None
    fmt = PIL_FORMAT.get(img.format)
    if fmt is None:
        raise ValueError(f"{name}: a {img.format} file; valid formats: {', '.join(FORMATS)}")
    depth = _png_depth(bytes(data[:32])) if fmt == "png" else 8
    if img.mode not in VALID_MODES[fmt] or depth == 16:
        what = "16-bit" if depth == 16 or img.mode.startswith(("I", "F")) else img.mode
        raise ValueError(f"{name}: a {what} {fmt.upper()} image (mode {img.mode}); valid: 8-bit "
                         f"{', '.join(VALID_MODES[fmt])} (convert it to 8-bit RGB before sending it)")
    w, h = img.size
    if h == 0 or w == 0:
        raise ValueError(f"{name}: zero size {h}x{w} (HxW)")
    limits.check("input_pixels", h * w, f"{name}: an image of {h}x{w} (HxW) pixels")
    return fmt, h, w


def decode_host(data: bytes | Encoded, name: str | None = None) -> np.ndarray:
    """One file's pixels on the host: HxWx3 uint8 (RGB; grey repeated, transparency composited on white
    as the processors do). ValueError naming the file for anything `check_encoded` refuses, and for a
    file truncated or corrupt past its header."""
    if isinstance(data, Encoded):
        data, name = data.data, name or data.name
    name = name or "image"
    check_encoded(data, name)
    img = Image.open(io.BytesIO(data))
    try:
        rgb = decoded_rgb(img, 0, name)
    except ValueError as e:
        raise ValueError(f"{name}: could not be decoded, the file is truncated or corrupt ({e.__cause__ or e})") from None
    return np.asarray(rgb)


def decode_host_many(items: Sequence[Encoded], threads: int = 1) -> list[np.ndarray]:
    """`decode_host` of each item, on ``threads`` threads at once (1 .. the cores this process may use)."""
    threads = limits.within_cores(limits.integer(threads, "threads", cap="threads"), "threads")
    if threads == 1 or len(items) < 2:
        return [decode_host(e) for e in items]
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        return list(pool.map(decode_host, items))


def keep_decodable(items: Sequence[tuple[str, bytes]]) -> list[Encoded]:
    """The files of a mix, (name, bytes) each, as `Encoded`: each checked from its header and decoded
    once; a file the serving path cannot take is skipped with a warning naming it and why."""
    out, skipped = [], []
    for name, data in items:
        try:
            fmt, h, w = check_encoded(data, name)
            decode_host(data, name)
        except ValueError as e:
            skipped.append(str(e))
            continue
        out.append(Encoded(name, bytes(data), fmt, None, h, w))
    if skipped:
        warnings.warn(f"skipped {len(skipped)} file(s) the serving path cannot take: " + "; ".join(skipped),
                      stacklevel=2)
    return out


def gpu_decoder(device: Any) -> tuple[bool, str]:
    """(whether `decode_gpu` runs on ``device``, why not where it does not)."""
    import torch

    if torch.device(device).type != "cuda":
        return False, "no CUDA device (nvJPEG runs on a GPU)"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a missing or broken torchvision: the cell is not available
        return False, f"torchvision.io.decode_jpeg does not import ({type(e).__name__})"
    return True, ""


def decode_gpu(items: Sequence[Encoded], device: Any) -> list:
    """JPEG files -> [H, W, 3] uint8 tensors on ``device`` (nvJPEG, one batched call). ValueError for a
    PNG (no GPU decoder) or a file `check_encoded` refuses; RuntimeError where nvJPEG cannot run."""
    import torch
    ok, why = gpu_decoder(device)
    if not ok:
        raise RuntimeError(f"GPU decoding is not available: {why}")
    from torchvision.io import ImageReadMode, decode_jpeg
    for e in items:
        if check_encoded(e.data, e.name)[0] != "jpeg":
            raise ValueError(f"{e.name}: a PNG; the GPU decoder takes JPEG only (decode PNGs on the host)")
    data = [torch.frombuffer(bytearray(e.data), dtype=torch.uint8) for e in items]
    dev = torch.device(device)
    try:
        out = decode_jpeg(data, mode=ImageReadMode.RGB, device=dev)
    except TypeError:        # a torchvision without batched decoding: one call per file
        out = [decode_jpeg(d, mode=ImageReadMode.RGB, device=dev) for d in data]
    return [x.permute(1, 2, 0) for x in out]


def pixel_diff(a, b) -> tuple[float, float]:
    """(largest, mean) absolute difference, in levels, between two HxWx3 uint8 images (arrays or
    tensors, any device); (inf, inf) where their shapes differ."""
    a = a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)
    b = b.cpu().numpy() if hasattr(b, "cpu") else np.asarray(b)
    if a.shape != b.shape:
        return float("inf"), float("inf")
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(d.max()), float(d.mean())
