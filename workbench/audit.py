"""``python -m workbench audit PATH [NEW]``: where a serving engine's model files normalize on the
device, read statically (the `ast` module; nothing of the engine is imported or run).

The seed of this project: an engine normalized uint8 pixels in the outer model, while its encoder
CUDA-graph path called the tower directly, so graph replays saw raw pixels (the correctness
matrix's outer x cudagraph cell, vllm #55370). Per model class this reads, from a vLLM source tree,
an installed package or a released wheel (``pip download vllm==X --no-deps``), in both places vLLM
keeps models (``vllm/model_executor/models`` and, from 0.34, ``vllm/models/<name>/...``):

- whether it normalizes on the device: it sets ``supports_mm_device_do_normalize = True`` (itself or
  a base class), vLLM's opt-in;
- where the norm runs, found by following the calls (`workbench.audit_calls`) from the encoder
  graph forward and from the eager entries down to each input-norm call: in the model class itself
  ("outer"), in a class it holds ("tower"), or in a patch embedding;
- whether it captures its encoder in CUDA graphs: ``SupportsEncoderCudaGraph`` among its bases;
- the verdict, from the workbench's correctness matrix: an outer norm is right under graphs only
  where the graph forward itself reaches it.

With NEW, both are audited and what changed between the two releases is printed: a release that
moves a norm or starts capturing an encoder is where the silent-wrong cell appears.

Static reading finds what the code says, not what a config switches at run time: a verdict is as
good as the names it looks for (`MARKERS`), and "check by hand" says where they did not suffice.
"""
from __future__ import annotations

import ast
import gc
import json
import os
import re
import warnings
import zipfile
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .audit_calls import MARKERS, PATCH, ClassInfo, Index, Site, read_module
from .engine_source import ZIP_ERRORS
from .files import atomic_write_text, open_regular, read_regular

MAX_FILE_BYTES = 4 << 20            # the largest model file of vLLM 0.33 is a few hundred kB
MAX_FILES = 20_000
MAX_TOTAL_BYTES = 512 << 20         # of sources, checked from their sizes before reading: an error, not a full memory
MODELS_DIR = ("vllm", "model_executor", "models")
MODELS_DIRS = (MODELS_DIR, ("vllm", "models"))
SHOWN_FROM = "/".join(MODELS_DIR) + "/"     # files shown relative to this folder; those elsewhere in full

VERDICTS = {
    "tower": "right on every path: the norm runs inside the tower, which eager, graph and dp all call",
    "patch embedding": "right on every path: the norm runs in the patch embedding, inside the tower",
    "outer+graphs": "WRONG under encoder CUDA graphs: the graph path calls the tower directly and skips "
                    "the outer model's norm (the outer x cudagraph cell)",
    "outer (in graph path)": "right on every path: the outer model normalizes inside a helper that the encoder "
                             "graph forward calls, so it is captured",
    "outer": "right today (no encoder CUDA graphs); wrong the day it captures its encoder",
    "double": "normalizes twice: in the outer model and again inside the tower",
    "unfound": "declares device normalization, but no norm call was found: check by hand",
    "processor": "normalizes on the CPU (the processor): right on every path",
}
ATTENTION = ("outer+graphs", "double", "unfound")        # the verdicts listed first, and exit 1


AUDIT_COLUMNS = ["model", "device norm", "norm in", "encoder graphs", "verdict"]


def audit_row(m: dict) -> tuple:
    """A model class's audit (`ModelAudit` as JSON data) in the words of AUDIT_COLUMNS."""
    return (m.get("model"), "yes" if m.get("device_norm") else "no", ", ".join(m.get("norm_in") or []) or "-",
            "yes" if m.get("encoder_graphs") else "no", m.get("verdict"))


class AuditError(ValueError):
    """A PATH that cannot be audited: ``str(e)`` names it and what is wrong."""


@dataclass
class ModelAudit:
    model: str
    file: str
    device_norm: bool
    norm_in: list[str]              # "outer", "tower", "patch embedding", as found
    where: list[str]                # Class file:line of each norm call
    encoder_graphs: bool
    verdict: str
    verdict_key: str
    graph_entry: str | None = None  # Class.encoder_cudagraph_forward, where one is implemented
    graph_path: list[str] = field(default_factory=list)     # the calls from it to a norm; [] where none reaches one
    eager_path: list[str] = field(default_factory=list)     # the same from an eager entry
    found_by: str = "calls"         # "calls" followed from the entries, or "scan" of all the class builds


