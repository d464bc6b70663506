"""The plain per-head reference of the benchmark (bench/loop_reference.py) against the batched claim-V
path (checks.value_vectors): two independent routes to the same 16 metrics (method §2)."""

from __future__ import annotations

import math

import pytest
import torch

from bench.loop_reference import reference_claim_v, reference_head
from bench.loop_reference_metrics import METRIC_NAMES
from bench.timing import StageClock
from checks.gram import KeyGram
from checks.value_vectors import random_orthonormal, value_vector_metrics_batched
from claims.verdicts import allclose_tolerance
from tests._helpers import F64, close

TOL = allclose_tolerance()  # [claim_v.allclose] of claims/thresholds.toml

NAMES = tuple(METRIC_NAMES) + tuple(f"{n}_null" for n in METRIC_NAMES)


def heads(b: int, n: int, d: int, seed: int, key_scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    k = key_scale * torch.randn(b, n, d, generator=g, dtype=F64)
    v = torch.randn(b, n, d, generator=g, dtype=F64)
    return k, v, random_orthonormal(n, min(n, d), seed + 1, (b,))


@pytest.mark.parametrize("n, d, key_scale, standardize, convention", [
    (12, 4, 1.0, False, "p2"),
    (20, 6, 3.0, False, "p2"),
    (16, 5, 1.0, True, "p2"),
    (15, 4, 1.0, False, "kpca"),
    (5, 8, 1.0, False, "p2"),  # N < d: V̂ padded with zero columns, undetermined
])
def test_reference_equals_batched_path(n, d, key_scale, standardize, convention):
    k, v, a0 = heads(3, n, d, seed=n + d, key_scale=key_scale)
    ours = value_vector_metrics_batched(k, v, null_axes=a0, standardize=standardize,
                                        convention=convention, **TOL)
    clock = StageClock()
    refs = reference_claim_v(zip(k, v, a0), standardize_keys=standardize, convention=convention,
                             clock=clock)
    for b, ref in enumerate(refs):
        for name in NAMES:
            got = float(ours[name][b])
            assert close(got, ref[name], 1e-8), (name, b, got, ref[name])
        assert bool(ours["undetermined"][b]) == bool(ref["undetermined"])
        assert close(float(ours["mu_d"][b]), ref["mu_d"], 1e-8, floor=1e-300)
        # ours: a 50-step power iteration (a lower bound of ‖K_φ‖₂); the reference: exact
        thr = float(ours["threshold"][b])
        assert ref["threshold"] * (1 - 1e-3) <= thr <= ref["threshold"] * (1 + 1e-12)
    assert set(clock.wall) == {"gram", "eigen", "metrics", "assignment"}


@pytest.mark.parametrize("convention", ["p2", "kpca"])
def test_reference_token_shuffled_null_equals_batched_path(convention):
    """The null the claim-V test uses, ΠV̂ (method §2.3): given as a token permutation per head,
    the reference reorders V̂'s rows and must agree with the batched path's null metrics."""
    k, v, _ = heads(3, 14, 4, seed=5)
    g = torch.Generator().manual_seed(9)
    perm = torch.stack([torch.randperm(14, generator=g) for _ in range(3)])
    ours = value_vector_metrics_batched(k, v, null_perm=perm, convention=convention, **TOL)
    for b, ref in enumerate(reference_claim_v(zip(k, v, perm), convention=convention)):
        for name in NAMES:
            assert close(float(ours[name][b]), ref[name], 1e-8), (name, b)
    with pytest.raises(ValueError, match="permutation"):
        reference_head(k[0], v[0], torch.zeros(14))


def test_reference_known_answer_v_equals_v_hat():
    """V := V̂ of the same keys: every metric at its perfect value, the null far from it."""
    k, _, a0 = heads(1, 14, 4, seed=3)
    v_hat = KeyGram(k[0]).kpca_values()
    ref = reference_head(k[0], v_hat, a0[0])
    for name in ("direct_cosine", "optimal_cosine", "linear_cka", "kernel_cka", "pearson",
                 "allclose", "subspace_overlap"):
        assert math.isclose(ref[name], 1.0, abs_tol=1e-10), name
    assert ref["relative_frobenius"] < 1e-10
    assert ref["subspace_overlap_null"] < 0.9 and ref["allclose_null"] == 0.0


def test_reference_rejects_bad_shapes():
    k, v, a0 = heads(1, 10, 4, seed=0)
    with pytest.raises(ValueError, match="null_axes"):
        reference_head(k[0], v[0], a0[0][:, :3])
    with pytest.raises(ValueError, match="2-D"):
        reference_head(k, v, a0)
    with pytest.raises(ValueError, match="NaN"):
        reference_head(k[0] * float("nan"), v[0], a0[0])


# ------------------------------------------------------------------ claims J and E (bench loops)
def test_reference_j_equals_the_batched_terms():
    from bench.loop_reference import J_NAMES, reference_j_head
    from checks.projection import log_phi_sq_norm_p1_code, projection_terms_batched

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(4, 17, 6, generator=g, dtype=F64) for _ in range(3))
    exact = projection_terms_batched(q, k, v)
    p1 = log_phi_sq_norm_p1_code(q, k)
    ours = {"log_phi_sq_mean": torch.logsumexp(exact["log_phi_sq"], -1) - math.log(17),
            "phi_sq_mean": exact["phi_sq"].mean(-1), "h_sq_mean": exact["h_sq"].mean(-1),
            "j_proj": exact["j_proj"], "bessel_share": exact["bessel_share"],
            "p1_log_phi_sq_mean": torch.logsumexp(p1, -1) - math.log(17)}
    clock = StageClock()
    for b in range(4):
        ref = reference_j_head(q[b], k[b], v[b], clock=clock)
        assert set(ref) == set(J_NAMES)
        for name in J_NAMES:
            assert close(float(ours[name][b]), ref[name], 1e-10), (name, b)
    assert set(clock.wall) == {"phi", "h", "summaries"}


