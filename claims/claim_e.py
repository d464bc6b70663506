"""Claim E (method §4): Gram eigenvalue statistics by three routes, and γ constancy per head."""

from __future__ import annotations

import itertools
import math

import torch

from checks.errors import UndefinedValueError, defined, defined_values
from checks.spectrum import STATISTICS, eigenvalue_statistics, route_comparison
from checks.stats import (bootstrap_indices, masked_mean, percentile_interval, position_between,
                          seed_from)

from . import claim_v, round_off_widths as round_off, verdicts
from .chance import chance_settings
from .claim_e_gamma_stats import EXACT_EIGEN, chance_tests, gamma_ci, imprecise_overlaps, subspace_summary
from .names import E_ROUTES as ROUTES
from .records import EHeadRecord, EModelRecord, finite_or_none, head_sample_rows

#: The sections of claims/thresholds.toml that judge claim E: model records, γ head records.
SECTION, GAMMA = "claim_e", "claim_e_gamma"
#: Every pair of routes whose ratio ``max_route_ratio`` takes the largest of (method §4).
ROUTE_PAIRS = tuple(itertools.combinations(ROUTES, 2))


def _route_mu(per_layer: list[dict[str, torch.Tensor]], heads: list[int], route: str) -> torch.Tensor:
    """|μ|-ready spectra [samples, layers×heads, d] of one route; NaN marks the naive route's
    non-finite items (the measured outcome of that route, counted, never averaged)."""
    parts = []
    for t in per_layer:
        mu = t[f"mu_{route}"][:, heads].clone()
        if route == "naive_float32":
            mu[~t["naive_finite"][:, heads]] = float("nan")
        parts.append(mu)
    return torch.cat(parts, dim=1)


def _where_nonfinite(per_layer: dict[int, dict], heads: list[int]) -> str | None:
    notes = []
    for layer, t in per_layer.items():
        bad = ~t["naive_finite"][:, heads]
        if bool(bad.any()):
            # in name order: the metrics' key order depends on how their file was written
            stages = sorted(k[len("naive_bad_"):] for k in t if k.startswith("naive_bad_")
                            and bool(t[k][:, heads].any()))
            notes.append(f"L{layer:02d}: {int(bad.sum())} of {bad.numel()} heads×samples "
                         f"({', '.join(stages)})")
    return "; ".join(notes) or None


def _few_tokens(per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                d: int) -> tuple[torch.Tensor, str] | None:
    """(the samples to keep, why the others are left out) when some samples have fewer tokens
    than the head dimension: their Gram has N < d eigenvalues, and P2's statistics read the
    first d (the rest would be padding, method §4); None when every sample has d or more."""
    n = next(iter(per_layer.values())).get("n_tokens")
    if n is None:
        return None
    n = n[:, heads[0]]
    few = n < d
    if not bool(few.any()):
        return None
    lo, hi = int(n[few].min()), int(n[few].max())
    return ~few, (f"{int(few.sum())} of {few.numel()} samples have fewer tokens than the head "
                  f"dimension (N < d, N = {lo if lo == hi else f'{lo}..{hi}'}): their Gram "
                  f"matrix has fewer than the d = {d} eigenvalues the statistics read (method §4)")


def _undetermined_model(model: str, layers: list[int], heads: list[int], rules: str,
                        why: str) -> EModelRecord:
    """The model record when no sample has d eigenvalues: every metric without a value, why."""
    undefined = {k: why for k in ("raw_vs_standardized_ratio", "max_route_ratio",
                                  "naive_finite_share")}
    metrics = {k: None for k in undefined}
    v, both = verdicts.judge_both(SECTION, metrics, None, rules_name=rules, undefined=undefined)
    return EModelRecord(claim="E", level="model", model=model, verdict=v.verdict, verdicts=both,
                        rules=rules, metrics=metrics, layers=layers, heads=heads,
                        evidence=verdicts.format_evidence(v, both=both), undefined=undefined,
                        reason=v.reason or None)


