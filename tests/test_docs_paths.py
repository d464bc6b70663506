"""The docs name only what exists, and docs/architecture.md's tables name where each job lives.

- Every backticked name in README.md and ``docs/*.md`` (outside fenced blocks) that starts with a
  project folder (:data:`PROJECT_ROOTS`) exists: a path (``claims/claim_v.py``, ``scripts/setup.sh``,
  a folder ``report/sections/``; a glob matches at least one file; ``<placeholder>`` parts are cut
  off, ``fixtures/data/trained/<config hash>/`` checks ``fixtures/data/trained/``), or a dotted
  name (``fixtures.engine.model_run``, ``checks.gamma.gamma_spread_batched``,
  ``fixtures.engine.model_run.ModelRun.prepare``): the longest prefix that is a module, then each
  further part a name defined in it (a ``def``, ``class``, assignment or import, at module level;
  then in that class). A span is checked word by word, so ``python -m bench.run --pipeline`` checks
  ``bench.run``. Names read from the source with :mod:`ast`; nothing is imported.
  A name that must not exist here (the example claim a maintainer would create, another
  repository's file, a file a command writes) is listed in :data:`NOT_IN_THIS_CHECKOUT` with the
  reason; an entry no page names any more fails.
- In every table of docs/architecture.md, a backticked identifier (``ModelRun``,
  ``Cache.read_verified``) that follows a module in the same cell is defined in that module
  (``def``/``class`` at any depth, an assignment at module or class level: not an import, so the
  table names the module that holds the job), or is a string key that module uses (a hook name, a
  registered kernel's name); a bare file name (``svg_colour.py``) is in the folder of the path
  before it in the same row.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from fixtures.fingerprint import module_path  # a dotted name's file under the checkout

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The project's top-level folders: a backticked word starting with one of them is a project name.
PROJECT_ROOTS = ("checks", "claims", "fixtures", "report", "bench", "tests", "scripts")
#: A dotted word whose last part is one of these is a file name (``report.html``), not a module.
FILE_SUFFIXES = {"html", "json", "jsonl", "md", "toml", "txt", "csv", "py", "ipynb", "sh", "xml",
                 "png", "j2", "safetensors"}
#: Names the docs give that are not files of this checkout, and why.
NOT_IN_THIS_CHECKOUT: dict[str, str] = {
    "claims/claim_h.py": "docs/architecture.md's example claim: the file a maintainer would create",
    "claims/test_attention_entropy.py": "docs/architecture.md's example claim: its test module",
    "scripts/norms.py": "method §9: a file of P2's repository (KarahanS/Reproduction-Study-KPCA)",
    "scripts/wandb_data/*_varphi.csv": "method §9: P2's logs, in P2's repository",
    "bench/pipeline.json": "written by `python -m bench.run --pipeline` (docs/performance.md)",
}

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+)`")
_WORD_START = re.compile(r"^(?:%s)(?:[/.]|$)" % "|".join(PROJECT_ROOTS))
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?$")
_BARE_FILE = re.compile(r"^[\w-]+\.(?:py|toml|json|txt|sh)$")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def spans(text: str) -> list[str]:
    """The code spans of Markdown text, outside fenced blocks."""
    return _SPAN.findall(_FENCE.sub("", text))


def project_words(span: str) -> list[str]:
    """The words of a code span that name something of the project, each cut at a call's ``(``,
    a placeholder's ``<``, a ``:`` or a trailing comma."""
    found = []
    for word in span.split():
        word = re.split(r"[(<:]", word, maxsplit=1)[0].rstrip(",;")
        if _WORD_START.match(word):
            found.append(word)
    return found


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _assigned(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body binds: defs, classes, assignments, imports (their aliases);
    ``try``/``if`` blocks included."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names[sub.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            inner = node.body + node.orelse + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                inner += handler.body
            names.update(_assigned(inner))
    return names


def dotted_exists(name: str) -> str | None:
    """None when a dotted project name exists, else what is missing."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_path(".".join(parts[:cut]))
        if path is not None:
            break
    else:
        return "no such module"
    rest = parts[cut:]
    if not rest:
        return None
    if (ROOT.joinpath(*parts[:cut]) / rest[0]).is_dir():
        return f"{'.'.join(parts[:cut + 1])} is a folder without __init__.py"
    scope = _assigned(_tree(path).body)
    for i, attr in enumerate(rest):
        if attr not in scope:
            return f"{'.'.join(parts[:cut + i])} defines no {attr!r}"
        node = scope[attr]
        if not isinstance(node, ast.ClassDef):
            return None  # attributes of a function or a value are not checked
        scope = _assigned(node.body)
    return None


def word_exists(word: str) -> str | None:
    """None when a project word of the docs names something that exists, else why not."""
    if "/" in word or word in PROJECT_ROOTS:
        if "*" in word or "?" in word:
            return None if any(ROOT.glob(word.rstrip("/"))) else "no file matches"
        return None if (ROOT / word).exists() else "no such file or folder"
    if word.rsplit(".", 1)[-1] in FILE_SUFFIXES:
        return None  # a file name such as report.html, not a module
    return dotted_exists(word)


def wrong_names(text: str) -> list[str]:
    """The project words of a page that name nothing here, with why."""
    wrong = []
    for span in spans(text):
        for word in project_words(span):
            if word in NOT_IN_THIS_CHECKOUT:
                continue
            why = word_exists(word)
            if why:
                wrong.append(f"`{word}` ({why})")
    return sorted(set(wrong))


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_project_name_in_the_docs_exists(page):
    wrong = wrong_names(page.read_text(encoding="utf-8"))
    assert not wrong, f"{page.relative_to(ROOT)} names what does not exist: " + "; ".join(wrong)


def test_names_not_in_this_checkout_are_still_named():
    named = {w for p in pages() for s in spans(p.read_text(encoding="utf-8"))
             for w in project_words(s)}
    stale = sorted(set(NOT_IN_THIS_CHECKOUT) - named)
    assert not stale, f"NOT_IN_THIS_CHECKOUT lists names no page gives, remove them: {stale}"


# ---- docs/architecture.md's tables -------------------------------------------------------------

def _defined(path: Path) -> set[str]:
    """What a module holds: every def and class (any depth), module- and class-level assignments
    (imports excluded), and its string constants."""
    tree = _tree(path)
    names: set[str] = set()
    bodies = [tree.body]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                bodies.append(node.body)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    for body in bodies:
        names.update(n for n, node in _assigned(body).items()
                     if not isinstance(node, (ast.Import, ast.ImportFrom)))
    return names


def _as_module(word: str) -> Path | None:
    """The module file a project word names (a ``.py`` path or a dotted module), else None."""
    if "/" in word:
        path = ROOT / word
        return path if path.suffix == ".py" and path.is_file() else None
    return module_path(word)


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every Markdown table of a page, as lists of cells."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[\s|:-]+\|$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def wrong_table_entries(text: str) -> list[str]:
    """In each table row: names that follow a module in a cell but are not held by it; bare file
    names not in the folder of the path before them."""
    wrong = []
    for cells in table_rows(text):
        folder: Path | None = None
        for cell in cells:
            module: Path | None = None
            for span in spans(cell):
                words = project_words(span)
                if words:
                    module = _as_module(words[0])
                    target = ROOT / words[0] if "/" in words[0] else module
                    if target is not None:
                        folder = target if target.is_dir() else target.parent
                elif _BARE_FILE.match(span) and folder is not None:
                    if (folder / span).is_file():
                        module = folder / span if span.endswith(".py") else None
                    else:
                        wrong.append(f"`{span}` is not in {folder.relative_to(ROOT)}/")
                elif _IDENTIFIER.match(span) and module is not None:
                    if not set(span.split(".")) <= _defined(module):
                        wrong.append(f"`{span}` is not defined in {module.relative_to(ROOT)}")
    return sorted(set(wrong))


ARCHITECTURE = DOCS / "architecture.md"


def test_architecture_tables_name_the_modules_that_hold_each_job():
    wrong = wrong_table_entries(ARCHITECTURE.read_text(encoding="utf-8"))
    assert not wrong, "docs/architecture.md's tables: " + "; ".join(wrong)


def test_the_checks_find_what_they_look_for():
    """Paths, globs, placeholders, dotted names down to a class's method, a command's words,
    file names; and in a table, a name in the wrong module and a file in the wrong folder."""
    page = ("`claims/claim_v.py` `claims/` `fixtures/data/trained/<config hash>/` "
            "`tests/data/report_golden/*.html` `python -m fixtures.cache info` `report.html` "
            "`fixtures.engine.model_run.ModelRun.prepare` `checks.stats.seed_from(ctx.head_id(h))` "
            "`claims/claim_q.py` `checks.gram.no_such_thing` `fixtures.engine.model_run.ModelRun.nope` "
            "`tests/data/*.nope` `bench.nowhere` `claims/claim_h.py`\n"
            "```\n`claims/fenced.py`\n```\n")
    assert wrong_names(page) == [
        "`bench.nowhere` (bench defines no 'nowhere')", "`checks.gram.no_such_thing` (checks.gram defines no "
        "'no_such_thing')", "`claims/claim_q.py` (no such file or folder)",
        "`fixtures.engine.model_run.ModelRun.nope` (fixtures.engine.model_run.ModelRun defines no "
        "'nope')", "`tests/data/*.nope` (no file matches)"]
    table = ("| job | module |\n|---|---|\n"
             "| the run | `fixtures/engine/model_run.py` (`ModelRun`, `ModelRun.prepare`), "
             "`layer_context.py` (`LayerContext`) |\n"
             "| wrong | `fixtures/cache.py` (`ModelRun`), `claim_v_section.py`, `fixtures/` |\n")
    assert wrong_table_entries(table) == ["`ModelRun` is not defined in fixtures/cache.py",
                                          "`claim_v_section.py` is not in fixtures/"]
