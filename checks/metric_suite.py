"""This module owns :func:`metric_suite`: every similarity metric of claim V of a learned V
against several targets at once (V̂ and the null V̂₀), with V's side computed once. It composes the
per-operand and pairing pieces of :mod:`checks.row_similarity`, :mod:`checks.cka` and
:mod:`checks.matrix_similarity`, so each formula stays in its metric's module."""

from __future__ import annotations

import torch

from .cka import gram_cka_pair, kernel_cka_operand, linear_cka_operand, linear_cka_pair
from .matrix_similarity import (allclose_pair, orthonormal_column_basis, overlap_pair,
                                relative_frobenius_pair)
from .row_similarity import cosine_pair, direct_pair, pearson_operand
from .similarity_scaling import check_pair, peak_one, unit_rows


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
        Tolerances of :func:`checks.matrix_similarity.allclose` (no default:
        ``[claim_v.allclose]`` of the thresholds file).

    Returns
    -------
    (metrics, cos)
        ``metrics``: each name of :data:`SUITE_NAMES` → Tensor [T, ...], equal to the metric
        function of that name applied to (x, ys[t]) (``allclose`` as bool). ``cos``: the cosine
        matrices [T, ..., N, N] of :func:`checks.row_similarity.cosine_matrix`;
        :func:`checks.row_similarity.matched_cosine` turns them into the optimal cosine, left to
        the caller so the Hungarian step can run apart.

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
    check_pair(x.expand_as(ys), ys)  # shapes, dtypes and finiteness of both, once
    xb, xs, yss = x.unsqueeze(0), peak_one(x), peak_one(ys)
    ux, uy = unit_rows(xs).unsqueeze(0), unit_rows(yss)
    out = {
        "direct_cosine": direct_pair(ux, uy),
        "linear_cka": linear_cka_pair(tuple(t.unsqueeze(0) for t in linear_cka_operand(xs)),
                                       linear_cka_operand(yss)),
        "kernel_cka": gram_cka_pair(kernel_cka_operand(xs).unsqueeze(0),
                                     kernel_cka_operand(yss)),
        "relative_frobenius": relative_frobenius_pair(xb, ys),
        "pearson": direct_pair(pearson_operand(xs).unsqueeze(0), pearson_operand(yss)),
        "allclose": allclose_pair(xb, ys, atol, rtol),
        "subspace_overlap": overlap_pair(
            tuple(t.unsqueeze(0) for t in orthonormal_column_basis(xs)),
            orthonormal_column_basis(yss)),
    }
    return out, cosine_pair(ux, uy)


def suite_cosines(x: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The cosine matrices [T, ..., N, N] of :func:`metric_suite` (x against each target of
    ``ys`` [T, ..., N, d]) without its metrics: the same operations on the same operands, so the
    same bits, for a caller that needs only the optimal cosine
    (:func:`checks.row_similarity.matched_cosine`) of a suite it has already computed.

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(8, 3, generator=g, dtype=torch.float64)
    >>> ys = torch.stack([x, torch.randn(8, 3, generator=g, dtype=torch.float64)])
    >>> bool(torch.equal(suite_cosines(x, ys), metric_suite(x, ys, atol=1e-5, rtol=1e-3)[1]))
    True
    """
    if not isinstance(ys, torch.Tensor) or ys.ndim != x.ndim + 1:
        raise ValueError("ys must stack the targets along a new leading axis: [T, ..., N, d]")
    check_pair(x.expand_as(ys), ys)
    return cosine_pair(unit_rows(peak_one(x)).unsqueeze(0), unit_rows(peak_one(ys)))
