"""Claim V by directions (method §2.5): which of V̂'s leading directions span(V) contains.

The subspace overlap (:func:`checks.matrix_similarity.subspace_overlap`) is one number per head,
the mean cos² of the principal angles between span(V) and span(V̂). It cannot tell a head that
shares half of V̂'s directions exactly from one whose every direction is tilted half-way, nor
V̂'s top directions from its bottom ones, although P1's claim is about the top ones. Here each of
V̂'s directions is taken in its eigenvalue order: direction m is the part of V̂'s m-th column
(the m-th largest eigenvalue of the centred key Gram) not in the span of the columns before it,
and its *capture* is the share of it that span(V) holds, c_m = ‖Q_Vᵀ q_m‖² ∈ [0, 1] (1: span(V)
contains it). Both sides are centred over the tokens, as the overlap's are, so the captures do
not change under the maps the network cannot see, V → V·M + 1cᵀ.

From the captures: ``shared``, how many of V̂'s directions span(V) holds to cos² ≥ ``bar`` (0.9
by default, a near-exact direction), and ``weighted``, the captures averaged with the directions'
eigenvalues as weights (the share of the kernel's variance in its top d components whose
directions span(V) holds), which ranks a head holding V̂'s top directions above one holding its
bottom ones. Pure batched tensor math; nothing here loops over heads or samples.
"""

from __future__ import annotations

import torch

from . import linalg_route as la
from .matrix_similarity import centred_column_basis
from .similarity_scaling import centre_tokens, peak_one

#: cos² at or above which a direction counts as shared (a near-exact direction).
SHARED_BAR = 0.9


def centred_peak_one(y: torch.Tensor) -> torch.Tensor:
    """y [..., N, d] at peak 1 with each column centred over the tokens: the matrix whose QR
    gives :func:`nested_directions` (and whose column space is the subspace overlap's,
    :func:`checks.matrix_similarity.centred_column_basis` of ``peak_one(y)``)."""
    return centre_tokens(peak_one(y))


