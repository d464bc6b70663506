"""Pairwise similarity metrics between a learned value matrix V and its KPCA counterpart V̂.

Every metric takes ``x`` (the learned V) and ``y`` (V̂ or a null V̂₀), both of shape ``[..., N, d]``
(tokens × features), and returns one number per leading index, shape ``[...]``. Definitions follow
method §2.1 (``docs/method.md``; P2's protocol; the subspace overlap is ours). Nothing here loops over
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


def _peak_one(x: torch.Tensor) -> torch.Tensor:
    """Matrices [..., a, b] divided by their largest magnitude (the matrix metrics' first step)."""
    return _rescale(x, (-2, -1))


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit Euclidean norm; a zero row stays zero (module docstring)."""
    x = _rescale(x, (-1,))
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(_tiny(x))


def _unit_frobenius(x: torch.Tensor) -> torch.Tensor:
    """Matrices [..., a, b] scaled to unit Frobenius norm; a zero matrix stays zero."""
    x = _rescale(x, (-2, -1))
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    return x / norm.clamp_min(_tiny(x))


# Each metric is split into per-operand pieces (the ``_*_operand`` helpers: what depends on one
# matrix only) and a pairing step (``_*_pair``). The public metric functions compose the two;
# :func:`metric_suite` composes the same pieces but computes the learned V's side once for V̂ and
# the null V̂₀ together. Every formula lives in exactly one of these helpers.

def _cosine_pair(ux: torch.Tensor, uy: torch.Tensor) -> torch.Tensor:
    """C = U_x U_yᵀ from unit rows, clamped to [−1, 1], [..., N, N] (method §2: cos(v_j, v̂_k))."""
    return (ux @ uy.transpose(-1, -2)).clamp(-1.0, 1.0)


def _direct_pair(ux: torch.Tensor, uy: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of cos(x_j, y_j) from unit rows, [...] (method §2: cos(v_j, v̂_j))."""
    return (ux * uy).sum(-1).clamp(-1.0, 1.0).mean(-1)


def cosine_matrix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """C[..., j, k] = cos(x_j, y_k) between the token rows of x and y, shape [..., N, N] (method §2).

    >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    >>> cosine_matrix(x, x).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    _check_pair(x, y)
    return _cosine_pair(_unit_rows(x), _unit_rows(y))


def direct_cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over tokens j of cos(x_j, y_j), shape [...]; a zero row counts as 0 (method §2, P2).

    >>> x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> round(float(direct_cosine(x, 5 * x)), 12), round(float(direct_cosine(x, -x)), 12)
    (1.0, -1.0)
    """
    _check_pair(x, y)
    return _direct_pair(_unit_rows(x), _unit_rows(y))


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
    the CPU while the device works on the next batch); see :func:`metric_suite`.

    >>> cos = torch.tensor([[0.1, 0.9], [0.8, 0.2]], dtype=torch.float64)
    >>> round(float(matched_cosine(cos)), 12)  # tokens 0 -> 1 and 1 -> 0
    0.85
    """
    perm = optimal_matching(cos)
    return torch.gather(cos, -1, perm.unsqueeze(-1)).squeeze(-1).mean(-1)  # cos(v_j, v̂_π(j))


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear CKA with biased HSIC, computed in feature space, shape [...] (method §2, P2).

    With column-centred Xc, Yc: ‖YcᵀXc‖²_F / (‖XcᵀXc‖_F ‖YcᵀYc‖_F), which equals the N×N form
    ⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F) with K_X = XXᵀ. A zero-variance operand gives 0.

    A rotated copy has linear CKA 1:

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(10, 4, generator=g, dtype=torch.float64)
    >>> rotation, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    >>> round(float(linear_cka(x, x @ rotation)), 12)
    1.0
    """
    _check_pair(x, y)
    return _linear_cka_pair(_linear_cka_operand(_peak_one(x)), _linear_cka_operand(_peak_one(y)))


