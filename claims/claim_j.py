"""Claim J (method §3): per-layer and per-model J_proj magnitudes, and the trend over training."""

from __future__ import annotations

import math

import torch

from checks.errors import UndefinedValueError, defined
from checks.projection_summary import pooled_terms, spearman_rho, term_attribution
from checks.stats import bootstrap_indices, percentile_interval, seed_from

from . import verdicts
from .names import J_METRICS
from .records import JRecord, JTrendRecord

CLAIM, TREND = "claim_j", "claim_j_trend"


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
    settings = verdicts.rule_set_settings()

    def cat(name):  # [S, units]
        return torch.cat([t[name][:, heads].to(torch.float64) for t in layer_terms], dim=1)
    n = cat("n_tokens")
    log_phi = torch.logsumexp(cat("log_phi_sq_mean") + n.log(), dim=1)  # [S]
    h, bessel, tokens = (cat("h_sq_mean") * n).sum(1), (cat("bessel_share") * n).sum(1), n.sum(1)
    idx = bootstrap_indices(n.shape[0], seed, int(settings["bootstrap_resamples"]))
    total = tokens[idx].sum(1)
    log_phi_r = torch.logsumexp(log_phi[idx], dim=1) - total.log()
    h_r = h[idx].sum(1) / total
    ratio = torch.where(h_r > 0, (h_r.clamp_min(1e-300).log() - log_phi_r) / math.log(10),
                        torch.full_like(h_r, -math.inf))
    level = float(settings["confidence"])
    return {name: [float(x) for x in percentile_interval(draws, level, n=int(n.shape[0]))]
            for name, draws in (("log10_ratio", ratio), ("bessel_share", bessel[idx].sum(1) / total))}


def _record(level: str, model: str, layer, values: dict, ci: dict | None = None,
            rules: str = "ours", **extra) -> JRecord:
    metrics = {k: values[k] for k in J_METRICS}
    undefined = {k: r for k, r in values.get("undefined", {}).items()}  # method §6.2
    if ci:  # an interval only for a defined value, with finite bounds (method §6.2)
        ci = {k: b for k, b in ci.items() if metrics.get(k) is not None
              and (all(math.isfinite(float(x)) for x in b) or all(x != x for x in b))}
    v, both = verdicts.judge_both(CLAIM, metrics, ci, rules_name=rules, undefined=undefined)
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
    ci = pooled_ci([terms], heads, seed_from(f"J-{model}-L{layer:02d}"))
    return _record("layer", model, layer, pooled([terms], heads), ci=ci, rules=rules,
                   per_head=per_head, heads=heads)


def model_record(model: str, per_layer: dict[int, dict[str, torch.Tensor]], heads: list[int],
                 rules: str = "ours") -> JRecord:
    layers = sorted(per_layer)
    per_layer_values = [pooled([per_layer[l]], heads) for l in layers]
    ci = pooled_ci([per_layer[l] for l in layers], heads, seed_from(f"J-{model}-model"))
    return _record("model", model, None, pooled([per_layer[l] for l in layers], heads),
                   ci=ci, rules=rules, layers=layers, heads=heads,
                   per_layer={name: [v[name] for v in per_layer_values]
                              for name in ("phi_sq_mean", "h_sq_mean", "j_proj", "log10_ratio",
                                           "bessel_share")})


def trend_record(series: str, points: list[dict]) -> JTrendRecord:
    """The trend verdict over an ordered series of checkpoints (method §3, P1 Fig. 1)."""
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
    v = verdicts.judge(TREND, metrics, undefined=undefined)
    ref = verdicts.load_thresholds()["claim_j_reference"]
    return JTrendRecord(
        claim="J", level="series", model=series,
        verdict=v.verdict, verdicts={r: v.verdict for r in verdicts.RULE_SETS},
        metrics=metrics, series=points, trend=trend, undefined=undefined or None,
        reason=v.reason or None, reference=ref, evidence=verdicts.format_evidence(v, extra={
            "share of dJ carried by ||h||^2": trend["share_h"],
            "share of dJ carried by ||phi||^2": trend["share_phi"]}))


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

# ------------------------------------------------------------------ per-layer computation
# Called by the session through the claim's spec (claims/builtin.py): ``layer_metrics(ctx)`` with
# a fixtures.model_run.LayerContext. Moved from fixtures/session.py (ModelRun._compute_claim_j).
def layer_metrics(ctx) -> dict[str, torch.Tensor]:
    """Claim-J terms of every (sample, head) of one layer, [B, H]: token means of ‖φ‖² (also
    in log space) and ‖h‖², J_proj, the Bessel share, the token count, and the p1-code ‖φ‖²."""
    from checks.errors import NonFiniteError
    from checks.gram import standardize_tokens
    from checks.projection import log_phi_sq_norm_p1_code, projection_terms_batched

    info = ctx.info
    dtype = ctx.options.torch_dtype
    out: dict[str, torch.Tensor] = {}
    for chunk, heads, q, k, v in ctx.groups():
        try:
            exact = projection_terms_batched(q, k, v, scale=info["scale"],
                                             standardize=ctx.options.standardize,
                                             dtype=dtype)
            # The p1-code variant differs from the exact terms only in ‖φ‖² (h is the same):
            # its log ‖φ‖² alone, on the same (cast, standardised) q and k, not the whole set.
            qd, kd = q.to(dtype), k.to(dtype)
            if ctx.options.standardize:
                qd, kd = standardize_tokens(qd), standardize_tokens(kd)
            p1 = {"log_phi_sq": log_phi_sq_norm_p1_code(qd, kd, info["scale"])}
        except NonFiniteError as exc:
            raise ctx.located(exc, chunk, heads) from exc
        n_tok = q.shape[-2]
        ctx.fill(out, chunk, heads, {
            # log of the token mean of ‖φ‖², exact even where ‖φ‖² underflows
            "log_phi_sq_mean": torch.logsumexp(exact["log_phi_sq"], -1) - math.log(n_tok),
            "phi_sq_mean": exact["phi_sq"].mean(-1),
            "h_sq_mean": exact["h_sq"].mean(-1),
            "j_proj": exact["j_proj"],
            "bessel_share": exact["bessel_share"],
            "n_tokens": torch.full(exact["j_proj"].shape, float(n_tok)),
            "p1_log_phi_sq_mean": torch.logsumexp(p1["log_phi_sq"], -1) - math.log(n_tok),
        })
    return out
