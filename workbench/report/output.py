"""The report's own folder (results/report/, or an --out folder that is new, empty or marked by the report), built
beside it and renamed into place; in it, copies of what the page links, notebooks' HTML cleaned by nh3."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from ..files import atomic_write_text, read_regular
from ..provenance import iso_utc, results_folder
from ..results import META_NAME
from ..results import holds_run
from ..notebook_path import localize_html, nh3_missing
from ..results import ReportError, Run, file_problem, why_unreadable

REPORT_MARKER = ".workbench-report.json"
RUNS_DIRNAME = "runs"                # <report>/runs/<run folder>/: copies of what the page links
class UnsafeOutDir(ReportError, ValueError):
    """A folder the report will not write into: replacing it could lose what the report did not write."""


def build_token() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")


def _walk_files(root: Path) -> tuple[dict[str, int], list[str]]:
    """{relative path: size} of the regular files under ``root`` but the marker, and all else (links, ...)."""
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
    files.pop(REPORT_MARKER, None)
    return files, other


def check_report_dir(out_dir: Path | str, results_dir: Path | str | None = None) -> str:
    """"new", "empty" or "report" (only the files its marker lists) where the report may replace ``out_dir``."""
    out_dir = Path(out_dir)
    results_dir = results_folder(results_dir, "results_dir")
    out, results = out_dir.resolve(), results_dir.resolve()

    def refuse(why: str) -> UnsafeOutDir:
        return UnsafeOutDir(f"refusing to write the report into {out_dir}: {why}. Pass --out with a new or "
                            f"empty folder, or with a folder the report wrote (one with {REPORT_MARKER} in it).")

    if out == results or out in results.parents:
        held = "it is the results folder itself" if out == results else f"it holds the results folder {results_dir}"
        raise refuse(f"{held}; the report replaces its whole folder, which would delete every run folder in it")
    run = next((d for d in (out, *(d for d in out.parents if results in d.parents)) if holds_run(d)), None)
    if run is not None:
        where = "it is a run folder" if run == out else f"it is inside the run folder {run}"
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
    if file_problem(out / REPORT_MARKER):
        raise refuse(f"it is not empty ({_some(entries)}) and holds no {REPORT_MARKER}, so it is not a folder "
                     "the report wrote, and the report replaces its whole folder")
    files, foreign = _walk_files(out)
    try:
        written = json.loads(read_regular(out / REPORT_MARKER))["files"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        written = None
    if isinstance(written, dict):
        foreign += [rel for rel, size in files.items() if written.get(rel) != size]
    else:
        foreign = [f"{REPORT_MARKER} (unreadable, or it lists no files)"]
    if foreign:
        raise refuse(f"it is a report folder, but holds files the report did not write or that changed since "
                     f"({_some(foreign)}), which replacing it would delete; move them out first")
    return "report"


def write_marker(folder: Path, results_dir: Path, final: bool) -> None:
    """The report's marker in ``folder``; ``final``: listing every file written there, with its size."""
    doc = {"written_by": "python -m workbench report (workbench.report.build_report)",
           "built_at": iso_utc(timespec="seconds"), "results": str(results_dir),
           "note": ("The report replaces this whole folder each time it is built, after checking "
                    "that it holds only the files listed here; keep nothing else in it."),
           "files": _walk_files(folder)[0] if final else None}
    atomic_write_text(folder / REPORT_MARKER, json.dumps(doc, indent=1) + "\n")


def swap_in(tmp: Path, out_dir: Path, results_dir: Path) -> None:
    """Replace ``out_dir`` (checked again) with ``tmp``, then remove what killed builds left beside it."""
    check_report_dir(out_dir, results_dir)
    out = out_dir.resolve()
    backup = out.with_name(f".{out.name}.old-{build_token()}") if out.exists() else None
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
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?:building|old)-(\d+)-[0-9a-f]{{8}}")
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return
    for d in siblings:
        m = pattern.fullmatch(d.name)
        if not m or d.is_symlink() or file_problem(d / REPORT_MARKER):
            continue
        try:
            os.kill(int(m[1]), 0)       # its build's process: running, or another user's
        except (ProcessLookupError, OverflowError):
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


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


def copy_linked(root: Path, runs: list[Run]) -> dict[tuple[str, str], str]:
    """{(run folder, "meta.json" | study): its copy under ``root``}; an unreadable file goes to ``skipped``."""
    links: dict[tuple[str, str], str] = {}
    notebooks = not nh3_missing()
    for r in (r for r in runs if not r.path.is_symlink()):       # a link to a folder elsewhere: none of it
        names = [META_NAME] + ([f"{study}.html" for study in r.tables] if notebooks else [])
        for name in (n for n in names if n not in r.skipped):
            try:
                text = read_regular(r.path / name).decode("utf-8", errors="replace")
            except FileNotFoundError:
                continue
            except OSError as e:
                r.skipped[name] = why_unreadable(e)
                continue
            target = root / RUNS_DIRNAME / r.name / name
            atomic_write_text(target, text if name == META_NAME else localize_html(text))
            key = "meta.json" if name == META_NAME else name[:-len(".html")]
            links[(r.name, key)] = target.relative_to(root).as_posix()
    return links
