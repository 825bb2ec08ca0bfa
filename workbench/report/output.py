"""The report's own folder: ``<results>/report/`` or an ``--out`` folder that is new, empty, or marked
by the report (``.workbench-report.json``, listing every file it wrote with its size). Every other
folder is refused before any work; a report is built beside its folder and renamed into place.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from ..files import atomic_write_text, file_kind, read_regular
from ..provenance import iso_utc, results_root
from ..runmeta import META_NAME
from .runs import ReportError

REPORT_MARKER = ".workbench-report.json"
REPORT_TITLE = "Workbench report"             # the <title> of index.html
_SHOW_AT_MOST = 5


class UnsafeOutDir(ReportError, ValueError):
    """A folder the report will not write into: replacing it could lose what the report did not write."""


def _token() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _regular(path: Path) -> bool:
    try:
        return file_kind(path, follow=False) is None
    except OSError:
        return False


def _looks_like_run(d: Path) -> bool:
    try:
        return (d / META_NAME).is_file() or any(d.glob("*.parquet"))
    except OSError:
        return False


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOW_AT_MOST])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _SHOW_AT_MOST else "")


def _walk_files(root: Path) -> tuple[dict[str, int], list[str]]:
    """{relative path: size} of the regular files under ``root``, and everything else there (links,
    special files, folders that cannot be read)."""
    files: dict[str, int] = {}
    other: list[str] = []
    for here, dirs, names in os.walk(root, onerror=lambda e: other.append(os.path.relpath(e.filename, root))):
        for n in dirs + names:
            rel = os.path.relpath(os.path.join(here, n), root).replace(os.sep, "/")
            try:
                st = os.lstat(os.path.join(here, n))
            except OSError:
                other.append(rel)
                continue
            if stat.S_ISREG(st.st_mode):
                files[rel] = st.st_size
            elif not stat.S_ISDIR(st.st_mode):
                other.append(rel)
    return files, other


def _not_written_by_report(folder: Path) -> list[str]:
    """What in a marked ``folder`` the marker does not list with its size, and anything not a plain file."""
    files, other = _walk_files(folder)
    try:
        written = json.loads(read_regular(folder / REPORT_MARKER))["files"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        written = None
    if not isinstance(written, dict):
        return [f"{REPORT_MARKER} (unreadable, or it lists no files)"]
    files.pop(REPORT_MARKER, None)
    return other + [rel for rel, size in files.items() if written.get(rel) != size]


def check_report_dir(out_dir: Path | str, results_dir: Path | str | None = None) -> str:
    """Whether the report may replace ``out_dir`` as a whole: "new", "empty" or "report" (the marker,
    and only the files it lists). UnsafeOutDir, naming the folder and why, for anything else."""
    out_dir = Path(out_dir)
    results_dir = Path(results_dir) if results_dir is not None else results_root()
    out, results = out_dir.resolve(), results_dir.resolve()

    def refuse(why: str) -> UnsafeOutDir:
        return UnsafeOutDir(f"refusing to write the report into {out_dir}: {why}. Pass --out with a new or "
                            f"empty folder, or with a folder the report wrote (one with {REPORT_MARKER} in it).")

    if out == results or out in results.parents:
        held = "it is the results folder itself" if out == results else f"it holds the results folder {results_dir}"
        raise refuse(f"{held}; the report replaces its whole folder, which would delete every run folder in it")
    for d in (out, *(d for d in out.parents if results in d.parents)):
        if _looks_like_run(d):
            where = "it is a run folder" if d == out else f"it is inside the run folder {d}"
            raise refuse(f"{where}; a run folder holds results only")
    if not out.exists():
        if out_dir.is_symlink():
            raise refuse("it is a link to a folder that does not exist")
        return "new"
    if not out.is_dir():
        raise refuse("it is a file, not a folder")
    try:
        entries = sorted(p.name for p in out.iterdir())
    except OSError as e:
        raise refuse(f"it cannot be listed ({e.strerror or e})") from e
    if not entries:
        return "empty"
    if not _regular(out / REPORT_MARKER):
        raise refuse(f"it is not empty ({_some(entries)}) and holds no {REPORT_MARKER}, so it is not a folder "
                     "the report wrote, and the report replaces its whole folder")
    foreign = _not_written_by_report(out)
    if foreign:
        raise refuse(f"it is a report folder, but holds files the report did not write or that changed since "
                     f"({_some(foreign)}), which replacing it would delete; move them out first")
    return "report"


def write_marker(folder: Path, results_dir: Path, final: bool) -> None:
    """The report's marker in ``folder``; ``final``: listing every file written there, with its size."""
    files = _walk_files(folder)[0] if final else None
    if files is not None:
        files.pop(REPORT_MARKER, None)
    doc = {"written_by": "python -m workbench report (workbench.report.build_report)",
           "built_at": iso_utc(timespec="seconds"), "results": str(results_dir),
           "note": ("The report replaces this whole folder each time it is built, after checking "
                    "that it holds only the files listed here; keep nothing else in it."),
           "files": files}
    atomic_write_text(folder / REPORT_MARKER, json.dumps(doc, indent=1) + "\n")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:             # another user's process
        pass
    return True


def _remove_leftovers(out: Path) -> None:
    """Folders that killed builds into ``out`` left beside it: the report's marker in them and their
    process gone (its id is in the name). Anything else is left alone."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?:building|old)-(\d+)-[0-9a-f]{{8}}")
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return
    for d in siblings:
        m = pattern.fullmatch(d.name)
        if m and not d.is_symlink() and _regular(d / REPORT_MARKER) and not _running(int(m[1])):
            shutil.rmtree(d, ignore_errors=True)


def swap_in(tmp: Path, out_dir: Path, results_dir: Path) -> None:
    """Replace ``out_dir`` with the finished report in ``tmp``, checked again right before; the old
    folder is moved aside and back again if moving the new one in fails."""
    check_report_dir(out_dir, results_dir)
    out = out_dir.resolve()
    backup = out.with_name(f".{out.name}.old-{_token()}") if out.exists() else None
    if backup is not None:
        os.rename(out, backup)
    try:
        os.rename(tmp, out)
    except BaseException as e:
        if backup is not None:
            try:
                os.rename(backup, out)
            except OSError as e2:
                raise ReportError(f"cannot write the report to {out_dir}: {e}; and the previous report could "
                                  f"not be moved back ({e2.strerror or e2}): it is at {backup}") from e
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
    _remove_leftovers(out)


def write_failure(out_dir: Path, e: OSError) -> str:
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        hint = "free some disk space, or pass --out DIR on another disk"
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "the folder is not writable: pass --out DIR to write the report somewhere writable"
    else:
        hint = "pass --out DIR to write the report elsewhere"
    return (f"cannot write the report to {out_dir}: {e.strerror or e}{where}; {hint}. The previous report "
            "there (if any) and every run folder are unchanged.")
