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

from checks.errors import defined_values

from .records import VERDICTS

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.toml")
SUPPORTED, REFUTED, INCONCLUSIVE, UNDETERMINED, PARTIAL = VERDICTS
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class Rule:
    """One threshold: ``metric direction value``, with where the value comes from."""

    metric: str
    value: float
    direction: str
    source: str

    def holds(self, measured: float | None) -> bool:
        if measured is None or not math.isfinite(measured):  # undefined never holds (method §6.2)
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


def load_thresholds(path: str | None = None) -> dict:
    """The parsed thresholds file (validated: every rule has value, direction and source), with
    the rule sections of registered claims that bring their own (``ClaimSpec.thresholds``: a
    claim from outside this repository) added.

    ``path`` defaults to the module attribute :data:`THRESHOLDS_FILE`, looked up at each call, so
    a test (or a caller) can point the whole suite at another copy of the file."""
    data = _parse_thresholds(str(path if path else THRESHOLDS_FILE))
    extra = _registered_sections(data)
    return {**data, **extra} if extra else data


def _registered_sections(data: dict) -> dict:
    """The rule sections registered claims carry (``ClaimSpec.thresholds``), validated as the
    file's are; a section the file also has must be equal to it."""
    from .registry import all_claims

    out: dict = {}
    for spec in all_claims():
        if spec.thresholds is None:
            continue
        if isinstance(spec.thresholds, (str, Path)):
            sections = _parse_thresholds(str(Path(spec.thresholds).resolve()))
        else:
            sections = _validated(dict(spec.thresholds), f"claim {spec.id!r} (ClaimSpec.thresholds)")
        for name, section in sections.items():
            if name in data and data[name] != section:
                raise ValueError(f"claim {spec.id!r} brings a rule section [{name}] that differs "
                                 f"from the one in {THRESHOLDS_FILE.name}; rename its section")
            out[name] = section
    return out


def allclose_tolerance(path: str | None = None) -> dict[str, float]:
    """``{"atol": …, "rtol": …}`` of the allclose rate, from ``[claim_v.allclose]`` (method §2.1)."""
    section = load_thresholds(path)["claim_v"]["allclose"]
    return {"atol": float(section["atol"]), "rtol": float(section["rtol"])}


@lru_cache(maxsize=None)
def _parse_thresholds(path: str) -> dict:
    p = Path(path)
    return _validated(tomllib.loads(p.read_text(encoding="utf-8")), str(p))


def _validated(data: dict, where: str) -> dict:
    """``data`` (rule sections), after checking every rule has value, direction and source."""
    for claim, section in data.items():
        ours = section.get("ours", {}) if isinstance(section, dict) else {}
        for kind, table in (("supported", section.get("supported", {})),
                            ("refuted", section.get("refuted", {})),
                            ("ours.supported", ours.get("supported", {})),
                            ("ours.refuted", ours.get("refuted", {}))):
            for metric, rule in table.items():
                missing = {"value", "direction", "source"} - set(rule)
                if missing:
                    raise ValueError(f"{where}: [{claim}.{kind}.{metric}] lacks {sorted(missing)}")
                if rule["direction"] not in _OPS:
                    raise ValueError(f"{where}: [{claim}.{kind}.{metric}] direction must be one of {sorted(_OPS)}")
    return data


def rules(claim: str, kind: str, path: str | None = None) -> list[Rule]:
    section = load_thresholds(path)[claim].get(kind, {})
    return [Rule(m, float(r["value"]), r["direction"], r["source"]) for m, r in section.items()]


def ours_rules(claim: str, kind: str, path: str | None = None) -> list[Rule]:
    """The ``ours`` rule set's own ``kind`` rules of ``claim`` (``[claim.ours.supported]`` /
    ``[claim.ours.refuted]``: invariant metrics, method §7.3); the shared ``[claim.kind]`` rules
    when the claim has no table of its own."""
    ours = load_thresholds(path)[claim].get("ours", {})
    if "supported" not in ours and "refuted" not in ours:
        return rules(claim, kind, path)
    return [Rule(m, float(r["value"]), r["direction"], r["source"])
            for m, r in ours.get(kind, {}).items()]


