"""Robust PCA and Principal Attention Pursuit (PAP), P1's RPC-Attention (method §15).

Pure tensor math, batched over any leading axes ``[..., N, d]``:

- :func:`shrink`: the soft-thresholding operator S_τ(x) = sgn(x)·max(|x| − τ, 0) (method Eq. 15.1);
- :func:`singular_value_threshold`: D_τ(X) = U S_τ(Σ) Vᵀ (method Eq. 15.2);
- :func:`principal_component_pursuit`: Candès, Li, Ma & Wright (2011), Algorithm 1 (robust PCA
  by the augmented Lagrange multiplier method): M = L + S with L low-rank and S sparse;
- :func:`pap_mu` and :func:`pap_attention`: P1's Algorithm 1 as its public code runs it — the same
  alternating scheme on the keys K of a symmetric-attention head, with the singular-value step
  replaced by softmax attention of the de-corrupted keys on themselves (method Eq. 15.3-15.6);
- :func:`effective_rank`, :func:`numerical_rank`, :func:`nonzero_share`: the mechanism readout.

``n_iter = 0`` is plain symmetric softmax attention, softmax(s·KKᵀ)V.

>>> import torch
>>> shrink(torch.tensor([-3.0, -0.5, 0.0, 2.0]), 1.0).tolist()
[-2.0, -0.0, 0.0, 1.0]
>>> k = torch.randn(2, 3, 5, 4, dtype=torch.float64); v = torch.randn(2, 3, 5, 4, dtype=torch.float64)
>>> plain = torch.softmax(0.5 * k @ k.transpose(-1, -2), -1) @ v
>>> bool(torch.allclose(pap_attention(k, v, 0.5, n_iter=0, lam=4.0).out, plain))
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import linalg_route as la


def shrink(x: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """Soft thresholding S_τ(x) = sgn(x)·max(|x| − τ, 0), elementwise (method Eq. 15.1).

    ``tau`` broadcasts against ``x`` (one threshold per matrix: shape ``[..., 1, 1]``)."""
    return torch.sign(x) * torch.clamp(x.abs() - tau, min=0.0)  # Eq. 15.1


def singular_value_threshold(x: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """D_τ(X) = U S_τ(Σ) Vᵀ for matrices ``[..., n1, n2]`` (method Eq. 15.2)."""
    u, s, vh = la.svd(x, full_matrices=False)
    if isinstance(tau, torch.Tensor):
        tau = tau.squeeze(-1)  # [..., 1, 1] -> [..., 1], against s [..., r]
    return (u * shrink(s, tau).unsqueeze(-2)) @ vh  # Eq. 15.2


@dataclass(frozen=True)
class RobustPCA:
    """The split M ≈ L + S of :func:`principal_component_pursuit`, with its iteration count and
    final relative residual ‖M − L − S‖_F / ‖M‖_F."""

    low_rank: torch.Tensor
    sparse: torch.Tensor
    iterations: int
    residual: float


def principal_component_pursuit(m: torch.Tensor, lam: float | None = None,
                                mu: float | None = None, max_iter: int = 1000,
                                tol: float = 1e-7) -> RobustPCA:
    """Robust PCA of one matrix ``m`` [n1, n2] (Candès et al. 2011, Algorithm 1).

    Minimises ‖L‖_* + λ‖S‖_1 subject to L + S = M by the augmented Lagrange multiplier method:
    L ← D_{1/μ}(M − S + Y/μ), S ← S_{λ/μ}(M − L + Y/μ), Y ← Y + μ(M − L − S), with Candès et al.'s
    defaults λ = 1/√max(n1, n2) and μ = n1·n2/(4‖M‖_1). Stops when the relative residual is below
    ``tol`` or after ``max_iter`` iterations.

    This is the algorithm PAP adapts; the unit tests check it recovers a hand-built split exactly.
    """
    if m.ndim != 2:
        raise ValueError(f"principal_component_pursuit takes one matrix [n1, n2], got {tuple(m.shape)}")
    n1, n2 = m.shape
    lam = 1.0 / max(n1, n2) ** 0.5 if lam is None else lam
    norm_l1 = float(m.abs().sum())
    if norm_l1 == 0.0:
        zero = torch.zeros_like(m)
        return RobustPCA(zero, zero.clone(), 0, 0.0)
    mu = n1 * n2 / (4.0 * norm_l1) if mu is None else mu
    s, y = torch.zeros_like(m), torch.zeros_like(m)
    norm_m = float(torch.linalg.matrix_norm(m))
    residual, it = float("inf"), 0
    for it in range(1, max_iter + 1):
        low = singular_value_threshold(m - s + y / mu, 1.0 / mu)
        s = shrink(m - low + y / mu, lam / mu)
        gap = m - low - s
        y = y + mu * gap
        residual = float(torch.linalg.matrix_norm(gap)) / norm_m
        if residual < tol:
            break
    return RobustPCA(low, s, it, residual)


def pap_mu(k: torch.Tensor, features: int | None = None) -> torch.Tensor:
    """PAP's penalty μ = N·C/(4‖K‖_1) per matrix of ``k`` [..., N, d], shape [..., 1, 1]
    (method Eq. 15.3).

    ``features`` is C: P1's code uses the layer's embedding dimension (all heads together), not
    the head dimension d; None uses d, Candès et al.'s n1·n2/(4‖M‖_1) for the N×d key matrix."""
    n, d = k.shape[-2], k.shape[-1]
    c = d if features is None else int(features)
    norm_l1 = k.abs().sum(dim=(-2, -1), keepdim=True)
    return n * c / (4.0 * norm_l1.clamp_min(torch.finfo(k.dtype).tiny))  # Eq. 15.3


