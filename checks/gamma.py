"""Claim E (method §4), second part: the γ-constancy test of P1 Eq. 11.

Pure batched tensor math (float64, any leading dimensions). :func:`recover_axes` turns learned
values into candidate axes â_m, :func:`gamma_vectors` forms γ_i = (K̃ â_m)_i / (N â_im),
:func:`pairwise_spread` measures how far γ is from constant, :func:`perturbed_axes` builds P2's
perturbed control basis, and :func:`gamma_spread_batched` does it all for the learned V beside the
two controls of method §4 (true eigenvectors, P2's perturbed basis), with
:func:`spread_summary` as the verdict input; what float64 determines of it (method §4.2,
"Precision") is :mod:`checks.gamma_precision`. The eigenvalue statistics, the first part of claim
E, are :mod:`checks.spectrum`.

Names follow method §4 (``docs/method.md``). Nothing here loops over heads or samples in the math.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ._validation import check_ndim, check_same_batch
from .errors import check_finite
from .gamma_controls import eigen_control_twin, perturbed_axes  # noqa: F401 (part of this API)
from .gamma_precision import canonical_axes, overlap_precision
from .round_off import relative_twin
from .similarity_scaling import centre_tokens
from .gram import DEFAULT_DTYPE, KeyGram
from .invariant_subspace import bias_direction, subspace_measures
from .nulls import shuffled_token_null


def recover_axes(v: torch.Tensor, log_g: torch.Tensor) -> torch.Tensor:
    """Candidate axes from values: â_jm = g_j·v_jm, centred over tokens j (P1 Eq. 6 inverted; method §4).

    For v = V̂ = G(I − 11ᵀ/N)A this returns A − mean_j(A) exactly (up to round-off).

    Parameters
    ----------
    v : Tensor [..., N, m]
        Value vectors of one head per leading index.
    log_g : Tensor [..., N]
        log g_j (``KeyGram.log_g``).

    Returns
    -------
    Tensor [..., N, m], float64 unless ``v`` has another floating dtype.

    Raises
    ------
    ValueError
        On mismatched shapes.
    NonFiniteError
        If g_j·v_jm overflows (log g_j > ~709 in float64). γ is unchanged when all of a head's
        g_j are divided by one constant, so a caller may pass log g − max_j log g to avoid that.

    Examples
    --------
    >>> k = torch.randn(8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> kg = KeyGram(k)
    >>> a = kg.axes()
    >>> torch.allclose(recover_axes(kg.kpca_values(), kg.log_g), a - a.mean(-2, keepdim=True))
    True
    """
    if v.ndim < 2 or log_g.shape != v.shape[:-1]:
        raise ValueError(f"v must be [..., N, m] and log_g [..., N]; got {tuple(v.shape)} and {tuple(log_g.shape)}")
    axes = v * torch.exp(log_g).unsqueeze(-1)                            # â_jm = g_j v_jm
    axes = centre_tokens(axes)                                           # centred over j
    check_finite(axes, "recovered axes g_j·v_jm")
    return axes


def gamma_vectors(centred_gram: torch.Tensor, axes: torch.Tensor,
                  rtol: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """γ_im = (K̃ â_m)_i / (N â_im) (P1 Eq. 11; method §4), with zero entries of â masked out.

    If â_m is an eigenvector of K̃ with eigenvalue μ_m, γ_im = μ_m/N for every i. γ is unchanged
    when â_m is multiplied by a nonzero constant and scales with K̃.

    Parameters
    ----------
    centred_gram : Tensor [..., N, N]
        K̃ (``KeyGram.centred``).
    axes : Tensor [..., N, m]
        Candidate axes â (any column scale).
    rtol : float, optional
        An entry is *valid* when |â_im| > rtol·max_j |â_jm|; default the dtype's machine epsilon,
        so exact zeros (and entries below round-off of their column) never divide.

    Returns
    -------
    (gamma, valid) : Tensors [..., N, m] and bool [..., N, m]
        ``gamma`` is 0 where ``valid`` is False (never NaN or Inf from a division by zero).

    Examples
    --------
    For a true eigenvector γ is constant over tokens (= μ/N):

    >>> k = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> kg = KeyGram(k)
    >>> gamma, valid = gamma_vectors(kg.centred, kg.axes(1))
    >>> torch.allclose(gamma[valid], kg.eigenvalues[0] / 6)
    True
    """
    if centred_gram.shape[-1] != centred_gram.shape[-2] or axes.shape[-2] != centred_gram.shape[-1]:
        raise ValueError(f"centred_gram must be [..., N, N] and axes [..., N, m] with the same N; got "
                         f"{tuple(centred_gram.shape)} and {tuple(axes.shape)}")
    n = axes.shape[-2]
    tol = torch.finfo(axes.dtype).eps if rtol is None else rtol
    valid = axes.abs() > tol * axes.abs().amax(dim=-2, keepdim=True)
    safe = torch.where(valid, axes, torch.ones((), dtype=axes.dtype, device=axes.device))
    gamma = (centred_gram @ axes) / (n * safe)                           # P1 Eq. 11
    return torch.where(valid, gamma, torch.zeros((), dtype=gamma.dtype, device=gamma.device)), valid


def pairwise_spread(gamma: torch.Tensor, valid: torch.Tensor | None = None,
                    relative: bool = True) -> torch.Tensor:
    """Mean over token pairs i < j of |γ_i − γ_j| (absolute) or |γ_i − γ_j| / max(|γ_i|, |γ_j|) (method §4).

    Pairs with an invalid entry (``valid`` False) are left out. A relative term whose two γ are
    both 0 counts as 0 (identical values). No N×N pair tensor is built: after sorting each column
    the pair sum has a closed form, O(N log N) per column (see :func:`_pair_sum`).

    Parameters
    ----------
    gamma : Tensor [..., N, m]
    valid : bool Tensor [..., N, m], optional
        From :func:`gamma_vectors`; all True when omitted.
    relative : bool, default True

    Returns
    -------
    Tensor [..., m]: the spread of each column.

    Raises
    ------
    ValueError
        If a column has fewer than two valid entries (no pair to compare), naming its index.

    Examples
    --------
    >>> gamma = torch.tensor([[2.0], [2.0], [2.0]], dtype=torch.float64)
    >>> pairwise_spread(gamma).tolist()
    [0.0]
    >>> pairwise_spread(torch.tensor([[1.0], [2.0]], dtype=torch.float64)).tolist()
    [0.5]
    """
    check_ndim(gamma, "gamma", shape="[..., N, m]")
    if valid is None:
        valid = torch.ones(gamma.shape, dtype=torch.bool, device=gamma.device)
    if valid.shape != gamma.shape:
        raise ValueError(f"valid must have gamma's shape {tuple(gamma.shape)}, got {tuple(valid.shape)}")
    n_valid = valid.sum(dim=-2)
    if bool((n_valid < 2).any()):
        where = tuple(int(i) for i in torch.nonzero(n_valid < 2)[0])
        raise ValueError(f"γ column at index {where} (leading dims..., component) has fewer than two "
                         f"nonzero axis entries; its spread is undefined")
    pairs = n_valid * (n_valid - 1) / 2
    return _pair_sum(gamma, valid, relative) / pairs


def _sorted_tokens(gamma: torch.Tensor, valid: torch.Tensor,
                   relative: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each column of γ [..., N, m] sorted along the tokens by its key (|γ| when ``relative``, γ
    otherwise), invalid entries first as 0: (γ sorted, c_r) [..., m, N], c_r the number of valid
    entries before position r (the invalid ones are the first, so c_r = max(r − #invalid, 0)).

    On the CPU (float64) the values themselves are sorted, by NumPy's vectorised sort along
    contiguous rows: 3x faster than its argsort, and no gather (measured on all-MiniLM-L6-v2's
    claim E: 10 ms against 3 ms per [60·96, 80] block, a third of γ's time). The relative key is
    |γ|'s bits with the sign bit moved last, an unsigned integer in |γ|'s order (among equal |γ|,
    the positive first) from which γ reads back exactly; invalid entries are 0 there (tied with
    valid zeros, all of whose pair terms are 0) and −inf in the absolute key."""
    gt = gamma.transpose(-1, -2).contiguous()                            # tokens last
    vt = valid.transpose(-1, -2)
    first = (~vt).sum(dim=-1, keepdim=True)
    before = (torch.arange(gt.shape[-1], device=gt.device) - first).clamp_min(0).to(gt.dtype)
    zero = torch.zeros((), dtype=gt.dtype, device=gt.device)
    if gt.device.type != "cpu" or gt.dtype != torch.float64:
        key = torch.where(vt, gt.abs() if relative else gt, -math.inf)
        return torch.where(vt, gt, zero).gather(-1, key.argsort(dim=-1)), before
    if relative:
        bits = torch.where(vt, gt, zero).detach().numpy().view(np.uint64)
        key = np.sort((bits << np.uint64(1)) | (bits >> np.uint64(63)), axis=-1)
        back = (key >> np.uint64(1)) | (key << np.uint64(63))             # γ's own bits
        return torch.from_numpy(back.view(np.float64)), before
    key = np.sort(torch.where(vt, gt, -math.inf).detach().numpy(), axis=-1)
    return torch.from_numpy(np.where(np.isneginf(key), 0.0, key)), before


def _pair_sum(gamma: torch.Tensor, valid: torch.Tensor, relative: bool) -> torch.Tensor:
    """Σ over valid pairs i < j (along dim −2) of |γ_i − γ_j|, or of |γ_i − γ_j| / max(|γ_i|, |γ_j|).

    Sort the valid entries (invalid ones first, weightless) and let, for the entry at sorted
    position r, c_r be the number of valid entries before it and C_r the sum of their γ.
    Absolute (sorted by γ): every earlier γ_j ≤ γ_r, so the pairs ending at r add c_r·γ_r − C_r.
    Relative (sorted by |γ|): every earlier |γ_j| ≤ |γ_r| = max, and |γ_r − γ_j|/|γ_r| =
    1 − γ_j/γ_r for either sign of γ_j, so they add c_r − C_r/γ_r (0 when γ_r = 0, since then all
    earlier γ_j are 0 as well).
    """
    g, before = _sorted_tokens(gamma, valid, relative)                  # [..., m, N]; c_r
    zero = torch.zeros((), dtype=g.dtype, device=g.device)
    prefix = g.cumsum(dim=-1) - g                                        # C_r
    if relative:
        nonzero = g != 0
        terms = torch.where(nonzero, before - prefix / torch.where(nonzero, g, 1.0), zero)
    else:
        terms = before * g - prefix
    # each term is a sum of nonnegative pair terms; the closed form can cancel to −ε (identical γ).
    # An invalid entry's term is 0 (γ 0, c_r 0). Summed over tokens in the [..., N, m] layout:
    # the summation order of the measured numbers
    return terms.clamp_min(0).transpose(-1, -2).contiguous().sum(dim=-2)


def spread_summary(spreads: dict) -> dict:
    """Per head: the mean over components of each relative spread, and the method §4 verdict input.

    Parameters
    ----------
    spreads : dict
        With ``"learned"``, ``"eigen"``, ``"perturbed"`` Tensors [..., m] (relative spreads).

    Returns
    -------
    dict with ``"learned"``, ``"eigen"``, ``"perturbed"`` Tensors [...] (means over components)
    and ``"closer_to_eigen"`` bool [...]: |learned − eigen| < |learned − perturbed|, on the means
    (method §4: *supported* when True, *refuted* otherwise).
    """
    means = {name: spreads[name].mean(dim=-1) for name in ("learned", "eigen", "perturbed")}
    means["closer_to_eigen"] = ((means["learned"] - means["eigen"]).abs()
                                < (means["learned"] - means["perturbed"]).abs())
    return means


def gamma_spread_batched(k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                         standardize: bool = False, seed: int | Sequence[int] = 0,
                         gram: KeyGram | None = None,
                         null_perm: torch.Tensor | None = None, round_off: bool = False) -> dict:
    """γ-constancy spreads of the learned values beside the two controls of method §4, per head.

    For keys ``k`` and learned values ``v`` of each head: build K̃ and log g in log space
    (:class:`checks.gram.KeyGram`), recover â = centred g·v (:func:`recover_axes`), form γ
    (:func:`gamma_vectors`) and its mean pairwise spread (:func:`pairwise_spread`). Controls use
    the same K̃: ``"eigen"`` its top-m eigenvectors A (spread ≈ 0), ``"perturbed"`` P2's
    QR(A + 0.1·N(0,1)) (:func:`perturbed_axes`), with m = min(d_v, N − 1): the constant vector,
    K̃'s trivial null vector, is never a control. Inside a (nearly) degenerate eigenspace A's
    basis is made the eigenspace's own (:func:`canonical_axes`), so neither control depends on the
    eigensolver's choice there.

    Parameters
    ----------
    k : Tensor [..., N, d]
        Keys.
    v : Tensor [..., N, d_v]
        Learned value vectors (before the output projection), same leading dims and N.
    scale : float, optional
        Softmax scale s; 1/√d when omitted.
    standardize : bool, default False
        Standardise keys (method §1) before the Gram matrix; ``v`` is used as given.
    seed : int or sequence of int, default 0
        Seed of the perturbed control: one for the batch, or one per head item
        (:func:`perturbed_axes`).
    gram : KeyGram, optional
        The :class:`checks.gram.KeyGram` of these keys (same ``scale`` and ``standardize``, built
        with eigenvectors and ``top`` ≥ min(d_v, N − 1)), when the caller has one already (claim
        E builds it for its log-space route): saves a second Gram matrix and eigendecomposition.
    null_perm : LongTensor [..., N], optional
        One token permutation per head item (:func:`checks.nulls.token_permutations`): adds the
        chance level of the subspace measures, the axes recovered from the token-shuffled values
        ΠV on the same K̃ and g (method §4.2), as ``"null_subspace"`` and ``"null_directions"``.
    round_off : bool, default False
        Also compute every measure's round-off twin (method §13.2), as ``"<key>_twin"``.

    Returns
    -------
    dict with Tensors (float64): ``"learned"`` [..., d_v], ``"eigen"``, ``"perturbed"`` [..., m]
    (relative spreads); ``"learned_abs"``, ``"eigen_abs"``, ``"perturbed_abs"`` (absolute spreads,
    same shapes); ``"<name>_subspace"`` (ρ, :func:`checks.invariant_subspace.invariant_subspace_residual`)
    and ``"<name>_directions"`` (ω, :func:`checks.invariant_subspace.invariance_overlap`) [...] for
    each candidate (and ``"null"`` with ``null_perm``); ``"learned_directions_precision"`` (and
    ``"null_directions_precision"``) [...]: how far round-off moves that ω
    (:func:`overlap_precision`); with ``round_off``, ``"<key>_twin"`` for every spread, ρ and ω above:
    the round-off twin (method §13.2) from K̃ moved by round-off, its own eigen control and
    perturbed control, and the learned and null axes moved by round-off; ``"summary"`` (:func:`spread_summary`);
    ``"undetermined"`` bool [...]
    (``KeyGram.undetermined``: μ_d is round-off and the eigen control is not meaningful).

    Raises
    ------
    ValueError
        On mismatched shapes, N < 3, or a degenerate column (see :func:`pairwise_spread`).
    NonFiniteError
        If keys or values contain NaN or Inf.
    """
    check_same_batch(k, v, ("k [..., N, d]", "v [..., N, d_v]"))
    if k.shape[-2] < 3:
        raise ValueError(f"need at least 3 tokens for a pairwise spread of a centred axis, got N={k.shape[-2]}")
    check_finite(v, "values")
    if gram is None:
        gram = KeyGram(k, scale=scale, standardize=standardize)
    elif gram.n != k.shape[-2] or gram.log_g.shape != k.shape[:-1]:
        raise ValueError(f"gram is the KeyGram of keys {tuple(gram.keys.shape)}, not of "
                         f"{tuple(k.shape)}")
    kg = gram
    v = v.to(DEFAULT_DTYPE)
    # γ is invariant to scaling a head's â by a constant, so divide g by its per-head maximum
    # (exactly cancelling) to keep g_j·v_jm finite for large key norms.
    log_g = kg.log_g - kg.log_g.amax(dim=-1, keepdim=True)
    m = min(v.shape[-1], kg.n - 1)
    # the basis inside a (nearly) degenerate eigenspace is the solver's choice: make it the
    # eigenspace's own, so that P2's perturbed control is a function of K̃ (method §4.2)
    eigen = canonical_axes(kg.eigenvalues[..., :m], kg.axes(m))
    candidates = {
        "learned": recover_axes(v, log_g),
        "eigen": eigen,
        "perturbed": perturbed_axes(eigen, seed=seed),
    }
    if null_perm is not None:  # ρ's and ω's chance level (method §4.2)
        candidates["null"] = recover_axes(shuffled_token_null(v, null_perm), log_g)
    # V + 1cᵀ moves â by h·cᵀ, h = g − ḡ: ρ and ω judge span([Â, h]), the same for every c
    bias = bias_direction(log_g)
    out, degenerate = _measures(kg.centred, candidates, bias)
    for name in ("learned", "null"):  # spans of data, which can be ill-conditioned (method §4.2)
        if name in candidates:
            out[f"{name}_directions_precision"] = overlap_precision(
                kg.centred, candidates[name], out[f"{name}_directions"], extra=bias)
    if round_off:  # method §13.2: every measure again on round-off-moved K̃ and axes
        twin_gram, twin_eigen = eigen_control_twin(kg, m)
        twins = {name: relative_twin(axes, 3) for name, axes in candidates.items()
                 if name in ("learned", "null")}
        twins.update(eigen=twin_eigen, perturbed=perturbed_axes(twin_eigen, seed=seed))
        twin, _ = _measures(twin_gram, {name: twins[name] for name in candidates},
                            relative_twin(bias.unsqueeze(-1), 4).squeeze(-1))
        out.update({f"{key}_twin": value for key, value in twin.items()})
    if bool((degenerate & ~kg.undetermined).any()):
        where = tuple(int(i) for i in torch.nonzero(degenerate & ~kg.undetermined)[0])
        raise ValueError(f"γ column of a determined head at index {where} has fewer than two "
                         "nonzero axis entries; its spread is undefined")
    out["summary"] = spread_summary(out)
    out["undetermined"] = kg.undetermined
    return out


def _measures(centred: torch.Tensor, candidates: dict[str, torch.Tensor],
              bias: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each candidate's relative and absolute γ spreads per column (``name``, ``name_abs``; the
    null has none), its invariant-subspace residual ρ (``name_subspace``) and direction overlap ω
    (``name_directions``) of span([Â, ``bias``]) on K̃ = ``centred``; and whether a head has a
    column whose spread is undefined (method §4, §4.2)."""
    spread = {name: axes for name, axes in candidates.items() if name != "null"}
    # An undetermined head (μ_d round-off; K̃ = 0 for identical keys) can have eigen-control
    # columns with a single nonzero entry (eigh returns unit vectors for a zero matrix): their
    # spread is undefined. Such columns get spread 0, never NaN, and the head stays flagged.
    # The candidates side by side as one [..., N, d_v + 2m] block: every step is per column,
    # so one product with K̃ and one pair of sorts serve all of them.
    widths = [axes.shape[-1] for axes in spread.values()]
    gamma, valid = gamma_vectors(centred, torch.cat(list(spread.values()), dim=-1))
    lacking = valid.sum(dim=-2) < 2                                      # [..., d_v + 2m]
    degenerate = lacking.any(dim=-1)
    gamma = gamma.masked_fill(lacking.unsqueeze(-2), 0.0)
    valid = valid | lacking.unsqueeze(-2)
    spreads = (pairwise_spread(gamma, valid, relative=True).split(widths, dim=-1),
               pairwise_spread(gamma, valid, relative=False).split(widths, dim=-1))
    out: dict[str, torch.Tensor] = {}
    for name, rel, absolute in zip(spread, *spreads):
        out[name], out[f"{name}_abs"] = rel, absolute
    # the basis-free form of γ constancy: is span(Â) K̃-invariant? (method §4.2)
    for name, axes in candidates.items():
        out[f"{name}_subspace"], out[f"{name}_directions"] = subspace_measures(centred, axes,
                                                                                bias)
    return out, degenerate


def gamma_spread(k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> dict:
    """Relative γ spreads of one head: {"learned": [d], "eigen": [m], "perturbed": [m]} (float64).

    Keys ``k`` [N, d] and learned values ``v`` [N, d_v]; m = min(d_v, N − 1). The single-head form of
    :func:`gamma_spread_batched` (seed 0, raw keys), which documents the method.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> k = torch.randn(12, 3, generator=g, dtype=torch.float64)
    >>> out = gamma_spread(k, KeyGram(k).kpca_values())  # V = V̂: the learned V are eigenvectors
    >>> float(out["learned"].max()) < 1e-6, float(out["perturbed"].min()) > 1e-3
    (True, True)
    """
    if k.ndim != 2 or v.ndim != 2:
        raise ValueError(f"gamma_spread takes one head, k [N, d] and v [N, d_v]; got {tuple(k.shape)} and "
                         f"{tuple(v.shape)} (use gamma_spread_batched for leading dims)")
    out = gamma_spread_batched(k, v, scale=scale)
    return {name: out[name] for name in ("learned", "eigen", "perturbed")}

