"""This module owns the baseline gate (method §10): the comparison of a run's results with a stored
baseline, its result (:class:`GateResult`) and its summary lines.

A baseline is written by ``--update-baseline`` from one run (results.json-shaped records plus
what made them comparable). Two modes (``--gate``):

``candidate`` (default)
    A *new* checkpoint of the same architecture, input set, options, thresholds and claim set is
    compared with the *accepted* one the baseline was made from. Models are matched by
    architecture, not by file name (:func:`~report.baseline_matching.match_models`); records by
    (claim, level, layer, head).
    The run regresses when a verdict gets worse (supported → inconclusive/undetermined/refuted,
    inconclusive/undetermined → refuted) or a judged metric moves in its bad direction by more
    than its tolerance ``abs + rel·|baseline|`` from ``[baseline_candidate]`` in
    ``claims/thresholds.toml``; when both records carry a CI of that metric (``record["ci"]``),
    only when each run's value also lies outside the other run's CI. Moves the other way are
    listed as improvements. The checkpoint hashes are recorded and printed, never required to
    match.
``same-checkpoint``
    Reproducibility of a frozen checkpoint after a change of code or environment: the checkpoint
    hash must match (checked at start-up where it is known before the run, fixtures/identity.py;
    here after the run otherwise), any verdict change is a regression, and metrics may move by
    round-off only (``[baseline]``: ``abs + rel·|baseline|``, one-sided where a direction is named).

Comparing runs that differ in anything but the checkpoint is an error (:class:`BaselineMismatch`,
exit 4), not a regression: the numbers would not be comparable.

The baseline file is :mod:`report.baseline`; the policy gate ``--require``, which needs no
baseline, is :mod:`report.require_gate`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .baseline import BaselineMismatch, identity, position, record_key
from .baseline_matching import check_options, check_same_checkpoint, check_thresholds, match_models

GATE_MODES = ("candidate", "same-checkpoint")
# A verdict's rank: a move to a lower rank is a regression, to a higher one an improvement.
# "undetermined" (a degenerate spectrum) is neither supported nor refuted: ranked as inconclusive.
# "partial" (claim V, method §2.6) is above inconclusive and below supported.
VERDICT_RANK = {"refuted": 0, "inconclusive": 1, "undetermined": 1, "partial": 1.5, "supported": 2}
_INPUT_FIELDS = ("input_set_hash", "input_tensor_hash", "n_samples")


@dataclass(frozen=True)
class Change:
    """One difference between baseline and candidate that the gate reports."""

    record: str            # "claim V checkpoint-b head L00 H1"
    what: str              # "verdict" or a metric name
    old: object
    new: object
    kind: str              # "regression" or "improvement"
    tolerance: float | None = None
    note: str = ""

    def __str__(self) -> str:
        if self.what == "verdict":
            return f"{self.record}: verdict {self.old} -> {self.new}"
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (self.old, self.new)):
            return f"{self.record}: {self.what} {self.old} -> {self.new}{self.note}"
        delta = self.new - self.old
        tol = "" if self.tolerance is None else f", tolerance {self.tolerance:.3g}"
        return (f"{self.record}: {self.what} {self.old:.6g} -> {self.new:.6g} "
                f"(change {delta:+.3g}{tol}{self.note})")


@dataclass
class GateResult:
    """The gate's outcome: what was compared with what, and what changed."""

    mode: str
    baseline: str = ""
    pairs: list[dict] = field(default_factory=list)  # candidate/baseline model keys and hashes
    regressions: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)
    compared: int = 0       # records compared
    unmatched: int = 0      # candidate records without a baseline record at their position

    def to_json(self) -> dict:
        out = asdict(self)
        for kind in ("regressions", "improvements"):
            out[kind] = [{**asdict(c), "text": str(c)} for c in getattr(self, kind)]
        return out


# ---------------------------------------------------------------------------------- compare
def _tolerance(tolerances: dict, claim: str, metric: str, default_direction: str | None):
    table = tolerances.get("metrics", {})
    rule = table.get(f"{claim}.{metric}") or table.get(metric)
    if rule is None and default_direction is None:
        return None
    rule = rule or {}
    return {"abs": float(rule.get("abs", tolerances.get("abs", 1e-6))),
            "rel": float(rule.get("rel", tolerances.get("rel", 1e-4))),
            "regression": rule.get("regression", default_direction)}


def _number(x):
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    return x


def _outside_cis(old_v, new_v, old_ci, new_ci) -> bool:
    """True unless both runs carry a CI and either value lies inside the other run's CI."""
    if not (isinstance(old_ci, (list, tuple)) and isinstance(new_ci, (list, tuple))
            and len(old_ci) == 2 and len(new_ci) == 2):
        return True
    try:
        olo, ohi = sorted(float(_number(x)) for x in old_ci)
        nlo, nhi = sorted(float(_number(x)) for x in new_ci)
    except (TypeError, ValueError):
        return True
    return not (olo <= new_v <= ohi) and not (nlo <= old_v <= nhi)