@dataclass
class Audit:
    source: str
    engine: str
    version: str
    files: int
    models: list[ModelAudit]
    unreadable: list[str]
    omitted: int = 0                # model files not read: beyond MAX_FILES
    omitted_files: list[str] = field(default_factory=list)     # the first of them
    skipped: list[str] = field(default_factory=list)           # links to folders below the path: never followed

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def head(self) -> str:
        return f"{self.engine} {self.version} ({self.source}): {self.files} model files, {len(self.models)} classes"

    def named(self, m: ModelAudit) -> str:
        """The class's name, with its file where another audited class has the same name."""
        return f"{m.model} ({m.file})" if sum(x.model == m.model for x in self.models) > 1 else m.model

    def tail(self) -> list[str]:
        wrong = [self.named(m) for m in self.models if m.verdict_key in ATTENTION]
        out = [f"needs attention: {', '.join(wrong)}" if wrong else "no model class in the silent-wrong cell"]
        out += [f"unreadable: {u}" for u in self.unreadable]
        out += [f"skipped: {p} (a symbolic link; the audit never follows a link out of the tree it is given)"
                for p in self.skipped]
        if self.omitted:
            out.append(f"omitted: {self.omitted} model files beyond the first {self.files} were not read "
                       f"(first: {', '.join(self.omitted_files[:5])})")
        return out

    def table(self) -> str:
        """One line per model class that normalizes on the device or captures its encoder."""
        rows = [tuple(AUDIT_COLUMNS)] + [(self.named(m),) + audit_row(asdict(m))[1:] for m in self.models]
        width = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], width)) + "  " + r[4] for r in rows]
        return "\n".join([self.head(), *lines, *self.tail()])


def _shown(name: str) -> str:
    return name[len(SHOWN_FROM):] if name.startswith(SHOWN_FROM) else name


def _over_budget(path: Path, total: int) -> AuditError:
    return AuditError(f"audit {path}: the model files add up to more than MAX_TOTAL_BYTES "
                      f"({MAX_TOTAL_BYTES >> 20} MiB, {total} bytes so far); not a vLLM release, or audit a "
                      f"smaller part of it")


def _from_zip(path: Path) -> tuple[list, str, list[str]]:
    with open_regular(path, follow=False) as f, zipfile.ZipFile(f) as z:
        infos = [i for i in z.infolist() if i.filename.endswith(".py") and not i.is_dir()]
        prefixes = tuple("/".join(d) + "/" for d in MODELS_DIRS)
        models = [i for i in infos if i.filename.startswith(prefixes)] or infos
        kept, omitted = models[:MAX_FILES], [i.filename for i in models[MAX_FILES:]]
        small = [i for i in kept if i.file_size <= MAX_FILE_BYTES]
        total = sum(i.file_size for i in small)
        if total > MAX_TOTAL_BYTES:
            raise _over_budget(path, total)
        files = [(i.filename, z.read(i) if i.file_size <= MAX_FILE_BYTES else None) for i in kept]
        version = _wheel_version(path.name) or _version_of(
            {i.filename: z.read(i) for i in infos if i.filename.endswith(("vllm/version.py", "vllm/_version.py"))
             and i.file_size <= MAX_FILE_BYTES})
    return files, version, omitted


def _link_on_the_way(path: Path, target: Path) -> Path | None:
    """The first symbolic link from ``path`` (given: followed) down to ``target``, or None where there is none."""
    p = path
    for part in target.relative_to(path).parts:
        p = p / part
        if p.is_symlink():
            return p
    return None


