"""Claim V's tier "partial" (method §2.6): a head that shares some of V̂'s top directions near-
exactly, more than chance gives and more than the same architecture does at random
initialisation.

The judged number is the top-weighted share s (:func:`checks.leading_directions.shared_directions`:
the share of V̂'s eigenvalue mass carried by the directions span(V) shares with span(V̂) at
cos² ≥ 0.9); beside it the count k of those directions ("k of d shared"). A head is *partial*
under the ``ours`` rules when it is not supported and both one-sided sign-flip tests over its
samples reject, after the run's correction across the model's selected heads:

- s above its null (ΠV̂, exchangeable with V̂ when V carries no KPCA structure: method §2.3);
- s above the random-init twin's head of the same index on the same samples (exchangeable with
  the model's head when training added nothing: method §2.6), the twin being the same
  architecture at a seeded random initialisation (``ClaimSpec.init_twin``).

Both are needed: every random-init head of the default models already shares more top directions
with its V̂ than its null does (V = X·W_V shares X with the keys), so "above the null" alone
would call an untrained model partial. Where a model has no twin, the tier is not judged.
"""

from __future__ import annotations

import torch

from checks.stats import masked_mean

from . import verdicts
from .chance import above_pvalues, adjusted, chance_settings, smallest_p

#: The judged number, the count shown beside it, and the suffix of the twin's values.
JUDGED, COUNT, TWIN = "top_weighted_share", "shared_directions", "_init_twin"


def has_twin(metrics: dict) -> bool:
    """Whether per-layer (or stacked) metrics carry the random-init twin's values."""
    return f"{JUDGED}{TWIN}" in metrics


def twin_pvalues(metrics: dict[str, torch.Tensor], keep: torch.Tensor, seed: int) -> torch.Tensor:
    """One-sided sign-flip p-values [U] of mean(s − s_twin) > 0 over each unit's kept samples,
    for ``metrics`` [S, U] (the unit's head paired with the twin's head of the same index)."""
    diff = metrics[JUDGED].to(torch.float64) - metrics[f"{JUDGED}{TWIN}"].to(torch.float64)
    return above_pvalues(diff, keep, seed)


def vs_twin_record(p: float, p_adjusted: float, n_kept: int) -> dict:
    """The record of the test against the random-init twin (method §2.6)."""
    alpha = chance_settings().alpha
    return {"metric": JUDGED, "p": float(p), "p_adjusted": float(p_adjusted),
            "above_twin": bool(p_adjusted <= alpha), "n_samples": int(n_kept),
            "p_floor": smallest_p(n_kept),
            "method": "one-sided sign-flip test over samples of the top-weighted share minus "
                      "the random-init twin's (same head index, same inputs), corrected as the "
                      "tests against chance (method §2.6, §7.2)"}


def head_tests(stacked: dict[str, torch.Tensor], keep: torch.Tensor,
               seed: int) -> list[dict] | None:
    """Per unit of ``stacked`` [S, U], the test against the twin with the run's correction
    across the units; None without twin values."""
    if not has_twin(stacked):
        return None
    p = twin_pvalues(stacked, keep, seed)
    p_adj = adjusted(p.unsqueeze(0))[0]
    n_kept = keep.sum(0)
    return [vs_twin_record(p[i], p_adj[i], int(n_kept[i])) for i in range(p.shape[0])]


def model_test(grid: dict[str, torch.Tensor], keep2: torch.Tensor, seed: int) -> dict | None:
    """The model's test against the twin: one sign-flip test over samples of the per-sample
    mean over its (layer, head) units (as the model's test against chance, method §7.2)."""
    if not has_twin(grid):
        return None
    k = keep2.to(torch.float64)
    count = k.sum(1, keepdim=True)
    per_sample = {n: (grid[n].to(torch.float64) * k).sum(1, keepdim=True)
                  / count.clamp_min(1) for n in (JUDGED, f"{JUDGED}{TWIN}")}
    p = float(twin_pvalues(per_sample, count > 0, seed)[0])
    return vs_twin_record(p, p, int((count > 0).sum()))


def summary(flat: dict[str, torch.Tensor], keep: torch.Tensor) -> dict | None:
    """The twin's means of the judged share and of the count over the kept samples, for the
    record (``init_twin``); None without twin values."""
    if not has_twin(flat):
        return None
    return {name: float(masked_mean(flat[f"{name}{TWIN}"].to(torch.float64), keep)[0])
            for name in (JUDGED, COUNT)}


def apply(verdict: str, vs_null: dict | None, vs_twin: dict | None) -> tuple[str, str]:
    """The ``ours`` verdict with the tier: ``(verdict, reason)``. A verdict that is not
    supported nor undetermined becomes partial when the judged share is above chance and above
    the twin (both adjusted); ``reason`` says why, or why not where the tier was judged."""
    if verdict in (verdicts.SUPPORTED, verdicts.UNDETERMINED):
        return verdict, ""
    if vs_twin is None:
        return verdict, "partial not judged: no random-init twin (method §2.6)"
    test = (vs_null or {}).get(JUDGED)
    above_null = bool(test and test.get("above_chance"))
    if above_null and vs_twin["above_twin"]:
        return verdicts.PARTIAL, (
            f"partial: its top-weighted share is above chance (adjusted p "
            f"{test['p_adjusted']:.3g}) and above its random-init twin's (adjusted p "
            f"{vs_twin['p_adjusted']:.3g}) (method §2.6)")
    why = [] if above_null else ["not above chance"]
    if not vs_twin["above_twin"]:
        why.append(f"not above its random-init twin (adjusted p {vs_twin['p_adjusted']:.3g})")
    return verdict, f"not partial: its top-weighted share is {' and '.join(why)} (method §2.6)"


def evidence(twin_means: dict | None, vs_twin: dict | None) -> str:
    """The evidence line of the random-init twin (method §2.6); "" without one."""
    if not twin_means or vs_twin is None:
        return ""
    return (f"\n  random-init twin: top-weighted share {twin_means[JUDGED]:.4g}, "
            f"{twin_means[COUNT]:.4g} directions shared; the head's share above it: "
            f"{'yes' if vs_twin['above_twin'] else 'no'} (adjusted p {vs_twin['p_adjusted']:.3g})")
