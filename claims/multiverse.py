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

from . import registry, verdicts
from .records import as_json

GRID_FILE = Path(__file__).with_name("specifications.toml")
STAGES = ("compute", "decide")
#: The verdicts a share is reported for, in display order.
VERDICT_ORDER = (verdicts.SUPPORTED, verdicts.PARTIAL, verdicts.INCONCLUSIVE, verdicts.REFUTED,
                 verdicts.UNDETERMINED)


def entries() -> dict[str, dict]:
    """The curve's entries per model, from the registered claims' declarations
    (``ClaimSpec.curve_entries``, :func:`claims.registry.entries_of`), in registration order:
    entry → ``{"claim", "unit", "headline", "model_verdict", "decide"}`` (the built-in claims: V
    with head units, J with layer units, E's eigenvalue statistics per model and its γ per head;
    ``decide``: the claim's ``curve_decide`` function or None)."""
    out = {}
    for spec in registry.all_claims():
        for name, table in registry.entries_of(spec).items():
            out[name] = {**table, "decide": (registry.resolve(spec.curve_decide)
                                             if spec.curve_decide is not None else None)}
    return out


def headline(entry: str) -> tuple[str, ...]:
    """The metrics curve entry ``entry`` shows per specification."""
    try:
        return entries()[entry]["headline"]
    except KeyError:
        raise GridError(f"no registered claim declares the curve entry {entry!r}") from None


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
    default: str | None = None  # the default specification's value, where not a run option
    crossed: bool = True  # False: varied alone, every other axis at its default

    def applies(self, claim: str, modality: str | None, causal: bool = False) -> bool:
        return (claim in self.claims and (self.modality is None or self.modality == modality)
                and (causal or not self.causal))


def load_grid(path: str | Path | None = None) -> dict[str, Axis]:
    """The axes of the grid file (default :data:`GRID_FILE`), in file order, validated, then the
    axes the registered claims declare of their own (``ClaimSpec.axes``, each for its claim)."""
    axes = dict(_load_grid(str(path or GRID_FILE)))
    for spec in registry.all_claims():
        for name, table in spec.axes.items():
            where = f"claim {spec.id}'s axis {name!r} (ClaimSpec.axes)"
            if name in axes:
                raise GridError(f"{where} is already an axis of the grid; name it otherwise")
            axis = _axis(name, {**table, "claims": [spec.id]}, where)
            if axis.label in {a.label for a in axes.values()}:
                raise GridError(f"{where}: label {axis.label!r} is used by another axis")
            axes[name] = axis
    return axes


def _axis(name: str, a, where: str) -> Axis:
    """One validated axis from its table (``where`` names it in errors)."""
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
    claims = a["claims"]
    if not isinstance(claims, list) or not claims:
        raise GridError(f"{where}: claims must be a non-empty list of claim ids")
    default = a.get("default")
    if default is not None and default not in values:
        raise GridError(f"{where}: default {default!r} is not among its values {values}")
    crossed = a.get("crossed", True)
    if not isinstance(crossed, bool):
        raise GridError(f"{where}: crossed must be true or false, got {crossed!r}")
    return Axis(name=name, label=str(a["label"]), values=tuple(values),
                claims=tuple(str(c) for c in claims), stage=a["stage"], option=str(a["option"]),
                why=str(a["why"]), modality=a.get("modality"), causal=bool(a.get("causal", False)),
                default=default, crossed=crossed)


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
        axis = _axis(name, a, f"{path}: [axes.{name}]")
        if axis.label in labels:
            raise GridError(f"{path}: [axes.{name}]: label {axis.label!r} is used by another axis")
        labels.add(axis.label)
        out.append((name, axis))
    return tuple(out)


def axes_for(grid: dict[str, Axis], claim: str, modality: str | None,
             causal: bool = False) -> list[Axis]:
    """The axes that apply to ``claim`` on a model of ``modality`` (a causal decoder or not),
    in grid order."""
    return [a for a in grid.values() if a.applies(claim, modality, causal)]


