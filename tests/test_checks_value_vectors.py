"""Claim-V math (method §2): the KPCA identity, the similarity metrics, the assignment, the null.

float64 known answers, independent routes and invariances; small shapes except one chance-level test.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from checks import cka, matrix_similarity, metric_suite, row_similarity, similarity_scaling
from checks.assignment import optimal_matching
from checks.gram import KeyGram, fix_signs, kpca_values
from checks.value_vectors import (
    DIRECTION_NAMES,
    METRIC_NAMES,
    direction_metrics,
    random_orthonormal,
    value_vector_metrics,
    value_vector_metrics_batched,
)
from claims.verdicts import allclose_tolerance
from tests._helpers import CROSS_PATH_UNIT, F64, gen, randn, rel_err

TOL = allclose_tolerance()  # [claim_v.allclose] of claims/thresholds.toml

SCALE_INVARIANT = ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka", "pearson",
                   "subspace_overlap")


def metric(name: str):
    """The similarity metric ``name``, from the module of its family."""
    for module in (row_similarity, cka, matrix_similarity):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"no similarity metric {name!r}")


def centring(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=F64) - torch.full((n, n), 1.0 / n, dtype=F64)


# ---------------------------------------------------------------- method §1: the exact identity

@pytest.mark.parametrize("convention", ["p2", "kpca"])
def test_attention_output_equals_kpca_projection(convention):
    n, d, nq = 12, 4, 7
    k, q = randn(n, d, seed=1), randn(nq, d, seed=2)
    gram = KeyGram(k)
    s = gram.scale
    lhs = torch.softmax(s * q @ k.T, dim=-1) @ gram.kpca_values(convention)  # attention with V := V̂

    # independent route: φ(x) = φ_k(x)/g(x), so φ(q_i)ᵀφ(k_j) = k(q_i,k_j)/(g(q_i) g(k_j)) (method §1)
    kq, kk = torch.exp(s * q @ k.T), torch.exp(s * k @ k.T)  # naive, fine at these magnitudes
    phi_dot = kq / (kq.sum(-1, keepdim=True) * kk.sum(-1).unsqueeze(0))
    phi_tilde_dot = phi_dot - phi_dot.mean(-1, keepdim=True)  # φ̃(k_j) = φ(k_j) − mean_m φ(k_m)
    axes = gram.axes()
    if convention == "kpca":
        axes = axes / gram.eigenvalues[:d].sqrt()
    rhs = phi_tilde_dot @ axes  # Σ_j a_jm φ(q_i)ᵀφ̃(k_j)
    assert rel_err(lhs, rhs) < 1e-12

    # and the axes really are the top-d eigenvectors of the naively built K̃ = H K_φ H
    k_phi = kk / (kk.sum(-1, keepdim=True) * kk.sum(-1).unsqueeze(0))
    h = centring(n)
    k_tilde = h @ k_phi @ h
    a = gram.axes()
    assert rel_err(k_tilde @ a, a * gram.eigenvalues[:d]) < 1e-10
    assert torch.allclose(a.T @ a, torch.eye(d, dtype=F64), atol=1e-12)


def test_log_space_gram_matches_naive_and_survives_overflow():
    k = randn(3, 9, 5, seed=3)
    gram = KeyGram(k)
    e = torch.exp(gram.scale * k @ k.transpose(-1, -2))
    g = e.sum(-1)
    naive = e / (g.unsqueeze(-1) * g.unsqueeze(-2))
    assert rel_err(gram.gram, naive) < 1e-13
    big = 40.0 * k  # S_ii ≈ 0.45·1600·5: exp overflows float64
    assert not bool(torch.isfinite(torch.exp(KeyGram(big).scores)).all())
    gb = KeyGram(big).gram
    assert bool(torch.isfinite(gb).all()) and float(gb.max()) <= 1.0 and float(gb.min()) >= 0.0


# ---------------------------------------------------------------- known answers

def test_v_equal_to_v_hat_scores_perfectly():
    k = randn(2, 3, 20, 5, seed=4)
    v_hat = KeyGram(k).kpca_values()
    r = value_vector_metrics_batched(k, v_hat.clone(), **TOL)
    for name in ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka", "pearson",
                 "subspace_overlap", "allclose"):
        assert torch.allclose(r[name], torch.ones(2, 3, dtype=F64), atol=1e-10), name
    assert float(r["relative_frobenius"].abs().max()) == 0.0
    assert not bool(r["undetermined"].any())
    assert bool((r["mu_d"] > r["threshold"]).all())
    names = (*METRIC_NAMES, *DIRECTION_NAMES)
    assert set(r) == {*names, *(f"{m}_null" for m in names), "undetermined", "mu_d",
                      "threshold", "effective_rows"}
    d = k.shape[-1]
    assert r["shared_directions"].tolist() == [[float(d)] * 3] * 2  # every direction shared
    assert torch.allclose(r["top_weighted_share"], torch.ones(2, 3, dtype=F64), atol=1e-10)


def test_null_with_the_true_axes_equals_the_metrics():
    """Given A₀ = A the null target is V̂ itself: its metrics equal V̂'s to round-off (the two
    targets are two items of one batched suite, whose kernels may round them differently on
    another CPU), while the default random A₀ moves them far beyond that tolerance."""
    k, v = randn(2, 15, 4, seed=5), randn(2, 15, 4, seed=6)
    r = value_vector_metrics_batched(k, v, null_axes=KeyGram(k).axes(), **TOL)
    for name in METRIC_NAMES:
        torch.testing.assert_close(r[f"{name}_null"], r[name], **CROSS_PATH_UNIT, msg=name)
    default = value_vector_metrics_batched(k, v, **TOL)
    assert float((default["linear_cka_null"] - r["linear_cka"]).abs().max()) > 1e-3


def test_kpca_convention_rescales_columns_by_inverse_root_eigenvalue():
    gram = KeyGram(randn(16, 4, seed=7))
    ratio = gram.kpca_values("kpca") / gram.kpca_values("p2")
    assert torch.allclose(ratio, gram.eigenvalues[:4].rsqrt().expand_as(ratio), rtol=1e-12)


def test_identical_keys_and_few_tokens_are_undetermined():
    same = randn(1, 6, seed=8).expand(10, 6).clone()  # K_φ constant, K̃ = 0
    r = value_vector_metrics_batched(same, randn(10, 6, seed=9), **TOL)
    assert bool(r["undetermined"])
    for n, d in ((4, 6), (6, 6)):  # N ≤ d: at most N − 1 non-zero eigenvalues
        k, v = randn(n, d, seed=10), randn(n, d, seed=11)
        r = value_vector_metrics_batched(k, v, **TOL)
        assert bool(r["undetermined"]), (n, d)
        assert all(bool(torch.isfinite(r[m])) for m in METRIC_NAMES)
        assert all(bool(torch.isfinite(r[f"{m}_null"])) for m in METRIC_NAMES)
    assert float(value_vector_metrics_batched(randn(4, 6, seed=10), randn(4, 6, seed=11), **TOL)["mu_d"]) == 0.0
    assert not bool(value_vector_metrics_batched(randn(30, 6, seed=12), randn(30, 6, seed=13), **TOL)[
        "undetermined"])


def test_independent_random_values_sit_at_the_null():
    n, d, heads = 197, 64, 8  # method §2: optimal cosine ≈ 0.32, overlap ≈ d/N ≈ 0.32 at chance
    k = randn(heads, n, d, seed=14, scale=0.3)  # moderate scores: eigenvectors spread over tokens
    v = randn(heads, n, d, seed=15)
    r = value_vector_metrics_batched(k, v, null_seed=16, **TOL)
    assert not bool(r["undetermined"].any())
    mean = {name: float(r[name].to(F64).mean()) for name in r if name != "undetermined"}
    assert 0.30 < mean["optimal_cosine"] < 0.34 and 0.30 < mean["optimal_cosine_null"] < 0.34
    assert abs(mean["subspace_overlap"] - d / n) < 0.01
    assert abs(mean["subspace_overlap_null"] - d / n) < 0.01
    for name, tol in (("direct_cosine", 0.02), ("pearson", 0.02), ("optimal_cosine", 0.01),
                      ("linear_cka", 0.02), ("kernel_cka", 0.02), ("relative_frobenius", 1e-4),
                      ("allclose", 0.0)):
        assert abs(mean[name] - mean[f"{name}_null"]) <= tol, name
    assert abs(mean["direct_cosine"]) < 0.02 and mean["allclose"] == 0.0
    assert abs(mean["relative_frobenius"] - 1.0) < 1e-4  # V̂ carries 1/g_j: tiny beside V


# ---------------------------------------------------------------- similarity metrics

def test_linear_cka_feature_form_equals_gram_form():
    x, y = randn(3, 11, 4, seed=17), randn(3, 11, 6, seed=18)[..., :4] + 0.5 * randn(3, 11, 4, seed=17)
    h = centring(11)
    hkx = h @ (x @ x.transpose(-1, -2)) @ h
    hky = h @ (y @ y.transpose(-1, -2)) @ h
    ref = (hkx * hky).sum((-2, -1)) / (hkx.norm(dim=(-2, -1)) * hky.norm(dim=(-2, -1)))
    assert rel_err(cka.linear_cka(x, y), ref) < 1e-12


def test_kernel_cka_matches_independent_route():
    x, y = randn(2, 9, 3, seed=19), randn(2, 9, 3, seed=20)
    h = centring(9)

    def rbf(a):
        d2 = torch.cdist(a, a) ** 2
        d2 = d2 * (1 - torch.eye(9, dtype=F64))
        iu = torch.triu_indices(9, 9, 1)
        vals = sorted(d2[iu[0], iu[1]].tolist())
        sigma2 = vals[(len(vals) - 1) // 2]  # lower middle value
        return h @ torch.exp(-d2 / (2 * sigma2)) @ h

    for b in range(2):
        kx, ky = rbf(x[b]), rbf(y[b])
        ref = (kx * ky).sum() / (kx.norm() * ky.norm())
        assert abs(float(cka.kernel_cka(x, y)[b]) - float(ref)) < 1e-12


def test_median_bandwidth_is_the_lower_middle_value():
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0]], dtype=F64)  # pair distances² 1,4,9,16,36,49
    assert float(cka.median_bandwidth(x)) == 9.0
    d2 = cka.squared_distances(x)
    assert float(d2[0, 3]) == 49.0 and torch.equal(d2.diagonal(), torch.zeros(4, dtype=F64))
    y = torch.tensor([[0.0], [2.0], [1.0], [5.0]], dtype=F64)
    h = centring(4)

    def cka_with(sx):
        kx = h @ torch.exp(-d2 / (2 * sx)) @ h
        ky = h @ torch.exp(-cka.squared_distances(y) / (2 * float(cka.median_bandwidth(y)))) @ h
        return float((kx * ky).sum() / (kx.norm() * ky.norm()))

    got = float(cka.kernel_cka(x, y))
    assert abs(got - cka_with(9.0)) < 1e-14
    assert abs(got - cka_with(12.5)) > 1e-4  # the mean of the middle values gives another answer


def test_median_bandwidth_is_torch_median_to_the_bit_batched_with_ties_and_non_finite():
    """The CPU's selection (NumPy) returns torch.median's element: random, tied and zero
    distances, every batch shape; a non-finite distance takes torch's path (NaN stays NaN)."""
    g = torch.Generator().manual_seed(3)
    for n in (2, 3, 4, 17, 64):
        x = torch.randn(2, 3, n, 5, generator=g, dtype=F64)
        x[0, 1] = x[0, 1].round()  # tied distances
        x[1, 2] = 0.0  # every distance 0
        d2 = cka.squared_distances(x)
        iu = torch.triu_indices(n, n, offset=1)
        expected = d2[..., iu[0], iu[1]].median(dim=-1).values
        assert torch.equal(cka._median_pair_distance(d2), expected)
        d32 = d2.to(torch.float32)
        assert torch.equal(cka._median_pair_distance(d32),
                           d32[..., iu[0], iu[1]].median(dim=-1).values)
    d2[0, 0, 0, 1] = d2[0, 0, 1, 0] = float("nan")
    assert torch.isnan(cka._median_pair_distance(d2)[0, 0])
    # a distance matrix that carries a gradient keeps it (torch's path)
    x = torch.randn(3, 9, 4, generator=g, dtype=F64, requires_grad=True)
    sigma2 = cka._median_pair_distance(cka.squared_distances(x))
    assert sigma2.requires_grad and sigma2.grad_fn is not None


