"""Verdicts: thresholds from ``claims/thresholds.toml`` applied to measured metrics.

The claim tests are thin: they fetch metrics (computed by ``checks`` through ``fixtures``), call a
verdict function from here, and assert on the result. Every threshold comes from the TOML file.
"""

from __future__ import annotations

import math
import operator
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.toml")
SUPPORTED, REFUTED, INCONCLUSIVE, UNDETERMINED = "supported", "refuted", "inconclusive", "undetermined"
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class Rule:
    """One threshold: ``metric direction value``, with where the value comes from."""

    metric: str
    value: float
    direction: str
    source: str

    def holds(self, measured: float) -> bool:
        if not math.isfinite(measured):
            return False
        return _OPS[self.direction](measured, self.value)

    def describe(self) -> str:
        return f"{self.direction} {self.value:g}"


@dataclass
class Verdict:
    """A verdict with its evidence: the rules it was judged by and the measured values."""

    claim: str
    verdict: str
    metrics: dict[str, float]
    supported_rules: list[Rule] = field(default_factory=list)
    refuted_rules: list[Rule] = field(default_factory=list)
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == SUPPORTED


@lru_cache(maxsize=None)
def load_thresholds(path: str | None = None) -> dict:
    """The parsed thresholds file (validated: every rule has value, direction and source)."""
    p = Path(path) if path else THRESHOLDS_FILE
    data = tomllib.loads(p.read_text(encoding="utf-8"))
    for claim, section in data.items():
        for kind in ("supported", "refuted"):
            for metric, rule in section.get(kind, {}).items():
                missing = {"value", "direction", "source"} - set(rule)
                if missing:
                    raise ValueError(f"{p}: [{claim}.{kind}.{metric}] lacks {sorted(missing)}")
                if rule["direction"] not in _OPS:
                    raise ValueError(f"{p}: [{claim}.{kind}.{metric}] direction must be one of {sorted(_OPS)}")
    return data


def rules(claim: str, kind: str, path: str | None = None) -> list[Rule]:
    section = load_thresholds(path)[claim].get(kind, {})
    return [Rule(m, float(r["value"]), r["direction"], r["source"]) for m, r in section.items()]


def judge(claim: str, metrics: dict[str, float], path: str | None = None) -> Verdict:
    """Supported when every `supported` rule holds; refuted when every `refuted` rule holds (or
    any of them, where the claim's section sets ``refuted_mode = "any"``); inconclusive otherwise."""
    sup, ref = rules(claim, "supported", path), rules(claim, "refuted", path)
    for rule in sup + ref:
        if rule.metric not in metrics:
            raise KeyError(f"{claim}: metric {rule.metric!r} needed by the thresholds is missing")
    refuted_any = load_thresholds(path)[claim].get("refuted_mode", "all") == "any"
    combine = any if refuted_any else all
    if sup and all(r.holds(metrics[r.metric]) for r in sup):
        verdict = SUPPORTED
    elif ref and combine(r.holds(metrics[r.metric]) for r in ref):
        verdict = REFUTED
    else:
        verdict = INCONCLUSIVE
    return Verdict(claim, verdict, dict(metrics), sup, ref)


def format_evidence(v: Verdict, nulls: dict[str, float] | None = None,
                    extra: dict[str, float] | None = None, ci: dict | None = None,
                    vs_null: dict | None = None, both: dict[str, str] | None = None) -> str:
    """A multi-line, human-readable account of a verdict: each metric ``value [lo, hi]`` (its
    95% CI, when given), its thresholds, its null, and its test against chance; with ``both``,
    a first line naming the verdict under each rule set (method §7)."""
    nulls = nulls or {}
    ci = ci or {}
    vs_null = vs_null or {}
    lines = []
    if both:
        lines.append("  verdicts: " + ", ".join(f"{k} rules {w}" for k, w in both.items())
                     + (f" ({v.reason})" if v.reason else ""))
    by_metric: dict[str, list[str]] = {}
    for kind, rs in (("supported", v.supported_rules), ("refuted", v.refuted_rules)):
        for r in rs:
            mark = "yes" if r.holds(v.metrics[r.metric]) else "no"
            by_metric.setdefault(r.metric, []).append(f"{kind} if {r.describe()} [{r.source}]: {mark}")
    for metric, texts in by_metric.items():
        null = nulls.get(metric)
        null_txt = f"  (chance level {null:.4g})" if null is not None else ""
        test = vs_null.get(metric)
        if test:
            null_txt += (f"  above chance: {'yes' if test['above_chance'] else 'no'} "
                         f"(adjusted p {test['p_adjusted']:.3g})")
        lines.append(f"  {metric:<26} {format_ci(v.metrics[metric], ci.get(metric))}{null_txt}")
        lines.extend(f"      {t}" for t in texts)
    for name, value in (extra or {}).items():
        null = nulls.get(name)
        null_txt = f"  (chance level {null:.4g})" if null is not None else ""
        lines.append(f"  {name:<26} {value:.4g}{null_txt}")
    return "\n".join(lines)


