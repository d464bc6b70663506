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
  (``__init__.py`` and ``__main__.py`` aside);
- no function over :data:`MAX_FUNCTION_LINES` lines, counted from its ``def`` line (decorators
  left out) to the last line of its body, **its docstring left out** (a function is not made
  shorter by cutting its documentation); the few that are longer are named in
  :data:`LONG_FUNCTIONS` with why, and an entry that no longer exceeds the bound fails until it
  is removed, so the list only shrinks;
- a project module imported inside a function (it loads when the function runs, and the module's
  head no longer says what it needs) is listed in :data:`INLINE_IMPORTS_FILE`
  (``tests/data/inline_imports.txt``, whose header states the policy): a new one fails until it
  moves to the module's head or is listed with its reason (start-up time, an import cycle), and a
  listed one that is gone fails until its line is removed. Third-party imports inside functions
  (optional dependencies such as ``gguf``, heavy ones kept off start-up) are not counted.

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

#: No function is longer than this (docstring left out; see the module docstring).
MAX_FUNCTION_LINES = 80

#: ``module:qualified name`` → why it is longer than :data:`MAX_FUNCTION_LINES` today. Measured
#: 2026-11-28: 8 functions over the bound (15 with docstrings counted). Only shrinks: split a
#: function along its seams and remove its entry; a new long function is split, not listed.
LONG_FUNCTIONS: dict[str, str] = {
    "bench.run:main":
        "the bench command line: its options and the dispatch to each benchmark in one place",
    "report.svg_line_plot:line_plot":
        "draws the plot's elements in paint order (axes, bands, lines, markers, legend) "
        "sharing one coordinate transform; not yet split per element",
    "bench.claim_v_timing:bench_model":
        "the timed stages of claim V on one model, in order, each with its timer and memory "
        "probe; a stage table would replace it",
    "claims.claim_e:head_record":
        "assembles the γ record of a head (metrics, intervals, tests against chance, rule "
        "sections); the chance test moves out with issue 46 item 2",
    "fixtures.plugin.options:pytest_addoption":
        "one addoption call per command-line option: a table written as calls",
}

#: The in-function project imports allowed today, one ``module:function -> imported`` a line.
INLINE_IMPORTS_FILE = ROOT / "tests" / "data" / "inline_imports.txt"
#: The most entries its ``[grandfathered]`` section may hold: the 250 found on 2026-11-28, when
#: the rule came in, 239 since the test against chance moved to claims/chance.py, 204 since claim
#: V's grid moved out of the engine into claims/claim_v_grid.py (issue 46), 203 since claim V's
#: layer reads its errors at its head. Lower it as the list
#: shrinks; never raise it.
GRANDFATHERED_INLINE_IMPORTS = 203


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


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return first.end_lineno - first.lineno + 1
    return 0


def _functions(tree: ast.AST, module: str):
    """Yield (``module:Class.function.inner``, node, the enclosing function's node or None) for
    every function of a module, nested ones included."""
    def walk(node: ast.AST, qual: list[str], outer):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{module}:{'.'.join(qual + [child.name])}"
                yield name, child, outer
                yield from walk(child, qual + [child.name], child)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, qual + [child.name], outer)
            else:
                yield from walk(child, qual, outer)
    yield from walk(tree, [], None)


def function_lengths(modules: dict[str, Path]) -> dict[str, int]:
    """``module:qualified name`` → its length in lines: from the ``def`` line to the end of
    its body, the docstring left out (a nested function counts in its own entry and in its
    enclosing function's)."""
    lengths = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node, _ in _functions(tree, module):
            lengths[name] = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
    return lengths


def inline_imports(modules: dict[str, Path]) -> set[str]:
    """Every project module imported inside a function, as ``module:function -> imported``
    (the innermost function holding the import; an import of the same module twice in one
    function counts once; ``if TYPE_CHECKING:`` blocks never run and are left out)."""
    names = set(modules)
    found = set()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, func, _ in _functions(tree, module):
            for node in _own_imports(func):
                for target in _resolve(module, path.name == "__init__.py", node, names):
                    found.add(f"{name} -> {target}")
    return found