@pytest.mark.parametrize("key_scale", [1.0, 40.0])  # 40: the naive float32 route overflows
def test_reference_e_equals_the_batched_spectra_and_spreads(key_scale):
    from bench.loop_reference import reference_e_head
    from checks import gamma as gamma_constancy
    from checks import spectrum

    g = torch.Generator().manual_seed(6)
    k = key_scale * torch.randn(3, 24, 6, generator=g, dtype=F64)
    v = torch.randn(3, 24, 6, generator=g, dtype=F64)
    captured = {}
    orig = gamma_constancy.perturbed_axes

    def keep(*a, **kw):
        captured["axes"] = orig(*a, **kw)
        return captured["axes"]

    gamma_constancy.perturbed_axes = keep
    try:
        gamma = gamma_constancy.gamma_spread_batched(k, v, seed=1)
    finally:
        gamma_constancy.perturbed_axes = orig
    raw = spectrum.gram_spectrum_batched(k)[..., :6]
    std = spectrum.gram_spectrum_batched(k, standardize=True)[..., :6]
    naive = spectrum.naive_gram_spectrum(k)
    clock = StageClock()
    for b in range(3):
        ref = reference_e_head(k[b], v[b], captured["axes"][b], clock=clock)
        for name, ours in (("mu_log_raw", raw[b]), ("mu_log_standardized", std[b])):
            top = float(ours.abs().max())
            assert torch.allclose(ours, torch.from_numpy(ref[name]), rtol=1e-8, atol=1e-8 * top)
        assert bool(naive.finite[b]) == bool(ref["naive_finite"])
        if naive.finite[b]:
            mu = naive.mu[b, :6]
            assert torch.allclose(mu, torch.from_numpy(ref["mu_naive_float32"]), rtol=1e-3,
                                  atol=1e-4 * float(mu.abs().max()))
        for name in ("learned", "perturbed"):
            assert close(float(gamma[name][b].mean()), ref[f"gamma_{name}"], 1e-8), name
            assert close(float(gamma[f"{name}_abs"][b].mean()), ref[f"gamma_{name}_abs"], 1e-8,
                         floor=1e-300), name
        assert bool(gamma["undetermined"][b]) == bool(ref["undetermined"])
    assert set(clock.wall) == {"gram", "eigen", "naive", "gamma"}
    if key_scale > 1:
        assert not bool(naive.finite.all())  # the case the test is for