def specifications(grid: dict[str, Axis], claim: str, modality: str | None,
                   default: dict[str, str], causal: bool = False) -> list[dict[str, str]]:
    """Every specification of ``claim`` (one value per applicable axis), the default first: every
    combination of the crossed axes' values (uncrossed axes at their default), then each other
    value of each uncrossed axis (``crossed = false``) with every other axis at its default.

    ``default``: the run's own value of every axis (the main records' specification); a default
    value that the grid does not list is added to that axis, so the default is always judged.

    >>> grid = {n: Axis(n, n, ("a", "b"), ("V",), "compute", n, "w", crossed=n != "z")
    ...         for n in ("x", "y", "z")}
    >>> [" ".join(s.values()) for s in specifications(grid, "V", None, dict(x="a", y="a", z="a"))]
    ['a a a', 'a b a', 'b a a', 'b b a', 'a a b']
    """
    axes = axes_for(grid, claim, modality, causal)
    for a in axes:
        if a.name not in default:
            raise GridError(f"the default specification has no value for axis {a.name!r}")
    base = {a.name: default[a.name] for a in axes}
    choices = [(a.name, (default[a.name], *[v for v in a.values if v != default[a.name]])
                if a.crossed else (default[a.name],)) for a in axes]
    specs = [dict(zip([n for n, _ in choices], combo))
             for combo in itertools.product(*[values for _, values in choices])]
    specs += [{**base, a.name: v} for a in axes if not a.crossed
              for v in a.values if v != default[a.name]]
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
def plain(outcome: dict) -> dict:
    """Records as their JSON objects (read many times per specification)."""
    return {"model": as_json(outcome["model"]),
            "units": {name: as_json(rec) for name, rec in outcome["units"].items()}}


def judged(outcome: dict, entry: str, decide: dict[str, str], unit_names: list[str]) -> dict:
    """One specification's result for a curve entry from a compute combination's records:
    the decide-stage values (``decide``: axis → value; today the rule set) pick the verdicts.
    A combination whose metrics could not be computed (``{"error": why}``, e.g. a quantity
    beyond the float32 range) is *undetermined* in every unit, with the reason (method §6.2)."""
    rule_set = decide.get("rules")
    table = entries()[entry]
    unit_of, judged_model, shown = table["unit"], table["model_verdict"], table["headline"]
    if "error" in outcome:
        res: dict = {"reason": outcome["error"]}
        if judged_model:
            res["verdict"] = verdicts.UNDETERMINED
            res["metrics"] = {m: None for m in shown}
        if unit_of is not None:
            res["units"] = [verdicts.UNDETERMINED] * len(unit_names)
            res["unit_counts"] = counts(res["units"])
        return res
    model_rec = outcome["model"]
    rejudge = table["decide"]
    res = {}
    if judged_model:
        res["verdict"] = _verdict_of(model_rec, rule_set, decide, rejudge)
        metrics = dict(model_rec["metrics"])
        taken = rejudge(model_rec, decide, rule_set) if rejudge is not None else None
        if taken is not None:
            metrics.update(taken[1])
        res["metrics"] = {m: metrics.get(m) for m in shown}
        if model_rec.get("optimal_cosine_bounds"):  # not matched: no verdict depends on it
            res["bounds"] = {"optimal_cosine": model_rec["optimal_cosine_bounds"]}
    if unit_of is not None:
        res["units"] = [_verdict_of(rec, rule_set, decide, rejudge)
                        for rec in outcome["units"].values()]
        res["unit_counts"] = counts(res["units"])
    return res


def _verdict_of(record, rule_set: str | None, decide: dict, rejudge=None) -> str:
    """A record's verdict under the decide-stage values: the claim's own ``curve_decide`` where it
    takes the decision (a claim-J statistic other than the default), else the rule set's."""
    taken = rejudge(record, decide, rule_set) if rejudge is not None else None
    if taken is not None:
        return taken[0]
    both = record.get("verdicts") or {}
    if rule_set is None:
        return record["verdict"]
    if rule_set not in both:
        raise GridError(f"the rule set {rule_set!r} of the grid is not one the records carry "
                        f"({', '.join(both) or 'none'})")
    return both[rule_set]
