"""Optimal one-to-one token matching for the optimal-cosine metric (spec §2, P2's protocol).

The only per-item Python loop in the claim-V math: scipy's Hungarian solver takes one matrix at a
time.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment


def optimal_matching(cos: torch.Tensor) -> torch.Tensor:
    """The permutation π maximising Σ_j cos[j, π(j)], for every leading index.

    Parameters
    ----------
    cos : Tensor [..., N, N]
        Square score matrices (for claim V: cos(v_j, v̂_k)), finite.

    Returns
    -------
    Tensor [..., N], dtype long, on ``cos``'s device
        ``π[..., j]`` is the column matched to row j (spec §2, optimal cosine; solved by
        ``scipy.optimize.linear_sum_assignment(maximize=True)``). When several permutations tie,
        which one is returned is scipy's choice; the optimal sum is unique.

    Examples
    --------
    >>> cos = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.2, 0.1], [0.0, 0.3, 0.7]])
    >>> optimal_matching(cos).tolist()
    [1, 0, 2]
    """
    if not isinstance(cos, torch.Tensor) or cos.ndim < 2 or cos.shape[-1] != cos.shape[-2]:
        shape = tuple(cos.shape) if isinstance(cos, torch.Tensor) else type(cos).__name__
        raise ValueError(f"cos must be a tensor of square matrices [..., N, N], got {shape}")
    if not bool(torch.isfinite(cos).all()):
        raise ValueError("cos contains NaN or Inf; the assignment needs finite scores")
    n = cos.shape[-1]
    flat = cos.detach().to("cpu", torch.float64).reshape(-1, n, n).numpy()
    perms = np.empty((flat.shape[0], n), dtype=np.int64)
    for b in range(flat.shape[0]):  # the one allowed per-item loop (scipy solves one matrix)
        rows, cols = linear_sum_assignment(flat[b], maximize=True)
        perms[b, rows] = cols
    return torch.from_numpy(perms).reshape(cos.shape[:-1]).to(cos.device)
