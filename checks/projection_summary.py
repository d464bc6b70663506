"""Claim J's summaries (method §3): per-head terms pooled into one set of quantities, and their
trend over a training series.

This module owns the reductions of :mod:`checks.projection`'s per-head token means:
:func:`pooled_terms` pools them over heads (and layers), weighting each head by its token count,
into mean ‖φ‖² (in log space), mean ‖h‖², J_proj, P2's log10 magnitude ratio, the Bessel share and
P1's logged value, with every quantity that has no finite value reported as None with its reason
(method §6.2); :func:`spearman_rho` (with :func:`average_ranks`) and :func:`term_attribution` work
on an ordered series of checkpoints (method §3, Trend).
"""

from __future__ import annotations

import math

import torch

from .errors import UndefinedValueError, defined


def _check_series(*series: torch.Tensor, names: tuple[str, ...]) -> None:
    """Raise ValueError unless the series share a shape [..., T] with T ≥ 2 and are finite."""
    shape = series[0].shape
    for x, name in zip(series, names):
        if x.ndim < 1 or x.shape[-1] < 2:
            raise ValueError(f"{name} must be an ordered series [..., T] with T ≥ 2, got {tuple(x.shape)}")
        if x.shape != shape:
            raise ValueError(f"{names[0]} {tuple(shape)} and {name} {tuple(x.shape)} must have the same shape")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or Inf")


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 1..T along the last axis, ties given their average rank (as scipy's rankdata).

    >>> average_ranks(torch.tensor([10.0, 30.0, 20.0, 20.0])).tolist()
    [1.0, 4.0, 2.5, 2.5]
    """
    less = (x.unsqueeze(-2) < x.unsqueeze(-1)).sum(-1)
    equal = (x.unsqueeze(-2) == x.unsqueeze(-1)).sum(-1)
    return less.to(torch.float64) + (equal.to(torch.float64) + 1.0) / 2.0


def spearman_rho(values: torch.Tensor, steps: torch.Tensor) -> float:
    """Spearman's ρ between a series [T] and its training steps [T] (method §3, Trend).

    The Pearson correlation of the average ranks (ties averaged). ρ < 0 means the series falls
    with training. Raises ValueError for T < 2, non-finite entries, or a constant series (ρ is
    undefined when either set of ranks has zero variance: :class:`checks.errors.UndefinedValueError`,
    method §6.2).

    >>> steps = torch.arange(5.0, dtype=torch.float64)
    >>> spearman_rho(torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0], dtype=torch.float64), steps)
    -1.0
    >>> spearman_rho(torch.tensor([1.0, 2.0, 2.0, 3.0, 9.0], dtype=torch.float64), steps) > 0.9
    True
    """
    if values.ndim != 1 or steps.ndim != 1:
        raise ValueError(f"values and steps must be 1-D series [T]; got {tuple(values.shape)}, "
                         f"{tuple(steps.shape)}")
    _check_series(values, steps, names=("values", "steps"))
    rv = average_ranks(values.to(torch.float64))
    rs = average_ranks(steps.to(torch.float64))
    rv, rs = rv - rv.mean(), rs - rs.mean()
    denom = torch.sqrt((rv * rv).sum() * (rs * rs).sum())
    if float(denom) == 0.0:
        raise UndefinedValueError("Spearman's rho is undefined: the series or its steps are constant "
                                  "(zero variance of the ranks, method §6.2)")
    return float((rv * rs).sum() / denom)


def term_attribution(phi_sq_means: torch.Tensor,
                     h_sq_means: torch.Tensor) -> dict[str, torch.Tensor]:
    """Which term of J_proj = ‖φ‖² − ‖h‖² carries its change over a series (method §3, Trend).

    ``phi_sq_means`` and ``h_sq_means`` are [..., T]: mean ‖φ(q)‖² and mean ‖h‖² per checkpoint,
    in training order. With Δx = x_last − x_first:
    ΔJ = Δφ − Δh; share_phi = Δφ/ΔJ and share_h = −Δh/ΔJ, which sum to 1.

    When ΔJ = 0 exactly the shares are undefined: both are reported as 0.0 and "defined" is False
    (never NaN). All entries are tensors of shape [...] (0-d for one series): "j_first",
    "j_last", "delta_j", "delta_phi", "delta_h", "share_phi", "share_h", "defined" (bool).

    ‖h‖² falls from 5 to 2 while ‖φ‖² stays at 1: J rises by 3, all of it carried by ‖h‖²:

    >>> att = term_attribution(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([5.0, 3.0, 2.0]))
    >>> float(att["delta_j"]), float(att["share_h"]), float(att["share_phi"])
    (3.0, 1.0, 0.0)
    """
    _check_series(phi_sq_means, h_sq_means, names=("phi_sq_means", "h_sq_means"))
    phi = phi_sq_means.to(torch.float64)
    h = h_sq_means.to(torch.float64)
    j = phi - h  # method §3, J_proj per checkpoint
    d_phi = phi[..., -1] - phi[..., 0]
    d_h = h[..., -1] - h[..., 0]
    d_j = d_phi - d_h  # = J_last − J_first, written so that the two shares sum to 1
    defined = d_j != 0
    safe = torch.where(defined, d_j, torch.ones_like(d_j))
    zero = torch.zeros_like(d_j)
    return {
        "j_first": j[..., 0],
        "j_last": j[..., -1],
        "delta_j": d_j,
        "delta_phi": d_phi,
        "delta_h": d_h,
        "share_phi": torch.where(defined, d_phi / safe, zero),
        "share_h": torch.where(defined, -d_h / safe, zero),
        "defined": defined,
    }


def _exp(log_value: float, what: str) -> float:
    """exp(log_value), or :class:`UndefinedValueError` when it is not a finite float64."""
    try:
        return math.exp(log_value)
    except OverflowError:
        raise UndefinedValueError(f"{what} = exp({log_value:.6g}) exceeds the float64 range "
                                  "(method §6.2)") from None


def _log10_ratio(h: float, log_phi: float) -> float:
    """log10(h / exp(log_phi)) for a mean ‖h‖² h ≥ 0, in log space."""
    if not h > 0:
        raise UndefinedValueError("log10(mean ||h||^2 / mean ||phi(q)||^2) is undefined: mean "
                                  "||h||^2 is 0 (all value vectors zero; method §6.2)")
    return (math.log(h) - log_phi) / math.log(10)


def _p1_log_mean_error(h: float, log_p1: float) -> float:
    """log(φ̄_p1 − h̄) = log φ̄_p1 + log(1 − h̄/φ̄_p1), with h̄/φ̄_p1 taken in log space."""
    if h > 0 and math.log(h) - log_p1 >= 0 or not math.isfinite(log_p1):
        raise UndefinedValueError("P1's logged value log(mean(||phi||^2_p1 - ||h||^2)) is undefined: "
                                  "the mean error is <= 0 (method §6.2)")
    frac = math.exp(math.log(h) - log_p1) if h > 0 else 0.0
    return log_p1 + math.log1p(-frac)


def pooled_terms(log_phi_sq_mean: torch.Tensor, h_sq_mean: torch.Tensor,
                 bessel: torch.Tensor, n_tokens: torch.Tensor,
                 p1_log_phi_sq_mean: torch.Tensor | None = None) -> dict:
    """Pool per-head token means (any shape, e.g. [samples, heads] or [samples, layers, heads])
    into one set of method §3 quantities, weighting each head by its token count.

    mean‖φ‖² is pooled in log space (it can underflow per token); J_proj = mean‖φ‖² − mean‖h‖²
    (method §3.1); log10_ratio = log10(mean‖h‖²/mean‖φ‖²) (P2's magnitude, method §3.2); the Bessel
    share is the share of all tokens with ‖h_i‖² ≤ ‖φ(q_i)‖². With ``p1_log_phi_sq_mean``, also
    P1's logged quantity log(mean(‖φ‖²_p1 − ‖h‖²)) ("p1-code", see
    :func:`checks.projection.log_phi_sq_norm_p1_code`).

    A quantity without a finite value (mean‖φ‖² beyond the float64 range, a zero mean‖h‖² under
    the log, a non-positive mean error under P1's log) is None, and ``"undefined"`` maps its name
    to the reason (method §6.2); all other entries are finite floats.

    >>> one = torch.ones(2, 3, dtype=torch.float64)
    >>> out = pooled_terms(torch.log(one), 100 * one, one, one)
    >>> out["log10_ratio"], out["j_proj"], out["undefined"]
    (2.0, -99.0, {})
    >>> pooled_terms(torch.log(one), 0 * one, one, one)["log10_ratio"] is None
    True
    """
    n = n_tokens.to(torch.float64).reshape(-1)
    total = n.sum()
    if total <= 0:
        raise ValueError("no tokens to pool")
    log_n = n.log()
    log_phi = float(torch.logsumexp(log_phi_sq_mean.reshape(-1) + log_n, 0) - total.log())
    h = float((h_sq_mean.reshape(-1) * n).sum() / total)
    why: dict[str, str] = {}
    phi = defined("phi_sq_mean", lambda: _exp(log_phi, "mean ||phi(q)||^2"), why)
    out = {
        "phi_sq_mean": phi,
        "log_phi_sq_mean": log_phi,
        "h_sq_mean": h,
        "bessel_share": float((bessel.reshape(-1) * n).sum() / total),
        "log10_ratio": defined("log10_ratio", lambda: _log10_ratio(h, log_phi), why),
    }
    if phi is None:
        why["j_proj"] = f"J_proj = mean ||phi||^2 - mean ||h||^2 has no value: {why['phi_sq_mean']}"
    out["j_proj"] = None if phi is None else phi - h
    if p1_log_phi_sq_mean is not None:
        log_p1 = float(torch.logsumexp(p1_log_phi_sq_mean.reshape(-1) + log_n, 0) - total.log())
        out["p1_log_phi_sq_mean"] = log_p1
        out["p1_log_mean_error"] = defined("p1_log_mean_error",
                                           lambda: _p1_log_mean_error(h, log_p1), why)
    out["undefined"] = why
    return out