@dataclass(frozen=True)
class PAPResult:
    """What :func:`pap_attention` computed: ``out`` = the attention output (the low-rank part L
    after the last iteration, [..., N, d]); ``sparse`` = S after the last iteration (None when
    ``n_iter`` is 0); ``attn`` = the last attention matrix [..., N, N]; ``mu`` [..., 1, 1]."""

    out: torch.Tensor
    sparse: torch.Tensor | None
    attn: torch.Tensor
    mu: torch.Tensor | None


def symmetric_attention(k: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(s·KKᵀ) over the last axis: attention with the keys as queries (SymViT)."""
    return torch.softmax((k @ k.transpose(-2, -1)) * scale, dim=-1)


def pap_attention(k: torch.Tensor, v: torch.Tensor, scale: float, n_iter: int, lam: float,
                  features: int | None = None, attn_dropout=None) -> PAPResult:
    """Principal Attention Pursuit (P1 Algorithm 1, as P1's public code runs it), batched.

    With L₀ = Y₀ = 0 and μ = :func:`pap_mu`, each of the ``n_iter`` iterations computes
    (method Eq. 15.4-15.6)::

        S ← S_{λμ}(K − L + Y/μ)
        A ← softmax(s·K̂K̂ᵀ),  K̂ = K − S − Y/μ
        L ← A V
        Y ← Y + μ(K − L − S)

    and the head's output is the last L. ``n_iter = 0`` returns softmax(s·KKᵀ)V, symmetric softmax
    attention. ``attn_dropout`` (a callable, e.g. an ``nn.Dropout``) is applied to the attention
    matrix of the last iteration only, as in P1's code. Differentiable throughout (soft
    thresholding has a subgradient), so gradient attacks reach the input through every iteration.
    """
    if k.shape != v.shape:
        raise ValueError(f"PAP needs keys and values of one shape [..., N, d], got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    if n_iter == 0:
        attn = symmetric_attention(k, scale)
        if attn_dropout is not None:
            attn = attn_dropout(attn)
        return PAPResult(attn @ v, None, attn, None)
    mu = pap_mu(k, features)
    low = torch.zeros_like(k)
    dual = torch.zeros_like(k)
    sparse = attn = None
    for i in range(n_iter):
        sparse = shrink(k - low + dual / mu, lam * mu)  # Eq. 15.4
        clean = k - sparse - dual / mu
        attn = symmetric_attention(clean, scale)  # Eq. 15.5
        if attn_dropout is not None and i == n_iter - 1:
            attn = attn_dropout(attn)
        low = attn @ v
        dual = dual + mu * (k - low - sparse)  # Eq. 15.6
    return PAPResult(low, sparse, attn, mu)


def effective_rank(x: torch.Tensor) -> torch.Tensor:
    """Roy & Vetterli's (2007) effective rank exp(H(p)), p = σ/Σσ, of matrices [..., n1, n2]
    (method Eq. 15.7); 0 for a zero matrix.

    >>> float(effective_rank(torch.eye(4, dtype=torch.float64)))
    4.0
    """
    s = la.svdvals(x)
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(torch.finfo(s.dtype).tiny)
    entropy = -(p * torch.log(p.clamp_min(torch.finfo(s.dtype).tiny))).sum(-1)
    return torch.where(total.squeeze(-1) > 0, torch.exp(entropy), torch.zeros_like(entropy))


def numerical_rank(x: torch.Tensor, rtol: float = 1e-2) -> torch.Tensor:
    """Singular values above ``rtol`` times the largest, per matrix [..., n1, n2] (an integer
    tensor [...])."""
    s = la.svdvals(x)
    return (s > rtol * s[..., :1]).sum(-1)


def nonzero_share(x: torch.Tensor) -> torch.Tensor:
    """The share of non-zero entries of each matrix [..., n1, n2] (1 − sparsity)."""
    return (x != 0).to(torch.float64).mean(dim=(-2, -1))
