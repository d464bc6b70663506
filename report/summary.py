"""results.json's ``summary``: outcome counts of a run, computed from its records. One function,
used where a run writes results.json (fixtures/records.py) and where shards are merged
(report/merge.py), so a merged file counts exactly as one run would."""

from __future__ import annotations


def summary(records: list[dict], not_run: list[str]) -> dict:
    """Outcome counts: verdicts per claim and level, pytest outcomes, and tests not run."""
    verdicts: dict[str, dict[str, dict[str, int]]] = {}
    outcomes: dict[str, int] = {}
    for rec in records:
        level = verdicts.setdefault(str(rec["claim"]), {}).setdefault(str(rec.get("level")), {})
        level[rec["verdict"]] = level.get(rec["verdict"], 0) + 1
        outcomes[rec.get("outcome", "unknown")] = outcomes.get(rec.get("outcome", "unknown"), 0) + 1
    return {"records": len(records), "verdicts": verdicts, "outcomes": outcomes,
            "not_run": len(not_run)}
