"""This module owns reading a results.json for the report: the record-level checks that keep a
results dict from being rendered (:func:`validate_results`) and the strict load of a file
(:func:`load_results`: parsed and checked against docs/results.schema.json by
:mod:`report.validate`, then by :func:`validate_results`)."""

from __future__ import annotations

from pathlib import Path

from claims.names import RESULTS_SCHEMA as SCHEMA
from claims.records import LEVELS, VERDICTS


def validate_results(results) -> None:
    """Raise ValueError naming the first problem that keeps ``results`` from being rendered.

    Checks the schema id, the top-level fields and their types, and every record's claim, level,
    model, layer, head and verdict.
    """
    if not isinstance(results, dict):
        raise ValueError(f"the top level must be a JSON object, not {type(results).__name__}")
    schema = results.get("schema")
    if schema != SCHEMA:
        raise ValueError(f"schema is {schema!r}; this report reads {SCHEMA!r}")
    kinds = {"provenance": dict, "options": dict, "thresholds": dict, "models": dict,
             "records": list, "not_run": list, "complete": bool}
    for name, kind in kinds.items():
        if name not in results:
            raise ValueError(f"the field {name!r} is missing")
        if not isinstance(results[name], kind):
            raise ValueError(f"the field {name!r} must be a {kind.__name__}, "
                             f"not {type(results[name]).__name__}")
    for key, info in results["models"].items():
        if not isinstance(info, dict):
            raise ValueError(f"models[{key!r}] must be an object")
    for i, rec in enumerate(results["records"]):
        where = f"records[{i}]"
        if not isinstance(rec, dict):
            raise ValueError(f"{where} must be an object")
        where += f" ({rec.get('test_id', 'no test_id')})"
        for name in ("claim", "level", "model", "verdict"):
            if not isinstance(rec.get(name), str):
                raise ValueError(f"{where}: {name!r} must be a string, got {rec.get(name)!r}")
        if rec["level"] not in LEVELS:
            raise ValueError(f"{where}: level {rec['level']!r} is not one of {list(LEVELS)}")
        if rec["verdict"] not in VERDICTS:
            raise ValueError(f"{where}: verdict {rec['verdict']!r} is not one of {list(VERDICTS)}")
        for name in ("layer", "head"):
            value = rec.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise ValueError(f"{where}: {name!r} must be a non-negative integer or null, "
                                 f"got {value!r}")
        if rec["level"] == "head" and (rec.get("layer") is None or rec.get("head") is None):
            raise ValueError(f"{where}: a head record needs both 'layer' and 'head'")
        if rec["level"] == "layer" and rec.get("layer") is None:
            raise ValueError(f"{where}: a layer record needs 'layer'")


def load_results(path, schema: bool = True) -> dict:
    """Read a results.json, parsed strictly and validated against docs/results.schema.json
    (report/validate.py) and :func:`validate_results`; ValueError naming the file and the problem
    otherwise. ``schema`` False skips the schema (1.3 s for command 1's 897 records on a 2-core
    Xeon, 2026-11-29) for the one caller that has just checked this very file's content against it:
    the run that wrote it (fixtures/plugin/results.py)."""
    from . import validate

    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such results file")
    results = validate.read_json(path, "results file")
    try:
        validate_results(results)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if schema:
        validate.check(results, f"results file {path}", "results")
    return results
