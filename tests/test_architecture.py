"""The project's import graph: no circles, and every import runs down the layers.

The layers, bottom to top: ``checks`` (pure tensor math); ``claims`` (claim specs, verdicts);
``report`` (results.json → HTML); the base of ``fixtures`` (``fixtures/__init__``, the cache, the
numeric environment, the torchvision shim); ``fixtures.inputs`` and ``fixtures.training``;
``fixtures.models``; ``fixtures.engine``; ``fixtures.plugin``; and ``bench`` on top. Which layer
may import which is one table, :data:`MAY_IMPORT`. The graph is read from the source with
:mod:`ast` (nothing is imported), and each import is either *module-level* (runs when the module
is imported: top level, class bodies, ``try``/``if`` blocks, but not ``if TYPE_CHECKING:``) or
*function-level* (inside a function, runs when it is called). The rules:

- no circle among module-level imports (strict);
- no import, at any level, from a layer to one its :data:`MAY_IMPORT` row does not list;
- a function-level import that closes a circle is listed in :data:`ALLOWED_LAZY` with the
  reason; a new one fails until it is fixed or listed, and a stale entry fails until removed;
- no project module over :data:`MAX_LINES` lines, and no two project modules share a file name
  (``__init__.py`` and ``__main__.py`` aside).

``python tests/test_architecture.py`` prints the graph's summary.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("checks", "fixtures", "claims", "report", "bench")
#: No project module is longer than this (tests aside).
MAX_LINES = 400

#: The sub-packages of ``fixtures`` that are layers of their own; its other modules are its base.
FIXTURES_LAYERS = ("inputs", "training", "models", "engine", "plugin")

#: Layer → the layers it may import (its own always). Only the plugin imports ``report``: it
#: writes results.json and the report at the end of a run.
MAY_IMPORT: dict[str, set[str]] = {
    "checks": set(),
    "claims": {"checks"},
    "report": {"checks", "claims"},
    "fixtures": {"checks"},
    "fixtures.inputs": {"checks", "fixtures"},
    "fixtures.training": {"checks", "fixtures"},
    "fixtures.models": {"checks", "fixtures", "fixtures.training"},
    "fixtures.engine": {"checks", "claims", "fixtures", "fixtures.inputs", "fixtures.training",
                        "fixtures.models"},
    "fixtures.plugin": {"checks", "claims", "report", "fixtures", "fixtures.inputs",
                        "fixtures.training", "fixtures.models", "fixtures.engine"},
    "bench": {"checks", "claims", "report", "fixtures", "fixtures.inputs", "fixtures.training",
              "fixtures.models", "fixtures.engine", "fixtures.plugin"},
}

#: Function-level imports that close a circle today, (importer, imported) → why they are
#: tolerated. Add an entry only with the change that removes it.
ALLOWED_LAZY: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> str:
    """``fixtures.models.families.base`` → ``fixtures.models``; ``fixtures.cache`` → ``fixtures``;
    ``claims.claim_v`` → ``claims``."""
    parts = module.split(".")
    if parts[0] == "fixtures" and len(parts) > 1 and parts[1] in FIXTURES_LAYERS:
        return "fixtures." + parts[1]
    return parts[0]


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


def layer_violations(edges: list[Edge]) -> list[Edge]:
    """The imports, at any level, from a layer to one :data:`MAY_IMPORT` does not give it."""
    return [e for e in edges if layer_of(e.imported) != layer_of(e.importer)
            and layer_of(e.imported) not in MAY_IMPORT[layer_of(e.importer)]]


def large_modules(modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(lines, module) of every module over :data:`MAX_LINES` lines, longest first."""
    sizes = [(len(p.read_text(encoding="utf-8").splitlines()), m) for m, p in modules.items()]
    return sorted((n, m) for n, m in sizes if n > MAX_LINES)[::-1]


def shared_file_names(modules: dict[str, Path]) -> dict[str, list[str]]:
    """File name → the modules that share it (``__init__.py`` and ``__main__.py`` aside)."""
    by_name: dict[str, list[str]] = {}
    for module, path in modules.items():
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(module)
    return {name: sorted(mods) for name, mods in by_name.items() if len(mods) > 1}


