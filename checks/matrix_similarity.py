"""This module owns the similarity metrics that compare x (the learned V) and y (V̂ or a null),
``[..., N, d]``, as whole matrices → ``[...]`` (method §2): entrywise (the relative Frobenius
distance, P2's allclose) and by column space (the subspace overlap, ours). Scaling and zeros:
:mod:`checks.similarity_scaling`."""

from __future__ import annotations

import torch

from . import linalg_route as la
from .invariant_subspace import full_rank
from .similarity_scaling import centre_tokens, check_pair, peak_one, tiny


def relative_frobenius(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """‖X − Y‖_F / ‖X‖_F with X the learned V, shape [...] (method §2, P2).

    Both are divided by their common largest magnitude first (no overflow/underflow). When
    ‖X‖_F = 0 the ratio is 0 if Y is zero too and +inf otherwise (an undefined ratio, never NaN).

    >>> x = torch.tensor([[3.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    >>> float(relative_frobenius(x, x)), float(relative_frobenius(x, torch.zeros_like(x)))
    (0.0, 1.0)
    """
    check_pair(x, y)
    return relative_frobenius_pair(x, y)


def relative_frobenius_pair(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:func:`relative_frobenius` without the input checks."""
    peak = torch.maximum(x.abs().amax(dim=(-2, -1)), y.abs().amax(dim=(-2, -1)))
    peak = peak.clamp_min(tiny(x))[..., None, None]
    xs, ys = x / peak, y / peak
    num = torch.linalg.vector_norm(xs - ys, dim=(-2, -1))  # method §2: ‖V − V̂‖_F
    den = torch.linalg.vector_norm(xs, dim=(-2, -1))  # ‖V‖_F
    ratio = num / den.clamp_min(tiny(x))
    degenerate = torch.where(num > 0, torch.full_like(num, float("inf")), torch.zeros_like(num))
    return torch.where(den > 0, ratio, degenerate)


def allclose(x: torch.Tensor, y: torch.Tensor, *, atol: float, rtol: float) -> torch.Tensor:
    """Bool [...]: every entry obeys |x − y| ≤ atol + rtol·|y|, y = V̂ (method §2.1, P2's allclose).

    The tolerances have no default here: the claims read them from ``[claim_v.allclose]`` of
    ``claims/thresholds.toml`` (method §9) and pass them in.

    >>> y = torch.tensor([[1.0, -2.0], [0.5, 4.0]], dtype=torch.float64)
    >>> bool(allclose(y + 1e-6, y, atol=1e-5, rtol=1e-3))
    True
    >>> bool(allclose(y + 1e-2, y, atol=1e-5, rtol=1e-3))
    False
    """
    check_pair(x, y)
    return allclose_pair(x, y, atol, rtol)


def allclose_pair(x: torch.Tensor, y: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """:func:`allclose` without the input checks."""
    if not (atol >= 0 and rtol >= 0):
        raise ValueError(f"allclose needs atol >= 0 and rtol >= 0, got atol={atol!r}, rtol={rtol!r}")
    ok = (x - y).abs() <= atol + rtol * y.abs()  # method §2.1
    return ok.all(dim=-1).all(dim=-1)


def orthonormal_column_basis(xs: torch.Tensor,
                             qr: tuple[torch.Tensor, torch.Tensor] | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q [..., N, k], rank [...]): Q spans the numerical column space of xs (peak 1, see
    :func:`checks.similarity_scaling.peak_one`); columns past the rank are zero.

    Rank = number of singular values > max(N, d)·ε·σ_max (NumPy's ``matrix_rank`` rule); a zero
    matrix has rank 0. For tall x (N ≥ 2d) the singular values are those of the small R of
    x = QR: where R certifies full rank by that rule for every item without an SVD
    (:func:`checks.invariant_subspace.full_rank`), Q itself is the basis; another batch takes
    the singular values of R, and its rank-deficient items the SVD of x. ``qr``: x's
    ``torch.linalg.qr`` when the caller has it (:func:`checks.leading_directions.nested_directions`
    factors the same matrix), used only on the tall path.
    """
    n, d = xs.shape[-2], xs.shape[-1]
    tol = max(n, d) * torch.finfo(xs.dtype).eps
    if n < 2 * d:
        u, s, _ = la.svd(xs, full_matrices=False)
        keep = s > tol * s[..., :1]
        return u * keep.to(xs.dtype).unsqueeze(-2), keep.sum(-1)
    q, r = la.qr(xs) if qr is None else qr
    if bool(full_rank(r, tol).all()):  # the usual batch: no singular value is needed
        return q, torch.full(r.shape[:-2], d, dtype=torch.int64, device=xs.device)
    s = la.svdvals(r)  # the singular values of xs
    keep = s > tol * s[..., :1]
    rank = keep.sum(-1)
    deficient = rank < d
    if bool(deficient.any()):
        u, _, _ = la.svd(xs[deficient], full_matrices=False)
        q = q.clone()
        q[deficient] = u * keep[deficient].to(xs.dtype).unsqueeze(-2)
    return q, rank


def subspace_overlap(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cos² of the principal angles between the *centred* column spaces of x and y in R^N
    (method §2, ours).

    = mean squared canonical correlation of the two sets of d columns, each column centred over
    the N tokens: Σ_i cos²θ_i = ‖Q_xᵀQ_y‖²_F, with Q_x, Q_y orthonormal bases of the numerical
    column spaces of (I − 11ᵀ/N)x and (I − 11ᵀ/N)y (SVD with the rank tolerance
    max(N, d)·ε·σ_max). Divided by max(rank x, rank y), so the overlap is 1 exactly when the two
    spaces coincide modulo the all-ones direction, and ≈ d/(N − 1) for two random d-dimensional
    subspaces. Invariant to any invertible map of the columns and to adding a constant row,
    x → x·M + 1cᵀ, the maps the network cannot see (W_O absorbs M, the output bias c·W_O, since
    softmax rows sum to 1). 0 when either operand is constant. Shape [...].

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(12, 3, generator=g, dtype=torch.float64)
    >>> m = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 3.0]], dtype=torch.float64)
    >>> c = torch.tensor([[5.0, -1.0, 2.0]], dtype=torch.float64)
    >>> round(float(subspace_overlap(x, x @ m + c)), 12)
    1.0
    """
    check_pair(x, y)
    return overlap_pair(centred_column_basis(peak_one(x)), centred_column_basis(peak_one(y)))


def centred_column_basis(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`orthonormal_column_basis` of xs with each column centred over the tokens (rows):
    the column space modulo the all-ones direction, which a value bias 1cᵀ moves along."""
    return orthonormal_column_basis(centre_tokens(xs))


def overlap_pair(bx: tuple[torch.Tensor, torch.Tensor],
                  by: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """‖Q_xᵀQ_y‖²_F / max(rank x, rank y) from two :func:`orthonormal_column_basis` results."""
    (qx, rank_x), (qy, rank_y) = bx, by
    total = torch.linalg.matrix_norm(qx.transpose(-1, -2) @ qy) ** 2  # method §2: Σ cos²θ_i
    return total / torch.maximum(rank_x, rank_y).clamp_min(1).to(qx.dtype)
