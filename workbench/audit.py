"""``python -m workbench audit PATH``: where a serving engine's model files normalize on the device,
read statically (the `ast` module; nothing of the engine is imported or run).

The seed of this project: an engine normalized uint8 pixels in the outer model, while its encoder
CUDA-graph path called the tower directly, so graph replays saw raw pixels (the correctness
matrix's outer x cudagraph cell). Per model class this reads, from a vLLM source tree, an
installed package or a released wheel (``pip download vllm==X --no-deps``):

- whether it normalizes on the device: it sets ``supports_mm_device_do_normalize = True`` (itself or
  a base class), vLLM's opt-in;
- where the norm runs: every call of an input-norm module (an attribute built by
  ``make_input_norm(...)`` or ``FusedInputNorm(...)``, or named ``input_norm``), found in the model
  class itself ("outer": before it calls the tower) or in a class it builds, directly or through
  the classes those build ("tower", or "patch embedding" where the class is a patch embedding);
- whether it captures its encoder in CUDA graphs: ``SupportsEncoderCudaGraph`` among its bases;
- the verdict, from the workbench's correctness matrix.

Static reading finds what the code says, not what a config switches at run time: a verdict is as
good as the names it looks for (`MARKERS`), and "check by hand" says where they did not suffice.
"""
from __future__ import annotations

import ast
import io
import json
import os
import re
import sys
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .files import atomic_write_text, read_regular

# the names vLLM's model files use (vllm #50411, #55370, the encoder CUDA-graph interface)
MARKERS = {
    "opt_in": "supports_mm_device_do_normalize",
    "graphs": "SupportsEncoderCudaGraph",
    "builders": ("make_input_norm", "build_mm_input_norm", "FusedInputNorm"),
    "attribute": "input_norm",
}
MAX_FILE_BYTES = 4 << 20            # the largest model file of vLLM 0.33 is a few hundred kB
MAX_FILES = 20_000
MODELS_DIR = ("vllm", "model_executor", "models")
AUDITS_DIR = "audits"

VERDICTS = {
    "tower": "right on every path: the norm runs inside the tower, which eager, graph and dp all call",
    "patch embedding": "right on every path: the norm runs in the patch embedding, inside the tower",
    "outer+graphs": "WRONG under encoder CUDA graphs: the graph path calls the tower directly and skips "
                    "the outer model's norm (the outer x cudagraph cell)",
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
class ClassInfo:
    name: str
    module: str
    bases: list[str]
    opt_in: bool | None = None                  # None: not set in this class's body
    norm_attrs: set[str] = field(default_factory=set)      # self.<attr> = make_input_norm(...)
    norm_calls: list[tuple[int, bool]] = field(default_factory=list)  # (line, in a patch embedding) of each
    #                                                  norm call, or of a call handing the norm to a function
    builds: set[str] = field(default_factory=set)          # names of the classes and functions it calls
    function: bool = False                                 # a module-level function (a factory), not a class


@dataclass
class ModelAudit:
    model: str
    file: str
    device_norm: bool
    norm_in: list[str]              # "outer", "tower", "patch embedding", as found
    where: list[str]                # Class.file:line of each norm call
    encoder_graphs: bool
    verdict: str
    verdict_key: str


@dataclass
class Audit:
    source: str
    engine: str
    version: str
    files: int
    models: list[ModelAudit]
    unreadable: list[str]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def table(self) -> str:
        """One line per model class that normalizes on the device or captures its encoder."""
        rows = [tuple(AUDIT_COLUMNS)] + [audit_row(asdict(m)) for m in self.models]
        width = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], width)) + "  " + r[4] for r in rows]
        head = f"{self.engine} {self.version} ({self.source}): {self.files} model files, {len(self.models)} classes"
        wrong = [m.model for m in self.models if m.verdict_key in ATTENTION]
        tail = [f"needs attention: {', '.join(wrong)}" if wrong else "no model class in the silent-wrong cell"]
        tail += [f"unreadable: {u}" for u in self.unreadable]
        return "\n".join([head, *lines, *tail])


