"""Small statistics shared by the claims."""

from __future__ import annotations

import functools
import math

import torch


def excess_over_null(value: torch.Tensor | float, null: torch.Tensor | float):
    """(x − x₀)/(1 − x₀): the share of the gap between a metric's null x₀ and its maximum 1 that
    the measurement x closes (method §2: the subspace overlap must exceed its null by a margin).
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
    (value − at_zero)/(at_one − at_zero). Used for γ constancy (method §4): 0 is the true
    eigenvectors' spread, 1 the perturbed control's; below 0.5 is closer to the eigenvectors.
    Returns +inf when the two controls coincide (no contrast to judge by)."""
    gap = at_one - at_zero
    if not gap > 0:
        return float("inf")
    return (value - at_zero) / gap


# ------------------------------------------------------------------ uncertainty (method §7)
#: Resamples of the percentile bootstrap and of the sign-flip test (method §7). Both are
#: vectorised: one index (or sign) matrix, one gather or matrix product for all metrics.
BOOTSTRAP_RESAMPLES = 1000
PERMUTATION_RESAMPLES = 9999
#: Up to this many kept samples the sign-flip test enumerates all 2**n sign patterns (exact p).
EXACT_SIGN_FLIP_MAX_N = 13


def seed_from(text: str) -> int:
    """A reproducible 63-bit seed from a string (a test id): sha256, first 15 hex digits."""
    import hashlib

    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


def bootstrap_indices(n: int, seed: int, resamples: int = BOOTSTRAP_RESAMPLES) -> torch.Tensor:
    """[resamples, n] sample indices drawn with replacement from a CPU generator seeded with
    ``seed``: the same seed gives the same resamples on every machine and worker."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, max(int(n), 1), (int(resamples), max(int(n), 1)), generator=gen)


def bootstrap_weights(n: int, seed: int, resamples: int = BOOTSTRAP_RESAMPLES) -> torch.Tensor:
    """[resamples, n] float64: how often each sample is drawn in each resample of
    :func:`bootstrap_indices` (same seed, same resamples), so that a resampled sum is one matrix
    product ``weights @ values`` instead of a gather of [resamples, n, metrics]."""
    idx = bootstrap_indices(n, seed, resamples)
    weights = torch.zeros(idx.shape, dtype=torch.float64)
    return weights.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))


#: Fewer samples than this give no bootstrap interval: every resample of one sample is that
#: sample, and the "interval" [x, x] would claim a certainty one sample cannot give (method §7).
MIN_INTERVAL_SAMPLES = 2


def percentile_interval(draws: torch.Tensor, level: float = 0.95,
                        n: int | None = None) -> torch.Tensor:
    """[..., 2]: the (1−level)/2 and (1+level)/2 quantiles (linear interpolation) of ``draws``
    along dim 0, ignoring NaN draws (a resample with no usable sample). ``n``: the number of
    samples resampled; below :data:`MIN_INTERVAL_SAMPLES` the interval is undefined (NaN)."""
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    draws = draws.to(torch.float64)
    if n is not None and n < MIN_INTERVAL_SAMPLES:
        return torch.full((*draws.shape[1:], 2), math.nan, dtype=torch.float64)
    big = torch.finfo(torch.float64).max  # ±inf draws (an undefined ratio) stay ±inf, not NaN
    finite = draws.clamp(-big, big)
    has_nan = bool(torch.isnan(draws).any())
    quantile = torch.nanquantile if has_nan else torch.quantile
    out = quantile(finite, q, dim=0) if has_nan or finite.ndim == 0 else _linear_quantiles(finite, q)
    if bool(torch.isinf(draws).any()):  # interpolating towards an infinite neighbour gives ±inf
        above = quantile(finite, q, dim=0, interpolation="higher")
        below = quantile(finite, q, dim=0, interpolation="lower")
        out = torch.where(above >= big, math.inf, torch.where(below <= -big, -math.inf, out))
    return out.movedim(0, -1)


def _linear_quantiles(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``torch.quantile(x, q, dim=0)`` (linear interpolation, ``x`` without NaN), the same bits,
    from the few order statistics each quantile needs (``topk`` from the nearer end) instead of
    a sort of every column: rank r = q·(R − 1), value x₍⌊r⌋₎ + (r − ⌊r⌋)·(x₍⌈r⌉₎ − x₍⌊r⌋₎) by
    ``torch.lerp`` as torch.quantile computes it. A bootstrap interval reads 2 of 1000 ranks."""
    r = x.shape[0]
    ranks = q * (r - 1)
    below, above, weight = ranks.to(torch.long), ranks.ceil().to(torch.long), ranks - ranks.floor()
    out = []
    for i in range(q.shape[0]):
        lo, hi = int(below[i]), int(above[i])
        if lo + 1 <= r - lo:  # the lower half: the hi + 1 smallest, ascending
            ends = x.topk(hi + 1, dim=0, largest=False).values
            pair = ends[lo], ends[hi]
        else:  # the upper half: the r − lo largest, descending (ends[j] is rank r − 1 − j)
            ends = x.topk(r - lo, dim=0, largest=True).values
            pair = ends[r - 1 - lo], ends[r - 1 - hi]
        out.append(torch.lerp(*pair, weight[i]))
    return torch.stack(out)


