"""The import graph of a Python package, read from its modules' own source with `ast`.

Every `import` and `from ... import` naming a module of the package is an edge, wherever it
stands: at module level, inside a function or method (a lazy import), or under
`if TYPE_CHECKING:` (a typing-only import, kept apart: it never runs, so it cannot close a
cycle, but it still counts for the layer rules). Relative imports are resolved, and
`from pkg import name` is an edge to the submodule `pkg.name` when there is one, else to `pkg`
(its `__init__`). The implicit import of parent packages is not an edge.

The cycles are the strongly connected components of the runtime edges (module level and
function level). The layer rules of lakesink (docs/architecture.md, "Layers") are `RULES`.

    python -m tests.layering          # or: python tests/layering.py
    python -m tests.layering --root path/to/src --package name

prints the cycles and the layer violations and exits 1 when there is either.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ImportKind = Literal["module", "function", "type_checking"]
RUNTIME_KINDS: frozenset[ImportKind] = frozenset({"module", "function"})
ALL_KINDS: frozenset[ImportKind] = frozenset({"module", "function", "type_checking"})

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True, order=True)
class ImportEdge:
    """One import statement of `importer` that names `imported`, both modules of the package."""

    importer: str
    imported: str
    lineno: int
    kind: ImportKind

    def describe(self) -> str:
        return f"{self.importer} -> {self.imported} (line {self.lineno}, {self.kind})"


@dataclass(frozen=True, slots=True)
class ImportGraph:
    """The modules of one package (dotted name -> file) and the imports between them."""

    package: str
    modules: dict[str, Path]
    edges: tuple[ImportEdge, ...]
    unresolved: tuple[str, ...] = ()

    def edges_of(self, kinds: frozenset[ImportKind]) -> list[ImportEdge]:
        return [e for e in self.edges if e.kind in kinds]

    def successors(self, kinds: frozenset[ImportKind] = RUNTIME_KINDS) -> dict[str, set[str]]:
        succ: dict[str, set[str]] = {m: set() for m in self.modules}
        for e in self.edges_of(kinds):
            if e.importer != e.imported:
                succ[e.importer].add(e.imported)
        return succ

    def cycles(self, kinds: frozenset[ImportKind] = RUNTIME_KINDS) -> list[list[str]]:
        """The strongly connected components of more than one module over the edges of `kinds`
        (by default the imports that run), each sorted, the largest first."""
        sccs = strongly_connected_components(self.successors(kinds))
        found = [sorted(c) for c in sccs if len(c) > 1]
        return sorted(found, key=lambda c: (-len(c), c))

    def cycle_edges(self, component: Iterable[str]) -> list[ImportEdge]:
        """The runtime imports between the modules of one component: the edges to break."""
        members = set(component)
        return sorted(
            e
            for e in self.edges_of(RUNTIME_KINDS)
            if e.importer in members and e.imported in members and e.importer != e.imported
        )

    def shortest_cycle(self, component: Sequence[str]) -> list[str]:
        """One shortest cycle through the first module of a component, as a path that ends
        where it starts."""
        members = set(component)
        succ = self.successors(RUNTIME_KINDS)
        start = component[0]
        parent: dict[str, str] = {}
        queue: deque[str] = deque([start])
        while queue:
            node = queue.popleft()
            for nxt in sorted(succ[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
        return [start]


def strongly_connected_components(succ: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on deep graphs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[set[str]] = []
    counter = 0
    for root in sorted(succ):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                result.append(component)
    return result


def module_name(package_dir: Path, path: Path) -> str:
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


@dataclass
class _Collector:
    """Walks one module's tree and records the raw imports with their kind."""

    found: list[tuple[str, tuple[str, ...], int, int, ImportKind]] = field(default_factory=list)

    def visit(self, nodes: Iterable[ast.stmt | ast.AST], kind: ImportKind) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.found.append((alias.name, (), 0, node.lineno, kind))
            elif isinstance(node, ast.ImportFrom):
                names = tuple(a.name for a in node.names)
                self.found.append((node.module or "", names, node.level, node.lineno, kind))
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                self.visit(node.body, "type_checking")
                self.visit(node.orelse, kind)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inner: ImportKind = "type_checking" if kind == "type_checking" else "function"
                self.visit(ast.iter_child_nodes(node), inner)
            else:
                self.visit(ast.iter_child_nodes(node), kind)


