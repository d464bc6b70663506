"""docs/bad-inputs.md and the behaviour stay together: every row of its tables names an exit code
and at least one test; every test it names exists; and each named test asserts that exit code
(a parametrised startup case is run through ``usage_error``, which asserts exit 4). The rows' own
runs are those tests: running them runs the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "bad-inputs.md"
FILES = {"B": "test_bad_inputs.py", "I": "test_interrupts.py", "P": "test_properties.py",
         "T": "test_input_types.py", "G": "test_baseline.py", "S": "test_scale.py",
         "C": "test_cache.py", "F": "test_families.py",
         "D": "test_decoders.py", "X": "test_side_tools.py", "N": "test_nothing_judged.py",
         "L": "test_capture_layers.py", "Y": "test_layer_shards.py"}
#: helpers of the test files that assert an exit code themselves
HELPERS = {"usage_error": {4}, "run_claims": {0, 1}}
_CODE_NAMES = {"USAGE_ERROR": 4, "TESTS_FAILED": 1, "OK": 0, "INTERRUPTED": 2,
               "INTERNAL_ERROR": 3, "NO_TESTS_COLLECTED": 5}


def rows() -> list[dict]:
    """Every body row of every table with an ``Exit`` column: its cells by header."""
    out, header = [], None
    for number, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip()[1:-1].split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            if "Exit" in header:
                assert len(cells) == len(header), f"docs/bad-inputs.md line {number}: {len(cells)} cells"
                out.append({"line": number, **dict(zip(header, cells))})
    return out


def refs(cell: str) -> list[tuple[str, str]]:
    """``B `a`, `b`, I `c``` → [("B", "a"), ("B", "b"), ("I", "c")]."""
    found, letter = [], None
    for token in re.finditer(r"\b([A-Z])\s+(?=`)|`([^`]+)`", cell):
        if token.group(1):
            letter = token.group(1)
            continue
        if letter is not None:
            name = token.group(2)
            if name.startswith("["):  # `[xdist]`: another param of the previous test
                continue
            found.append((letter, name.split("[")[0]))
    return found


def _exits(cell: str) -> set[int] | None:
    if cell.strip() in ("—", "-"):
        return None
    return {int(x) for x in re.findall(r"\d+", cell)}


def _source(letter: str) -> str:
    return (ROOT / "tests" / FILES[letter]).read_text(encoding="utf-8")


def _function(letter: str, name: str) -> ast.FunctionDef | None:
    tree = ast.parse(_source(letter))
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name),
                None)


def asserted_codes(func: ast.FunctionDef) -> set[int]:
    """The exit codes a test function asserts: ``ret == 4``, ``returncode in (0, 1)``,
    ``ExitCode.USAGE_ERROR``, ``exit_status == 7``, or a helper that asserts one."""
    text = ast.unparse(func)
    codes = set()
    for m in re.finditer(r"(?:ret|returncode|exit_status|exitstatus|code)\s*(?:==|in)\s*"
                         r"[\(\[{]?\s*([0-9][0-9, ]*)", text):
        codes |= {int(x) for x in re.findall(r"\d+", m.group(1))}
    codes |= {v for k, v in _CODE_NAMES.items() if f"ExitCode.{k}" in text}
    for helper, helper_codes in HELPERS.items():
        if re.search(rf"\b{helper}\(", text):
            codes |= helper_codes
    return codes


def _row_id(row: dict) -> str:
    return f"line{row['line']}"


ROWS = rows()


def test_the_table_has_its_rows():
    assert len(ROWS) >= 80, len(ROWS)
    assert all(refs(r["Test"]) for r in ROWS), [r["line"] for r in ROWS if not refs(r["Test"])]


@pytest.mark.parametrize("row", ROWS, ids=_row_id)
def test_each_row_names_existing_tests_that_assert_its_exit_code(row):
    exits = _exits(row["Exit"])
    checked: list[tuple[str, set[int]]] = []
    for letter, name in refs(row["Test"]):
        source = _source(letter)
        func = _function(letter, name)
        if func is None:  # a case of a parametrised table: ("id", ...) or "id": (...)
            assert re.search(rf"""\(\s*["']{re.escape(name)}["']\s*,|["']{re.escape(name)}["']\s*:\s*\(""",
                             source), f"line {row['line']}: no test or case {name!r} in {FILES[letter]}"
            if exits is not None and letter == "B":
                assert exits == {4}, f"line {row['line']}: the startup cases of B assert exit 4"
            if exits is not None and letter == "S":
                assert exits & {4}, f"line {row['line']}: the bad-merge cases of S assert exit 4"
            continue
        if exits is not None:
            checked.append((name, asserted_codes(func)))
    if exits is not None and checked:  # one of the row's runs asserts its exit code
        assert any(codes & exits for _, codes in checked), (
            f"line {row['line']}: the table says exit {sorted(exits)}, its tests assert "
            + "; ".join(f"{name}: {sorted(codes)}" for name, codes in checked))
