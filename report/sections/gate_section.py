"""This module owns the report's CI-gate section: the outcome of ``--baseline``/``--require``
recorded in ``results["gate"]`` (what was compared with what, verdict moves, metric deltas and
their tolerances), with the baseline named by its file name only."""

from __future__ import annotations

from pathlib import Path


def gate_context(results: dict) -> dict | None:
    """The CI gate's outcome (``results["gate"]``, written by ``--baseline``/``--require``): what
    was compared with what, verdict moves and metric deltas with their tolerances."""
    gate = results.get("gate")
    if not isinstance(gate, dict):
        return None
    path = gate.get("baseline") or ""
    name = Path(path).name if path else ""  # the report names files, never absolute paths
    if "error" in gate:
        error = gate["error"].replace(path, name) if path else gate["error"]
        return {"error": error, "summary": error, "pairs": [], "rows": [],
                "mode": gate.get("mode", ""), "compared": 0}

    def row(c: dict, kind: str) -> dict:
        metric = c.get("what") != "verdict"
        delta = (c["new"] - c["old"]) if metric and isinstance(c.get("new"), (int, float)) \
            and isinstance(c.get("old"), (int, float)) else None
        return {"kind": kind, "record": c["record"], "what": c["what"], "old": c["old"],
                "new": c["new"], "delta": delta, "tolerance": c.get("tolerance")}

    rows = [row(c, "regression") for c in gate.get("regressions", [])]
    rows += [row(c, "requirement not met") for c in gate.get("require", [])]
    rows += [row(c, "improvement") for c in gate.get("improvements", [])]
    summary = gate.get("summary", "").replace(path, name) if path else gate.get("summary", "")
    return {"error": None, "summary": summary, "mode": gate.get("mode", ""),
            "baseline": name, "pairs": gate.get("pairs", []),
            "compared": gate.get("compared", 0), "require": gate.get("require_text"),
            "rows": rows}
