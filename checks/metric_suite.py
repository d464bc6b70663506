"""This module owns :func:`metric_suite`: every similarity metric of claim V of a learned V
against several targets at once (V̂ and the null V̂₀), with V's side computed once. It composes the
per-operand and pairing pieces of :mod:`checks.row_similarity`, :mod:`checks.cka` and
:mod:`checks.matrix_similarity`, so each formula stays in its metric's module."""

from __future__ import annotations

import torch

from . import linalg_route as la
from .cka import gram_cka_pair, kernel_cka_operand, linear_cka_operand, linear_cka_pair
from .leading_directions import (SHARED_BAR, nested_directions, shared_from_bases,
                                 shuffled_directions)
from .matrix_similarity import (allclose_pair, orthonormal_column_basis, overlap_pair,
                                relative_frobenius_pair)
from .row_similarity import cosine_pair, direct_pair, pearson_operand
from .similarity_scaling import centre_tokens, check_pair, peak_one, unit_rows


SUITE_NAMES = ("direct_cosine", "linear_cka", "kernel_cka", "relative_frobenius", "pearson",
               "allclose", "subspace_overlap")
#: The direction metrics (method §2.6) the suite adds when given the targets' weights, and
#: their keys in :func:`checks.leading_directions.shared_from_bases`'s result.
DIRECTION_KEYS = {"shared_directions": "count", "top_weighted_share": "weighted"}


def metric_suite(x: torch.Tensor, ys: torch.Tensor, *, atol: float, rtol: float,
                 weights: torch.Tensor | None = None,
                 bar: float = SHARED_BAR) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
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
    weights : Tensor [..., d], optional
        V̂'s eigenvalues, the weights of every target's directions: adds the direction metrics
        of :data:`DIRECTION_KEYS` (:func:`checks.leading_directions.shared_directions` of x
        against each target, ``bar`` its shared bar), with each target's nested directions
        taken from the QR factorisation its column basis makes anyway.

    Returns
    -------
    (metrics, cos)
        ``metrics``: each name of :data:`SUITE_NAMES` (and, with ``weights``, of
        :data:`DIRECTION_KEYS`) → Tensor [T, ...], equal to the metric function of that name
        applied to (x, ys[t]) (``allclose`` as bool). ``cos``: the cosine
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
    ox, oy = leading(operands(x)), operands(ys, nested=weights is not None)
    nested = [tuple(part[t] for part in oy["nested"]) for t in range(ys.shape[0])] \
        if weights is not None else []
    return _with_directions(pair_metrics(ox, oy, atol=atol, rtol=rtol), ox, nested, weights, bar), \
        cosine_pair(ox["unit"], oy["unit"])


def _with_directions(metrics: dict, ox: dict, nested: list[tuple[torch.Tensor, torch.Tensor]],
                     weights: torch.Tensor | None, bar: float) -> dict:
    """``metrics`` with the direction metrics of x against each target added when ``weights``
    are given: one :func:`shared_from_bases` per target's nested directions (q, valid), each
    as its factorisation (or the permutation of V̂'s) laid it out: never a stacked copy, whose
    other memory layout can move a product by an ulp."""
    if weights is None:
        return metrics
    qx = ox["basis"][0][0]
    per = [shared_from_bases(qx, q, valid, weights, bar=bar) for q, valid in nested]
    metrics.update({name: torch.stack([p[key] for p in per])
                    for name, key in DIRECTION_KEYS.items()})
    return metrics


def metric_suite_shuffled(x: torch.Tensor, y: torch.Tensor, perm: torch.Tensor, *, atol: float,
                          rtol: float, weights: torch.Tensor | None = None,
                          bar: float = SHARED_BAR) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """:func:`metric_suite` of x against the two targets y and Πy (y's tokens in the order
    ``perm`` [..., N]: the token-shuffled null of method §2.3), with y's operands computed once
    and the null's taken from them by :func:`permuted` (a gather, where a second set of operands
    would cost a second QR factorisation and CKA operand per head). Equal to
    ``metric_suite(x, torch.stack([y, Πy]))`` up to round-off in the null's token sums.

    >>> g = torch.Generator().manual_seed(0)
    >>> x, y = (torch.randn(9, 3, generator=g, dtype=torch.float64) for _ in range(2))
    >>> perm = torch.randperm(9, generator=g)
    >>> fast, _ = metric_suite_shuffled(x, y, perm, atol=1e-5, rtol=1e-3)
    >>> plain, _ = metric_suite(x, torch.stack([y, y[perm]]), atol=1e-5, rtol=1e-3)
    >>> all(torch.allclose(fast[k].double(), plain[k].double(), rtol=1e-12, atol=1e-14)
    ...     for k in SUITE_NAMES)
    True
    """
    if perm.shape != y.shape[:-1]:
        raise ValueError(f"perm must hold one permutation of the N tokens per item, shape "
                         f"{tuple(y.shape[:-1])}, got {tuple(perm.shape)}")
    check_pair(x, y)  # shapes, dtypes and finiteness of both, once (Πy has y's entries)
    ox, oy = leading(operands(x)), operands(y, nested=weights is not None)
    shuffled = permuted(oy, perm)
    nested = [ops.pop("nested") for ops in (oy, shuffled) if "nested" in ops]
    targets = stacked([oy, shuffled])
    return (_with_directions(pair_metrics(ox, targets, atol=atol, rtol=rtol), ox, nested, weights,
                             bar), cosine_pair(ox["unit"], targets["unit"]))