def test_squared_distances_exact_zero_diagonal_and_agree_with_cdist():
    x = randn(2, 30, 8, seed=21, scale=1e3) + 1e4
    d2 = cka.squared_distances(x)
    assert torch.equal(d2.diagonal(dim1=-2, dim2=-1), torch.zeros(2, 30, dtype=F64))
    assert bool((d2 >= 0).all())
    assert rel_err(d2, torch.cdist(x, x) ** 2) < 1e-9


def test_cka_invariances():
    x, y = randn(2, 14, 5, seed=22), randn(2, 14, 5, seed=23)
    q1 = random_orthonormal(5, 5, seed=1, batch_shape=(2,))
    q2 = random_orthonormal(5, 5, seed=2, batch_shape=(2,))
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0], dtype=F64)
    lin, ker = cka.linear_cka(x, y), cka.kernel_cka(x, y)
    for xx, yy in ((3.7 * x @ q1, y), (x, y * signs), (x @ q1, 0.02 * y @ q2), (x + 5.0, y)):
        assert torch.allclose(cka.linear_cka(xx, yy), lin, rtol=0, atol=1e-12)
    for xx, yy in ((3.7 * x @ q1, y), (x @ q1, 0.02 * y @ q2), (x * signs, y)):
        assert torch.allclose(cka.kernel_cka(xx, yy), ker, rtol=0, atol=1e-12)
    stretch = torch.tensor([1.0, 10.0, 1.0, 1.0, 0.1], dtype=F64)  # not an isotropic map
    assert float((cka.linear_cka(x * stretch, y) - lin).abs().min()) > 1e-3
    assert float((cka.kernel_cka(x * stretch, y) - ker).abs().min()) > 1e-3