def model_record(model: str, per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                 d: int, rules: str = "ours") -> EModelRecord:
    layers = sorted(per_layer)
    few = _few_tokens(per_layer, heads, d)
    if few is not None and not bool(few[0].any()):
        return _undetermined_model(model, layers, heads, rules, few[1])
    if few is not None:  # judged on the samples of d eigenvalues or more
        per_layer = {l: {k: t[few[0]] for k, t in per_layer[l].items()} for l in layers}
    tensors = [per_layer[l] for l in layers]
    routes, stats = {}, {}
    for route in ROUTES:
        s = eigenvalue_statistics(_route_mu(tensors, heads, route), d)
        stats[route] = s
        routes[route] = {"stats": {k: {"mean": s["mean"][k], "std": s["std"][k]} for k in STATISTICS},
                         "n_samples": s["n_samples"], "n_nonfinite": s["n_nonfinite"]}
    routes["naive_float32"]["nonfinite_where"] = _where_nonfinite(per_layer, heads)
    raw_std = route_comparison(stats["log_raw"], stats["log_standardized"])
    pairs = [route_comparison(stats[a], stats[b]) for a, b in ROUTE_PAIRS]
    finite = torch.cat([t["naive_finite"][:, heads].reshape(-1) for t in tensors])
    metrics = {"raw_vs_standardized_ratio": raw_std["max_ratio"],
               "max_route_ratio": max(p["max_ratio"] for p in pairs),
               "naive_finite_share": float(finite.to(torch.float64).mean())}
    # method §6.2: an infinite ratio (a route without a finite sample, or a statistic that is 0 on
    # one route only) is recorded as no value, with the reason, never as inf
    undefined = {k: "a route has no finite sample, or a statistic is 0 on one route only"
                 for k, x in metrics.items() if not math.isfinite(x)}
    metrics = defined_values(metrics, undefined)
    per_sample_finite = torch.cat([t["naive_finite"][:, heads] for t in tensors], dim=1)
    ci = _finite_intervals(route_ci(stats, per_sample_finite, seed_from(f"E-{model}-model")),
                           metrics)
    v, both = verdicts.judge_both(SECTION, metrics, ci, rules_name=rules, undefined=undefined)
    evidence = verdicts.format_evidence(v, ci=ci, both=both)
    notes = construction_notes(per_layer, heads, v.verdict)
    if few is not None:
        notes["few_tokens"] = f"left out: {few[1]}"
    if notes:
        evidence += "\n" + "\n".join(f"  note: {n}" for n in notes.values())
    return EModelRecord(claim="E", level="model", model=model, verdict=v.verdict, verdicts=both,
                        rules=rules, metrics=metrics, ci=ci, routes=routes,
                        route_ratios=defined_values(raw_std["ratio"], {}), layers=layers,
                        heads=heads, evidence=evidence,
                        undefined=undefined or None, reason=v.reason or None,
                        extra={"notes": notes} if notes else {})


def construction_notes(per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                       verdict: str) -> dict[str, str]:
    """What a claim-E model verdict rests on (method §4.1): ``"by_construction"`` when the raw
    and standardised routes give the same spectra to round-off in every (sample, layer, head),
    i.e. the model standardises its keys itself and the raw/standardised rule holds by
    construction; ``"one_head"`` when the naive float32 route fails in exactly one (layer, head),
    so a refutation by that rule rests on that head alone."""
    notes: dict[str, str] = {}
    same = all(bool(torch.allclose(t["mu_log_raw"][:, heads], t["mu_log_standardized"][:, heads],
                                   rtol=1e-6, atol=0.0)) for t in per_layer.values())
    if same:
        notes["by_construction"] = (
            f"{verdict} by construction for the raw-vs-standardised rule: the model's keys are "
            "already standardised per token (the two routes agree to 1e-6 in every sample), so "
            "that rule cannot fail; it says nothing about P1's eigenvalue statistics")
    failing = [(layer, h) for layer, t in sorted(per_layer.items()) for h in heads
               if not bool(t["naive_finite"][:, h].all())]
    if len(failing) == 1:
        layer, h = failing[0]
        notes["one_head"] = (f"the naive float32 route fails in one (layer, head) only, "
                             f"L{layer:02d}-H{h}: a refutation by that rule rests on that head")
    return notes


def _finite_intervals(ci: dict, metrics: dict) -> dict:
    """The intervals of the defined metrics whose bounds are finite (method §6.2: no inf or NaN
    in a record; a metric without an interval is judged on its value), and those left undefined
    by too few samples (both bounds NaN: recorded as null, method §7)."""
    return {k: b for k, b in ci.items() if metrics.get(k) is not None
            and (all(math.isfinite(float(x)) for x in b) or all(x != x for x in b))}