def _sources(path: Path) -> tuple[list[tuple[str, bytes]], str, str]:
    """([(relative name, bytes)] of the model files under ``path``, engine, version)."""
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(io.BytesIO(read_regular(path))) as z:
            names = [n for n in z.namelist() if n.endswith(".py")]
            models = [n for n in names if n.startswith("/".join(MODELS_DIR) + "/")] or names
            files = [(n, z.read(n)) for n in models[:MAX_FILES] if z.getinfo(n).file_size <= MAX_FILE_BYTES]
            version = _wheel_version(path.name) or _version_of(
                {n: z.read(n) for n in names if n.endswith(("vllm/version.py", "vllm/_version.py"))})
        return files, "vllm", version
    if not path.is_dir():
        raise AuditError(f"audit {path}: not a folder, a wheel or a zip of model files")
    roots = ((path.joinpath(*MODELS_DIR), path / "vllm"), (path.joinpath(*MODELS_DIR[1:]), path))
    root, pkg = next(((r, p) for r, p in roots if r.is_dir()), (path, path))
    files: list[tuple[str, bytes | None]] = []
    for folder, dirs, names in os.walk(root):        # links are not followed out of the tree
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py") and len(files) < MAX_FILES:
                p = Path(folder) / n
                try:
                    files.append((str(p.relative_to(root)), read_regular(p, MAX_FILE_BYTES)))
                except OSError:
                    files.append((str(p.relative_to(root)), None))     # named as unreadable later
    found = {}
    for candidate in (pkg / "version.py", pkg / "_version.py"):
        try:
            found[str(candidate)] = read_regular(candidate, MAX_FILE_BYTES)
        except OSError:
            pass
    return files, "vllm" if root != path else "engine", _version_of(found)


def _wheel_version(name: str) -> str | None:
    m = re.match(r"vllm-([0-9][^-]*)-", name)
    return m.group(1) if m else None


def _version_of(files: dict[str, bytes]) -> str:
    for text in files.values():
        m = re.search(rb"""(?:__version__|version)\s*(?::\s*\w+\s*)?=\s*["']([^"']+)["']""", text)
        if m:
            return m.group(1).decode("ascii", "replace")
    return "unknown"


