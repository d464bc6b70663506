"""Known answers for the `ours` rules (method §2.4, §3.6, §4.2, §7): synthetic heads whose V is
V̂ itself, one of its function-preserving twins (V̂·R, V̂·M with cond(M) = 10, 100, 1000, sign
flips, permuted columns, c·V̂), V̂ plus noise, or independent of the keys (a true null), judged
through the claims' own record and verdict functions. Every twin gets V̂'s verdict under `ours`;
the true null is refuted, never supported."""

from __future__ import annotations

import math

import pytest
import torch

from checks.gamma import gamma_spread_batched
from checks.gram import KeyGram
from checks.nulls import token_permutations
from checks.value_vectors import value_vector_metrics_batched
from claims import claim_e, claim_e_layer, claim_v, verdicts

N, D, S = 65, 32, 20
F64 = torch.float64
TOL = {"atol": 1e-5, "rtol": 1e-3}


def _orthogonal(g: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=F64))
    return q


def _conditioned(cond: float, g: torch.Generator) -> torch.Tensor:
    """A d × d matrix with condition number ``cond``: U diag(σ) W with log-spaced σ."""
    sigma = torch.logspace(0.0, -math.log10(cond), D, dtype=F64)
    return _orthogonal(g) @ torch.diag(sigma) @ _orthogonal(g)


TWINS = ("v_hat", "rotated", "cond10", "cond100", "cond1000", "signs", "columns", "scaled")


def synthetic_layer(key_scale: float = 1.0, seed: int = 0, noise: tuple[float, ...] = (0.1,)):
    """Keys [S, N, D] and values [S, H, N, D] for the heads TWINS + noisy + independent, all on
    the same keys (one head per condition), and their names."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(S, N, D, generator=g, dtype=F64) * key_scale
    v_hat = KeyGram(k).kpca_values("p2")
    signs = torch.where(torch.arange(D) % 2 == 0, 1.0, -1.0).to(F64)
    values = {
        "v_hat": v_hat, "rotated": v_hat @ _orthogonal(g),
        "cond10": v_hat @ _conditioned(10, g), "cond100": v_hat @ _conditioned(100, g),
        "cond1000": v_hat @ _conditioned(1000, g), "signs": v_hat * signs,
        "columns": v_hat[..., torch.randperm(D, generator=g)], "scaled": 368.0 * v_hat,
    }
    # a value bias 1c^T on a mixed twin, of the size of V's own entries: the output bias absorbs
    # c·W_O (softmax rows sum to 1), so the network is V̂'s (method §2.4)
    c = torch.randn(S, 1, D, generator=g, dtype=F64) * v_hat.abs().amax(dim=(-2, -1), keepdim=True)
    values["biased"] = values["cond10"] + c
    for eps in noise:
        z = torch.randn(S, N, D, generator=g, dtype=F64)
        values[f"noise{eps:g}"] = v_hat + eps * z * v_hat.norm(dim=-1, keepdim=True) / math.sqrt(D)
    values["independent"] = torch.randn(S, N, D, generator=g, dtype=F64)
    names = list(values)
    return k, torch.stack([values[n] for n in names], dim=1), names


def layer_metrics(k: torch.Tensor, v: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """claim V's per-layer tensors [S, H] for keys [S, N, D] shared by the H heads of v."""
    h = v.shape[1]
    kk = k.unsqueeze(1).expand(-1, h, -1, -1)
    perm = token_permutations(N, seed + 7, (S, h))
    return value_vector_metrics_batched(kk, v, null_perm=perm, **TOL)


@pytest.fixture(scope="module")
def records():
    k, v, names = synthetic_layer()
    m = layer_metrics(k, v)
    stats = claim_v.head_statistics("synthetic", {0: m}, list(range(len(names))))
    return {name: claim_v.head_record("synthetic", 0, i, m, statistics=stats[(0, i)])
            for i, name in enumerate(names)}


