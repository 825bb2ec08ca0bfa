"""The static reader behind `workbench.audit`: model files parsed into classes, methods and imports,
and the calls followed from an engine's entry points down to where the input norm is applied.

Why follow calls rather than list every norm a model class could reach: the seed bug was a norm that
exists and runs, but on the eager path only. What decides the verdict is which entry point reaches
it: the encoder CUDA-graph forward (what graph capture records) or the eager entries. Names are
resolved the way Python would, through each module's imports, because vLLM has same-named classes in
different files (two ``SiglipVisionModel``, one model class per hardware vendor under ``vllm/models``)
and taking the first one found by name reads the wrong class.

The walk is bounded (visited set, depth and step caps), so a base-class cycle or a mutual recursion
in the files read ends instead of hanging; what it cannot resolve (``getattr``, containers of
modules, code outside the files read) it leaves out, and the audit falls back to listing every norm
the class builds when no entry point reaches one.
"""
from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field

# the names vLLM's model files use (vllm #50411, #55370, the encoder CUDA-graph interface)
MARKERS = {
    "opt_in": "supports_mm_device_do_normalize",
    "graphs": "SupportsEncoderCudaGraph",
    "builders": ("make_input_norm", "build_mm_input_norm", "FusedInputNorm"),
    "attribute": "input_norm",
}
GRAPH_ENTRY = "encoder_cudagraph_forward"      # what the engine's encoder graph runner captures and replays
EAGER_ENTRIES = ("embed_multimodal", "encoder_eager_forward")
EAGER_HELPERS = re.compile(r"_process_\w*input")
PATCH = re.compile(r"patch_?embed", re.I)
MAX_DEPTH = 16           # calls followed down from one entry point
MAX_STEPS = 5_000        # (object, function) pairs one walk visits at most
MAX_LINEAGE = 64         # classes in one lineage
MAX_HOPS = 8             # re-exports, factories and properties followed for one name
SUPER = "super()"        # first element of a call through super(): no attribute has this name


