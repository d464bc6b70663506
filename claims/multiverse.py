"""The specification curve (method §14): every claim judged under every specification of a
declared grid (claims/specifications.toml), the share of specifications that support, refute or
leave it inconclusive, and which axes move the verdict.

A *specification* is one value per axis that applies to the claim (and to the model's modality).
Axes of stage ``compute`` change the per-layer metrics (the session recomputes them from the cached
capture, fixtures/engine/multiverse_metrics.py); axes of stage ``decide`` judge the same metrics another way. The
records of one compute combination are built by the claim modules' own functions
(:func:`outcomes`), exactly as the claim tests build them, so the default specification's
records are the main run's records.

Everything here is pure: metrics in, verdicts, shares and axis effects out.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from . import verdicts

GRID_FILE = Path(__file__).with_name("specifications.toml")
STAGES = ("compute", "decide")
#: The verdicts a share is reported for, in display order.
VERDICT_ORDER = (verdicts.SUPPORTED, verdicts.INCONCLUSIVE, verdicts.REFUTED, verdicts.UNDETERMINED)
#: The curve's entries per model: claim V (model verdict, head units), claim J (model verdict,
#: layer units), claim E's eigenvalue statistics (model verdict) and its γ constancy (head units).
ENTRIES = {"V": ("V", "head"), "J": ("J", "layer"), "E": ("E", None), "E-gamma": ("E", "head")}


class GridError(ValueError):
    """A specification grid that cannot be used: the message names the axis and the fix."""


@dataclass(frozen=True)
class Axis:
    name: str
    label: str
    values: tuple[str, ...]
    claims: tuple[str, ...]
    stage: str
    option: str
    why: str
    modality: str | None = None
    causal: bool = False  # the axis exists for causal decoders only

    def applies(self, claim: str, modality: str | None, causal: bool = False) -> bool:
        return (claim in self.claims and (self.modality is None or self.modality == modality)
                and (causal or not self.causal))


def load_grid(path: str | Path | None = None) -> dict[str, Axis]:
    """The axes of the grid file (default :data:`GRID_FILE`), in file order, validated."""
    return dict(_load_grid(str(path or GRID_FILE)))


@lru_cache(maxsize=8)
def _load_grid(path: str) -> tuple[tuple[str, Axis], ...]:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise GridError(f"the specification grid {path} cannot be read: {exc}") from None
    axes = data.get("axes")
    if not isinstance(axes, dict) or not axes:
        raise GridError(f"{path}: no [axes.<name>] tables: declare at least one axis")
    out = []
    labels = set()
    for name, a in axes.items():
        where = f"{path}: [axes.{name}]"
        if not isinstance(a, dict):
            raise GridError(f"{where} must be a table")
        missing = [k for k in ("label", "values", "claims", "stage", "option", "why") if k not in a]
        if missing:
            raise GridError(f"{where} lacks {', '.join(missing)}")
        values = a["values"]
        if (not isinstance(values, list) or len(values) < 2
                or not all(isinstance(v, str) and v for v in values) or len(set(values)) != len(values)):
            raise GridError(f"{where}: values must be a list of at least two distinct strings")
        if a["stage"] not in STAGES:
            raise GridError(f"{where}: stage must be one of {STAGES}, got {a['stage']!r}")
        if a["label"] in labels:
            raise GridError(f"{where}: label {a['label']!r} is used by another axis")
        labels.add(a["label"])
        claims = a["claims"]
        if not isinstance(claims, list) or not claims:
            raise GridError(f"{where}: claims must be a non-empty list of claim ids")
        out.append((name, Axis(name=name, label=str(a["label"]), values=tuple(values),
                               claims=tuple(str(c) for c in claims), stage=a["stage"],
                               option=str(a["option"]), why=str(a["why"]),
                               modality=a.get("modality"), causal=bool(a.get("causal", False)))))
    return tuple(out)


def axes_for(grid: dict[str, Axis], claim: str, modality: str | None,
             causal: bool = False) -> list[Axis]:
    """The axes that apply to ``claim`` on a model of ``modality`` (a causal decoder or not),
    in grid order."""
    return [a for a in grid.values() if a.applies(claim, modality, causal)]


def specifications(grid: dict[str, Axis], claim: str, modality: str | None,
                   default: dict[str, str], causal: bool = False) -> list[dict[str, str]]:
    """Every specification of ``claim`` (one value per applicable axis), the default first.

    ``default``: the run's own value of every axis (the main records' specification); a default
    value that the grid does not list is added to that axis, so the default is always judged."""
    axes = axes_for(grid, claim, modality, causal)
    for a in axes:
        if a.name not in default:
            raise GridError(f"the default specification has no value for axis {a.name!r}")
    choices = [(a.name, (default[a.name], *[v for v in a.values if v != default[a.name]]))
               for a in axes]
    specs = [dict(zip([n for n, _ in choices], combo))
             for combo in itertools.product(*[values for _, values in choices])]
    return specs  # product order keeps the all-default combination first


def spec_name(grid: dict[str, Axis], spec: dict[str, str]) -> str:
    """``"axes=p2 std=off dtype=float64 rules=ours"``: the specification's axis values."""
    return " ".join(f"{grid[name].label}={value}" for name, value in spec.items())


