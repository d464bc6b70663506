"""Claim J (method §3): per-layer and per-model J_proj magnitudes, and the trend over training."""

from __future__ import annotations

import math

import torch

from checks.errors import UndefinedValueError, defined
from checks.projection_summary import pooled_terms, spearman_rho, term_attribution
from checks.stats import (bootstrap_indices, bootstrap_weights, excess_over_null,
                          percentile_interval, seed_from)

from . import verdicts
from .chance import above_pvalues, chance_settings, chance_test, tost_p
from .names import J_METRICS
from .records import JRecord, JTrendRecord

#: The sections of claims/thresholds.toml that judge claim J: layer and model records, the trend.
SECTION, TREND = "claim_j", "claim_j_trend"


def pooled(layer_terms: list[dict[str, torch.Tensor]], heads: list[int]) -> dict:
    """method §3 quantities pooled over the given layers' samples, heads and tokens."""
    def cat(name):
        return torch.cat([t[name][:, heads].reshape(-1) for t in layer_terms])
    return pooled_terms(cat("log_phi_sq_mean"), cat("h_sq_mean"), cat("bessel_share"),
                        cat("n_tokens"), cat("p1_log_phi_sq_mean"))


def pooled_ci(layer_terms: list[dict[str, torch.Tensor]], heads: list[int], seed: int) -> dict:
    """95% percentile-bootstrap CIs over samples (method §7) of the judged pooled quantities,
    ``log10_ratio`` and ``bessel_share``: a resample draws whole samples with all their (layer,
    head) units, and pools them exactly as :func:`pooled` does (token-weighted, ‖φ‖² in log
    space). Vectorised: one [R, S] index matrix, one gather per quantity."""
    settings = chance_settings()

    def cat(name):  # [S, units]
        return torch.cat([t[name][:, heads].to(torch.float64) for t in layer_terms], dim=1)
    n = cat("n_tokens")
    log_phi = torch.logsumexp(cat("log_phi_sq_mean") + n.log(), dim=1)  # [S]
    h, bessel, tokens = (cat("h_sq_mean") * n).sum(1), (cat("bessel_share") * n).sum(1), n.sum(1)
    idx = bootstrap_indices(n.shape[0], seed, settings.bootstrap_resamples)
    total = tokens[idx].sum(1)
    log_phi_r = torch.logsumexp(log_phi[idx], dim=1) - total.log()
    h_r = h[idx].sum(1) / total
    ratio = torch.where(h_r > 0, (h_r.clamp_min(1e-300).log() - log_phi_r) / math.log(10),
                        torch.full_like(h_r, -math.inf))
    return {name: [float(x) for x in percentile_interval(draws, settings.confidence,
                                                         n=int(n.shape[0]))]
            for name, draws in (("log10_ratio", ratio), ("bessel_share", bessel[idx].sum(1) / total))}


#: The metrics the ``ours`` rule set judges claim J by (method §3.6): the output fit's R², its
#: excess over the token-shuffled null, and the per-token magnitudes at the fit.
OURS_METRICS = ("output_r2", "output_r2_excess", "fit_median_log10_ratio", "fit_bessel_share")


def token_statistics(layer_terms: list[dict[str, torch.Tensor]], heads: list[int]) -> dict | None:
    """Per-token statistics of the given layers' selected heads, all their tokens pooled
    (method §3.7, :func:`checks.projection_tokens.token_ratio_summary`), and the per-token
    magnitudes at the output fit (method §3.6): ``fit_median_log10_ratio`` (median over tokens
    of log10 ‖h*‖²/‖φ‖²) and ``fit_bessel_share`` (share of tokens with ‖h*‖² ≤ ‖φ‖²). None when
    the terms carry no per-token tensors."""
    from checks.projection_tokens import log10_token_ratios, token_ratio_summary

    if "token_log_phi_sq" not in layer_terms[0]:
        return None

    def cat(name):
        return torch.cat([t[name][:, heads].reshape(-1) for t in layer_terms]).to(torch.float64)
    log_phi = cat("token_log_phi_sq")
    valid = torch.isfinite(log_phi)
    out = token_ratio_summary(log_phi, cat("token_h_sq"), valid)
    fit_h_sq = cat("token_fit_h_sq")
    fitted = valid & torch.isfinite(fit_h_sq)  # no fit where V̂ has < d columns (N < d)
    if not bool(fitted.any()):
        return out
    fit = log10_token_ratios(log_phi[fitted], fit_h_sq[fitted])
    out["fit_median_log10_ratio"] = float(fit.quantile(0.5))
    out["fit_bessel_share"] = float((fit <= 0).to(torch.float64).mean())
    return out


