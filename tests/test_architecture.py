"""The project's import graph: no circles, and no arrow running back up the layers (issue 15).

The layers, bottom to top: ``checks`` (pure tensor math) ← ``fixtures`` (models, inputs, capture,
cache, plugin, session) and ``claims`` (claim specs, verdicts) ← ``report``; ``bench`` sits on top
of everything. The graph is read from the source with :mod:`ast` (nothing is imported), and each
import is either *module-level* (runs when the module is imported: top level, class bodies,
``try``/``if`` blocks, but not ``if TYPE_CHECKING:``) or *function-level* (inside a function, runs
when it is called). The rules:

- no circle among module-level imports (strict);
- ``checks`` imports nothing from ``fixtures``, ``claims``, ``report`` or ``bench``, at any level;
- ``claims`` imports nothing from ``fixtures``, ``report`` or ``bench`` at module level;
- ``report`` imports nothing from ``fixtures`` or ``bench`` at module level;
- a function-level import that closes a circle, or runs against those directions, is listed in
  :data:`ALLOWED_LAZY` with the reason; a new one fails until it is fixed or listed, and an entry
  whose import is gone fails until it is removed.

(``fixtures.plugin`` is the pytest plugin: it drives a run and writes its report, so ``fixtures``
importing ``report`` is not an arrow up.)

``python tests/test_architecture.py`` prints the graph's summary and the modules over
:data:`SIZE_NOTE` lines (information, not a failure).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("checks", "fixtures", "claims", "report", "bench")
#: Modules longer than this are listed by :func:`large_modules` (style guide §2, "module size").
SIZE_NOTE = 400

#: Top-level package → the top-level packages it must never import (at module level; for
#: ``checks`` at function level too: pure math has no lazy way up either).
FORBIDDEN = {
    "checks": {"fixtures", "claims", "report", "bench"},
    "claims": {"fixtures", "report", "bench"},
    "report": {"fixtures", "bench"},
}
STRICT_AT_EVERY_LEVEL = {"checks"}

#: Function-level imports that close a circle or run against the layer order today,
#: (importer, imported) → why they are tolerated. Add an entry only with the issue that removes it.
ALLOWED_LAZY: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    """One import of a project module by a project module."""

    importer: str
    imported: str
    lazy: bool  # inside a function body
    line: int


def module_name(path: Path) -> str:
    """``fixtures/inputs/images.py`` → ``fixtures.inputs.images``; a package's ``__init__.py`` is
    the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Every Python module of the project's packages (tests are not part of the graph)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Yield (import node, inside a function) for every import that can run."""
    def walk(node: ast.AST, lazy: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), lazy)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, inner)
    yield from walk(tree, False)


def _resolve(importer: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             modules: set[str]) -> list[str]:
    """The project modules one import statement loads (the deepest existing module per name)."""
    def deepest(name: str) -> str | None:
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    if isinstance(node, ast.Import):
        targets = [deepest(alias.name) for alias in node.names]
    else:
        if node.level:
            base = importer.split(".")
            if not is_package:
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        # ``from pkg import name``: ``pkg.name`` when it is a module, else ``pkg`` itself.
        targets = [deepest(f"{prefix}.{alias.name}") if f"{prefix}.{alias.name}" in modules
                   else deepest(prefix) for alias in node.names]
    return sorted({t for t in targets if t and t != importer})


def import_graph() -> tuple[dict[str, Path], list[Edge]]:
    """All project modules and every import between them."""
    modules = project_modules()
    names = set(modules)
    edges = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, lazy in _imports(tree):
            for target in _resolve(name, path.name == "__init__.py", node, names):
                edges.append(Edge(name, target, lazy, node.lineno))
    return modules, edges


def circles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer_violations(edges: list[Edge]) -> tuple[list[Edge], list[Edge]]:
    """(module-level violations, function-level violations) of :data:`FORBIDDEN`."""
    eager, lazy = [], []
    for e in edges:
        src, dst = e.importer.split(".")[0], e.imported.split(".")[0]
        if dst in FORBIDDEN.get(src, ()):
            if not e.lazy or src in STRICT_AT_EVERY_LEVEL:
                eager.append(e)
            else:
                lazy.append(e)
    return eager, lazy