def test_scale_invariant_metrics_survive_tiny_and_huge_scales():
    x, y = randn(2, 12, 4, seed=24), randn(2, 12, 4, seed=25)
    for name in SCALE_INVARIANT:
        fn = metric(name)
        base = fn(x, y)
        for c in (1e-170, 1e170):  # V̂ carries 1/g_j, which can be this small
            assert torch.allclose(fn(x, c * y), base, rtol=0, atol=1e-12), (name, c)
            assert torch.allclose(fn(c * x, y), base, rtol=0, atol=1e-12), (name, c)
    assert torch.allclose(matrix_similarity.relative_frobenius(1e200 * x, 1e200 * y), matrix_similarity.relative_frobenius(x, y),
                          rtol=1e-14, atol=0)


def test_direct_optimal_cosine_and_pearson_hand_cases():
    x = randn(3, 10, 6, seed=26)
    perm = torch.tensor([3, 0, 1, 2, 9, 8, 7, 6, 5, 4])
    y = 2.0 * x[..., perm, :]
    assert torch.allclose(row_similarity.optimal_cosine(x, y), torch.ones(3, dtype=F64), atol=1e-14)
    assert bool((row_similarity.direct_cosine(x, y) < 0.9).all())
    other = randn(3, 10, 6, seed=27)
    assert bool((row_similarity.optimal_cosine(x, other) >= row_similarity.direct_cosine(x, other) - 1e-15).all())
    # cos of (1,0) with (1,1) and of (0,1) with (−1,0): mean of √½ and 0
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    b = torch.tensor([[1.0, 1.0], [-1.0, 0.0]], dtype=F64)
    assert abs(float(row_similarity.direct_cosine(a, b)) - 0.5 * math.sqrt(0.5)) < 1e-15
    # Pearson is centred per token: an offset and a positive scale per token leave it at 1
    assert torch.allclose(row_similarity.pearson(x, 3.0 * x + torch.arange(10.0, dtype=F64)[:, None]),
                          torch.ones(3, dtype=F64), atol=1e-14)
    assert torch.allclose(row_similarity.pearson(x, -x), -torch.ones(3, dtype=F64), atol=1e-14)