def _linear_cka_operand(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Xc, ‖XcᵀXc‖_F): xs (peak 1) column-centred (H X) at unit Frobenius norm, and its self-term."""
    xc = _unit_frobenius(xs - xs.mean(-2, keepdim=True))  # column-centred: H X
    return xc, torch.linalg.matrix_norm(xc.transpose(-1, -2) @ xc)  # ‖XcᵀXc‖_F


def _linear_cka_pair(px: tuple[torch.Tensor, torch.Tensor],
                     py: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """‖YcᵀXc‖²_F / (‖XcᵀXc‖_F ‖YcᵀYc‖_F) from two :func:`_linear_cka_operand` results."""
    (xc, self_x), (yc, self_y) = px, py
    cross = torch.linalg.matrix_norm(yc.transpose(-1, -2) @ xc) ** 2  # method §2: ‖YcᵀXc‖²_F
    return cross / (self_x * self_y).clamp_min(_tiny(xc))


def squared_distances(x: torch.Tensor) -> torch.Tensor:
    """D[..., i, j] = ‖x_i − x_j‖², built as ‖x_i‖² + ‖x_j‖² − 2x_iᵀx_j (method §2, kernel CKA).

    Clamped at 0 and with an exactly zero diagonal (``torch.cdist`` leaves round-off there).

    >>> x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    >>> squared_distances(x).tolist()
    [[0.0, 25.0], [25.0, 0.0]]
    """
    sq = (x * x).sum(-1)
    d2 = (x @ x.transpose(-1, -2)).mul_(-2.0)  # method §2: ‖x_i‖² + ‖x_j‖² − 2x_iᵀx_j, in place
    d2.add_(sq.unsqueeze(-1)).add_(sq.unsqueeze(-2)).clamp_min_(0.0)
    d2.diagonal(dim1=-2, dim2=-1).zero_()
    return d2


def median_bandwidth(x: torch.Tensor) -> torch.Tensor:
    """σ² = median of ‖x_i − x_j‖² over pairs i < j, the lower middle value (as torch.median), [...].

    Method §2, kernel CKA. Needs N ≥ 2 tokens.

    >>> x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)  # pair distances² 1, 4, 9
    >>> float(median_bandwidth(x))
    4.0
    """
    return _median_pair_distance(squared_distances(x))


def _median_pair_distance(d2: torch.Tensor) -> torch.Tensor:
    """The lower median of the strictly upper triangle of squared distances [..., N, N], [...]."""
    n = d2.shape[-1]
    if n < 2:
        raise ValueError(f"kernel CKA needs at least 2 tokens, got N={n}")
    iu = torch.triu_indices(n, n, offset=1, device=d2.device)
    return d2[..., iu[0], iu[1]].median(dim=-1).values  # method §2: lower of the two middle values


def rbf_gram(x: torch.Tensor) -> torch.Tensor:
    """K[..., i, j] = exp(−‖x_i − x_j‖²/(2σ²)), σ² from :func:`median_bandwidth` (method §2).

    σ² is clamped at finfo.tiny: when more than half the pairs coincide (σ² = 0) coinciding tokens
    get 1 and all others 0, instead of NaN.

    >>> x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    >>> torch.diagonal(rbf_gram(x)).tolist()
    [1.0, 1.0, 1.0]
    >>> round(float(rbf_gram(x)[0, 2]), 12) == round(float(torch.exp(torch.tensor(-9 / 8, dtype=torch.float64))), 12)
    True
    """
    d2 = squared_distances(x)
    sigma2 = _median_pair_distance(d2).clamp_min(_tiny(x))
    return d2.div_(-2.0 * sigma2[..., None, None]).exp_()  # method §2: exp(−‖x_i − x_j‖²/(2σ²))


def _gram_cka_pair(cx: torch.Tensor, cy: torch.Tensor) -> torch.Tensor:
    """⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F) from centred Grams at unit Frobenius norm (method §2)."""
    return (cx * cy).sum(dim=(-2, -1))


def _kernel_cka_operand(xs: torch.Tensor) -> torch.Tensor:
    """H K H / ‖H K H‖_F for the RBF Gram K of xs (peak 1; median bandwidth), [..., N, N]."""
    return _unit_frobenius(center_gram(rbf_gram(xs)))


def kernel_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CKA with RBF Gram matrices, σ² chosen separately for x and y, shape [...] (method §2, P2).

    Invariant to orthogonal maps and isotropic scaling of either operand.

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(10, 4, generator=g, dtype=torch.float64)
    >>> rotation, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    >>> round(float(kernel_cka(x, 3 * x @ rotation)), 12)
    1.0
    """
    _check_pair(x, y)
    return _gram_cka_pair(_kernel_cka_operand(_peak_one(x)), _kernel_cka_operand(_peak_one(y)))