def assert_supported(record: dict, message: str) -> None:
    """The outcome of a claim test: pass when supported, skip when undetermined (with the
    reason), fail with ``message`` (verdict, metrics, thresholds, sources, nulls) otherwise."""
    import pytest

    if record["verdict"] == UNDETERMINED:
        pytest.skip(message)
    assert record["verdict"] == SUPPORTED, message


# ------------------------------------------------------------------ rule sets (method §7)
RULE_SETS = ("p2", "ours")


def rule_set_settings(path: str | None = None) -> dict:
    """The ``[rule_sets.ours]`` settings: confidence, resamples, alpha, correction."""
    return load_thresholds(path)["rule_sets"]["ours"]


def _at_bound(rule: Rule, ci: tuple[float, float] | list[float]) -> float:
    """The end of the interval least favourable to ``rule``: the lower bound for a ">=" / ">"
    bar, the upper bound for a "<=" / "<" bar (the bar must hold over the whole interval)."""
    lo, hi = float(ci[0]), float(ci[1])
    return lo if rule.direction in (">=", ">") else hi


def judge_ours(claim: str, metrics: dict[str, float], ci: dict, above_chance: dict | None = None,
               path: str | None = None) -> Verdict:
    """The ``ours`` rule set (method §7): every bar of ``claim`` applied to the CI bound least
    favourable to it (metrics without a CI, or named in ``[claim.ours].exact_metrics``, are
    judged on their value). For claim V, also *refuted* when none of
    ``[claim_v.ours].above_chance_metrics`` is above chance (``above_chance[metric]``) or the
    upper CI bound of each of ``upper_below_support_metrics`` is below its supported bar."""
    section = load_thresholds(path)[claim]
    extra = section.get("ours", {})
    exact = set(extra.get("exact_metrics", []))
    sup, ref = rules(claim, "supported", path), rules(claim, "refuted", path)

    def value(rule: Rule) -> float:
        if rule.metric in ci and rule.metric not in exact:
            return _at_bound(rule, ci[rule.metric])
        return metrics[rule.metric]

    refuted_any = section.get("refuted_mode", "all") == "any"
    combine = any if refuted_any else all
    reasons = []
    if sup and all(r.holds(value(r)) for r in sup):
        verdict = SUPPORTED
        reasons.append("every supported bar holds over the whole 95% CI")
    else:
        refuted = bool(ref) and combine(r.holds(value(r)) for r in ref)
        if refuted:
            reasons.append("the refuted bars hold over the whole 95% CI")
        chance = extra.get("above_chance_metrics", [])
        if chance and above_chance is not None and all(m in above_chance for m in chance):
            if not any(above_chance[m] for m in chance):
                refuted = True
                reasons.append(f"none of {', '.join(chance)} is above chance (adjusted p >= "
                               f"{rule_set_settings(path)['alpha']:g})")
        below = extra.get("upper_below_support_metrics", [])
        bars = {r.metric: r for r in sup}
        if below and all(m in ci and m in bars for m in below):
            if all(float(ci[m][1]) < bars[m].value for m in below):
                refuted = True
                reasons.append(f"the upper CI bound of each of {', '.join(below)} is below "
                               "its supported bar")
        verdict = REFUTED if refuted else INCONCLUSIVE
    return Verdict(claim, verdict, dict(metrics), sup, ref, reason="; ".join(reasons))


def judge_both(claim: str, metrics: dict[str, float], ci: dict | None,
               above_chance: dict | None = None, rules_name: str = "ours",
               path: str | None = None) -> tuple[Verdict, dict[str, str]]:
    """Both rule sets' verdicts, ``{"p2": ..., "ours": ...}``, and the Verdict chosen by
    ``rules_name`` (the ``--rules`` option). Without a CI, ``ours`` equals ``p2``."""
    if rules_name not in RULE_SETS:
        raise ValueError(f"unknown rule set {rules_name!r}; use one of {RULE_SETS}")
    p2 = judge(claim, metrics, path)
    ours = judge_ours(claim, metrics, ci, above_chance, path) if ci else p2
    return (p2 if rules_name == "p2" else ours), {"p2": p2.verdict, "ours": ours.verdict}


def format_ci(value: float, ci) -> str:
    """``value [lo, hi]`` (the interval text of a failure message and the report)."""
    if ci is None:
        return f"{value:.4g}"
    return f"{value:.4g} [{float(ci[0]):.4g}, {float(ci[1]):.4g}]"
