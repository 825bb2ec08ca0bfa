"""Files from folders anyone may have written, opened only where they are regular files and without waiting (a FIFO
blocks its reader, a link may point anywhere: judged before and after the non-blocking open; run folders are read
without following links, model and image folders follow them); files written so that a reader never sees a part."""
from __future__ import annotations

import errno
import os
import stat
import uuid
from pathlib import Path
from typing import BinaryIO

# what a path is, for the messages: every one but the regular file is refused unopened
_KINDS = ((stat.S_ISREG, None), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


class NotRegularFile(OSError):
    """A path that is there but is not a regular file; ``kind`` says what it is ("a FIFO"...)."""

    def __init__(self, path, kind: str):
        super().__init__(errno.EINVAL, f"it is {kind}, not a regular file", os.fspath(path))
        self.kind = kind


def _kind_of(mode: int) -> str | None:
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def file_kind(path, follow: bool = True) -> str | None:
    """None where ``path`` is a regular file (with ``follow``, a link to one too), else what it is
    ("a FIFO", "a broken symbolic link", ...); nothing is opened. FileNotFoundError where nothing is."""
    try:
        mode = (os.stat if follow else os.lstat)(path).st_mode
    except OSError:
        if follow and os.path.islink(path):        # dangling, or a loop of links
            return "a broken symbolic link"
        raise
    return _kind_of(mode)


def open_regular(path, follow: bool = True) -> BinaryIO:
    """``path`` opened for binary reading where it is a regular file, else NotRegularFile.
    Non-blocking (a FIFO swapped in after the check does not wait) and, without ``follow``, never
    through a link."""
    kind = file_kind(path, follow)
    if kind:
        raise NotRegularFile(path, kind)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    f = os.fdopen(os.open(path, flags), "rb")
    kind = _kind_of(os.fstat(f.fileno()).st_mode)
    if kind:
        f.close()
        raise NotRegularFile(path, kind)
    return f


def read_regular(path, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` (`open_regular`, never through a link); OSError (EFBIG) above ``max_bytes``."""
    with open_regular(path, follow=False) as f:
        data = f.read(-1 if max_bytes is None else max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", os.fspath(path))
    return data


def atomic_write_bytes(path, data: bytes, exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` through a flushed temporary file beside it, so that readers see
    the old file or the new one, never a part. With ``exclusive`` the file is hard-linked into
    place, which fails (FileExistsError) where ``path`` exists, even when another process creates
    it at the same moment: a finished file is never replaced. Parents are made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise FileExistsError(f"{path} exists; a finished file is never overwritten") from None
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))