def large_modules(modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(lines, module) of every module over :data:`SIZE_NOTE` lines, longest first."""
    sizes = [(len(p.read_text(encoding="utf-8").splitlines()), m) for m, p in modules.items()]
    return sorted((n, m) for n, m in sizes if n > SIZE_NOTE)[::-1]


def _where(e: Edge) -> str:
    kind = "function-level" if e.lazy else "module-level"
    return f"{e.importer} imports {e.imported} ({kind}, line {e.line})"


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_graph_covers_every_module_and_lists_the_large_ones(graph, capsys):
    modules, edges = graph
    on_disk = {module_name(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert set(modules) == on_disk
    # the graph sees the imports it must see: a relative, a package and a dotted one
    pairs = {(e.importer, e.imported) for e in edges}
    assert ("checks.spectrum", "checks.gram") in pairs
    assert ("fixtures.inputs", "fixtures.inputs.images") in pairs
    assert ("claims.claim_e", "checks.spectrum") in pairs
    with capsys.disabled():
        listed = large_modules(modules)
        if listed:
            print(f"\n[info] modules over {SIZE_NOTE} lines (style guide §2, not a failure):")
            for n, m in listed:
                print(f"  {n:5d}  {modules[m].relative_to(ROOT)}")


def test_no_import_circle_at_module_level(graph):
    _, edges = graph
    found = circles([e for e in edges if not e.lazy])
    assert not found, "import circles among module-level imports: " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_arrow_runs_up_the_layers_at_module_level(graph):
    _, edges = graph
    eager, _ = layer_violations(edges)
    assert not eager, ("imports against the layer order checks <- fixtures/claims <- report: "
                       + "; ".join(_where(e) for e in eager))


def test_function_level_arrows_up_are_listed(graph):
    _, edges = graph
    _, lazy = layer_violations(edges)
    unlisted = [e for e in lazy if (e.importer, e.imported) not in ALLOWED_LAZY]
    assert not unlisted, ("function-level imports against the layer order, neither fixed nor in "
                          "ALLOWED_LAZY: " + "; ".join(_where(e) for e in unlisted))


def test_function_level_circles_are_listed(graph):
    _, edges = graph
    rest = [e for e in edges if not (e.lazy and (e.importer, e.imported) in ALLOWED_LAZY)]
    found = circles(rest)
    assert not found, ("import circles closed by function-level imports, neither fixed nor in "
                       "ALLOWED_LAZY: " + "; ".join(
                           " <-> ".join(c) + " (" + ", ".join(
                               _where(e) for e in rest if e.lazy and e.importer in c
                               and e.imported in c) + ")" for c in found))


def test_allowed_lazy_lists_only_imports_that_exist(graph):
    _, edges = graph
    stale = set(ALLOWED_LAZY) - {(e.importer, e.imported) for e in edges if e.lazy}
    assert not stale, f"ALLOWED_LAZY lists imports that no longer exist, remove them: {sorted(stale)}"


def test_the_checks_find_what_they_look_for():
    """The rules on a hand-made graph: a circle, an eager and a lazy arrow up."""
    edges = [Edge("checks.a", "checks.b", False, 1), Edge("checks.b", "checks.a", False, 1),
             Edge("claims.x", "fixtures.y", False, 3), Edge("report.r", "fixtures.y", True, 5),
             Edge("checks.c", "claims.x", True, 7), Edge("fixtures.y", "checks.a", False, 2)]
    assert circles(edges) == [["checks.a", "checks.b"]]
    assert circles([e for e in edges if e.importer != "checks.b"]) == []
    eager, lazy = layer_violations(edges)
    assert [(e.importer, e.imported) for e in eager] == [("claims.x", "fixtures.y"),
                                                          ("checks.c", "claims.x")]
    assert [(e.importer, e.imported) for e in lazy] == [("report.r", "fixtures.y")]


def test_imports_are_classified_by_where_they_run():
    src = ("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import checks.gram\n"
           "try:\n    from checks import spectrum\nexcept ImportError:\n    pass\n"
           "class A:\n    from checks import gamma\n"
           "def f():\n    from fixtures import cache\n    return cache\n")
    found = [(type(n).__name__, getattr(n, "module", None), lazy)
             for n, lazy in _imports(ast.parse(src))]
    # the TYPE_CHECKING import never runs; the try block and the class body run at import time
    assert found == [("Import", None, False), ("ImportFrom", "typing", False),
                     ("ImportFrom", "checks", False), ("ImportFrom", "checks", False),
                     ("ImportFrom", "fixtures", True)]


def test_relative_imports_resolve_to_modules():
    mods = {"fixtures", "fixtures.inputs", "fixtures.inputs.images", "fixtures.inputs.inputset",
            "fixtures.cache", "fixtures.torchvision_compat", "checks", "checks.gram"}
    node = ast.parse("from .inputset import InputSet").body[0]
    assert _resolve("fixtures.inputs.images", False, node, mods) == ["fixtures.inputs.inputset"]
    node = ast.parse("from .. import torchvision_compat").body[0]
    assert _resolve("fixtures.inputs.images", False, node, mods) == ["fixtures.torchvision_compat"]
    node = ast.parse("from . import images").body[0]
    assert _resolve("fixtures.inputs", True, node, mods) == ["fixtures.inputs.images"]
    node = ast.parse("from checks.gram import KeyGram, standardize_tokens").body[0]
    assert _resolve("fixtures.cache", False, node, mods) == ["checks.gram"]
    node = ast.parse("import checks.gram as g, os").body[0]
    assert _resolve("fixtures.cache", False, node, mods) == ["checks.gram"]


if __name__ == "__main__":
    mods, all_edges = import_graph()
    print(f"{len(mods)} modules, {sum(not e.lazy for e in all_edges)} module-level and "
          f"{sum(e.lazy for e in all_edges)} function-level imports between them")
    print("module-level circles:", circles([e for e in all_edges if not e.lazy]) or "none")
    print("function-level circles (with the module-level edges):",
          circles(all_edges) or "none")
    up_eager, up_lazy = layer_violations(all_edges)
    for e in up_eager + up_lazy:
        print("against the layers:", _where(e))
    for n, m in large_modules(mods):
        print(f"{n:5d}  {mods[m].relative_to(ROOT)}")
