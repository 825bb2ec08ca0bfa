"""The report's drawing cache: what a study's summary drew for one view (its figures, finding and key-number
tables), a study's comparisons, and the page's answers, kept under ``<results>/.cache/report/`` and reused while
everything they were made from is unchanged, so that a page is drawn once per change, not once per build.

Keys are content, never time. Every key starts from `code_digest`: every file of the workbench package (the studies'
summaries, the plotting helpers, the report itself: any edit draws everything again), the versions of Python,
numpy, pandas, pyarrow, matplotlib and Pillow, matplotlib's rc file and fonts, the image-mix file and
``$WORKBENCH_LIMITS``. A view's key adds the study, its summary module and `frame_digest` of the very table its
summarize is given (every value, dtype, column name and attribute: the rows of its runs, as the run folders' tables
and meta.json make them); a study's comparisons add its whole table and its runs' start times; the answers add
`results_digest`, the bytes of every file of the results folder they may read. Only studies whose summary is a
module of this package are cached (their code is in the digest); any other study is drawn every time.

An entry is a folder ``<key>/``: ``value.pickle``, the files it wrote under ``files/``, and ``entry.json`` listing
each one's size and SHA-256, written in a temporary folder and renamed into place (a killed build leaves no part
of an entry). An entry whose files do not match its ``entry.json`` is removed and drawn again, never used; its
pickle is loaded only after its checksum matches (the folder is as trusted as the checkout: anyone who can write
it can edit the code). `prune` keeps the folder under `MAX_BYTES`, removing the entries used longest ago, never one
of this build's. Nothing here reads or writes a run folder's files but through the hashes above.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from ..files import atomic_write_bytes, read_regular
from ..results import AUDITS_DIR, REFERENCE_DIRNAME
from .output import REPORT_MARKER, build_token

CACHE_DIR = (".cache", "report")      # under the results folder (ignored by git, as all of results/ but reference/)
FORMAT = 1                           # bumped when an entry's layout changes
MAX_BYTES = 1 << 30                  # the whole cache; a full report of the committed runs draws about 55 MB
ENTRY = "entry.json"
VALUE = "value.pickle"
FILES = "files"
_NOT_READ = (".ipynb", ".html", ".png", ".svg", ".pdf")     # what no answer reads from a results folder
_TMP = re.compile(r"\.tmp-(\d+)-[0-9a-f]{8}")


def _update_file(h, path: Path) -> None:
    """``path``'s bytes into the digest ``h``, or why it cannot be read (a link, a FIFO: never followed)."""
    try:
        data = read_regular(path)
    except OSError as e:
        h.update(f"unreadable {e.errno} {e.strerror}\0".encode())
        return
    h.update(f"{len(data)}\0".encode())
    h.update(data)


