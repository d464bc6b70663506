"""γ constancy for a subspace (method §4.2): is span(Â) an invariant subspace of K̃?

P1 Eq. 11's γ_i = (K̃â)_i/(N â_i) is constant over i exactly when the column â is an eigenvector
of K̃. That is a statement about each column, so it changes when the columns are mixed
(Â → Â·M, which the network cannot see: only V·W_O matters). Its basis-free form asks whether the
span of the recovered axes is mapped into itself by K̃, i.e. is spanned by d eigenvectors:

  ρ(Â) = ‖K̃Q − Q(QᵀK̃Q)‖_F / ‖K̃Q‖_F,  Q an orthonormal basis of span(Â),

0 for any basis of the span of eigenvectors, whatever M, signs, order or scale, and up to 1 when
K̃ maps the span entirely out of itself.
"""

from __future__ import annotations

import torch


def invariant_subspace_residual(centred_gram: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """ρ(Â) of the module docstring for K̃ [..., N, N] and Â [..., N, m]: shape [...].

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(8, 8, generator=g, dtype=torch.float64); k = x @ x.T
    >>> a = torch.linalg.eigh(k).eigenvectors[:, -3:]
    >>> m = torch.tensor([[2.0, 1, 0], [0, -1, 0], [1, 0, 300]], dtype=torch.float64)
    >>> float(invariant_subspace_residual(k, a @ m)) < 1e-12
    True
    >>> float(invariant_subspace_residual(k, torch.randn(8, 3, generator=g, dtype=torch.float64))) > 0.1
    True
    """
    a = axes.to(torch.float64)
    peak = a.abs().amax(dim=(-2, -1), keepdim=True)
    a = a / torch.where(peak > 0, peak, torch.ones_like(peak))
    q, _ = torch.linalg.qr(a)
    k = centred_gram.to(torch.float64)
    kq = k @ q
    resid = kq - q @ (q.transpose(-1, -2) @ kq)
    total = torch.linalg.matrix_norm(kq)
    return torch.where(total > 0, torch.linalg.matrix_norm(resid) / total.clamp_min(1e-300),
                       torch.zeros_like(total))
