"""Claim E (method §4), first part: Gram eigenvalue statistics under P2's protocol.

Pure batched tensor math (float64 by default, any leading dimensions).
:func:`gram_spectrum_batched` gives the spectrum μ of the centred, normalised key Gram matrix K̃
computed in log space (:class:`checks.gram.KeyGram`); :func:`naive_gram_spectrum` is the naive
float32 ``exp(S)`` route, which reports, per batch item, where float32 overflowed instead of
raising; :func:`eigenvalue_statistics` reduces spectra to P2's per-sample max/min/mean/median of
the top-d |μ_k|; :func:`route_comparison` measures how far two routes are apart (the thresholds
file judges it). The γ-constancy test of P1 Eq. 11, the second part of claim E, is
:mod:`checks.gamma`.

Names follow method §4 (``docs/method.md``). Nothing here loops over heads or samples in the math.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._validation import check_int, check_ndim
from .eigen import eigvalsh
from .errors import NonFiniteError, check_finite
from .gram import (
    DEFAULT_DTYPE,
    KeyGram,
    resolve_scale,
    score_matrix,
    standardize_tokens,
)

#: The per-sample statistics of P2's eigenvalue protocol, in reporting order (method §4).
STATISTICS = ("max", "min", "mean", "median")

#: Stages of the naive float32 route, in the order they run (see :func:`naive_gram_spectrum`).
NAIVE_STAGES = ("scores", "exp", "normaliser", "gram", "centre", "eigen")

# --------------------------------------------------------------------------------------------
# Spectra
# --------------------------------------------------------------------------------------------

def gram_spectrum_batched(k: torch.Tensor, scale: float | None = None,
                          standardize: bool = False) -> torch.Tensor:
    """Eigenvalues μ of the centred normalised key Gram matrix K̃, computed in log space (method §1, §4).

    Parameters
    ----------
    k : Tensor of shape [..., N, d]
        Keys of one head per leading index (bias included, split per head).
    scale : float, optional
        The softmax scale s; 1/√d when omitted.
    standardize : bool, default False
        Standardise every key over its d features first (method §1, the option P2 uses).

    Returns
    -------
    Tensor of shape [..., N], float64, descending (μ_1 ≥ μ_2 ≥ …). K̃ is PSD, so negative entries
    are round-off of order N·ε·‖K_φ‖₂ (``KeyGram.threshold``).

    Raises
    ------
    ValueError
        If ``k`` has fewer than 2 dimensions or ``scale`` is not a positive finite number.
    NonFiniteError
        If the keys contain NaN or Inf.

    Identical keys make K_φ constant and K̃ zero:

    >>> k = torch.ones(2, 5, 3, dtype=torch.float64)
    >>> float(gram_spectrum_batched(k).abs().max()) < 1e-12
    True
    """
    return KeyGram(k, scale=scale, standardize=standardize, eigenvectors=False).eigenvalues


def gram_spectrum(k: torch.Tensor, scale: float | None = None,
                  standardize: bool = False) -> torch.Tensor:
    """Eigenvalues μ [N] (float64, descending) of K̃ for the keys ``k`` [N, d] of one head.

    The single-head form of :func:`gram_spectrum_batched`, which documents the parameters.

    >>> k = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> mu = gram_spectrum(k)
    >>> tuple(mu.shape), bool((mu[:-1] >= mu[1:]).all())
    ((6,), True)
    """
    if k.ndim != 2:
        raise ValueError(f"gram_spectrum takes the keys of one head, shape [N, d]; got "
                         f"{tuple(k.shape)} (use gram_spectrum_batched for [..., N, d])")
    return gram_spectrum_batched(k, scale=scale, standardize=standardize)


class NaiveSpectrum(NamedTuple):
    """Result of :func:`naive_gram_spectrum`; unpacks as ``mu, finite, first_nonfinite_stage``.

    ``mu`` [..., N] float64, descending, NaN exactly where ``finite`` is False. ``finite`` [...]
    bool. ``first_nonfinite_stage`` maps every name of :data:`NAIVE_STAGES` to a bool mask [...]
    that is True where that stage was the first to produce a non-finite value; for each item at
    most one mask is True, and none is True exactly when the item is finite.
    """

    mu: torch.Tensor
    finite: torch.Tensor
    first_nonfinite_stage: dict[str, torch.Tensor]


def _all_finite(x: torch.Tensor, dims: int) -> torch.Tensor:
    """True per leading index where the trailing ``dims`` dimensions of ``x`` are all finite."""
    return torch.isfinite(x).flatten(start_dim=x.ndim - dims).all(dim=-1)


def naive_gram_spectrum(k: torch.Tensor, scale: float | None = None, standardize: bool = False,
                        dtype: torch.dtype = torch.float32) -> NaiveSpectrum:
    """P2's naive route: the spectrum of K̃ from K = exp(S) in ``dtype`` (float32), overflow kept.

    Steps (method §1, §4), all in ``dtype``: S = s·K Kᵀ; K = exp(S); g = K.sum(-1);
    K_φ = K/(g_i g_j); K̃ = H K_φ H; μ = eigvalsh(K̃). Unlike the log-space route
    (:func:`gram_spectrum_batched`) nothing is stabilised: with real keys exp(S) overflows float32
    (S_ij > 88.7). This function measures that honestly. It does not raise on overflow; it records
    per batch item the first stage whose output was non-finite:

    ``"scores"`` S (or the cast of the keys to ``dtype``); ``"exp"`` exp(S); ``"normaliser"`` g;
    ``"gram"`` the denominator g_i·g_j or K_φ (a finite g whose product overflows counts here,
    although K/inf is a finite 0); ``"centre"`` K̃; ``"eigen"`` the eigensolver failed or returned
    a non-finite value.

    The eigensolver never sees a non-finite matrix: flagged items are replaced by zeros before it
    and their μ set to NaN afterwards. This is the one route where NaN appears in a result, because
    it is the measured outcome, and ``finite`` says so.

    Parameters
    ----------
    k : Tensor [..., N, d]
        Keys; must be finite (non-finite input is an input error, not a measurement).
    scale : float, optional
        Softmax scale s; 1/√d when omitted.
    standardize : bool, default False
        Standardise keys per token (method §1), in ``dtype``, before S.
    dtype : torch.dtype, default torch.float32
        The floating dtype of the whole route.

    Returns
    -------
    NaiveSpectrum
        ``(mu [..., N] float64 descending with NaN on flagged items, finite [...] bool,
        first_nonfinite_stage dict name → bool [...])``.

    Raises
    ------
    ValueError
        If ``k`` has fewer than 2 dimensions, ``dtype`` is not floating, or ``scale`` is invalid.
    NonFiniteError
        If the input keys contain NaN or Inf.

    Examples
    --------
    Keys with scores above 88.7 overflow exp(S) in float32; the log-space route is unaffected:

    >>> k = 5.0 * torch.eye(3, 8, dtype=torch.float64)  # s·‖k‖² = 25/√8 ≈ 8.8: finite
    >>> bool(naive_gram_spectrum(k).finite)
    True
    >>> out = naive_gram_spectrum(4 * k)  # ≈ 141: exp(S) overflows float32
    >>> bool(out.finite), bool(out.first_nonfinite_stage["exp"])
    (False, True)
    >>> bool(torch.isfinite(gram_spectrum(4 * k)).all())
    True
    """
    check_ndim(k, "keys")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    check_finite(k, "keys")
    s = resolve_scale(k.shape[-1], scale)
    batch = k.shape[:-2]

    x = k.to(dtype)
    if standardize:
        x = standardize_tokens(x)
    scores = score_matrix(x, s)                                          # S = s·K Kᵀ (method §1)
    kernel = torch.exp(scores)                                           # K = exp(S), no shift
    g = kernel.sum(dim=-1)                                               # g_j = Σ_m k(k_j, k_m)
    denom = g.unsqueeze(-1) * g.unsqueeze(-2)                            # g_i g_j
    gram = kernel / denom                                                # K_φ (method §1)
    row, col = gram.mean(dim=-1, keepdim=True), gram.mean(dim=-2, keepdim=True)
    centred = gram - row - col + gram.mean(dim=(-2, -1), keepdim=True)   # K̃ = H K_φ H (method §1)

    ok = {
        "scores": _all_finite(x, 2) & _all_finite(scores, 2),
        "exp": _all_finite(kernel, 2),
        "normaliser": _all_finite(g, 1),
        "gram": _all_finite(denom, 2) & _all_finite(gram, 2),
        "centre": _all_finite(centred, 2),
    }
    good = torch.ones(batch, dtype=torch.bool, device=k.device)
    first: dict[str, torch.Tensor] = {}
    for name in NAIVE_STAGES[:-1]:
        first[name] = good & ~ok[name]
        good = good & ok[name]

    safe = torch.where(good[..., None, None], centred, torch.zeros((), dtype=dtype, device=k.device))
    safe = 0.5 * (safe + safe.transpose(-1, -2))
    mu, solved = _eigvalsh_flagged(safe)
    first["eigen"] = good & ~solved
    good = good & solved

    mu = mu.flip(-1).to(DEFAULT_DTYPE)
    mu = torch.where(good[..., None], mu, torch.full((), math.nan, dtype=mu.dtype, device=mu.device))
    return NaiveSpectrum(mu, good, first)


def _eigvalsh_flagged(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending eigenvalues of finite symmetric matrices [..., N, N] and a per-item success mask.

    Batched ``torch.linalg.eigvalsh`` raises for the whole batch when one item fails to converge;
    only then does this fall back to solving item by item, to find which one (error path only).
    """
    batch = matrix.shape[:-2]
    try:
        mu = eigvalsh(matrix)
        solved = torch.ones(batch, dtype=torch.bool, device=matrix.device)
    except torch.linalg.LinAlgError:
        flat = matrix.reshape(-1, *matrix.shape[-2:])
        mu = torch.zeros(flat.shape[:-1], dtype=matrix.dtype, device=matrix.device)
        solved = torch.ones(flat.shape[0], dtype=torch.bool, device=matrix.device)
        for i in range(flat.shape[0]):
            try:
                mu[i] = eigvalsh(flat[i])
            except torch.linalg.LinAlgError:
                solved[i] = False
        mu, solved = mu.reshape(*batch, -1), solved.reshape(batch)
    return mu, solved & _all_finite(mu, 1)


