"""Claim E's γ statistics over samples (method §4.2, §7): the invariant-subspace summary of a
head, the tests against chance of its residuals, and the bootstrap intervals of the γ spreads
and of the γ position, every head of a layer at once."""

from __future__ import annotations

import math

import torch

from checks.errors import UndefinedValueError, defined
from checks.stats import bootstrap_weights, masked_mean, percentile_interval, position_between

from . import verdicts
from .chance import ChanceTest, above_pvalues, adjusted, chance_settings, chance_test, tost_p

GAMMA = "claim_e_gamma"
#: The true eigenvectors' relative γ spread in exact arithmetic, the anchor of the per-column γ
#: position (method §4.2, "Precision"). The measured spread of the eigen control is the
#: eigensolver's round-off amplified by 1/(μ_k·â_ik) (up to 3e-3 on heads with a graded
#: spectrum): it only decides whether there is a contrast at all (the perturbed control above it).
#: ρ's and ω's positions are anchored at the eigen control as measured: they judge span([Â, h])
#: (the value bias's direction h = g − ḡ included), whose value for the true eigenvectors,
#: span([A, h]), is not 0 but is computed to round-off (ρ of an exact eigenbasis is ~1e-15).
EXACT_EIGEN = 0.0


def imprecise_overlaps(t: dict[str, torch.Tensor], head: int, keep: torch.Tensor,
                       subspace: dict, undefined: dict[str, str]) -> dict[str, float]:
    """The direction overlaps ω of ``subspace`` that are not determined at float64 (method §4.2,
    "Precision"): where round-off alone moves ω of a kept sample by more than
    :data:`checks.gamma_precision.OVERLAP_PRECISION_BAR` (``gamma_<name>_directions_precision``), that
    candidate's mean ω is taken out of ``subspace["directions"]`` and returned (``{"learned": ω,
    "null": ω}``, either or both), and the positions built on it become undefined: the head's
    ``gamma_direction_position`` (with its reason in ``undefined``) for the learned axes, the null's
    own direction position for the null."""
    from checks.gamma_precision import OVERLAP_PRECISION_BAR

    out: dict[str, float] = {}
    for name in ("learned", "null"):
        key = f"gamma_{name}_directions_precision"
        if key not in t or name not in subspace["directions"]:
            continue
        moved = t[key][:, head].to(torch.float64)[keep]
        n_bad = int((moved > OVERLAP_PRECISION_BAR).sum())
        if n_bad == 0:
            continue
        out[name] = subspace["directions"].pop(name)
        if name == "learned":
            subspace["directions"]["position"] = None
            undefined["gamma_direction_position"] = (
                f"omega of the learned axes is not determined at float64 in {n_bad} of "
                f"{int(keep.sum())} samples: round-off alone moves it by more than "
                f"{OVERLAP_PRECISION_BAR:g} (few tokens carry g, so span(A_hat) or its image has "
                "directions at round-off; method §4.2)")
        elif subspace.get("null_positions") is not None:
            subspace["null_positions"]["gamma_direction_position"] = None
    return out


def subspace_summary(t: dict[str, torch.Tensor], head: int, keep: torch.Tensor) -> dict | None:
    """Means over the kept samples of the invariant-subspace residuals ρ of the learned axes and
    the two controls, and the learned axes' position between them (method §4.2); the same for
    the direction-wise overlap ω under ``"directions"`` (its position on 1 − ω); and, when the
    tensors carry the token-shuffled null, ρ of the null (``"null"``) and both positions the null
    itself takes (``"null_positions"`` → ``{"gamma_subspace_position",
    "gamma_direction_position"}``).
    None when the tensors carry no residuals. ``"undefined"`` holds the reasons when the controls
    coincide."""
    if "gamma_learned_subspace" not in t:
        return None
    names = ("learned", "eigen", "perturbed") + (("null",) if "gamma_null_subspace" in t else ())

    def mean(key: str) -> float:
        return float(masked_mean(t[key][:, head].to(torch.float64), keep)[0])

    means = {name: mean(f"gamma_{name}_subspace") for name in names}
    has_directions = "gamma_learned_directions" in t
    directions = ({name: mean(f"gamma_{name}_directions") for name in names} if has_directions
                  else {})
    undefined: dict[str, str] = {}

    def between(metric: str, values: dict, what: str, who: str = "learned") -> float | None:
        def contrast() -> float:  # anchored at the measured span([A, h]) (see EXACT_EIGEN)
            if not values["perturbed"] > values["eigen"]:
                raise UndefinedValueError(f"the perturbed control's {what} does not exceed the "
                                          "true eigenvectors': no contrast to judge by")
            return position_between(values[who], values["eigen"], values["perturbed"])
        return defined(metric, contrast, undefined if who == "learned" else {})

    loss = {name: 1.0 - x for name, x in directions.items()}  # 1 − ω: 0 when invariant
    out = {**means, "position": between("gamma_subspace_position", means, "subspace residual"),
           "directions": dict(directions), "null_positions": None, "undefined": undefined}
    if has_directions:
        out["directions"]["position"] = between("gamma_direction_position", loss,
                                                "direction-wise non-invariance 1 - omega")
    else:
        out["directions"]["position"] = None
        undefined["gamma_direction_position"] = "no direction-wise overlaps in these tensors"
    if "null" in means:
        out["null_positions"] = {
            "gamma_subspace_position": between("gamma_subspace_position", means,
                                               "subspace residual", "null"),
            "gamma_direction_position": (between("gamma_direction_position", loss,
                                                 "direction-wise non-invariance", "null")
                                         if has_directions else None),
        }
    return out