def _ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max(a/b, b/a) elementwise as :func:`checks.spectrum.route_comparison` defines it: 1 for
    equal values, inf for an undefined side, opposite signs or exactly one zero."""
    with torch.no_grad():
        r = torch.maximum(a / b, b / a)
    bad = ~torch.isfinite(a) | ~torch.isfinite(b) | ((a == 0) ^ (b == 0)) | (a * b < 0)
    r = torch.where(a == b, torch.ones_like(r), r)
    return torch.where(bad, torch.full_like(r, math.inf), r)


def route_ci(stats: dict[str, dict], finite: torch.Tensor, seed: int) -> dict:
    """95% percentile-bootstrap CIs over samples (method §7) of the route ratios and the naive
    route's finite share: each resample recomputes every route's across-sample mean of each
    statistic (finite samples only, as :func:`checks.spectrum.eigenvalue_statistics`) and the
    ratios from them. ``finite`` [S, units]: the naive route's finiteness per (sample, unit)."""
    settings = chance_settings()
    per = {route: torch.stack([stats[route]["per_sample"][k].to(torch.float64) for k in STATISTICS],
                              dim=1) for route in ROUTES}  # [S, statistics], NaN: non-finite sample
    idx = bootstrap_indices(finite.shape[0], seed, settings.bootstrap_resamples)
    means = {route: torch.nanmean(x[idx], dim=1) for route, x in per.items()}  # [R, statistics]
    raw_std = _ratio(means["log_raw"], means["log_standardized"]).amax(-1)
    pairs = torch.stack([_ratio(means[a], means[b]).amax(-1) for a, b in ROUTE_PAIRS]).amax(0)
    share = finite.to(torch.float64).mean(1)[idx].mean(1)
    return {name: [float(x) for x in percentile_interval(draws, settings.confidence,
                                                         n=int(finite.shape[0]))]
            for name, draws in (("raw_vs_standardized_ratio", raw_std), ("max_route_ratio", pairs),
                                ("naive_finite_share", share))}


