"""γ constancy for a subspace (method §4.2): the residual ρ, the direction-wise overlap ω and the
token-shuffled chance level, on cases with known answers."""

from __future__ import annotations

import math

import torch

from checks.gamma import gamma_spread_batched, recover_axes
from checks.gram import KeyGram
from checks.invariant_subspace import bias_direction, invariance_overlap, invariant_subspace_residual
from checks.nulls import shuffled_token_null, token_permutations
from claims import claim_e, claim_e_layer, verdicts

F64 = torch.float64


def _orthonormal(n: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=F64))
    return q


def test_a_hand_computed_case():
    """K = diag(2, 1), span{(1, 1)}: K·a = (2, 1), so cos² of the angle is 9/10 = ω and
    ρ² = 1 − ω (one dimension: ρ is the sine of that angle)."""
    k = torch.diag(torch.tensor([2.0, 1.0], dtype=F64))
    a = torch.tensor([[1.0], [1.0]], dtype=F64)
    assert math.isclose(float(invariance_overlap(k, a)), 0.9, rel_tol=1e-12)
    assert math.isclose(float(invariant_subspace_residual(k, a)), math.sqrt(0.1), rel_tol=1e-12)


def test_an_exactly_invariant_span_of_a_full_rank_gram_is_far_from_its_null():
    """Any basis of d eigenvectors of a full-rank K (mixed, scaled, signs flipped): ρ = 0 and
    ω = 1; a random span of the same dimension on the same K is far from both."""
    gen = torch.Generator().manual_seed(0)
    n, d = 40, 6
    u = _orthonormal(n, gen)
    k = u @ torch.diag(10.0 ** torch.linspace(2.0, -2.0, n, dtype=F64)) @ u.T
    m = torch.randn(d, d, generator=gen, dtype=F64) * torch.tensor([1.0, -3.0, 1e3, 1, 1, 1],
                                                                   dtype=F64)
    span = u[:, [0, 3, 7, 11, 20, 39]] @ m
    assert float(invariant_subspace_residual(k, span)) < 1e-12
    assert abs(float(invariance_overlap(k, span)) - 1.0) < 1e-12
    random = torch.randn(n, d, generator=gen, dtype=F64)
    assert float(invariant_subspace_residual(k, random)) > 0.3
    assert float(invariance_overlap(k, random)) < 0.8


def test_a_span_holding_the_dominant_pair_of_a_rank_2_dominated_gram():
    """K = 10⁴·(u₁u₁ᵀ + u₂u₂ᵀ) plus a spread-out rest: a span holding u₁, u₂ and random
    directions besides is nearly invariant by ρ (the pair carries ‖K‖_F) but not direction by
    direction: ω counts the random directions."""
    gen = torch.Generator().manual_seed(1)
    n, d = 60, 16
    u = _orthonormal(n, gen)
    mu = torch.cat([torch.tensor([1e4, 1e4], dtype=F64), torch.linspace(5.0, 0.1, n - 2,
                                                                          dtype=F64)])
    k = u @ torch.diag(mu) @ u.T
    span = torch.cat([u[:, :2], torch.randn(n, d - 2, generator=gen, dtype=F64)], dim=1)
    rho, omega = float(invariant_subspace_residual(k, span)), float(invariance_overlap(k, span))
    eigen = u[:, :d]
    perturbed, _ = torch.linalg.qr(eigen + 0.1 * torch.randn(n, d, generator=gen, dtype=F64))
    rho_p, omega_p = (float(invariant_subspace_residual(k, perturbed)),
                      float(invariance_overlap(k, perturbed)))
    assert rho < 0.01 and rho / rho_p < 0.35       # ρ's position: "supported"
    assert (1 - omega) / (1 - omega_p) > 1.0        # ω's position: far past its bar of 0.1


def _head(k: torch.Tensor, v: torch.Tensor, seed: int = 0) -> dict:
    """The γ record of one head from keys k and values v [S, N, d]."""
    kk, vv = k.unsqueeze(1), v.unsqueeze(1)
    g = gamma_spread_batched(kk, vv, seed=seed,
                             null_perm=token_permutations(k.shape[-2], seed + 1, kk.shape[:-2]))
    t = {"undetermined": g["undetermined"], **claim_e_layer.gamma_terms(g)}
    return claim_e.head_record("synthetic", 0, 0, t, rules="ours").to_json()