def build_graph(package_dir: Path) -> ImportGraph:
    """The import graph of the package whose top folder is `package_dir`."""
    package_dir = package_dir.resolve()
    package = package_dir.name
    modules = {
        module_name(package_dir, p): p
        for p in sorted(package_dir.rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    edges: set[ImportEdge] = set()
    unresolved: set[str] = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        collector = _Collector()
        collector.visit(tree.body, "module")
        is_package = path.name == "__init__.py"
        for target, names, level, lineno, kind in collector.found:
            if level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (level - 1)]
                target = ".".join([*base, target] if target else base)
            if target != package and not target.startswith(package + "."):
                continue
            candidates = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if len(candidates) < len(names) or not names:
                candidates.append(target)
            for dotted in candidates:
                if dotted in modules:
                    edges.add(ImportEdge(name, dotted, lineno, kind))
                else:
                    unresolved.add(f"{name} line {lineno}: {dotted}")
    return ImportGraph(package, modules, tuple(sorted(edges)), tuple(sorted(unresolved)))


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@dataclass(frozen=True, slots=True)
class Rule:
    """A layer rule: the modules under `sources` may import, of the package, only their own
    layer and `allowed` (when given), and never `forbidden`. Names are relative to the package
    (`table`, `errors`); a name covers the module and everything under it."""

    id: str
    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...] = ()
    allowed: tuple[str, ...] | None = None
    kinds: frozenset[ImportKind] = ALL_KINDS

    def violations(self, graph: ImportGraph) -> list[ImportEdge]:
        def full(names: Iterable[str]) -> list[str]:
            return [f"{graph.package}.{n}" for n in names]

        forbidden = full(self.forbidden)
        bad: list[ImportEdge] = []
        for source in full(self.sources):
            allowed = None if self.allowed is None else [source, *full(self.allowed)]
            for e in graph.edges_of(self.kinds):
                if not _within(e.importer, source) or _within(e.imported, source):
                    continue
                if any(_within(e.imported, f) for f in forbidden) or (
                    allowed is not None and not any(_within(e.imported, a) for a in allowed)
                ):
                    bad.append(e)
        return bad


# The layers of docs/architecture.md: cli -> spark -> formats (hudi, iceberg; each a plugin in the
# registry `lakesink.formats`) -> engine -> {storage, kafka} -> protocol. `errors` is the one
# root of the error tree that every layer raises from, so it stands below them all and imports
# nothing of the package. The engine knows no format; a format knows the engine and below but
# never another format; spark and cli reach a format only through the registry. Imports under
# TYPE_CHECKING count here too: a type is a dependency.
FORMATS = ("formats.hudi", "formats.iceberg")
ABOVE_FORMATS = ("spark", "cli", "api")
# The configuration registry (`config`: keys, parsers, LakesinkConfig) is read at the edge only;
# everything below it takes the typed settings the edge builds (`settings`). Every top-level
# module of the package is one or the other (tests/unit/test_layering.py checks the split).
CONFIG_READERS = ("config", "spark", "cli", "api")
BELOW_THE_EDGE = (
    "errors", "protocol", "storage", "kafka", "engine", "formats",
    "settings", "security", "metrics", "console", "extras", "faults",
)  # fmt: skip
RULES: tuple[Rule, ...] = (
    Rule("errors", "errors imports nothing of the package", ("errors",), allowed=()),
    Rule(
        "protocol",
        "protocol imports nothing of the package but errors",
        ("protocol",),
        allowed=("errors",),
    ),
    Rule(
        "storage",
        "storage imports only errors and extras",
        ("storage",),
        allowed=("errors", "extras"),
    ),
    Rule("kafka", "kafka imports nothing of the engine, the formats or above",
         ("kafka",), forbidden=("engine", "formats", *ABOVE_FORMATS)),
    Rule("engine", "the engine imports no format and nothing above it",
         ("engine",), forbidden=("formats", *ABOVE_FORMATS)),
    Rule("hudi", "the Hudi format imports neither the Iceberg format nor anything above it",
         ("formats.hudi",), forbidden=("formats.iceberg", *ABOVE_FORMATS)),
    Rule("iceberg", "the Iceberg format imports neither the Hudi format nor anything above it",
         ("formats.iceberg",), forbidden=("formats.hudi", *ABOVE_FORMATS)),
    Rule("registry", "spark and cli reach a format only through the registry (lakesink.formats)",
         ("spark", "cli"), forbidden=FORMATS),
    Rule("spark", "spark imports nothing of cli", ("spark",), forbidden=("cli",)),
    Rule("config", "only spark, cli and the API (and config itself) import the configuration "
         "registry; below them the layers take lakesink.settings",
         BELOW_THE_EDGE, forbidden=("config",)),
)  # fmt: skip


