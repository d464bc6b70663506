"""γ constancy for a subspace (method §4.2): is span(Â) an invariant subspace of K̃?

P1 Eq. 11's γ_i = (K̃â)_i/(N â_i) is constant over i exactly when the column â is an eigenvector
of K̃. That is a statement about each column, so it changes when the columns are mixed
(Â → Â·M, which the network cannot see: only V·W_O matters). Its basis-free form asks whether the
span of the recovered axes is mapped into itself by K̃, i.e. is spanned by d eigenvectors:

  ρ(Â) = ‖K̃Q − Q(QᵀK̃Q)‖_F / ‖K̃Q‖_F,  Q an orthonormal basis of span(Â),

0 for any basis of the span of eigenvectors, whatever M, signs, order or scale, and up to 1 when
K̃ maps the span entirely out of itself.

The value bias. V → V + 1cᵀ is the same network (softmax rows sum to 1; the output bias absorbs
c·W_O), and it moves the recovered axes to Â + h·cᵀ with h = g − ḡ (method §4.2). Every measure
here therefore takes an optional ``extra`` direction [..., N] (claim E passes h): the span judged
is then span([Â, h]), the same for every c. h is added as the unit vector of its part outside
span(Â) when that part exceeds :data:`EXTRA_FLOOR`·√N (h at peak 1 of g), and as a zero column
otherwise (h in span(Â), or a constant g whose h is round-off): a zero column changes neither ρ
nor ω.
"""

from __future__ import annotations

import torch

from . import linalg_route as la

#: The part of the extra direction h outside span(Â), per √N, below which h counts as inside it
#: (h is g − ḡ with g at peak 1; its round-off is about 1e-16 per entry, so this is 10⁶ times
#: that, and a part this small moves the span by less than the round-off of the axes' own QR).
EXTRA_FLOOR = 1e-10


def invariant_subspace_residual(centred_gram: torch.Tensor, axes: torch.Tensor,
                                extra: torch.Tensor | None = None) -> torch.Tensor:
    """ρ(Â) of the module docstring for K̃ [..., N, N] and Â [..., N, m]: shape [...]; of
    span([Â, extra]) with ``extra`` [..., N] (the module docstring's value bias).

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(8, 8, generator=g, dtype=torch.float64); k = x @ x.T
    >>> a = torch.linalg.eigh(k).eigenvectors[:, -3:]
    >>> m = torch.tensor([[2.0, 1, 0], [0, -1, 0], [1, 0, 300]], dtype=torch.float64)
    >>> float(invariant_subspace_residual(k, a @ m)) < 1e-12
    True
    >>> float(invariant_subspace_residual(k, torch.randn(8, 3, generator=g, dtype=torch.float64))) > 0.1
    True
    """
    return _residual(*_basis_and_image(centred_gram, axes, extra))


def bias_direction(log_g: torch.Tensor) -> torch.Tensor:
    """h = g − ḡ [..., N] from log g [..., N] (at any per-head offset: g is taken at peak 1): the
    direction along which a value bias moves the recovered axes, â → â + h·c for V → V + 1cᵀ
    (method §4.2). ρ and ω judge span([Â, h]), which no c changes.

    >>> from checks.gamma import recover_axes
    >>> v = torch.randn(6, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> log_g = torch.linspace(-1.0, 0.0, 6, dtype=torch.float64)
    >>> c = torch.tensor([[3.0, -2.0]], dtype=torch.float64)
    >>> moved = recover_axes(v + c, log_g) - recover_axes(v, log_g)
    >>> h = bias_direction(log_g) * torch.exp(log_g).amax()
    >>> torch.allclose(moved, h.unsqueeze(-1) * c)
    True
    """
    g = torch.exp(log_g.to(torch.float64) - log_g.to(torch.float64).amax(dim=-1, keepdim=True))
    return g - g.mean(dim=-1, keepdim=True)


def subspace_measures(centred_gram: torch.Tensor, axes: torch.Tensor,
                      extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ρ, ω) of :func:`invariant_subspace_residual` and :func:`invariance_overlap`, the
    same bits, with the basis Q of span(Â) (or span([Â, extra])) and its image K̃Q computed
    once for both."""
    q, kq = _basis_and_image(centred_gram, axes, extra)
    return _residual(q, kq), _overlap(q, kq, None)


def _basis_and_image(centred_gram: torch.Tensor, axes: torch.Tensor,
                     extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Q, an orthonormal basis of span(Â) (Â at peak 1 first), with ``extra``'s direction outside
    it appended (a zero column where that part is below :data:`EXTRA_FLOOR`·√N; nothing where
    Q has N columns already, N ≤ the number of axes), and K̃Q: what ρ and ω start from."""
    a = axes.to(torch.float64)
    peak = a.abs().amax(dim=(-2, -1), keepdim=True)
    a = a / torch.where(peak > 0, peak, torch.ones_like(peak))
    q, _ = la.qr(a)
    if extra is not None and q.shape[-1] < q.shape[-2]:  # a basis of all of ℝ^N holds h already
        q = torch.cat([q, _outside(q, extra.to(torch.float64).unsqueeze(-1))], dim=-1)
    return q, centred_gram.to(torch.float64) @ q