def test_the_null_axes_are_the_shuffled_values_recovered_with_the_same_weights():
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(3, 20, 4, generator=gen, dtype=F64)
    v = torch.randn(3, 20, 4, generator=gen, dtype=F64)
    perm = token_permutations(20, 0, (3,))
    kg = KeyGram(k)
    g = gamma_spread_batched(k, v, null_perm=perm)
    log_g = kg.log_g - kg.log_g.amax(-1, keepdim=True)
    axes = recover_axes(shuffled_token_null(v, perm), log_g)
    # the span judged holds the value bias's direction h = g − ḡ too (method §4.2): here by
    # appending h as a column, a route apart from the measures' own `extra`
    g_at_peak = torch.exp(log_g)
    spanned = torch.cat([axes, (g_at_peak - g_at_peak.mean(-1, keepdim=True)).unsqueeze(-1)], -1)
    assert torch.allclose(g["null_subspace"], invariant_subspace_residual(kg.centred, spanned))
    assert torch.allclose(g["null_directions"], invariance_overlap(kg.centred, spanned))


def test_a_value_bias_leaves_rho_and_omega_unchanged_and_h_inside_the_span_adds_nothing():
    """V → V + 1cᵀ moves Â to Â + h·cᵀ (h = g − ḡ); span([Â, h]) is the same for every c, so ρ
    and ω with ``extra=h`` are too, while without it they move. An h inside span(Â), or a zero
    h (constant g), adds no direction: the measures equal those of span(Â) alone."""
    gen = torch.Generator().manual_seed(5)
    k = torch.randn(4, 30, 6, generator=gen, dtype=F64)
    kg = KeyGram(k)
    log_g = kg.log_g - kg.log_g.amax(-1, keepdim=True)
    v = torch.randn(4, 30, 6, generator=gen, dtype=F64)
    c = 10.0 * torch.randn(4, 1, 6, generator=gen, dtype=F64)
    a, biased = recover_axes(v, log_g), recover_axes(v + c, log_g)
    h = bias_direction(log_g)
    for measure in (invariant_subspace_residual, invariance_overlap):
        plain, moved = measure(kg.centred, a), measure(kg.centred, biased)
        assert (plain - moved).abs().min() > 1e-3                       # the bias moves them ...
        assert torch.allclose(measure(kg.centred, a, extra=h),          # ... not modulo h
                              measure(kg.centred, biased, extra=h), rtol=0, atol=1e-12)
        inside = a @ torch.randn(6, 1, generator=gen, dtype=F64)
        for extra in (inside.squeeze(-1), torch.zeros_like(h)):
            assert torch.allclose(measure(kg.centred, a, extra=extra), plain, rtol=0, atol=1e-12)
        # as many axes as tokens (N ≤ d): the span is all of ℝ^N, h is in it, nothing is added
        wide = torch.randn(4, 30, 31, generator=gen, dtype=F64)
        assert torch.equal(measure(kg.centred, wide, extra=h), measure(kg.centred, wide))


def test_v_hat_is_supported_far_above_chance_and_a_true_null_is_refuted_at_chance():
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(20, 65, 8, generator=gen, dtype=F64)
    exact = _head(k, KeyGram(k).kpca_values())
    assert exact["verdicts"]["ours"] == verdicts.SUPPORTED, exact["evidence"]
    tests = exact["vs_null"]["gamma_subspace_residual"]
    assert tests["above_chance"] and not tests["at_chance"]
    assert exact["null"]["gamma_subspace_position"] > 0.35
    null = _head(k, torch.randn(20, 65, 8, generator=gen, dtype=F64))
    assert null["vs_null"]["gamma_subspace_residual"]["at_chance"] is True
    assert null["verdicts"]["ours"] == verdicts.REFUTED, null["evidence"]
    assert "at chance" in null["reason"]


def test_a_span_invariant_only_on_the_dominant_directions_is_not_supported():
    """Keys from a few dominant token directions: the centred Gram's top eigenvalues carry
    nearly all of its mass. Values holding those directions (V = X·W with the keys' X) have a
    small ρ, far below their token-shuffled null; their other directions lie at round-off of
    K̃ (μ_d is round-off here), so ω is not determined at float64 and the direction position is
    undefined with that reason (method §4.2, "Precision"): the head is not supported."""
    gen = torch.Generator().manual_seed(4)
    s, n, big, dim, d = 20, 120, 3, 48, 32
    x = torch.randn(s, n, dim, generator=gen, dtype=F64)
    x[..., :big] *= 12.0  # a few directions dominate the tokens
    basis = torch.randn(s, n, big, generator=gen, dtype=F64)
    x = x + 12.0 * basis @ torch.randn(big, dim, generator=gen, dtype=F64)
    w_k = torch.randn(dim, 8, generator=gen, dtype=F64) / dim ** 0.5
    w_v = torch.randn(dim, d, generator=gen, dtype=F64) / dim ** 0.5
    rec = _head(x @ w_k, x @ w_v)
    assert rec["verdicts"]["ours"] != verdicts.SUPPORTED, rec["evidence"]
    assert rec["metrics"]["gamma_direction_position"] is None, rec["metrics"]
    assert set(rec["directions_imprecise"]) == {"learned", "null"}
    assert "learned" not in rec["directions"] and rec["null"]["gamma_direction_position"] is None