def bootstrap_ratio_ci(sums: torch.Tensor, counts: torch.Tensor, seed: int,
                       resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Percentile bootstrap over samples of the pooled mean Σ sums / Σ counts (method §7).

    ``sums`` [S, M] (per-sample sums of M metrics over the units a sample contributes, e.g. its
    kept heads) and ``counts`` [S] (how many units). Resampling whole samples keeps each sample's
    heads together (model level); with one unit per sample it is the bootstrap of a plain mean.
    Returns (draws [R, M], interval [M, 2]); resamples with no unit give NaN draws, ignored.
    """
    weights = bootstrap_weights(sums.shape[0], seed, resamples)  # [R, S]: times drawn
    s = weights @ sums.to(torch.float64)  # [R, M]
    c = weights @ counts.to(torch.float64).reshape(-1, 1)  # [R, 1]
    draws = torch.where(c > 0, s / c.clamp_min(1), torch.full_like(s, float("nan")))
    return draws, percentile_interval(draws, level)


def bootstrap_mean_ci(values: torch.Tensor, seed: int, resamples: int = BOOTSTRAP_RESAMPLES,
                      level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Percentile bootstrap CI of the mean of ``values`` [S] or [S, M] over its S samples."""
    v = values.to(torch.float64)
    v = v.unsqueeze(-1) if v.ndim == 1 else v
    draws, ci = bootstrap_ratio_ci(v, torch.ones(v.shape[0]), seed, resamples, level)
    return (draws, ci) if values.ndim > 1 else (draws[:, 0], ci[0])


@functools.lru_cache(maxsize=8)
def _random_signs(seed: int, n: int, resamples: int) -> torch.Tensor:
    """The Monte Carlo sign matrix [resamples, n] of ±1.0 of :func:`sign_flip_pvalues` (read,
    never written: kept, since a model's seeds recur in every rule set and specification)."""
    gen = torch.Generator().manual_seed(seed)
    return 1.0 - 2.0 * torch.randint(0, 2, (resamples, n), generator=gen).to(torch.float64)


def sign_flip_pvalues(diff: torch.Tensor, keep: torch.Tensor | None, seed: int,
                      resamples: int = PERMUTATION_RESAMPLES) -> torch.Tensor:
    """One-sided paired sign-flip permutation test of H0 "metric − null is symmetric about 0"
    against "the metric exceeds its null", for many units at once (method §7).

    ``diff`` [S, U]: per sample (rows) and unit (columns: heads × metrics) the difference
    metric − null; ``keep`` [S, U] bool marks the samples that count (a dropped sample adds 0
    under every sign, which is the test on the kept samples alone). Statistic: the sum (for a
    fixed count, the mean) of the kept differences. All units share one sign matrix, so the
    work is one [R, S] × [S, U] product. Exact over all 2**S patterns for S ≤
    :data:`EXACT_SIGN_FLIP_MAX_N` (p = share of patterns with a statistic ≥ the observed one);
    otherwise Monte Carlo, p = (1 + #{T* ≥ T})/(R + 1), which is never below the exact p's
    level (valid at every α). Returns p [U].

    Why a sign-flip test and not Wilcoxon: it tests the mean difference, which is what the
    verdict rules judge, with no rank transform and no tie rules; it is exact under the
    symmetry hypothesis, and vectorises over every head and metric in one product.
    """
    d = diff.to(torch.float64)
    if keep is not None:
        d = torch.where(keep, d, torch.zeros_like(d))
    n = d.shape[0]
    observed = d.sum(0)  # [U]
    tol = 1e-12 * d.abs().sum(0).clamp_min(1e-300)  # round-off ties count as ≥
    if n <= EXACT_SIGN_FLIP_MAX_N:
        patterns = torch.arange(2 ** n).unsqueeze(1).bitwise_right_shift(torch.arange(n)) & 1
        signs = 1.0 - 2.0 * patterns.to(torch.float64)  # [2**n, n], row 0 = all +1
        stats = signs @ d
        return (stats >= observed - tol).to(torch.float64).mean(0)
    count = ((_random_signs(int(seed), n, int(resamples)) @ d) >= observed - tol
             ).to(torch.float64).sum(0)
    return (1.0 + count) / (resamples + 1.0)


def adjust_pvalues(p: torch.Tensor, method: str = "bh") -> torch.Tensor:
    """Multiplicity-adjusted p-values over the last axis: "bh" (Benjamini–Hochberg, the values
    of ``scipy.stats.false_discovery_control``), "holm", or "none" (method §7)."""
    p = p.to(torch.float64)
    if method == "none" or p.shape[-1] <= 1:
        return p.clone()
    m = p.shape[-1]
    if method == "bh":  # as scipy.stats.false_discovery_control(method="bh"), without its import
        order = p.argsort(-1)
        scaled = p.gather(-1, order) * m / torch.arange(1, m + 1, dtype=torch.float64)
        scaled = scaled.flip(-1).cummin(-1).values.flip(-1).clamp_max(1.0)
        return torch.empty_like(p).scatter_(-1, order, scaled)
    if method == "holm":
        order = p.argsort(-1)
        sorted_p = p.gather(-1, order) * torch.arange(m, 0, -1, dtype=torch.float64)
        sorted_p = torch.cummax(sorted_p, -1).values.clamp_max(1.0)
        return torch.empty_like(p).scatter_(-1, order, sorted_p)
    raise ValueError(f"unknown correction {method!r}; use 'bh', 'holm' or 'none'")
