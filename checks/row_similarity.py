"""This module owns the similarity metrics that compare token rows of x (the learned V) and y (V̂ or
a null), ``[..., N, d]`` → ``[...]`` (method §2): the cosine matrix, the direct and the optimal
(matched) cosine, and Pearson's correlation per token. Scaling and zeros:
:mod:`checks.similarity_scaling`."""

from __future__ import annotations

import torch

from .assignment import optimal_matching
from .similarity_scaling import check_pair, rescale, unit_rows


def cosine_pair(ux: torch.Tensor, uy: torch.Tensor) -> torch.Tensor:
    """C = U_x U_yᵀ from unit rows, clamped to [−1, 1], [..., N, N] (method §2: cos(v_j, v̂_k))."""
    return (ux @ uy.transpose(-1, -2)).clamp(-1.0, 1.0)


def direct_pair(ux: torch.Tensor, uy: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of cos(x_j, y_j) from unit rows, [...] (method §2: cos(v_j, v̂_j))."""
    return (ux * uy).sum(-1).clamp(-1.0, 1.0).mean(-1)


def cosine_matrix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """C[..., j, k] = cos(x_j, y_k) between the token rows of x and y, shape [..., N, N] (method §2).

    >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    >>> cosine_matrix(x, x).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    check_pair(x, y)
    return cosine_pair(unit_rows(x), unit_rows(y))


def direct_cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over tokens j of cos(x_j, y_j), shape [...]; a zero row counts as 0 (method §2, P2).

    >>> x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> round(float(direct_cosine(x, 5 * x)), 12), round(float(direct_cosine(x, -x)), 12)
    (1.0, -1.0)
    """
    check_pair(x, y)
    return direct_pair(unit_rows(x), unit_rows(y))


def optimal_cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of matched cosines under the matching π maximising Σ_j cos(x_j, y_π(j)) (method §2, P2).

    π comes from :func:`checks.assignment.optimal_matching` (SciPy's Hungarian solver by
    default), shape [...].

    Shuffled tokens are matched back, so V = V̂ up to token order scores 1:

    >>> x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> round(float(optimal_cosine(x, x[[3, 1, 5, 0, 2, 4]])), 12)
    1.0
    """
    return matched_cosine(cosine_matrix(x, y))


def matched_cosine(cos: torch.Tensor) -> torch.Tensor:
    """The optimal cosine from a cosine matrix [..., N, N] of :func:`cosine_matrix`, shape [...].

    The Hungarian step on its own, so that a caller can run it apart from the tensor math (on
    the CPU while the device works on the next batch); see :func:`checks.metric_suite.metric_suite`.

    >>> cos = torch.tensor([[0.1, 0.9], [0.8, 0.2]], dtype=torch.float64)
    >>> round(float(matched_cosine(cos)), 12)  # tokens 0 -> 1 and 1 -> 0
    0.85
    """
    perm = optimal_matching(cos)
    return torch.gather(cos, -1, perm.unsqueeze(-1)).squeeze(-1).mean(-1)  # cos(v_j, v̂_π(j))


def matched_cosine_twin(cos: torch.Tensor, twin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal cosine of ``cos`` [..., N, N] and its round-off twin (method §13.2): the mean
    of ``twin``'s cosines along ``cos``'s optimal matching. To first order that is the twin's
    own optimum (the optimum's derivative is its matching), and no second Hungarian step is run.

    >>> cos = torch.tensor([[0.1, 0.9], [0.8, 0.2]], dtype=torch.float64)
    >>> [round(float(x), 12) for x in matched_cosine_twin(cos, cos + 0.01)]
    [0.85, 0.86]
    """
    perm = optimal_matching(cos).unsqueeze(-1)
    return (torch.gather(cos, -1, perm).squeeze(-1).mean(-1),
            torch.gather(twin.to(cos.device, cos.dtype), -1, perm).squeeze(-1).mean(-1))


def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per token j, Pearson correlation of x_j and y_j across the d features; mean over tokens.

    Shape [...] (method §2, P2). A zero-variance row contributes 0.

    >>> x = torch.tensor([[1.0, 2.0, 4.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    >>> round(float(pearson(x, 2 * x + 3)), 12), round(float(pearson(x, -x)), 12)
    (1.0, -1.0)
    """
    check_pair(x, y)
    return direct_pair(pearson_operand(x), pearson_operand(y))  # method §2: corr(v_j, v̂_j)


def pearson_operand(x: torch.Tensor) -> torch.Tensor:
    """Rows centred over the features and scaled to unit norm: corr(x_j, y_j) = their dot product."""
    xr = rescale(x, (-1,))
    return unit_rows(xr - xr.mean(-1, keepdim=True))