def test_a_gram_on_which_the_null_itself_meets_the_bar_is_undetermined():
    """When the token-shuffled values' span already sits below the support bar, every span of
    that dimension is nearly invariant on that K̃: the rule cannot tell, and says so."""
    s = 8
    t = {"undetermined": torch.zeros(s, 1, dtype=torch.bool)}
    for name, spread, rho, omega in (("learned", 0.1, 0.05, 0.99), ("eigen", 0.0, 0.0, 1.0),
                                     ("perturbed", 1.0, 1.0, 0.5), ("null", None, 0.2, 0.9)):
        if spread is not None:
            t[f"gamma_{name}"] = torch.full((s, 1), spread, dtype=F64)
            t[f"gamma_{name}_abs"] = torch.full((s, 1), spread, dtype=F64)
        t[f"gamma_{name}_subspace"] = rho + 0.01 * torch.arange(s, dtype=F64).unsqueeze(1)
        t[f"gamma_{name}_directions"] = torch.full((s, 1), omega, dtype=F64)
    rec = claim_e.head_record("m", 0, 0, t, rules="ours").to_json()
    assert rec["verdicts"]["ours"] == verdicts.UNDETERMINED
    assert "cannot discriminate" in rec["undefined"]["gamma_subspace_position"]
    assert rec["verdicts"]["p2"] == verdicts.SUPPORTED  # P2's per-column rule is not affected
    t["gamma_null_subspace"] = t["gamma_null_subspace"] + 0.5  # the null back past the bar
    assert claim_e.head_record("m", 0, 0, t, rules="ours")["verdicts"]["ours"] == \
        verdicts.SUPPORTED


def test_both_measures_at_once_are_the_same_bits_as_each_alone():
    """claim E's γ computes ρ and ω of a candidate from one basis and one image
    (checks.invariant_subspace.subspace_measures): the same bits as the two functions, on a batch
    with a rank-deficient span and a zero Gram matrix among its items."""
    from checks.invariant_subspace import subspace_measures

    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 20, 20, generator=g, dtype=torch.float64)
    k = x @ x.transpose(-1, -2)
    k[3] = 0.0
    a = torch.randn(4, 20, 5, generator=g, dtype=torch.float64)
    a[1, :, 4] = a[1, :, 0] * 2.0  # rank 4 of 5
    rho, omega = subspace_measures(k, a)
    assert torch.equal(rho, invariant_subspace_residual(k, a))
    assert torch.equal(omega, invariance_overlap(k, a))


def test_the_images_rank_test_without_an_svd_decides_as_the_svd():
    """ω's full-rank test (checks.invariant_subspace.full_rank) skips the SVD where
    ‖R‖_F·‖R⁻¹‖_F bounds σ_max/σ_min well below 1/tol: the same decision as the singular values,
    on triangular R with σ_min/σ_max of 1, 1e-10, just above and below tol, and 0."""
    from checks.invariant_subspace import full_rank

    g = torch.Generator().manual_seed(5)
    m, tol = 6, 20 * torch.finfo(torch.float64).eps
    ratios = [1.0, 1e-10, 4 * tol, tol / 4, 0.0]
    u = torch.linalg.qr(torch.randn(len(ratios), 20, m, generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(len(ratios), m, m, generator=g, dtype=torch.float64)).Q
    s = torch.tensor([[1.0] * (m - 1) + [r] for r in ratios], dtype=torch.float64)
    r = torch.linalg.qr((u * s.unsqueeze(-2)) @ v.transpose(-1, -2)).R
    sv = torch.linalg.svdvals(r)
    assert full_rank(r, tol).tolist() == (sv > tol * sv[..., :1]).all(-1).tolist()
    assert full_rank(r, tol).tolist() == [True, True, True, False, False]