def stacked(ops: list[dict]) -> dict:
    """Several :func:`operands` results stacked along a new leading axis, as ``operands`` of the
    stacked inputs would be laid out ([T, ...])."""
    def stack(parts: list) -> torch.Tensor | tuple:
        if isinstance(parts[0], tuple):
            return tuple(torch.stack(items) for items in zip(*parts))
        return torch.stack(parts)

    return {name: stack([op[name] for op in ops]) for name in ops[0]}


def operands(x: torch.Tensor, nested: bool = False) -> dict:
    """Each metric's own side of :func:`metric_suite` for x [..., N, d] (a stack of targets
    too): the raw matrix (entrywise metrics), unit rows (cosines), the linear and kernel CKA
    operands, the Pearson operand and the centred orthonormal column basis, all of x at peak 1;
    with ``nested``, x's nested directions too (:func:`checks.leading_directions.nested_directions`),
    from the same QR factorisation as the basis (one QR of the centred x for both). No input
    checks: :func:`metric_suite` and its callers check x once."""
    xs = peak_one(x)
    ops = {"raw": x, "unit": unit_rows(xs), "linear": linear_cka_operand(xs),
           "kernel": kernel_cka_operand(xs), "pearson": pearson_operand(xs)}
    centred = centre_tokens(xs)  # = centred_peak_one(x), peak_one computed once
    factors = la.qr(centred) if nested else None
    ops["basis"] = orthonormal_column_basis(centred, qr=factors)
    if nested:
        ops["nested"] = nested_directions(x, qr=factors)
    return ops


def leading(ops: dict) -> dict:
    """:func:`operands` with a new leading axis of size 1 on every tensor (x against T targets)."""
    return {name: (tuple(t.unsqueeze(0) for t in op) if isinstance(op, tuple) else op.unsqueeze(0))
            for name, op in ops.items()}


def permuted(ops: dict, perm: torch.Tensor) -> dict:
    """The :func:`operands` of ΠX, x's tokens (rows) in the order ``perm`` [..., N], from those of
    x: every operand is x's with its token axis permuted (rows; the kernel CKA operand's rows and
    columns), since the peak, the per-row scalings, the token means and the column space do not
    depend on token order. Equal to ``operands(x[..., perm, :])`` up to round-off (its sums run
    in another order), at the cost of a gather (method §2.3: the token-shuffled null ΠV̂)."""
    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-2, perm.unsqueeze(-1).expand(*perm.shape, t.shape[-1]))

    (xc, self_x), (q, rank) = ops["linear"], ops["basis"]
    out = {"raw": rows(ops["raw"]), "unit": rows(ops["unit"]), "linear": (rows(xc), self_x),
           "kernel": rows(rows(ops["kernel"]).transpose(-1, -2)).transpose(-1, -2),
           "pearson": rows(ops["pearson"]), "basis": (rows(q), rank)}
    if "nested" in ops:
        out["nested"] = shuffled_directions(ops["nested"], perm)
    return out


def pair_metrics(ox: dict, oy: dict, *, atol: float, rtol: float) -> dict[str, torch.Tensor]:
    """Every metric of :data:`SUITE_NAMES` from x's operands (:func:`leading`) and the targets'
    [T, ...]: the pairing step of :func:`metric_suite`."""
    return {
        "direct_cosine": direct_pair(ox["unit"], oy["unit"]),
        "linear_cka": linear_cka_pair(ox["linear"], oy["linear"]),
        "kernel_cka": gram_cka_pair(ox["kernel"], oy["kernel"]),
        "relative_frobenius": relative_frobenius_pair(ox["raw"], oy["raw"]),
        "pearson": direct_pair(ox["pearson"], oy["pearson"]),
        "allclose": allclose_pair(ox["raw"], oy["raw"], atol, rtol),
        "subspace_overlap": overlap_pair(ox["basis"], oy["basis"]),
    }


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
