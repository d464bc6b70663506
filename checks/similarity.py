"""Pairwise similarity metrics between a learned value matrix V and its KPCA counterpart V̂.

Every metric takes ``x`` (the learned V) and ``y`` (V̂ or a null V̂₀), both of shape ``[..., N, d]``
(tokens × features), and returns one number per leading index, shape ``[...]``. Definitions follow
``shared/spec/claims.md`` §2 (P2's protocol; the subspace overlap is ours). Nothing here loops over
heads or samples except the assignment solver in :mod:`checks.assignment`.

Scale and zeros
---------------
V̂ = G(I − 11ᵀ/N)A carries the factor 1/g_j, which is astronomically small for keys with large
scores (g_j up to e^{hundreds}), so products of V̂ entries can underflow even in float64. Every
scale-invariant metric therefore first divides its operand by its largest magnitude (per row for
row metrics, per matrix for matrix metrics) and only then normalises; both divisions clamp the
divisor at ``torch.finfo(dtype).tiny``. With that clamp a zero row, a zero-variance row or a zero
matrix yields 0 for the cosine, Pearson, CKA and overlap metrics — never NaN — and any non-zero
representable scale gives the same result as unit scale. (``F.cosine_similarity`` clamps the
*product* of norms at 1e-8 instead, which would zero the cosine of V̂'s tiny rows; we do not.)
"""

from __future__ import annotations

import torch

from .assignment import optimal_matching
from .errors import check_finite
from .gram import center_gram

ALLCLOSE_ATOL = 1e-5  # spec §2, allclose rate: |V − V̂| ≤ 1e-5 + 1e-3·|V̂|
ALLCLOSE_RTOL = 1e-3