def _sources(path: Path) -> tuple[list[tuple[str, bytes | None]], str, str, list[str], list[str]]:
    """([(name, bytes, or None where unreadable)] of the model files under ``path``, engine, version,
    [names not read: beyond MAX_FILES], [links to folders, not followed]); names are relative to the folder
    holding ``vllm/``."""
    if path.is_file() and zipfile.is_zipfile(path):
        files, version, omitted = _from_zip(path)
        return files, "vllm", version, omitted, []
    if not path.is_dir():
        raise AuditError(f"audit {path}: not a folder, a wheel or a zip of model files")
    # a source tree (holds vllm/), the installed package (is vllm/), or any folder of Python files
    pkg = next((p for p in (path / "vllm", path) if any(p.joinpath(*d[1:]).is_dir() for d in MODELS_DIRS)), None)
    roots = [(pkg.joinpath(*d[1:]), "/".join(d)) for d in MODELS_DIRS] if pkg else [(path, "")]
    files: list[tuple[str, bytes | None]] = []
    omitted: list[str] = []
    skipped: dict[str, None] = {}       # in order, once each
    total = 0
    for root, prefix in roots:
        if (link := _link_on_the_way(path, root)) is not None:      # os.walk would follow a link it starts at
            skipped[str(link)] = None
            continue
        for folder, dirs, names in os.walk(root):        # links are not followed out of the tree: named
            skipped.update((str(Path(folder) / d), None) for d in sorted(dirs) if (Path(folder) / d).is_symlink())
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                             and not (Path(folder) / d).is_symlink())
            for n in sorted(names):
                if not n.endswith(".py"):
                    continue
                p = Path(folder) / n
                name = "/".join(filter(None, [prefix, p.relative_to(root).as_posix()]))
                if len(files) >= MAX_FILES:
                    omitted.append(name)
                    continue
                try:
                    size = p.lstat().st_size
                    total += size if size <= MAX_FILE_BYTES else 0
                    if total > MAX_TOTAL_BYTES:
                        raise _over_budget(path, total)
                    files.append((name, read_regular(p, MAX_FILE_BYTES)))
                except OSError:
                    files.append((name, None))      # named as unreadable later
    found = {}
    for candidate in ((pkg / "version.py", pkg / "_version.py") if pkg else (path / "version.py",)):
        try:
            found[str(candidate)] = read_regular(candidate, MAX_FILE_BYTES)
        except OSError:
            pass
    return files, "vllm" if pkg else "engine", _version_of(found), omitted, list(skipped)


def _wheel_version(name: str) -> str | None:
    m = re.match(r"vllm-([0-9][^-]*)-", name)
    return m.group(1) if m else None


MAX_VERSION_CHARS = 64     # a release's version string; a longer "version" is not one (it names the saved file)


def _version_of(files: dict[str, bytes]) -> str:
    for text in files.values():
        m = re.search(rb"""(?:__version__|version)\s*(?::\s*\w+\s*)?=\s*["']([^"'\n]{1,%d})["']"""
                      % MAX_VERSION_CHARS, text)
        if m:
            return m.group(1).decode("ascii", "replace")
    return "unknown"


def _index(files: list[tuple[str, bytes | None]]) -> tuple[Index, list[str]]:
    """Every file parsed and read, with the cyclic garbage collector paused: a release is over a
    thousand files, and the collector's passes over the growing index (not the parsing) would take
    most of the time. It runs again, whatever happens, before this returns."""
    modules, bad = [], []
    was_on = gc.isenabled()
    gc.disable()
    try:
        for name, data in files:
            if data is None:
                bad.append(f"{_shown(name)} (not a regular file, unreadable or over {MAX_FILE_BYTES} bytes)")
                continue
            try:    # utf-8-sig: a byte-order mark is valid Python source, and plain utf-8 would refuse it
                tree = ast.parse(data.decode("utf-8-sig"), filename=name)
                modules.append(read_module(name, tree, _shown(name)))
            except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
                bad.append(f"{_shown(name)} ({type(e).__name__})")
    finally:
        if was_on:
            gc.enable()
    return Index(modules), bad


def _first(sites: list[Site]) -> list[str]:
    return min(sites, key=lambda s: len(s.path)).path if sites else []


def _scan_built(index: Index, model) -> dict[str, list[str]]:
    """{kind: [where]} of every norm call in the class and what it builds, 4 levels down: the reading
    before calls were followed, kept for classes whose entry points reach no norm (a call it cannot
    follow), so that those keep the verdict they had rather than fall to "check by hand"."""
    where: dict[str, list[str]] = {}
    lineage = index.lineage(model)
    for c in lineage:
        for line, patch in c.norm_calls:
            where.setdefault("patch embedding" if patch else "outer", []).append(f"{c.name} {c.module}:{line}")
    seen = {id(c) for c in lineage}
    todo = deque((n, c.mod, 1) for c in lineage for n in sorted(c.builds))
    while todo:
        n, mod, depth = todo.popleft()
        built = index.resolve(n, mod)
        if built is None or id(built) in seen or depth > 4:
            continue
        seen.add(id(built))
        for b in index.lineage(built) if isinstance(built, ClassInfo) else [built]:
            for line, patch in b.norm_calls:
                kind = "patch embedding" if patch or PATCH.search(b.name) else "tower"
                where.setdefault(kind, []).append(f"{b.name} {b.module}:{line}")
            todo += [(x, b.mod, depth + 1) for x in sorted(b.builds)]
    return where