# --------------------------------------------------------------------------------------------
# Eigenvalue statistics (P2 protocol, method §4)
# --------------------------------------------------------------------------------------------

def _median(x: torch.Tensor) -> torch.Tensor:
    """numpy's median over the last dimension: the mean of the two middle values for an even count."""
    ordered = x.sort(dim=-1).values
    n = x.shape[-1]
    return 0.5 * (ordered[..., (n - 1) // 2] + ordered[..., n // 2])


def eigenvalue_statistics(mu: torch.Tensor, d: int) -> dict:
    """P2's eigenvalue statistics of K̃ spectra (method §4).

    Per sample: sort each head's spectrum by signed μ, descending, keep μ_1..μ_d, and average |μ_k|
    over every layer and head (all middle dimensions) → a profile of d values. Per sample, reduce
    the profile to its max, min, mean and median over k. Median convention: numpy's ``np.median``,
    the mean of the two middle values when d is even (not ``torch.median``'s lower middle).
    Across samples: mean and unbiased std (n − 1) of each statistic, over the finite samples only.

    Parameters
    ----------
    mu : Tensor [S, ..., N]
        Spectra: S samples, any number of (layer, head) dimensions, N eigenvalues each, for example
        [S, L, H, N] or [S, M, N] or [S, N]. Need not be sorted. NaN marks a failed item (the naive
        route); a sample with any non-finite μ among its top d is a non-finite sample.
    d : int
        Number of leading eigenvalues (the head dimension), 1 ≤ d ≤ N.

    Returns
    -------
    dict with keys
        ``"profile"`` Tensor [S, d]: mean |μ_k| over layers and heads, per sample.
        ``"per_sample"`` dict statistic → Tensor [S] (NaN exactly on non-finite samples).
        ``"mean"``, ``"std"`` dict statistic → float over finite samples; ``None`` where undefined
        (mean: no finite sample; std: fewer than two), never NaN.
        ``"finite"`` Tensor [S] bool; ``"n_samples"``, ``"n_finite"``, ``"n_nonfinite"`` int; ``"d"``.

    Raises
    ------
    ValueError
        If ``mu`` has fewer than 2 dimensions or ``d`` is outside 1..N.

    Examples
    --------
    >>> mu = torch.tensor([[[4.0, 2.0, 1.0, 0.0]], [[2.0, 2.0, 2.0, 0.0]]], dtype=torch.float64)
    >>> st = eigenvalue_statistics(mu, d=3)
    >>> st["mean"]["max"], st["mean"]["min"], st["n_nonfinite"]
    (3.0, 1.5, 0)
    """
    if mu.ndim < 2:
        raise ValueError(f"mu must have shape [S, ..., N] (samples first, eigenvalues last); got {tuple(mu.shape)}")
    n = mu.shape[-1]
    check_int(d, "d", min_val=1, max_val=n, expected=f"an integer in 1..N={n}")
    mu = mu.to(DEFAULT_DTYPE)
    top = mu.sort(dim=-1, descending=True).values[..., :d]               # signed order, P2 (method §4)
    failed = ~torch.isfinite(mu).all(dim=-1, keepdim=True)              # a failed head stays failed
    top = torch.where(failed, torch.full((), math.nan, dtype=top.dtype, device=top.device), top)
    profile = top.abs().reshape(top.shape[0], -1, d).mean(dim=1)          # mean |μ_k| over layers, heads
    finite = torch.isfinite(profile).all(dim=-1)

    per_sample = {
        "max": profile.amax(dim=-1),
        "min": profile.amin(dim=-1),
        "mean": profile.mean(dim=-1),
        "median": _median(profile),
    }
    n_finite = int(finite.sum())
    means: dict[str, float | None] = {}
    stds: dict[str, float | None] = {}
    for name in STATISTICS:
        values = per_sample[name][finite]
        means[name] = float(values.mean()) if n_finite >= 1 else None
        stds[name] = float(values.std(unbiased=True)) if n_finite >= 2 else None
    return {
        "profile": profile,
        "per_sample": per_sample,
        "mean": means,
        "std": stds,
        "finite": finite,
        "n_samples": int(mu.shape[0]),
        "n_finite": n_finite,
        "n_nonfinite": int(mu.shape[0]) - n_finite,
        "d": d,
    }


def _ratio(a: float | None, b: float | None) -> float:
    """max(a/b, b/a) for two statistics; inf when they have opposite signs, one is 0, or one is undefined."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    if a == b:
        return 1.0
    if a * b <= 0:
        return math.inf
    return max(a / b, b / a)


def route_comparison(stats_a: dict, stats_b: dict) -> dict:
    """Compare the eigenvalue statistics of two routes: the measurements claim E is judged on
    (method §4.1). The judgement itself (which ratio refutes, which supports) is the thresholds
    file's ``[claim_e]`` rules, applied in ``claims/claim_e.py``; nothing here decides.

    For each statistic of :data:`STATISTICS`, the ratio r = max(a/b, b/a) of the two routes'
    across-sample means. Sign handling: the statistics are means of |μ| and so ≥ 0; equal values
    (both 0 included) give r = 1; values of opposite sign, exactly one zero, or a statistic that is
    undefined on either side (no finite sample) give r = inf — they differ by more than any factor.

    Parameters
    ----------
    stats_a, stats_b : dict
        Outputs of :func:`eigenvalue_statistics`.

    Returns
    -------
    dict with ``"ratio"`` (statistic → float), ``"max_ratio"`` float and ``"nonfinite"`` bool
    (either route has a non-finite sample).

    Examples
    --------
    >>> mu = torch.tensor([[[4.0, 2.0, 1.0]], [[3.0, 2.0, 1.0]]], dtype=torch.float64)
    >>> same = route_comparison(eigenvalue_statistics(mu, 3), eigenvalue_statistics(mu, 3))
    >>> same["max_ratio"], same["nonfinite"]
    (1.0, False)
    >>> round(route_comparison(eigenvalue_statistics(mu, 3),
    ...                        eigenvalue_statistics(3 * mu, 3))["max_ratio"], 12)
    3.0
    """
    ratio = {name: _ratio(stats_a["mean"][name], stats_b["mean"][name]) for name in STATISTICS}
    return {
        "ratio": ratio,
        "max_ratio": max(ratio.values()),
        "nonfinite": stats_a["n_nonfinite"] > 0 or stats_b["n_nonfinite"] > 0,
    }


__all__ = [
    "NAIVE_STAGES", "STATISTICS", "NaiveSpectrum", "NonFiniteError", "eigenvalue_statistics",
    "gram_spectrum", "gram_spectrum_batched", "naive_gram_spectrum", "route_comparison",
]
