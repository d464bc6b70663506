"""What float64 determines of claim E's γ test (method §4.2, "Precision"): :func:`canonical_axes`
makes the eigenvector basis inside a (nearly) degenerate eigenspace independent of the
eigensolver, and :func:`overlap_precision` estimates how far round-off alone moves the
direction-wise overlap ω, so that a number that is not a function of the head at this precision
is reported but never judged. Pure batched tensor math; :mod:`checks.gamma` uses both.
"""

from __future__ import annotations

import functools

import torch

from . import linalg_route as la
from .gram import fix_signs
from .invariant_subspace import invariance_overlap
from .round_off import ROUND_OFF


#: Consecutive eigenvalues closer than this times |μ_1| form one (nearly) degenerate eigenspace for
#: :func:`canonical_axes`: inside such a gap the eigensolver's basis is rotated by up to
#: ε·‖K̃‖/gap ≈ 2e-6 or more, which moves P2's perturbed control beyond the judged tolerance.
DEGENERATE_RTOL = 1e-10


# ROUND_OFF (checks/round_off.py): the relative size of the round-off perturbation of K̃ and Â in
# :func:`overlap_precision`, about 5 ulps of the largest entry, the size of the centring's
# round-off; the round-off twins use the same size.


#: ω is *not determined at float64* in a sample when the round-off perturbation of
#: :func:`overlap_precision` moves it by more than this, relatively. Measured on the claim-identity
#: selection (216 samples × heads of MiniLM and of the tiny ViT's checkpoints): where the estimate
#: is at most 1e-7, ω moved by at most 1.1e-8 relative between MKL on SSE4.2 (CBWR) and the native
#: dispatch, a margin of about 100 to the judged tolerance 1e-6 (method §4.2, §13).
OVERLAP_PRECISION_BAR = 1e-7


def canonical_axes(eigenvalues: torch.Tensor, axes: torch.Tensor,
                   rtol: float = DEGENERATE_RTOL) -> torch.Tensor:
    """The eigenvectors ``axes`` with each (nearly) degenerate eigenspace given a basis that depends
    on the eigenspace alone, not on the eigensolver (method §4.2, "Precision").

    Consecutive eigenvalues (descending) closer than ``rtol``·|μ_1| form one cluster. Inside a
    cluster with columns U, any rotation U·R is as good an eigenvector basis, and which one the
    solver returns depends on its code path. Column k of the cluster is replaced by the projection
    U·Uᵀ·w_k of a fixed vector w_k (from a fixed seed, the same for every head), orthonormalised
    in order (QR) and sign-fixed: UUᵀ does not change under U → U·R, so neither does the basis.
    Columns outside any cluster are returned unchanged, to the bit.

    A cluster cut by the last column (its other members beyond m) keeps the solver's columns: the
    top-m eigenspace itself is then not determined; that happens only where μ_m is at round-off,
    which :attr:`checks.gram.KeyGram.undetermined` flags.

    Parameters
    ----------
    eigenvalues : Tensor [..., m]
        μ, descending.
    axes : Tensor [..., N, m]
        Unit eigenvectors, column k belonging to μ_k.
    rtol : float, default :data:`DEGENERATE_RTOL`

    Returns
    -------
    Tensor [..., N, m], ``axes``' dtype.

    Examples
    --------
    K̃ = diag(3, 2, 2, 1) has the degenerate pair μ_2 = μ_3; any rotation of e_2, e_3 gives the
    same basis:

    >>> mu, a = torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=torch.float64), torch.eye(4, dtype=torch.float64)
    >>> import math
    >>> c, s = math.cos(0.3), math.sin(0.3)
    >>> rot = torch.tensor([[1, 0, 0, 0], [0, c, -s, 0], [0, s, c, 0], [0, 0, 0, 1]], dtype=torch.float64)
    >>> torch.allclose(canonical_axes(mu, a), canonical_axes(mu, a @ rot), atol=1e-15)
    True
    """
    if eigenvalues.shape[-1] != axes.shape[-1] or eigenvalues.shape[:-1] != axes.shape[:-2]:
        raise ValueError(f"eigenvalues [..., m] and axes [..., N, m] must match; got "
                         f"{tuple(eigenvalues.shape)} and {tuple(axes.shape)}")
    m = axes.shape[-1]
    if m < 2:
        return axes
    mu = eigenvalues.to(axes.dtype)
    scale = mu.abs().amax(dim=-1, keepdim=True)
    close = (mu[..., :-1] - mu[..., 1:]).abs() <= rtol * scale                 # [..., m-1]
    if not bool(close.any()):
        return axes
    # cluster id of each column: a new cluster starts wherever the gap is not small
    starts = torch.cat([torch.ones_like(close[..., :1]), ~close], dim=-1)
    ids = starts.to(torch.int64).cumsum(dim=-1)                              # [..., m]
    same = ids.unsqueeze(-1) == ids.unsqueeze(-2)                            # [..., m, m]
    clustered = same.sum(dim=-1) > 1                                         # [..., m]
    # a cluster that reaches the last column may continue beyond it: keep the solver's columns
    last = ids[..., -1:]
    clustered = clustered & ~((ids == last) & close[..., -1:])
    gen = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(axes.shape[-2], m, generator=gen, dtype=torch.float64).to(axes.device, axes.dtype)
    coeff = (axes.transpose(-1, -2) @ w) * same.to(axes.dtype)               # [..., m, m]: a_jᵀw_k, same cluster
    projected = torch.where(clustered.unsqueeze(-2), axes @ coeff, axes)     # U Uᵀ w_k in clusters
    q, _ = la.qr(projected)
    return torch.where(clustered.unsqueeze(-2), fix_signs(q), axes)


