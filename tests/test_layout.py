"""The package's shape as issue 29 set it: no module over 500 lines, no import circle between modules at import
time (imports inside functions are lazy and do not count), no `import_module` outside plugin discovery."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
MAX_LINES = 500
# where a name is looked up at run time on purpose: the package's lazy attributes, the studies' and benchmarks'
# registries, and a worker process importing the module a study names
IMPORT_MODULE_ALLOWED = {"__init__.py", "studies/__init__.py", "benchmarks/__init__.py", "workers.py"}


def _modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the package (a package by its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _top_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports when it is imported (module level, `if` blocks included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
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
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:                 # `from . import x` names a module, `from .x import y` a name
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name and m != "workbench"}


def test_no_module_of_the_package_is_over_500_lines():
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