@pytest.mark.parametrize("twin", TWINS)
def test_every_twin_of_v_hat_is_supported_under_ours(records, twin):
    rec = records[twin]
    assert rec["verdicts"]["ours"] == verdicts.SUPPORTED, rec["evidence"]
    assert rec["metrics"]["subspace_overlap"] == pytest.approx(1.0, abs=1e-6)


def test_a_value_bias_keeps_v_hats_claim_v_verdict(records):
    """V → V·M + 1cᵀ is the same network: the overlap of the centred spans is 1 and claim V
    keeps V̂'s verdict under ours (method §2.1, §2.4)."""
    rec = records["biased"]
    assert rec["verdicts"]["ours"] == records["v_hat"]["verdicts"]["ours"] == verdicts.SUPPORTED, \
        rec["evidence"]
    assert rec["metrics"]["subspace_overlap"] == pytest.approx(1.0, abs=1e-6)


def test_the_non_invariant_metrics_still_move_under_the_twins(records):
    """P2's metrics (judged by `p2` only) do change under V̂·M: why `ours` does not use them."""
    assert records["cond1000"]["metrics"]["optimal_cosine"] < 0.5
    assert records["signs"]["metrics"]["optimal_cosine"] < 0.5
    assert records["cond1000"]["verdicts"]["p2"] != verdicts.SUPPORTED


def test_small_noise_keeps_support_and_the_true_null_is_refuted_at_chance(records):
    assert records["noise0.1"]["verdicts"]["ours"] == verdicts.SUPPORTED
    null = records["independent"]
    assert null["verdicts"]["ours"] == verdicts.REFUTED, null["evidence"]
    assert null["vs_null"]["subspace_overlap"]["at_chance"] is True
    assert null["vs_null"]["subspace_overlap"]["above_chance"] is False


# --- claim J: an exact kernel-PCA head and its rescaled twin -----------------------------------

def j_terms(v_of, key_scale: float = 1.0, seed: int = 3) -> dict[str, torch.Tensor]:
    """claim J's layer terms [S, 1, ...] for one head whose values are ``v_of(k, v_hat)``."""
    from claims.claim_j_layer import batch_terms

    g = torch.Generator().manual_seed(seed)
    k = torch.randn(S, 1, N, D, generator=g, dtype=F64) * key_scale
    q = k + 0.5 * key_scale * torch.randn(S, 1, N, D, generator=g, dtype=F64)
    v_hat = KeyGram(k).kpca_values("p2")
    perm = token_permutations(N, seed + 11, (S, 1))
    return batch_terms(q, k, v_of(k, v_hat, g), D ** -0.5, False, "p2", perm)


J_CASES = {
    "exact": lambda k, vh, g: vh,
    "scaled368": lambda k, vh, g: 368.0 * vh,
    "cond100": lambda k, vh, g: vh @ _conditioned(100, g),
    "independent": lambda k, vh, g: torch.randn(vh.shape, generator=g, dtype=F64),
}


@pytest.fixture(scope="module")
def j_records():
    from claims import claim_j

    return {name: claim_j.layer_record("synthetic", 0, j_terms(case), [0])
            for name, case in J_CASES.items()}


def test_a_rescaled_kernel_pca_head_gets_the_exact_heads_verdict_under_ours(j_records):
    exact, scaled = j_records["exact"], j_records["scaled368"]
    assert exact["verdicts"]["ours"] == verdicts.SUPPORTED, exact["evidence"]
    assert scaled["verdicts"]["ours"] == exact["verdicts"]["ours"], scaled["evidence"]
    assert j_records["cond100"]["verdicts"]["ours"] == verdicts.SUPPORTED
    # P2's pooled-mean rule sees the scale: log10 ratio moves by 2 log10 368 = 5.13
    shift = scaled["metrics"]["log10_ratio"] - exact["metrics"]["log10_ratio"]
    assert shift == pytest.approx(2 * math.log10(368.0), abs=1e-9)
    assert scaled["metrics"]["output_r2"] == pytest.approx(1.0, abs=1e-9)