PENDING_FILE = Path(__file__).with_name("layering_pending.txt")


def read_pending(path: Path = PENDING_FILE) -> frozenset[tuple[str, str]]:
    """The imports that break a rule today and are on the way out (issue 28: the engine still
    reaches Hudi's table, spark and cli still import the formats directly): one
    `importer -> imported` per line. They are reported apart and do not fail the check; the
    list may only shrink (tests/unit/test_layering.py fails on an entry that no longer breaks
    a rule)."""
    pairs: set[tuple[str, str]] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            importer, imported = (part.strip() for part in line.split("->"))
            pairs.add((importer, imported))
    return frozenset(pairs)


PENDING = read_pending() if PENDING_FILE.exists() else frozenset()


def report(
    graph: ImportGraph,
    rules: Sequence[Rule] = RULES,
    pending: frozenset[tuple[str, str]] = frozenset(),
) -> tuple[str, bool]:
    """The printable report and whether it found a problem (a cycle or a rule violation)."""
    by_kind = {k: len(graph.edges_of(frozenset({k}))) for k in ALL_KINDS}
    lines = [
        f"{graph.package}: {len(graph.modules)} modules, {len(graph.edges)} imports "
        f"({by_kind['module']} at module level, {by_kind['function']} in functions, "
        f"{by_kind['type_checking']} under TYPE_CHECKING)",
        "",
    ]
    cycles = graph.cycles()
    lines.append(f"Import cycles (strongly connected components): {len(cycles)}")
    for n, component in enumerate(cycles, 1):
        lines.append(f"  {n}. {len(component)} modules: {', '.join(component)}")
        lines.append(f"     e.g. {' -> '.join(graph.shortest_cycle(component))}")
        lines.extend(f"     {e.describe()}" for e in graph.cycle_edges(component))
    lines.append("")
    problems = bool(cycles)
    lines.append("Layer rules:")
    for rule in rules:
        found = rule.violations(graph)
        bad = [e for e in found if (e.importer, e.imported) not in pending]
        waiting = len(found) - len(bad)
        problems = problems or bool(bad)
        verdict = f"{len(bad)} violations" if bad else "ok"
        if waiting:
            verdict += f" ({waiting} pending in {PENDING_FILE.name})"
        lines.append(f"  [{rule.id}] {rule.name}: {verdict}")
        lines.extend(f"       {e.describe()}" for e in bad)
    lines.append("")
    typing_cycles = [c for c in graph.cycles(ALL_KINDS) if c not in cycles]
    lines.append(f"Cycles that TYPE_CHECKING imports add or widen: {len(typing_cycles)}")
    lines.extend(f"  {len(c)} modules: {', '.join(c)}" for c in typing_cycles)
    lines.append("")
    typing_only = graph.edges_of(frozenset({"type_checking"}))
    lines.append(f"TYPE_CHECKING-only imports: {len(typing_only)}")
    lines.extend(f"  {e.describe()}" for e in typing_only)
    if graph.unresolved:
        problems = True
        lines.append("")
        lines.append(f"Imports naming no module of the package: {len(graph.unresolved)}")
        lines.extend(f"  {u}" for u in graph.unresolved)
    return "\n".join(lines), problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="folder holding the package")
    parser.add_argument("--package", default="lakesink", help="top-level package name")
    parser.add_argument(
        "--strict", action="store_true", help=f"count the imports in {PENDING_FILE.name} too"
    )
    args = parser.parse_args(argv)
    pending = frozenset() if args.strict or args.root != REPO_ROOT else PENDING
    text, problems = report(build_graph(args.root / args.package), pending=pending)
    print(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