def test_allclose_and_relative_frobenius():
    y = randn(2, 5, 3, seed=28)
    assert bool(matrix_similarity.allclose(y + 0.9e-3 * y.abs(), y, **TOL).all())
    bumped = y.clone()
    bumped[1, 2, 1] += 1e-5 + 2e-3 * abs(float(y[1, 2, 1]))
    assert matrix_similarity.allclose(bumped, y, **TOL).tolist() == [True, False]
    x = randn(2, 5, 3, seed=29)
    ref = (x - y).flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1)
    assert torch.allclose(matrix_similarity.relative_frobenius(x, y), ref, rtol=1e-14, atol=0)


def test_subspace_overlap_known_answers_and_invariance():
    theta = 0.3
    # two centred unit directions of R^3 (orthogonal to the all-ones vector) at angle theta
    e1 = torch.tensor([[1.0], [-1.0], [0.0]], dtype=F64) / math.sqrt(2)
    e2 = torch.tensor([[1.0], [1.0], [-2.0]], dtype=F64) / math.sqrt(6)
    u = math.cos(theta) * e1 + math.sin(theta) * e2
    assert abs(float(matrix_similarity.subspace_overlap(e1, u)) - math.cos(theta) ** 2) < 1e-15
    # the all-ones direction does not count: a constant row added to either side changes nothing
    assert abs(float(matrix_similarity.subspace_overlap(e1 + 4.0, u - 1.5)) - math.cos(theta) ** 2) < 1e-14
    x, y = randn(2, 20, 4, seed=30), randn(2, 20, 4, seed=31)
    m = randn(2, 4, 4, seed=32) + 3 * torch.eye(4, dtype=F64)  # invertible
    c = randn(2, 1, 4, seed=35)  # a value bias 1c^T (method §2.4)
    assert torch.allclose(matrix_similarity.subspace_overlap(x @ m, y), matrix_similarity.subspace_overlap(x, y), atol=1e-12)
    assert torch.allclose(matrix_similarity.subspace_overlap(x @ m + c, y), matrix_similarity.subspace_overlap(x, y), atol=1e-12)
    assert torch.allclose(matrix_similarity.subspace_overlap(x, x @ m + c), torch.ones(2, dtype=F64), atol=1e-12)
    # rank deficiency: x spans 2 directions with 3 columns; the mean runs over max(rank) = 2 or 3
    basis = randn(20, 3, seed=33)
    deficient = torch.stack([basis[:, 0], basis[:, 1], basis[:, 0] + basis[:, 1]], dim=1)
    assert abs(float(matrix_similarity.subspace_overlap(deficient, deficient[:, [1, 0, 2]])) - 1.0) < 1e-12
    assert abs(float(matrix_similarity.subspace_overlap(deficient, basis)) - 2.0 / 3.0) < 1e-12


