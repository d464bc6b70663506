"""Packaging: the dependency check of CI (deptry, configured in pyproject.toml) passes on the
checkout and fails when a module imports a package that pyproject.toml does not declare."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("deptry", reason="deptry is in the test extra: pip install -e '.[test]'")


def _copy_checkout(dest: Path) -> Path:
    """The checkout's Python sources and pyproject.toml, without caches, runs or the venv."""
    ignore = shutil.ignore_patterns(".git", ".venv", "venv", "runs", ".kpca-cache", "__pycache__",
                                    "*.safetensors", "*.ipynb", "*.json", "*.html", "data")
    for name in ("bench", "checks", "claims", "fixtures", "report", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "conftest.py", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def _deptry(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deptry", "."], cwd=path, capture_output=True,
                          text=True, timeout=120, env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"})


def test_requires_python_matches_the_stdlib_used():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"].startswith(">=3.11")  # tomllib is new in 3.11
    uses_tomllib = any("import tomllib" in p.read_text() for p in (ROOT / "claims").glob("*.py"))
    assert uses_tomllib  # if the code stops needing 3.11, this test should be revisited


def test_dependency_check_passes_on_the_checkout(tmp_path):
    out = _deptry(_copy_checkout(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("planted, rule", [
    ("import requests\n", "DEP003"),              # installed (through transformers), not declared
    ("import kpca_no_such_package\n", "DEP001"),  # not installed at all
])
def test_dependency_check_fails_on_a_planted_undeclared_import(tmp_path, planted, rule):
    root = _copy_checkout(tmp_path)
    (root / "checks" / "planted.py").write_text(f'"""An undeclared import."""\n{planted}')
    out = _deptry(root)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "checks/planted.py" in text and rule in text and planted.split()[1].strip() in text