def relative_frobenius(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """‖X − Y‖_F / ‖X‖_F with X the learned V, shape [...] (method §2, P2).

    Both are divided by their common largest magnitude first (no overflow/underflow). When
    ‖X‖_F = 0 the ratio is 0 if Y is zero too and +inf otherwise (an undefined ratio, never NaN).

    >>> x = torch.tensor([[3.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    >>> float(relative_frobenius(x, x)), float(relative_frobenius(x, torch.zeros_like(x)))
    (0.0, 1.0)
    """
    _check_pair(x, y)
    return _relative_frobenius_pair(x, y)


def _relative_frobenius_pair(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:func:`relative_frobenius` without the input checks."""
    peak = torch.maximum(x.abs().amax(dim=(-2, -1)), y.abs().amax(dim=(-2, -1)))
    peak = peak.clamp_min(_tiny(x))[..., None, None]
    xs, ys = x / peak, y / peak
    num = torch.linalg.vector_norm(xs - ys, dim=(-2, -1))  # method §2: ‖V − V̂‖_F
    den = torch.linalg.vector_norm(xs, dim=(-2, -1))  # ‖V‖_F
    ratio = num / den.clamp_min(_tiny(x))
    degenerate = torch.where(num > 0, torch.full_like(num, float("inf")), torch.zeros_like(num))
    return torch.where(den > 0, ratio, degenerate)


def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per token j, Pearson correlation of x_j and y_j across the d features; mean over tokens.

    Shape [...] (method §2, P2). A zero-variance row contributes 0.

    >>> x = torch.tensor([[1.0, 2.0, 4.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    >>> round(float(pearson(x, 2 * x + 3)), 12), round(float(pearson(x, -x)), 12)
    (1.0, -1.0)
    """
    _check_pair(x, y)
    return _direct_pair(_pearson_operand(x), _pearson_operand(y))  # method §2: corr(v_j, v̂_j)


def _pearson_operand(x: torch.Tensor) -> torch.Tensor:
    """Rows centred over the features and scaled to unit norm: corr(x_j, y_j) = their dot product."""
    xr = _rescale(x, (-1,))
    return _unit_rows(xr - xr.mean(-1, keepdim=True))


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
    _check_pair(x, y)
    return _allclose_pair(x, y, atol, rtol)


def _allclose_pair(x: torch.Tensor, y: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """:func:`allclose` without the input checks."""
    if not (atol >= 0 and rtol >= 0):
        raise ValueError(f"allclose needs atol >= 0 and rtol >= 0, got atol={atol!r}, rtol={rtol!r}")
    ok = (x - y).abs() <= atol + rtol * y.abs()  # method §2.1
    return ok.all(dim=-1).all(dim=-1)


def _orthonormal_column_basis(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q [..., N, k], rank [...]): Q spans the numerical column space of xs (peak 1, see
    :func:`_peak_one`); columns past the rank are zero.

    Rank = number of singular values > max(N, d)·ε·σ_max (NumPy's ``matrix_rank`` rule); a zero
    matrix has rank 0. For tall x (N ≥ 2d) the singular values come from the small R of x = QR
    and, when the rank is full, Q itself is the basis; only rank-deficient items take the SVD.
    """
    n, d = xs.shape[-2], xs.shape[-1]
    eps = torch.finfo(xs.dtype).eps
    if n < 2 * d:
        u, s, _ = torch.linalg.svd(xs, full_matrices=False)
        keep = s > max(n, d) * eps * s[..., :1]
        return u * keep.to(xs.dtype).unsqueeze(-2), keep.sum(-1)
    q, r = torch.linalg.qr(xs)
    s = torch.linalg.svdvals(r)  # the singular values of xs
    keep = s > max(n, d) * eps * s[..., :1]
    rank = keep.sum(-1)
    deficient = rank < d
    if bool(deficient.any()):
        u, _, _ = torch.linalg.svd(xs[deficient], full_matrices=False)
        q = q.clone()
        q[deficient] = u * keep[deficient].to(xs.dtype).unsqueeze(-2)
    return q, rank


def subspace_overlap(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cos² of the principal angles between the column spaces of x and y in R^N (method §2, ours).

    = mean squared canonical correlation of the two sets of d columns (not centred): Σ_i cos²θ_i =
    ‖Q_xᵀQ_y‖²_F, with Q_x, Q_y orthonormal bases of the numerical column spaces (SVD with the rank
    tolerance max(N, d)·ε·σ_max). Divided by max(rank x, rank y), so the overlap is 1 exactly when
    the two spaces coincide, and ≈ d/N for two random d-dimensional subspaces. Invariant to any
    invertible map of the columns. 0 when either operand is zero. Shape [...].

    Any invertible map of the columns leaves the column space, and so the overlap, unchanged:

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(12, 3, generator=g, dtype=torch.float64)
    >>> m = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 3.0]], dtype=torch.float64)
    >>> round(float(subspace_overlap(x, x @ m)), 12)
    1.0
    """
    _check_pair(x, y)
    return _overlap_pair(_orthonormal_column_basis(_peak_one(x)),
                         _orthonormal_column_basis(_peak_one(y)))


def _overlap_pair(bx: tuple[torch.Tensor, torch.Tensor],
                  by: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """‖Q_xᵀQ_y‖²_F / max(rank x, rank y) from two :func:`_orthonormal_column_basis` results."""
    (qx, rank_x), (qy, rank_y) = bx, by
    total = torch.linalg.matrix_norm(qx.transpose(-1, -2) @ qy) ** 2  # method §2: Σ cos²θ_i
    return total / torch.maximum(rank_x, rank_y).clamp_min(1).to(qx.dtype)


SUITE_NAMES = ("direct_cosine", "linear_cka", "kernel_cka", "relative_frobenius", "pearson",
               "allclose", "subspace_overlap")


def metric_suite(x: torch.Tensor, ys: torch.Tensor, *, atol: float,
                 rtol: float) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Every metric of x against each of several targets, with x's side computed once.

    Parameters
    ----------
    x : Tensor [..., N, d]
        The learned values V.
    ys : Tensor [T, ..., N, d]
        T targets (for claim V: V̂ and the null V̂₀).
    atol, rtol : float
        Tolerances of :func:`allclose` (no default: ``[claim_v.allclose]`` of the thresholds file).

    Returns
    -------
    (metrics, cos)
        ``metrics``: each name of :data:`SUITE_NAMES` → Tensor [T, ...], equal to the metric
        function of that name applied to (x, ys[t]) (``allclose`` as bool). ``cos``: the cosine
        matrices [T, ..., N, N] of :func:`cosine_matrix`; :func:`matched_cosine` turns them into
        the optimal cosine, left to the caller so the Hungarian step can run apart.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    >>> metrics, cos = metric_suite(x, torch.stack([x, -x]), atol=1e-5, rtol=1e-3)
    >>> metrics["direct_cosine"].tolist(), metrics["allclose"].tolist(), tuple(cos.shape)
    ([1.0, -1.0], [True, False], (2, 8, 8))
    """
    if not isinstance(ys, torch.Tensor) or ys.ndim != x.ndim + 1:
        raise ValueError("ys must stack the targets along a new leading axis: [T, ..., N, d]")
    _check_pair(x.expand_as(ys), ys)  # shapes, dtypes and finiteness of both, once
    xb, xs, yss = x.unsqueeze(0), _peak_one(x), _peak_one(ys)
    ux, uy = _unit_rows(xs).unsqueeze(0), _unit_rows(yss)
    out = {
        "direct_cosine": _direct_pair(ux, uy),
        "linear_cka": _linear_cka_pair(tuple(t.unsqueeze(0) for t in _linear_cka_operand(xs)),
                                       _linear_cka_operand(yss)),
        "kernel_cka": _gram_cka_pair(_kernel_cka_operand(xs).unsqueeze(0),
                                     _kernel_cka_operand(yss)),
        "relative_frobenius": _relative_frobenius_pair(xb, ys),
        "pearson": _direct_pair(_pearson_operand(xs).unsqueeze(0), _pearson_operand(yss)),
        "allclose": _allclose_pair(xb, ys, atol, rtol),
        "subspace_overlap": _overlap_pair(
            tuple(t.unsqueeze(0) for t in _orthonormal_column_basis(xs)),
            _orthonormal_column_basis(yss)),
    }
    return out, _cosine_pair(ux, uy)


def suite_cosines(x: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The cosine matrices [T, ..., N, N] of :func:`metric_suite` (x against each target of
    ``ys`` [T, ..., N, d]) without its metrics: the same operations on the same operands, so the
    same bits, for a caller that needs only the optimal cosine (:func:`matched_cosine`) of a
    suite it has already computed.

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    >>> ys = torch.stack([x, torch.randn(8, 3, generator=g, dtype=torch.float64)])
    >>> bool(torch.equal(suite_cosines(x, ys), metric_suite(x, ys, atol=1e-5, rtol=1e-3)[1]))
    True
    """
    if not isinstance(ys, torch.Tensor) or ys.ndim != x.ndim + 1:
        raise ValueError("ys must stack the targets along a new leading axis: [T, ..., N, d]")
    _check_pair(x.expand_as(ys), ys)
    return _cosine_pair(_unit_rows(_peak_one(x)).unsqueeze(0), _unit_rows(_peak_one(ys)))