def head_record(model: str, layer: int, head: int, t: dict[str, torch.Tensor],
                rules: str = "ours", cache: dict | None = None) -> EHeadRecord:
    """The γ record of one head (method §4). ``cache``: where the layer's γ intervals, computed
    for all its heads at once, are kept (:func:`claims.claim_e_gamma_stats.gamma_ci`): a dict owned by
    the caller in which this model's layer ``layer`` has the fixed tensors ``t``."""
    undetermined = t["undetermined"][:, head]
    keep = ~undetermined
    n, n_undet = int(keep.numel()), int(undetermined.sum())
    max_share = float(verdicts.load_thresholds()[GAMMA]["undetermined"]["max_share"])
    if n_undet / max(n, 1) > max_share:
        keep = torch.ones_like(keep)
    means = {name: float(masked_mean(t[f"gamma_{name}"][:, head], keep)[0])
             for name in ("learned", "eigen", "perturbed")}
    absolute = {name: float(masked_mean(t[f"gamma_{name}_abs"][:, head], keep)[0])
                for name in ("learned", "eigen", "perturbed")}
    undefined: dict[str, str] = {}

    def contrast() -> float:  # method §6.2: without contrast between the controls, no position
        if not means["perturbed"] > means["eigen"]:
            raise UndefinedValueError("the perturbed control's spread does not exceed the true "
                                      "eigenvectors' spread: no contrast to judge by")
        return position_between(means["learned"], EXACT_EIGEN, means["perturbed"])

    position = defined("gamma_position", contrast, undefined)
    subspace = subspace_summary(t, head, keep)
    imprecise: dict[str, float] = {}
    if subspace is not None:
        undefined.update(subspace.pop("undefined"))
        imprecise = imprecise_overlaps(t, head, keep, subspace, undefined)
    closer = (torch.abs(t["gamma_learned"][:, head] - EXACT_EIGEN)
              < torch.abs(t["gamma_learned"][:, head] - t["gamma_perturbed"][:, head]))
    metrics = {**means, "gamma_position": position,
               "gamma_subspace_position": None if subspace is None else subspace["position"],
               "gamma_direction_position": None if subspace is None else
               subspace["directions"]["position"]}
    if subspace is None:
        for name in ("gamma_subspace_position", "gamma_direction_position"):
            undefined[name] = "no invariant-subspace residuals in these tensors"
    keeps = t["undetermined"]  # every head's kept samples, as above, for the layer's one pass
    share = keeps.to(torch.float64).mean(0)
    keeps = torch.where(share > max_share, torch.ones_like(keeps), ~keeps)
    seed = seed_from(f"E-{model}-L{layer:02d}")
    ci = _finite_intervals(gamma_ci(t, keeps, seed, cache)[head], metrics)
    null, vs_null, at_chance = None, None, None
    if subspace is not None:
        for metric, suffix, flip in (("gamma_subspace_position", "subspace", False),
                                     ("gamma_direction_position", "directions", True)):
            if f"gamma_learned_{suffix}" not in t:
                continue
            sub_t = {f"gamma_{name}": (1.0 - t[f"gamma_{name}_{suffix}"].to(torch.float64))
                     if flip else t[f"gamma_{name}_{suffix}"]
                     for name in ("learned", "eigen", "perturbed")}
            sub_ci = gamma_ci(sub_t, keeps, seed, measured_anchor=True)[head]["gamma_position"]
            ci.update(_finite_intervals({metric: sub_ci}, metrics))
        if subspace["null_positions"] is not None:
            null = subspace["null_positions"]
            vs_null = chance_tests(t, keeps, seed_from(f"E-{model}-L{layer:02d}-chance"))[head]
            at_chance = {"gamma_subspace_residual": vs_null["at_chance"]}
            bar = next((r.value for r in verdicts.ours_rules(GAMMA, "supported")
                        if r.metric == "gamma_subspace_position"), None)
            null_position = null.get("gamma_subspace_position")
            if bar is not None and null_position is not None and null_position < bar:
                # the token-shuffled values already meet the support bar: every span is nearly
                # invariant on this K̃, so the rule cannot tell (method §4.2)
                why = (f"the invariant-subspace test cannot discriminate: the token-shuffled "
                       f"values' axes already sit at position {null_position:.3g} (< the support "
                       f"bar {bar:g})")
                for name in ("gamma_subspace_position", "gamma_direction_position"):
                    metrics[name] = None
                    undefined[name] = why
                ci = {k: b for k, b in ci.items() if k not in undefined}
                at_chance = None
    n_eff, degenerate = None, False
    if "effective_rows" in t:
        n_eff, degenerate = claim_v.degeneracy(t["effective_rows"][:, head], keep)
    record = EHeadRecord(claim="E", level="head", model=model, layer=layer, head=head,
                         metrics=metrics, abs=absolute,
                         closer_to_eigen_share=float(closer[keep].to(torch.float64).mean()),
                         n_samples=n, n_undetermined=n_undet, ci=ci, rules=rules,
                         effective_rows=n_eff, subspace=None if subspace is None else
                         {k: subspace[k] for k in ("learned", "eigen", "perturbed", "null")
                          if k in subspace})
    if subspace is not None:
        record.extra["directions"] = {k: v for k, v in subspace["directions"].items()
                                      if k != "position" and k not in imprecise}
    if imprecise:  # reported, never judged; compared across machines as `ill_conditioned`
        record.extra["directions_imprecise"] = imprecise
    if null is not None:
        record.extra["null"] = null
        record.extra["vs_null"] = {"gamma_subspace_residual": vs_null}
    if degenerate:  # method §2.2: the axes are about one token's; counted apart, never judged
        record.verdict = verdicts.UNDETERMINED
        record.verdicts = {r: verdicts.UNDETERMINED for r in verdicts.RULE_SETS}
        record.degenerate = True
        record.reason = (f"degenerate: V_hat is carried by about one token (median effective "
                         f"number of rows of G {n_eff:.3g} <= {claim_v.degenerate_bar():g}; "
                         "method §2.2)")
        return record
    if n_undet / max(n, 1) > max_share:
        record.verdict = verdicts.UNDETERMINED
        record.verdicts = {r: verdicts.UNDETERMINED for r in verdicts.RULE_SETS}
        record.reason = (f"{n_undet} of {n} samples have an undetermined eigen control "
                         "(mu_d is round-off, method §2)")
        return record
    v, both = verdicts.judge_both(
        GAMMA, {"gamma_position": position,
                "gamma_subspace_position": metrics["gamma_subspace_position"],
                "gamma_direction_position": metrics["gamma_direction_position"]},
        ci, rules_name=rules, undefined=undefined, at_chance=at_chance)
    record.verdict, record.verdicts = v.verdict, both
    record.evidence = verdicts.format_evidence(v, ci=ci, both=both)
    record.reason = v.reason or None  # e.g. "at chance: ..." (method §4.2)
    if undefined:
        record.undefined = undefined
    return record


