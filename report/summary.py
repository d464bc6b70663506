"""results.json's ``summary``: outcome counts of a run, computed from its records. One function,
used where a run writes results.json (fixtures/plugin/transport.py) and where shards are merged
(report/merge.py), so a merged file counts exactly as one run would.

The headline counts (``records``, ``verdicts``, ``outcomes``) are about the models under test
only; the records of controls (those carrying ``control``, method §12) are counted apart under
``controls``: per role, how many records met their expected verdict, how many did not
(instrument failures), how many had too few samples to reach it (``underpowered``, present when
any: fixtures/models/controls.py) and how many had no expectation."""

from __future__ import annotations


def summary(records: list[dict], not_run: list[str]) -> dict:
    """Outcome counts: verdicts per claim and level, pytest outcomes, and tests not run, of the
    models under test; the controls' expected-vs-got counts under ``controls``."""
    verdicts: dict[str, dict[str, dict[str, int]]] = {}
    outcomes: dict[str, int] = {}
    controls: dict[str, dict[str, int]] = {}
    under_test = 0
    for rec in records:
        if rec.get("control"):
            expected = rec.get("expected") if isinstance(rec.get("expected"), dict) else {}
            met = expected.get("met")
            key = "as_expected" if met is True else "instrument_failures" if met is False \
                else "underpowered" if expected.get("outcome") == "underpowered" \
                else "no_expectation"
            role = controls.setdefault(str(rec["control"]), {
                "records": 0, "as_expected": 0, "instrument_failures": 0, "no_expectation": 0})
            role["records"] += 1
            role[key] = role.get(key, 0) + 1
            continue
        under_test += 1
        level = verdicts.setdefault(str(rec["claim"]), {}).setdefault(str(rec.get("level")), {})
        level[rec["verdict"]] = level.get(rec["verdict"], 0) + 1
        outcomes[rec.get("outcome", "unknown")] = outcomes.get(rec.get("outcome", "unknown"), 0) + 1
    out = {"records": under_test, "verdicts": verdicts, "outcomes": outcomes,
           "not_run": len(not_run)}
    if controls:
        out["controls"] = controls
    return out
