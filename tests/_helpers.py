"""Helpers shared by the project's own tests: the float64 dtype, seeded generators and random
tensors, the two relative-error comparisons the known-answer tests use, and the named tolerances
of comparisons between two code paths of one computation (``CROSS_PATH_*``).

Import them as ``from tests._helpers import F64, randn, rel_err`` (the checkout is on ``sys.path``
when pytest runs from it). Keeping them here means one definition of "a seeded float64 normal
tensor" and of "relative error", instead of a copy per test file.
"""

from __future__ import annotations

import torch

__all__ = ["CROSS_PATH_TERMS_RTOL", "CROSS_PATH_UNIT", "EPS32", "F64", "close",
           "cross_path_f32_eigenvalues", "cross_path_terms", "gen", "randn", "rel_err"]

#: The dtype of every reference computation in the tests.
F64 = torch.float64
#: float32's machine epsilon, the unit of float32 tolerances.
EPS32 = torch.finfo(torch.float32).eps

# --- one computation by two code paths -----------------------------------------------------------
# Batched against one item alone, one position of a batch against another, chunked against whole,
# a float32 route against itself in another batch: each path may run other BLAS, LAPACK, oneDNN or
# libm kernels (another summation order, FMA or not, another blocking for another shape or
# alignment), and which ones depends on the CPU. Paths that give the same bits on one machine need
# not on another: a batched ``canonical_axes`` did not on an Intel Xeon, and under MKL's SSE4.2
# path with CBWR (``MKL_ENABLE_INSTRUCTIONS=SSE4_2 MKL_CBWR=COMPATIBLE``, one of
# tests/test_cpu_emulation.py's settings) claim J's per-token ‖h‖² and log ‖φ‖² of MiniLM differ
# by up to 8 ulps between a batch of 12 heads and one head alone (tests/test_end_to_end.py).
# Such comparisons use the tolerances below. Bitwise stays where it is a property of our code on
# one machine: the same call twice, serial against -n, shards against one run, cache against
# fresh, values copied, sliced, saved or loaded, and results of exact IEEE operations.

#: Float64 results of order one, bounded by about 1 in magnitude (entries of orthonormal bases,
#: cosines, CKA, subspace overlaps, relative Frobenius errors near 1), from products, QR and means
#: over at most a few thousand terms of well-conditioned inputs (condition ≲ 10): each path is
#: within a few ε·√n of the exact value, so two paths differ by about 1e-15 (measured at most
#: 1.3e-15, 6 ulps, between the kernels of every emulated setting). 1e-14 ≈ 45 ε keeps a margin of
#: about 8 over that; anything beyond round-off (another basis, another item's data or seed, a
#: column of the other route) moves such entries by 1e-3 or more.
CROSS_PATH_UNIT = dict(rtol=0.0, atol=1e-14)

#: Relative tolerance of claim J's float64 terms (‖φ(q)‖², ‖h‖², their logarithms and means) taken
#: by two paths. Every term starts from the scores s·qᵀk, dot products over the
#: head's d features whose rounding error is at most d·ε·Σ_i|s·q_i·k_i| ≈ 32 · 2.2e-16 · 50
#: ≈ 3.6e-13 on MiniLM's heads (d = 32; Σ_i|s·q_i·k_i| measured at most 46): an absolute error of
#: the exponentials' arguments, hence a relative error of every exp, softmax weight and ‖h‖², and
#: an absolute error of every log. 1e-12 bounds that worst case with a margin of about 3;
#: measured between a batch of 12 heads and one head alone: 8 ulps (1.5e-15).
CROSS_PATH_TERMS_RTOL = 1e-12


def cross_path_terms(reference: torch.Tensor) -> dict:
    """``rtol``/``atol`` for float64 terms like claim J's computed by two paths (see
    :data:`CROSS_PATH_TERMS_RTOL`): :data:`CROSS_PATH_TERMS_RTOL` relative to each element, and
    the same times the largest finite |entry| of ``reference`` absolute, since a sum or a
    difference carries the round-off of its largest terms (log ‖φ‖² near 0, J_proj)."""
    finite = reference[torch.isfinite(reference)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return dict(rtol=CROSS_PATH_TERMS_RTOL, atol=CROSS_PATH_TERMS_RTOL * scale)


def cross_path_f32_eigenvalues(n: int, norm: float) -> dict:
    """``rtol``/``atol`` for the eigenvalues of one n×n matrix built and solved in float32 by two
    paths (claim E's naive route in another batch): the float32 sums that build the matrix and a
    backward-stable eigensolver move each eigenvalue by at most about n·ε₃₂·‖M‖₂ (``norm``), so
    two paths differ by less than that (measured 0.2 of it for n = 16)."""
    return dict(rtol=0.0, atol=n * EPS32 * norm)


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: the same draws on every run and platform."""
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0, scale: float = 1.0, dtype: torch.dtype = F64) -> torch.Tensor:
    """``scale`` × standard normal draws of ``shape`` from :func:`gen` (``seed``), float64 by default."""
    return scale * torch.randn(*shape, generator=gen(seed), dtype=dtype)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|: the largest error relative to the reference ``b``'s largest entry."""
    return float((a - b).abs().max() / b.abs().max())


def close(a: float, b: float, rtol: float, floor: float = 1e-3) -> bool:
    """|a − b| ≤ rtol · max(|a|, |b|, floor): relative agreement, absolute below ``floor``."""
    return abs(a - b) <= rtol * max(abs(a), abs(b), floor)