def compute_part(grid: dict[str, Axis], spec: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The compute-stage values of a specification: what its per-layer metrics depend on."""
    return tuple((n, v) for n, v in spec.items() if grid[n].stage == "compute")


# ------------------------------------------------------------------------------ shares, effects
def shares(verdict_list: list[str]) -> dict[str, float]:
    """The share of each verdict of :data:`VERDICT_ORDER` in ``verdict_list`` (sums to 1)."""
    n = len(verdict_list)
    if not n:
        raise ValueError("shares of no specification: the grid is empty")
    return {v: sum(1 for x in verdict_list if x == v) / n for v in VERDICT_ORDER}


def axis_effects(specs: list[dict[str, str]], outcomes: list[tuple[str, ...]]) -> dict[str, dict]:
    """Which axes move the verdict. For each axis, every pair of specifications that differ in
    that axis alone is compared unit by unit (``outcomes[i]``: the verdicts of specification
    ``i``, one per unit, the same units in the same order for every specification):
    ``{"pairs", "comparisons", "flips", "share"}``, ``share = flips / comparisons``; an axis with
    ``flips > 0`` moves the verdict of some unit for some setting of the other axes."""
    if len(specs) != len(outcomes):
        raise ValueError(f"{len(specs)} specifications but {len(outcomes)} outcomes")
    names = list(specs[0]) if specs else []
    out = {}
    for axis in names:
        pairs = comparisons = flips = 0
        for i, s in enumerate(specs):
            for j in range(i + 1, len(specs)):
                t = specs[j]
                if s[axis] == t[axis] or any(s[a] != t[a] for a in names if a != axis):
                    continue
                pairs += 1
                a, b = outcomes[i], outcomes[j]
                if len(a) != len(b):
                    raise ValueError("outcomes of two specifications have different unit counts")
                comparisons += len(a)
                flips += sum(1 for x, y in zip(a, b) if x != y)
        out[axis] = {"pairs": pairs, "comparisons": comparisons, "flips": flips,
                     "share": flips / comparisons if comparisons else 0.0}
    return out


def survivors(outcomes: list[tuple[str, ...]]) -> list[str | None]:
    """Per unit, the verdict every specification gives it, or None where specifications differ."""
    if not outcomes:
        return []
    return [col[0] if all(v == col[0] for v in col) else None for col in zip(*outcomes)]


def summarize(grid: dict[str, Axis], specs: list[dict[str, str]], model_verdicts: list[str] | None,
              unit_verdicts: list[tuple[str, ...]] | None, unit_names: list[str] | None) -> dict:
    """One curve entry (a claim on a model): shares over specifications of the model verdict and
    over (specification, unit) pairs of the unit verdicts, the verdict that survives every
    specification (model) and how many units keep theirs, and the axes that move each."""
    out: dict = {"n_specifications": len(specs), "default": specs[0],
                 "axes": [a for a in specs[0]]}
    if model_verdicts is not None:
        out["model"] = {"shares": shares(model_verdicts),
                        "survives": survivors([(v,) for v in model_verdicts])[0],
                        "default_verdict": model_verdicts[0],
                        "axis_effects": axis_effects(specs, [(v,) for v in model_verdicts])}
    if unit_verdicts is not None:
        flat = [v for row in unit_verdicts for v in row]
        kept = survivors(unit_verdicts)
        out["units"] = {"n_units": len(unit_verdicts[0]) if unit_verdicts else 0,
                        "shares": shares(flat),
                        "robust": sum(1 for k in kept if k is not None),
                        "robust_counts": {v: sum(1 for k in kept if k == v) for v in VERDICT_ORDER},
                        "axis_effects": axis_effects(specs, unit_verdicts),
                        "names": unit_names}
    return out


def counts(verdict_list) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in verdict_list:
        out[v] = out.get(v, 0) + 1
    return out


# ------------------------------------------------------------------------------ records per combo
def v_outcomes(model: str, per_layer: dict, heads: list[int], rules: str) -> dict:
    """Claim V's head and model records of one compute combination, built as the claim tests
    build them (claims/test_value_vectors.py): ``{"model": record, "units": {name: record}}``."""
    from . import claim_v

    record, heads_of = claim_v.model_over_heads(model, per_layer, heads, rules)
    units = {f"L{layer:02d}-H{head}": rec for (layer, head), rec in heads_of.items()}
    return _plain({"model": record, "units": units})


#: The per-(sample, head) upper bounds of the optimal cosine a claim-V layer may carry in place
#: of the matched value (fixtures/engine/multiverse_v_grid.py ``v_grid_layer``): ``optimal_cosine`` then holds
#: the lower bound (the identity matching, the direct cosine).
V_UPPER = {"optimal_cosine": "optimal_cosine_hi", "optimal_cosine_null": "optimal_cosine_null_hi"}


def v_outcomes_bounded(model: str, per_layer: dict, heads: list[int], rules: str) -> dict | None:
    """Claim V's records of one compute combination whose optimal cosine is known only between
    bounds, when no verdict depends on where between them it lies (:func:`v_bounded`), else
    None: then the caller matches."""
    outcome, open_units = v_bounded(model, per_layer, heads, rules)
    return outcome if open_units == [] else None


def v_bounded(model: str, per_layer: dict, heads: list[int],
              rules: str) -> tuple[dict | None, list[tuple[int, int]] | None]:
    """Claim V's records of one compute combination whose optimal cosine is known only between
    bounds (lower: the identity matching; upper: the mean row maximum of the cosine matrix; a
    unit whose exact value is known carries it as both), without the Hungarian matching. The
    `ours` rules do not judge the optimal cosine (``[claim_v.ours]``); the `p2` rules judge its
    mean against bars, and their verdict can only rise with it, so a verdict is exact when the
    lower and the upper bound give the same one.

    Returns ``(outcome, open_units)``: the records (:func:`v_outcomes`, built on the lower bound,
    the model record's ``optimal_cosine`` replaced by None and its bounds
    ``optimal_cosine_bounds``) and the (layer, head) units whose p2 verdict differs between the
    bounds (``[]``: every verdict is exact). ``open_units`` is None, and so is the outcome, when
    the model record's verdict differs between the bounds or an `ours` rule judges the optimal
    cosine: then every head needs its exact value."""
    from . import claim_v

    if any(r.metric in V_UPPER for kind in ("supported", "refuted")
           for r in verdicts.ours_rules(claim_v.SECTION, kind)):
        return None, None
    base = {l: {n: t for n, t in m.items() if n not in V_UPPER.values()}
            for l, m in per_layer.items()}
    outcome = v_outcomes(model, base, heads, rules)
    layers = sorted(per_layer)

    def upper_mean(values: torch.Tensor, undetermined: torch.Tensor) -> float:
        keep = ~undetermined.reshape(-1)
        return float(values.reshape(-1).to(torch.float64)[keep].mean())

    def same_at_upper(rec: dict, values: torch.Tensor, undetermined: torch.Tensor) -> bool:
        if rec["verdicts"]["p2"] == verdicts.UNDETERMINED:  # not judged: no bar is applied
            return True
        metrics = {**rec["metrics"], "optimal_cosine": upper_mean(values, undetermined)}
        return verdicts.judge(claim_v.SECTION, metrics).verdict == rec["verdicts"]["p2"]

    hi = torch.cat([per_layer[l]["optimal_cosine_hi"][:, heads] for l in layers], dim=1)
    undet = torch.cat([per_layer[l]["undetermined"][:, heads] for l in layers], dim=1)
    model_rec = outcome["model"]
    if not same_at_upper(model_rec, hi, undet):
        return None, None
    open_units = [(layer, head) for layer in layers for head in heads
                  if not same_at_upper(outcome["units"][f"L{layer:02d}-H{head}"],
                                       per_layer[layer]["optimal_cosine_hi"][:, head],
                                       per_layer[layer]["undetermined"][:, head])]
    lo = model_rec["metrics"]["optimal_cosine"]
    model_rec["metrics"] = {**model_rec["metrics"], "optimal_cosine": None}
    model_rec["optimal_cosine_bounds"] = [lo, upper_mean(hi, undet)]
    return outcome, open_units


def j_outcomes(model: str, per_layer: dict, heads: list[int], rules: str) -> dict:
    """Claim J's layer and model records (claims/test_projection_loss.py)."""
    from . import claim_j

    units = {f"L{layer:02d}": claim_j.layer_record(model, layer, per_layer[layer], heads, rules=rules)
             for layer in sorted(per_layer)}
    return _plain({"model": claim_j.model_record(model, per_layer, heads, rules=rules),
                   "units": units})


def e_outcomes(model: str, per_layer: dict, heads: list[int], head_dim: int, rules: str) -> dict:
    """Claim E's model record (eigenvalue statistics) and γ head records
    (claims/test_gram_spectrum.py)."""
    from . import claim_e

    units = {f"L{layer:02d}-H{head}": rec
             for (layer, head), rec in claim_e.head_records(model, per_layer, heads, rules).items()}
    return _plain({"model": claim_e.model_record(model, per_layer, heads, head_dim, rules=rules),
                   "units": units})


def _plain(outcome: dict) -> dict:
    """Records as their JSON objects (read many times per specification)."""
    from .records import as_json

    return {"model": as_json(outcome["model"]),
            "units": {name: as_json(rec) for name, rec in outcome["units"].items()}}


#: The headline metrics each entry shows per specification.
HEADLINE = {"V": ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap_excess"),
            "J": ("log10_ratio", "bessel_share"),
            "E": ("raw_vs_standardized_ratio", "max_route_ratio", "naive_finite_share"),
            "E-gamma": ()}


def judged(outcome: dict, entry: str, decide: dict[str, str], unit_names: list[str]) -> dict:
    """One specification's result for a curve entry from a compute combination's records:
    the decide-stage values (``decide``: axis → value; today the rule set) pick the verdicts.
    A combination whose metrics could not be computed (``{"error": why}``, e.g. a quantity
    beyond the float32 range) is *undetermined* in every unit, with the reason (method §6.2)."""
    rule_set = decide.get("rules")
    unit_of = ENTRIES[entry][1]
    if "error" in outcome:
        res: dict = {"reason": outcome["error"]}
        if entry != "E-gamma":
            res["verdict"] = verdicts.UNDETERMINED
            res["metrics"] = {m: None for m in HEADLINE[entry]}
        if unit_of is not None:
            res["units"] = [verdicts.UNDETERMINED] * len(unit_names)
            res["unit_counts"] = counts(res["units"])
        return res
    model_rec = outcome["model"]
    statistic = decide.get("j_statistic", J_DEFAULT_STATISTIC) if entry == "J" else None
    res = {}
    if entry != "E-gamma":
        res["verdict"] = _verdict_of(model_rec, rule_set, statistic)
        metrics = dict(model_rec["metrics"])
        if statistic not in (None, J_DEFAULT_STATISTIC):
            metrics["log10_ratio"] = _token_statistic(model_rec, statistic)
        res["metrics"] = {m: metrics.get(m) for m in HEADLINE[entry]}
        if model_rec.get("optimal_cosine_bounds"):  # not matched: no verdict depends on it
            res["bounds"] = {"optimal_cosine": model_rec["optimal_cosine_bounds"]}
    if unit_of is not None:
        res["units"] = [_verdict_of(rec, rule_set, statistic) for rec in outcome["units"].values()]
        res["unit_counts"] = counts(res["units"])
    return res


#: Claim J's magnitude statistic (the ``j_statistic`` axis, method §14.2): the judged one is the
#: ratio of pooled means (method §3.2); the others are per-token statistics of the claim-J
#: records' ``tokens`` (method §3.7), put in its place in the rules that judge ``log10_ratio``.
J_DEFAULT_STATISTIC = "pooled-means"
J_STATISTICS = {"per-token-median": "median_log10_ratio",
                "p2-trimmed-median": "p2_appendix_log10_ratio"}


def _token_statistic(record: dict, statistic: str) -> float | None:
    if statistic not in J_STATISTICS:
        raise GridError(f"unknown claim-J statistic {statistic!r}; the grid may use "
                        f"{J_DEFAULT_STATISTIC!r} or {', '.join(map(repr, J_STATISTICS))}")
    return (record.get("tokens") or {}).get(J_STATISTICS[statistic])


def _rejudged_j(record: dict, statistic: str, rule_set: str) -> str:
    """A claim-J record judged with its ``log10_ratio`` replaced by a per-token statistic (and
    that metric's interval dropped: it was the pooled ratio's); undetermined when the record has
    no such statistic (method §6.2)."""
    value = _token_statistic(record, statistic)
    if value is None:
        return verdicts.UNDETERMINED
    metrics = {**record["metrics"], "log10_ratio": value}
    ci = {k: b for k, b in (record.get("ci") or {}).items() if k != "log10_ratio"}
    undefined = {k: r for k, r in (record.get("undefined") or {}).items() if k != "log10_ratio"}
    extra = {}
    fit = record.get("output_fit") or {}
    if "vs_null" in fit and "at_chance" in fit["vs_null"]:
        extra["at_chance"] = {"output_r2": bool(fit["vs_null"]["at_chance"])}
    _, both = verdicts.judge_both("claim_j", metrics, ci or None, rules_name=rule_set,
                                  undefined=undefined, **extra)
    return both[rule_set]


def _verdict_of(record, rule_set: str | None, statistic: str | None = None) -> str:
    both = record.get("verdicts") or {}
    if statistic not in (None, J_DEFAULT_STATISTIC):
        return _rejudged_j(record, statistic, rule_set or record["rules"])
    if rule_set is None:
        return record["verdict"]
    if rule_set not in both:
        raise GridError(f"the rule set {rule_set!r} of the grid is not one the records carry "
                        f"({', '.join(both) or 'none'})")
    return both[rule_set]
