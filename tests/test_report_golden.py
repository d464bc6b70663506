"""report.html is byte-identical for the same results.json across refactors of report/.

The goldens in ``tests/data/report_golden/`` are the pages the renderer makes from the variants
below of ``tests/data/results_example.json``: a refactor of report/ leaves them unchanged.

Regenerate (only for a deliberate change of the page, and say which in the commit):
``python -m tests.test_report_golden``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from report.render import render_report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"
GOLDEN = ROOT / "tests" / "data" / "report_golden"
MINI = "all-MiniLM-L6-v2"


def _example() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def _partial() -> dict:
    part = _example()
    part["records"] = [r for r in part["records"]
                       if not (r["claim"] == "E" and r["model"] == MINI
                               and (r["level"] == "model" or r.get("layer") == 1))]
    part["not_run"] = sorted(
        [f"claims/test_gram_spectrum.py::test_gamma_constancy[{MINI}-L01-H{h}]" for h in range(3)]
        + [f"claims/test_gram_spectrum.py::test_eigenvalue_statistics[{MINI}]"]
        + ["claims/test_projection_loss.py::test_projection_loss_series[p1-series-b]",
           "claims/test_value_vectors.py::test_value_vectors_model[other-model]"])
    part["complete"], part["exit_status"] = False, 2
    return part


def _empty() -> dict:
    return {**_example(), "models": {}, "records": [], "complete": False, "exit_status": 2,
            "not_run": [f"claims/test_value_vectors.py::test_value_vectors[{MINI}-L00-H0]"]}


def _model_only() -> dict:
    only = _example()
    only["records"] = [r for r in only["records"] if r["level"] in ("model", "series")]
    return only


def _sparse() -> dict:
    """Records thinned to the fields every reader must cope without (optional ones dropped)."""
    sparse = copy.deepcopy(_example())
    for r in sparse["records"]:
        for key in ("p2_code", "head_verdicts_by_rules", "vs_null", "reference", "p1_code",
                    "per_head", "route_ratios"):
            r.pop(key, None)
    return sparse


VARIANTS = {"example": _example, "partial": _partial, "empty": _empty,
            "model_only": _model_only, "sparse": _sparse}

@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_report_matches_the_golden(name):
    page = render_report(VARIANTS[name]())
    golden = (GOLDEN / f"{name}.html").read_text(encoding="utf-8")
    if page != golden:
        new, old = page.splitlines(), golden.splitlines()
        first = next((i for i, (a, b) in enumerate(zip(new, old)) if a != b), min(len(new), len(old)))
        pytest.fail(f"report.html of {name!r} differs from tests/data/report_golden/{name}.html "
                    f"from line {first + 1}:\n  golden: {old[first:first + 1]}\n  now:    "
                    f"{new[first:first + 1]}")


if __name__ == "__main__":
    for name, make in VARIANTS.items():
        (GOLDEN / f"{name}.html").write_text(render_report(make()), encoding="utf-8")
        print(f"wrote {GOLDEN / name}.html")
