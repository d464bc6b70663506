"""Claim J in the specification curve (``--multiverse``, method §14): its records of one compute
combination (``ClaimSpec.curve``) and its decide-stage axis ``j_statistic``
(``ClaimSpec.curve_decide``): the judged magnitude statistic, the ratio of pooled means by
default (method §3.2), or a per-token statistic of the records' ``tokens`` (method §3.7) put in
its place in the rules that judge ``log10_ratio``.
"""

from __future__ import annotations

from . import claim_j, verdicts
from .multiverse import GridError, plain

#: The default of the ``j_statistic`` axis (claims/specifications.toml) and the per-token
#: statistics it may name instead, as the record's ``tokens`` field names them.
J_DEFAULT_STATISTIC = "pooled-means"
J_STATISTICS = {"per-token-median": "median_log10_ratio",
                "p2-trimmed-median": "p2_appendix_log10_ratio"}


def j_outcomes(model: str, per_layer: dict, heads: list[int], rules: str) -> dict:
    """Claim J's layer and model records (claims/test_projection_loss.py)."""
    units = {f"L{layer:02d}": claim_j.layer_record(model, layer, per_layer[layer], heads, rules=rules)
             for layer in sorted(per_layer)}
    return plain({"model": claim_j.model_record(model, per_layer, heads, rules=rules),
                  "units": units})


def token_statistic(record: dict, statistic: str) -> float | None:
    """The per-token statistic ``statistic`` of a claim-J record (None where it has none)."""
    if statistic not in J_STATISTICS:
        raise GridError(f"unknown claim-J statistic {statistic!r}; the grid may use "
                        f"{J_DEFAULT_STATISTIC!r} or {', '.join(map(repr, J_STATISTICS))}")
    return (record.get("tokens") or {}).get(J_STATISTICS[statistic])


def rejudge(record: dict, decide: dict, rule_set: str | None) -> tuple[str, dict] | None:
    """Claim J's decision under the decide-stage values ``decide`` (``ClaimSpec.curve_decide``):
    None for the default statistic (the record's own verdicts); else the record judged with its
    ``log10_ratio`` replaced by the per-token statistic (and that metric's interval dropped: it
    was the pooled ratio's), undetermined when the record has no such statistic (method §6.2),
    with the headline metric it was judged on: ``(verdict, {"log10_ratio": value})``."""
    statistic = decide.get("j_statistic", J_DEFAULT_STATISTIC)
    if statistic == J_DEFAULT_STATISTIC:
        return None
    rule_set = rule_set or record["rules"]
    value = token_statistic(record, statistic)
    if value is None:
        return verdicts.UNDETERMINED, {"log10_ratio": None}
    metrics = {**record["metrics"], "log10_ratio": value}
    ci = {k: b for k, b in (record.get("ci") or {}).items() if k != "log10_ratio"}
    undefined = {k: r for k, r in (record.get("undefined") or {}).items() if k != "log10_ratio"}
    extra = {}
    fit = record.get("output_fit") or {}
    if "vs_null" in fit and "at_chance" in fit["vs_null"]:
        extra["at_chance"] = {"output_r2": bool(fit["vs_null"]["at_chance"])}
    _, both = verdicts.judge_both("claim_j", metrics, ci or None, rules_name=rule_set,
                                  undefined=undefined, **extra)
    return both[rule_set], {"log10_ratio": value}
