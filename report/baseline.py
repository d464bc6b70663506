"""The CI gate: compare a run's results with a stored baseline (method §10).

A baseline is written by ``--update-baseline`` from one run (results.json-shaped records plus
what made them comparable). Two modes (``--gate``):

``candidate`` (default)
    A *new* checkpoint of the same architecture, input set, options, thresholds and claim set is
    compared with the *accepted* one the baseline was made from. Models are matched by
    architecture, not by file name (:func:`match_models`); records by (claim, level, layer, head).
    The run regresses when a verdict gets worse (supported → inconclusive/undetermined/refuted,
    inconclusive/undetermined → refuted) or a judged metric moves in its bad direction by more
    than its tolerance ``abs + rel·|baseline|`` from ``[baseline_candidate]`` in
    ``claims/thresholds.toml``; when both records carry a CI of that metric (``record["ci"]``),
    only when each run's value also lies outside the other run's CI. Moves the other way are
    listed as improvements. The checkpoint hashes are recorded and printed, never required to
    match.
``same-checkpoint``
    Reproducibility of a frozen checkpoint after a change of code or environment: the checkpoint
    hash must match (checked at start-up where it is known before the run, fixtures/engine/weight_identity.py;
    here after the run otherwise), any verdict change is a regression, and metrics may move by
    round-off only (``[baseline]``: ``abs + rel·|baseline|``, one-sided where a direction is named).

Comparing runs that differ in anything but the checkpoint is an error (:class:`BaselineMismatch`,
exit 4), not a regression: the numbers would not be comparable.

A policy gate needs no baseline: :func:`parse_require` / :func:`check_require` hold the
model-level verdicts to a floor (``--require 'V>=inconclusive,J=supported'``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from claims import registry
from claims.records import Record

from .atomic import atomic_write_text

BASELINE_SCHEMA = "kpca-claims/baseline/2"
GATE_MODES = ("candidate", "same-checkpoint")
# A verdict's rank: a move to a lower rank is a regression, to a higher one an improvement.
# "undetermined" (a degenerate spectrum) is neither supported nor refuted: ranked as inconclusive.
VERDICT_RANK = {"refuted": 0, "inconclusive": 1, "undetermined": 1, "supported": 2}
_ARCH_FIELDS = ("arch", "family", "n_layers", "n_heads", "head_dim")
_INPUT_FIELDS = ("input_set_hash", "input_tensor_hash", "n_samples")
_OPTION_FIELDS = ("standardize", "axis_convention", "dtype", "n_samples_requested", "seed",
                  "max_tokens", "rules")


class BaselineMismatch(ValueError):
    """The baseline was made for other checkpoints, inputs, options, thresholds or claims."""


class RequireError(ValueError):
    """A --require expression that cannot be parsed."""


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


# Kept for callers of the first gate: a regression is a Change of kind "regression".
Regression = Change


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
            "options": {k: options.get(k) for k in _OPTION_FIELDS},
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


# ---------------------------------------------------------------------------- model matching
def parse_baseline_model(text: str | None) -> dict[str | None, str]:
    """``--baseline-model KEY`` (every candidate model of KEY's architecture) or
    ``CAND=KEY,CAND2=KEY2``."""
    if not text:
        return {}
    out: dict[str | None, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        cand, sep, base = part.partition("=")
        if sep and (not cand.strip() or not base.strip()):
            raise BaselineMismatch(f"--baseline-model {text!r}: write KEY or CANDIDATE=KEY pairs")
        out[cand.strip() if sep else None] = (base if sep else cand).strip()
    return out


def match_models(candidates: dict, baseline_models: dict, chosen: dict | None = None) -> dict:
    """Which baseline model each candidate model is compared with.

    ``candidates`` and ``baseline_models`` map model keys to identities (at least ``arch``).
    The rule: ``chosen`` (from --baseline-model) first; otherwise the baseline model of the same
    key if it has the candidate's architecture; otherwise the only baseline model of that
    architecture. None, or several without a choice, is a :class:`BaselineMismatch`.
    """
    chosen = chosen or {}
    held = ", ".join(f"{k} ({m.get('arch')})" for k, m in sorted(baseline_models.items())) or "none"
    for want in sorted(set(chosen.values()) - set(baseline_models)):
        raise BaselineMismatch(f"--baseline-model {want}: the baseline has no such model "
                               f"(it holds {held})")
    for cand in sorted(k for k in chosen if k is not None and k not in candidates):
        raise BaselineMismatch(f"--baseline-model {cand}={chosen[cand]}: this run has no model "
                               f"{cand} (it runs {', '.join(sorted(candidates))})")
    out = {}
    for key, ident in candidates.items():
        pick = chosen.get(key)
        if pick is None and chosen.get(None) is not None and \
                baseline_models[chosen[None]].get("arch") == ident.get("arch"):
            pick = chosen[None]  # a bare KEY: for every candidate of its architecture
        if pick is None and key in baseline_models and \
                baseline_models[key].get("arch") == ident.get("arch"):
            pick = key
        if pick is None:
            same = sorted(k for k, m in baseline_models.items()
                          if m.get("arch") == ident.get("arch"))
            if not same:
                raise BaselineMismatch(
                    f"the baseline holds no model of architecture {ident.get('arch')} for {key} "
                    f"(it holds {held}): a candidate is compared with an accepted checkpoint of "
                    "its own architecture")
            if len(same) > 1:
                raise BaselineMismatch(
                    f"the baseline holds several models of architecture {ident.get('arch')} "
                    f"({', '.join(same)}): say which one {key} is compared with by "
                    "--baseline-model KEY")
            pick = same[0]
        for f in _ARCH_FIELDS:
            if baseline_models[pick].get(f) != ident.get(f):
                raise BaselineMismatch(
                    f"the architecture differs: {f} of baseline model {pick} is "
                    f"{baseline_models[pick].get(f)}, of {key} {ident.get(f)}")
        out[key] = pick
    return out


def check_comparable_before_run(specs: dict, options: dict, thresholds: dict, baseline: dict,
                                chosen: dict | None = None) -> dict:
    """The checks that need no result: models, architectures, options and thresholds.

    ``specs`` maps candidate keys to ``{"arch", "family", "n_layers", "n_heads", "head_dim"}``.
    Run at configure time, so that a wrong baseline stops the run before any model is loaded.
    """
    then = baseline["identity"]
    pairs = match_models(specs, then["models"], chosen)
    known = {k for k in _OPTION_FIELDS if options.get(k) is not None or k != "rules"}
    _check_options({k: options.get(k) for k in known}, {k: then["options"].get(k) for k in known})
    _check_thresholds(judging_thresholds(thresholds), then["thresholds"])
    return pairs


def check_same_checkpoint(cand: str, cand_hash, base: str, base_hash, origin: str = "") -> None:
    """``--gate same-checkpoint``: the candidate's weight hash is the baseline model's, else a
    :class:`BaselineMismatch` naming both. Made at start-up where the hash is known before the
    run (fixtures/engine/weight_identity.py), and by :func:`compare` after it (the backstop)."""
    if cand_hash != base_hash:
        where = f" ({origin})" if origin else ""
        raise BaselineMismatch(
            f"--gate same-checkpoint: the checkpoint hash of {cand}{where} is {cand_hash}, "
            f"the baseline's ({base}) {base_hash}: use the default --gate candidate to gate a "
            "new checkpoint, or regenerate the baseline with --update-baseline")


def _check_options(now: dict, then: dict) -> None:
    for k in (k for k in _OPTION_FIELDS if k in now or k in then):
        if now.get(k) != then.get(k):
            raise BaselineMismatch(f"the option {k} differs: {then.get(k)!r} in the baseline, "
                                   f"{now.get(k)!r} in this run")


def _first_difference(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    return None if a == b else (path, a, b)


def _check_thresholds(now: dict, then: dict) -> None:
    d = _first_difference(then, now)
    if d:
        raise BaselineMismatch(f"the thresholds differ: {d[0]} is {d[1]!r} in the baseline, "
                               f"{d[2]!r} in this run (claims/thresholds.toml)")


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
    _check_options(now["options"], then["options"])
    _check_thresholds(now["thresholds"], then["thresholds"])
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


# ------------------------------------------------------------------------------- policy gate
_REQUIRE_OPS = (">=", "=")


def parse_require(text: str) -> list[tuple[str, str, str]]:
    """``'V>=inconclusive,J=supported'`` →
    ``[("V", ">=", "inconclusive"), ("J", "=", "supported")]``.

    Each clause is CLAIM OP VERDICT: CLAIM a registered claim (V, J, E, ...); OP ``>=`` (at least, in the order
    refuted < inconclusive = undetermined < supported) or ``=`` (exactly); VERDICT one of
    supported, inconclusive, undetermined, refuted. Raises :class:`RequireError` otherwise.
    """
    out = []
    for clause in (c.strip() for c in (text or "").split(",")):
        if not clause:
            continue
        for op in _REQUIRE_OPS:
            if op in clause:
                claim, verdict = (s.strip() for s in clause.split(op, 1))
                break
        else:
            raise RequireError(f"--require {text!r}: clause {clause!r} has no >= or =; write "
                               "e.g. 'V>=inconclusive,J=supported'")
        known = [spec.id for spec in registry.all_claims()]
        if claim.upper() not in known:
            raise RequireError(f"--require {text!r}: {claim!r} is not a claim; use "
                               f"{', '.join(known[:-1])} or {known[-1]}" if len(known) > 1 else
                               f"--require {text!r}: {claim!r} is not a registered claim")
        if verdict.lower() not in VERDICT_RANK:
            raise RequireError(f"--require {text!r}: {verdict!r} is not a verdict; use "
                               f"{', '.join(sorted(VERDICT_RANK))}")
        out.append((claim.upper(), op, verdict.lower()))
    if not out:
        raise RequireError(f"--require {text!r} names no claim; write e.g. 'V>=inconclusive'")
    return out


def check_require(results: dict, rules: list[tuple[str, str, str]]) -> list[Change]:
    """Model-level verdicts below their floor; BaselineMismatch when a required claim has no
    model-level verdict in the run (it was deselected)."""
    out = []
    for claim, op, want in rules:
        recs = [r for r in results["records"] if r["claim"] == claim and r.get("level") == "model"]
        if not recs:
            raise BaselineMismatch(f"--require {claim}{op}{want}: this run has no model-level "
                                   f"verdict of claim {claim}; select its tests")
        for rec in recs:
            got = rec["verdict"]
            ok = (got == want) if op == "=" else \
                VERDICT_RANK.get(got, -1) >= VERDICT_RANK[want]
            if not ok:
                out.append(Change(record_key(rec), "verdict", f"required {op}{want}", got,
                                  "regression"))
    return out


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
