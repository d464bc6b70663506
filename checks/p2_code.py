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

The variant is computed on a seeded subset of :data:`P2_CODE_SAMPLES` samples per model
(:func:`p2_code_subset`; every sample when there are no more), the same samples for every layer
and head, and recorded beside the exact metrics over the same samples (method §8.3). It is a
comparison, never judged: an exact value on a fifth of the default 100 samples costs a fifth of
its float32 eigendecomposition and of its Hungarian step, which was a third of claim V's
assignment stage.
"""

from __future__ import annotations

import torch

from ._validation import check_int
from .eigen import eigh
from .gram import center_gram, log_normaliser, resolve_scale, score_matrix, standardize_tokens
from .row_similarity import matched_cosine
from .value_vectors import _pad_columns

#: P2's code: the epsilon added to row norms before a cosine or Pearson correlation.
ROW_NORM_EPS = 1e-8
#: P2's code: the epsilon added to g gᵀ in K_φ = K_raw/(g gᵀ + 1e-6).
GRAM_EPS = 1e-6
#: Samples per model on which the p2-code variant is computed (method §8.3); all when fewer.
P2_CODE_SAMPLES = 20


def p2_code_subset(n_samples: int, model: str, size: int | None = None) -> torch.Tensor:
    """Which samples of a model get the p2-code variant, bool [n_samples] (method §8.3).

    Every sample when ``n_samples <= size`` (default :data:`P2_CODE_SAMPLES`); otherwise ``size`` samples drawn without replacement
    by a CPU generator seeded from the model name (:func:`checks.stats.seed_from` of
    ``"<model>-V-p2code"``): the same samples for every layer and head, on every machine.

    >>> p2_code_subset(4, "m").tolist()
    [True, True, True, True]
    >>> int(p2_code_subset(100, "m", size=20).sum())
    20
    """
    from .stats import seed_from

    size = P2_CODE_SAMPLES if size is None else size
    check_int(n_samples, "n_samples", min_val=0, expected="a non-negative int")
    check_int(size, "size", min_val=1, expected="a positive int (samples in the subset)")
    mask = torch.zeros(n_samples, dtype=torch.bool)
    if n_samples <= size:
        return mask.fill_(True)
    gen = torch.Generator().manual_seed(seed_from(f"{model}-V-p2code"))
    mask[torch.randperm(n_samples, generator=gen)[:size]] = True
    return mask


def scatter_rows(values: list[torch.Tensor], rows: list[int], n_rows: int, width: int) -> torch.Tensor:
    """Per-sample results ``values`` (one [width] tensor per entry of ``rows``) placed at ``rows``
    of a NaN tensor [n_rows, width] (float64, CPU): samples outside the p2-code subset read NaN,
    "not computed".

    >>> scatter_rows([torch.tensor([1.0, 2.0])], [1], 2, 2).tolist()
    [[nan, nan], [1.0, 2.0]]
    """
    out = torch.full((n_rows, width), float("nan"), dtype=torch.float64)
    if rows:
        out[rows] = torch.stack(list(values)).detach().to("cpu", torch.float64)
    return out


def p2_code_metrics_on(k: torch.Tensor, v: torch.Tensor, rows: list[int], *,
                       scale: float | None = None, standardize: bool = False
                       ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The p2-code variant for the samples ``rows`` of a batch k, v [B, H, N, d] (method §8.3).

    Returns ``({"direct_cosine", "pearson"}: [B, H] float64 CPU, NaN outside ``rows``; the cosine
    matrices [H, N, N] of each sample of ``rows``, in order)``: :func:`scatter_rows` places their
    matched cosines (:func:`checks.row_similarity.matched_cosine`) the same way.
    """
    n_rows, width = k.shape[0], k.shape[1]
    if not rows:
        empty = scatter_rows([], [], n_rows, width)
        return {"direct_cosine": empty, "pearson": empty.clone()}, []
    p2 = p2_code_metrics(k[rows], v[rows], scale, standardize, defer_matching=True)
    return ({name: scatter_rows(list(p2[name]), rows, n_rows, width)
             for name in ("direct_cosine", "pearson")}, list(p2["cosine_matrix"]))


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
    mu, vecs = eigh(centred)  # the solver's signs, kept
    order = mu.abs().argsort(dim=-1, descending=True)[..., : min(d, n)]
    axes = torch.gather(vecs, -1, order.unsqueeze(-2).expand(*vecs.shape[:-1], order.shape[-1]))
    g_inv = torch.exp(-log_g).to(torch.float32).unsqueeze(-1)
    v_hat = g_inv * axes - g_inv * axes.mean(dim=-2, keepdim=True)  # G A − G 1_N A
    return _pad_columns(v_hat, d), log_g


def p2_code_metrics(k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                    standardize: bool = False, defer_matching: bool = False) -> dict[str, torch.Tensor]:
    """Direct cosine, optimal cosine and Pearson of the learned V against P2-code V̂, [...] each
    (float32 inputs, P2's row normalisation). With ``defer_matching``, ``"cosine_matrix"``
    [..., N, N] (CPU) replaces ``"optimal_cosine"``, for :func:`checks.row_similarity.matched_cosine`
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