def _name(node: ast.AST) -> str | None:
    """``Foo`` of ``Foo`` and ``mod.Foo``; None otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):             # Generic[...] bases
        return _name(node.value)
    return None


def _read_class(node: ast.ClassDef | ast.FunctionDef, module: str) -> ClassInfo:
    function = not isinstance(node, ast.ClassDef)
    info = ClassInfo(node.name, module, [] if function else [b for b in map(_name, node.bases) if b], function=function)
    builders = MARKERS["builders"]
    for stmt in [] if function else node.body:      # the class body's own opt-in
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) and stmt.value is not None else []
        if any(_name(t) == MARKERS["opt_in"] for t in targets) and isinstance(stmt.value, ast.Constant):
            info.opt_in = bool(stmt.value.value)
    for sub in ast.walk(node):                      # attributes that hold an input norm
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call) and _name(sub.value.func) in builders:
            info.norm_attrs.update(t.attr for t in sub.targets if isinstance(t, ast.Attribute))
    attrs = info.norm_attrs | {MARKERS["attribute"]}
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call):
            continue
        callee = _name(sub.func)
        handed = [a for a in [*sub.args, *(k.value for k in sub.keywords)]
                  if isinstance(a, ast.Attribute) and a.attr in attrs]
        if isinstance(sub.func, ast.Attribute) and callee in attrs:
            info.norm_calls.append((sub.lineno, False))
        elif handed and callee and not callee[:1].isupper():    # the norm handed to a function that applies it
            info.norm_calls.append((sub.lineno, bool(re.search(r"patch_?embed", callee, re.I))))
        elif callee and callee not in builders and (callee[:1].isupper() or isinstance(sub.func, ast.Name)):
            info.builds.add(callee)
    return info


def _classes(files: list[tuple[str, bytes]]) -> tuple[dict[str, list[ClassInfo]], list[str]]:
    classes: dict[str, list[ClassInfo]] = {}
    bad = []
    for name, data in files:
        if data is None:
            bad.append(f"{name} (not a regular file, unreadable or over {MAX_FILE_BYTES} bytes)")
            continue
        try:
            tree = ast.parse(data.decode("utf-8"), filename=name)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            bad.append(f"{name} ({type(e).__name__})")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) or (isinstance(node, ast.FunctionDef) and node in tree.body):
                classes.setdefault(node.name, []).append(_read_class(node, name))
    return classes, bad


def _lookup(classes: dict[str, list[ClassInfo]], name: str, module: str) -> ClassInfo | None:
    """The class ``name`` as seen from ``module``: the one defined there, else the first found."""
    found = classes.get(name) or []
    return next((c for c in found if c.module == module), found[0] if found else None)


def _lineage(classes, cls: ClassInfo) -> list[ClassInfo]:
    """``cls`` and its bases found in the files, nearest first (each class once)."""
    out, todo = [], [cls]
    while todo:
        c = todo.pop(0)
        if c in out:
            continue
        out.append(c)
        todo += [b for b in (_lookup(classes, n, c.module) for n in c.bases) if b is not None]
    return out


def _audit_model(classes, cls: ClassInfo) -> ModelAudit | None:
    if cls.function:
        return None
    lineage = _lineage(classes, cls)
    opt_in = next((c.opt_in for c in lineage if c.opt_in is not None), False)
    graphs = any(MARKERS["graphs"] in c.bases or c.name == MARKERS["graphs"] for c in lineage[1:]) \
        or MARKERS["graphs"] in cls.bases
    if not opt_in and not graphs:
        return None
    where: dict[str, list[str]] = {}
    for c in lineage:
        for line, patch in c.norm_calls:
            where.setdefault("patch embedding" if patch else "outer", []).append(f"{c.name} {c.module}:{line}")
    seen = {c.name for c in lineage}
    todo = [(n, c.module, 1) for c in lineage for n in sorted(c.builds)]
    while todo:                                     # the classes the model builds, 4 levels down
        n, module, depth = todo.pop(0)
        built = _lookup(classes, n, module)
        if built is None or built.name in seen or depth > 4:
            continue
        seen.add(built.name)
        for b in _lineage(classes, built):
            for line, patch in b.norm_calls:
                kind = "patch embedding" if patch or re.search(r"patch_?embed", b.name, re.I) else "tower"
                where.setdefault(kind, []).append(f"{b.name} {b.module}:{line}")
            todo += [(x, b.module, depth + 1) for x in sorted(b.builds)]
    where = {k: v for k, v in where.items() if v}
    norm_in = [k for k in ("outer", "tower", "patch embedding") if k in where]
    if not opt_in:
        key = "processor"
    elif not norm_in:
        key = "unfound"
    elif "outer" in norm_in and len(norm_in) > 1:
        key = "double"
    elif norm_in == ["outer"]:
        key = "outer+graphs" if graphs else "outer"
    else:
        key = norm_in[-1]
    return ModelAudit(cls.name, cls.module, opt_in, norm_in if opt_in else [],
                      [w for k in norm_in for w in where[k]] if opt_in else [], graphs, VERDICTS[key], key)


def audit(path: str | os.PathLike) -> Audit:
    """The audit of the model files under ``path`` (a source tree, an installed package, a wheel)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise AuditError(f"audit {path}: no such file or folder; give a vLLM source tree, its installed "
                         f"package (python -c 'import vllm, os; print(os.path.dirname(vllm.__file__))') or a "
                         f"wheel from 'pip download vllm==0.33.0 --no-deps'")
    try:
        files, engine, version = _sources(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise AuditError(f"audit {path}: cannot be read ({e})") from None
    if not files:
        raise AuditError(f"audit {path}: no Python model files there (looked for {'/'.join(MODELS_DIR)}/*.py, "
                         f"else any *.py)")
    classes, bad = _classes(files)
    models = [m for found in classes.values() for c in found if (m := _audit_model(classes, c)) is not None]
    # a base that only declares what its subclasses inherit is not a model of its own: keep those
    # no other audited class derives from, and those where a norm call was found
    derived = {b for m in models for c in classes[m.model] for b in c.bases}
    models = [m for m in models if m.model not in derived or m.where]
    models.sort(key=lambda m: (m.verdict_key not in ATTENTION, m.model))
    return Audit(str(path), engine, version, len(files), models, bad)


def save(result: Audit, results: Path | str) -> Path:
    """``<results>/audits/<engine>-<version>.json``, written atomically (the report shows the newest)."""
    from .runstate import slug
    stem = slug(f"{result.engine}-{result.version}", empty="audit")
    return atomic_write_text(Path(results) / AUDITS_DIR / f"{stem}.json", result.to_json())


def load_newest(results: Path | str) -> dict | None:
    """The newest saved audit under ``results`` or its committed ``reference/`` (by file time), as JSON
    data; None where none is."""
    folders = [f for f in (Path(results) / AUDITS_DIR, Path(results) / "reference" / AUDITS_DIR) if f.is_dir()]
    found = sorted((p for f in folders for p in f.glob("*.json") if not p.is_symlink()),
                   key=lambda p: p.stat().st_mtime)
    for p in reversed(found):
        try:
            data = json.loads(read_regular(p, MAX_FILE_BYTES))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("models"), list):
            return data
    return None


def audit_command(args) -> int:
    """``python -m workbench audit PATH``: print the audit (a table, or ``--json``), keep it under
    ``<results>/audits/`` unless ``--no-save``; 1 when a model class needs attention."""
    try:
        result = audit(args.path)
    except AuditError as e:
        raise SystemExit(str(e)) from None
    print(result.to_json() if args.json else result.table(), end="\n" if not args.json else "")
    if not args.no_save:
        print(f"audit: saved to {save(result, args.results)}", file=sys.stderr)
    return 1 if any(m.verdict_key in ATTENTION for m in result.models) else 0