def test_zero_rows_and_zero_matrices_give_numbers_not_nan():
    y = randn(2, 8, 4, seed=34)
    x = y.clone()
    x[:, 0] = 0.0  # a zero token row
    assert torch.allclose(row_similarity.direct_cosine(x, y), torch.full((2,), 7 / 8, dtype=F64), atol=1e-14)
    assert torch.allclose(row_similarity.pearson(x, y), torch.full((2,), 7 / 8, dtype=F64), atol=1e-14)
    x[:, 1] = 2.5  # a zero-variance token row
    assert torch.allclose(row_similarity.pearson(x, y), torch.full((2,), 6 / 8, dtype=F64), atol=1e-14)
    zero = torch.zeros_like(y)
    for name in METRIC_NAMES:
        for a, b in ((zero, y), (y, zero), (zero, zero), (x, y)):
            out = metric(name)(a, b, **(TOL if name == "allclose" else {}))
            assert not bool(torch.isnan(out.to(F64)).any()), name
    for name in ("linear_cka", "kernel_cka", "subspace_overlap", "direct_cosine", "pearson",
                 "optimal_cosine"):
        assert float(metric(name)(zero, y).abs().max()) == 0.0, name
    assert float(matrix_similarity.relative_frobenius(zero, zero).max()) == 0.0
    assert bool(torch.isinf(matrix_similarity.relative_frobenius(zero, y)).all())  # documented: undefined ratio


# ---------------------------------------------------------------- assignment

@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_optimal_matching_matches_brute_force(n):
    c = randn(3, 2, n, n, seed=40 + n)
    perm = optimal_matching(c)
    assert perm.shape == (3, 2, n) and perm.dtype == torch.long
    for idx in itertools.product(range(3), range(2)):
        p = perm[idx].tolist()
        assert sorted(p) == list(range(n))
        best = max(sum(float(c[idx][j, s[j]]) for j in range(n))
                   for s in itertools.permutations(range(n)))
        assert abs(sum(float(c[idx][j, p[j]]) for j in range(n)) - best) < 1e-12


def test_optimal_matching_rejects_bad_input():
    with pytest.raises(ValueError, match="square"):
        optimal_matching(torch.zeros(3, 4, dtype=F64))
    with pytest.raises(ValueError, match="NaN"):
        optimal_matching(torch.full((2, 2), float("nan"), dtype=F64))
    assert optimal_matching(torch.zeros(0, 3, 3)).shape == (0, 3)


# ---------------------------------------------------------------- determinism and batching

def test_random_orthonormal_is_deterministic_orthonormal_and_sign_fixed():
    a = random_orthonormal(9, 4, seed=5, batch_shape=(2, 3))
    assert a.shape == (2, 3, 9, 4) and a.dtype == F64
    assert torch.equal(a, random_orthonormal(9, 4, seed=5, batch_shape=(2, 3)))
    assert not torch.equal(a, random_orthonormal(9, 4, seed=6, batch_shape=(2, 3)))
    assert torch.allclose(a.transpose(-1, -2) @ a, torch.eye(4, dtype=F64).expand(2, 3, 4, 4),
                          atol=1e-14)
    assert torch.equal(fix_signs(a), a)
    assert torch.equal(random_orthonormal(9, 4, seed=5, dtype=torch.float32),
                       random_orthonormal(9, 4, seed=5).float())
    with pytest.raises(ValueError, match="m <= n"):
        random_orthonormal(3, 4, seed=0)


def test_repeated_and_permuted_batches_give_the_same_signs_and_metrics():
    k, v = randn(5, 14, 4, seed=50), randn(5, 14, 4, seed=51)
    a0 = random_orthonormal(14, 4, seed=52, batch_shape=(5,))
    g1, g2 = KeyGram(k), KeyGram(k)
    assert torch.equal(g1.eigenvectors, g2.eigenvectors)
    r1 = value_vector_metrics_batched(k, v, null_axes=a0, **TOL)
    r2 = value_vector_metrics_batched(k, v, null_axes=a0, **TOL)
    assert all(torch.equal(r1[name], r2[name]) for name in r1)
    perm = torch.tensor([3, 0, 4, 1, 2])
    gp = KeyGram(k[perm])
    assert torch.allclose(gp.axes(), g1.axes()[perm], rtol=0, atol=1e-12)
    rp = value_vector_metrics_batched(k[perm], v[perm], null_axes=a0[perm], **TOL)
    for name in r1:
        assert torch.allclose(rp[name].to(F64), r1[name][perm].to(F64), rtol=0, atol=1e-12), name


def test_batched_equals_per_item_and_single_head_entry_point():
    k, v = randn(2, 3, 12, 4, seed=60), randn(2, 3, 12, 4, seed=61)
    a0 = random_orthonormal(12, 4, seed=62, batch_shape=(2, 3))
    r = value_vector_metrics_batched(k, v, null_axes=a0, **TOL)
    for i, j in itertools.product(range(2), range(3)):
        one = value_vector_metrics_batched(k[i, j], v[i, j], null_axes=a0[i, j], **TOL)
        for name in r:
            assert torch.allclose(one[name].to(F64), r[name][i, j].to(F64), rtol=0, atol=1e-12), name
    q = randn(12, 4, seed=63)
    single = value_vector_metrics(q, k[0, 0], v[0, 0], seed=7, **TOL)
    assert set(single) == {*METRIC_NAMES, *(f"{m}_null" for m in METRIC_NAMES)}
    assert all(type(val) is float for val in single.values())
    ref = value_vector_metrics_batched(k[0, 0], v[0, 0], null_seed=7, **TOL)
    assert all(single[name] == float(ref[name]) for name in single)
    assert single["allclose"] in (0.0, 1.0)