def output_fit_statistics(layer_terms: list[dict[str, torch.Tensor]], heads: list[int],
                          seed: int) -> dict | None:
    """The output fit's R² and its null over the given layers' selected heads (method §3.6):
    means over (sample, head) units, the excess (R² − null)/(1 − null), 95% bootstrap intervals
    over samples (whole samples, all their units together), and the tests against chance on the
    per-sample mean difference R² − null: the sign-flip test ("above chance") and the
    equivalence test ("at chance", margin ``[claim_j.ours.chance_margin.output_r2]`` of the room
    1 − null above the null, :func:`claims.verdicts.absolute_margin`), method §7.2: one test
    per record, so its adjusted p-values are the raw ones. None when the terms carry no output
    fit."""
    if "output_r2" not in layer_terms[0]:
        return None
    settings = chance_settings()
    r2 = torch.cat([t["output_r2"][:, heads] for t in layer_terms], dim=1).to(torch.float64)
    null = torch.cat([t["output_r2_null"][:, heads] for t in layer_terms], dim=1).to(torch.float64)
    fitted = torch.isfinite(r2).all(1) & torch.isfinite(null).all(1)  # NaN: N < d
    excluded = None
    if not bool(fitted.all()):
        excluded = _short_samples(layer_terms[0]["n_tokens"][:, heads[0]], ~fitted)
        if not bool(fitted.any()):
            return {"undetermined": excluded}
        r2, null = r2[fitted], null[fitted]
    per_sample = torch.stack([r2.mean(1), null.mean(1)], dim=1)  # [S, 2]
    mean = per_sample.mean(0)
    weights = bootstrap_weights(per_sample.shape[0], seed, settings.bootstrap_resamples)
    draws = (weights @ per_sample) / weights.sum(1, keepdim=True)  # [R, 2]
    excess = excess_over_null(draws[:, 0], draws[:, 1])
    ci = percentile_interval(torch.stack([draws[:, 0], draws[:, 1], excess], 1),
                             settings.confidence,
                             n=int(per_sample.shape[0])).tolist()  # none from one sample (§7)
    diff = (per_sample[:, 0] - per_sample[:, 1]).unsqueeze(1)
    margin = float(verdicts.absolute_margin(SECTION, "output_r2", float(mean[1])))
    p = float(above_pvalues(diff, None, seed)[0])
    p_tost = float(tost_p(diff, None, margin, seed)[0])
    return {"output_r2": float(mean[0]), "output_r2_null": float(mean[1]),
            "output_r2_excess": float(excess_over_null(float(mean[0]), float(mean[1]))),
            "ci": {"output_r2": ci[0], "output_r2_excess": ci[2]}, "ci_null": ci[1],
            "vs_null": chance_test(p, p, p_tost, p_tost, margin,
                                   verdicts.chance_margins(SECTION)["output_r2"],
                                   int(per_sample.shape[0])),
            **({"excluded": excluded} if excluded else {})}


def _short_samples(n_tokens: torch.Tensor, short: torch.Tensor) -> str:
    """Why the output fit leaves out the samples ``short`` (of fewer tokens than the head
    dimension: their V̂ has fewer than d columns, method §2)."""
    lo, hi = int(n_tokens[short].min()), int(n_tokens[short].max())
    return (f"{int(short.sum())} of {short.numel()} samples have fewer tokens than the head "
            f"dimension (N < d, N = {lo if lo == hi else f'{lo}..{hi}'}), so V_hat is not "
            "determined by the keys and the output fit is not defined for them (method §2)")


