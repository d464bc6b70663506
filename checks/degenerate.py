"""Degenerate heads (method §2.2): V̂ carried by about one token.

V̂ = G(I − 11ᵀ/N)A weights token j by 1/g_j. When one g_j is many decades smaller than the others
(all-MiniLM-L6-v2 L00-H2: log10 g spans 17 decades), V̂ is that token's row and rounding noise;
every metric against it, and γ, then measures one token. The effective number of rows of G,
n_eff = 1/Σ_j w_j² with w_j = g_j⁻² / Σ_m g_m⁻² (the normalised squared weights), is N when all
tokens weigh the same and 1 when one token carries all the weight.
"""

from __future__ import annotations

import torch


def effective_rows(log_g: torch.Tensor) -> torch.Tensor:
    """n_eff = 1/Σ_j w_j², w = softmax(−2 log g) over the last axis (the tokens), in log space;
    shape [...] for log_g [..., N] (method §2.2).

    >>> effective_rows(torch.zeros(4, dtype=torch.float64)).item()
    4.0
    >>> round(effective_rows(torch.tensor([0.0, 50.0, 50.0], dtype=torch.float64)).item(), 6)
    1.0
    """
    log_w = torch.log_softmax(-2.0 * log_g.to(torch.float64), dim=-1)
    return torch.exp(-torch.logsumexp(2.0 * log_w, dim=-1))
