"""A run folder (`RunFolder`): made atomically, locked while a process works in it (`RunLock`), its state read
back from the file each stage of a study leaves (README, "Interrupted runs"): where a resume starts."""
from __future__ import annotations

import json
import os
import re
import socket
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ..files import read_regular
from .meta import META_NAME, RunMeta

STAGES = ("table", "notebook", "html", "figures")
FIGURES_DIR = "figures"


def figures_marker(run_dir: Path | str, study: str) -> Path:
    """The file that lists the study's figures of this run, once they are all saved."""
    return Path(run_dir) / FIGURES_DIR / f".{study}.drawn"


def holds_run(folder: Path | str, tables: set[str] | None = None) -> bool:
    """Whether ``folder`` is a run folder: it holds a meta.json or a table (one of ``tables``, else any *.parquet)."""
    try:
        return lists_run(os.listdir(folder), tables)
    except OSError:
        return False


def lists_run(names, tables: set[str] | None = None) -> bool:
    """`holds_run` on a folder's listing already read."""
    return META_NAME in names or any(n in tables if tables is not None else n.endswith(".parquet") for n in names)


def notebook_done(path: Path) -> bool:
    """Whether ``path`` is a notebook papermill executed to its end without an exception."""
    try:
        # a run folder may come from anyone: never through a link, never a FIFO (which blocks)
        pm = json.loads(read_regular(path).decode("utf-8"))["metadata"]["papermill"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False
    return isinstance(pm, dict) and bool(pm.get("end_time")) and not pm.get("exception")


@dataclass
class RunState:
    finished: bool                    # meta.json has finished_at: the sweep (or a resume) reached its end
    direct: bool                      # studies ran without notebooks
    studies: dict[str, dict[str, bool]] = field(default_factory=dict)    # {study: {stage: done}}

    @property
    def left(self) -> dict[str, list[str]]:
        """{study: stages left, in order} for every study that is not complete, in plan order."""
        left = {n: [s for s in STAGES if done.get(s) is False] for n, done in self.studies.items()}
        return {n: stages for n, stages in left.items() if stages}

    def describe_left(self) -> str:
        """'fp32_memory (notebook, html, figures); correctness (table, ...)' or 'nothing'."""
        return "; ".join(f"{n} ({', '.join(stages)})" for n, stages in self.left.items()) or "nothing"


def slug(text, empty: str | None = None, what: str = "name") -> str:
    """``text`` safe as a file name: letters, digits, '.', '_' and '-' kept, other runs one '-', no '-'
    or '.' at either end. Where nothing is left: ``empty``, else a ValueError naming ``what``."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.")
    if out or empty is not None:
        return out or empty
    raise ValueError(f"{what} {text!r} has no usable characters")


_TABLE_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def check_study_name(study) -> str:
    """``study`` when it can name a study's file in a run folder (``<study>.parquet``): letters, digits, '_', '.'
    and '-', starting with a letter or digit, at most 100 characters; ValueError naming it otherwise (a '/' or
    '..' would write outside the folder, an empty name a hidden file)."""
    if not isinstance(study, str) or not _TABLE_STEM.fullmatch(study):
        raise ValueError(f"study name {study!r} cannot name a table in a run folder: give letters, digits, '_', "
                         f"'.' or '-' (no '/', not starting with '.' or '-', at most 100), e.g. 'encoder_latency'")
    return study


class RunLock:
    """An exclusive flock on ``<run>/.lock`` while a process works in the folder. The system drops it
    when the holder exits, however it exits; the file names the holder's pid and host for people."""

    NAME = ".lock"

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / self.NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        import fcntl
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._fd = fd
        return True

    def release(self, remove: bool = False) -> None:
        """Drop the lock; ``remove`` also deletes the file (a complete run holds results only)."""
        if self._fd is not None:
            if remove:
                self.path.unlink(missing_ok=True)
            os.close(self._fd)          # closing drops the flock
            self._fd = None

    def holder(self) -> str:
        with suppress(OSError):
            return self.path.read_text().strip()
        return ""


def run_in_use(run_dir: Path | str) -> bool:
    """Whether another process holds the folder's lock now: a shared flock probe on the lock file,
    opened read-only (a read-only results folder works). Only informs; `RunLock` keeps processes out."""
    import errno
    import fcntl
    try:
        fd = os.open(Path(run_dir) / RunLock.NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)      # closing the file drops it again
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)
    return False


@dataclass(frozen=True)
class RunFolder:
    """One run folder: where its files are, its lock, its record and its stages."""

    path: Path

    @classmethod
    def create(cls, root: Path | str, name: str | None = None) -> "RunFolder":
        """A new folder ``<root>/<UTC time>-<short sha or 'nogit'>[-name][-k]``: ``mkdir`` grants a name
        to one caller only, so two runs started in the same second never share a folder."""
        from ..provenance import git_info, utc_now
        stamp = utc_now().strftime("%Y%m%dT%H%M%SZ")
        base = f"{stamp}-{git_info().get('short') or 'nogit'}" + (f"-{slug(name, what='run name')}" if name else "")
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        for k in range(1, 1000):
            path = root / (base if k == 1 else f"{base}-{k}")
            with suppress(FileExistsError):
                path.mkdir()
                return cls(path)
        raise FileExistsError(f"no free run folder name {base}[-k] under {root} (999 taken)")

    @classmethod
    def find(cls, results: Path | str, name: str) -> "RunFolder":
        """``name`` as a folder, or a folder name under ``results``; SystemExit otherwise."""
        for candidate in (Path(name), Path(results) / name):
            if (candidate / META_NAME).is_file():
                return cls(candidate)
        raise SystemExit(f"--resume {name!r}: no run folder with a meta.json there or under {results}/")

    def file(self, study: str, suffix: str) -> Path:
        return self.path / f"{study}{suffix}"

    def table(self, study: str) -> Path:
        return self.file(study, ".parquet")

    def write_table(self, study: str, table) -> Path:
        """The study's table checked and written atomically; an existing one is never replaced."""
        from .tables import write_study_table
        return write_study_table(table, self.table(check_study_name(study)))

    def lock(self) -> RunLock:
        return RunLock(self.path)

    def meta(self) -> RunMeta:
        """Its meta.json, read and checked (MetaError otherwise)."""
        return RunMeta.from_json(self.path / META_NAME)

    def stages_done(self, study: str, direct: bool) -> dict[str, bool]:
        """{stage: whether its file is there} of the stages a study of this run goes through."""
        done = {"table": self.table(study).is_file()}
        if not direct:
            done["notebook"] = notebook_done(self.file(study, ".ipynb"))
            done["html"] = self.file(study, ".html").is_file()
        # figures: the marker, or (a run made before it existed) the study's own figure files
        folder = self.path / FIGURES_DIR
        done["figures"] = figures_marker(self.path, study).is_file() or (
            folder.is_dir() and any(p.name.startswith(f"{study}_") for p in folder.iterdir()))
        return done

    def state(self, meta: RunMeta) -> RunState:
        """The state of every study the run planned (``meta``: its meta.json, already read)."""
        direct = (meta.params or {}).get("mode") != "papermill"
        return RunState(bool(meta.finished_at), direct, {name: self.stages_done(name, direct) for name in meta.plan})