def head_records(model: str, per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                 rules: str = "ours") -> dict[tuple[int, int], EHeadRecord]:
    """The γ record of every selected (layer, head) of a model, each layer's intervals computed
    once for all its heads."""
    cache: dict = {}
    return {(layer, head): head_record(model, layer, head, per_layer[layer], rules, cache)
            for layer in sorted(per_layer) for head in heads}


def record_for_head(run, model: str, layer: int, head: int) -> EHeadRecord:
    """A γ head test's record from its model run (``run.layer_metrics``, ``run.options.rules``,
    ``run.statistics``, where the layer's intervals are kept for its other heads)."""
    t = run.layer_metrics("E", layer)
    twin = round_off.twin_metrics(t)  # method §13.2: the record's round-off widths
    return round_off.attach(
        head_record(model, layer, head, t, run.options.rules, run.statistics),
        twin and head_record(model, layer, head, twin, run.options.rules,
                             round_off.twin_cache(run.statistics)))


def record_for_model(run, model: str, layers: list[int], heads: list[int]) -> EModelRecord:
    """An eigenvalue-statistics test's record from its model run, over ``layers`` × ``heads``."""
    return model_record(model, {layer: run.layer_metrics("E", layer) for layer in layers}, heads,
                        run.prepare()["head_dim"], rules=run.options.rules)


def message(record: EModelRecord | EHeadRecord, what: str) -> str:
    if record.level == "model" and not record.routes:  # no sample of d eigenvalues or more
        return f"claim E undetermined for {what}: {record.reason}"
    if record.level == "model":
        r = record.routes
        lines = [f"claim E {record.verdict} for {what}: eigenvalue statistics by route "
                 "(mean over samples of max/min/mean/median_k of |mu_k| averaged over layers and heads)"]
        for route in ROUTES:
            stats = ", ".join(
                f"{k} {_fmt(r[route]['stats'][k]['mean'])}" for k in STATISTICS)
            lines.append(f"  {route:<17} {stats}; non-finite samples {r[route]['n_nonfinite']}")
        if r["naive_float32"].get("nonfinite_where"):
            lines.append(f"  naive route went non-finite at {r['naive_float32']['nonfinite_where']}")
        return "\n".join(lines) + "\n" + record.evidence
    m = record.metrics
    if record.verdict == verdicts.UNDETERMINED:
        return f"claim E (gamma) undetermined for {what}: {record.reason}"
    return (f"claim E (gamma constancy) {record.verdict} for {what}: relative spread of gamma "
            f"from the learned V {m['learned']:.4g} beside the true eigenvectors {m['eigen']:.4g} "
            f"and P2's perturbed basis {m['perturbed']:.4g} (position "
            f"{verdicts.format_ci(m['gamma_position'], record.ci_of('gamma_position'))}: "
            f"0 = eigenvectors, 1 = perturbed)\n{record.evidence}")


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.4g}"


def sample_rows(record: dict, run) -> list[dict]:
    """``--save-samples`` (``ClaimSpec.sample_rows``): the rows behind a γ head record (method
    §4): per sample, the relative γ spread of the learned V and of the two controls (``learned``,
    ``eigen``, ``perturbed``) and their absolute spreads (``*_abs``); the mean of a column over
    the ``used`` rows is the record's value (the record's ``gamma_position`` is the position of
    those means between the controls). A model record judges ratios of route statistics, not
    means over samples: no rows. Non-finite values are written as null."""
    if record.get("level") != "head":
        return []
    layer, head = record["layer"], record["head"]
    t = run.layer_metrics("E", layer)
    names = run.prepare()["input_set"].get("names") or []
    undetermined = t["undetermined"][:, head].bool()
    max_share = float(verdicts.load_thresholds()[GAMMA]["undetermined"]["max_share"])
    share = float(undetermined.to(float).mean()) if undetermined.numel() else 0.0
    used = torch.ones_like(undetermined) if share > max_share else ~undetermined
    rows = head_sample_rows("E", record, names, undetermined, used)
    for s, row in enumerate(rows):
        for name in ("learned", "eigen", "perturbed"):
            row[name] = finite_or_none(t[f"gamma_{name}"][s, head])
            row[f"{name}_abs"] = finite_or_none(t[f"gamma_{name}_abs"][s, head])
    return rows
