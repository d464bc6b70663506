"""Chance levels that are exchangeable with the measurement, and "at chance" as a tested statement
(method §2.3, §7.2).

The null of a claim-V metric is the same metric against the token-shuffled KPCA value matrix ΠV̂:
V̂ built from the same keys presented in another order (the Gram matrix of ΠK is ΠK̃Πᵀ, its
eigenvectors ΠA and its normalisers Πg, so V̂(ΠK) = ΠV̂(K) up to column signs). ΠV̂ has V̂'s
spectrum, its 1/g weights, its centring and its column structure; only the pairing of its rows
with V's tokens is broken. When V carries no KPCA structure (V independent of the keys, with an
exchangeable token order), (V, V̂) and (V, ΠV̂) have the same distribution, so metric − null is
symmetric about 0 and the sign-flip test of :func:`checks.stats.sign_flip_pvalues` is exact.

"At chance" is an equivalence test (two one-sided tests, TOST) of |mean(metric − null)| < margin,
not a failure to reject: :func:`tost_pvalues`.
"""

from __future__ import annotations

import torch

from .stats import PERMUTATION_RESAMPLES, sign_flip_pvalues


def token_permutations(n: int, seed: int, batch_shape: tuple[int, ...] = ()) -> torch.Tensor:
    """Independent uniform random permutations of ``n`` tokens, one per batch index, from a CPU
    generator seeded with ``seed``: LongTensor [*batch_shape, n] (method §2.3).

    >>> p = token_permutations(5, seed=0, batch_shape=(2,))
    >>> p.shape, sorted(p[0].tolist()) == list(range(5))
    (torch.Size([2, 5]), True)
    """
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"token_permutations needs an integer n >= 1, got {n!r}")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    keys = torch.rand(*tuple(int(b) for b in batch_shape), n, generator=gen, dtype=torch.float64)
    return keys.argsort(dim=-1)


def shuffled_token_null(v_hat: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """ΠV̂: the rows (tokens) of ``v_hat`` [..., N, d] in the order ``perm`` [..., N] (method §2.3,
    the claim-V null: V̂ of the same keys in another token order).

    >>> v = torch.arange(6.0).reshape(3, 2)
    >>> shuffled_token_null(v, torch.tensor([2, 0, 1])).tolist()
    [[4.0, 5.0], [0.0, 1.0], [2.0, 3.0]]
    """
    if perm.shape != v_hat.shape[:-1]:
        raise ValueError(f"perm must have shape {tuple(v_hat.shape[:-1])} (one permutation of the "
                         f"N tokens per head), got {tuple(perm.shape)}")
    index = perm.to(v_hat.device).unsqueeze(-1).expand_as(v_hat)
    return v_hat.gather(-2, index)


def tost_pvalues(diff: torch.Tensor, keep: torch.Tensor | None, margin: torch.Tensor | float,
                 seed: int, resamples: int = PERMUTATION_RESAMPLES) -> torch.Tensor:
    """Equivalence test (TOST) of "the mean of metric − null lies within ±margin", per unit
    (method §7.2): p = max(p₋, p₊), with p₋ the one-sided sign-flip p-value of H0 "mean ≤ −margin"
    (on diff + margin) and p₊ that of H0 "mean ≥ +margin" (on margin − diff). A unit is *at chance*
    when p < α: both one-sided nulls are rejected, so the mean difference is shown to be inside
    the margin. ``diff`` and ``keep`` are [S, U] as in :func:`checks.stats.sign_flip_pvalues`;
    ``margin`` a float or a Tensor [U]. Returns p [U].

    With few samples the test cannot reject (p ≥ 2⁻ˢ), and a unit is then not called at chance.

    >>> d = torch.tensor([[0.01], [-0.02], [0.0], [0.015], [-0.01], [0.005], [0.0], [-0.005]] * 2)
    >>> float(tost_pvalues(d, None, 0.1, seed=0)[0]) < 0.05
    True
    >>> float(tost_pvalues(d + 0.5, None, 0.1, seed=0)[0]) > 0.5
    True
    """
    d = diff.to(torch.float64)
    m = torch.as_tensor(margin, dtype=torch.float64).expand(d.shape[1:])
    lower = sign_flip_pvalues(d + m, keep, seed, resamples)
    upper = sign_flip_pvalues(m - d, keep, seed, resamples)
    return torch.maximum(lower, upper)


def rejection_rate(p: torch.Tensor, alpha: float) -> tuple[float, float]:
    """The share of units with p < alpha and its Monte Carlo standard error √(r(1 − r)/n), for
    the calibration of a test over many synthetic units (method §7.2)."""
    flat = p.reshape(-1)
    rate = float((flat < alpha).to(torch.float64).mean())
    return rate, (rate * (1 - rate) / max(flat.numel(), 1)) ** 0.5
