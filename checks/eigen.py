"""Eigenpairs of batched symmetric matrices in the project's conventions (method §1): eigenvalues
descending, each eigenvector's sign fixed so that its entry of largest magnitude is positive, so
that no result depends on the eigensolver. The building block of :mod:`checks.gram` and
:mod:`checks.topk` (which both import it; it imports neither). The solves themselves run where
:mod:`checks.linalg_route` says (on a GPU, some sizes go to the CPU).
"""

from __future__ import annotations

import torch

from .linalg_route import eigh, eigvalsh

__all__ = ["eigh", "eigvalsh", "fix_signs", "sorted_eigh", "sorted_eigvalsh"]


def fix_signs(vectors: torch.Tensor) -> torch.Tensor:
    """Flip each column so that its entry of largest magnitude is positive (method §1).

    ``vectors`` has shape [..., N, m]; the sign rule makes results independent of the eigensolver.

    >>> fix_signs(torch.tensor([[0.6, 0.1], [-0.8, -0.2]])).tolist()
    [[-0.6000000238418579, -0.10000000149011612], [0.800000011920929, 0.20000000298023224]]
    """
    idx = vectors.abs().argmax(dim=-2, keepdim=True)
    pivot = torch.gather(vectors, -2, idx)
    signs = torch.where(pivot < 0, -1.0, 1.0).to(vectors.dtype)
    return vectors * signs


def sorted_eigh(matrix: torch.Tensor, top: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs of symmetric matrices, eigenvalues descending, signs fixed by :func:`fix_signs`.

    Returns (μ [..., M], A [..., N, M]) with K A = A diag(μ) and unit columns: all N pairs, or the
    ``top`` leading ones (only those are flipped and sign-fixed).

    >>> mu, a = sorted_eigh(torch.tensor([[2.0, 0.0], [0.0, 3.0]], dtype=torch.float64))
    >>> mu.tolist(), a.tolist()
    ([3.0, 2.0], [[0.0, 1.0], [1.0, 0.0]])
    """
    sym = 0.5 * (matrix + matrix.transpose(-1, -2))
    mu, vecs = eigh(sym)
    m = matrix.shape[-1] if top is None else top
    return mu[..., -m:].flip(-1), fix_signs(vecs[..., -m:].flip(-1))


def sorted_eigvalsh(matrix: torch.Tensor, top: int | None = None) -> torch.Tensor:
    """Eigenvalues of symmetric matrices, descending: all N, or the ``top`` leading ones [..., M].

    No eigenvectors (LAPACK's values-only path): for callers that need the spectrum alone.
    """
    sym = 0.5 * (matrix + matrix.transpose(-1, -2))
    mu = eigvalsh(sym).flip(-1)
    return mu if top is None else mu[..., :top]
