"""The report's "Controls" section (method §12): for every control model and claim, the expected
verdict beside the verdicts it got, instrument failures highlighted, and the numbers that decide
them; shown before the models under test, which the rest of the report is about.

A record is a control's when it carries ``control`` (its role) and ``expected``
(fixtures/models/controls.py writes both); results files without them have no Controls section.
"""

from __future__ import annotations

import re

from claims.records import VERDICTS

from ..common import fmt
from ..first_screen import control_outcome

ROLE_ORDER = ("positive", "dose-response", "negative")
#: The columns: (claim, level) and their heading.
UNITS = (("V", "head", "V heads"), ("V", "model", "V model"), ("J", "layer", "J layers"),
         ("J", "model", "J model"), ("E", "head", "γ heads"), ("E", "model", "E statistics"))
#: The numbers shown beside each control: (claim, level, metric, label).
NUMBERS = (("V", "model", "subspace_overlap", "overlap"),
           ("V", "model", "optimal_cosine", "opt. cos"),
           ("V", "model", "linear_cka", "lin. CKA"),
           ("J", "model", "log10_ratio", "log10 ‖h‖²/‖φ‖²"),
           ("J", "model", "bessel_share", "Bessel share"))


def split(results: dict) -> tuple[dict, dict]:
    """(results of the models under test, results of the controls): the records carrying
    ``control`` and their models go to the second; everything else to the first."""
    control_models = {r["model"] for r in results["records"] if r.get("control")}
    if not control_models:
        return results, {**results, "records": [], "models": {}}
    under_test = {**results,
                  "records": [r for r in results["records"] if not r.get("control")],
                  "models": {k: v for k, v in results["models"].items() if k not in control_models}}
    controls = {**results, "records": [r for r in results["records"] if r.get("control")],
                "models": {k: v for k, v in results["models"].items() if k in control_models}}
    return under_test, controls


def _natural(key: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def _cell(records: list[dict]) -> dict:
    """One (control, claim, level) cell: the expectation, the verdicts got, and the failures."""
    if not records:
        return {"empty": True}
    expected = records[0].get("expected") or {}
    got: dict[str, int] = {}
    for r in records:
        verdict = (r.get("expected") or {}).get("got") or r["verdict"]
        got[verdict] = got.get(verdict, 0) + 1
    outcomes = [control_outcome(r) for r in records]
    failed, met = outcomes.count("failed"), outcomes.count("met")
    underpowered = outcomes.count("underpowered")
    state = ("failed" if failed else "met" if met == len(records) else
             "underpowered" if underpowered else "free")
    return {"empty": False, "expected": expected.get("verdict"), "why": expected.get("why", ""),
            "rules": expected.get("rules"), "n": len(records), "failed": failed, "state": state,
            "underpowered": underpowered,
            "got": [(v, got[v]) for v in VERDICTS if got.get(v)]}


def context(results: dict) -> dict | None:
    """The Controls section's context, or None when the results hold no control record."""
    records = [r for r in results["records"] if r.get("control")]
    if not records:
        return None
    by_model: dict[str, list[dict]] = {}
    for r in records:
        by_model.setdefault(r["model"], []).append(r)
    rows = []
    for model in sorted(by_model, key=lambda m: (
            ROLE_ORDER.index(by_model[m][0]["control"]) if by_model[m][0]["control"] in ROLE_ORDER
            else len(ROLE_ORDER), _natural(m))):
        recs = by_model[model]
        info = results["models"].get(model) or {}
        cells = [_cell([r for r in recs if r["claim"] == c and r["level"] == lv])
                 for c, lv, _ in UNITS]
        numbers = []
        for c, lv, metric, label in NUMBERS:
            rec = next((r for r in recs if r["claim"] == c and r["level"] == lv), None)
            value = ((rec or {}).get("metrics") or {}).get(metric)
            numbers.append((label, fmt(value) if isinstance(value, (int, float)) else "—"))
        gamma = [((r.get("metrics") or {}).get("gamma_position")) for r in recs
                 if r["claim"] == "E" and r["level"] == "head"]
        gamma = [g for g in gamma if isinstance(g, (int, float))]
        if gamma:
            numbers.append(("mean γ position", fmt(sum(gamma) / len(gamma))))
        rows.append({"model": model, "role": recs[0]["control"],
                     "label": str(info.get("label", "")).split(": ", 1)[-1],
                     "cells": cells, "numbers": numbers,
                     "failed": sum(cell.get("failed", 0) for cell in cells)})
    failures = [f.get("error", "") for f in results.get("instrument_failures") or []]
    if not failures:  # a results file written before the list existed: from the records
        failures = [f"claim {r['claim']} {r['model']} ({r['level']}): expected "
                    f"{r['expected'].get('verdict')}, got {r['expected'].get('got')}"
                    for r in records if (r.get("expected") or {}).get("met") is False]
    roles = {}
    for row in rows:
        roles[row["role"]] = roles.get(row["role"], 0) + 1
    outcomes = [control_outcome(r) for r in records]
    return {"rows": rows, "units": [label for _, _, label in UNITS], "failures": failures,
            "n_failed": len(failures), "n_records": len(records),
            "n_met": outcomes.count("met"),
            # a record without an expectation, or underpowered, is neither a hit nor a miss
            "n_judged": outcomes.count("met") + outcomes.count("failed"),
            "n_none": outcomes.count("none"), "n_underpowered": outcomes.count("underpowered"),
            "roles": [(role, roles[role]) for role in ROLE_ORDER if role in roles],
            "rules": next(((r.get("expected") or {}).get("rules") for r in records), "ours")}
