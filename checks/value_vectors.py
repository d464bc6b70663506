"""Claim V — "value vectors are the Gram eigenvectors" (P1 §2; P2 finding 1; method §2).

Compares learned values V with the KPCA value matrix V̂ = G(I − 11ᵀ/N)A of the same head (method §1,
P1 Eq. 6) on every metric of method §2, each beside its chance level: the same metric against a null
V̂₀ = G(I − 11ᵀ/N)A₀ built from a random orthonormal basis A₀. Batched over any leading dimensions
``[..., N, d]``; the only per-item loop is the assignment solver inside the optimal cosine.
"""

from __future__ import annotations

import torch

from . import linalg_route as la
from .metric_suite import DIRECTION_KEYS, metric_suite, metric_suite_shuffled
from .row_similarity import matched_cosine, matched_cosine_twin
from .degenerate import effective_rows
from .errors import check_finite
from .leading_directions import (SHARED_BAR, nested_directions, shared_directions,
                                 shared_from_bases, shuffled_directions)
from .matrix_similarity import centred_column_basis
from .similarity_scaling import peak_one
from .gram import DEFAULT_DTYPE, KeyGram, fix_signs, kpca_values

METRIC_NAMES = (
    "direct_cosine",
    "optimal_cosine",
    "linear_cka",
    "kernel_cka",
    "relative_frobenius",
    "pearson",
    "allclose",
    "subspace_overlap",
)


def random_orthonormal(n: int, m: int, seed: int, batch_shape: tuple[int, ...] = (),
                       dtype: torch.dtype = DEFAULT_DTYPE) -> torch.Tensor:
    """A random orthonormal basis A₀ of m columns in R^n for each batch index (method §2, chance level).

    QR of a float64 standard Gaussian [*batch_shape, n, m] drawn from a CPU ``torch.Generator``
    seeded with ``seed``; the column space is uniform on the Grassmannian. Column signs are fixed by
    :func:`checks.gram.fix_signs` (the rule V̂ uses), then the result is cast to ``dtype``: the same
    seed gives the same Gaussian draw on every machine and the same basis for every dtype; the
    QR is LAPACK's, so two CPUs agree on the basis to float64 round-off, not to the bit.
    Requires 1 ≤ m ≤ n.

    Returns
    -------
    Tensor [*batch_shape, n, m] on the CPU.

    >>> a0 = random_orthonormal(6, 3, seed=0)
    >>> torch.allclose(a0.T @ a0, torch.eye(3, dtype=torch.float64), atol=1e-12)
    True
    """
    if not (isinstance(n, int) and isinstance(m, int) and 1 <= m <= n):
        raise ValueError(f"random_orthonormal needs integers 1 <= m <= n, got n={n!r}, m={m!r}")
    batch_shape = tuple(int(b) for b in batch_shape)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    gauss = torch.randn(*batch_shape, n, m, generator=gen, dtype=torch.float64)
    q, _ = la.qr(gauss, mode="reduced")
    return fix_signs(q).to(dtype)


def _pad_columns(x: torch.Tensor, d: int) -> torch.Tensor:
    """x [..., N, m] with m ≤ d, right-padded with zero columns to [..., N, d]."""
    missing = d - x.shape[-1]
    if missing == 0:
        return x
    zeros = torch.zeros(*x.shape[:-1], missing, dtype=x.dtype, device=x.device)
    return torch.cat([x, zeros], dim=-1)


