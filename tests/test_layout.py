"""The package's shape: its modules meet at public names, never at private ones (no module imports a `_name` of
another, nor reads `module._name` of one it imported: a name a module shares is part of its interface, and says so by
having no underscore); no module over 800 lines (a guard against sprawl, not a reason to split one honest unit); no
import circle between modules at import time (imports inside functions are lazy and do not count); no `import_module`
outside plugin discovery."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
MAX_LINES = 800
# where a name is looked up at run time on purpose: the package's lazy attributes, the studies' and benchmarks'
# registries, and a worker process importing the module a study names
IMPORT_MODULE_ALLOWED = {"__init__.py", "studies/__init__.py", "benchmarks/__init__.py", "workers.py"}
# Private names the report package may still import from its own modules while workbench/report/ is reworked, as
# (importing file relative to the package, module, name), e.g. ("report/answers.py", "workbench.report.html", "_e").
# Only report's files may be listed, and an entry whose import is gone fails the test, so the set only shrinks. Empty
# now: the rework has made report's seven private imports (html's _e, _fold, _href, _newest_first, _view_body,
# output's _token, views' _runs_words) public.
PRIVATE_IMPORTS_ALLOWED: set[tuple[str, str, str]] = set()


def _modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the package (a package by its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of ``from <module> import ...`` written in ``package``."""
    if not node.level:
        return node.module or ""
    up = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(up + ([node.module] if node.module else []))


def _package(name: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _top_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports when it is imported (module level, `if` blocks included)."""
    package = _package(name, path)
    found = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "handlers", []) + getattr(node, "finalbody", [])
            continue
        if isinstance(node, ast.ExceptHandler):
            body += node.body
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            for a in node.names:                 # `from . import x` names a module, `from .x import y` a name
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name and m != "workbench"}


def _private_imports(name: str, path: Path, tree: ast.Module) -> set[tuple[str, str, str, int]]:
    """(file, module, name, line) of every private name module ``name`` imports from the package: `from .x import
    _y`, `from workbench.x import _y`, `from . import _x`, anywhere in the file (inside functions too), and
    `import workbench._x`."""
    file, found = str(path.relative_to(PACKAGE)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "workbench"):
            base = _base(node, _package(name, path))
            found |= {(file, base, a.name, node.lineno) for a in node.names if _private(a.name)}
        elif isinstance(node, ast.Import):
            found |= {(file, *a.name.rpartition(".")[::2], node.lineno) for a in node.names
                      if a.name.split(".")[0] == "workbench" and any(map(_private, a.name.split(".")))}
    return found


def _module_aliases(name: str, path: Path, tree: ast.Module, known: set[str]) -> dict[str, str]:
    """{local name: package module it stands for} of the imports anywhere in the file: `import workbench.x as m`,
    `import workbench.x` (binds `workbench`), `from . import x`, `from workbench.y import x` (x a module)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "workbench":
                    out[a.asname or "workbench"] = a.name if a.asname else "workbench"
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "workbench"):
            base = _base(node, _package(name, path))
            out.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known})
    return out


def _private_attributes(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[tuple[str, str, str, int]]:
    """(file, module, attribute, line) of every ``m._y`` (``workbench.x._y`` too) where ``m`` is another package
    module this one imported."""
    aliases, found = _module_aliases(name, path, tree, known), set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in aliases:
            target = ".".join([aliases[value.id], *reversed(chain)])
            if target in known and target != name:
                found.add((str(path.relative_to(PACKAGE)), target, node.attr, node.lineno))
    return found


def _shown(found) -> str:
    return "\n".join(f"  {file}:{line}: {module}.{attr}" for file, module, attr, line in sorted(found))


def test_no_module_uses_a_private_name_of_another():
    """No `_name` of one package module imported by another (bar PRIVATE_IMPORTS_ALLOWED), and no `module._name`
    read through a module imported from the package."""
    assert all(file.startswith("report/") for file, _, _ in PRIVATE_IMPORTS_ALLOWED), "only report's files are allowed"
    mods = _modules()
    known = set(mods)
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in mods.items()}
    imports = set().union(*(_private_imports(n, mods[n], trees[n]) for n in mods))
    banned = {i for i in imports if i[:3] not in PRIVATE_IMPORTS_ALLOWED}
    assert not banned, ("private names imported from another module of the package (make the name public, with a "
                        "docstring, or keep the code in one module):\n" + _shown(banned))
    stale = PRIVATE_IMPORTS_ALLOWED - {i[:3] for i in imports}
    assert not stale, f"PRIVATE_IMPORTS_ALLOWED names imports that are gone; remove them: {sorted(stale)}"
    attributes = set().union(*(_private_attributes(n, mods[n], trees[n], known) for n in mods))
    assert not attributes, "private attributes of another package module read:\n" + _shown(attributes)


def test_the_private_name_checks_catch_every_form():
    """The two checks on a made-up module of workbench.studies: each form they must catch, and what they must not."""
    source = """
from __future__ import annotations
from . import params, plotting as plots, _helpers
from .params import _hidden, Param, __all__
from ..images import _CHANNELS
from workbench.report.html import _e
import workbench.norms as norms
import workbench.mixes
import workbench._secret


def f(self):
    from ..results import _store
    return (params._spec, plots._ax, norms._kernel, workbench.mixes._sizes, params.__name__, plots.ax,
            self._own, _hidden._inner)
"""
    known = {"workbench", "workbench.images", "workbench.mixes", "workbench.norms", "workbench.report",
             "workbench.report.html", "workbench.results", "workbench.studies", "workbench.studies.params",
             "workbench.studies.plotting", "workbench.studies.probe"}
    name, path, tree = "workbench.studies.probe", PACKAGE / "studies" / "probe.py", ast.parse(source)
    assert {i[1:3] for i in _private_imports(name, path, tree)} == {
        ("workbench.studies.params", "_hidden"), ("workbench.images", "_CHANNELS"), ("workbench.report.html", "_e"),
        ("workbench", "_secret"), ("workbench.results", "_store"), ("workbench.studies", "_helpers")}
    assert {i[1:3] for i in _private_attributes(name, path, tree, known)} == {
        ("workbench.studies.params", "_spec"), ("workbench.studies.plotting", "_ax"), ("workbench.norms", "_kernel"),
        ("workbench.mixes", "_sizes")}


def test_no_module_of_the_package_is_over_800_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_import_circle_between_the_package_modules():
    mods = _modules()
    graph = {name: _top_level_imports(name, path, set(mods)) for name, path in mods.items()}
    assert graph["workbench.runner"] >= {"workbench.runner_policy", "workbench.encoder"}   # the reader reads imports
    state: dict[str, int] = {}
    circles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                circles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not circles, f"modules importing each other at import time: {circles}"


def test_import_module_only_where_plugins_or_lazy_names_are_looked_up():
    users = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if "import_module(" in p.read_text(encoding="utf-8")}
    assert users <= IMPORT_MODULE_ALLOWED, f"import_module outside plugin discovery: {users - IMPORT_MODULE_ALLOWED}"
