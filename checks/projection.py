"""Claim J: the KPCA projection loss J_proj of one attention head and its two terms (method §3).

For queries Q ∈ R^{N×d}, keys K ∈ R^{M×d} and values V ∈ R^{M×d_v} of one head (self-attention has
M = N), with kernel k(x, y) = exp(s·xᵀy) and g(q) = Σ_j k(q, k_j):

- ‖φ(q_i)‖² = k(q_i, q_i)/g(q_i)² = exp(s‖q_i‖² − 2·logsumexp_j(s·q_iᵀk_j)), computed in log space;
- h_i = Σ_j softmax_j(s·q_iᵀk_j) v_j, the head output before the output projection, and ‖h_i‖²;
- J_proj = (1/N) Σ_i (‖φ(q_i)‖² − ‖h_i‖²).

Every tensor function is batched over any leading dimensions (``[..., N, d]``); nothing loops over
heads or samples. What the per-head terms are reduced to (pooled over heads and layers, and the
trend over a training series) is :mod:`checks.projection_summary`.
"""

from __future__ import annotations

import math

import torch

from ._validation import check_same_batch
from .errors import UndefinedValueError, check_finite
from .gram import DEFAULT_DTYPE, resolve_scale, standardize_tokens

VARIANTS = ("exact", "p1-code")


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------

def _check_qk(q: torch.Tensor, k: torch.Tensor) -> None:
    """Raise ValueError unless q is [..., N, d] and k is [..., M, d] with the same leading dims."""
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError(f"queries and keys must have shape [..., N, d]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    check_same_batch(q, k, ("queries", "keys"), may_differ=-2,
                     message="queries {x} and keys {y} must share leading dimensions and the head "
                             "dimension d")
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.shape[-1] == 0:
        raise ValueError(f"empty token or feature axis: q {tuple(q.shape)}, k {tuple(k.shape)}")