def code_digest(package: Path | None = None) -> str:
    """What every drawing depends on besides its data: the files of the workbench package (``package``: another
    folder's), the libraries' versions, matplotlib's configuration and fonts, the image mixes and the caps."""
    from importlib import metadata

    import matplotlib
    from matplotlib import font_manager

    from .. import limits, mixes

    h = hashlib.sha256(f"workbench report cache {FORMAT}\0python {sys.version}\0".encode())
    for dist in ("numpy", "pandas", "pyarrow", "matplotlib", "pillow"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "absent"
        h.update(f"{dist} {version}\0".encode())
    h.update(f"MPLBACKEND={os.environ.get('MPLBACKEND', '')}\0{limits.LIMITS_ENV}="
             f"{os.environ.get(limits.LIMITS_ENV, '')}\0".encode())
    fonts = sorted((f.fname, f.name, f.style, str(f.weight), f.stretch) for f in font_manager.fontManager.ttflist)
    h.update(repr(fonts).encode())
    for path in (Path(matplotlib.matplotlib_fname()), mixes.MIX_FILE):
        h.update(f"{path.name}\0".encode())
        _update_file(h, path)
    package = Path(package) if package is not None else Path(__file__).resolve().parent.parent
    for here, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(n for n in names if not n.endswith((".pyc", ".pyo"))):
            path = Path(here) / name
            h.update(f"{path.relative_to(package).as_posix()}\0".encode())
            _update_file(h, path)
    return h.hexdigest()


def frame_digest(df) -> str:
    """A digest of a DataFrame's content: its shape, column names and dtypes, attrs, index and every value (the
    bytes of numeric columns; type and repr of each object, so 1 and "1" differ)."""
    import numpy as np
    import pandas as pd

    h = hashlib.sha256()
    h.update(repr((df.shape, [str(c) for c in df.columns], [str(t) for t in df.dtypes],
                   sorted((str(k), repr(v)) for k, v in df.attrs.items()))).encode())

    def series(s) -> None:
        dtype = s.dtype
        if isinstance(dtype, pd.CategoricalDtype):
            h.update(b"categorical\0")
            series(pd.Series(s.cat.categories))
            h.update(np.ascontiguousarray(s.cat.codes.to_numpy()).tobytes())
            return
        if isinstance(dtype, np.dtype) and dtype.kind in "biufcmM":
            h.update(f"{dtype.str}\0".encode())
            h.update(np.ascontiguousarray(s.to_numpy()).tobytes())
            return
        values = s.to_numpy(dtype=object)
        if pd.api.types.infer_dtype(values, skipna=False) == "string":
            encoded = [v.encode("utf-8", "surrogatepass") for v in values]
            h.update(b"str\0" + np.fromiter(map(len, encoded), np.int64, len(encoded)).tobytes())
            h.update(b"".join(encoded))
            return
        h.update(repr([(type(v).__qualname__, v) for v in values]).encode())

    if isinstance(df.index, pd.RangeIndex):
        h.update(repr(("range", df.index.start, df.index.stop, df.index.step)).encode())
    else:
        series(df.index.to_series())
    for i in range(df.shape[1]):
        series(df.iloc[:, i])
    return h.hexdigest()


def results_digest(results_dir: Path) -> str:
    """The bytes of every file of the results folder and its reference/ that an answer may read (all but notebooks
    and figures; never the report's own folders, nor hidden ones), each named by its path; the saved audits by
    their time too, since the newest by file time is the one shown."""
    h = hashlib.sha256(f"{Path(results_dir).resolve()}\0".encode())
    for root in (Path(results_dir), Path(results_dir) / REFERENCE_DIRNAME):
        if not root.is_dir():
            continue
        h.update(f"root {root.name}\0".encode())
        for here, dirs, names in os.walk(root):
            if Path(here) != root and REPORT_MARKER in names:        # a report folder: what it shows, not data
                dirs[:] = []
                continue
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (here == str(root) and d == REFERENCE_DIRNAME))
            for name in sorted(names):
                path = Path(here) / name
                rel = path.relative_to(root).as_posix()
                try:
                    st = os.lstat(path)
                    if stat.S_ISLNK(st.st_mode):
                        h.update(f"{rel}\0link {os.readlink(path)}\0".encode())
                    elif stat.S_ISREG(st.st_mode) and not name.endswith(_NOT_READ):
                        h.update(f"{rel}\0".encode())
                        if AUDITS_DIR in Path(rel).parts:
                            h.update(f"{st.st_mtime_ns}\0".encode())
                        _update_file(h, path)
                except OSError as e:
                    h.update(f"{rel}\0unreadable {e.errno}\0".encode())
    return h.hexdigest()