def chance_tests(t: dict[str, torch.Tensor], keep: torch.Tensor,
                 seed: int) -> list[ChanceTest]:
    """γ's tests against chance for every head of a layer (method §4.2, §7.2), on the per-sample
    difference of invariant-subspace residuals ρ(null) − ρ(learned) over the kept samples
    (``keep`` [S, H]): *above chance* (one-sided sign-flip test: the learned span is more nearly
    invariant than the token-shuffled values' span) and *at chance* (TOST with margin
    ``[claim_e_gamma.ours.chance_margin.gamma_subspace_residual]`` of the room between the
    null's mean residual and the true eigenvectors' (ρ of span([A, h]), the least a span can
    have once the value bias's direction is in it), :func:`claims.verdicts.absolute_margin`),
    both adjusted across the layer's heads (``[rule_sets.ours].correction``)."""
    diff = (t["gamma_null_subspace"] - t["gamma_learned_subspace"]).to(torch.float64)  # [S, H]
    k = keep.to(torch.float64)

    def mean(name: str) -> torch.Tensor:
        return (t[f"gamma_{name}_subspace"].to(torch.float64) * k).sum(0) / k.sum(0).clamp_min(1)

    room = mean("null") - mean("eigen")                                  # [H]
    margin = verdicts.absolute_margin(GAMMA, "gamma_subspace_residual", room)  # [H]
    share = float(verdicts.chance_margins(GAMMA)["gamma_subspace_residual"])
    p = above_pvalues(diff, keep, seed)
    tost = tost_p(diff, keep, margin, seed + 1)
    p_adj, tost_adj = adjusted(p), adjusted(tost)
    n = keep.sum(0)
    return [chance_test(p[h], p_adj[h], tost[h], tost_adj[h], margin[h], share, int(n[h]))
            for h in range(diff.shape[1])]


def gamma_ci(t: dict[str, torch.Tensor], keep: torch.Tensor, seed: int,
             cache: dict | None = None, measured_anchor: bool = False) -> list[dict]:
    """95% percentile-bootstrap CIs over samples (method §7) of the γ-spread means and of the γ
    position recomputed from each resample's three means, for every head of a layer at once
    (``keep`` [S, H]: the samples each head's means use), all heads sharing the resamples of
    ``seed``: one [R, S] × [S, H·3] product per layer.

    ``cache``: a dict owned by the caller in which ``seed`` names one layer's fixed tensors (a
    model run's ``statistics``: the seed names model and layer), where the result is kept under
    (seed, ``keep``, rule-set settings), so that a layer's head tests share one pass; None:
    computed afresh. ``measured_anchor``: the position is anchored at each resample's mean eigen
    control (ρ's and ω's positions), not at :data:`EXACT_EIGEN` (the spread's)."""
    settings = chance_settings()
    key = ("E-gamma-ci", seed, keep.numpy().tobytes(), settings, measured_anchor)
    if cache is not None and key in cache:
        return cache[key]
    level = settings.confidence
    k = keep.to(torch.float64)  # [S, H]
    values = torch.stack([t[f"gamma_{name}"].to(torch.float64)
                          for name in ("learned", "eigen", "perturbed")], dim=-1)  # [S, H, 3]
    weights = bootstrap_weights(k.shape[0], seed, settings.bootstrap_resamples)
    sums = (weights @ (values * k.unsqueeze(-1)).reshape(k.shape[0], -1)).reshape(
        weights.shape[0], *values.shape[1:])
    counts = (weights @ k).unsqueeze(-1)
    draws = torch.where(counts > 0, sums / counts.clamp_min(1), torch.full_like(sums, math.nan))
    # a contrast needs the perturbed control above the measured eigen control; the position is
    # then anchored at the exact eigenvectors' value (method §4.2, "Precision")
    anchor = draws[..., 1] if measured_anchor else EXACT_EIGEN
    gap = draws[..., 2] - anchor
    position = torch.where(draws[..., 2] > draws[..., 1],
                           (draws[..., 0] - anchor) / gap.clamp_min(1e-300),
                           torch.full_like(gap, math.inf))
    ci = percentile_interval(torch.cat([draws, position.unsqueeze(-1)], dim=-1), level,
                             n=int(k.shape[0])).tolist()
    out = [dict(zip(("learned", "eigen", "perturbed", "gamma_position"), head)) for head in ci]
    if cache is not None:
        cache[key] = out
    return out