def _record(level: str, model: str, layer, values: dict, ci: dict | None = None,
            rules: str = "ours", tokens: dict | None = None, fit: dict | None = None,
            **extra) -> JRecord:
    metrics = {k: values[k] for k in J_METRICS}
    undefined = {k: r for k, r in values.get("undefined", {}).items()}  # method §6.2
    if ci:  # an interval only for a defined value, with finite bounds (method §6.2)
        ci = {k: b for k, b in ci.items() if metrics.get(k) is not None
              and (all(math.isfinite(float(x)) for x in b) or all(x != x for x in b))}
    at_chance = None
    short = fit.get("undetermined") if fit is not None else None
    if short is not None:  # no sample to fit: V̂ has fewer than d columns in every one
        fit = None
    min_room = float(verdicts.load_thresholds()[SECTION]["ours"]["min_room"])
    if short is not None:
        for name in OURS_METRICS:
            metrics[name] = None
            undefined[name] = short
        ci = {k: b for k, b in (ci or {}).items() if k not in OURS_METRICS}
    elif fit is not None and 1.0 - fit["output_r2_null"] < min_room:
        # the token-shuffled V̂ leaves no room above it: softmax·V spans whatever softmax·V̂
        # spans (attention of rank <= d), so the fit cannot tell (method §3.6)
        why = (f"the output fit cannot discriminate: the token-shuffled V_hat already explains "
               f"all but {1.0 - fit['output_r2_null']:.2g} of the output's variance (room "
               f"below [claim_j.ours] min_room = {min_room:g}), as happens when the attention "
               "matrix has rank <= d")
        for name in OURS_METRICS:
            metrics[name] = None
            undefined[name] = why
        ci = {k: b for k, b in (ci or {}).items() if k not in OURS_METRICS}
    elif fit is not None and tokens is not None:  # the ours rule set's metrics (method §3.6)
        metrics.update({"output_r2": fit["output_r2"], "output_r2_excess": fit["output_r2_excess"],
                        "fit_median_log10_ratio": tokens["fit_median_log10_ratio"],
                        "fit_bessel_share": tokens["fit_bessel_share"]})
        ci = {**(ci or {}), **fit["ci"]}
        at_chance = {"output_r2": bool(fit["vs_null"]["at_chance"])}
    else:
        for name in OURS_METRICS:
            metrics[name] = None
            undefined[name] = "no per-token terms or output fit in these layer terms"
    v, both = verdicts.judge_both(SECTION, metrics, ci, rules_name=rules, undefined=undefined,
                                  at_chance=at_chance)
    if tokens is not None:
        extra["tokens"] = tokens
    if fit is not None:
        extra["output_fit"] = {k: fit[k] for k in ("output_r2_null", "ci_null", "vs_null",
                                                    "excluded") if k in fit}
    return JRecord(claim="J", level=level, model=model, layer=layer,
                   verdict=v.verdict, verdicts=both, rules=rules, metrics=metrics,
                   p1_code={"log_phi_sq_mean": values["p1_log_phi_sq_mean"],
                            "log_mean_error": values["p1_log_mean_error"],
                            "label": "P1's logged quantity (p1-code variant), not the true loss"},
                   reference=verdicts.load_thresholds()["claim_j_reference"],
                   evidence=verdicts.format_evidence(v, ci=ci, both=both if ci else None),
                   ci=ci or None, undefined=undefined or None, reason=v.reason or None, **extra)


def layer_record(model: str, layer: int, terms: dict[str, torch.Tensor], heads: list[int],
                 rules: str = "ours") -> JRecord:
    per_head = {name: [pooled([terms], [h])[name] for h in heads]
                for name in J_METRICS}
    seed = seed_from(f"J-{model}-L{layer:02d}")
    ci = pooled_ci([terms], heads, seed)
    return _record("layer", model, layer, pooled([terms], heads), ci=ci, rules=rules,
                   tokens=token_statistics([terms], heads),
                   fit=output_fit_statistics([terms], heads, seed),
                   per_head=per_head, heads=heads)


def model_record(model: str, per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                 rules: str = "ours") -> JRecord:
    layers = sorted(per_layer)
    per_layer_values = [pooled([per_layer[l]], heads) for l in layers]
    seed = seed_from(f"J-{model}-model")
    terms = [per_layer[l] for l in layers]
    ci = pooled_ci(terms, heads, seed)
    tokens = token_statistics(terms, heads)
    if tokens is not None:  # the heavy tail per layer, for the report (method §3.7)
        tokens["per_layer"] = {name: [token_statistics([per_layer[l]], heads)[name] for l in layers]
                               for name in ("median_log10_ratio", "top_phi_share",
                                            "p2_appendix_log10_ratio")}
    return _record("model", model, None, pooled(terms, heads),
                   ci=ci, rules=rules, layers=layers, heads=heads,
                   tokens=tokens, fit=output_fit_statistics(terms, heads, seed),
                   per_layer={name: [v[name] for v in per_layer_values]
                              for name in ("phi_sq_mean", "h_sq_mean", "j_proj", "log10_ratio",
                                           "bessel_share")})


