"""Small statistics shared by the claims."""

from __future__ import annotations

import torch


def excess_over_null(value: torch.Tensor | float, null: torch.Tensor | float):
    """(x − x₀)/(1 − x₀): the share of the gap between a metric's null x₀ and its maximum 1 that
    the measurement x closes (spec §2: the subspace overlap must exceed its null by a margin).
    1 means a perfect match, 0 chance level, negative below chance."""
    if isinstance(value, torch.Tensor) or isinstance(null, torch.Tensor):
        gap = (1 - torch.as_tensor(null)).clamp_min(1e-12)
        return (torch.as_tensor(value) - null) / gap
    return (value - null) / max(1.0 - null, 1e-12)


def masked_mean(values: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of ``values`` over the entries where ``keep`` is True, along dim 0.

    Returns NaN-free results: where nothing is kept the mean and std are reported as 0 with a
    count of 0, and callers must check the count (``keep.sum(0)``).
    """
    keep = keep.to(values.dtype)
    count = keep.sum(0)
    mean = (values * keep).sum(0) / count.clamp_min(1)
    var = (((values - mean) ** 2) * keep).sum(0) / (count - 1).clamp_min(1)
    return mean, var.sqrt()


def position_between(value: float, at_zero: float, at_one: float) -> float:
    """Where ``value`` lies on the line from ``at_zero`` (0) to ``at_one`` (1):
    (value − at_zero)/(at_one − at_zero). Used for γ constancy (spec §4): 0 is the true
    eigenvectors' spread, 1 the perturbed control's; below 0.5 is closer to the eigenvectors.
    Returns +inf when the two controls coincide (no contrast to judge by)."""
    gap = at_one - at_zero
    if not gap > 0:
        return float("inf")
    return (value - at_zero) / gap
