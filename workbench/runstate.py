"""A run folder and its lifecycle: made atomically (`provenance.new_run_dir`), locked while a process
works in it (`RunLock`), and its state read back from the files it holds, which is where a resume
starts.

A sweep takes each planned study through four stages, and each stage leaves a file behind, so a
run killed at any moment (SIGKILL included) can be read back and finished:

- ``table``: ``<study>.parquet`` (written atomically: present means complete);
- ``notebook``: ``<study>.ipynb`` executed to its end without an exception (papermill records
  both in the notebook's metadata); runs in ``direct`` mode have no notebooks;
- ``html``: ``<study>.html``, the readable copy of the executed notebook (papermill mode);
- ``figures``: ``figures/.<study>.drawn``, the list of figure files, written after the study's
  figures of this run were all saved.

``meta.json`` says what was planned (``params.studies``) and whether the sweep reached its end
(``finished_at``).
"""
from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .files import read_regular
from .runmeta import META_NAME, RunMeta

STAGES = ("table", "notebook", "html", "figures")
FIGURES_DIR = "figures"


def figures_marker(run_dir: Path | str, study: str) -> Path:
    """The file that says the study's figures of this run are all saved (it lists them)."""
    return Path(run_dir) / FIGURES_DIR / f".{study}.drawn"


def notebook_done(path: Path) -> bool:
    """Whether ``path`` is a notebook papermill executed to its end without an exception."""
    try:
        # a run folder may come from anyone: never through a link, never a FIFO (which blocks)
        doc = json.loads(read_regular(path).decode("utf-8"))
        pm = doc["metadata"]["papermill"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False
    return isinstance(pm, dict) and bool(pm.get("end_time")) and not pm.get("exception")


def _figures_drawn(run_dir: Path, study: str) -> bool:
    if figures_marker(run_dir, study).is_file():
        return True
    # runs made before the marker existed: the study's own figure files
    folder = run_dir / FIGURES_DIR
    return folder.is_dir() and any(p.name.startswith(f"{study}_") for p in folder.iterdir())


@dataclass
class StudyState:
    """One planned study's stages: which are done, which are left (in order)."""

    name: str
    done: dict[str, bool]

    @property
    def left(self) -> list[str]:
        return [s for s in STAGES if s in self.done and not self.done[s]]

    @property
    def complete(self) -> bool:
        return not self.left


@dataclass
class RunState:
    run_dir: Path
    finished: bool                    # meta.json has finished_at: the sweep (or a resume) reached its end
    direct: bool                      # studies ran without notebooks
    studies: dict[str, StudyState] = field(default_factory=dict)

    @property
    def left(self) -> dict[str, list[str]]:
        """{study: stages left} for every study that is not complete, in plan order."""
        return {n: s.left for n, s in self.studies.items() if s.left}

    def describe_left(self) -> str:
        """'fp32_memory (notebook, html, figures); correctness (table, ...)' or 'nothing'."""
        return "; ".join(f"{n} ({', '.join(stages)})" for n, stages in self.left.items()) or "nothing"


def study_state(run_dir: Path | str, study: str, direct: bool) -> StudyState:
    run = RunFolder(Path(run_dir))
    done = {"table": run.table(study).is_file()}
    if not direct:
        done["notebook"] = notebook_done(run.file(study, ".ipynb"))
        done["html"] = run.file(study, ".html").is_file()
    done["figures"] = _figures_drawn(run.path, study)
    return StudyState(study, done)


def _typed(meta: RunMeta | Mapping[str, Any]) -> RunMeta:
    return meta if isinstance(meta, RunMeta) else RunMeta.from_dict(dict(meta))


def run_state(run_dir: Path | str, meta: RunMeta | Mapping[str, Any]) -> RunState:
    """The state of every study ``meta`` (the run's meta.json, already read) planned."""
    meta = _typed(meta)
    direct = (meta.params or {}).get("mode") != "papermill"
    return RunState(run_dir=Path(run_dir), finished=bool(meta.finished_at), direct=direct,
                    studies={name: study_state(run_dir, name, direct) for name in meta.plan})


def open_failures(meta: RunMeta | Mapping[str, Any]) -> list[str]:
    """The failures of a run that no later resume has mended (`RunMeta.open_failures`)."""
    return _typed(meta).open_failures()


# --------------------------------------------------------------------------- run folders

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text, empty: str | None = None, what: str = "name") -> str:
    """The file-name-safe form of ``text``: letters, digits, '.', '_' and '-' kept, every run of
    other characters one '-', no '-' or '.' at either end (no hidden files, no option dash).
    Where nothing is left: ``empty``, or without one a ValueError naming ``what`` and ``text``."""
    out = _UNSAFE.sub("-", str(text)).strip("-.")
    if out or empty is not None:
        return out or empty
    raise ValueError(f"{what} {text!r} has no usable characters")


class RunLock:
    """An exclusive flock on a run folder (``<run>/.lock``) while a process works in it. The
    operating system drops it when the holder exits, however it exits, so a folder whose lock can
    be taken is not being worked on. The file records the holder's pid and host for people."""

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

    def __enter__(self) -> "RunLock":
        if not self.acquire():
            raise RuntimeError(f"run folder {self.path.parent} is in use by another process "
                               f"({self.holder() or 'unknown holder'})")
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def holder(self) -> str:
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""


def run_in_use(run_dir: Path | str) -> bool:
    """Whether another process holds the run folder's lock now. Only reads (the lock file is
    opened read-only, never made, so a read-only results folder works): a shared flock probe
    conflicts with the holder's exclusive one. A lock file that cannot be opened counts as not in
    use: this only informs; `RunLock.acquire` is what keeps two processes out of one folder."""
    import errno
    import fcntl

    try:
        fd = os.open(Path(run_dir) / RunLock.NAME, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RunFolder:
    """One run folder: where its files are, its lock, its record and its stages."""

    path: Path

    @classmethod
    def find(cls, results: Path | str, name: str) -> "RunFolder":
        """``name`` as a folder, or a folder name under ``results``; SystemExit otherwise."""
        for candidate in (Path(name), Path(results) / name):
            if (candidate / META_NAME).is_file():
                return cls(candidate)
        raise SystemExit(f"--resume {name!r}: no run folder with a meta.json there or under {results}/")

    @property
    def name(self) -> str:
        return self.path.name

    def file(self, study: str, suffix: str) -> Path:
        return self.path / f"{study}{suffix}"

    def table(self, study: str) -> Path:
        return self.file(study, ".parquet")

    def lock(self) -> RunLock:
        return RunLock(self.path)

    def in_use(self) -> bool:
        return run_in_use(self.path)

    def meta(self) -> RunMeta:
        """Its meta.json, read and checked (MetaError otherwise)."""
        return RunMeta.from_json(self.path / META_NAME)

    def state(self, meta: RunMeta | None = None) -> RunState:
        return run_state(self.path, meta if meta is not None else self.meta())