def test_values_independent_of_the_keys_are_never_supported_for_claim_j(j_records):
    null = j_records["independent"]
    assert null["verdicts"]["ours"] == verdicts.REFUTED, null["evidence"]
    assert null["output_fit"]["vs_null"]["above_chance"] is False


def test_every_claim_j_record_carries_its_per_token_statistics(j_records):
    tokens = j_records["exact"]["tokens"]
    assert tokens["n_tokens"] == S * N
    for name in ("median_log10_ratio", "trimmed_mean_log10_ratio", "top_phi_share",
                 "p2_appendix_log10_ratio"):
        assert math.isfinite(tokens[name]), name
    assert 1.0 / (S * N) <= tokens["top_phi_share"] <= 1.0


# --- γ constancy: the basis-free form gives every twin V̂'s verdict ------------------------------

@pytest.fixture(scope="module")
def gamma_records():
    from checks.degenerate import effective_rows
    from checks.gamma import gamma_spread_batched
    from claims import claim_e, claim_e_layer

    k, v, names = synthetic_layer(seed=2)
    kk = k.unsqueeze(1).expand(-1, v.shape[1], -1, -1)
    g = gamma_spread_batched(kk, v, seed=0,
                             null_perm=token_permutations(kk.shape[-2], 3, kk.shape[:-2]))
    t = {"undetermined": g["undetermined"], "effective_rows": effective_rows(KeyGram(kk).log_g),
         **claim_e_layer.gamma_terms(g)}
    return {name: claim_e.head_record("synthetic", 0, i, t) for i, name in enumerate(names)}


@pytest.mark.parametrize("twin", TWINS + ("biased",))
def test_every_twin_of_v_hat_is_gamma_supported_under_ours(gamma_records, twin):
    """The biased twin V̂·M + 1cᵀ included: ρ and ω judge span([Â, h]), h = g − ḡ (method §4.2)."""
    rec = gamma_records[twin]
    assert rec["verdicts"]["ours"] == verdicts.SUPPORTED, rec["evidence"]
    assert abs(rec["metrics"]["gamma_subspace_position"]) < 1e-9
    assert abs(rec["metrics"]["gamma_direction_position"]) < 1e-9


def test_a_value_bias_keeps_v_hats_gamma_verdict_at_d_8():
    """At d = 8 a bias once moved γ from supported to inconclusive (ρ position 0.155): V̂ and
    V̂ + 1cᵀ now get the same verdict and the same positions to round-off."""
    g = torch.Generator().manual_seed(4)
    k = torch.randn(S, 1, N, 8, generator=g, dtype=F64)
    v_hat = KeyGram(k).kpca_values("p2")
    c = torch.randn(S, 1, 1, 8, generator=g, dtype=F64) * v_hat.abs().amax(dim=(-2, -1),
                                                                            keepdim=True)
    v = torch.cat([v_hat, v_hat + c], dim=1)
    kk = k.expand(-1, 2, -1, -1)
    out = gamma_spread_batched(kk, v, null_perm=token_permutations(N, 3, (S, 2)))
    t = {"undetermined": out["undetermined"], **claim_e_layer.gamma_terms(out)}
    exact, biased = (claim_e.head_record("synthetic", 0, i, t) for i in (0, 1))
    assert exact["verdicts"]["ours"] == biased["verdicts"]["ours"] == verdicts.SUPPORTED, \
        biased["evidence"]
    for name in ("gamma_subspace_position", "gamma_direction_position"):
        assert biased["metrics"][name] == pytest.approx(exact["metrics"][name], abs=1e-9)


def test_gamma_under_ours_refutes_the_true_null_and_p2s_gamma_misses_the_rotation(gamma_records):
    assert gamma_records["independent"]["verdicts"]["ours"] == verdicts.REFUTED
    assert gamma_records["noise0.1"]["verdicts"]["ours"] == verdicts.SUPPORTED
    # per-column γ (the p2 rule set) cannot see that span(V̂·R) = span(V̂)
    assert gamma_records["rotated"]["metrics"]["gamma_position"] > 0.5
