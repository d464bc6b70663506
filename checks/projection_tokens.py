"""Claim J per token (method §3.7): statistics of the per-token ratio ‖h_i‖²/‖φ(q_i)‖² that a
handful of tokens cannot carry.

The ratio of pooled means, mean‖h‖²/mean‖φ‖² (method §3.2), is decided by the largest ‖φ‖²: one
query pointing away from every key can hold all of Σ‖φ‖² (s‖q‖² = 44 gives ‖φ‖² ≈ 10²⁴). These
functions summarise the distribution over tokens instead: its median and trimmed mean in log10,
the share of Σ‖φ‖² held by the top 0.1 % of tokens (how heavy the tail is), and P2's appendix
summary (per-layer medians after dropping the values above the 95th percentile). All work on
flattened tokens with a validity mask, in log space: ‖φ‖² spans hundreds of decades.
"""

from __future__ import annotations

import math

import torch

#: Share of tokens cut from each end for the trimmed mean, and the top share of tokens whose
#: part of Σ‖φ‖² is reported (method §3.7).
TRIM = 0.1
TOP = 0.001
#: P2's appendix drops the values above this percentile before taking medians (method §3.7).
P2_OUTLIER_PERCENTILE = 95.0


def log10_token_ratios(log_phi_sq: torch.Tensor, h_sq: torch.Tensor) -> torch.Tensor:
    """log10(‖h_i‖²/‖φ(q_i)‖²) per token, from log ‖φ‖² and ‖h‖² (any shape; −inf where h = 0)."""
    return (h_sq.to(torch.float64).log() - log_phi_sq.to(torch.float64)) / math.log(10.0)


def _flat(x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    x = x.to(torch.float64).reshape(-1)
    return x if valid is None else x[valid.reshape(-1).bool()]


def trimmed_mean(x: torch.Tensor, trim: float = TRIM) -> float:
    """Mean after cutting ⌊trim·n⌋ values from each end (``scipy.stats.trim_mean``'s rule).

    >>> trimmed_mean(torch.tensor([1.0, 2.0, 3.0, 4.0, 1000.0]), 0.2)
    3.0
    """
    x = x.reshape(-1).sort().values
    cut = int(trim * x.numel())
    kept = x[cut: x.numel() - cut]
    return float(kept.mean()) if kept.numel() else float("nan")


def top_share(log_values: torch.Tensor, top: float = TOP) -> float:
    """The share of Σ exp(log_values) held by the largest ⌈top·n⌉ values (at least one), in log
    space (method §3.7: how much of Σ‖φ‖² the top 0.1 % of tokens hold).

    >>> round(top_share(torch.log(torch.tensor([1.0, 1.0, 2.0])), 0.3), 6)
    0.5
    """
    x = log_values.reshape(-1).to(torch.float64)
    k = max(1, math.ceil(top * x.numel()))
    return float(torch.exp(torch.logsumexp(x.topk(k).values, 0) - torch.logsumexp(x, 0)))


def p2_trimmed_median(log_values: torch.Tensor,
                      percentile: float = P2_OUTLIER_PERCENTILE) -> float:
    """P2's appendix summary of one quantity over a layer's tokens (P2's code,
    ``scripts/norms.py``, ``plot_layer_statistics``: ``np.percentile`` at 95, keep the values ≤ it,
    ``np.median``), on log values: the same order statistics, with the two middle values of an
    even count averaged in log space (a geometric mean) and the percentile interpolated in log
    space. Returns the log of the summary."""
    x = log_values.reshape(-1).to(torch.float64)
    x = x[torch.isfinite(x)] if bool(torch.isinf(x).any()) else x
    if x.numel() == 0:
        return float("nan")
    cut = torch.quantile(x, percentile / 100.0)  # linear interpolation, as np.percentile
    kept = x[x <= cut]
    return float(kept.sort().values[[(kept.numel() - 1) // 2, kept.numel() // 2]].mean())


def token_ratio_summary(log_phi_sq: torch.Tensor, h_sq: torch.Tensor,
                        valid: torch.Tensor | None = None, trim: float = TRIM,
                        top: float = TOP) -> dict[str, float]:
    """Per-token claim-J statistics over every valid token given (any shape; method §3.7):

    - ``median_log10_ratio``: the median over tokens of log10(‖h_i‖²/‖φ(q_i)‖²);
    - ``trimmed_mean_log10_ratio``: its mean after cutting ``trim`` of the tokens at each end;
    - ``top_phi_share``: the share of Σ‖φ‖² held by the top ``top`` of tokens;
    - ``p2_appendix_log10_ratio``: log10 of P2's appendix summaries, median ‖h‖² over median
      ‖φ‖², each after dropping its values above its own 95th percentile;
    - ``n_tokens``: how many tokens.

    A quantile of tokens has no bootstrap interval over samples here: the tokens of one sample
    are not independent, and these are descriptive statistics of the distribution (method §3.7).

    >>> lp = torch.zeros(10, dtype=torch.float64)
    >>> s = token_ratio_summary(lp, torch.full((10,), 100.0, dtype=torch.float64))
    >>> s["median_log10_ratio"], round(s["top_phi_share"], 12), s["p2_appendix_log10_ratio"]
    (2.0, 0.1, 2.0)
    """
    log_phi = _flat(log_phi_sq, valid)
    h = _flat(h_sq, valid)
    if log_phi.numel() == 0:
        raise ValueError("token_ratio_summary needs at least one valid token")
    ratio = log10_token_ratios(log_phi, h)
    ln10 = math.log(10.0)
    return {
        "median_log10_ratio": float(ratio.median()) if ratio.numel() % 2 else
        float(ratio.sort().values[[(ratio.numel() - 1) // 2, ratio.numel() // 2]].mean()),
        "trimmed_mean_log10_ratio": trimmed_mean(ratio, trim),
        "top_phi_share": top_share(log_phi, top),
        "p2_appendix_log10_ratio": (p2_trimmed_median(h.log()) - p2_trimmed_median(log_phi)) / ln10,
        "n_tokens": int(log_phi.numel()),
    }