def _audit_model(index: Index, cls) -> ModelAudit | None:
    """The audit of one class that opts in or captures graphs. An outer norm is judged by the graph
    forward's own calls: graph capture records what that method runs, so a norm it reaches (even in
    a helper the eager path shares) is captured, and one only the eager entries reach is skipped on
    replay. Without a graph forward to follow, an outer norm under graphs stays WRONG, as before."""
    lineage = index.lineage(cls)
    opt_in = next((c.opt_in for c in lineage if c.opt_in is not None), False)
    marker = MARKERS["graphs"]
    graphs = any(b.rpartition(".")[2] == marker for c in lineage for b in c.bases) or any(
        c.name == marker for c in lineage[1:])
    if not opt_in and not graphs:
        return None
    entry, eager = index.entries(cls)
    if not opt_in:
        return ModelAudit(cls.name, cls.module, False, [], [], graphs, VERDICTS["processor"], "processor",
                          entry.label if entry else None)
    in_graph = index.walk(cls, [entry]) if entry else []
    in_eager = index.walk(cls, eager)
    where: dict[str, list[str]] = {}
    for s in in_graph + in_eager:
        if s.where not in where.get(s.kind, []):
            where.setdefault(s.kind, []).append(s.where)
    found_by = "calls" if where else "scan"
    where = where or _scan_built(index, cls)    # no entry reaches a norm: every norm the class builds
    norm_in = [k for k in ("outer", "tower", "patch embedding") if where.get(k)]
    if not norm_in:
        key = "unfound"
    elif "outer" in norm_in and len(norm_in) > 1:
        key = "double"
    elif norm_in == ["outer"] and not graphs:
        key = "outer"
    elif norm_in == ["outer"]:                  # captured only where the graph forward itself reaches it
        key = "outer (in graph path)" if any(s.kind == "outer" for s in in_graph) else "outer+graphs"
    else:
        key = norm_in[-1]
    return ModelAudit(cls.name, cls.module, True, norm_in, [w for k in norm_in for w in where[k]], graphs,
                      VERDICTS[key], key, entry.label if entry else None, _first(in_graph), _first(in_eager),
                      found_by)


