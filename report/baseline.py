"""This module owns the baseline file of the CI gate (method §10): what makes two runs comparable
(:func:`identity`: per model the architecture, checkpoint hash and input set; the options, the
judging thresholds and the record positions), writing a baseline from one run
(``--update-baseline``: results.json-shaped records plus that identity) and reading one back,
validated against docs/results.schema.json. The comparison itself is :mod:`report.baseline_gate`,
the matching of models and the checks that two runs are comparable :mod:`report.baseline_matching`,
the policy gate ``--require`` :mod:`report.require_gate`.

Comparing runs that differ in anything but the checkpoint is an error (:class:`BaselineMismatch`,
exit 4), not a regression: the numbers would not be comparable.
"""

from __future__ import annotations

import json
from pathlib import Path

from claims.records import Record

from .atomic import atomic_write_text

BASELINE_SCHEMA = "kpca-claims/baseline/2"
#: The run options that must match for two runs to be comparable.
OPTION_FIELDS = ("standardize", "axis_convention", "dtype", "forward_dtype", "n_samples_requested",
                 "seed", "max_tokens", "rules")
#: Options that may differ between comparable runs (they do not change a number by design).
FREE_OPTIONS = ("device", "device_map")
#: Options a results.json or baseline written before they existed ran at: such a file is read as
#: having this value (every capture's forward pass was float64 before ``--forward-dtype``).
IMPLIED_OPTIONS = {"forward_dtype": "float64"}


def with_implied_options(options: dict | None) -> dict:
    """``options`` with :data:`IMPLIED_OPTIONS` filled in where a file predates them."""
    return {**IMPLIED_OPTIONS, **(options or {})}


def implied_record(record: dict) -> dict:
    """A record as compared: its ``options`` (when it has them) with :data:`IMPLIED_OPTIONS`
    filled in and without :data:`FREE_OPTIONS`."""
    if "options" not in record:
        return record
    options = with_implied_options(record["options"])
    return {**record, "options": {k: v for k, v in options.items() if k not in FREE_OPTIONS}}


class BaselineMismatch(ValueError):
    """The baseline was made for other checkpoints, inputs, options, thresholds or claims."""


# ---------------------------------------------------------------------------------- identity
def record_key(rec: dict, model: str | None = None) -> str:
    parts = [f"claim {rec['claim']}", model or rec["model"], rec.get("level", "")]
    if rec.get("layer") is not None:
        parts.append(f"L{rec['layer']:02d}")
    if rec.get("head") is not None:
        parts.append(f"H{rec['head']}")
    return " ".join(parts)


def position(rec: dict) -> tuple:
    """Where a record sits inside its model: matched across checkpoints by this, not by name."""
    return (rec["claim"], rec.get("level", ""), rec.get("layer"), rec.get("head"))


def _strip(obj):
    """Thresholds without their prose (sources, descriptions): the numbers that judge."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in sorted(obj.items()) if k not in ("source", "description")}
    return obj


def judging_thresholds(thresholds: dict) -> dict:
    """The threshold tables that make verdicts (every ``claim_*`` table), prose removed."""
    return {k: _strip(v) for k, v in sorted(thresholds.items()) if k.startswith("claim_")}


def _model_identity(m: dict) -> dict:
    inp = m.get("input_set") or {}
    return {"arch": m.get("arch"), "family": m.get("family"), "n_layers": m.get("n_layers"),
            "n_heads": m.get("n_heads"), "head_dim": m.get("head_dim"),
            "checkpoint_hash": m.get("checkpoint_hash"), "input_set_hash": inp.get("hash"),
            "input_tensor_hash": inp.get("tensor_hash"), "n_samples": inp.get("n_samples")}


def identity(results: dict) -> dict:
    """What must match for two runs to be comparable (and, per model, the checkpoint hash)."""
    options = dict(results.get("options") or {})
    if options.get("rules") is None:
        rules = {r.get("rules") for r in results.get("records", []) if r.get("rules")}
        options["rules"] = rules.pop() if len(rules) == 1 else None
    models = {key: _model_identity(m) for key, m in results.get("models", {}).items()}
    claims: dict[str, list] = {}
    for rec in results.get("records", []):
        claims.setdefault(rec["model"], set()).add(position(rec))
    return {"models": models,
            "options": {k: options.get(k) for k in OPTION_FIELDS},
            "thresholds": judging_thresholds(results.get("thresholds") or {}),
            "positions": {k: sorted(map(list, v), key=str) for k, v in claims.items()}}


def _record_entry(obj: dict) -> dict:
    """A baseline entry: a record's identity, verdict, metrics and intervals."""
    rec = Record.from_json(obj)
    out = {"claim": rec.claim, "model": rec.model, "level": rec.level, "layer": rec.layer,
           "head": rec.head, "verdict": rec.verdict, "metrics": rec.metrics or {}}
    if rec.ci:
        out["ci"] = rec.ci
    return out


def make_baseline(results: dict) -> dict:
    results = json.loads(json.dumps(results))  # a copy: the baseline must not alias the run
    return {"schema": BASELINE_SCHEMA, "identity": identity(results),
            "provenance": results.get("provenance", {}),
            "records": [_record_entry(r) for r in results["records"]]}


def write_baseline(results: dict, path: str | Path) -> Path:

    path = Path(path)
    atomic_write_text(path, json.dumps(make_baseline(results), indent=1, sort_keys=True))
    return path


def load_baseline(path: str | Path) -> dict:
    """Read a baseline file, parsed strictly and validated against docs/results.schema.json
    (report/validate.py): BaselineMismatch with one sentence when it cannot be used."""
    from . import validate

    path = Path(path)
    try:
        data = validate.read_json(path, "baseline")
    except validate.InvalidFile as exc:
        if not path.exists():
            raise BaselineMismatch(f"baseline {path} does not exist; write one with "
                                   "--update-baseline (serial run)") from None
        raise BaselineMismatch(str(exc)) from None
    try:
        validate.require_object(data, f"baseline {path}")
        if data.get("schema") != BASELINE_SCHEMA:
            raise BaselineMismatch(f"{path} is not a baseline this version reads (schema "
                                   f"{data.get('schema')!r}, expected {BASELINE_SCHEMA!r}): "
                                   "regenerate it with --update-baseline")
        validate.check(data, f"baseline {path}", "baseline")
    except validate.InvalidFile as exc:
        raise BaselineMismatch(str(exc)) from None
    return data