def _where(e: Edge) -> str:
    kind = "function-level" if e.lazy else "module-level"
    return f"{e.importer} imports {e.imported} ({kind}, line {e.line})"


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_graph_covers_every_module(graph):
    modules, edges = graph
    on_disk = {module_name(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert set(modules) == on_disk
    # the graph sees the imports it must see: a relative, a package and a dotted one
    pairs = {(e.importer, e.imported) for e in edges}
    assert ("checks.spectrum", "checks.gram") in pairs
    assert ("fixtures.inputs", "fixtures.inputs.images") in pairs
    assert ("claims.claim_e", "checks.spectrum") in pairs
    # every layer of the table exists, and every module is in a layer of the table
    assert {layer_of(m) for m in modules} == set(MAY_IMPORT)


def test_no_module_is_over_the_size_limit(graph):
    modules, _ = graph
    listed = large_modules(modules)
    assert not listed, f"modules over {MAX_LINES} lines, split them along their seams: " + ", ".join(
        f"{modules[m].relative_to(ROOT)} ({n})" for n, m in listed)


def test_no_two_modules_share_a_file_name(graph):
    modules, _ = graph
    shared = shared_file_names(modules)
    assert not shared, "module file names used twice, rename one: " + "; ".join(
        f"{name}: {', '.join(mods)}" for name, mods in sorted(shared.items()))


def test_no_import_circle_at_module_level(graph):
    _, edges = graph
    found = circles([e for e in edges if not e.lazy])
    assert not found, "import circles among module-level imports: " + "; ".join(
        " <-> ".join(c) for c in found)


def test_every_import_runs_down_the_layers(graph):
    _, edges = graph
    wrong = layer_violations(edges)
    assert not wrong, ("imports against the layer table MAY_IMPORT: "
                       + "; ".join(_where(e) for e in wrong))


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
    """The rules on a hand-made graph: a circle, arrows up at either level, and a sub-package
    of fixtures importing one above it."""
    edges = [Edge("checks.a", "checks.b", False, 1), Edge("checks.b", "checks.a", False, 1),
             Edge("claims.x", "fixtures.y", False, 3), Edge("report.r", "fixtures.y", True, 5),
             Edge("checks.c", "claims.x", True, 7), Edge("fixtures.y", "checks.a", False, 2),
             Edge("fixtures.models.m", "fixtures.engine.e", True, 9),
             Edge("fixtures.engine.e", "fixtures.models.m", False, 4),
             Edge("fixtures.cache", "report.atomic", False, 6),
             Edge("fixtures.plugin.p", "report.r", False, 8)]
    assert circles(edges) == [["checks.a", "checks.b"], ["fixtures.engine.e", "fixtures.models.m"]]
    assert circles([e for e in edges if e.importer != "checks.b" and not e.lazy]) == []
    assert [(e.importer, e.imported) for e in layer_violations(edges)] == [
        ("claims.x", "fixtures.y"), ("report.r", "fixtures.y"), ("checks.c", "claims.x"),
        ("fixtures.models.m", "fixtures.engine.e"), ("fixtures.cache", "report.atomic")]
    assert layer_of("fixtures.models.families.base") == "fixtures.models"
    assert layer_of("fixtures") == layer_of("fixtures.numeric_env") == "fixtures"


def test_light_jobs_import_light_modules(tmp_path):
    """The cache and a checkpoint's training metadata are read without the report's templates
    (Jinja, the claim registry) and without timm or the training loop."""
    import subprocess
    import sys

    from safetensors.torch import save_file
    import torch

    ckpt = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(2)}, str(ckpt), metadata={"kpca_claims_training": '{"variant": "softmax"}'})
    code = ("import sys\n"
            "from fixtures.cache import Cache, code_fingerprint\n"
            "from fixtures.models.checkpoints import training_variant\n"
            f"training_variant({str(ckpt)!r})\n"
            "heavy = [m for m in ('jinja2', 'report', 'report.render', 'claims.registry', 'timm',\n"
            "                     'fixtures.training.series', 'fixtures.engine.model_run') if m in sys.modules]\n"
            "print(heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


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
    for e in layer_violations(all_edges):
        print("against the layers:", _where(e))
    for n, m in large_modules(mods):
        print(f"{n:5d}  {mods[m].relative_to(ROOT)}")
    for name, shared in shared_file_names(mods).items():
        print(f"{name}: {', '.join(shared)}")