def fit_excess(point: dict) -> float | None:
    """The output fit's excess (R² − null)/(1 − null) of one checkpoint (method §3.6), or None
    when the checkpoint has no fit or its null leaves less room than ``[claim_j.ours] min_room``."""
    r2, null = point.get("output_r2"), point.get("output_r2_null")
    min_room = float(verdicts.load_thresholds()[SECTION]["ours"]["min_room"])
    if r2 is None or null is None or not (math.isfinite(r2) and math.isfinite(null)) \
            or 1.0 - null < min_room:
        return None
    return (r2 - null) / (1.0 - null)


def trend_record(series: str, points: list[dict], rules: str = "ours") -> JTrendRecord:
    """The trend verdict over an ordered series of checkpoints (method §3.4, P1 Fig. 1): `p2` on
    J_proj's sign and fall, `ours` on the rise of the output fit's excess over its null, which
    V's scale and basis cannot move; ``rules`` picks the record's verdict."""
    if rules not in verdicts.RULE_SETS:
        raise ValueError(f"unknown rule set {rules!r}; use one of {verdicts.RULE_SETS}")
    steps = torch.tensor([p["step"] for p in points], dtype=torch.float64)
    j = torch.tensor([p["j_proj"] for p in points], dtype=torch.float64)
    phi = torch.tensor([p["phi_sq_mean"] for p in points], dtype=torch.float64)
    h = torch.tensor([p["h_sq_mean"] for p in points], dtype=torch.float64)

    undefined: dict[str, str] = {}

    def rho(name, x):  # a constant series or a single checkpoint has no rho (method §6.2)
        def compute():
            if len(points) < 2:
                raise UndefinedValueError(f"Spearman's rho needs at least 2 checkpoints, got {len(points)}")
            return spearman_rho(x, steps)
        return defined(name, compute, undefined)

    att = term_attribution(phi, h)
    share = {name: float(att[name]) for name in ("share_phi", "share_h")}
    if not bool(att["defined"]):  # ΔJ = 0: no change to attribute (method §6.2), not shares of 0
        for name in share:
            undefined[name] = "J_proj is the same at the first and the last checkpoint"
        share = {name: None for name in share}
    carried = (None if share["share_h"] is None else
               "h" if abs(share["share_h"]) >= abs(share["share_phi"]) else "phi")
    trend = {"spearman_j": rho("spearman_j", j), "spearman_phi": rho("spearman_phi", phi),
             "spearman_h": rho("spearman_h", h),
             "delta_j": float(att["delta_j"]), "delta_phi": float(att["delta_phi"]),
             "delta_h": float(att["delta_h"]), **share, "carried_by": carried}
    metrics = {"min_j_proj": float(j.min()), "spearman_j": trend["spearman_j"]}
    excess = [fit_excess(p) for p in points]
    fitted = [(s_, e) for s_, e in zip(steps.tolist(), excess) if e is not None]
    if len(fitted) < 2:
        undefined["spearman_fit_excess"] = (
            f"the output fit's excess has a value at {len(fitted)} of {len(points)} checkpoints "
            "(no fit, or the null leaves no room: method §3.6); a trend needs 2")
        metrics["spearman_fit_excess"] = None
    else:
        ex = torch.tensor([e for _, e in fitted], dtype=torch.float64)
        st = torch.tensor([s_ for s_, _ in fitted], dtype=torch.float64)
        metrics["spearman_fit_excess"] = defined("spearman_fit_excess",
                                                 lambda: spearman_rho(ex, st), undefined)
    trend["fit_excess"] = excess
    p2 = verdicts.judge(TREND, {k: metrics[k] for k in ("min_j_proj", "spearman_j")},
                        undefined=undefined)
    ours = verdicts.judge_ours(TREND, metrics, {}, undefined=undefined)
    v = ours if rules == "ours" else p2
    ref = verdicts.load_thresholds()["claim_j_reference"]
    return JTrendRecord(
        claim="J", level="series", model=series,
        verdict=v.verdict, verdicts={"p2": p2.verdict, "ours": ours.verdict}, rules=rules,
        metrics=metrics, series=points, trend=trend, undefined=undefined or None,
        reason=v.reason or None, reference=ref, evidence=verdicts.format_evidence(v, extra={
            "share of dJ carried by ||h||^2": trend["share_h"],
            "share of dJ carried by ||phi||^2": trend["share_phi"]}))


