"""No import circle anywhere in pp1q/ or pp1q_kernels/.

Every module is parsed (ast, nothing imported) and every import statement becomes an
edge, those inside functions and ``if TYPE_CHECKING:`` blocks too: a lazy import only
hides a circle until the day someone moves it to the top. Relative imports are
resolved, ``from pkg import module`` points at the module, and importing ``a.b.c``
also runs the package ``__init__`` of ``a.b`` (and ``a``) unless the importer lives
inside that package already (then it has run): re-exports in an ``__init__`` count.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"pp1q": ROOT / "pp1q", "pp1q_kernels": ROOT / "pp1q_kernels"}  # name -> folder

Graph = dict[str, set[str]]


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages."""
    out = {}
    for name, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that executing ``module`` may import (run first)."""
    package = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets.add(stem)
            targets.update(f"{stem}.{alias.name}" for alias in node.names)  # pkg.module
    own = {module, *_ancestors(module)}  # packages already initialised when module runs
    out = set()
    for target in targets:
        for name in (*_ancestors(target), target):
            if name in known and name not in own:
                out.add(name)
    return out


def import_graph() -> Graph:
    files = module_files()
    known = set(files)
    return {m: imports_of(m, p.read_text(), p.name == "__init__.py", known)
            for m, p in files.items()}


def components(graph: Graph) -> list[set[str]]:
    """The strongly connected components that hold a circle (Tarjan)."""
    return [c for c, _circle in _tangles(graph)]


def cycles(graph: Graph) -> list[list[str]]:
    """One circle per strongly connected component with more than one module, as a
    path ``[a, b, ..., a]`` (a shortest one through the component's first module); a
    module importing itself counts too. Break it and run again: the component may hold
    more."""
    return [circle for _c, circle in _tangles(graph)]


def _tangles(graph: Graph) -> list[tuple[set[str], list[str]]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[set[str], list[str]]] = []

    def connect(v: str) -> None:  # iterative: the graph may be deep
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append((component, _circle(graph, component)))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _circle(graph: Graph, component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (BFS)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w in component and w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected component without a circle")


# -- the checker itself -------------------------------------------------------------------


def test_cycle_finder_catches_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]
    assert sorted(map(sorted, components(graph))) == [["a", "b", "c"], ["e"]]
    graph["c"].discard("a")  # the planted edge removed: no circle left (but e's own)
    assert cycles(graph) == [["e", "e"]]


def test_edges_resolve_relative_from_and_package_inits():
    known = {"p", "p.a", "p.b", "p.sub", "p.sub.x", "q", "q.y"}
    src = ("from . import a\nfrom .sub import x\nimport q.y\n"
           "def f():\n    from ..q import y\n    from p.sub.x import thing\n")
    # importing q.y also runs q's __init__; p and p.sub's own packages are not edges
    assert imports_of("p.b", src, False, known) == {"p.a", "p.sub", "p.sub.x", "q", "q.y"}
    assert imports_of("p.sub.x", "from .. import b\nfrom . import x\n", False, known) == {"p.b"}
    planted = import_graph()
    planted["pp1q.core.errors"] = planted["pp1q.core.errors"] | {"pp1q.wire.framing"}
    # the circle is reported from the component's first module, whichever that is
    assert any({"pp1q.core.errors", "pp1q.wire.framing"} <= c for c in components(planted))
    assert any(c[0] == c[-1] and "pp1q.wire.framing" in c for c in cycles(planted))


# -- the project -------------------------------------------------------------------------


def test_no_import_cycle_in_pp1q_or_kernels():
    graph = import_graph()
    assert {"pp1q.cli", "pp1q.runtime.config", "pp1q_kernels.dispatch"} <= set(graph)
    found = _tangles(graph)
    shown = "\n".join(f"{' -> '.join(circle)}  (in a knot of {len(c)}: {', '.join(sorted(c))})"
                      for c, circle in found)
    assert not found, f"{len(found)} import circle(s):\n{shown}"