def nested_directions(y: torch.Tensor, qr: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [..., N, d], valid [..., d]): orthonormal directions of y's columns centred over the
    tokens, in column order, q_m the part of column m not in the span of columns 1..m−1 (QR
    without pivoting); ``valid`` where that part is not round-off (|R_mm| above
    max(N, d)·ε·max |R_jj|). Columns past N (N < d) are zero and not valid. ``qr``: the
    ``torch.linalg.qr`` of :func:`centred_peak_one` of y when the caller has it.

    >>> y = torch.tensor([[1.0, 1.0], [0.0, 1.0], [-1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    >>> q, valid = nested_directions(torch.cat([y, y[:, :1]], -1))  # a repeated column
    >>> valid.tolist()  # the second column is constant: nothing is left of it once centred
    [True, False, False]
    """
    n, d = y.shape[-2], y.shape[-1]
    q, r = la.qr(centred_peak_one(y)) if qr is None else qr
    diag = torch.diagonal(r, dim1=-2, dim2=-1).abs()  # [..., min(N, d)]
    eps = torch.finfo(y.dtype).eps
    valid = diag > max(n, d) * eps * diag.amax(-1, keepdim=True).clamp_min(torch.finfo(y.dtype).tiny)
    if n < d:
        q = torch.nn.functional.pad(q, (0, d - n))
        valid = torch.nn.functional.pad(valid, (0, d - n), value=False)
    return q * valid.to(q.dtype).unsqueeze(-2), valid


def shuffled_directions(nested: tuple[torch.Tensor, torch.Tensor],
                        perm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ΠY's nested directions from Y's (:func:`nested_directions`): the same directions with the
    tokens in the order ``perm`` [..., N], the same validity (claim V's token-shuffled null ΠV̂)."""
    q, valid = nested
    return q.gather(-2, perm.unsqueeze(-1).expand_as(q)), valid


def leading_capture(x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor, *,
                    bar: float = SHARED_BAR) -> dict[str, torch.Tensor]:
    """How much of each of y's directions (V̂'s, in eigenvalue order) the span of x (V) holds.

    Parameters
    ----------
    x, y : Tensor [..., N, d]
        Learned values V and the kernel-PCA values V̂ (columns in descending eigenvalue order).
    weights : Tensor [..., d]
        The directions' weights: the eigenvalues μ_m of the centred key Gram (non-negative;
        a direction of weight 0 adds nothing to ``weighted``).
    bar : float
        The cos² at or above which a direction counts as shared (:data:`SHARED_BAR`).

    Returns
    -------
    dict of Tensor
        ``capture`` [..., d]: c_m = ‖Q_xᵀ q_m‖² (NaN for a direction that is not valid:
        :func:`nested_directions`); ``shared`` [...]: how many valid c_m ≥ ``bar``;
        ``weighted`` [...]: Σ w_m c_m / Σ w_m over the valid directions (NaN when no valid
        direction has weight); ``directions`` [...]: how many directions are valid.

    Examples
    --------
    V = V̂ up to the maps the network cannot see holds every direction:

    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randn(20, 4, generator=g, dtype=torch.float64)
    >>> m = torch.randn(4, 4, generator=g, dtype=torch.float64)
    >>> out = leading_capture(y @ m + 3.0, y, torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64))
    >>> [round(c, 9) for c in out["capture"].tolist()], int(out["shared"]), round(float(out["weighted"]), 9)
    ([1.0, 1.0, 1.0, 1.0], 4, 1.0)
    """
    if x.shape != y.shape or weights.shape != (*y.shape[:-2], y.shape[-1]):
        raise ValueError(f"x and y must be [..., N, d] and weights [..., d]; got x "
                         f"{tuple(x.shape)}, y {tuple(y.shape)}, weights {tuple(weights.shape)}")
    qx, _rank = centred_column_basis(peak_one(x))
    qy, valid = nested_directions(y)
    capture = (qx.transpose(-1, -2) @ qy).pow(2).sum(dim=-2)  # [..., d]
    capture = torch.where(valid, capture, torch.full_like(capture, float("nan")))
    w = torch.where(valid, weights.to(capture.dtype).clamp_min(0.0), torch.zeros_like(capture))
    total = w.sum(dim=-1)
    weighted = (w * capture.nan_to_num(0.0)).sum(dim=-1) / total
    weighted = torch.where(total > 0, weighted, torch.full_like(weighted, float("nan")))
    return {"capture": capture, "shared": ((capture >= bar) & valid).sum(dim=-1),
            "weighted": weighted, "directions": valid.sum(dim=-1)}


def principal_angle_count(x: torch.Tensor, y: torch.Tensor, *,
                          bar: float = SHARED_BAR) -> torch.Tensor:
    """How many principal angles between the centred column spaces of x and y have cos² ≥
    ``bar``: the directions the two spans share near-exactly, in whatever order (the count the
    overlap's mean cos² hides, method §2.6). Shape [...].

    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randn(30, 6, generator=g, dtype=torch.float64)
    >>> x = torch.cat([y[:, :2], torch.randn(30, 4, generator=g, dtype=torch.float64)], -1)
    >>> int(principal_angle_count(y @ torch.eye(6, dtype=torch.float64) + 1.0, y)), int(principal_angle_count(x, y))
    (6, 2)
    """
    qx, _ = centred_column_basis(peak_one(x))
    qy, _ = centred_column_basis(peak_one(y))
    cos2 = la.svdvals(qx.transpose(-1, -2) @ qy).pow(2)
    return (cos2 >= bar).sum(dim=-1)


def shared_directions(x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor, *,
                      bar: float = SHARED_BAR) -> dict[str, torch.Tensor]:
    """The directions span(x) and span(y) share near-exactly, counted and weighted toward y's
    top eigenvectors (method §2.6): claim V's tier "partial".

    The principal angles of the centred column spaces (x: V, y: V̂) give principal vectors
    u_i in span(y) with cos²θ_i ≥ ``bar`` for the shared ones. ``count`` is how many there are
    (in whatever order V̂ holds them). ``weighted`` is the share of V̂'s eigenvalue mass that
    they carry, Σ_{i shared} Σ_m p_m (q_mᵀu_i)², with q_m V̂'s directions in eigenvalue order
    (:func:`nested_directions`) and p_m = μ_m / Σ μ over the valid directions: 1 when every
    direction is shared, the top-k eigenvalue share when V̂'s top k are, ≈ 0 when only its bottom
    ones are or none is. Both are unchanged by x → x·M + 1cᵀ and by y's column scales.

    Parameters
    ----------
    x, y : Tensor [..., N, d]
        Learned values V and the kernel-PCA values V̂ (columns in descending eigenvalue order).
    weights : Tensor [..., d]
        V̂'s eigenvalues μ_m (clamped at 0; an invalid direction weighs nothing).

    Returns
    -------
    dict of Tensor [...]
        ``count`` (float) and ``weighted`` (0 when no valid direction has weight: V̂ is then
        undetermined, method §2.2, and the sample enters no mean).

    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randn(40, 4, generator=g, dtype=torch.float64)
    >>> mu = torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64)
    >>> top = torch.cat([y[:, :2], torch.randn(40, 2, generator=g, dtype=torch.float64)], -1)
    >>> out = shared_directions(top @ torch.randn(4, 4, generator=g, dtype=torch.float64) + 1.0, y, mu)
    >>> int(out["count"]), round(float(out["weighted"]), 2)  # V̂'s top two: 12 of 15 of its mass
    (2, 0.8)
    """
    if x.shape != y.shape or weights.shape != (*y.shape[:-2], y.shape[-1]):
        raise ValueError(f"x and y must be [..., N, d] and weights [..., d]; got x "
                         f"{tuple(x.shape)}, y {tuple(y.shape)}, weights {tuple(weights.shape)}")
    qx, _rank = centred_column_basis(peak_one(x))
    return shared_from_bases(qx, *nested_directions(y), weights, bar=bar)


def shared_from_bases(qx: torch.Tensor, qy: torch.Tensor, valid: torch.Tensor,
                      weights: torch.Tensor, *, bar: float = SHARED_BAR) -> dict[str, torch.Tensor]:
    """:func:`shared_directions` from x's centred orthonormal basis ``qx`` [..., N, d] and y's
    nested directions ``qy``, ``valid`` (:func:`nested_directions`): for a caller that has them
    (claim V's null ΠV̂ has Π·qy for directions, the same weights)."""
    # vh's rows: the principal vectors u_i in y's nested basis, one per singular value (qx may
    # have fewer columns than qy: N < d)
    _, s, vh = la.svd(qx.transpose(-1, -2) @ qy, full_matrices=False)
    shared = (s.pow(2) >= bar).to(qy.dtype)  # [..., min(columns)]
    w = weights.to(qy.dtype).clamp_min(0.0)
    w = torch.where(valid, w, torch.zeros_like(w))
    total = w.sum(dim=-1, keepdim=True)
    p = w / total.clamp_min(torch.finfo(qy.dtype).tiny)
    mass = (vh.pow(2) * p.unsqueeze(-2)).sum(dim=-1)  # [..., d]: Σ_m p_m (q_mᵀu_i)²
    return {"count": shared.sum(dim=-1), "weighted": (shared * mass).sum(dim=-1)}
