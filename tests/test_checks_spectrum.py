"""Known-answer tests for checks/spectrum.py and checks/gamma.py: claim-E eigenvalue statistics and γ
constancy (method §4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from checks.errors import NonFiniteError
from checks.gram import KeyGram, standardize_tokens
from checks.gamma import (
    gamma_spread,
    gamma_spread_batched,
    gamma_vectors,
    pairwise_spread,
    perturbed_axes,
    recover_axes,
    spread_summary,
)
from checks.spectrum import (
    NAIVE_STAGES,
    STATISTICS,
    eigenvalue_statistics,
    gram_spectrum,
    gram_spectrum_batched,
    naive_gram_spectrum,
    route_comparison,
)
from tests._helpers import CROSS_PATH_UNIT, EPS32, F64, cross_path_f32_eigenvalues, randn


def brute_spread(gamma, valid, relative):
    """Reference: a Python double loop over pairs i < j for one column."""
    terms = []
    for i, j in itertools.combinations(range(len(gamma)), 2):
        if valid[i] and valid[j]:
            a, b = float(gamma[i]), float(gamma[j])
            t = abs(a - b)
            if relative:
                top = max(abs(a), abs(b))
                t = t / top if top > 0 else 0.0
            terms.append(t)
    return sum(terms) / len(terms)


# ------------------------------------------------------------------------------------------ spectra

def test_spectrum_of_orthogonal_equal_norm_keys_is_known():
    # N orthogonal keys of equal norm: S = t·I, K = (e^t − 1)I + 11ᵀ, g = e^t − 1 + N, so
    # K̃ = (e^t − 1)/g² · H: eigenvalue (e^t − 1)/g² (N − 1 times) and 0.
    n, d, c = 5, 8, 2.0
    k = torch.zeros(n, d, dtype=F64)
    k[torch.arange(n), torch.arange(n)] = c
    t = c * c / math.sqrt(d)
    lam = math.expm1(t) / (math.expm1(t) + n) ** 2
    mu = gram_spectrum(k)
    assert mu.dtype == F64 and mu.shape == (n,)
    expected = torch.tensor([lam] * (n - 1) + [0.0], dtype=F64)
    torch.testing.assert_close(mu, expected, rtol=0, atol=1e-15)
    # an explicit scale replaces 1/√d
    t2 = c * c * 0.3
    lam2 = math.expm1(t2) / (math.expm1(t2) + n) ** 2
    torch.testing.assert_close(gram_spectrum(k, scale=0.3)[0], torch.tensor(lam2, dtype=F64), rtol=1e-13, atol=0)


def test_two_token_spectrum_is_known():
    # N = 2: K̃ = (K11 + K22 − 2K12)/4 · [[1, −1], [−1, 1]], so μ = ((K11 + K22 − 2K12)/2, 0).
    k = torch.tensor([[1.0, 0.5, -0.3], [0.2, -0.7, 0.9]], dtype=F64)
    s = 1 / math.sqrt(3)
    S = s * (k @ k.T)
    g = S.exp().sum(1)
    kphi = S.exp() / (g[:, None] * g[None, :])
    mu1 = float(kphi[0, 0] + kphi[1, 1] - 2 * kphi[0, 1]) / 2
    torch.testing.assert_close(gram_spectrum(k), torch.tensor([mu1, 0.0], dtype=F64), rtol=1e-13, atol=1e-15)


def test_spectrum_options_and_batching():
    k = randn(2, 3, 12, 6, seed=1)
    batched = gram_spectrum_batched(k)
    assert batched.shape == (2, 3, 12)
    assert bool((batched[..., :-1] >= batched[..., 1:]).all())  # descending
    torch.testing.assert_close(batched[1, 2], gram_spectrum(k[1, 2]), rtol=1e-12, atol=1e-16)
    std = gram_spectrum_batched(k, standardize=True)
    torch.testing.assert_close(std, gram_spectrum_batched(standardize_tokens(k)), rtol=0, atol=0)
    assert not torch.allclose(std, batched)
    with pytest.raises(ValueError, match=r"\[N, d\]"):
        gram_spectrum(k)
    with pytest.raises(ValueError, match="scale"):
        gram_spectrum(k[0, 0], scale=-1.0)


def test_centred_gram_eigenvalues_are_nonnegative_up_to_roundoff():
    k = torch.cat([randn(4, 30, 8, seed=2), 6 * randn(4, 30, 8, seed=3)])
    kg = KeyGram(k)
    assert bool((kg.eigenvalues[..., -1] >= -kg.threshold).all())
    assert bool((kg.eigenvalues[..., 0] > 0).all())


# ------------------------------------------------------------------------------- naive float32 route

def test_naive_route_agrees_with_log_space_where_finite():
    k = randn(4, 16, 8, seed=4)
    ref = gram_spectrum_batched(k)
    mu, finite, stages = naive_gram_spectrum(k)
    assert mu.dtype == F64 and bool(finite.all())
    assert not any(bool(m.any()) for m in stages.values())
    top = ref.abs().amax(dim=-1, keepdim=True)
    assert bool(((mu - ref).abs() <= 10 * 16 * EPS32 * top).all())
    # the same naive formulas in float64 are an independent route to the log-space answer
    mu64 = naive_gram_spectrum(k, dtype=F64).mu
    torch.testing.assert_close(mu64, ref, rtol=0, atol=1e-14 * float(top.max()))
    # standardisation applies to the naive route too
    torch.testing.assert_close(naive_gram_spectrum(k, standardize=True, dtype=F64).mu,
                               gram_spectrum_batched(k, standardize=True), rtol=0, atol=1e-14)


def test_naive_route_overflows_on_large_keys_while_log_space_stays_finite():
    k = randn(3, 16, 8, seed=5)
    big = 50 * k
    mu, finite, stages = naive_gram_spectrum(big)
    assert not bool(finite.any())
    assert bool(torch.isnan(mu).all())
    assert bool(stages["exp"].all())
    assert bool(torch.isfinite(gram_spectrum_batched(big)).all())
    # a mixed batch: only the large item is flagged, the other keeps its own answer (to float32
    # round-off: the batched float32 products and eigvalsh may round otherwise than one item's)
    mixed = torch.stack([k[0], big[1]])
    mu, finite, stages = naive_gram_spectrum(mixed)
    assert finite.tolist() == [True, False]
    assert stages["exp"].tolist() == [False, True]
    alone = naive_gram_spectrum(k[0]).mu
    torch.testing.assert_close(mu[0], alone,
                               **cross_path_f32_eigenvalues(16, float(alone.abs().max())))
    assert bool(torch.isnan(mu[1]).all()) and bool(torch.isfinite(mu[0]).all())


def test_naive_route_names_the_first_stage_that_overflowed():
    n, d = 3, 4
    s = 1 / math.sqrt(d)
    normal = randn(n, d, seed=6)
    # "normaliser": identical keys with S = 88.5: each e^S ≈ 2.7e38 is finite, g = 3·e^S is not
    same = torch.full((n, d), math.sqrt(88.5 / s / d), dtype=F64)
    # "gram": orthogonal keys with S_ii = 50: g ≈ 5e21 is finite, g_i·g_j ≈ 3e43 is not
    ortho = torch.zeros(n, d, dtype=F64)
    ortho[torch.arange(n), torch.arange(n)] = math.sqrt(50 / s)
    # "scores": the keys fit float32 but S = s·‖k‖² does not
    huge = torch.full((n, d), 1e20, dtype=F64)
    # "exp": S ≈ 100
    hot = ortho * math.sqrt(2.0)
    mu, finite, stages = naive_gram_spectrum(torch.stack([normal, same, ortho, huge, hot]))
    assert finite.tolist() == [True, False, False, False, False]
    first = {name: mask.tolist() for name, mask in stages.items()}
    assert set(first) == set(NAIVE_STAGES)
    assert first["normaliser"] == [False, True, False, False, False]
    assert first["gram"] == [False, False, True, False, False]
    assert first["scores"] == [False, False, False, True, False]
    assert first["exp"] == [False, False, False, False, True]
    assert first["centre"] == first["eigen"] == [False] * 5
    assert torch.stack(list(stages.values())).sum(0).tolist() == [0, 1, 1, 1, 1]  # one stage each
    assert bool(torch.isfinite(mu[0]).all()) and bool(torch.isnan(mu[1:]).all())
    with pytest.raises(NonFiniteError):
        naive_gram_spectrum(torch.full((n, d), math.nan, dtype=F64))


def test_naive_route_batched_equals_per_item():
    k = randn(2, 3, 10, 4, seed=7)
    batched = naive_gram_spectrum(k).mu
    torch.testing.assert_close(batched[1, 2], naive_gram_spectrum(k[1, 2]).mu, rtol=1e-5, atol=1e-9)


# ---------------------------------------------------------------------------- eigenvalue statistics

def test_eigenvalue_statistics_hand_computed():
    # S = 3 samples, 1 layer, 2 heads, N = 4, d = 3. Spectra given unsorted; one signed value < 0.
    mu = torch.tensor([
        [[[0.1, 4.0, 2.0, 0.0], [6.0, 0.2, 2.0, 0.4]]],   # top-3 signed: (4,2,0.1), (6,2,0.4)
        [[[1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0]]],   # (1,1,1), (3,3,3)
        [[[5.0, -9.0, 1.0, 3.0], [1.0, 1.0, -1.0, 0.0]]],  # (5,3,1), (1,1,0): -9 is not in the top 3
    ], dtype=F64)
    st = eigenvalue_statistics(mu, d=3)
    profiles = torch.tensor([[5.0, 2.0, 0.25], [2.0, 2.0, 2.0], [3.0, 2.0, 0.5]], dtype=F64)
    torch.testing.assert_close(st["profile"], profiles, rtol=0, atol=1e-15)
    per = {"max": [5.0, 2.0, 3.0], "min": [0.25, 2.0, 0.5], "mean": [7.25 / 3, 2.0, 5.5 / 3],
           "median": [2.0, 2.0, 2.0]}
    for name in STATISTICS:
        torch.testing.assert_close(st["per_sample"][name], torch.tensor(per[name], dtype=F64), rtol=0, atol=1e-15)
        values = per[name]
        mean = sum(values) / 3
        std = math.sqrt(sum((x - mean) ** 2 for x in values) / 2)
        assert st["mean"][name] == pytest.approx(mean, abs=1e-14)
        assert st["std"][name] == pytest.approx(std, abs=1e-14)
    assert (st["n_samples"], st["n_finite"], st["n_nonfinite"], st["d"]) == (3, 3, 0, 3)


def test_eigenvalue_statistics_matches_numpy_with_even_d():
    gen = np.random.default_rng(0)
    mu = gen.normal(size=(6, 2, 3, 9))  # [S, L, H, N], unsorted, signed
    d = 4
    st = eigenvalue_statistics(torch.from_numpy(mu), d=d)
    top = -np.sort(-mu, axis=-1)[..., :d]
    profile = np.abs(top).reshape(6, -1, d).mean(axis=1)
    ref = {"max": profile.max(1), "min": profile.min(1), "mean": profile.mean(1), "median": np.median(profile, 1)}
    for name in STATISTICS:
        np.testing.assert_allclose(st["per_sample"][name].numpy(), ref[name], rtol=1e-13)
        assert st["mean"][name] == pytest.approx(ref[name].mean(), rel=1e-13)
        assert st["std"][name] == pytest.approx(ref[name].std(ddof=1), rel=1e-12)
    # numpy's median averages the two middle values; torch.median would take the lower one
    assert not np.allclose(ref["median"], np.sort(profile, 1)[:, 1])
    # [S, M, N] is the same as [S, L, H, N] with the heads flattened
    flat = eigenvalue_statistics(torch.from_numpy(mu.reshape(6, 6, 9)), d=d)
    assert flat["mean"] == pytest.approx(st["mean"], rel=1e-14)


def test_eigenvalue_statistics_counts_nonfinite_samples():
    mu = randn(5, 2, 3, 8, seed=8).abs()
    bad = mu.clone()
    bad[2, 1, 0] = math.nan  # one head of sample 2 failed (naive route)
    st = eigenvalue_statistics(bad, d=3)
    assert st["finite"].tolist() == [True, True, False, True, True]
    assert (st["n_finite"], st["n_nonfinite"]) == (4, 1)
    assert bool(torch.isnan(st["per_sample"]["max"][2]))
    ref = eigenvalue_statistics(mu[[0, 1, 3, 4]], d=3)
    assert st["mean"] == pytest.approx(ref["mean"], rel=1e-15)
    assert st["std"] == pytest.approx(ref["std"], rel=1e-15)
    one = eigenvalue_statistics(bad[1:3], d=3)  # one finite sample: mean defined, std undefined
    assert one["std"]["max"] is None and one["mean"]["max"] == pytest.approx(float(st["per_sample"]["max"][1]))
    none = eigenvalue_statistics(torch.full((2, 3, 8), math.nan, dtype=F64), d=3)
    assert none["n_finite"] == 0 and all(none["mean"][s] is None for s in STATISTICS)
    with pytest.raises(ValueError, match="d must"):
        eigenvalue_statistics(mu, d=9)
    with pytest.raises(ValueError, match="mu must"):
        eigenvalue_statistics(mu[0, 0, 0], d=3)


def test_route_comparison_measures_only():
    """route_comparison returns ratios (method §4.1); the [claim_e] rules of the thresholds file
    judge them in claims/claim_e.py, so no verdict flag comes back from checks/."""
    mu = randn(4, 3, 10, seed=9).abs() + 0.1
    base = eigenvalue_statistics(mu, d=5)
    same = route_comparison(base, base)
    assert same["ratio"] == {s: 1.0 for s in STATISTICS} and same["max_ratio"] == 1.0
    assert set(same) == {"ratio", "max_ratio", "nonfinite"}
    triple = route_comparison(base, eigenvalue_statistics(3 * mu, d=5))
    assert triple["max_ratio"] == pytest.approx(3.0)
    assert route_comparison(eigenvalue_statistics(3 * mu, d=5), base)["ratio"] == pytest.approx(triple["ratio"])
    assert route_comparison(base, eigenvalue_statistics(1.05 * mu, d=5))["max_ratio"] == pytest.approx(1.05)
    # a route with a non-finite sample is flagged; with no finite sample it differs by inf
    part = mu.clone()
    part[0, 0, 0] = math.nan
    flagged = route_comparison(base, eigenvalue_statistics(part, d=5))
    assert flagged["nonfinite"] and not same["nonfinite"]
    empty = route_comparison(base, eigenvalue_statistics(torch.full_like(mu, math.nan), d=5))
    assert empty["max_ratio"] == math.inf
    # sign handling: one zero statistic against a positive one is an infinite ratio
    zero = route_comparison(base, eigenvalue_statistics(torch.zeros_like(mu), d=5))
    assert zero["ratio"]["min"] == math.inf
    both_zero = eigenvalue_statistics(torch.zeros_like(mu), d=5)
    assert route_comparison(both_zero, both_zero)["ratio"]["max"] == 1.0


# --------------------------------------------------------------------------------------- γ constancy

def test_gamma_of_exact_eigenvectors_is_mu_over_n():
    k = randn(2, 24, 6, seed=10)
    kg = KeyGram(k)
    axes = kg.axes()
    gamma, valid = gamma_vectors(kg.centred, axes)
    assert bool(valid.all())
    expected = (kg.eigenvalues[..., :6] / 24).unsqueeze(-2).expand_as(gamma)
    torch.testing.assert_close(gamma, expected, rtol=1e-8, atol=0)
    assert float(pairwise_spread(gamma, valid).max()) <= 1e-8


def test_perturbed_control_is_not_constant_and_reproducible():
    k = randn(2, 24, 6, seed=11)
    kg = KeyGram(k)
    q = perturbed_axes(kg.axes(), seed=3)
    torch.testing.assert_close(q.transpose(-1, -2) @ q, torch.eye(6, dtype=F64).expand(2, 6, 6), rtol=0, atol=1e-13)
    assert torch.equal(q, perturbed_axes(kg.axes(), seed=3))
    assert not torch.allclose(q, perturbed_axes(kg.axes(), seed=4))
    gamma, valid = gamma_vectors(kg.centred, q)
    assert float(pairwise_spread(gamma, valid).min()) > 1e-3


def test_pairwise_spread_matches_double_loop_with_masks_zeros_and_ties():
    g = randn(2, 7, 3, seed=12)
    g[0, 2, 1] = 0.0
    g[1, 3, 0] = -g[1, 1, 0]          # equal magnitude, opposite sign
    g[1, :, 2] = 0.5                   # constant column with one zero
    g[1, 0, 2] = 0.0
    g[0, 4:, 2] = 0.0                  # several zeros: 0 vs 0 pairs count as 0
    valid = torch.rand(2, 7, 3, generator=torch.Generator().manual_seed(1)) > 0.25
    valid[0, :, 2] = True
    for relative in (True, False):
        got = pairwise_spread(g, valid, relative=relative)
        for b, m in itertools.product(range(2), range(3)):
            ref = brute_spread(g[b, :, m], valid[b, :, m], relative)
            assert float(got[b, m]) == pytest.approx(ref, rel=1e-13, abs=1e-15)
    assert float(pairwise_spread(torch.ones(5, 2, dtype=F64)).abs().max()) == 0.0
    few = torch.zeros(2, 5, 3, dtype=torch.bool)
    few[..., :2, :] = True
    few[1, 1, 2] = False
    with pytest.raises(ValueError, match=r"index \(1, 2\)"):
        pairwise_spread(g[:, :5], few)


def test_zero_axis_entries_are_masked_not_divided():
    kg = KeyGram(randn(16, 4, seed=13))
    axes = kg.axes().clone()
    axes[3, 0] = 0.0
    gamma, valid = gamma_vectors(kg.centred, axes)
    assert not bool(valid[3, 0]) and int((~valid).sum()) == 1
    assert bool(torch.isfinite(gamma).all()) and float(gamma[3, 0]) == 0.0
    spread = pairwise_spread(gamma, valid)
    assert float(spread[0]) == pytest.approx(brute_spread(gamma[:, 0], valid[:, 0], True), rel=1e-12)


def test_spread_scale_behaviour():
    k, v = randn(20, 5, seed=14), randn(20, 5, seed=15)
    kg = KeyGram(k)
    axes = recover_axes(v, kg.log_g)
    gamma, valid = gamma_vectors(kg.centred, axes)
    # γ is homogeneous of degree 0 in â: scaling v by 7.3 changes neither spread
    gamma73, valid73 = gamma_vectors(kg.centred, recover_axes(7.3 * v, kg.log_g))
    torch.testing.assert_close(gamma73, gamma, rtol=1e-12, atol=0)
    assert torch.equal(valid73, valid)
    # ...and so does dividing all g_j by one constant (what gamma_spread_batched does)
    shifted, _ = gamma_vectors(kg.centred, recover_axes(v, kg.log_g - 3.7))
    torch.testing.assert_close(shifted, gamma, rtol=1e-12, atol=0)
    # γ scales with K̃: the absolute spread scales, the relative one does not
    gamma_c, _ = gamma_vectors(7.3 * kg.centred, axes)
    torch.testing.assert_close(pairwise_spread(gamma_c, valid), pairwise_spread(gamma, valid), rtol=1e-12, atol=0)
    torch.testing.assert_close(pairwise_spread(gamma_c, valid, relative=False),
                               7.3 * pairwise_spread(gamma, valid, relative=False), rtol=1e-12, atol=0)


def test_recover_axes_inverts_kpca_values():
    kg = KeyGram(randn(3, 18, 5, seed=16))
    a = kg.axes()
    torch.testing.assert_close(recover_axes(kg.kpca_values(), kg.log_g), a - a.mean(-2, keepdim=True),
                               rtol=0, atol=1e-12)
    with pytest.raises(NonFiniteError):
        recover_axes(torch.ones(4, 2, dtype=F64), torch.full((4,), 800.0, dtype=F64))
    with pytest.raises(ValueError, match="log_g"):
        recover_axes(torch.ones(4, 2, dtype=F64), torch.zeros(3, dtype=F64))


@pytest.mark.parametrize("convention", ["p2", "kpca"])
def test_kpca_values_score_like_the_true_eigenvectors(convention):
    k = randn(3, 20, 6, seed=17)
    v_hat = KeyGram(k).kpca_values(convention)
    out = gamma_spread_batched(k, v_hat)
    assert float(out["learned"].max()) <= 1e-8 and float(out["eigen"].max()) <= 1e-8
    assert float(out["perturbed"].min()) > 1e-3
    assert out["summary"]["closer_to_eigen"].tolist() == [True, True, True]
    # random values are not eigenvectors
    random = gamma_spread_batched(k, randn(3, 20, 6, seed=18))
    assert float(random["learned"].min()) > 1e-3
    assert not bool(random["summary"]["closer_to_eigen"].any())


def test_gamma_spread_shapes_and_batched_equals_per_item():
    k, v = randn(2, 3, 14, 4, seed=19), randn(2, 3, 14, 4, seed=20)
    out = gamma_spread_batched(k, v, seed=5)
    for name in ("learned", "eigen", "perturbed", "learned_abs", "eigen_abs", "perturbed_abs"):
        assert out[name].shape == (2, 3, 4) and out[name].dtype == F64
        assert bool((out[name] >= 0).all())
    assert out["undetermined"].shape == (2, 3) and out["summary"]["closer_to_eigen"].shape == (2, 3)
    single = gamma_spread(k[1, 2], v[1, 2])
    assert set(single) == {"learned", "eigen", "perturbed"}
    torch.testing.assert_close(single["learned"], out["learned"][1, 2], rtol=1e-10, atol=1e-15)
    item = gamma_spread_batched(k[1, 2], v[1, 2])
    torch.testing.assert_close(item["learned_abs"], out["learned_abs"][1, 2], rtol=1e-10, atol=1e-20)
    assert float(item["eigen"].max()) <= 1e-8 and float(out["eigen"][1, 2].max()) <= 1e-8
    # the perturbed control of one item, rebuilt from the batch's own noise
    kg = KeyGram(k)
    q = perturbed_axes(kg.axes(), seed=5)[1, 2]
    gamma, valid = gamma_vectors(kg.centred[1, 2], q)
    torch.testing.assert_close(pairwise_spread(gamma, valid), out["perturbed"][1, 2], rtol=1e-10, atol=0)
    # standardised keys change the Gram matrix the values are judged against
    assert not torch.allclose(gamma_spread_batched(k, v, standardize=True)["learned"], out["learned"])
    with pytest.raises(ValueError, match="one head"):
        gamma_spread(k, v)
    with pytest.raises(ValueError, match="share leading dims"):
        gamma_spread_batched(k, v[..., :10, :])


def test_controls_skip_the_constant_null_vector_when_n_is_small():
    # N = 5 tokens, d_v = 8: only N − 1 = 4 non-trivial eigenvectors exist
    k, v = randn(5, 8, seed=21), randn(5, 8, seed=22)
    out = gamma_spread(k, v)
    assert out["learned"].shape == (8,) and out["eigen"].shape == (4,) and out["perturbed"].shape == (4,)
    assert float(out["eigen"].max()) <= 1e-8


def test_spread_summary_rule():
    spreads = {"learned": torch.tensor([[0.1, 0.3], [0.5, 0.7]], dtype=F64),
               "eigen": torch.zeros(2, 2, dtype=F64),
               "perturbed": torch.full((2, 2), 0.5, dtype=F64)}
    summary = spread_summary(spreads)
    torch.testing.assert_close(summary["learned"], torch.tensor([0.2, 0.6], dtype=F64))
    assert summary["closer_to_eigen"].tolist() == [True, False]


def test_perturbed_control_with_one_seed_per_item_does_not_depend_on_the_batching():
    """Per-item seeds: an item's perturbed basis alone equals the one inside a larger batch to
    round-off (the claim runs seed each (sample, head), so --max-memory and the device draw the
    same noise; the batched QR may round otherwise than one item's on another CPU)."""
    from checks.gamma import perturbed_axes

    gen = torch.Generator().manual_seed(0)
    axes = torch.linalg.qr(torch.randn(3, 2, 9, 4, generator=gen, dtype=torch.float64))[0]
    seeds = list(range(100, 106))
    whole = perturbed_axes(axes, seed=seeds)
    for i in range(3):
        for j in range(2):
            alone = perturbed_axes(axes[i, j], seed=[seeds[2 * i + j]])
            torch.testing.assert_close(whole[i, j], alone, **CROSS_PATH_UNIT)
    # the items' draws differ, by far more than that tolerance
    assert float((whole[0, 0] - perturbed_axes(axes[0, 0], seed=[seeds[1]])).abs().max()) > 1e-3
    with pytest.raises(ValueError, match="one seed per item"):
        perturbed_axes(axes, seed=[1, 2])
