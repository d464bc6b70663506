"""This module owns the similarity metrics of method §2 on one head, as the loop reference writes
them (textbook forms: the N×N Gram form of linear CKA, ``scipy.spatial.distance.pdist`` for kernel
CKA, column-pivoted QR bases for the subspace overlap, SciPy's Hungarian solver for the optimal
cosine). Float64 NumPy/SciPy only; nothing from :mod:`checks`.

Scale handling (numerics, not part of the method): V̂ carries the factor 1/g_j, which can be very
small, so every scale-invariant metric divides its operands by their largest magnitude first (per
row for row metrics, per matrix for matrix metrics). A zero row or matrix yields 0, never NaN.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import qr as pivoted_qr
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import pdist, squareform

from .loop_reference_kpca import EPS, TINY, centring_matrix

METRIC_NAMES = ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka",
                "relative_frobenius", "pearson", "allclose", "subspace_overlap")
ALLCLOSE_ATOL, ALLCLOSE_RTOL = 1e-5, 1e-3  # method §2: |V − V̂| ≤ 1e-5 + 1e-3·|V̂|


def by_peak(x: np.ndarray, axis=None) -> np.ndarray:
    peak = np.abs(x).max(axis=axis, keepdims=axis is not None)
    return x / np.maximum(peak, TINY)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of x scaled to unit length; a zero row stays zero."""
    xs = by_peak(x, axis=1)
    norm = np.linalg.norm(xs, axis=1, keepdims=True)
    return np.divide(xs, norm, out=np.zeros_like(xs), where=norm > 0)


def direct_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Mean over tokens of cos(v_j, v̂_j) (method §2); a zero row counts as 0."""
    return float(np.mean(np.clip(np.sum(unit_rows(x) * unit_rows(y), axis=1), -1.0, 1.0)))


def optimal_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Mean matched cosine under the Hungarian matching maximising Σ cos(v_j, v̂_π(j)) (method §2)."""
    c = np.clip(unit_rows(x) @ unit_rows(y).T, -1.0, 1.0)  # C[j, k] = cos(v_j, v̂_k)
    rows, cols = linear_sum_assignment(c, maximize=True)
    return float(c[rows, cols].mean())


def _cka_of_grams(kx: np.ndarray, ky: np.ndarray) -> float:
    """⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F); 0 when either centred Gram is zero."""
    h = centring_matrix(len(kx))
    cx, cy = by_peak(h @ kx @ h), by_peak(h @ ky @ h)
    nx, ny = np.linalg.norm(cx), np.linalg.norm(cy)
    if nx == 0 or ny == 0:
        return 0.0
    return float(np.sum(cx * cy) / (nx * ny))


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA, biased HSIC, in the N×N Gram form with K_X = XXᵀ (method §2)."""
    xs, ys = by_peak(x), by_peak(y)
    return _cka_of_grams(xs @ xs.T, ys @ ys.T)


def _rbf(x: np.ndarray) -> np.ndarray:
    """exp(−‖x_i − x_j‖²/(2σ²)), σ² the lower middle value of the pairwise squared distances."""
    dist = pdist(by_peak(x), "sqeuclidean")
    sigma2 = max(float(np.sort(dist)[(len(dist) - 1) // 2]), TINY)  # method §2: lower median
    return np.exp(-squareform(dist) / (2.0 * sigma2))


def kernel_cka(x: np.ndarray, y: np.ndarray) -> float:
    """CKA with RBF Gram matrices, σ² chosen separately for V and V̂ (method §2)."""
    return _cka_of_grams(_rbf(x), _rbf(y))


def relative_frobenius(x: np.ndarray, y: np.ndarray) -> float:
    """‖V − V̂‖_F / ‖V‖_F (method §2); 0 for two zero matrices, inf for a zero V alone."""
    peak = max(np.abs(x).max(), np.abs(y).max(), TINY)
    num, den = np.linalg.norm((x - y) / peak), np.linalg.norm(x / peak)
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return float(num / den)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Per token, the correlation of v_j and v̂_j over the d features; mean over tokens (method §2)."""
    xs, ys = by_peak(x, axis=1), by_peak(y, axis=1)
    xc, yc = xs - xs.mean(axis=1, keepdims=True), ys - ys.mean(axis=1, keepdims=True)
    r = np.clip(np.sum(unit_rows(xc) * unit_rows(yc), axis=1), -1.0, 1.0)  # zero variance → 0
    return float(np.mean(r))


def allclose(x: np.ndarray, y: np.ndarray) -> float:
    """1.0 when |V − V̂| ≤ 1e-5 + 1e-3·|V̂| everywhere, else 0.0 (method §2)."""
    return float(np.all(np.abs(x - y) <= ALLCLOSE_ATOL + ALLCLOSE_RTOL * np.abs(y)))


def _column_basis(x: np.ndarray) -> np.ndarray:
    """Orthonormal basis of x's numerical column space by column-pivoted QR.

    Rank = number of |R_ii| > max(N, d)·ε·|R_00| (the pivoted-QR stand-in for the SVD rule).
    """
    q, r, _ = pivoted_qr(by_peak(x), mode="economic", pivoting=True)
    diag = np.abs(np.diag(r))
    if diag.size == 0 or diag[0] == 0:
        return q[:, :0]
    rank = int(np.sum(diag > max(x.shape) * EPS * diag[0]))
    return q[:, :rank]


def subspace_overlap(x: np.ndarray, y: np.ndarray) -> float:
    """Mean cos² of the principal angles between the centred column spaces of V and V̂ (method
    §2, ours; each column centred over the tokens, so a value bias 1cᵀ does not count):
    Σ σ_i(Q_xᵀQ_y)² / max(rank x, rank y)."""
    qx = _column_basis(by_peak(x) - by_peak(x).mean(axis=0))
    qy = _column_basis(by_peak(y) - by_peak(y).mean(axis=0))
    if qx.shape[1] == 0 or qy.shape[1] == 0:
        return 0.0
    cosines = np.linalg.svd(qx.T @ qy, compute_uv=False)
    return float(np.sum(cosines ** 2) / max(qx.shape[1], qy.shape[1]))


METRICS = {"direct_cosine": direct_cosine, "linear_cka": linear_cka, "kernel_cka": kernel_cka,
           "relative_frobenius": relative_frobenius, "pearson": pearson, "allclose": allclose,
           "subspace_overlap": subspace_overlap}