def value_vector_metrics_batched(
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    standardize: bool = False,
    convention: str = "p2",
    null_axes: torch.Tensor | None = None,
    null_seed: int = 0,
    null_perm: torch.Tensor | None = None,
    dtype: torch.dtype = DEFAULT_DTYPE,
    defer_matching: bool = False,
    round_off: bool = False,
    flags: bool = True,
    directions: bool = True,
    shared_bar: float = SHARED_BAR,
    atol: float,
    rtol: float,
) -> dict[str, torch.Tensor]:
    """Claim-V metrics of learned values against V̂ and against the null V̂₀, batched (method §2).

    Parameters
    ----------
    k, v : Tensor [..., N, d]
        Keys and learned values of each head, same shape (bias included, split per head).
    scale : float, optional
        Softmax scale s; 1/√d when None (:func:`checks.gram.resolve_scale`).
    standardize : bool
        Standardise keys per token before the Gram matrix (method §1; recorded option).
    convention : {"p2", "kpca"}
        Axis normalisation of V̂: unit a_m (P2's, the thresholds' convention) or a_m/√μ_m.
    null_axes : Tensor [..., N, m], optional
        A₀ for the null, m = min(N, d), same leading shape as k. Default:
        ``random_orthonormal(N, min(N, d), null_seed, batch_shape)``. The null always uses these
        axes as given (unit columns), whatever ``convention`` is.
    null_seed : int
        Seed for the default A₀ (the caller derives it from the test id).
    null_perm : LongTensor [..., N], optional
        One permutation of the tokens per head: the null is then the token-shuffled V̂, ΠV̂
        (:func:`checks.nulls.shuffled_token_null`; method §2.3), exchangeable with V̂ when V
        carries no KPCA structure, instead of the random-basis V̂₀. Exclusive with ``null_axes``.
    dtype : torch.dtype
        Precision of all the math (float64 by default; float32 is an option to record).
    defer_matching : bool
        Leave the Hungarian step out: instead of ``optimal_cosine`` and ``optimal_cosine_null``
        the result holds ``"cosine_matrices"`` [2, ..., N, N] (V̂, then V̂₀) on the CPU, which
        :func:`checks.row_similarity.matched_cosine` turns into those two metrics. Lets a caller run
        the assignment on the CPU while the next batch is computed.
    round_off : bool
        Also compute the round-off twin (method §13.2): every metric again from keys and values
        moved by round-off alone (:func:`checks.round_off.value_twin_inputs`), as
        ``"twin_<name>"``; with ``defer_matching``, the twin's cosine matrices as
        ``"twin_cosine_matrices"`` [2, ..., N, N] instead of the optimal cosine's twins.
    flags : bool
        False: the metrics alone, without ``undetermined``, ``mu_d``, ``threshold`` (a Lanczos
        estimate) and ``effective_rows`` (the round-off twin reads only the metrics).
    directions : bool
        The directions V shares with V̂ and with the null (method §2.6,
        :func:`checks.leading_directions.shared_directions`): each name of
        :data:`DIRECTION_NAMES` and its ``"_null"``; ``shared_bar``: the cos² at which a
        direction counts as shared (the caller passes ``[claim_v.partial]``'s).
    atol, rtol : float
        Tolerances of the allclose rate, |V − V̂| ≤ atol + rtol·|V̂| elementwise. No default: the
        caller passes ``[claim_v.allclose]`` of ``claims/thresholds.toml`` (method §2.1, §9).

    Returns
    -------
    dict of Tensor [...]
        Each name of :data:`METRIC_NAMES` (V vs V̂; ``allclose`` as 1.0/0.0 so a mean is the rate),
        each name + ``"_null"`` (V vs V̂₀), ``"undetermined"`` (bool: μ_d ≤ N·ε·‖K_φ‖₂),
        ``"mu_d"`` (μ_d; 0 when N < d, the missing eigenvalues of the padded spectrum) and
        ``"threshold"`` (N·ε·‖K_φ‖₂); with ``round_off``, the twins above.

    Notes
    -----
    When N ≤ d, V̂ has only N eigen-directions: it (and V̂₀) is padded with zero columns to d and the
    head is undetermined (KeyGram flags it); its metrics are computed all the same.
    Raises :class:`checks.errors.NonFiniteError` for non-finite keys, values or Gram matrices.

    Examples
    --------
    V = V̂ scores 1 on every similarity metric and 0 in relative Frobenius:

    >>> k = torch.randn(2, 20, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> v_hat = KeyGram(k).kpca_values()
    >>> r = value_vector_metrics_batched(k, v_hat, atol=1e-5, rtol=1e-3)
    >>> [round(x, 9) for x in r["optimal_cosine"].tolist()], r["allclose"].tolist()
    ([1.0, 1.0], [1.0, 1.0])
    >>> float(r["relative_frobenius"].abs().max()) < 1e-12
    True
    """
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
        raise ValueError("k and v must be torch tensors of shape [..., N, d]")
    if k.ndim < 2 or k.shape != v.shape:
        raise ValueError(
            f"keys and values must have the same shape [..., N, d]; got k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    n, d = k.shape[-2], k.shape[-1]
    if n < 2:
        raise ValueError(f"claim V needs at least 2 tokens per head, got N={n}")
    batch_shape = tuple(k.shape[:-2])

    gram = KeyGram(k, scale=scale, standardize=standardize, dtype=dtype, top=d)  # only the top d
    v = v.to(dtype)
    check_finite(v, "values")
    v_hat = _pad_columns(gram.kpca_values(convention), d)  # method §1, P1 Eq. 6: V̂ = G(I − 11ᵀ/N)A

    null_perm, a0 = _null_operands(k, null_perm, null_axes, null_seed, dtype)
    # the direction metrics (method §2.6) come with the suite, from the QR its bases make
    shared = {"weights": direction_weights(gram.eigenvalues, d) if directions else None,
              "bar": shared_bar}
    if null_perm is not None:  # ΠV̂'s operands are V̂'s with the tokens permuted
        metrics, cos = metric_suite_shuffled(v, v_hat, null_perm, atol=atol, rtol=rtol, **shared)
    else:
        v_null = _pad_columns(kpca_values(a0, gram.log_g), d)  # V̂₀ = G(I − 11ᵀ/N)A₀
        metrics, cos = metric_suite(v, torch.stack([v_hat, v_null]), atol=atol, rtol=rtol,
                                    **shared)
    out = {}
    for name, both in metrics.items():
        both = both.to(v.dtype) if name == "allclose" else both
        out[name], out[f"{name}_null"] = both[0], both[1]
    if defer_matching:
        out["cosine_matrices"] = cos.to("cpu")
    else:
        optimal = matched_cosine(cos)
        out["optimal_cosine"], out["optimal_cosine_null"] = optimal[0], optimal[1]
    if flags:
        threshold = gram.threshold  # every item's Lanczos estimate (recorded): the flag reuses it
        out["undetermined"] = gram.undetermined
        if d <= n:
            out["mu_d"] = gram.eigenvalues[..., d - 1]
        else:
            out["mu_d"] = torch.zeros(batch_shape, dtype=gram.eigenvalues.dtype, device=k.device)
        out["threshold"] = threshold
        out["effective_rows"] = effective_rows(gram.log_g)  # method §2.2: degenerate when ≈ 1
    if round_off:
        out.update(_twin(k, v, dtype=dtype, atol=atol, rtol=rtol, scale=scale,
                         standardize=standardize, convention=convention,
                         null_axes=None if null_perm is not None else a0, null_perm=null_perm,
                         directions=directions, shared_bar=shared_bar))
        if not defer_matching:
            twin_cos = out.pop("twin_cosine_matrices")
            out["twin_optimal_cosine"] = matched_cosine_twin(cos[0], twin_cos[0])[1]
            out["twin_optimal_cosine_null"] = matched_cosine_twin(cos[1], twin_cos[1])[1]
    return out


def _null_operands(k: torch.Tensor, null_perm: torch.Tensor | None,
                   null_axes: torch.Tensor | None, null_seed: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(ΠV̂'s permutations on k's device, None) for the token-shuffled null, else (None, A₀): the
    given ``null_axes`` (checked) or a seeded random orthonormal basis (method §2.3)."""
    n, d = k.shape[-2], k.shape[-1]
    batch_shape, m = tuple(k.shape[:-2]), min(n, d)
    if null_perm is not None:
        if null_axes is not None:
            raise ValueError("give null_axes (random-basis null) or null_perm (token-shuffled "
                             "null), not both")
        return null_perm.to(k.device), None  # method §2.3: the null is ΠV̂
    if null_axes is None:
        return None, random_orthonormal(n, m, null_seed, batch_shape, dtype=dtype).to(k.device)
    if not isinstance(null_axes, torch.Tensor) or tuple(null_axes.shape) != (*batch_shape, n, m):
        got = tuple(null_axes.shape) if isinstance(null_axes, torch.Tensor) else null_axes
        raise ValueError(f"null_axes must have shape {(*batch_shape, n, m)} (A₀), got {got}")
    a0 = null_axes.to(device=k.device, dtype=dtype)
    check_finite(a0, "null_axes")
    return None, a0


#: Claim V by directions (method §2.6): how many directions span(V) shares with span(V̂), and the
#: share of V̂'s eigenvalue mass they carry (each one's key in :data:`DIRECTION_KEYS`).
DIRECTION_NAMES = tuple(DIRECTION_KEYS)


def direction_weights(eigenvalues: torch.Tensor, d: int) -> torch.Tensor:
    """V̂'s eigenvalues [..., ≥ min(N, d)] as the d weights of its (padded) directions."""
    return _pad_columns(eigenvalues[..., :d].unsqueeze(-2), d).squeeze(-2)


def direction_metrics(v: torch.Tensor, v_hat: torch.Tensor, eigenvalues: torch.Tensor, *,
                      null_perm: torch.Tensor | None = None,
                      v_null: torch.Tensor | None = None,
                      bar: float = SHARED_BAR) -> dict[str, torch.Tensor]:
    """:data:`DIRECTION_NAMES` of V [..., N, d] against V̂ (padded to d columns) and, as
    ``"<name>_null"``, against the null: ΠV̂ for ``null_perm`` [..., N] (its nested directions
    are Π times V̂'s), else V̂₀ = ``v_null``; V̂'s eigenvalues [..., ≥ min(N, d)] weigh both.
    :func:`value_vector_metrics_batched` gets the same numbers from its metric suite's bases."""
    qx, _ = centred_column_basis(peak_one(v))
    nested = nested_directions(v_hat)
    null = shuffled_directions(nested, null_perm) if null_perm is not None else \
        nested_directions(v_null)
    return directions_from_bases(qx, nested, null, direction_weights(eigenvalues, v.shape[-1]),
                                 bar)


def directions_from_bases(qx: torch.Tensor, nested: tuple[torch.Tensor, torch.Tensor],
                          null: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                          bar: float) -> dict[str, torch.Tensor]:
    """:data:`DIRECTION_NAMES` and their ``"_null"`` from V's centred basis ``qx`` and the
    nested directions of V̂ and of the null, (q, valid) each, weighed by V̂'s ``weights`` [..., d]."""
    main = shared_from_bases(qx, *nested, weights, bar=bar)
    other = shared_from_bases(qx, *null, weights, bar=bar)
    out = {}
    for name, key in DIRECTION_KEYS.items():
        out[name], out[f"{name}_null"] = main[key], other[key]
    return out


def init_twin_directions(k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                         standardize: bool = False, convention: str = "p2",
                         dtype: torch.dtype = DEFAULT_DTYPE,
                         bar: float = SHARED_BAR) -> dict[str, torch.Tensor]:
    """:data:`DIRECTION_NAMES` of a random-init twin's head against its own V̂ (method §2.6):
    ``"<name>_init_twin"`` [...], the level a head of the same architecture reaches untrained."""
    d = k.shape[-1]
    gram = KeyGram(k, scale=scale, standardize=standardize, dtype=dtype, top=d)
    v_hat = _pad_columns(gram.kpca_values(convention), d)
    out = shared_directions(v.to(dtype), v_hat, direction_weights(gram.eigenvalues, d), bar=bar)
    return {f"{name}_init_twin": out[key] for name, key in DIRECTION_KEYS.items()}


def _twin(k: torch.Tensor, v: torch.Tensor, *, dtype: torch.dtype,
          **settings) -> dict[str, torch.Tensor]:
    """The round-off twin of every metric (method §13.2): the metrics again on keys and values
    moved by round-off alone (:func:`checks.round_off.value_twin_inputs`), as ``"twin_<name>"``
    (and ``"twin_<name>_null"``), with the twin's cosine matrices [2, ..., N, N] (CPU; against
    V̂, then the null) as ``"twin_cosine_matrices"`` for the optimal cosine's twin
    (:func:`checks.row_similarity.matched_cosine_twin`)."""
    from .round_off import value_twin_inputs

    k2, v2 = value_twin_inputs(k.to(dtype), v.to(dtype))
    twin = value_vector_metrics_batched(k2, v2, dtype=dtype, defer_matching=True, flags=False,
                                        **settings)
    # the direction metrics too: a direction whose cos² lies within round-off of the shared bar
    # is counted or not by the machine (measured: an Intel Xeon against an AMD EPYC moved the
    # top-weighted share's null of two tiny-ViT heads by 1.6e-4 relative, method §13.2)
    out = {f"twin_{key}": twin[key] for name in (*METRIC_NAMES, *DIRECTION_NAMES)
           for key in (name, f"{name}_null") if key in twin}
    out["twin_cosine_matrices"] = twin["cosine_matrices"]
    return out


def value_vector_metrics(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         scale: float | None = None, standardize: bool = False,
                         seed: int = 0, *, atol: float, rtol: float) -> dict[str, float]:
    """Claim-V metrics for one attention head (method §2): learned V vs V̂, and vs the null V̂₀.

    Parameters
    ----------
    q : Tensor [N_q, d]
        Queries of the head. Only its shape is checked: V̂ depends on the keys alone (method §1),
        so q is accepted for a uniform (q, k, v) interface and otherwise unused.
    k, v : Tensor [N, d]
        Keys and learned values of the head.
    scale : float, optional
        Softmax scale s; 1/√d when None.
    standardize : bool
        Standardise keys per token first (method §1).
    seed : int
        Seed of the null basis A₀ (:func:`random_orthonormal`).
    atol, rtol : float
        Tolerances of the allclose rate (``[claim_v.allclose]``, method §2.1; no default).

    Returns
    -------
    dict[str, float]
        Exactly 16 keys: the 8 :data:`METRIC_NAMES` and each with suffix ``"_null"``; ``allclose``
        as 1.0 or 0.0. Computed in float64 with P2's axis convention. Use
        :func:`value_vector_metrics_batched` for the undetermined flag and batches.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> k = torch.randn(20, 4, generator=g, dtype=torch.float64)
    >>> m = value_vector_metrics(k, k, KeyGram(k).kpca_values(), atol=1e-5, rtol=1e-3)
    >>> round(m["optimal_cosine"], 9), round(m["linear_cka"], 9), m["allclose"]
    (1.0, 1.0, 1.0)
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D tensor [N, d] for one head, got {shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the head dimension d; got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    res = value_vector_metrics_batched(k, v, scale=scale, standardize=standardize, null_seed=seed,
                                       atol=atol, rtol=rtol)
    names = METRIC_NAMES + tuple(f"{name}_null" for name in METRIC_NAMES)
    return {name: float(res[name]) for name in names}