def shared_bar(path: str | None = None) -> float:
    """``[claim_v.partial] shared_bar``: the cos² of a principal angle at which a direction of
    span(V) and one of span(V̂) count as shared (method §2.6)."""
    return float(load_thresholds(path)["claim_v"]["partial"]["shared_bar"])


def chance_margins(claim: str, path: str | None = None) -> dict[str, float]:
    """``{metric: share}`` of the equivalence test "at chance" (``[claim.ours.chance_margin]``,
    method §7.2): the share of the room between the null and the metric's best value within
    which |mean(metric − null)| must be shown to lie (:func:`absolute_margin`)."""
    table = load_thresholds(path)[claim].get("ours", {}).get("chance_margin", {})
    return {m: float(r["value"]) for m, r in table.items()}


def absolute_margin(claim: str, metric: str, null_mean, path: str | None = None):
    """The margin of the equivalence test of ``metric`` for a unit whose null averages
    ``null_mean`` (a float or a Tensor of units), method §7.2: the table's share of the *room*
    |best − null|, with ``best`` the metric's exact-head value (1 for an overlap or an R², 0 for
    a residual; ``best`` in the table, default 1). Relative, so that the same head is "at chance"
    or not whatever the sequence length that sets its null.

    >>> round(absolute_margin("claim_v", "subspace_overlap", 0.5), 6)
    0.05
    """
    spec = load_thresholds(path)[claim]["ours"]["chance_margin"][metric]
    room = abs(float(spec.get("best", 1.0)) - null_mean)
    return float(spec["value"]) * room


def missing_reason(missing: list[str], why: dict[str, str]) -> str:
    """Why a verdict is undetermined (method §6.2): each distinct reason once, after the metrics
    without a value it applies to, in the order of ``missing``.

    >>> missing_reason(["a", "b", "c"], {"a": "no fit", "b": "no fit"})
    'a, b have no value: no fit; c has no value: undefined'
    """
    groups: dict[str, list[str]] = {}
    for m in missing:
        groups.setdefault(why.get(m, "undefined"), []).append(m)
    return "; ".join(f"{', '.join(ms)} {'has' if len(ms) == 1 else 'have'} no value: {reason}"
                     for reason, ms in groups.items())


def judge(claim: str, metrics: dict[str, float | None], path: str | None = None,
          undefined: dict[str, str] | None = None) -> Verdict:
    """Supported when every `supported` rule holds; refuted when every `refuted` rule holds (or
    any of them, where the claim's section sets ``refuted_mode = "any"``); inconclusive otherwise.

    Undefined values (method §6.2): a metric that is None or not finite never satisfies a rule; when
    no verdict is reached and a rule's metric is undefined, the verdict is *undetermined*, with the
    reason (from ``undefined``, metric → reason) in :attr:`Verdict.reason`."""
    why = dict(undefined or {})
    metrics = defined_values(dict(metrics), why)
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
    missing = sorted({r.metric for r in sup + ref if metrics[r.metric] is None})
    if verdict == INCONCLUSIVE and missing:
        return Verdict(claim, UNDETERMINED, metrics, sup, ref, reason=missing_reason(missing, why))
    return Verdict(claim, verdict, metrics, sup, ref)


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
    if both:  # the reason, if any, once: on the last line
        lines.append("  verdicts: " + ", ".join(f"{k} rules {w}" for k, w in both.items()))
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
        lines.append(f"  {name:<26} {format_number(value)}{null_txt}")
    if v.reason:
        lines.append(f"  {'undetermined' if v.verdict == UNDETERMINED else 'why'}: {v.reason}")
    return "\n".join(lines)


def format_number(x: float | None) -> str:
    """A metric for a message: 4 significant digits, or "undefined" (method §6.2)."""
    return "undefined" if x is None or not math.isfinite(x) else f"{x:.4g}"


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


