"""The package's import graph has no cycle: data flows one way (configs and preprocessing -> norms
-> towers -> encoder -> runner and dp -> measurement -> studies -> report -> the sweep layer and
the command line), and every import counts, including those inside functions. The local process
launcher (workbench.launch) stands apart: the dp path and the studies use it, and it knows nothing
of the encoder."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "workbench"
# the command line and the sweep machinery, top to bottom: each imports only those below it
COMMAND_LAYER = ("workbench.__main__", "workbench.cli", "workbench.arguments", "workbench.sweep", "workbench.workers",
                 "workbench.stages")


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
    measurement = {"workbench.timing", "workbench.ceilings", "workbench.floors", "workbench.memory_model",
                   "workbench.cuda_memory", "workbench.kernel_profile", "workbench.formatting", "workbench.ulps"}
    above = {"workbench.runner", "workbench.dp", "workbench.launch", "workbench.report", *measurement,
             *COMMAND_LAYER}
    above |= {m for m in graph if m.startswith("workbench.studies")}
    for core in ("workbench.config", "workbench.preprocess", "workbench.norms", "workbench.towers",
                 "workbench.encoder", "workbench.dtypes"):
        assert not (graph[core] & above), (core, sorted(graph[core] & above))


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def test_the_launcher_imports_nothing_of_the_encoder():
    graph = import_graph()
    assert {"workbench.launch", "workbench.dp", "workbench.encoder"} <= set(graph)
    # the package __init__ holds shared helpers (cpu_share) and re-exports the rest lazily: as in the
    # cycle test, an import of it does not import those
    graph = {m: {n for n in deps if n != "workbench"} for m, deps in graph.items()}
    # the encoder's parts, and every module that builds on the encoder (dp, runner, the studies, ...)
    encoder_side = {"workbench.encoder", "workbench.config", "workbench.preprocess", "workbench.norms",
                    "workbench.fused", "workbench.attention", "workbench.dtypes"}
    encoder_side |= {m for m in graph if m.startswith("workbench.towers")}
    encoder_side |= {m for m in graph if "workbench.encoder" in reachable(graph, m)}
    assert {"workbench.dp", "workbench.runner"} <= encoder_side
    reached = reachable(graph, "workbench.launch")
    assert not reached & encoder_side, sorted(reached & encoder_side)
    assert not reached & set(COMMAND_LAYER), sorted(reached & set(COMMAND_LAYER))


def test_the_command_line_and_sweep_layer_sits_above_studies_and_report():
    graph = import_graph()
    layer = set(COMMAND_LAYER)
    assert layer <= set(graph)
    below = {m: sorted(deps & layer) for m, deps in graph.items() if m not in layer and deps & layer}
    assert below == {}, f"modules below the command line import it: {below}"
    for i, m in enumerate(COMMAND_LAYER):
        higher = graph[m] & set(COMMAND_LAYER[:i])
        assert not higher, (m, sorted(higher))
    assert graph["workbench.__main__"] == {"workbench.cli"}
    # the layer is where studies and report meet the command line
    assert "workbench.report" in graph["workbench.cli"] and "workbench.results" in graph["workbench.stages"]
    assert "workbench.report" not in graph["workbench.stages"]      # figures are drawn from the store's runs


def test_the_results_store_sits_below_everything_that_reads_runs():
    """workbench.results owns the run folders: it imports none of the studies, the report, the commands or the
    sweep, and those reach run folders through it (no other module names meta.json's reader or writer)."""
    graph = import_graph()
    store = {m for m in graph if m == "workbench.results" or m.startswith("workbench.results.")}
    assert {"workbench.results.store", "workbench.results.folder", "workbench.results.meta"} <= store
    above = {m for m in graph if m.startswith(("workbench.studies", "workbench.report", "workbench.benchmarks"))}
    above |= set(COMMAND_LAYER) | {"workbench.advise", "workbench.advise_tables", "workbench.audit",
                                   "workbench.compare"}
    for m in store:
        assert not (graph[m] & above), (m, sorted(graph[m] & above))
    for user in ("workbench.report", "workbench.advise", "workbench.compare", "workbench.audit",
                 "workbench.sweep", "workbench.stages", "workbench.studies"):
        assert "workbench.results" in reachable(graph, user), user
    # the folder readers of old are gone: no module outside the store reads a meta.json or lists run folders
    outside = [p for p in PKG.rglob("*.py") if "results" not in p.relative_to(PKG).parts]
    for p in outside:
        text = p.read_text()
        assert 'glob("*/meta.json")' not in text and "RunMeta.from_json(" not in text, p