def _check_pair(x: torch.Tensor, y: torch.Tensor) -> None:
    """Raise ValueError unless x and y are floating tensors of one shape [..., N, d]."""
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError("x and y must be torch tensors of shape [..., N, d]")
    if x.ndim < 2 or x.shape != y.shape:
        raise ValueError(
            f"x and y must have the same shape [..., N, d]; got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if not (x.is_floating_point() and y.is_floating_point()):
        raise ValueError(f"x and y must be floating-point tensors; got {x.dtype} and {y.dtype}")
    check_finite(x, "x (learned values)")
    check_finite(y, "y (KPCA values)")


def _tiny(x: torch.Tensor) -> float:
    return torch.finfo(x.dtype).tiny


def _rescale(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """x divided by its largest magnitude over ``dims`` (clamped at finfo.tiny): zero stays zero."""
    peak = x.abs().amax(dim=dims, keepdim=True)
    return x / peak.clamp_min(_tiny(x))


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit Euclidean norm; a zero row stays zero (module docstring)."""
    x = _rescale(x, (-1,))
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(_tiny(x))


def _unit_frobenius(x: torch.Tensor) -> torch.Tensor:
    """Matrices [..., a, b] scaled to unit Frobenius norm; a zero matrix stays zero."""
    x = _rescale(x, (-2, -1))
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    return x / norm.clamp_min(_tiny(x))


def cosine_matrix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """C[..., j, k] = cos(x_j, y_k) between the token rows of x and y, shape [..., N, N] (spec §2)."""
    _check_pair(x, y)
    c = _unit_rows(x) @ _unit_rows(y).transpose(-1, -2)  # spec §2: cos(v_j, v̂_k)
    return c.clamp(-1.0, 1.0)


def direct_cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over tokens j of cos(x_j, y_j), shape [...]; a zero row counts as 0 (spec §2, P2)."""
    _check_pair(x, y)
    cos = (_unit_rows(x) * _unit_rows(y)).sum(-1).clamp(-1.0, 1.0)  # spec §2: cos(v_j, v̂_j)
    return cos.mean(-1)


def optimal_cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of matched cosines under the matching π maximising Σ_j cos(x_j, y_π(j)) (spec §2, P2).

    π comes from :func:`checks.assignment.optimal_matching` (Hungarian method), shape [...].
    """
    c = cosine_matrix(x, y)
    perm = optimal_matching(c)
    matched = torch.gather(c, -1, perm.unsqueeze(-1)).squeeze(-1)  # spec §2: cos(v_j, v̂_π(j))
    return matched.mean(-1)


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear CKA with biased HSIC, computed in feature space, shape [...] (spec §2, P2).

    With column-centred Xc, Yc: ‖YcᵀXc‖²_F / (‖XcᵀXc‖_F ‖YcᵀYc‖_F), which equals the N×N form
    ⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F) with K_X = XXᵀ. A zero-variance operand gives 0.
    """
    _check_pair(x, y)
    xs, ys = _rescale(x, (-2, -1)), _rescale(y, (-2, -1))
    xc = _unit_frobenius(xs - xs.mean(-2, keepdim=True))  # column-centred: H X
    yc = _unit_frobenius(ys - ys.mean(-2, keepdim=True))
    cross = torch.linalg.matrix_norm(yc.transpose(-1, -2) @ xc) ** 2  # spec §2: ‖YcᵀXc‖²_F
    self_x = torch.linalg.matrix_norm(xc.transpose(-1, -2) @ xc)  # ‖XcᵀXc‖_F
    self_y = torch.linalg.matrix_norm(yc.transpose(-1, -2) @ yc)  # ‖YcᵀYc‖_F
    return cross / (self_x * self_y).clamp_min(_tiny(x))


def squared_distances(x: torch.Tensor) -> torch.Tensor:
    """D[..., i, j] = ‖x_i − x_j‖², built as ‖x_i‖² + ‖x_j‖² − 2x_iᵀx_j (spec §2, kernel CKA).

    Clamped at 0 and with an exactly zero diagonal (``torch.cdist`` leaves round-off there).
    """
    sq = (x * x).sum(-1)
    d2 = sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * (x @ x.transpose(-1, -2))  # spec §2
    d2 = d2.clamp_min(0.0)
    eye = torch.eye(x.shape[-2], dtype=torch.bool, device=x.device)
    return d2.masked_fill(eye, 0.0)


def median_bandwidth(x: torch.Tensor) -> torch.Tensor:
    """σ² = median of ‖x_i − x_j‖² over pairs i < j, the lower middle value (as torch.median), [...].

    Spec §2, kernel CKA. Needs N ≥ 2 tokens.
    """
    n = x.shape[-2]
    if n < 2:
        raise ValueError(f"kernel CKA needs at least 2 tokens, got N={n}")
    iu = torch.triu_indices(n, n, offset=1, device=x.device)
    pairs = squared_distances(x)[..., iu[0], iu[1]]
    return pairs.median(dim=-1).values  # spec §2: lower of the two middle values


def rbf_gram(x: torch.Tensor) -> torch.Tensor:
    """K[..., i, j] = exp(−‖x_i − x_j‖²/(2σ²)), σ² from :func:`median_bandwidth` (spec §2).

    σ² is clamped at finfo.tiny: when more than half the pairs coincide (σ² = 0) coinciding tokens
    get 1 and all others 0, instead of NaN.
    """
    sigma2 = median_bandwidth(x).clamp_min(_tiny(x))
    return torch.exp(-squared_distances(x) / (2.0 * sigma2[..., None, None]))  # spec §2


def _gram_cka(kx: torch.Tensor, ky: torch.Tensor) -> torch.Tensor:
    """⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F) for Gram matrices [..., N, N] (spec §2, CKA)."""
    cx = _unit_frobenius(center_gram(kx))
    cy = _unit_frobenius(center_gram(ky))
    return (cx * cy).sum(dim=(-2, -1))


def kernel_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CKA with RBF Gram matrices, σ² chosen separately for x and y, shape [...] (spec §2, P2).

    Invariant to orthogonal maps and isotropic scaling of either operand.
    """
    _check_pair(x, y)
    kx = rbf_gram(_rescale(x, (-2, -1)))
    ky = rbf_gram(_rescale(y, (-2, -1)))
    return _gram_cka(kx, ky)


def relative_frobenius(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """‖X − Y‖_F / ‖X‖_F with X the learned V, shape [...] (spec §2, P2).

    Both are divided by their common largest magnitude first (no overflow/underflow). When
    ‖X‖_F = 0 the ratio is 0 if Y is zero too and +inf otherwise (an undefined ratio, never NaN).
    """
    _check_pair(x, y)
    peak = torch.maximum(x.abs().amax(dim=(-2, -1)), y.abs().amax(dim=(-2, -1)))
    peak = peak.clamp_min(_tiny(x))[..., None, None]
    xs, ys = x / peak, y / peak
    num = torch.linalg.vector_norm(xs - ys, dim=(-2, -1))  # spec §2: ‖V − V̂‖_F
    den = torch.linalg.vector_norm(xs, dim=(-2, -1))  # ‖V‖_F
    ratio = num / den.clamp_min(_tiny(x))
    degenerate = torch.where(num > 0, torch.full_like(num, float("inf")), torch.zeros_like(num))
    return torch.where(den > 0, ratio, degenerate)


def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per token j, Pearson correlation of x_j and y_j across the d features; mean over tokens.

    Shape [...] (spec §2, P2). A zero-variance row contributes 0.
    """
    _check_pair(x, y)
    xr, yr = _rescale(x, (-1,)), _rescale(y, (-1,))
    xc = _unit_rows(xr - xr.mean(-1, keepdim=True))
    yc = _unit_rows(yr - yr.mean(-1, keepdim=True))
    r = (xc * yc).sum(-1).clamp(-1.0, 1.0)  # spec §2: corr(v_j, v̂_j) over features
    return r.mean(-1)


def allclose(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Bool [...]: every entry obeys |x − y| ≤ 1e-5 + 1e-3·|y|, y = V̂ (spec §2, P2 allclose rate)."""
    _check_pair(x, y)
    ok = (x - y).abs() <= ALLCLOSE_ATOL + ALLCLOSE_RTOL * y.abs()  # spec §2
    return ok.all(dim=-1).all(dim=-1)


def _orthonormal_column_basis(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q [..., N, k], rank [...]): Q spans x's numerical column space, columns past the rank zero.

    Rank = number of singular values > max(N, d)·ε·σ_max (NumPy's ``matrix_rank`` rule); a zero
    matrix has rank 0.
    """
    u, s, _ = torch.linalg.svd(_rescale(x, (-2, -1)), full_matrices=False)
    tol = max(x.shape[-2], x.shape[-1]) * torch.finfo(x.dtype).eps * s[..., :1]
    keep = s > tol
    return u * keep.to(x.dtype).unsqueeze(-2), keep.sum(-1)


def subspace_overlap(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cos² of the principal angles between the column spaces of x and y in R^N (spec §2, ours).

    = mean squared canonical correlation of the two sets of d columns (not centred): Σ_i cos²θ_i =
    ‖Q_xᵀQ_y‖²_F, with Q_x, Q_y orthonormal bases of the numerical column spaces (SVD with the rank
    tolerance max(N, d)·ε·σ_max). Divided by max(rank x, rank y), so the overlap is 1 exactly when
    the two spaces coincide, and ≈ d/N for two random d-dimensional subspaces. Invariant to any
    invertible map of the columns. 0 when either operand is zero. Shape [...].
    """
    _check_pair(x, y)
    qx, rank_x = _orthonormal_column_basis(x)
    qy, rank_y = _orthonormal_column_basis(y)
    total = torch.linalg.matrix_norm(qx.transpose(-1, -2) @ qy) ** 2  # spec §2: Σ cos²θ_i
    return total / torch.maximum(rank_x, rank_y).clamp_min(1).to(x.dtype)
