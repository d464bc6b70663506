"""Calibration of the tests against chance (method §7.2) on a null that is really null: values
drawn independently of the keys, over many synthetic heads (N = 65 tokens, d = 32, 20 samples
each). For every metric the `ours` rule set judges, the share of heads called above chance at
alpha = 0.05 lands within Monte Carlo error of alpha; on V = V̂ it is 1, and "at chance"
(the equivalence test) is never said of V̂."""

from __future__ import annotations

import pytest
import torch

from checks.gram import KeyGram
from checks.nulls import rejection_rate, token_permutations, tost_pvalues
from checks.stats import sign_flip_pvalues
from checks.value_vectors import value_vector_metrics_batched
from claims import claim_j, claim_v, verdicts

HEADS, S, N, D = 200, 20, 65, 32
F64 = torch.float64
ALPHA = 0.05


def _keys_and_values(seed: int, independent: bool):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(S, HEADS, N, D, generator=g, dtype=F64)
    v = torch.randn(S, HEADS, N, D, generator=g, dtype=F64) if independent else None
    return g, k, v


@pytest.fixture(scope="module")
def overlap_pvalues():
    out = {}
    for name, independent in (("null", True), ("v_hat", False)):
        g, k, v = _keys_and_values(11, independent)
        v = KeyGram(k).kpca_values() if v is None else v
        m = value_vector_metrics_batched(k, v, null_perm=token_permutations(N, 5, (S, HEADS)),
                                         defer_matching=True, atol=1e-5, rtol=1e-3)
        diff = m["subspace_overlap"] - m["subspace_overlap_null"]  # [S, HEADS]
        margin = verdicts.chance_margins("claim_v")["subspace_overlap"]
        out[name] = (sign_flip_pvalues(diff, None, 1), tost_pvalues(diff, None, margin, 2))
    return out


@pytest.fixture(scope="module")
def output_fit_pvalues():
    out = {}
    for name, independent in (("null", True), ("v_hat", False)):
        g, k, v = _keys_and_values(12, independent)
        q = k + 0.5 * torch.randn(k.shape, generator=g, dtype=F64)
        v_hat = KeyGram(k).kpca_values()
        v = v_hat if v is None else v
        fit = claim_j.output_fit_terms(q, k, v, D ** -0.5, "p2",
                                       token_permutations(N, 6, (S, HEADS)))
        diff = fit["r2"] - fit["r2_null"]
        margin = verdicts.chance_margins("claim_j")["output_r2"]
        out[name] = (sign_flip_pvalues(diff, None, 3), tost_pvalues(diff, None, margin, 4))
    return out


@pytest.mark.parametrize("fixture", ["overlap_pvalues", "output_fit_pvalues"])
def test_above_chance_is_called_at_the_nominal_rate_on_a_true_null(fixture, request):
    p, _ = request.getfixturevalue(fixture)["null"]
    rate, se = rejection_rate(p, ALPHA)
    assert 0.02 <= rate <= 0.08, (fixture, rate, se)


@pytest.mark.parametrize("fixture", ["overlap_pvalues", "output_fit_pvalues"])
def test_v_hat_is_always_above_chance_and_never_at_chance(fixture, request):
    p, tost = request.getfixturevalue(fixture)["v_hat"]
    assert rejection_rate(p, ALPHA)[0] == 1.0
    assert rejection_rate(tost, ALPHA)[0] == 0.0


@pytest.mark.parametrize("fixture", ["overlap_pvalues", "output_fit_pvalues"])
def test_the_true_null_is_mostly_shown_at_chance(fixture, request):
    """Power of the equivalence test with 20 samples: most null heads are shown at chance."""
    _, tost = request.getfixturevalue(fixture)["null"]
    assert rejection_rate(tost, ALPHA)[0] >= 0.8