def test_shape_errors_name_the_argument():
    k, v = randn(10, 4, seed=70), randn(10, 4, seed=71)
    with pytest.raises(ValueError, match="head dimension"):
        value_vector_metrics(randn(10, 5, seed=72), k, v, **TOL)
    with pytest.raises(ValueError, match="v must have the shape of k"):
        value_vector_metrics(k, k, v[:9], **TOL)
    with pytest.raises(ValueError, match="2-D"):
        value_vector_metrics(k, k[None], v[None], **TOL)
    with pytest.raises(ValueError, match="same shape"):
        value_vector_metrics_batched(k, v[:, :3], **TOL)
    with pytest.raises(ValueError, match="null_axes"):
        value_vector_metrics_batched(k, v, null_axes=torch.zeros(10, 3, dtype=F64), **TOL)
    with pytest.raises(ValueError, match="convention"):
        value_vector_metrics_batched(k, v, convention="unit", **TOL)
    with pytest.raises(ValueError, match="same shape"):
        cka.linear_cka(k, v[:5])


# ------------------------------------------------------------------------------ the fused suite
def test_metric_suite_equals_each_metric_function_per_target():
    """metric_suite shares the learned side between targets; every number must equal the
    stand-alone metric of (x, ys[t]), including a target with tiny rows and a rank-deficient one."""
    x = torch.randn(3, 2, 40, 8, generator=gen(7), dtype=F64)
    y0 = torch.randn(3, 2, 40, 8, generator=gen(8), dtype=F64) * 1e-200
    y1 = torch.randn(3, 2, 40, 8, generator=gen(9), dtype=F64)
    y1[..., 5:] = y1[..., :3] @ torch.randn(3, 3, generator=gen(10), dtype=F64)  # rank 5 of 8
    ys = torch.stack([y0, y1])
    metrics, cos = metric_suite.metric_suite(x, ys, **TOL)
    assert set(metrics) == set(metric_suite.SUITE_NAMES)
    for t in range(2):
        for name in metric_suite.SUITE_NAMES:
            expected = metric(name)(x, ys[t], **(TOL if name == "allclose" else {}))
            got = metrics[name][t]
            if name == "allclose":
                assert torch.equal(got, expected)
            else:
                torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(cos[t], row_similarity.cosine_matrix(x, ys[t]), rtol=0, atol=1e-14)
        torch.testing.assert_close(row_similarity.matched_cosine(cos[t]), row_similarity.optimal_cosine(x, ys[t]),
                                   rtol=0, atol=1e-14)


def test_permuted_operands_give_the_metrics_of_the_token_shuffled_target():
    """The null ΠV̂'s metrics from V̂'s operands with the tokens permuted equal the suite run on
    ΠV̂ itself (round-off apart: token sums run in another order), for every metric, a
    rank-deficient target included; the entrywise and per-row ones bit for bit."""
    from checks.nulls import shuffled_token_null

    x = torch.randn(3, 2, 41, 8, generator=gen(11), dtype=F64)
    y = torch.randn(3, 2, 41, 8, generator=gen(12), dtype=F64) * 3.0
    y[1, 0, :, 5:] = y[1, 0, :, :3] @ torch.randn(3, 3, generator=gen(13), dtype=F64)  # rank 5
    g = gen(14)
    perm = torch.stack([torch.stack([torch.randperm(41, generator=g) for _ in range(2)])
                        for _ in range(3)])
    want, _ = metric_suite.metric_suite(x, shuffled_token_null(y, perm).unsqueeze(0), **TOL)
    ox = metric_suite.leading(metric_suite.operands(x))
    got = metric_suite.pair_metrics(
        ox, metric_suite.leading(metric_suite.permuted(metric_suite.operands(y), perm)), **TOL)
    for name in metric_suite.SUITE_NAMES:
        if name in ("allclose", "relative_frobenius", "direct_cosine", "pearson"):
            assert torch.equal(got[name], want[name]), name
        else:
            torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-13)
    # and it is a null: not the metric of the unshuffled target
    same, _ = metric_suite.metric_suite(x, y.unsqueeze(0), **TOL)
    assert not torch.allclose(same["kernel_cka"], got["kernel_cka"])


def test_metric_suite_rejects_unstacked_targets():
    x = torch.randn(4, 40, 8, dtype=F64)
    with pytest.raises(ValueError, match=r"\[T, \.\.\., N, d\]"):
        metric_suite.metric_suite(x, x, **TOL)


