"""Claim V's sign-dependent metrics computed the way P2's code does ("p2-code", method §8).

The exact metrics (:mod:`checks.value_vectors`) build V̂ in log space in float64, take the
eigenvectors with a fixed sign rule and normalise rows with no epsilon. P2's value_vectors.py
differs in four conventions, reproduced here so that a reader can compare our numbers with P2's
printed ones; these values are recorded beside the exact ones and never judged:

1. K_φ = K_raw / (g gᵀ + 1e-6), K_raw = exp(S), g_j = Σ_m exp(S_jm);
2. eigenpairs of K̃ = H K_φ H sorted by |μ| descending, unit eigenvectors with the solver's signs;
3. V̂ = G A − G 1_N A (= G(I − 11ᵀ/N)A, G = diag(1/g_j));
4. float32 throughout, and rows normalised as x/(‖x‖₂ + 1e-8) before every cosine and Pearson.

Convention 4 is the one that shows: v̂_j carries the factor 1/g_j, so a token with large g_j
(all-MiniLM-L6-v2: up to ~3e9) has ‖v̂_j‖ near or below 1e-8, and the +1e-8 pulls its cosine
towards 0. ViT heads (g ≈ 1e3–1e5) have ‖v̂_j‖ ≫ 1e-8 and are unaffected.
"""

from __future__ import annotations

import torch

from .gram import center_gram, log_normaliser, resolve_scale, score_matrix, standardize_tokens
from .similarity import matched_cosine

#: P2's code: the epsilon added to row norms before a cosine or Pearson correlation.
ROW_NORM_EPS = 1e-8
#: P2's code: the epsilon added to g gᵀ in K_φ = K_raw/(g gᵀ + 1e-6).
GRAM_EPS = 1e-6


def p2_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows divided by their Euclidean norm + 1e-8 (P2's code), in x's dtype."""
    return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + ROW_NORM_EPS)


def p2_code_values(k: torch.Tensor, scale: float | None = None,
                   standardize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(V̂ [..., N, d] float32, log g [..., N] float64) as P2's code builds V̂ (conventions 1–3
    of the module docstring). K_raw/(g gᵀ + 1e-6) is evaluated as
    exp(S − log g_i − log g_j) / (1 + 1e-6·exp(−log g_i − log g_j)), the same number without
    float32 overflow of exp(S); the eigen-decomposition and V̂ are float32. With N < d, V̂ has N
    columns and is padded with zero columns to d."""
    n, d = k.shape[-2], k.shape[-1]
    s = resolve_scale(d, scale)
    k64 = k.to(torch.float64)
    if standardize:
        k64 = standardize_tokens(k64)
    scores = score_matrix(k64, s)
    log_g = log_normaliser(scores)
    log_gg = log_g.unsqueeze(-1) + log_g.unsqueeze(-2)
    gram = torch.exp(scores - log_gg) / (1.0 + GRAM_EPS * torch.exp(-log_gg))  # K_raw/(ggᵀ + ε)
    centred = center_gram(gram.to(torch.float32))
    centred = 0.5 * (centred + centred.transpose(-1, -2))
    mu, vecs = torch.linalg.eigh(centred)  # the solver's signs, kept
    order = mu.abs().argsort(dim=-1, descending=True)[..., : min(d, n)]
    axes = torch.gather(vecs, -1, order.unsqueeze(-2).expand(*vecs.shape[:-1], order.shape[-1]))
    g_inv = torch.exp(-log_g).to(torch.float32).unsqueeze(-1)
    v_hat = g_inv * axes - g_inv * axes.mean(dim=-2, keepdim=True)  # G A − G 1_N A
    if v_hat.shape[-1] < d:
        pad = torch.zeros(*v_hat.shape[:-1], d - v_hat.shape[-1], dtype=v_hat.dtype)
        v_hat = torch.cat([v_hat, pad], dim=-1)
    return v_hat, log_g


def p2_code_metrics(k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                    standardize: bool = False, defer_matching: bool = False) -> dict[str, torch.Tensor]:
    """Direct cosine, optimal cosine and Pearson of the learned V against P2-code V̂, [...] each
    (float32 inputs, P2's row normalisation). With ``defer_matching``, ``"cosine_matrix"``
    [..., N, N] (CPU) replaces ``"optimal_cosine"``, for :func:`checks.similarity.matched_cosine`
    to run elsewhere (as the exact path does)."""
    v_hat, _ = p2_code_values(k, scale, standardize)
    x = v.to(torch.float32)
    ux, uy = p2_rows(x), p2_rows(v_hat)
    cos = ux @ uy.transpose(-1, -2)  # [..., N, N]
    px = p2_rows(x - x.mean(-1, keepdim=True))
    py = p2_rows(v_hat - v_hat.mean(-1, keepdim=True))
    out = {"direct_cosine": (ux * uy).sum(-1).mean(-1).to(torch.float64),
           "pearson": (px * py).sum(-1).mean(-1).to(torch.float64)}
    if defer_matching:
        out["cosine_matrix"] = cos.to("cpu", torch.float64)
    else:
        out["optimal_cosine"] = matched_cosine(cos.to(torch.float64))
    return out
