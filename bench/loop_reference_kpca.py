"""This module owns method §1 on one head, as the loop references write it: the input check of a
head's [N, d] array, per-token standardisation, the explicit centring matrix H = I − 11ᵀ/N, the
centred Gram matrix H K_φ H in log space, the rank threshold N·ε·‖K_φ‖₂, sign fixing and column
padding. Float64 NumPy/SciPy only; nothing from :mod:`checks`."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

EPS = np.finfo(np.float64).eps
TINY = np.finfo(np.float64).tiny


def as_f64(x, name: str, ndims: tuple[int, ...] = (2,)) -> np.ndarray:
    arr = np.array(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)
    if arr.ndim not in ndims:
        raise ValueError(f"{name} must be a 2-D array [N, d] for one head, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or Inf")
    return arr


def standardize(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Per-token (x − mean)/(std + eps) over the features, unbiased std (method §1)."""
    return (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, ddof=1, keepdims=True) + eps)


def centring_matrix(n: int) -> np.ndarray:
    """H = I − 11ᵀ/N (method §1)."""
    return np.eye(n) - np.full((n, n), 1.0 / n)


def sign_fixed(vectors: np.ndarray) -> np.ndarray:
    """Each column flipped so that its entry of largest magnitude is positive (method §1)."""
    out = vectors.copy()
    for col in range(out.shape[1]):
        if out[np.argmax(np.abs(out[:, col])), col] < 0:
            out[:, col] = -out[:, col]
    return out


def pad_columns(x: np.ndarray, d: int) -> np.ndarray:
    """x [N, m] right-padded with zero columns to [N, d]."""
    return np.hstack([x, np.zeros((x.shape[0], d - x.shape[1]))]) if x.shape[1] < d else x


def centred_gram(k: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(K_φ, H K_φ H, log g) of keys k [N, d] with softmax scale s, in log space, with the explicit
    H (method §1): S = s·K Kᵀ, log g_j = logsumexp_m S_jm, K_φ = exp(S − log g_i − log g_j); the
    centred matrix is symmetrised against round-off."""
    scores = s * (k @ k.T)  # method §1: S = s·K Kᵀ
    log_g = logsumexp(scores, axis=1)  # log g_j = logsumexp_m S_jm
    k_phi = np.exp(scores - log_g[:, None] - log_g[None, :])  # K_φ in log space
    h = centring_matrix(len(k))
    kc = h @ k_phi @ h  # K̃ = H K_φ H
    return k_phi, 0.5 * (kc + kc.T), log_g


def rank_threshold(k_phi: np.ndarray) -> float:
    """N·ε·‖K_φ‖₂, ‖K_φ‖₂ the largest eigenvalue of K_φ (PSD): an eigenvalue of the centred Gram
    matrix at or below it is numerically zero (method §1, the undetermined rule)."""
    return len(k_phi) * EPS * float(np.linalg.eigvalsh(k_phi)[-1])