def audit(path: str | os.PathLike) -> Audit:
    """The audit of the model files under ``path`` (a source tree, an installed package, a wheel)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise AuditError(f"audit {path}: no such file or folder; give a vLLM source tree, its installed "
                         f"package (python -c 'import vllm, os; print(os.path.dirname(vllm.__file__))') or a "
                         f"wheel from 'pip download vllm==0.33.0 --no-deps'")
    try:
        files, engine, version, omitted, skipped = _sources(path)
    except ZIP_ERRORS as e:     # a wheel's corrupt, encrypted or oddly compressed member too: named, no traceback
        raise AuditError(f"audit {path}: cannot be read ({e})") from None
    for link in skipped:
        warnings.warn(f"audit {path}: skipped {link}, a symbolic link (never followed out of the tree)", stacklevel=2)
    if not files:
        links = f"; skipped, as symbolic links: {', '.join(skipped)}" if skipped else ""
        raise AuditError(f"audit {path}: no Python model files there (looked for "
                         f"{' and '.join('/'.join(d) for d in MODELS_DIRS)}/*.py, else any *.py){links}")
    index, bad = _index(files)
    found = [(c, m) for c in index.classes() if (m := _audit_model(index, c)) is not None]
    # a base that only declares what its subclasses inherit is not a model of its own: keep those
    # no other audited class derives from, and those where a norm call was found
    derived = {id(b) for c, _ in found for b in index.lineage(c)[1:]}
    models = [m for c, m in found if id(c) not in derived or m.where]
    models.sort(key=lambda m: (m.verdict_key not in ATTENTION, m.model, m.file))
    return Audit(str(path), engine, version, len(files), models, bad, len(omitted), omitted[:50], skipped)


def compare(old: Audit, new: Audit) -> list[dict]:
    """What changed from ``old`` to ``new``, one row per change of one class: {model, file, change,
    old, new}. A class is matched by name and file, else by name where it moved to a new file."""
    olds, news, pairs = list(old.models), list(new.models), []
    for match in (lambda o, n: (o.model, o.file) == (n.model, n.file),
                  lambda o, n: o.model == n.model and sum(x.model == n.model for x in news) == 1
                  and sum(x.model == n.model for x in olds) == 1):
        for n in list(news):
            o = next((o for o in olds if match(o, n)), None)
            if o is not None:
                pairs.append((o, n))
                olds.remove(o)
                news.remove(n)
    rows = []

    def row(m: ModelAudit, change: str, was, now) -> None:
        rows.append({"model": m.model, "file": m.file, "change": change, "old": was, "new": now})
    for o, n in pairs:
        if o.device_norm != n.device_norm:
            row(n, "gained device normalization" if n.device_norm else "lost device normalization", "no", "yes")
        if o.encoder_graphs != n.encoder_graphs:
            row(n, "gained encoder graphs" if n.encoder_graphs else "lost encoder graphs", "no", "yes")
        if o.device_norm and n.device_norm and o.norm_in != n.norm_in:
            row(n, "norm moved", ", ".join(o.norm_in) or "-", ", ".join(n.norm_in) or "-")
        if o.verdict_key != n.verdict_key:
            row(n, "verdict changed", o.verdict_key, n.verdict_key)
        if o.file != n.file:
            row(n, "file moved", o.file, n.file)
    for n in news:
        row(n, "added", "-", n.verdict_key)
    for o in olds:
        row(o, "removed", o.verdict_key, "-")
    rows.sort(key=lambda r: (r["new"] not in ATTENTION, r["model"], r["file"]))
    return rows


def compare_table(old: Audit, new: Audit, rows: list[dict]) -> str:
    """The changes as a table under both audits' first lines, with the new audit's tail."""
    head = [f"old: {old.head()}", f"new: {new.head()}",
            f"{len(rows)} changes" if rows else "no change among the audited classes"]
    cols = ("model", "file", "change", "old", "new")
    table = [cols] + [tuple(str(r[c]) for c in cols) for r in rows]
    width = [max(len(t[i]) for t in table) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, width)).rstrip() for t in table] if rows else []
    return "\n".join(head + lines + new.tail())


def save(result: Audit, results: Path | str) -> Path:
    """``<results>/audits/<engine>-<version>.json``, written atomically (the report shows the newest)."""
    from .results import AUDITS_DIR, slug
    stem = slug(f"{result.engine}-{result.version}", empty="audit")
    return atomic_write_text(Path(results) / AUDITS_DIR / f"{stem}.json", result.to_json())


# what a saved audit's JSON holds where the report and advise read it: {key: (kinds, what)}
SAVED_FIELDS = {"engine": ((str, type(None)), "a string"), "version": ((str, type(None)), "a string"),
                "source": ((str, type(None)), "a string"), "models": ((list,), "a list")}
MODEL_FIELDS = {"model": ((str,), "a string"), "file": ((str, type(None)), "a string"),
                "device_norm": ((bool,), "true or false"), "encoder_graphs": ((bool,), "true or false"),
                "verdict": ((str,), "a string"), "norm_in": ((list,), "a list of strings")}


def saved_problem(data) -> str | None:
    """Why a saved audit (parsed JSON) cannot be shown: the first field of the wrong kind; None where it can."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    for key, (kinds, what) in SAVED_FIELDS.items():
        if not isinstance(data.get(key), kinds):
            return f"{key!r} is {type(data.get(key)).__name__}, not {what}"
    for i, m in enumerate(data["models"]):
        if not isinstance(m, dict):
            return f"models[{i}] is {type(m).__name__}, not an object"
        for key, (kinds, what) in MODEL_FIELDS.items():
            v = m.get(key)
            if not isinstance(v, kinds) or (key == "norm_in" and not all(isinstance(x, str) for x in v)):
                return f"models[{i}].{key} is {type(v).__name__}, not {what}"
    return None


def load_newest(results: Path | str, skipped: list[str] | None = None) -> dict | None:
    """The newest usable saved audit (`workbench.results.saved_audits`: the user's own by file time, else the
    committed ones by release), as JSON data; None where none is. Each newer one passed over (unreadable, or
    failing `saved_problem`) is added to ``skipped`` with why."""
    from .results import saved_audits
    for p in reversed(saved_audits(results)):
        try:
            data = json.loads(read_regular(p, MAX_FILE_BYTES))
            why = saved_problem(data)
        except (OSError, ValueError, RecursionError) as e:
            why = f"unreadable ({type(e).__name__}: {str(e)[:200]})"
        if why is None:
            return data
        if skipped is not None:
            skipped.append(f"{p.name}: {why}")
    return None