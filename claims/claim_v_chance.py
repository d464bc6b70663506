"""Claim V's statistics over samples (method §7): the bootstrap intervals of the metrics' means
and their nulls', and the tests against chance (sign-flip, TOST) of metric − null."""

from __future__ import annotations

import math

import torch

from checks.stats import bootstrap_weights, excess_over_null, percentile_interval

from . import verdicts
from .chance import ChanceTest, above_pvalues, chance_settings, chance_test, tost_p
from .names import V_MEASURED as METRICS

SECTION = "claim_v"  # the section of claims/thresholds.toml that judges claim V


#: The metrics tested against their null (method §7.2): the judged subspace overlap, and P2's
#: CKAs for the record. Not the optimal cosine: its matching ignores token order, so against the
#: token-shuffled null V̂ it scores exactly what it scores against V̂ (method §2.3).
#: The top-weighted share (method §2.6) is tested too: the tier "partial" needs it above chance.
CHANCE_METRICS = ("linear_cka", "kernel_cka", "subspace_overlap", "top_weighted_share")


def interval_stats(metrics: dict[str, torch.Tensor], keep: torch.Tensor, seed: int,
                   per_unit: bool = False) -> dict | list[dict]:
    """95% percentile-bootstrap CIs over samples (method §7) of every metric's mean and its
    null's, and of the subspace-overlap excess (from the same resamples of overlap and null).

    ``metrics[name]`` and ``keep`` are [S, U]: S samples, U units per sample (the selected
    (layer, head) pairs of a model). Pooled (default): one interval set for the mean over all
    kept units, a resample drawing whole samples so each sample's heads stay together (model
    level). ``per_unit``: one interval set per unit (head level), all units sharing the resamples
    of ``seed``, so that the whole model costs one [R, S] × [S, units × metrics] product and a
    head's interval does not depend on which other heads are selected."""
    settings = chance_settings()
    level = settings.confidence
    names = [n for name in METRICS for n in (name, f"{name}_null")]
    k = keep.to(torch.float64)  # [S, U]
    values = torch.stack([metrics[n].to(torch.float64) for n in names], dim=-1)  # [S, U, M]
    weights = bootstrap_weights(k.shape[0], seed, settings.bootstrap_resamples)  # [R, S]
    if per_unit:
        sums = (weights @ (values * k.unsqueeze(-1)).reshape(k.shape[0], -1)).reshape(
            weights.shape[0], *values.shape[1:])  # [R, U, M]
        counts = (weights @ k).unsqueeze(-1)  # [R, U, 1]
    else:
        sums = (weights @ (values * k.unsqueeze(-1)).sum(1)).unsqueeze(1)  # [R, 1, M]
        counts = (weights @ k.sum(1, keepdim=True)).unsqueeze(-1)  # [R, 1, 1]
    draws = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, float("nan")))
    ov, ov_null = draws[..., names.index("subspace_overlap")], draws[..., names.index("subspace_overlap_null")]
    draws = torch.cat([draws, excess_over_null(ov, ov_null).unsqueeze(-1)], dim=-1)
    ci = percentile_interval(draws, level, n=int(k.shape[0])).tolist()  # [U, M + 1, 2]
    out = []
    for unit in ci:
        by_name = dict(zip([*names, "subspace_overlap_excess"], unit))
        out.append({"ci": {n: by_name[n] for n in (*METRICS, "subspace_overlap_excess")},
                    "ci_null": {n: by_name[f"{n}_null"] for n in METRICS}})
    return out if per_unit else out[0]


def equivalence_margins(metrics: dict[str, torch.Tensor], keep: torch.Tensor) -> torch.Tensor:
    """The margins of the equivalence test, [U, len(CHANCE_METRICS)] (NaN for a metric without
    one): ``[claim_v.ours.chance_margin]``'s share of each unit's room 1 − null, with the null's
    mean over the unit's kept samples (:func:`claims.verdicts.absolute_margin`, method §7.2)."""
    k = keep.to(torch.float64)  # [S, U]
    count = k.sum(0).clamp_min(1)
    shares = verdicts.chance_margins(SECTION)
    cols = []
    for name in CHANCE_METRICS:
        null_mean = (metrics[f"{name}_null"].to(torch.float64) * k).sum(0) / count  # [U]
        cols.append(verdicts.absolute_margin(SECTION, name, null_mean) if name in shares
                    else torch.full_like(null_mean, math.nan))
    return torch.stack(cols, dim=-1)


def chance_pvalues(metrics: dict[str, torch.Tensor], keep: torch.Tensor, seed: int,
                   equivalence: bool = False) -> torch.Tensor:
    """One-sided sign-flip p-values (method §7, :func:`checks.stats.sign_flip_pvalues`) of
    metric − null over samples, [U, len(CHANCE_METRICS)], for ``metrics`` [S, U] (each unit's
    kept samples). ``equivalence``: the p-values of the equivalence test "at chance" instead
    (TOST with the margins of :func:`equivalence_margins`, :func:`checks.nulls.tost_pvalues`;
    a metric without a margin gets p = 1)."""
    diffs = torch.stack([metrics[m].to(torch.float64) - metrics[f"{m}_null"].to(torch.float64)
                         for m in CHANCE_METRICS], dim=-1)  # [S, U, M]
    s, u, m = diffs.shape
    mask = keep.unsqueeze(-1).expand(s, u, m).reshape(s, u * m)
    if not equivalence:
        return above_pvalues(diffs.reshape(s, u * m), mask, seed).reshape(u, m)
    margin = equivalence_margins(metrics, keep).reshape(u * m)
    missing = torch.isnan(margin)
    p = tost_p(diffs.reshape(s, u * m), mask, torch.nan_to_num(margin), seed)
    return torch.where(missing, torch.ones_like(p), p).reshape(u, m)


def vs_null_record(p: torch.Tensor, p_adjusted: torch.Tensor, n_kept: int,
                   tost: torch.Tensor, tost_adjusted: torch.Tensor,
                   margins: torch.Tensor | None = None) -> dict[str, ChanceTest]:
    """``{metric: ChanceTest}`` (:func:`claims.chance.chance_test`) of :data:`CHANCE_METRICS`
    from their p-values [len(CHANCE_METRICS)] against chance and of the equivalence test, raw
    and adjusted, with ``n_kept`` samples and the absolute margins ``margins``
    (:func:`equivalence_margins`; None: none). "Not above chance" is never read as "at chance":
    only the equivalence test says that (method §7.2)."""
    shares = verdicts.chance_margins(SECTION)
    return {m: chance_test(p[i], p_adjusted[i], tost[i], tost_adjusted[i],
                           None if margins is None else margins[i], shares.get(m), n_kept)
            for i, m in enumerate(CHANCE_METRICS)}
