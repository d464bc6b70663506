"""The README is a user guide and the documentation holds together.

- README.md is at most :data:`MAX_README_LINES` lines, starts with the two commands of the quick
  start (command 1 the main job on the embedded default, command 2 the project's tests), and
  links every page of ``docs/``;
- every relative link of README.md and of ``docs/*.md`` resolves: the file exists, and an anchor
  (``#…``) names a heading of the target (GitHub's slugs) or an ``<a id="…">`` in it;
- docs/architecture.md states the layer table of ``tests/test_architecture.py`` and names every
  module and folder of ``fixtures/``.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
#: The quick start, exactly: what a fresh clone runs first.
QUICK_START = """```bash
# 1. the main job on the embedded default (offline): verdicts per head/layer/model, results.json, report.html
bash scripts/setup.sh && .venv/bin/python -m pytest claims/ -n 2
# 2. the project's own tests
bash scripts/setup.sh && .venv/bin/python -m pytest tests/ -n 2
```"""

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, outside code blocks and code spans."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return _LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (hyphens and
    underscores kept), spaces to hyphens."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown file defines: its headings' slugs (numbered -1, -2 … when repeated,
    as GitHub does) and its ``<a id="…">`` tags."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    found: set[str] = set(re.findall(r"<a id=\"([^\"]+)\"", text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` whose file or anchor does not exist."""
    wrong = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            wrong.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            wrong.append(f"{target} (no such anchor in {dest.name})")
    return wrong


def test_readme_is_a_short_user_guide():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, more than {MAX_README_LINES}: move detail to a page "
        "of docs/ and link it")


def test_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    first_block = _FENCE.search(text)
    assert first_block is not None and first_block.group(0) == QUICK_START, (
        "README.md's first code block must be the quick start, exactly: command 1 (claims/) and "
        "command 2 (tests/)")
    before = text[:first_block.start()]
    assert "\n## " not in before, "the quick start comes before the README's first section"


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    missing = [p.name for p in sorted(DOCS.iterdir())
               if p.suffix in (".md", ".json") and p.resolve() not in linked]
    assert not missing, f"README.md's documentation table does not link: {', '.join(missing)}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    wrong = broken_links(page)
    assert not wrong, f"{page.relative_to(ROOT)}: broken links: " + "; ".join(wrong)


def test_the_link_check_finds_what_it_looks_for(tmp_path):
    """A missing file, a missing anchor, and links it must accept: a heading's slug with
    punctuation, a repeated heading, an ``<a id>``, links inside code, and web links."""
    (tmp_path / "other.md").write_text('# Other\n\n<a id="s2-3"></a>\n\n'
                                       "## Exit codes: 0–8 (`--x`)\n\n## Exit codes: 0–8 (`--x`)\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[a](other.md) [b](other.md#s2-3) [c](other.md#exit-codes-08---x)\n"
                    "[c2](other.md#exit-codes-08---x-1) [d](#page) [w](https://example.org/x)\n"
                    "`[code](gone.md)`\n\n```\n[fenced](gone.md)\n```\n"
                    "[bad](gone.md) [bad2](other.md#nowhere) [bad3](#nothing)\n")
    assert broken_links(page) == ["gone.md (no such file)",
                                  "other.md#nowhere (no such anchor in other.md)",
                                  "#nothing (no such anchor in page.md)"]


ARCHITECTURE = DOCS / "architecture.md"


def test_architecture_page_states_the_layer_table():
    from tests.test_architecture import MAY_IMPORT

    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = text.split("<!-- layers:begin", 1)[1].split("<!-- layers:end -->", 1)[0]
    stated = {}
    for line in block.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        stated[cells[0].strip("`")] = set(re.findall(r"`([a-z.]+)`", cells[1]))
    assert stated == MAY_IMPORT, "docs/architecture.md's layer table differs from MAY_IMPORT"


def test_architecture_page_names_everything_in_fixtures():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    tree = text.split("## The fixtures tree", 1)[1].split("\n## ", 1)[0]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", tree))
    shipped = ROOT / "fixtures" / "data" / "trained"  # data: the tree names the folder only
    found = [p for p in (ROOT / "fixtures").rglob("*") if "__pycache__" not in p.parts
             and (p.is_dir() or p.suffix in (".py", ".json", ".txt"))
             and not p.is_relative_to(shipped)]
    missing = sorted(str(p.relative_to(ROOT)) for p in found
                     if p.stem not in words and p.name not in words)
    assert not missing, f"docs/architecture.md's fixtures tree does not name: {', '.join(missing)}"