def _outside(q: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The unit vector of h [..., N, 1]'s part outside span(q) (projected out twice, as
    Gram-Schmidt needs for orthogonality to round-off), or 0 where that part is below
    :data:`EXTRA_FLOOR`·√N."""
    for _ in range(2):
        h = h - q @ (q.transpose(-1, -2) @ h)
    norm = torch.linalg.vector_norm(h, dim=(-2, -1), keepdim=True)
    keep = norm > EXTRA_FLOOR * h.shape[-2] ** 0.5
    return torch.where(keep, h / torch.where(keep, norm, torch.ones_like(norm)),
                       torch.zeros_like(h))


def _residual(q: torch.Tensor, kq: torch.Tensor) -> torch.Tensor:
    resid = kq - q @ (q.transpose(-1, -2) @ kq)
    total = torch.linalg.matrix_norm(kq)
    return torch.where(total > 0, torch.linalg.matrix_norm(resid) / total.clamp_min(1e-300),
                       torch.zeros_like(total))


def invariance_overlap(centred_gram: torch.Tensor, axes: torch.Tensor,
                       rtol: float | None = None,
                       extra: torch.Tensor | None = None) -> torch.Tensor:
    """ω(Â): how invariant span(Â) is under K̃ direction by direction, shape [...] (method §4.2).

    ω = ‖Qᵀ U‖²_F / r, with Q an orthonormal basis of span(Â) and U an orthonormal basis of
    K̃·span(Â) (its r directions whose singular values exceed ``rtol`` times the largest): the
    mean squared cosine of the principal angles between the span and its image. It is 1 exactly
    when K̃ maps the span into itself, whatever M, signs, order or scale, like ρ of
    :func:`invariant_subspace_residual`; unlike ρ, every direction of the image counts once,
    whatever its eigenvalue. When a few eigenvalues of K̃ carry nearly all of ‖K̃‖_F, ρ is decided
    by those few directions (a span holding them and random directions besides has a small ρ),
    while ω counts the random ones.

    ``rtol`` defaults to N·ε of the dtype (float64): image directions below round-off of the
    largest are left out (a direction K̃ maps to about 0 is trivially invariant). ``extra``
    [..., N]: ω of span([Â, extra]) (the module docstring's value bias).

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(8, 8, generator=g, dtype=torch.float64); k = x @ x.T
    >>> a = torch.linalg.eigh(k).eigenvectors[:, -3:]
    >>> m = torch.tensor([[2.0, 1, 0], [0, -1, 0], [1, 0, 300]], dtype=torch.float64)
    >>> abs(float(invariance_overlap(k, a @ m)) - 1.0) < 1e-12
    True
    >>> float(invariance_overlap(k, torch.randn(8, 3, generator=g, dtype=torch.float64))) < 0.9
    True
    """
    return _overlap(*_basis_and_image(centred_gram, axes, extra), rtol)


def _overlap(q: torch.Tensor, image: torch.Tensor, rtol: float | None) -> torch.Tensor:
    """ω from Q and the image K̃Q. The image's singular values come from the small R of its QR
    factorisation; where every direction is kept (full rank, the usual case), the image's Q is
    a basis of the kept directions and ω = ‖QᵀQ_image‖²_F / m. Only the other items take the SVD,
    to drop the directions below round-off (about half the time of an SVD for every item)."""
    tol = (q.shape[-2] * torch.finfo(torch.float64).eps) if rtol is None else rtol
    m = image.shape[-1]
    q_image, r = la.qr(image)
    full = full_rank(r, tol)
    omega = ((q.transpose(-1, -2) @ q_image) ** 2).sum(dim=(-2, -1)) / m
    if bool(full.all()):
        return omega
    part = ~full
    return omega.masked_scatter(part, _overlap_svd(q[part], image[part], tol))


def full_rank(r: torch.Tensor, tol: float) -> torch.Tensor:
    """Whether every singular value of the triangular R [..., m, m] (the image's) exceeds ``tol``
    times the largest, [...]. σ_min/σ_max ≥ 1/(‖R‖_F·‖R⁻¹‖_F), so where that bound clears ``tol``
    by a factor 1000 (room for the round-off of R⁻¹, about m·ε·cond(R) relative, and of the
    singular values, about m·ε·σ_max) the answer is yes without an SVD, as the SVD would give;
    only the other items take one (400 of all-MiniLM-L6-v2's 9600 in layer 0's claim E, where
    the SVD of every item was a tenth of the claim's time)."""
    eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device).expand_as(r)
    inverse = torch.linalg.solve_triangular(r, eye, upper=True)          # inf/NaN: not sure
    sure = torch.linalg.matrix_norm(r) * torch.linalg.matrix_norm(inverse) * tol < 1e-3
    if bool(sure.all()):
        return sure
    rest = ~sure
    s = la.svdvals(r[rest])                                              # [..., m], descending
    return sure.masked_scatter(rest, (s > tol * s[..., :1]).all(dim=-1))


def _overlap_svd(q: torch.Tensor, image: torch.Tensor, tol: float) -> torch.Tensor:
    """ω with the image's directions from its SVD, those above ``tol`` times the largest kept."""
    u, s, _ = la.svd(image, full_matrices=False)
    keep = (s > tol * s[..., :1]).to(torch.float64)                      # [..., m]
    cos2 = ((q.transpose(-1, -2) @ u) ** 2).sum(dim=-2)                  # per image direction
    count = keep.sum(dim=-1)
    return torch.where(count > 0, (cos2 * keep).sum(dim=-1) / count.clamp_min(1),
                       torch.ones_like(count))
