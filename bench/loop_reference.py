"""This module owns the plain per-head references of claims V, J and E (method §1–§4), the loops the
batched path replaces, independent of :mod:`checks`.

Everything here works on one attention head at a time, in float64 NumPy/SciPy, with the textbook
form of each formula rather than the batched one the suite uses:

- the centred Gram matrix is H K_φ H with the explicit N×N centring matrix H = I − 11ᵀ/N;
- V̂ = G H A with the explicit diagonal G = diag(1/g_j);
- ‖K_φ‖₂ is the largest eigenvalue of K_φ (``numpy.linalg.eigvalsh``), not a Krylov iteration;
- linear CKA uses the N×N Gram form ⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F);
- kernel CKA takes its squared distances from ``scipy.spatial.distance.pdist``;
- the subspace overlap uses column-pivoted QR bases and the SVD of Q_xᵀQ_y.

Its only purpose is to be an independent route to the numbers of the suite's batched path
(:func:`checks.value_vectors.value_vector_metrics_batched` and claims J's and E's per-layer
computations: the benchmark asserts agreement before it reports a speed ratio) and a baseline to
time that path against. It imports nothing from ``checks``. Method §1 on one head is
:mod:`bench.loop_reference_kpca`, the metrics of method §2 :mod:`bench.loop_reference_metrics`.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
from scipy.special import logsumexp

from .loop_reference_kpca import (EPS, TINY, as_f64, centred_gram, centring_matrix, pad_columns,
                                  rank_threshold, sign_fixed, standardize)
from .loop_reference_metrics import METRICS, optimal_cosine
from .timing import StageClock, no_clock


def reference_head(k, v, null_axes, scale: float | None = None, standardize_keys: bool = False,
                   convention: str = "p2", clock: StageClock | None = None) -> dict[str, float]:
    """Claim-V metrics of one head against V̂ and the null V̂₀, computed plainly (method §1–§2).

    Parameters
    ----------
    k, v : array-like [N, d]
        Keys and learned values of one head (NumPy arrays or torch tensors).
    null_axes : array-like [N, min(N, d)] or [N]
        The null: a basis A₀ [N, min(N, d)] (orthonormal columns, used as given) for the
        random-basis null V̂₀, or a permutation of the N tokens [N] for the token-shuffled null
        ΠV̂ (method §2.3), the one the claim-V test uses.
    scale : float, optional
        Softmax scale s; 1/√d when None.
    standardize_keys : bool
        Standardise keys per token first (method §1).
    convention : {"p2", "kpca"}
        Unit axes a_m (P2) or a_m/√μ_m.
    clock : StageClock, optional
        Receives the time of the stages ``gram``, ``eigen``, ``metrics`` and ``assignment``.

    Returns
    -------
    dict of float
        The 8 metrics of method §2, each with a ``_null`` twin; ``undetermined`` (1.0/0.0),
        ``mu_d`` (0 when N < d) and ``threshold`` (N·ε·‖K_φ‖₂).
    """
    timed = clock.stage if clock is not None else no_clock
    k, v = as_f64(k, "k"), as_f64(v, "v")
    a0 = as_f64(null_axes, "null_axes", ndims=(1, 2))
    n, d = k.shape
    m = min(n, d)
    shuffled = a0.ndim == 1
    if shuffled and sorted(a0.astype(np.int64).tolist()) != list(range(n)):
        raise ValueError(f"a 1-D null_axes must be a permutation of the {n} tokens")
    if v.shape != k.shape or (not shuffled and a0.shape != (n, m)) or n < 2:
        raise ValueError(f"need k, v [N, d] with N >= 2 and null_axes [N, min(N, d)] or a "
                         f"permutation [N]; got k {k.shape}, v {v.shape}, null_axes {a0.shape}")
    if convention not in ("p2", "kpca"):
        raise ValueError(f"unknown axis convention {convention!r}; use 'p2' or 'kpca'")
    s = 1.0 / math.sqrt(d) if scale is None else float(scale)

    with timed("gram"):
        if standardize_keys:
            k = standardize(k)
        k_phi, k_centred, log_g = centred_gram(k, s)  # K_φ and K̃ = H K_φ H, in log space
        h = centring_matrix(n)
        threshold = rank_threshold(k_phi)  # N·ε·‖K_φ‖₂ (K_φ is PSD)
    with timed("eigen"):
        mu, vecs = np.linalg.eigh(k_centred)
        mu, vecs = mu[::-1], vecs[:, ::-1]
        axes = sign_fixed(vecs[:, :m])
    with timed("metrics"):
        if convention == "kpca":
            axes = axes / np.sqrt(np.maximum(mu[:m], TINY))
        g_inv = np.diag(np.exp(-log_g))  # G = diag(1/g_j)
        v_hat = pad_columns(g_inv @ h @ axes, d)  # P1 Eq. 6: V̂ = G(I − 11ᵀ/N)A
        if shuffled:
            v_null = v_hat[a0.astype(np.int64)]  # method §2.3: ΠV̂, the rows of V̂ reordered
        else:
            v_null = pad_columns(g_inv @ h @ a0, d)  # method §2: V̂₀ = G(I − 11ᵀ/N)A₀
        out: dict[str, float] = {}
        for suffix, target in (("", v_hat), ("_null", v_null)):
            for name, fn in METRICS.items():
                out[name + suffix] = fn(v, target)
    with timed("assignment"):
        for suffix, target in (("", v_hat), ("_null", v_null)):
            out["optimal_cosine" + suffix] = optimal_cosine(v, target)
    mu_d = float(mu[d - 1]) if d <= n else 0.0
    out["undetermined"] = float(d > n or mu_d <= threshold)
    out["mu_d"] = mu_d
    out["threshold"] = threshold
    return out


def reference_claim_v(heads: Iterable[tuple], scale: float | None = None,
                      standardize_keys: bool = False, convention: str = "p2",
                      clock: StageClock | None = None) -> list[dict[str, float]]:
    """:func:`reference_head` for each ``(k, v, null_axes)`` of ``heads``, one after the other.

    This is the loop the batched path replaces: one head per iteration, over whatever
    (sample, layer, head) triples the caller enumerates.
    """
    return [reference_head(k, v, a0, scale=scale, standardize_keys=standardize_keys,
                           convention=convention, clock=clock) for k, v, a0 in heads]


# ----------------------------------------------------------------------------- claim J, one head
J_NAMES = ("log_phi_sq_mean", "phi_sq_mean", "h_sq_mean", "j_proj", "bessel_share",
           "p1_log_phi_sq_mean")


def reference_j_head(q, k, v, scale: float | None = None,
                     clock: StageClock | None = None) -> dict[str, float]:
    """Claim-J terms of one head, plainly (method §3): the per-layer quantities the session stores.

    ‖φ(q_i)‖² = exp(s‖q_i‖² − 2 log g(q_i)) with log g(q_i) = logsumexp_j s·q_iᵀk_j; P1's logged
    value exp(q·q − 2(1−s)·q·k₀)/g(q)²; h_i = softmax(S_i) V; J_proj = mean(‖φ‖² − ‖h‖²); the Bessel
    share is the fraction of tokens with ‖h_i‖² ≤ ‖φ(q_i)‖². Stages: ``phi``, ``h``, ``summaries``.
    """
    timed = clock.stage if clock is not None else no_clock
    q, k, v = as_f64(q, "q"), as_f64(k, "k"), as_f64(v, "v")
    n, d = q.shape
    s = 1.0 / math.sqrt(d) if scale is None else float(scale)
    with timed("phi"):
        scores = s * (q @ k.T)  # S_q = s·Q Kᵀ
        log_g = logsumexp(scores, axis=1)
        qq = np.sum(q * q, axis=1)
        log_phi = s * qq - 2.0 * log_g
        log_p1 = qq - 2.0 * (1.0 - s) * (q @ k[0]) - 2.0 * log_g  # P1's logged ‖φ‖²
    with timed("h"):
        h = np.exp(scores - log_g[:, None]) @ v  # softmax rows times V
        h_sq = np.sum(h * h, axis=1)
    with timed("summaries"):
        phi = np.exp(log_phi)
        return {"log_phi_sq_mean": float(logsumexp(log_phi) - math.log(n)),
                "phi_sq_mean": float(phi.mean()), "h_sq_mean": float(h_sq.mean()),
                "j_proj": float(np.mean(phi - h_sq)), "bessel_share": float(np.mean(h_sq <= phi)),
                "p1_log_phi_sq_mean": float(logsumexp(log_p1) - math.log(n))}


# ----------------------------------------------------------------------------- claim E, one head
E_NAMES = ("mu_log_raw", "mu_log_standardized", "mu_naive_float32", "naive_finite",
           "gamma_learned", "gamma_learned_abs", "gamma_eigen", "gamma_eigen_abs",
           "gamma_perturbed", "gamma_perturbed_abs", "undetermined")


def _pair_spreads(gamma: np.ndarray, valid: np.ndarray) -> tuple[float, float]:
    """Mean over columns of the mean over valid pairs i < j of |γ_i − γ_j|/max(|γ_i|, |γ_j|)
    (0 when both are 0) and of |γ_i − γ_j|, with the explicit pair matrix (method §4)."""
    rel, ab = [], []
    for col in range(gamma.shape[1]):
        g = gamma[valid[:, col], col]
        if len(g) < 2:  # a degenerate column (undetermined heads only) counts 0, as ours
            rel.append(0.0)
            ab.append(0.0)
            continue
        diff = np.abs(g[:, None] - g[None, :])
        big = np.maximum(np.abs(g[:, None]), np.abs(g[None, :]))
        iu = np.triu_indices(len(g), 1)
        r = np.divide(diff, big, out=np.zeros_like(diff), where=big > 0)
        rel.append(float(r[iu].mean()))
        ab.append(float(diff[iu].mean()))
    return float(np.mean(rel)), float(np.mean(ab))


def reference_e_head(k, v, perturbed, scale: float | None = None,
                     clock: StageClock | None = None) -> dict[str, float | np.ndarray]:
    """Claim-E quantities of one head, plainly (method §4): the top-d spectra of the log-space raw
    and standardised routes and of the naive float32 route (NaN → 0, with its finite flag), and
    the mean relative and absolute γ spreads of the learned values, the eigenvectors and the
    perturbed basis ``perturbed`` [N, m] (P2's QR(A + 0.1 Z); given, since its noise is one draw
    per batch). Stages: ``gram``, ``eigen``, ``naive``, ``gamma``.
    """
    timed = clock.stage if clock is not None else no_clock
    k, v = as_f64(k, "k"), as_f64(v, "v")
    a_pert = as_f64(perturbed, "perturbed")
    n, d = k.shape
    m = a_pert.shape[1]
    s = 1.0 / math.sqrt(d) if scale is None else float(scale)

    def top(mu: np.ndarray) -> np.ndarray:
        mu = mu[::-1][:d]
        return np.pad(mu, (0, d - len(mu)))

    with timed("gram"):
        k_phi, kc, log_g = centred_gram(k, s)
        _, kc_std, _ = centred_gram(standardize(k), s)
        threshold = rank_threshold(k_phi)
    with timed("eigen"):
        mu, vecs = np.linalg.eigh(kc)
        mu_std = np.linalg.eigvalsh(kc_std)
    with timed("naive"):
        k32 = k.astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            scores32 = np.float32(s) * (k32 @ k32.T)
            kern = np.exp(scores32)
            g = kern.sum(axis=1)
            denom = g[:, None] * g[None, :]
            gram = kern / denom
            row, col = gram.mean(axis=1, keepdims=True), gram.mean(axis=0, keepdims=True)
            centred = gram - row - col + gram.mean()
        # finite only if no step overflowed (an infinite g_i·g_j counts, though K/inf is 0)
        finite = all(bool(np.all(np.isfinite(x))) for x in (scores32, kern, g, denom, centred))
        mu_naive = np.linalg.eigvalsh(0.5 * (centred + centred.T)).astype(np.float64) if finite \
            else np.zeros(n)
        finite = finite and bool(np.all(np.isfinite(mu_naive)))
    with timed("gamma"):
        axes = {"learned": None, "eigen": sign_fixed(vecs[:, ::-1][:, :m]), "perturbed": a_pert}
        lg = log_g - log_g.max()  # γ is invariant to one factor per head
        learned = v * np.exp(lg)[:, None]
        axes["learned"] = learned - learned.mean(axis=0)
        out: dict[str, float | np.ndarray] = {}
        for name, a in axes.items():
            valid = np.abs(a) > EPS * np.abs(a).max(axis=0, keepdims=True)
            gamma = np.where(valid, (kc @ a) / (n * np.where(valid, a, 1.0)), 0.0)
            out[f"gamma_{name}"], out[f"gamma_{name}_abs"] = _pair_spreads(gamma, valid)
    out["mu_log_raw"] = top(mu)
    out["mu_log_standardized"] = top(mu_std)
    out["mu_naive_float32"] = top(mu_naive) if finite else np.zeros(d)
    out["naive_finite"] = float(finite)
    mu_d = mu[::-1][d - 1] if d <= n else 0.0
    out["undetermined"] = float(d > n or mu_d <= threshold)
    return out