def _own_imports(func: ast.FunctionDef | ast.AsyncFunctionDef):
    """The import statements a function runs itself: not those of the functions defined in it
    (theirs), nor those under ``if TYPE_CHECKING:`` (never run)."""
    def walk(nodes):
        for child in nodes:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and _is_type_checking(child):
                yield from walk(child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            yield from walk(list(ast.iter_child_nodes(child)))
    yield from walk(func.body)


def read_inline_imports(path: Path = None) -> tuple[dict[str, str], set[str]]:
    """The allowlist: (entries with their stated reason, grandfathered entries). Lines above
    ``[grandfathered]`` must carry a reason after ``#``; ``#`` lines are comments."""
    path = path or INLINE_IMPORTS_FILE
    reasoned: dict[str, str] = {}
    grandfathered: set[str] = set()
    section = "reasoned"
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line == "[grandfathered]":
            section = "grandfathered"
            continue
        if not line or line.startswith("#"):
            continue
        entry, _, reason = (part.strip() for part in line.partition("#"))
        if section == "grandfathered":
            grandfathered.add(entry)
        else:
            reasoned[entry] = reason
    return reasoned, grandfathered


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


def test_no_function_is_over_the_length_limit(graph):
    modules, _ = graph
    lengths = function_lengths(modules)
    over = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    new = sorted(set(over) - set(LONG_FUNCTIONS))
    assert not new, (f"functions over {MAX_FUNCTION_LINES} lines (docstring left out), split "
                     "them along their seams: " + ", ".join(f"{n} ({over[n]})" for n in new))
    stale = sorted(set(LONG_FUNCTIONS) - set(over))
    assert not stale, ("LONG_FUNCTIONS lists functions that are gone or no longer over "
                       f"{MAX_FUNCTION_LINES} lines, remove them: " + ", ".join(
                           f"{n} ({lengths.get(n, 'gone')})" for n in stale))
    assert all(reason.strip() for reason in LONG_FUNCTIONS.values())


def test_in_function_project_imports_are_listed(graph):
    modules, _ = graph
    found = inline_imports(modules)
    reasoned, grandfathered = read_inline_imports()
    missing_reason = sorted(e for e, why in reasoned.items() if not why)
    assert not missing_reason, (f"{INLINE_IMPORTS_FILE.relative_to(ROOT)}: an entry above "
                                "[grandfathered] states its reason after '#': " + ", ".join(
                                    missing_reason))
    assert len(grandfathered) <= GRANDFATHERED_INLINE_IMPORTS, (
        f"{INLINE_IMPORTS_FILE.relative_to(ROOT)}: the [grandfathered] list only shrinks "
        f"(at most {GRANDFATHERED_INLINE_IMPORTS}); list a new import above it with its reason")
    listed = set(reasoned) | grandfathered
    new = sorted(found - listed)
    assert not new, ("project modules imported inside a function: move the import to the "
                     "module's head, or list it above [grandfathered] in "
                     f"{INLINE_IMPORTS_FILE.relative_to(ROOT)} with its reason (start-up time, "
                     "an import cycle): " + "; ".join(new))
    stale = sorted(listed - found)
    assert not stale, (f"{INLINE_IMPORTS_FILE.relative_to(ROOT)} lists in-function imports that "
                       "are gone, remove their lines: " + "; ".join(stale))


def test_function_rules_find_what_they_look_for(tmp_path):
    """Lengths leave the docstring out; in-function imports are found in the innermost
    function, methods and nested functions named by their path, TYPE_CHECKING and module-level
    imports left out; the allowlist's sections."""
    pkg = tmp_path / "checks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "gram.py").write_text("X = 1\n")
    src = ("from typing import TYPE_CHECKING\nimport checks.gram\n"
           "def f():\n    \"\"\"Doc\n    two lines.\"\"\"\n    from . import gram\n"
           "    from .gram import X\n    def g():\n        import checks.gram\n"
           "    return gram\n"
           "class A:\n    def m(self):\n        if TYPE_CHECKING:\n            from checks import gram\n"
           "        import os\n        return os\n")
    (pkg / "mod.py").write_text(src)
    modules = {"checks": pkg / "__init__.py", "checks.gram": pkg / "gram.py",
               "checks.mod": pkg / "mod.py"}
    assert inline_imports(modules) == {"checks.mod:f -> checks.gram",
                                       "checks.mod:f.g -> checks.gram"}
    lengths = function_lengths(modules)
    assert lengths["checks.mod:f"] == 8 - 2 and lengths["checks.mod:A.m"] == 5
    listing = tmp_path / "list.txt"
    listing.write_text("# policy\na:f -> b  # start-up time\nc:g -> d\n[grandfathered]\n"
                       "e:h -> i\n")
    assert read_inline_imports(listing) == ({"a:f -> b": "start-up time", "c:g -> d": ""},
                                            {"e:h -> i"})


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
    long = sorted(((n, f) for f, n in function_lengths(mods).items() if n > MAX_FUNCTION_LINES),
                  reverse=True)
    print(f"{len(long)} functions over {MAX_FUNCTION_LINES} lines (docstring left out):")
    for n, f in long:
        print(f"{n:5d}  {f}")
    print(f"{len(inline_imports(mods))} in-function project imports (module:function -> imported)")


def claim_literals(paths, ids: set[str]) -> list[str]:
    """``file:line 'X'`` for every string literal in ``paths`` that is one of the claim ``ids``."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in ids:
                found.append(f"{Path(path).name}:{node.lineno} {node.value!r}")
    return found


def test_the_engine_names_no_claim(tmp_path):
    """``fixtures/engine`` knows no claim by name (docs/architecture.md): no registered claim's id
    is a string literal there; what the engine needs of a claim is in its ``ClaimSpec``."""
    from claims import registry

    ids = {spec.id for spec in registry.all_claims()}
    assert {"V", "J", "E", "R"} <= ids
    found = claim_literals(sorted((ROOT / "fixtures" / "engine").glob("*.py")), ids)
    assert not found, "the engine names claims: " + ", ".join(found)
    # the rule finds what it looks for: a key marked for one claim, as the engine's once was
    (tmp_path / "bad.py").write_text('def key(claim):\n    return {"v_hat": 1} if claim == "J" '
                                     'else {}\n')
    assert claim_literals([tmp_path / "bad.py"], ids) == ["bad.py:2 'J'"]
