"""This module owns the policy gate, which needs no baseline: ``--require
'V>=inconclusive,J=supported'`` parsed (:func:`parse_require`) and the run's model-level verdicts
held to that floor (:func:`check_require`)."""

from __future__ import annotations

from claims import registry

from .baseline import BaselineMismatch, record_key
from .baseline_gate import VERDICT_RANK, Change


class RequireError(ValueError):
    """A --require expression that cannot be parsed."""


_REQUIRE_OPS = (">=", "=")


def parse_require(text: str) -> list[tuple[str, str, str]]:
    """``'V>=inconclusive,J=supported'`` →
    ``[("V", ">=", "inconclusive"), ("J", "=", "supported")]``.

    Each clause is CLAIM OP VERDICT: CLAIM a registered claim (V, J, E, ...); OP ``>=`` (at least, in the order
    refuted < inconclusive = undetermined < partial < supported) or ``=`` (exactly); VERDICT
    one of supported, partial, inconclusive, undetermined, refuted. Raises :class:`RequireError` otherwise.
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
