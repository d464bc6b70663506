"""This module owns what every similarity metric between a learned value matrix V and its KPCA
counterpart V̂ starts with: the input check of a pair ``x`` (the learned V) and ``y`` (V̂ or a null
V̂₀), both ``[..., N, d]`` (tokens × features), and the rescaling that keeps the metrics finite.

The metrics, one number per leading index (shape ``[...]``), are grouped by what they compare
(definitions: method §2.1 of ``docs/method.md``; P2's protocol; the subspace overlap is ours):
token rows (:mod:`checks.row_similarity`: cosines, Pearson), centred Gram matrices
(:mod:`checks.cka`: linear and kernel CKA) and whole matrices (:mod:`checks.matrix_similarity`:
relative Frobenius, allclose, subspace overlap); :mod:`checks.metric_suite` computes them all at
once. Nothing here loops over heads or samples except the assignment solver in
:mod:`checks.assignment`.

Each metric is split into per-operand pieces (the ``*_operand`` functions: what depends on one
matrix only) and a pairing step (``*_pair``), both without the input checks. The public metric
functions check their inputs and compose the two; :func:`checks.metric_suite.metric_suite`
composes the same pieces but computes the learned V's side once for V̂ and the null V̂₀
together. Every formula lives in exactly one of these functions.

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

from .errors import check_finite


def check_pair(x: torch.Tensor, y: torch.Tensor) -> None:
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


def tiny(x: torch.Tensor) -> float:
    return torch.finfo(x.dtype).tiny


def rescale(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """x divided by its largest magnitude over ``dims`` (clamped at finfo.tiny): zero stays zero."""
    peak = x.abs().amax(dim=dims, keepdim=True)
    return x / peak.clamp_min(tiny(x))


def centre_tokens(x: torch.Tensor) -> torch.Tensor:
    """Matrices [..., N, m] with each column centred over the tokens (rows): H X, H = I − 11ᵀ/N,
    the centring of the Gram matrix (method §1) applied to a token-by-feature matrix.

    >>> centre_tokens(torch.tensor([[1.0, 2.0], [3.0, 2.0]])).tolist()
    [[-1.0, 0.0], [1.0, 0.0]]
    """
    return x - x.mean(dim=-2, keepdim=True)


def peak_one(x: torch.Tensor) -> torch.Tensor:
    """Matrices [..., a, b] divided by their largest magnitude (the matrix metrics' first step)."""
    return rescale(x, (-2, -1))


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit Euclidean norm; a zero row stays zero (module docstring)."""
    x = rescale(x, (-1,))
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(tiny(x))


def unit_frobenius(x: torch.Tensor) -> torch.Tensor:
    """Matrices [..., a, b] scaled to unit Frobenius norm; a zero matrix stays zero."""
    x = rescale(x, (-2, -1))
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    return x / norm.clamp_min(tiny(x))
