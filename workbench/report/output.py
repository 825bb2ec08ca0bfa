"""The report's own folder: ``<results>/report/`` or an ``--out`` folder that is new, empty, or
marked as the report's (``.workbench-report.json``, listing every file it wrote, with its size).
Every other folder is refused before any work (`check_report_dir`). A report is built in a
temporary folder beside its target and renamed into place (`swap_in`), so a failed build leaves
the previous report and every run folder as they were.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from ..files import atomic_write_text, read_regular
from ..provenance import iso_utc, results_root
from ..runmeta import META_NAME
from .runs import REFERENCE_DIRNAME, ReportError
from .views import _regular

REPORT_MARKER = ".workbench-report.json"      # in every report folder the report builds


REPORT_TITLE = "Workbench report"             # the <title> of index.html


_LEFTOVER = r"\.{name}\.(?:building|old)-\d+-[0-9a-f]{{8}}"


_SHOW_AT_MOST = 5


class UnsafeOutDir(ReportError, ValueError):
    """A folder the report will not write into: replacing it could lose something the report did
    not write (see `check_report_dir`)."""



def _token() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"



def _looks_like_run(d: Path) -> bool:
    try:
        return (d / META_NAME).is_file() or any(d.glob("*.parquet"))
    except OSError:
        return False



def _some(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOW_AT_MOST])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _SHOW_AT_MOST else "")



def _walk_files(root: Path) -> tuple[dict[str, int], list[str]]:
    """{relative path: size} of the regular files under ``root``, and what else is there (links,
    special files, folders that cannot be read), relative to ``root``."""
    files: dict[str, int] = {}
    other: list[str] = []

    def unreadable(e: OSError) -> None:
        other.append(os.path.relpath(e.filename, root) if e.filename else str(e))

    for here, dirs, names in os.walk(root, onerror=unreadable, followlinks=False):
        rel_here = Path(os.path.relpath(here, root))
        for d in list(dirs):
            if os.path.islink(os.path.join(here, d)):
                other.append((rel_here / d).as_posix())
                dirs.remove(d)
        for n in names:
            full = os.path.join(here, n)
            rel = (rel_here / n).as_posix()
            try:
                st = os.lstat(full)
            except OSError:
                other.append(rel)
                continue
            if stat.S_ISREG(st.st_mode):
                files[rel] = st.st_size
            else:
                other.append(rel)
    return files, other



def _read_marker(folder: Path) -> dict | None:
    try:
        doc = json.loads(read_regular(folder / REPORT_MARKER).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None



def _foreign_in_report(folder: Path) -> list[str] | None:
    """What in the report folder ``folder`` the report did not write: every file its marker does
    not list with that size, and anything that is not a plain file. None when ``folder`` holds
    no marker: it is no report folder, whatever else it holds."""
    if not _regular(folder / REPORT_MARKER):
        return None
    files, other = _walk_files(folder)
    marker = _read_marker(folder)
    written = marker.get("files") if marker else None
    if not isinstance(written, dict):
        return [f"{REPORT_MARKER} (unreadable, or it lists no files)"]
    files.pop(REPORT_MARKER, None)
    return other + [rel for rel, size in files.items() if written.get(rel) != size]



def check_report_dir(out_dir: Path | str, results_dir: Path | str | None = None) -> str:
    """Whether the report may be written to ``out_dir`` (replacing it as a whole): returns
    ``"new"`` (it does not exist), ``"empty"`` or ``"report"`` (a report folder: its marker,
    and only the files the marker lists). Raises UnsafeOutDir, naming the folder, saying why and
    what to do, for anything else: the results folder itself, a folder that holds it, a run
    folder, a folder inside a run folder or holding run folders, a file, a non-empty folder
    without the marker (a saved copy of a report's page beside other files included), or a
    report folder holding anything the report did not write.
    """
    out_dir = Path(out_dir)
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out, results = out_dir.resolve(), results_dir.resolve()
    todo = ("Pass --out with a new or empty folder, or with a folder the report wrote "
            f"(one with {REPORT_MARKER} in it).")

    def refuse(why: str) -> UnsafeOutDir:
        return UnsafeOutDir(f"refusing to write the report into {out_dir}: {why}. {todo}")

    if out == results:
        raise refuse("it is the results folder itself; the report replaces its whole folder, which "
                     "would delete every run folder in it")
    if out in results.parents:
        raise refuse(f"it holds the results folder {results_dir}; the report replaces its whole "
                     "folder, which would delete every run folder in it")
    if out.is_dir() and _looks_like_run(out):
        raise refuse("it is a run folder (it holds a meta.json or tables), not a report folder")
    if results in out.parents:
        for above in out.parents:
            if above == results:
                break
            if _looks_like_run(above):
                raise refuse(f"it is inside the run folder {above}; a run folder holds results only")
    if not out.exists():
        if out_dir.is_symlink():
            raise refuse("it is a link to a folder that does not exist")
        return "new"
    if not out.is_dir():
        raise refuse("it is a file, not a folder")
    try:
        entries = sorted(out.iterdir())
    except OSError as e:
        raise refuse(f"it cannot be listed ({e.strerror or e})") from e
    if not entries:
        return "empty"
    runs = [c.name for c in entries if c.is_dir() and not c.is_symlink() and _looks_like_run(c)]
    ref = out / REFERENCE_DIRNAME
    if ref.is_dir() and not ref.is_symlink():
        try:
            runs += [f"{REFERENCE_DIRNAME}/{c.name}" for c in sorted(ref.iterdir())
                     if c.is_dir() and _looks_like_run(c)]
        except OSError:
            pass
    if runs:
        raise refuse(f"it holds run folders ({_some(runs)}); the report replaces its whole folder, "
                     "which would delete them")
    foreign = _foreign_in_report(out)
    if foreign is None:
        raise refuse(f"it is not empty ({_some([e.name for e in entries])}) and holds no {REPORT_MARKER}, "
                     "so it is not a folder the report wrote, and the report replaces its whole "
                     "folder")
    if foreign:
        raise refuse(f"it is a report folder, but holds files the report did not write or that "
                     f"changed since ({_some(foreign)}), which replacing it would delete; move them "
                     "out first")
    return "report"



def _write_marker(folder: Path, results_dir: Path, files: dict[str, int] | None) -> None:
    doc = {"written_by": "python -m workbench report (workbench.report.build_report)",
           "built_at": iso_utc(timespec="seconds"),
           "results": str(results_dir),
           "note": ("The report replaces this whole folder each time it is built, after checking "
                    "that it holds only the files listed here; keep nothing else in it."),
           "files": files}
    atomic_write_text(folder / REPORT_MARKER, json.dumps(doc, indent=1) + "\n")



class _FolderLock:
    """An exclusive flock on a folder (its own descriptor), held while the block runs; a folder
    that cannot be opened is not locked (the lock only orders concurrent builds)."""

    def __init__(self, folder: Path, wait: bool = True):
        self.folder, self.wait, self.fd, self.held = folder, wait, None, False

    def __enter__(self) -> "_FolderLock":
        import fcntl

        try:
            self.fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            self.held = True
        except OSError:
            pass
        return self

    def __exit__(self, *exc) -> bool:
        if self.fd is not None:
            os.close(self.fd)                # closing drops the flock
            self.fd = None
        return False



def _remove_leftovers(out: Path) -> None:
    """Folders that builds into ``out`` killed mid-way left beside it (``.<name>.building-*``,
    ``.<name>.old-*``), where no build holds them and they are the report's own (its marker).
    Anything else is left alone."""
    pattern = re.compile(_LEFTOVER.format(name=re.escape(out.name)))
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return
    for d in siblings:
        if not pattern.fullmatch(d.name) or d.is_symlink() or not d.is_dir():
            continue
        with _FolderLock(d, wait=False) as lock:
            # a build writes its marker only once it holds its folder's lock
            if lock.held and _regular(d / REPORT_MARKER):
                shutil.rmtree(d, ignore_errors=True)



def _swap_in(tmp: Path, out_dir: Path, results_dir: Path) -> None:
    """Replace ``out_dir`` with the finished report in ``tmp``: checked again right before, the old
    folder moved aside, the new one moved in, the old one removed. If moving the new one in fails,
    the old one is moved back."""
    out = out_dir.resolve()
    with _FolderLock(out.parent):            # one build at a time swaps into this folder
        check_report_dir(out_dir, results_dir)
        backup = None
        if out.exists():
            backup = out.with_name(f".{out.name}.old-{_token()}")
            os.rename(out, backup)
        try:
            os.rename(tmp, out)
        except BaseException as e:
            if backup is not None:
                try:
                    os.rename(backup, out)
                except OSError as e2:
                    raise ReportError(
                        f"cannot write the report to {out_dir}: {e}; and the previous report could not "
                        f"be moved back ({e2.strerror or e2}): it is at {backup}") from e
            raise
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
        _remove_leftovers(out)



def _write_failure(out_dir: Path, e: OSError) -> str:
    import errno

    why = e.strerror or str(e) or type(e).__name__
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        hint = "free some disk space, or pass --out DIR on another disk"
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "the folder is not writable: pass --out DIR to write the report somewhere writable"
    else:
        hint = "pass --out DIR to write the report elsewhere"
    return (f"cannot write the report to {out_dir}: {why}{where}; {hint}. The previous report there "
            f"(if any) and every run folder are unchanged.")