def _compare_pair(new: dict, old: dict, key: str, mode: str, tolerances: dict,
                  result: GateResult) -> None:
    v_old, v_new = old.get("verdict"), new.get("verdict")
    if v_old != v_new:
        r_old, r_new = VERDICT_RANK.get(v_old), VERDICT_RANK.get(v_new)
        if mode == "same-checkpoint" or r_old is None or r_new is None or r_new < r_old:
            result.regressions.append(Change(key, "verdict", v_old, v_new, "regression"))
        elif r_new > r_old:
            result.improvements.append(Change(key, "verdict", v_old, v_new, "improvement"))
    strict = mode == "same-checkpoint"
    old_m, new_m = old.get("metrics") or {}, new.get("metrics") or {}
    for metric, value in new_m.items():
        if metric not in old_m:
            continue
        tol = _tolerance(tolerances, new["claim"], metric, "both" if strict else None)
        if tol is None:
            continue  # candidate mode judges the metrics with a direction only
        new_v, old_v = _number(value), _number(old_m[metric])
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (new_v, old_v)):
            same = new_v == old_v or (new_v != new_v and old_v != old_v)
            if not same:
                result.regressions.append(Change(key, metric, old_v, new_v, "regression",
                                                 note=", not a finite number on one side"))
            continue
        limit = tol["abs"] + tol["rel"] * abs(old_v)
        delta = new_v - old_v
        worse = {"both": abs(delta), "increase": delta, "decrease": -delta}[tol["regression"]]
        better = {"both": 0.0, "increase": -delta, "decrease": delta}[tol["regression"]]
        ci_old, ci_new = (old.get("ci") or {}).get(metric), (new.get("ci") or {}).get(metric)
        note = f", regression when {tol['regression']}"
        if worse > limit:
            if strict or _outside_cis(old_v, new_v, ci_old, ci_new):
                result.regressions.append(Change(key, metric, old_v, new_v, "regression",
                                                 limit, note))
        elif better > limit and not strict and _outside_cis(old_v, new_v, ci_old, ci_new):
            result.improvements.append(Change(key, metric, old_v, new_v, "improvement", limit))


def compare(results: dict, baseline: dict, tolerances: dict, *, mode: str = "same-checkpoint",
            chosen: dict | None = None, path: str = "") -> GateResult:
    """The gate's result for ``results`` against ``baseline``; raises BaselineMismatch if the two
    runs are not comparable. ``tolerances`` is ``[baseline]`` (same-checkpoint) or
    ``[baseline_candidate]`` (candidate) of the thresholds file."""
    if mode not in GATE_MODES:
        raise ValueError(f"mode {mode!r} is not one of {GATE_MODES}")
    now, then = identity(results), baseline["identity"]
    pairs = match_models(now["models"], then["models"], chosen)
    check_options(now["options"], then["options"])
    check_thresholds(now["thresholds"], then["thresholds"])
    result = GateResult(mode=mode, baseline=str(path))
    for cand, base in sorted(pairs.items()):
        c, b = now["models"][cand], then["models"][base]
        for f in _INPUT_FIELDS:
            if c.get(f) != b.get(f):
                raise BaselineMismatch(
                    f"the input set differs: {f.replace('_', ' ')} of {cand} is {c.get(f)}, of "
                    f"baseline model {base} {b.get(f)}: gate on the inputs the baseline used")
        if mode == "same-checkpoint":
            check_same_checkpoint(cand, c["checkpoint_hash"], base, b["checkpoint_hash"])
        pos_now = {tuple(p) for p in now["positions"].get(cand, [])}
        pos_then = {tuple(p) for p in then["positions"].get(base, [])}
        claims_now, claims_then = {p[0] for p in pos_now}, {p[0] for p in pos_then}
        if claims_now != claims_then:
            raise BaselineMismatch(
                f"the claim set differs: the baseline checked {', '.join(sorted(claims_then))} "
                f"on {base}, this run {', '.join(sorted(claims_now))} on {cand}: select the same "
                "claims (-k) as the baseline run")
        if pos_now != pos_then and mode == "candidate":
            raise BaselineMismatch(
                f"the selection differs: the baseline checked {len(pos_then)} records "
                f"(claim, level, layer, head) of {base}, this run {len(pos_now)} of {cand}, not "
                "the same ones: use the --layers/--heads of the baseline run")
        result.pairs.append({"candidate": cand, "baseline": base,
                             "candidate_hash": c["checkpoint_hash"],
                             "baseline_hash": b["checkpoint_hash"]})
    by_pos = {(r["model"], position(r)): r for r in baseline["records"]}
    for rec in results["records"]:
        base_model = pairs.get(rec["model"], rec["model"])
        old = by_pos.get((base_model, position(rec)))
        if old is None:
            result.unmatched += 1
            continue
        result.compared += 1
        _compare_pair(rec, old, record_key(rec), mode, tolerances, result)
    return result


# ------------------------------------------------------------------------------------ output
def summary_lines(gate: dict, limit: int = 20) -> list[str]:
    """A short table for the end of the terminal output (``gate`` is GateResult.to_json(),
    possibly with a "require" list)."""
    lines = []
    for p in gate.get("pairs", []):
        same = "same checkpoint" if p["candidate_hash"] == p["baseline_hash"] else "new checkpoint"
        lines.append(f"gate: {p['candidate']} ({_short(p['candidate_hash'])}) vs baseline "
                     f"{p['baseline']} ({_short(p['baseline_hash'])}): {same}")
    rows = [("REGRESSION", c) for c in gate.get("regressions", [])] + \
           [("REGRESSION", c) for c in gate.get("require", [])] + \
           [("improvement", c) for c in gate.get("improvements", [])]
    for label, c in rows[:limit]:
        lines.append(f"{label} {c['text']}")
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more in results.json (\"gate\") and report.html")
    return lines


def _short(h) -> str:
    h = str(h or "?")
    return h.split(":")[-1][:12]