def judge_ours(claim: str, metrics: dict[str, float | None], ci: dict,
               above_chance: dict | None = None, path: str | None = None,
               undefined: dict[str, str] | None = None,
               at_chance: dict | None = None) -> Verdict:
    """The ``ours`` rule set (method §7): every bar of ``claim`` applied to the CI bound least
    favourable to it (metrics without a CI, or named in ``[claim.ours].exact_metrics``, are
    judged on their value). For claim V, also *refuted* when none of
    ``[claim_v.ours].above_chance_metrics`` is above chance (``above_chance[metric]``) or the
    upper CI bound of each of ``upper_below_support_metrics`` is below its supported bar.
    Undefined values follow :func:`judge` (method §6.2)."""
    why = dict(undefined or {})
    metrics = defined_values(dict(metrics), why)
    section = load_thresholds(path)[claim]
    extra = section.get("ours", {})
    exact = set(extra.get("exact_metrics", []))
    sup, ref = ours_rules(claim, "supported", path), ours_rules(claim, "refuted", path)

    def value(rule: Rule) -> float:
        if rule.metric in ci and rule.metric not in exact:
            return _at_bound(rule, ci[rule.metric])
        return metrics[rule.metric]

    refuted_any = extra.get("refuted_mode", section.get("refuted_mode", "all")) == "any"
    combine = any if refuted_any else all
    reasons = []
    equivalent = [m for m in extra.get("at_chance_metrics", [])
                  if at_chance is not None and at_chance.get(m)]
    # "at chance" is a tested statement and is never said of a supported head: it is checked
    # before the supported bars (method §7.2)
    if sup and not equivalent and all(r.holds(value(r)) for r in sup):
        verdict = SUPPORTED
        reasons.append("every supported bar holds over the whole 95% CI")
    else:
        refuted = bool(ref) and combine(r.holds(value(r)) for r in ref)
        if refuted:
            reasons.append("the refuted bars hold over the whole 95% CI")
        if equivalent:
            refuted = True
            margins = chance_margins(claim, path)
            reasons.append("at chance: " + ", ".join(
                f"{m} within {margins.get(m, float('nan')):g} of the room above its null "
                "(TOST)" for m in equivalent))
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
    missing = sorted({r.metric for r in sup + ref if metrics[r.metric] is None})
    if verdict == INCONCLUSIVE and missing:
        return Verdict(claim, UNDETERMINED, metrics, sup, ref, reason=missing_reason(missing, why))
    return Verdict(claim, verdict, dict(metrics), sup, ref, reason="; ".join(reasons))


def judge_both(claim: str, metrics: dict[str, float | None], ci: dict | None,
               above_chance: dict | None = None, rules_name: str = "ours",
               path: str | None = None,
               undefined: dict[str, str] | None = None,
               at_chance: dict | None = None) -> tuple[Verdict, dict[str, str]]:
    """Both rule sets' verdicts, ``{"p2": ..., "ours": ...}``, and the Verdict chosen by
    ``rules_name`` (the ``--rules`` option). Without a CI, ``ours`` equals ``p2``."""
    if rules_name not in RULE_SETS:
        raise ValueError(f"unknown rule set {rules_name!r}; use one of {RULE_SETS}")
    p2 = judge(claim, metrics, path, undefined=undefined)
    no_interval = sorted(k for k, b in (ci or {}).items()
                         if b is None or any(x is None or x != x for x in b))
    if no_interval:  # too few samples: ours judges over intervals, and there are none (§7)
        ours = Verdict(claim, UNDETERMINED, dict(metrics), p2.supported_rules, p2.refuted_rules,
                       reason=f"no 95% interval of {', '.join(no_interval)}: a bootstrap "
                              "interval needs at least 2 samples (method §7)")
    else:
        ours = (judge_ours(claim, metrics, ci, above_chance, path, undefined=undefined,
                           at_chance=at_chance) if ci else p2)
    return (p2 if rules_name == "p2" else ours), {"p2": p2.verdict, "ours": ours.verdict}


def format_ci(value: float, ci) -> str:
    """``value [lo, hi]`` (the interval text of a failure message and the report)."""
    if ci is None:
        return format_number(value)
    if any(x is None or x != x for x in ci):  # undefined: too few samples (method §7)
        return f"{format_number(value)} [no 95% interval]"
    return f"{format_number(value)} [{float(ci[0]):.4g}, {float(ci[1]):.4g}]"