def files_under(folder: Path) -> set[str]:
    """The regular files under ``folder`` (no link followed), relative to it."""
    out = set()
    for here, dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(here, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                out.add(os.path.relpath(path, folder).replace(os.sep, "/"))
    return out


def _safe_rel(rel: Any) -> bool:
    parts = rel.split("/") if isinstance(rel, str) else []
    return bool(parts) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


class DrawCache:
    """The cache folder of one build; ``root`` None: nothing is read or written (``--no-cache``)."""

    def __init__(self, root: Path | None, salt: str | None = None):
        self.root, self._salt = root, salt
        self.used: set[str] = set()          # the entries this build read or wrote: never pruned by it
        self.problem: str | None = None      # the first write that failed (a read-only results folder)

    @classmethod
    def for_results(cls, results_dir: Path, enabled: bool = True) -> "DrawCache":
        if not enabled:
            return cls(None)
        return cls(Path(results_dir).joinpath(*CACHE_DIR))

    @property
    def enabled(self) -> bool:
        return self.root is not None

    @property
    def salt(self) -> str:
        """`code_digest`, worked out at the first key; where that fails, the cache is left alone (all is drawn)."""
        if self._salt is None:
            try:
                self._salt = code_digest()
            except Exception as e:  # noqa: BLE001 - a cache that cannot key its entries is not used
                self.problem = f"the drawing cache is not used: {type(e).__name__}: {e}"
                self.root, self._salt = None, ""
        return self._salt

    def key(self, *parts: Any) -> str:
        return hashlib.sha256(repr((self.salt, parts)).encode()).hexdigest()

    def get(self, key: str, files_to: Path | None = None) -> tuple[bool, Any]:
        """(True, value) with its files written under ``files_to``, or (False, None) where there is no good entry
        (a bad one is removed)."""
        if self.root is None:
            return False, None
        entry = self.root / key
        if not entry.is_dir() or entry.is_symlink():
            if entry.is_symlink() or entry.exists():
                self._remove(entry)
            return False, None
        try:
            doc = json.loads(read_regular(entry / ENTRY, 1 << 24))
            if doc.get("format") != FORMAT or doc.get("key") != key or not isinstance(doc.get("files"), dict):
                raise ValueError("not an entry of this format")
            blob = self._checked(entry / VALUE, doc.get("value"))
            files = {}
            for rel, want in doc["files"].items():
                if not _safe_rel(rel) or files_to is None:
                    raise ValueError(f"a file {rel!r} it cannot hold")
                files[rel] = self._checked(entry / FILES / rel, want)
            value = pickle.loads(blob)
        except Exception:  # noqa: BLE001 - a damaged entry, whatever is wrong with it, is drawn again
            self._remove(entry)
            return False, None
        for rel, data in files.items():
            target = files_to / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        self.used.add(key)
        try:
            os.utime(entry / ENTRY)       # used now: pruned last
        except OSError:
            pass
        return True, value

    @staticmethod
    def _checked(path: Path, want: Any) -> bytes:
        data = read_regular(path)
        if (not isinstance(want, list) or len(want) != 2 or want[0] != len(data)
                or want[1] != hashlib.sha256(data).hexdigest()):
            raise ValueError(f"{path.name}: size or checksum differs from {ENTRY}")
        return data

    def _remove(self, entry: Path) -> None:
        try:
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink()
            else:
                shutil.rmtree(entry)
        except OSError:
            pass

    def put(self, key: str, value: Any, files_from: Path | None = None, files: list[str] = ()) -> str | None:
        """Store ``value`` and ``files`` (relative to ``files_from``) as the entry ``key``; the problem where it
        could not be written (the build goes on without it), None otherwise (another build storing it first too)."""
        if self.root is None:
            return None
        tmp = self.root / f".tmp-{build_token()}"
        try:
            listed = {}
            for rel in files:
                if not _safe_rel(rel):
                    return None                 # not stored: drawn again next time
                data = read_regular(files_from / rel)
                target = tmp / FILES / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                listed[rel] = [len(data), hashlib.sha256(data).hexdigest()]
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / VALUE).write_bytes(blob)
            doc = {"format": FORMAT, "key": key, "value": [len(blob), hashlib.sha256(blob).hexdigest()],
                   "files": listed}
            atomic_write_bytes(tmp / ENTRY, (json.dumps(doc, indent=1) + "\n").encode())
            try:
                os.rename(tmp, self.root / key)
            except OSError:
                if not (self.root / key).is_dir():
                    raise
            self.used.add(key)
            return None
        except (OSError, pickle.PicklingError, TypeError, AttributeError, RecursionError) as e:
            what = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
            self.problem = self.problem or f"the drawing cache {self.root} could not be written ({what})"
            return self.problem
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def prune(self, max_bytes: int = MAX_BYTES) -> None:
        """Remove what killed builds left, entries without a readable ``entry.json``, and the entries used longest
        ago until the cache holds at most ``max_bytes`` (this build's entries stay, whatever their size)."""
        if self.root is None or not self.root.is_dir():
            return
        entries = []
        for d in self.root.iterdir():
            m = _TMP.fullmatch(d.name)
            if m:
                try:
                    os.kill(int(m[1]), 0)       # its build is still running
                except (ProcessLookupError, OverflowError):
                    self._remove(d)
                except OSError:
                    pass
                continue
            try:
                when = os.stat(d / ENTRY, follow_symlinks=False).st_mtime
                size = sum(os.lstat(os.path.join(here, n)).st_size for here, _, names in os.walk(d) for n in names)
            except OSError:
                self._remove(d)
                continue
            entries.append((when, d.name, size))
        total = sum(size for _, _, size in entries)
        for when, name, size in sorted(entries):
            if total <= max_bytes:
                break
            if name not in self.used:
                self._remove(self.root / name)
                total -= size