def overlap_precision(centred_gram: torch.Tensor, axes: torch.Tensor,
                      omega: torch.Tensor | None = None,
                      extra: torch.Tensor | None = None) -> torch.Tensor:
    """How far round-off alone moves ω(Â) (:func:`checks.invariant_subspace.invariance_overlap`):
    |ω(K̃ + δK, Â + δÂ) − ω(K̃, Â)| / ω(K̃, Â), shape [...] (method §4.2, "Precision").

    δK (symmetric) and δÂ are fixed Gaussian patterns (the same for every head, so the estimate does
    not depend on how heads were batched) scaled to :data:`ROUND_OFF` times the largest entry of
    K̃ and of Â: the size of the round-off that the centring and the products leave in them.
    ω counts every direction of span(Â) and of its image once; where Â or K̃·Â has singular values
    far below the largest (few tokens carry g, graded spectra), those directions are decided by
    round-off and ω with them: the estimate is then large (up to 0.4 measured), and two CPUs give
    ω's that differ by about as much. Where it is small, ω is a function of the head.

    Parameters
    ----------
    centred_gram : Tensor [..., N, N]
    axes : Tensor [..., N, m]
    omega : Tensor [...], optional
        ω(K̃, Â) when the caller has it.
    extra : Tensor [..., N], optional
        The value bias's direction h: ω of span([Â, h]), as claim E judges it (method §4.2).

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(8, 8, generator=g, dtype=torch.float64); k = x @ x.T
    >>> float(overlap_precision(k, torch.randn(8, 3, generator=g, dtype=torch.float64))) < 1e-12
    True
    """
    n, m = axes.shape[-2], axes.shape[-1]
    gram = centred_gram.to(torch.float64)
    a = axes.to(torch.float64)
    if omega is None:
        omega = invariance_overlap(gram, a, extra=extra)
    e_k, e_a = _round_off_patterns(n, m)
    e_k, e_a = e_k.to(gram.device), e_a.to(a.device)
    k_scale = gram.abs().amax(dim=(-2, -1), keepdim=True)
    a_scale = a.abs().amax(dim=(-2, -1), keepdim=True)
    moved = invariance_overlap(gram + ROUND_OFF * k_scale * e_k, a + ROUND_OFF * a_scale * e_a,
                               extra=extra)
    return (moved - omega).abs() / omega.abs().clamp_min(torch.finfo(torch.float64).tiny)


def round_off_gram_pattern(n: int) -> torch.Tensor:
    """The fixed symmetric [n, n] pattern along which K̃ is moved by round-off, here and in the
    round-off twins of claim E (method §13.2)."""
    return _round_off_patterns(n, 1)[0]


@functools.lru_cache(maxsize=8)
def _round_off_patterns(n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed perturbation patterns of :func:`overlap_precision`: symmetric [n, n] and [n, m]."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    e_k = torch.randn(n, n, generator=gen, dtype=torch.float64)
    e_a = torch.randn(n, m, generator=gen, dtype=torch.float64)
    return 0.5 * (e_k + e_k.T), e_a