def test_tall_rank_deficient_basis_matches_the_svd_rule():
    """N ≥ 2d takes QR + singular values of R; a rank-deficient item must fall back to the SVD
    basis so the overlap divides by the numerical rank (here 3 of 6)."""
    a = torch.randn(2, 30, 3, generator=gen(11), dtype=F64)
    full = torch.randn(2, 30, 6, generator=gen(12), dtype=F64)
    deficient = torch.cat([a, a @ torch.randn(3, 3, generator=gen(13), dtype=F64)], dim=-1)
    x = torch.stack([full[0], deficient[0]])
    q, rank = matrix_similarity.orthonormal_column_basis(similarity_scaling.peak_one(x))
    assert rank.tolist() == [6, 3]
    # Q spans the same space as the SVD's leading left singular vectors
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    for i, r in enumerate(rank.tolist()):
        proj_q = q[i] @ q[i].T
        proj_u = u[i, :, :r] @ u[i, :, :r].T
        torch.testing.assert_close(proj_q, proj_u, rtol=0, atol=1e-10)
    # the overlap of the deficient matrix with the space of its first 3 columns is exactly 1
    assert float(matrix_similarity.subspace_overlap(deficient[0], a[0].expand(30, 3).repeat(1, 2))) == \
        pytest.approx(1.0, abs=1e-12)


def test_certified_rank_agrees_with_the_singular_values_of_r():
    """The tall path certifies full rank from R without an SVD where it can; on a mix of
    well-conditioned, graded, nearly deficient (σ_min/σ_max 1.4e-14, just above the rule's
    max(N, d)·ε = 8.9e-15: decided by R's singular values) and deficient items its ranks are
    those of NumPy's matrix_rank rule on R's singular values."""
    g = gen(31)
    base = torch.randn(7, 40, 6, generator=g, dtype=F64)
    scales = torch.tensor([1.0, 1e-3, 1e-8, 1e-13, 3e-14, 1e-15, 0.0], dtype=F64)
    x = base.clone()
    x[:, :, -1] = base[:, :, 0] + scales[:, None] * base[:, :, -1]  # last column: near copy
    xs = similarity_scaling.peak_one(x)
    q, rank = matrix_similarity.orthonormal_column_basis(xs)
    s = torch.linalg.svdvals(torch.linalg.qr(xs).R)
    want = (s > 40 * torch.finfo(F64).eps * s[..., :1]).sum(-1)
    assert rank.tolist() == want.tolist() == [6, 6, 6, 6, 6, 5, 5]


@pytest.mark.parametrize("null", ["token-shuffled", "random-basis"])
@pytest.mark.parametrize("n", [40, 12])  # N ≥ 2d: one QR for basis and directions; N < 2d: SVD
def test_suite_direction_metrics_equal_their_own_route_to_the_bit(null, n):
    """The direction metrics come from the metric suite's bases (one QR of V̂ for its column
    basis and its nested directions); :func:`direction_metrics` factorises each matrix itself.
    Same operations on the same inputs: the same bits, with and without the round-off twin."""
    k = torch.randn(2, 3, n, 8, generator=gen(32), dtype=F64)
    v = torch.randn(2, 3, n, 8, generator=gen(33), dtype=F64)
    v[0, 0, :, 1] = v[0, 0, :, 0]  # a rank-deficient V
    perm = torch.stack([torch.randperm(n, generator=gen(34 + i)) for i in range(6)]).reshape(2, 3, n)
    kw = {"null_perm": perm} if null == "token-shuffled" else {"null_seed": 5}
    out = value_vector_metrics_batched(k, v, directions=True, round_off=True, **kw, **TOL)
    gram = KeyGram(k, top=8)
    v_hat = gram.kpca_values()
    other = {"null_perm": perm} if null == "token-shuffled" else {
        "v_null": kpca_values(random_orthonormal(n, 8, 5, (2, 3)), gram.log_g)}
    alone = direction_metrics(v, v_hat, gram.eigenvalues, **other)
    assert set(alone) == {f"{m}{s}" for m in DIRECTION_NAMES for s in ("", "_null")}
    for name, value in alone.items():
        assert torch.equal(out[name], value), name
        assert f"twin_{name}" in out


def test_deferred_matching_gives_the_same_metrics():
    k = torch.randn(2, 3, 30, 8, generator=gen(14), dtype=F64)
    v = torch.randn(2, 3, 30, 8, generator=gen(15), dtype=F64)
    now = value_vector_metrics_batched(k, v, null_seed=3, **TOL)
    later = value_vector_metrics_batched(k, v, null_seed=3, defer_matching=True, **TOL)
    assert "optimal_cosine" not in later and later["cosine_matrices"].shape == (2, 2, 3, 30, 30)
    optimal = row_similarity.matched_cosine(later.pop("cosine_matrices"))
    later["optimal_cosine"], later["optimal_cosine_null"] = optimal[0], optimal[1]
    assert set(now) == set(later)
    for name in now:
        assert torch.equal(now[name], later[name]), name