def dotted(node: ast.AST) -> str | None:
    """``a.b.C`` of ``a.b.C`` (and of ``a.b.C[...]``, a generic base); None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    if isinstance(node, ast.Subscript):
        return dotted(node.value)
    return None


def _last(name: str | None) -> str | None:
    return name.rpartition(".")[2] if name else None


def _self_chain(node: ast.AST, aliases: dict[str, tuple]) -> tuple | None:
    """``("a", "b")`` of ``self.a.b`` (or of ``x.b`` where ``x = self.a``); ``()`` of ``self``."""
    if isinstance(node, ast.Name):
        return () if node.id == "self" else aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        head = _self_chain(node.value, aliases)
        return head + (node.attr,) if head is not None else None
    return None


@dataclass(eq=False)
class Module:
    name: str                                   # dotted, as Python imports it
    file: str                                   # as the audit shows it
    package: str
    defs: dict = field(default_factory=dict)    # name -> ClassInfo | Func (module level and nested classes)
    imports: dict = field(default_factory=dict)  # local name -> (module, name or None for the module itself)
    stars: list = field(default_factory=list)
    aliases: dict = field(default_factory=dict)  # module-level ``Name = other.Name``


@dataclass(eq=False)
class Func:
    name: str
    mod: Module
    line: int
    owner: "ClassInfo | None" = None
    prop: bool = False                          # a @property: ``self.x`` runs it
    calls: list = field(default_factory=list)   # (callee, handed self-chains, line); callee: a self-chain
    #                                              tuple, a dotted name, or (SUPER, method)
    returns: list = field(default_factory=list)  # self-chains and constructor names it returns
    norm_calls: list = field(default_factory=list)   # the whole-body scan of the fallback
    builds: set = field(default_factory=set)

    @property
    def module(self) -> str:
        return self.mod.file

    @property
    def label(self) -> str:
        return f"{self.owner.name}.{self.name}" if self.owner else self.name


@dataclass(eq=False)
class ClassInfo:
    name: str
    mod: Module
    bases: list[str]
    opt_in: bool | None = None                  # None: not set in this class's body
    methods: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)   # self.<attr> -> the constructor (or factory) names assigned
    norm_attrs: set = field(default_factory=set)   # self.<attr> = make_input_norm(...)
    norm_calls: list = field(default_factory=list)  # (line, in a patch embedding): the fallback's scan
    builds: set = field(default_factory=set)       # the classes and functions it calls (the fallback)

    @property
    def module(self) -> str:
        return self.mod.file


@dataclass
class Site:
    """A norm applied: where (``Class file:line``), as seen from the audited model, and the calls there."""
    kind: str                                   # "outer", "tower", "patch embedding"
    where: str
    path: list[str]


def _scan(calls: list[ast.Call], norm_attrs: set[str], info) -> None:
    """The whole-body reading the audit used before it followed calls, kept as its fallback."""
    builders, attrs = MARKERS["builders"], norm_attrs | {MARKERS["attribute"]}
    for sub in calls:
        callee = _last(dotted(sub.func)) or (sub.func.attr if isinstance(sub.func, ast.Attribute) else None)
        handed = [a for a in [*sub.args, *(k.value for k in sub.keywords)]
                  if isinstance(a, ast.Attribute) and a.attr in attrs]
        if isinstance(sub.func, ast.Attribute) and callee in attrs:
            info.norm_calls.append((sub.lineno, False))
        elif handed and callee and not callee[:1].isupper():    # the norm handed to a function that applies it
            info.norm_calls.append((sub.lineno, bool(PATCH.search(callee))))
        elif callee and callee not in builders and (callee[:1].isupper() or isinstance(sub.func, ast.Name)):
            info.builds.add(dotted(sub.func) or callee)


def _ctors(value: ast.AST, local: dict[str, list[str]]) -> list[str]:
    """The names called to make what ``value`` evaluates to (both arms of ``a if c else b``)."""
    if isinstance(value, ast.Call):
        name = dotted(value.func)
        return [name] if name else []
    if isinstance(value, ast.IfExp):
        return _ctors(value.body, local) + _ctors(value.orelse, local)
    if isinstance(value, ast.BoolOp):
        return [n for v in value.values for n in _ctors(v, local)]
    if isinstance(value, ast.Name):
        return local.get(value.id, [])
    return []


def _new_class(node: ast.ClassDef, mod: Module) -> ClassInfo:
    info = ClassInfo(node.name, mod, [b for b in map(dotted, node.bases) if b])
    for stmt in node.body:                      # the class body's own opt-in
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) and stmt.value is not None else []
        if any(_last(dotted(t)) == MARKERS["opt_in"] for t in targets) and isinstance(stmt.value, ast.Constant):
            info.opt_in = bool(stmt.value.value)
    return info


def _assigned(node: ast.AST, cls: tuple | None, fn: tuple | None) -> None:
    """What an assignment tells: a local naming a module of self (``vt = self.vision_tower``, for
    the function's calls), what a ``self.<attr>`` is built from (for the class)."""
    value = node.value
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if fn is not None and len(targets) == 1 and isinstance(targets[0], ast.Name):
        chain = _self_chain(value, {})
        if chain:
            fn[1][targets[0].id] = chain
    if cls is None:
        return
    info, _, local = cls
    made = _ctors(value, local)
    for t in targets:
        if isinstance(t, ast.Name) and made:
            local[t.id] = made
        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
            if any(_last(m) in MARKERS["builders"] for m in made):
                info.norm_attrs.add(t.attr)
            elif made:
                info.attrs.setdefault(t.attr, []).extend(m for m in made if m not in info.attrs.get(t.attr, []))


def _called(node: ast.Call, fn: tuple) -> None:
    f, aliases, _ = fn
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and dotted(func.value.func) == "super":
        callee = (SUPER, func.attr)
    else:
        callee = _self_chain(func, aliases) or dotted(func)
    if callee:
        handed = tuple(c for a in [*node.args, *(k.value for k in node.keywords)] if (c := _self_chain(a, aliases)))
        f.calls.append((callee, handed, node.lineno))


def _imported(node: ast.Import | ast.ImportFrom, mod: Module) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            local = a.asname or a.name.partition(".")[0]
            mod.imports.setdefault(local, (a.name if a.asname else local, None))
        return
    base = node.module or ""
    if node.level:
        anchor = mod.package.split(".") if mod.package else []
        anchor = anchor[:max(0, len(anchor) - (node.level - 1))]
        base = ".".join(anchor + ([base] if base else []))
    for a in node.names:
        if a.name == "*":
            mod.stars.append(base)
        else:
            mod.imports.setdefault(a.asname or a.name, (base, a.name))


_LEAVES = (ast.expr_context, ast.Constant, ast.Name, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.alias,
           ast.arguments)                   # nothing under these calls, assigns or defines anything


def _children(node: ast.AST) -> list[ast.AST]:
    """``ast.iter_child_nodes`` less the leaves: most of a tree is names, constants and contexts."""
    out = []
    for name in node._fields:
        value = getattr(node, name, None)
        if type(value) is list:
            out += [v for v in value if isinstance(v, ast.AST) and not isinstance(v, _LEAVES)]
        elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
            out.append(value)
    return out


def module_name(file: str) -> tuple[str, str]:
    """(dotted module, its package) of a file path relative to the folder ``import vllm`` looks in."""
    parts = file[:-3].split("/") if file.endswith(".py") else file.split("/")
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def read_module(file: str, tree: ast.Module, shown: str | None = None) -> Module:
    """The classes, functions and imports of one parsed file (``file`` relative to the folder holding
    ``vllm/``, ``shown`` as the audit names it), read in one pass in source order (a local alias is
    assigned before it is used): a vLLM release is over a thousand files."""
    name, package = module_name(file)
    mod = Module(name, shown or file, package)
    scans: list[tuple] = []                     # (class or function, its calls, norm attributes)
    stack: list[tuple] = [(n, None, None) for n in reversed(tree.body)]
    while stack:
        node, cls, fn = stack.pop()             # cls: (info, calls, locals); fn: (Func, aliases, calls)
        kind = type(node)
        children = None
        if kind is ast.Call:
            if fn is not None:
                _called(node, fn)
                fn[2].append(node)
            if cls is not None:
                cls[1].append(node)
        elif kind is ast.Assign or kind is ast.AnnAssign:
            if node.value is None:
                continue
            _assigned(node, cls, fn)
            if cls is None and fn is None and kind is ast.Assign and len(node.targets) == 1 and isinstance(
                    node.targets[0], ast.Name) and isinstance(node.value, (ast.Name, ast.Attribute)):
                mod.aliases.setdefault(node.targets[0].id, dotted(node.value))
            children = [node.value] if kind is ast.AnnAssign else None
        elif kind is ast.ClassDef:
            info = mod.defs[node.name] = _new_class(node, mod)
            cls, fn = (info, [], {}), None
            scans.append((info, cls[1], info.norm_attrs))
            children = node.body
        elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
            children = node.body                # not the annotations, defaults or decorators
            if fn is None:
                decorators = {_last(dotted(d)) for d in node.decorator_list}
                f = Func(node.name, mod, node.lineno, cls[0] if cls else None,
                         prop=bool(decorators & {"property", "cached_property"}))
                fn = (f, {}, [])
                if cls:
                    cls[0].methods[node.name] = f
                else:                           # a module-level function: a factory or a helper
                    mod.defs[node.name] = f
                    scans.append((f, fn[2], set()))
        elif kind is ast.Import or kind is ast.ImportFrom:      # anywhere: vLLM imports lazily in functions
            _imported(node, mod)
            continue
        elif kind is ast.Return and fn is not None and node.value is not None:
            chain = _self_chain(node.value, fn[1])
            fn[0].returns += [chain] if chain else _ctors(node.value, {})
        for child in reversed(children if children is not None else _children(node)):
            stack.append((child, cls, fn))
    for info, calls, norm_attrs in scans:       # a class's norm attributes are known once it is all read
        _scan(calls, norm_attrs, info)
    return mod


class Index:
    """Every module read, and the lookups the walk needs: names through imports, lineages, members."""

    def __init__(self, modules: list[Module]):
        self.modules = {m.name: m for m in modules}
        self.by_name: dict[str, list] = {}
        for m in modules:
            for name, d in m.defs.items():
                self.by_name.setdefault(name, []).append(d)
        self._lineages: dict[int, list[ClassInfo]] = {}

    def classes(self) -> list[ClassInfo]:
        return [d for m in self.modules.values() for d in m.defs.values() if isinstance(d, ClassInfo)]

    def _guess(self, name: str, mod: Module):
        """A name neither defined nor imported (a star import from outside, a sloppy file): the one
        definition of that name, else the one nearest in the package tree."""
        found = self.by_name.get(name) or []
        if len(found) <= 1:
            return found[0] if found else None
        here = mod.name.split(".")

        def shared(d) -> int:
            there = d.mod.name.split(".")
            return next((i for i, (a, b) in enumerate(zip(here, there)) if a != b), min(len(here), len(there)))
        return max(found, key=shared)

    def resolve(self, name: str, mod: Module, skip=None, hops: int = 0):
        """The class or function ``name`` (dotted or bare) means in ``mod``; None where it is outside
        the files read, a module, or unknown. ``skip``: a class whose base shares its own name."""
        if hops > MAX_HOPS or not name:
            return None
        head, _, rest = name.partition(".")
        if rest:
            target = self._module_of(head, mod)
            if target is None:
                return None if head in mod.imports else self._guess(_last(rest), mod)
            path, _, last = f"{target}.{rest}".rpartition(".")
            found = self.modules.get(path)
            return self.resolve(last, found, hops=hops + 1) if found else None
        d = mod.defs.get(head)
        if d is not None and d is not skip:
            return d
        if head in mod.aliases:
            return self.resolve(mod.aliases[head], mod, skip, hops + 1)
        if head in mod.imports:
            target, orig = mod.imports[head]
            if orig is None or f"{target}.{orig}" in self.modules or target not in self.modules:
                return None
            return self.resolve(orig, self.modules[target], hops=hops + 1)
        for star in mod.stars:
            if star in self.modules and (d := self.resolve(head, self.modules[star], hops=hops + 1)):
                return d
        d = self._guess(head, mod)
        return d if d is not skip else None

    def _module_of(self, head: str, mod: Module) -> str | None:
        if head not in mod.imports:
            return None
        target, orig = mod.imports[head]
        if orig is None:
            return target
        return f"{target}.{orig}" if f"{target}.{orig}" in self.modules else None

    def lineage(self, cls: ClassInfo) -> list[ClassInfo]:
        """``cls`` and its bases found in the files, nearest first, each once (a cycle ends)."""
        if id(cls) in self._lineages:
            return self._lineages[id(cls)]
        out, seen, todo = [], set(), deque([cls])
        while todo and len(out) < MAX_LINEAGE:
            c = todo.popleft()
            if id(c) in seen:
                continue
            seen.add(id(c))
            out.append(c)
            todo += [b for b in (self.resolve(n, c.mod, skip=c) for n in c.bases) if isinstance(b, ClassInfo)]
        self._lineages[id(cls)] = out
        return out

    def method(self, cls: ClassInfo, name: str, after: ClassInfo | None = None) -> Func | None:
        line = self.lineage(cls)
        if after is not None:
            line = line[next((i + 1 for i, c in enumerate(line) if c is after), len(line)):]
        return next((c.methods[name] for c in line if name in c.methods), None)

    def norm_names(self, cls: ClassInfo | None) -> set[str]:
        return {MARKERS["attribute"]}.union(*(c.norm_attrs for c in self.lineage(cls))) if cls else {
            MARKERS["attribute"]}

    def built_by(self, name: str, mod: Module, hops: int = 0) -> list[ClassInfo]:
        """The classes a constructor or factory ``name`` makes (a factory: what it returns)."""
        d = self.resolve(name, mod)
        if isinstance(d, ClassInfo):
            return [d]
        if isinstance(d, Func) and d.owner is None and hops < MAX_HOPS:
            return [c for r in d.returns if isinstance(r, str) for c in self.built_by(r, d.mod, hops + 1)]
        return []

    def attr_classes(self, cls: ClassInfo, attr: str, hops: int = 0) -> list[ClassInfo]:
        """The classes of ``self.<attr>`` for an object of class ``cls`` (nearest assignment first)."""
        if hops > MAX_HOPS:
            return []
        for c in self.lineage(cls):
            found = [k for n in c.attrs.get(attr, ()) for k in self.built_by(n, c.mod)]
            f = c.methods.get(attr)
            if not found and f is not None and f.prop:
                found = [k for r in f.returns for k in (self.chain_classes(cls, r, hops + 1) if isinstance(r, tuple)
                                                        else self.built_by(r, f.mod))]
            if found:
                return list({id(k): k for k in found}.values())
        return []

    def chain_classes(self, cls: ClassInfo, chain: tuple, hops: int = 0) -> list[ClassInfo]:
        objs = [cls]
        for attr in chain:
            objs = list({id(k): k for o in objs for k in self.attr_classes(o, attr, hops)}.values())[:8]
        return objs

    def _forward(self, cls: ClassInfo) -> list[tuple]:
        f = self.method(cls, "forward") or self.method(cls, "__call__")
        return [(cls, f)] if f else []

    def _member(self, cls: ClassInfo, name: str) -> list[tuple]:
        """Where ``obj.name(...)`` goes for ``obj`` of class ``cls``: its method, else the module it holds."""
        f = self.method(cls, name)
        if f is not None and not f.prop:
            return [(cls, f)]
        return [t for k in self.attr_classes(cls, name) for t in self._forward(k)]

    def _edges(self, model: ClassInfo, obj, func: Func, call: tuple) -> tuple[list, list]:
        """(norm sites, (object, function) pairs called) of one call made by ``func`` on ``obj``."""
        callee, handed, line = call
        norms = self.norm_names(obj)
        sites, calls = [], []
        name = callee[-1] if isinstance(callee, tuple) else _last(callee)
        owner = func.owner.name if func.owner else func.name
        if obj is None:                             # a module-level function: no self, a name it calls
            d = self.resolve(callee, func.mod) if isinstance(callee, str) else None
            return [], [(None, d)] if isinstance(d, Func) and d.owner is None else []
        if isinstance(callee, tuple) and callee[0] != SUPER and callee[-1] in norms:
            return [(self._kind(model, obj, func, False), f"{owner} {func.module}:{line}")], []
        if name and not name[:1].isupper() and any(h[-1] in norms for h in handed):
            sites.append((self._kind(model, obj, func, bool(PATCH.search(name))), f"{owner} {func.module}:{line}"))
        if isinstance(callee, tuple) and callee[0] == SUPER:
            f = self.method(obj, callee[1], after=func.owner)
            calls += [(obj, f)] if f else []
        elif isinstance(callee, tuple):
            targets = [obj] if len(callee) == 1 else self.chain_classes(obj, callee[:-1])
            calls += [t for o in targets for t in self._member(o, callee[-1])]
        else:
            d = self.resolve(callee, func.mod)
            calls += [(None, d)] if isinstance(d, Func) and d.owner is None else []
        for h in handed:                            # a module handed to a helper: the helper calls it
            if h[-1] not in norms:
                calls += [t for k in self.chain_classes(obj, h) for t in self._forward(k)]
        return sites, calls

    @staticmethod
    def _kind(model: ClassInfo, obj: ClassInfo, func: Func, patch: bool) -> str:
        if patch:
            return "patch embedding"
        if obj is model:
            return "outer"
        names = (obj.name, func.owner.name if func.owner else func.name)
        return "patch embedding" if any(PATCH.search(n) for n in names) else "tower"

    def walk(self, model: ClassInfo, entries: list[Func]) -> list[Site]:
        """Every norm applied on the calls from ``entries`` (methods run on ``model``), breadth first,
        so each site's path is a shortest one."""
        sites: dict[str, Site] = {}
        seen: set[tuple[int, int]] = set()
        todo = deque((model, f, [f.label], 0) for f in entries)
        while todo and len(seen) < MAX_STEPS:
            obj, func, path, depth = todo.popleft()
            if (id(obj), id(func)) in seen:
                continue
            seen.add((id(obj), id(func)))
            for call in func.calls:
                found, calls = self._edges(model, obj, func, call)
                for kind, where in found:
                    sites.setdefault(where, Site(kind, where, path))
                if depth < MAX_DEPTH:
                    todo += [(o, f, path + [f.label], depth + 1) for o, f in calls if (id(o), id(f)) not in seen]
        return list(sites.values())

    def entries(self, model: ClassInfo) -> tuple[Func | None, list[Func]]:
        """(the encoder graph forward, the eager entries) of ``model``, through inheritance; the
        interface's own declaration is not an implementation."""
        graph = self.method(model, GRAPH_ENTRY)
        if graph is not None and graph.owner is not None and graph.owner.name == MARKERS["graphs"]:
            graph = None
        names = set(EAGER_ENTRIES) | {n for c in self.lineage(model) for n in c.methods if EAGER_HELPERS.match(n)}
        eager = [f for n in sorted(names) if (f := self.method(model, n)) is not None
                 and not (f.owner is not None and f.owner.name == MARKERS["graphs"])]
        return graph, eager
