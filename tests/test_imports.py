"""The package's import graph has no cycle: data flows one way (configs and preprocessing -> norms
-> towers -> encoder -> runner and dp -> measurement -> studies -> sweep, report, command line),
and every import counts, including those inside functions."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "workbench"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (static, any depth in the file)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from . import x` may import submodule x
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                # importing a package's name through its __init__ only counts when the __init__
                # itself is not the importer's own package (it holds no code of the importer)
                if t and t != mod and t in modules:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_import_graph_has_no_cycle():
    graph = import_graph()
    assert "workbench.encoder" in graph and "workbench.norms" in graph["workbench.encoder"]
    # the package __init__ only re-exports lazily: ignore edges into it (a submodule that calls a
    # helper defined there does not import the rest of the package)
    graph = {m: {n for n in deps if n != "workbench"} for m, deps in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_core_imports_nothing_above_it():
    graph = import_graph()
    above = {"workbench.runner", "workbench.dp", "workbench.measure", "workbench.report", "workbench.__main__"}
    above |= {m for m in graph if m.startswith("workbench.studies")}
    for core in ("workbench.config", "workbench.preprocess", "workbench.norms", "workbench.towers",
                 "workbench.encoder", "workbench.dtypes"):
        assert not (graph[core] & above), (core, sorted(graph[core] & above))
