"""Property-based tests of the metric functions: bounds and invariances on random shapes, scales
and dtypes, degenerate inputs included (repeated tokens, zero rows, rank-deficient values).

Shapes: N tokens 3..40, d features 2..16 (so N < d occurs); scales 1e-3..50; float32 and float64.
Tensors come from a seeded torch generator (hypothesis draws the seed, shape, scale and the kind
of degeneracy), which keeps each example cheap. Every property also asserts that nothing returns
a NaN: an input the math cannot handle must raise, not answer NaN.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checks import gamma as gamma_constancy
from checks import cka, matrix_similarity, row_similarity, spectrum
from checks.errors import NonFiniteError
from checks.gram import KeyGram
from checks.projection import projection_terms_batched

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEGENERACY = ("none", "repeated tokens", "zero row", "rank one")


def tol(dtype: torch.dtype) -> float:
    """Round-off allowance of a bound (cosine, CKA and overlap are normalised to O(1))."""
    return 1e-5 if dtype == torch.float32 else 1e-12


@st.composite
def matrices(draw, count: int = 1, batch: tuple[int, ...] = (2,)):
    """``count`` tensors [*batch, N, d] of one shape, scale, dtype and degeneracy, plus the dtype."""
    n, d = draw(st.integers(3, 40)), draw(st.integers(2, 16))
    scale = draw(st.floats(1e-3, 50.0))
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    kind = draw(st.sampled_from(DEGENERACY))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    out = []
    for _ in range(count):
        x = scale * torch.randn(*batch, n, d, generator=gen, dtype=torch.float64)
        if kind == "repeated tokens":
            x[..., : (n + 1) // 2, :] = x[..., :1, :]
        elif kind == "zero row":
            x[..., -1, :] = 0.0
        elif kind == "rank one":
            x = x[..., :, :1] * torch.linspace(-1.0, 1.0, d, dtype=torch.float64)
        out.append(x.to(dtype))
    return (*out, dtype)


def assert_finite(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert not bool(torch.isnan(t).any()), t


def orthogonal(d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed),
                                       dtype=torch.float64))
    return q.to(dtype)


# ------------------------------------------------------------------------------ claim V metrics
@SETTINGS
@given(matrices(count=2))
def test_cka_is_in_unit_interval_and_symmetric(args):
    x, y, dtype = args
    for fn in (cka.linear_cka, cka.kernel_cka):
        value = fn(x, y)
        assert_finite(value)
        assert bool((value >= -tol(dtype)).all() and (value <= 1 + tol(dtype)).all()), value
    torch.testing.assert_close(cka.linear_cka(x, y), cka.linear_cka(y, x),
                               rtol=0, atol=10 * tol(dtype))


@SETTINGS
@given(matrices(), st.floats(1e-3, 50.0), st.integers(0, 1000))
def test_cka_of_a_rotated_rescaled_copy_is_one(args, factor, seed):
    """CKA is invariant to orthogonal maps and isotropic scaling: CKA(X, c·XQ) = CKA(X, X) = 1
    unless X has no variance at all (then 0)."""
    x, dtype = args
    x = x.to(torch.float64)  # the invariance, not float32 round-off of the copy, is under test
    y = factor * x @ orthogonal(x.shape[-1], torch.float64, seed)
    centred = x - x.mean(-2, keepdim=True)
    spread = torch.linalg.vector_norm(centred, dim=(-2, -1)) > 1e-9 * x.abs().amax(dim=(-2, -1))
    for fn in (cka.linear_cka, cka.kernel_cka):
        value = fn(x, y)
        expected = torch.where(spread, 1.0, 0.0).to(value.dtype)
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-6)


@SETTINGS
@given(matrices(count=2))
def test_cosines_are_bounded_and_the_optimal_matching_beats_the_identity(args):
    x, y, dtype = args
    c = row_similarity.cosine_matrix(x, y)
    direct, best = row_similarity.direct_cosine(x, y), row_similarity.optimal_cosine(x, y)
    r = row_similarity.pearson(x, y)
    assert_finite(c, direct, best, r)
    for value in (c, direct, best, r):
        assert bool((value.abs() <= 1).all()), value
    # the identity is one of the matchings the optimum is taken over
    assert bool((best >= direct - 10 * tol(dtype)).all())
    # the diagonal of the cosine matrix is the direct cosine of each token
    torch.testing.assert_close(torch.diagonal(c, dim1=-2, dim2=-1).mean(-1), direct,
                               rtol=0, atol=10 * tol(dtype))


@SETTINGS
@given(matrices(count=2), st.integers(0, 1000))
def test_subspace_overlap_is_bounded_and_invariant_to_invertible_maps(args, seed):
    x, y, dtype = args
    overlap = matrix_similarity.subspace_overlap(x, y)
    assert_finite(overlap)
    assert bool((overlap >= -tol(dtype)).all() and (overlap <= 1 + 10 * tol(dtype)).all()), overlap
    # an invertible (well-conditioned) map of y's columns leaves its column space unchanged; the
    # numerical rank of a nearly rank-deficient y is not stable under it, so only clear ranks count
    d = x.shape[-1]
    m = orthogonal(d, torch.float64, seed) @ torch.diag(torch.linspace(1.0, 3.0, d, dtype=torch.float64))
    x64, y64 = x.to(torch.float64), y.to(torch.float64)
    sv = torch.linalg.svdvals(y64)
    clear = ((sv > 1e-6 * sv[..., :1]) | (sv == 0)).all(-1)
    torch.testing.assert_close(matrix_similarity.subspace_overlap(x64, y64 @ m)[clear],
                               matrix_similarity.subspace_overlap(x64, y64)[clear],
                               rtol=0, atol=1e-8)
    self_overlap = matrix_similarity.subspace_overlap(x64, x64)
    nonzero = x64.abs().amax(dim=(-2, -1)) > 0
    torch.testing.assert_close(self_overlap, torch.where(nonzero, 1.0, 0.0).to(torch.float64),
                               rtol=0, atol=1e-8)


@SETTINGS
@given(matrices(count=2))
def test_relative_frobenius_is_nonnegative_and_zero_for_identical_inputs(args):
    x, y, dtype = args
    value = matrix_similarity.relative_frobenius(x, y)
    assert_finite(value)
    assert bool((value >= 0).all())
    nonzero = x.abs().amax(dim=(-2, -1)) > 0
    assert bool(torch.isfinite(value[nonzero]).all())  # +inf only for a zero reference V
    assert bool((matrix_similarity.relative_frobenius(x, x) == 0).all())


# ------------------------------------------------------------------------- Gram spectrum (§1)
@SETTINGS
@given(matrices(batch=(2, 2)))
def test_gram_entries_and_spectrum_bounds(args):
    """K_φ entries lie in [0, 1] (0 only by underflow), K̃ has zero row sums, and its eigenvalues
    are ≥ −N·ε·‖K_φ‖₂ (the round-off scale the undetermined flag uses)."""
    k, dtype = args
    gram = KeyGram(k, dtype=dtype)
    info = torch.finfo(dtype)
    assert_finite(gram.gram, gram.centred, gram.eigenvalues, gram.threshold)
    assert bool(((gram.gram >= 0) & (gram.gram <= 1)).all())
    scale = gram.gram.abs().amax(dim=(-2, -1))
    row_sums = gram.centred.sum(-1).abs().amax(-1)
    assert bool((row_sums <= 10 * gram.n * (info.eps * scale + info.tiny)).all())
    assert bool((gram.eigenvalues[..., :-1] >= gram.eigenvalues[..., 1:]).all())  # descending
    # Keys with s·‖k‖² beyond the dtype's exponent range (large scale, float32) leave K_φ near or
    # below the smallest normal number, where the bound loses meaning (see
    # test_a_subnormal_gram_is_undetermined below)
    normal = scale >= info.tiny / info.eps
    mu_min = gram.eigenvalues[..., -1]
    assert bool((mu_min[normal] >= -gram.threshold[normal]).all()), (mu_min, gram.threshold)
    if gram.d > gram.n:
        assert bool(gram.undetermined.all())


@SETTINGS
@given(matrices(batch=(2,)))
def test_naive_route_never_hands_out_an_unflagged_nan(args):
    """The naive float32 exp(S) route: NaN exactly where it says the item is not finite."""
    k, _ = args
    naive = spectrum.naive_gram_spectrum(k)
    nan_items = torch.isnan(naive.mu).any(dim=-1)
    assert bool((nan_items == ~naive.finite).all())
    stages = torch.stack(list(naive.first_nonfinite_stage.values()))
    assert bool((stages.sum(0) == (~naive.finite).to(torch.long)).all())  # one first stage each


# -------------------------------------------------------------------------- claim J terms (§3)
@SETTINGS
@given(matrices(count=3))
def test_projection_terms_are_nonnegative_or_refused(args):
    """‖φ(q)‖² and ‖h‖² are squared norms: ≥ 0. A value beyond the dtype's range raises
    NonFiniteError; it is never returned as inf or NaN."""
    q, k, v, dtype = args
    try:
        terms = projection_terms_batched(q, k, v, dtype=dtype)
    except NonFiniteError as err:
        assert "exceeds the dtype's range" in str(err)
        return
    except ValueError as err:  # the magnitude ratio of all-zero values is undefined
        assert "undefined" in str(err)
        return
    for name in ("log_phi_sq", "phi_sq", "h_sq", "j_proj", "bessel_share", "log10_ratio"):
        assert bool(torch.isfinite(terms[name]).all()), name
    assert bool((terms["phi_sq"] >= 0).all() and (terms["h_sq"] >= 0).all())
    assert bool(((terms["bessel_share"] >= 0) & (terms["bessel_share"] <= 1)).all())
    torch.testing.assert_close(terms["j_proj"], (terms["phi_sq"] - terms["h_sq"]).mean(-1))


# ------------------------------------------------------------------------- γ spread (§4)
def _brute_spread(gamma: torch.Tensor, relative: bool) -> torch.Tensor:
    """Mean over pairs i < j of |γ_i − γ_j| (over max(|γ_i|, |γ_j|) if relative), [..., m]."""
    diff = (gamma.unsqueeze(-2) - gamma.unsqueeze(-3)).abs()  # [..., N, N, m]
    if relative:
        top = torch.maximum(gamma.abs().unsqueeze(-2), gamma.abs().unsqueeze(-3))
        diff = torch.where(top > 0, diff / torch.where(top > 0, top, 1.0), 0.0)
    n = gamma.shape[-2]
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    return diff[..., upper, :].sum(-2) / (n * (n - 1) / 2)


@SETTINGS
@given(matrices())
def test_gamma_spreads_are_nonnegative_bounded_and_match_all_pairs(args):
    gamma, dtype = args
    gamma = gamma.to(torch.float64)
    relative = gamma_constancy.pairwise_spread(gamma, relative=True)
    absolute = gamma_constancy.pairwise_spread(gamma, relative=False)
    assert_finite(relative, absolute)
    assert bool(((relative >= 0) & (relative <= 2)).all() and (absolute >= 0).all())
    torch.testing.assert_close(relative, _brute_spread(gamma, True), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(absolute, _brute_spread(gamma, False), rtol=1e-9,
                               atol=1e-12 * max(1.0, float(gamma.abs().max())))


@SETTINGS
@given(matrices(count=2))
def test_gamma_spread_of_heads_is_nonnegative_or_refused(args):
    k, v, _ = args
    try:
        out = gamma_constancy.gamma_spread_batched(k, v)
    except ValueError as err:  # a degenerate γ column is refused, naming it
        assert "fewer than two nonzero axis entries" in str(err)
        return
    except NonFiniteError:  # g_j·v_j beyond float64 (log g > ~709)
        return
    # The closed-form pair sum cancels: exact ≥ 0, computed ≥ −a few ε (see the regression below)
    slack = 16 * torch.finfo(torch.float64).eps
    for name in ("learned", "eigen", "perturbed"):
        assert_finite(out[name], out[f"{name}_abs"])
        assert bool((out[name] >= -slack).all() and (out[name] <= 2).all()), out[name]
        assert bool((out[f"{name}_abs"] >= -slack * out[f"{name}_abs"].abs().amax()).all())


# ------------------------------------------------------------- regressions found by the above
def test_spread_of_identical_gammas_is_not_negative():
    """Identical γ (a true eigenvector) have spread 0; the closed form returns −7.4e-17."""
    gamma = torch.full((4, 1), 1.871572222987025, dtype=torch.float64)
    assert float(gamma_constancy.pairwise_spread(gamma, relative=True)) >= 0
    assert float(gamma_constancy.pairwise_spread(gamma, relative=False)) >= 0


def test_a_subnormal_gram_is_undetermined():
    """float32 keys with s·‖k‖² ≈ 8000: every K_φ entry is ≤ 2e-44 (subnormal). float64 finds
    μ_2 ≈ 1e-61 ≤ its threshold 1e-59 (undetermined); float32 must not call μ_2 = 1.4e-45 (one
    subnormal step, pure round-off) determined."""
    k = torch.tensor([[0.3328995108604431, -0.3328995108604431],
                      [107.01476287841797, -107.01476287841797],
                      [44.71470642089844, -44.71470642089844]], dtype=torch.float32)
    assert bool(KeyGram(k.to(torch.float64)).undetermined)
    gram = KeyGram(k, dtype=torch.float32)
    assert float(gram.gram.max()) < torch.finfo(torch.float32).tiny
    assert bool(gram.undetermined)