def _check_kv(k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError unless v is [..., M, d_v] with the keys' leading dims and token count M."""
    check_same_batch(v, k, ("values", "keys"), min_ndim=1,
                     message="values {x} must have the keys' leading dimensions and token count; "
                             "keys are {y}")


# ---------------------------------------------------------------------------------------------
# The two terms of J_proj
# ---------------------------------------------------------------------------------------------

def query_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """S_q = s·Q Kᵀ, shape [..., N, M] (method §3).

    >>> q = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    >>> query_scores(q, q, 0.5).tolist()
    [[2.5]]
    """
    return scale * (q @ k.transpose(-1, -2))


def log_phi_sq_norm(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """log ‖φ(q_i)‖² = s‖q_i‖² − 2·logsumexp_j(s·q_iᵀk_j), shape [..., N] (method §3).

    Finite for any finite input: no exponential is ever formed.

    With one key and q = k, ‖φ(q)‖² = exp(s‖q‖²)/exp(s‖q‖²)² = exp(−s‖q‖²):

    >>> q = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    >>> log_phi_sq_norm(q, q, scale=0.5).tolist()
    [-2.0]
    """
    _check_qk(q, k)
    s = resolve_scale(q.shape[-1], scale)
    log_g = torch.logsumexp(query_scores(q, k, s), dim=-1)
    return s * (q * q).sum(-1) - 2.0 * log_g  # method §3, ‖φ(q)‖² = exp(s‖q‖²)/g(q)²


def _exp_checked(log_x: torch.Tensor, what: str) -> torch.Tensor:
    """exp(log_x), raising NonFiniteError when the value leaves the dtype's range (overflow)."""
    x = torch.exp(log_x)
    check_finite(x, f"{what} (its log is finite, the value exceeds the dtype's range)",
                 batch_dims=x.ndim - 1)
    return x


def phi_sq_norm(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """‖φ(q_i)‖² = exp(s‖q_i‖² − 2·logsumexp_j(s·q_iᵀk_j)), shape [..., N] (method §3).

    Computed as the exponential of :func:`log_phi_sq_norm`, so it stays finite where the direct
    formula exp(s‖q‖²)/(Σ_j exp(s·qᵀk_j))² overflows (keys and queries ×50). A value that itself
    exceeds the dtype's range raises :class:`~checks.errors.NonFiniteError`; use
    :func:`log_phi_sq_norm` then.

    >>> q = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    >>> round(float(phi_sq_norm(q, q, scale=0.5)[0]), 12) == round(math.exp(-2.0), 12)
    True
    """
    return _exp_checked(log_phi_sq_norm(q, k, scale), "‖φ(q)‖²")


def log_phi_sq_norm_p1_code(q: torch.Tensor, k: torch.Tensor,
                            scale: float | None = None) -> torch.Tensor:
    """log of P1's *logged* ‖φ(q_i)‖² (variant "p1-code"; not the true value), shape [..., N].

    P1's training code (``Reconstruction/softmax.py`` of the original repository) computed the
    numerator as exp(q·q) — the scale s is missing — and the denominator as
    exp(2·q·k₀ − log(softmax_0(s·q·k)²)), where k₀ is the key of the **first token** (index 0 on
    the token axis: the class token of a ViT/DeiT) and q·k₀ is the *unscaled* score while the
    softmax uses the scaled ones. Since softmax_0 = exp(s·q·k₀)/g(q), with g(q) = Σ_j exp(s·q·k_j),
    the denominator is g(q)²·exp(2(1−s)·q·k₀), hence the closed form (method §3)::

        ‖φ(q)‖²_p1 = exp(q·q − 2(1−s)·q·k₀) / g(q)²,
        ‖φ(q)‖²_p1 / ‖φ(q)‖²_exact = exp((1−s)·(q·q − 2·q·k₀)).

    Returned in log space: q·q − 2(1−s)·q·k₀ − 2·log g(q).

    With s = 1 the missing scale does not matter and P1's logged value is exact:

    >>> q = torch.tensor([[0.3, -0.2], [0.1, 0.4]], dtype=torch.float64)
    >>> torch.allclose(log_phi_sq_norm_p1_code(q, q, 1.0), log_phi_sq_norm(q, q, 1.0))
    True
    """
    _check_qk(q, k)
    s = resolve_scale(q.shape[-1], scale)
    log_g = torch.logsumexp(query_scores(q, k, s), dim=-1)
    qk0 = (q * k[..., :1, :]).sum(-1)  # unscaled score against the first key
    return (q * q).sum(-1) - 2.0 * (1.0 - s) * qk0 - 2.0 * log_g  # method §3, P1's logged ‖φ‖²


def head_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: float | None = None) -> torch.Tensor:
    """h_i = Σ_j softmax_j(s·q_iᵀk_j) v_j, shape [..., N, d_v] (method §3).

    The head output before the output projection; no dropout, no mask.

    A zero query attends uniformly, so h is the mean of the values:

    >>> q = torch.zeros(1, 2, dtype=torch.float64)
    >>> k = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    >>> v = torch.tensor([[2.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    >>> head_output(q, k, v).tolist()
    [[1.0, 2.0]]
    """
    _check_qk(q, k)
    _check_kv(k, v)
    s = resolve_scale(q.shape[-1], scale)
    return torch.softmax(query_scores(q, k, s), dim=-1) @ v


def h_sq_norm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              scale: float | None = None) -> torch.Tensor:
    """‖h_i‖², shape [..., N] (method §3).

    >>> q = torch.zeros(1, 2, dtype=torch.float64)
    >>> k = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    >>> v = torch.tensor([[2.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    >>> h_sq_norm(q, k, v).tolist()
    [5.0]
    """
    h = head_output(q, k, v, scale)
    return (h * h).sum(-1)


# ---------------------------------------------------------------------------------------------
# Per-head summaries
# ---------------------------------------------------------------------------------------------

def projection_loss(phi_sq: torch.Tensor, h_sq: torch.Tensor) -> torch.Tensor:
    """J_proj = (1/N) Σ_i (‖φ(q_i)‖² − ‖h_i‖²), shape [...] (method §3; P1 repository issue #1).

    >>> projection_loss(torch.tensor([3.0, 5.0]), torch.tensor([1.0, 1.0])).item()
    3.0
    """
    return (phi_sq - h_sq).mean(-1)


def bessel_share(phi_sq: torch.Tensor, h_sq: torch.Tensor, rtol: float = 0.0) -> torch.Tensor:
    """Share of tokens with ‖h_i‖² ≤ ‖φ(q_i)‖²·(1 + rtol), shape [...] (method §3, Bessel).

    Only reports the share; the verdict's 99% bar is applied elsewhere. ``rtol`` (default 0, an
    exact comparison) allows round-off in hand-built heads where the bound is nearly attained.

    >>> bessel_share(torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([0.5, 1.0, 2.0, 0.0])).item()
    0.75
    """
    if rtol < 0:
        raise ValueError(f"rtol must be ≥ 0, got {rtol!r}")
    return (h_sq <= phi_sq * (1.0 + rtol)).to(phi_sq.dtype).mean(-1)


def magnitude_log10_ratio(phi_sq: torch.Tensor, h_sq: torch.Tensor,
                          log_phi_sq: torch.Tensor | None = None) -> torch.Tensor:
    """log10(mean_i ‖h_i‖² / mean_i ‖φ(q_i)‖²), shape [...] (method §3, Magnitude).

    If ``log_phi_sq`` is given, mean ‖φ‖² is taken in log space (logsumexp − log N), which stays
    exact when the ‖φ‖² themselves under- or overflow. Raises ValueError when a mean is zero or
    infinite (e.g. all value vectors zero): the ratio is then undefined, never reported as ±inf/NaN.

    >>> phi = torch.tensor([0.001, 0.001], dtype=torch.float64)
    >>> h = torch.tensor([1.0, 1.0], dtype=torch.float64)
    >>> round(float(magnitude_log10_ratio(phi, h)), 12)
    3.0
    """
    n = h_sq.shape[-1]
    if log_phi_sq is None:
        log_mean_phi = torch.log(phi_sq.mean(-1))
    else:
        log_mean_phi = torch.logsumexp(log_phi_sq, dim=-1) - math.log(n)
    ratio = (torch.log(h_sq.mean(-1)) - log_mean_phi) / math.log(10.0)  # method §3, log10 ratio
    if not bool(torch.isfinite(ratio).all()):
        bad = tuple(int(i) for i in torch.nonzero(~torch.isfinite(ratio))[0]) if ratio.ndim else ()
        raise UndefinedValueError(
            f"log10(mean ‖h‖² / mean ‖φ‖²) is undefined at batch index {bad}: a mean is zero or "
            "infinite (zero value vectors, or ‖φ‖² underflow: pass log_phi_sq; method §6.2)")
    return ratio


def p1_logged_value(phi_sq: torch.Tensor, h_sq: torch.Tensor,
                    dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """P1's logged curve: log(mean(‖φ(q)‖² − ‖h‖²)) over ``dim`` (method §3, "P1's logged quantity").

    P1's code took, per layer, the natural log of the mean error over batch, heads and tokens
    together (``dim=None``, the default: all elements) and then averaged those logs over the
    layers. Fed with the "p1-code" ‖φ‖² it reproduces P1's curve; fed with the exact ‖φ‖² it is
    usually undefined. The log of a non-positive mean is undefined: raises ValueError then.

    >>> round(float(p1_logged_value(torch.tensor([3.0, 5.0]), torch.tensor([1.0, 1.0]))), 6) == round(math.log(3.0), 6)
    True
    """
    err = phi_sq - h_sq
    mean = err.mean() if dim is None else err.mean(dim=dim)
    if not bool((mean > 0).all()):
        raise UndefinedValueError(
            "log(mean(‖φ‖² − ‖h‖²)) is undefined: the mean error is ≤ 0 (‖h‖² dominates); P1's "
            "logged value only exists when the mean error is positive (method §6.2)")
    return torch.log(mean)


def projection_terms_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             scale: float | None = None, standardize: bool = False,
                             variant: str = "exact",
                             dtype: torch.dtype = DEFAULT_DTYPE) -> dict[str, torch.Tensor]:
    """J_proj and its terms for a batch of heads (method §3).

    Parameters
    ----------
    q, k, v : Tensor [..., N, d], [..., M, d], [..., M, d_v]
        Queries, keys and values of each head, any leading dims (e.g. [samples, heads]).
    scale : float, optional
        Softmax scale s; 1/√d when None.
    standardize : bool
        Standardise q and k per token over the d features first (method §1), as P1's attention does
        (P1 divides by the unbiased std without the 1e-8 of method §1; the difference is negligible).
    variant : {"exact", "p1-code"}
        "exact" (default): the true ‖φ(q)‖². "p1-code": **P1's logged quantity, not the true
        value** — ‖φ(q)‖² as P1's code computed it, exp(q·q − 2(1−s)·q·k₀)/g(q)² with k₀ the first
        token's key (see :func:`log_phi_sq_norm_p1_code`). h is the same in both.
    dtype : torch.dtype
        Working dtype (float64 default).

    Returns
    -------
    dict with "log_phi_sq" [..., N], "phi_sq" [..., N], "h_sq" [..., N], "j_proj" [...],
    "bessel_share" [...] (share of tokens with ‖h‖² ≤ ‖φ‖²) and "log10_ratio" [...]
    (log10(mean ‖h‖² / mean ‖φ‖²), with mean ‖φ‖² taken in log space).

    Raises
    ------
    ValueError for bad shapes, variant or scale; NonFiniteError for non-finite inputs or a
    ‖φ‖² beyond the dtype's range.

    Examples
    --------
    Zero values give h = 0, so J_proj is the mean ‖φ‖² and Bessel holds for every token:

    >>> q = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> out = projection_terms_batched(q, q, torch.full_like(q, 1e-3))
    >>> out["bessel_share"].tolist()
    [1.0, 1.0]
    >>> bool(torch.allclose(out["j_proj"], (out["phi_sq"] - out["h_sq"]).mean(-1)))
    True
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; use one of {VARIANTS}")
    _check_qk(q, k)
    _check_kv(k, v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    for x, name in ((q, "queries"), (k, "keys"), (v, "values")):
        check_finite(x, name)
    if standardize:
        q, k = standardize_tokens(q), standardize_tokens(k)
    s = resolve_scale(q.shape[-1], scale)
    if variant == "exact":
        log_phi = log_phi_sq_norm(q, k, s)
    else:
        log_phi = log_phi_sq_norm_p1_code(q, k, s)
    phi_sq = _exp_checked(log_phi, f"‖φ(q)‖² ({variant})")
    h_sq = h_sq_norm(q, k, v, s)
    check_finite(h_sq, "‖h‖²", batch_dims=h_sq.ndim - 1)
    return {
        "log_phi_sq": log_phi,
        "phi_sq": phi_sq,
        "h_sq": h_sq,
        "j_proj": projection_loss(phi_sq, h_sq),
        "bessel_share": bessel_share(phi_sq, h_sq),
        "log10_ratio": magnitude_log10_ratio(phi_sq, h_sq, log_phi_sq=log_phi),
    }


def projection_terms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: float | None = None, *, standardize: bool = False,
                     variant: str = "exact") -> dict[str, torch.Tensor | float]:
    """J_proj of a single head: q [N, d], k [M, d], v [M, d_v] (method §3), in float64.

    Returns {"phi_sq": Tensor [N], "h_sq": Tensor [N], "j_proj": float}: ‖φ(q_i)‖² and ‖h_i‖² per
    query token and J_proj = mean_i(‖φ(q_i)‖² − ‖h_i‖²). See :func:`projection_terms_batched`
    for the options and the batched form.

    >>> q = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    >>> out = projection_terms(q, q, torch.full((1, 2), 1e-3, dtype=torch.float64), scale=0.5)
    >>> round(out["j_proj"], 12) == round(math.exp(-2.0) - 2e-6, 12)  # ‖φ‖² − ‖h‖², h = v
    True
    """
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2:
        raise ValueError(f"projection_terms takes one head: q [N, d], k [M, d], v [M, d_v]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} "
                         "(use projection_terms_batched for leading dims)")
    out = projection_terms_batched(q, k, v, scale=scale, standardize=standardize, variant=variant,
                                   dtype=torch.float64)
    return {"phi_sq": out["phi_sq"], "h_sq": out["h_sq"], "j_proj": float(out["j_proj"])}