def record_for_layer(run, model: str, layer: int, heads: list[int]) -> JRecord:
    """A layer test's record from its model run (``run.layer_metrics``, ``run.options.rules``)."""
    return layer_record(model, layer, run.layer_metrics("J", layer), heads,
                        rules=run.options.rules)


def record_for_model(run, model: str, layers: list[int], heads: list[int]) -> JRecord:
    """A model test's record from its model run, pooled over ``layers`` × ``heads``."""
    return model_record(model, {layer: run.layer_metrics("J", layer) for layer in layers}, heads,
                        rules=run.options.rules)


def trend_point(point) -> dict:
    """One checkpoint of a series as :func:`trend_record` reads it (P1 Fig. 1): J_proj's terms
    pooled over every layer and head, with the checkpoint's step, accuracy, loss and hash.
    ``point``: the series' checkpoint (``step``, ``run``, ``sidecar``, ``record_fields()``)."""
    info = point.run.prepare()
    terms = [point.run.layer_metrics("J", layer) for layer in range(info["n_layers"])]
    pooled_ = pooled(terms, list(range(info["n_heads"])))
    return {"step": point.step, **point.record_fields(),
            "test_accuracy": point.sidecar.get("test_accuracy"),
            "train_loss": point.sidecar.get("train_loss"),
            "checkpoint_hash": info["checkpoint_hash"],
            **{k: pooled_[k] for k in ("phi_sq_mean", "h_sq_mean", "j_proj", "bessel_share",
                                        "log10_ratio")},
            "p1_code_log_mean_error": pooled_["p1_log_mean_error"],
            **_pooled_fit(terms)}


def _pooled_fit(layer_terms: list[dict[str, torch.Tensor]]) -> dict:
    """The output fit's R² and its null, means over every fitted (sample, layer, head) of one
    checkpoint (method §3.6); None where the terms carry no fit."""
    if not layer_terms or "output_r2" not in layer_terms[0]:
        return {"output_r2": None, "output_r2_null": None}
    r2 = torch.cat([t["output_r2"].reshape(-1) for t in layer_terms]).to(torch.float64)
    null = torch.cat([t["output_r2_null"].reshape(-1) for t in layer_terms]).to(torch.float64)
    ok = torch.isfinite(r2) & torch.isfinite(null)
    if not bool(ok.any()):
        return {"output_r2": None, "output_r2_null": None}
    return {"output_r2": float(r2[ok].mean()), "output_r2_null": float(null[ok].mean())}


def record_for_series(name: str, points) -> tuple[JTrendRecord, object]:
    """A trend test's record over the checkpoints ``points`` of series ``name`` (taken one at a
    time), and the last checkpoint's run (its options and provenance go with the record)."""
    rows, run = [], None
    for point in points:
        rows.append(trend_point(point))
        run = point.run
    return trend_record(name, rows, rules=run.options.rules if run is not None else "ours"), run


def message(record: JRecord | JTrendRecord, what: str) -> str:
    m = record.metrics
    if record.level == "series":
        t = record.trend
        head = (f"claim J trend {record.verdict} for {what}: J_proj from "
                f"{record.series[0]['j_proj']:.4g} to {record.series[-1]['j_proj']:.4g} over "
                f"{len(record.series)} checkpoints; " + (
                    "J_proj did not change" if t["carried_by"] is None else
                    f"the change is carried by "
                    f"{'||h||^2' if t['carried_by'] == 'h' else '||phi(q)||^2'} "
                    f"(share {t['share_' + t['carried_by']]:.3g})"))
    else:
        num = verdicts.format_number
        ratio = verdicts.format_ci(m["log10_ratio"], record.ci_of("log10_ratio"))
        lo, hi = record.reference["p2_logs_log10_ratio_after_epoch_10"]  # [claim_j_reference]
        head = (f"claim J {record.verdict} for {what}: mean||phi(q)||^2 = {num(m['phi_sq_mean'])}, "
                f"mean||h||^2 = {num(m['h_sq_mean'])}, J_proj = {num(m['j_proj'])}, "
                f"log10 ratio = {ratio} (P2-logs: {lo}-{hi} after epoch 10)")
    return f"{head}\n{record.evidence}"
