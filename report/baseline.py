"""The CI gate: compare a run's results with a stored baseline of the same checkpoints and inputs.

A baseline is a results.json-shaped file (``--update-baseline`` writes one). A run regresses
when a verdict changes or a metric moves outside its tolerance from ``claims/thresholds.toml``
(``[baseline]``): ``abs + rel·|baseline|``, one-sided where the section names the direction in
which a change is a regression. Comparing against a baseline of other checkpoints, inputs or
options is an error, not a regression: the numbers would not be comparable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

BASELINE_SCHEMA = "kpca-claims/baseline/1"


class BaselineMismatch(ValueError):
    """The baseline was made for other checkpoints, inputs or options."""


@dataclass(frozen=True)
class Regression:
    record: str
    what: str

    def __str__(self) -> str:
        return f"{self.record}: {self.what}"


def record_key(rec: dict) -> str:
    parts = [f"claim {rec['claim']}", rec["model"], rec.get("level", "")]
    if rec.get("layer") is not None:
        parts.append(f"L{rec['layer']:02d}")
    if rec.get("head") is not None:
        parts.append(f"H{rec['head']}")
    return " ".join(parts)


def identity(results: dict) -> dict:
    """What must match for two runs to be comparable: checkpoints, inputs and options."""
    models = {key: {"checkpoint_hash": m["checkpoint_hash"],
                    "input_set_hash": m["input_set"]["hash"],
                    "input_tensor_hash": m["input_set"].get("tensor_hash")}
              for key, m in results["models"].items()}
    opts = {k: results["options"].get(k) for k in ("standardize", "axis_convention", "dtype",
                                                    "n_samples_requested", "seed")}
    return {"models": models, "options": opts}


def make_baseline(results: dict) -> dict:
    results = json.loads(json.dumps(results))  # a copy: the baseline must not alias the run
    return {"schema": BASELINE_SCHEMA, "identity": identity(results),
            "provenance": results.get("provenance", {}),
            "records": {record_key(r): {"verdict": r["verdict"], "metrics": r.get("metrics", {})}
                        for r in results["records"]}}


def write_baseline(results: dict, path: str | Path) -> Path:
    from fixtures.cache import atomic_write_text

    path = Path(path)
    atomic_write_text(path, json.dumps(make_baseline(results), indent=1, sort_keys=True))
    return path


def load_baseline(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineMismatch(f"baseline {path} does not exist; write one with "
                               "--update-baseline (serial run)") from None
    except (OSError, ValueError) as exc:
        raise BaselineMismatch(f"baseline {path} is not readable JSON ({exc})") from None
    if data.get("schema") != BASELINE_SCHEMA:
        raise BaselineMismatch(f"{path} is not a kpca-claims baseline (schema {data.get('schema')!r})")
    return data


def _tolerance(tolerances: dict, claim: str, metric: str) -> dict:
    table = tolerances.get("metrics", {})
    rule = table.get(f"{claim}.{metric}") or table.get(metric) or {}
    return {"abs": float(rule.get("abs", tolerances.get("abs", 1e-6))),
            "rel": float(rule.get("rel", tolerances.get("rel", 1e-4))),
            "regression": rule.get("regression", "both")}


def _number(x):
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    return x


def compare(results: dict, baseline: dict, tolerances: dict) -> list[Regression]:
    """Regressions of ``results`` against ``baseline``; raises BaselineMismatch if incomparable."""
    now, then = identity(results), baseline["identity"]
    for key, ident in now["models"].items():
        if key not in then["models"]:
            raise BaselineMismatch(f"the baseline has no model {key!r} (it holds "
                                   f"{', '.join(sorted(then['models'])) or 'none'})")
        for field, value in ident.items():
            if then["models"][key].get(field) != value:
                raise BaselineMismatch(
                    f"the baseline was made for a different {field.replace('_', ' ')} of {key} "
                    f"({then['models'][key].get(field)} there, {value} now): regenerate it with "
                    "--update-baseline for this checkpoint and input set")
    if now["options"] != then["options"]:
        raise BaselineMismatch(f"the baseline was made with options {then['options']}, "
                               f"this run uses {now['options']}")
    out: list[Regression] = []
    for rec in results["records"]:
        key = record_key(rec)
        old = baseline["records"].get(key)
        if old is None:
            continue  # a head the baseline did not select: nothing to compare
        if old["verdict"] != rec["verdict"]:
            out.append(Regression(key, f"verdict changed from {old['verdict']} to {rec['verdict']}"))
        for metric, value in (rec.get("metrics") or {}).items():
            if metric not in old["metrics"]:
                continue
            new_v, old_v = _number(value), _number(old["metrics"][metric])
            if not isinstance(new_v, (int, float)) or not isinstance(old_v, (int, float)):
                if new_v != old_v:
                    out.append(Regression(key, f"{metric} changed from {old_v} to {new_v}"))
                continue
            if math.isnan(new_v) or math.isnan(old_v) or math.isinf(new_v) or math.isinf(old_v):
                if not (new_v == old_v or (math.isnan(new_v) and math.isnan(old_v))):
                    out.append(Regression(key, f"{metric} changed from {old_v} to {new_v}"))
                continue
            tol = _tolerance(tolerances, rec["claim"], metric)
            limit = tol["abs"] + tol["rel"] * abs(old_v)
            delta = new_v - old_v
            bad = {"both": abs(delta) > limit, "increase": delta > limit,
                   "decrease": -delta > limit}[tol["regression"]]
            if bad:
                out.append(Regression(
                    key, f"{metric} moved from {old_v:.6g} to {new_v:.6g} (change {delta:+.3g}, "
                         f"tolerance {limit:.3g}, regression when {tol['regression']})"))
    return out
