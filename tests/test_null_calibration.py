"""Calibration of the tests against chance (method §7.2) on a null that is really null: values
drawn independently of the keys, over many synthetic heads (N = 65 tokens, d = 32, 20 samples
each). For every metric the `ours` rule set judges against a null (claim V's subspace overlap,
claim J's output-fit R², γ's invariant-subspace residual), the share of heads called above
chance at alpha = 0.05 lands within Monte Carlo error of alpha; on V = V̂ it is 1, and "at
chance" (the equivalence test) is never said of V̂."""

from __future__ import annotations

import pytest
import torch

from checks.gram import KeyGram
from checks.nulls import rejection_rate, token_permutations, tost_pvalues
from checks.stats import sign_flip_pvalues
from checks.value_vectors import value_vector_metrics_batched
from claims import claim_v, claim_j_layer, verdicts

HEADS, S, N, D = 200, 20, 65, 32
F64 = torch.float64
ALPHA = 0.05


CHUNK = 25  # heads per batch: bounded memory


def _chunks(seed: int, independent: bool):
    """(g, k [S, CHUNK, N, D], v or None) for the HEADS heads, CHUNK at a time."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(HEADS // CHUNK):
        k = torch.randn(S, CHUNK, N, D, generator=g, dtype=F64)
        v = torch.randn(S, CHUNK, N, D, generator=g, dtype=F64) if independent else None
        yield g, k, v


def _pvalues(diffs: list[torch.Tensor], nulls: list[torch.Tensor], claim: str, metric: str,
             seed: int):
    """The tests against chance of every head: sign-flip p and TOST p, the TOST margin being
    the production one, a share of each head's room above (or below) its mean null."""
    diff = torch.cat(diffs, dim=1)  # [S, HEADS]
    margin = verdicts.absolute_margin(claim, metric, torch.cat(nulls, dim=1).mean(0))  # [HEADS]
    return sign_flip_pvalues(diff, None, seed), tost_pvalues(diff, None, margin, seed + 1)


@pytest.fixture(scope="module")
def overlap_pvalues():
    out = {}
    for name, independent in (("null", True), ("v_hat", False)):
        diffs, nulls = [], []
        for i, (g, k, v) in enumerate(_chunks(11, independent)):
            v = KeyGram(k).kpca_values() if v is None else v
            perm = token_permutations(N, 5 + i, (S, CHUNK))
            m = value_vector_metrics_batched(k, v, null_perm=perm, defer_matching=True,
                                             atol=1e-5, rtol=1e-3)
            diffs.append(m["subspace_overlap"] - m["subspace_overlap_null"])
            nulls.append(m["subspace_overlap_null"])
        out[name] = _pvalues(diffs, nulls, "claim_v", "subspace_overlap", 1)
    return out


@pytest.fixture(scope="module")
def output_fit_pvalues():
    out = {}
    for name, independent in (("null", True), ("v_hat", False)):
        diffs, nulls = [], []
        for i, (g, k, v) in enumerate(_chunks(12, independent)):
            q = k + 0.5 * torch.randn(k.shape, generator=g, dtype=F64)
            v_hat = KeyGram(k).kpca_values()
            fit = claim_j_layer.output_fit_terms(q, k, v_hat if v is None else v, D ** -0.5, "p2",
                                           token_permutations(N, 6 + i, (S, CHUNK)))
            diffs.append(fit["r2"] - fit["r2_null"])
            nulls.append(fit["r2_null"])
        out[name] = _pvalues(diffs, nulls, "claim_j", "output_r2", 3)
    return out


@pytest.fixture(scope="module")
def gamma_pvalues():
    """γ's chance tests (method §4.2): ρ of the token-shuffled values' axes minus ρ of the
    learned axes, on the same K̃ (the production route, gamma_spread_batched)."""
    from checks.gamma import gamma_spread_batched

    out = {}
    for name, independent in (("null", True), ("v_hat", False)):
        diffs, nulls = [], []
        for i, (g, k, v) in enumerate(_chunks(13, independent)):
            v = KeyGram(k).kpca_values() if v is None else v
            out_g = gamma_spread_batched(k, v, seed=i,
                                         null_perm=token_permutations(N, 7 + i, (S, CHUNK)))
            diffs.append(out_g["null_subspace"] - out_g["learned_subspace"])
            nulls.append(out_g["null_subspace"] - out_g["eigen_subspace"])  # room, as in claim E
        out[name] = _pvalues(diffs, nulls, "claim_e_gamma", "gamma_subspace_residual", 5)
    return out


FIXTURES = ["overlap_pvalues", "output_fit_pvalues", "gamma_pvalues"]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_above_chance_is_called_at_the_nominal_rate_on_a_true_null(fixture, request):
    p, _ = request.getfixturevalue(fixture)["null"]
    rate, se = rejection_rate(p, ALPHA)
    print(f"{fixture}: above chance at alpha {ALPHA} in {rate:.3f} (MC s.e. {se:.3f})")
    assert 0.02 <= rate <= 0.08, (fixture, rate, se)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_v_hat_is_always_above_chance_and_never_at_chance(fixture, request):
    p, tost = request.getfixturevalue(fixture)["v_hat"]
    assert rejection_rate(p, ALPHA)[0] == 1.0
    assert rejection_rate(tost, ALPHA)[0] == 0.0


@pytest.mark.parametrize("fixture", FIXTURES)
def test_the_true_null_is_mostly_shown_at_chance(fixture, request):
    """Power of the equivalence test with 20 samples: most null heads are shown at chance."""
    _, tost = request.getfixturevalue(fixture)["null"]
    rate, se = rejection_rate(tost, ALPHA)
    print(f"{fixture}: at-chance power {rate:.3f} (MC s.e. {se:.3f})")
    assert rate >= 0.8, (fixture, rate, se)