def test_keygram_top_d_equals_the_full_decomposition():
    """KeyGram(top=d) (claim V's route) keeps the first d pairs of the full spectrum exactly; the
    subspace-iteration route agrees to 1e-8 (eigenvalues) and 1e-6 (subspaces)."""
    k = torch.randn(3, 120, 16, generator=gen(16), dtype=F64) * 0.7
    full = KeyGram(k)
    top = KeyGram(k, top=16)
    assert top.eigenvalues.shape == (3, 16) and top.eigenvectors.shape == (3, 120, 16)
    assert torch.equal(top.eigenvalues, full.eigenvalues[..., :16])
    assert torch.equal(top.eigenvectors, full.eigenvectors[..., :16])
    assert torch.equal(top.undetermined, full.undetermined)
    torch.testing.assert_close(top.threshold, full.threshold, rtol=1e-10, atol=0)
    it = KeyGram(k, top=16, eigen_method="subspace")
    torch.testing.assert_close(it.eigenvalues, full.eigenvalues[..., :16], rtol=1e-8, atol=0)
    gap = it.eigenvectors @ it.eigenvectors.mT - full.axes(16) @ full.axes(16).mT
    assert float(torch.linalg.matrix_norm(gap, ord=2).max()) < 1e-6
    with pytest.raises(ValueError, match="only the top 16 eigenvectors"):
        top.axes(20)
    with pytest.raises(ValueError, match="top must be a positive int"):
        KeyGram(k, top=0)


def test_spectral_norm_matches_eigvalsh_even_with_a_close_second_eigenvalue():
    from checks.gram import psd_spectral_norm

    k = torch.randn(4, 60, 8, generator=gen(17), dtype=F64)
    g = KeyGram(k).gram
    torch.testing.assert_close(psd_spectral_norm(g), torch.linalg.eigvalsh(g)[..., -1],
                               rtol=1e-12, atol=0)
    # λ₂/λ₁ = 0.995, where 50 power steps would still be off by ~1e-5
    q = torch.linalg.qr(torch.randn(80, 80, generator=gen(18), dtype=F64)).Q
    mu = torch.cat([torch.tensor([1.0, 0.995], dtype=F64), torch.linspace(0.9, 0.0, 78, dtype=F64)])
    mat = (q * mu) @ q.T
    assert float(psd_spectral_norm(mat)) == pytest.approx(1.0, rel=1e-9)


def test_long_heads_take_the_top_k_solver_and_give_the_same_metrics(monkeypatch):
    """Above checks.topk.AUTO_CROSSOVER_N tokens KeyGram(top=d) uses subspace iteration instead
    of the full eigh (long sequences); claim V's numbers agree with the full route. The
    crossover is lowered here so that the test stays small."""
    from checks import topk

    k = torch.randn(2, 150, 16, generator=gen(19), dtype=F64) * 0.6
    v = torch.randn(2, 150, 16, generator=gen(20), dtype=F64)
    full = value_vector_metrics_batched(k, v, null_seed=5, **TOL)
    calls = []
    original = topk.subspace_iteration
    monkeypatch.setattr(topk, "subspace_iteration",
                        lambda *a, **kw: calls.append(a[0].shape) or original(*a, **kw))
    monkeypatch.setattr(topk, "AUTO_CROSSOVER_N", 64)
    iterative = value_vector_metrics_batched(k, v, null_seed=5, **TOL)
    assert calls == [(2, 150, 150)]
    for name, value in full.items():
        if value.dtype == torch.bool:
            assert torch.equal(value, iterative[name]), name
        else:
            torch.testing.assert_close(iterative[name], value, rtol=1e-6, atol=1e-9, msg=name)


def test_session_computes_the_p2_code_variant_on_its_seeded_subset_only(tmp_path, monkeypatch):
    """Method §8.3: with a subset smaller than the samples, the p2-code metrics are NaN ("not
    computed") outside it and finite inside it; every judged metric and null is still computed
    on every sample, unchanged. (Inside the subset the p2-code values are not compared with the
    all-samples run: P2's convention keeps the float32 eigensolver's signs, which follow the
    batch, method §8.3.)"""
    import checks.p2_code
    from fixtures.cache import Cache
    from fixtures.models.catalogue import REGISTRY
    from fixtures.engine.model_run import ModelRun
    from fixtures.engine.run_options import RunOptions

    spec = REGISTRY["control-vit_tiny_patch16_224"]
    layers = {}
    for size in (4, 2):
        monkeypatch.setattr(checks.p2_code, "P2_CODE_SAMPLES", size)
        opts = RunOptions(n_samples=4, seed=0, cache_dir=str(tmp_path / f"cache{size}"))
        layers[size] = ModelRun(spec, opts, Cache(opts.cache_dir)).compute_layer("V", 0)
    chosen = checks.p2_code.p2_code_subset(4, spec.key, size=2)
    assert int(chosen.sum()) == 2
    for name, full in layers[4].items():
        part = layers[2][name]
        if name.startswith("p2code_"):
            assert part[~chosen].isnan().all() and torch.isfinite(part[chosen]).all()
            assert torch.isfinite(full).all()
        else:
            assert torch.equal(part, full), name
