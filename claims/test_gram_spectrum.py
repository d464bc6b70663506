"""Claim E: "Gram eigenvalue statistics justify V as eigenvectors" (P1 §2.2.2, Eq. 11; P2 finding 3).

Per model: P2's eigenvalue statistics by three routes (raw keys and standardised keys in log
space, and the naive float32 exp(S) route). Per head: γ constancy of the learned V beside the true
eigenvectors and P2's perturbed basis. Thresholds: thresholds.toml.
"""

import pytest

from claims import claim_e
from claims.outcome import assert_supported

pytestmark = pytest.mark.kpca_claim("E")  # the claim these tests judge (claims/registry.py)


def test_eigenvalue_statistics(model_ref, claim_session, record_result, collected_heads):
    run = claim_session.run(model_ref.model)
    record = claim_e.record_for_model(run, model_ref.model, *collected_heads(model_ref.model))
    record_result(record, run)
    assert_supported(record, claim_e.message(record, f"model {model_ref.model}"))


def test_gamma_constancy(head_ref, claim_session, record_result):
    run = claim_session.run(head_ref.model)
    record = claim_e.record_for_head(run, head_ref.model, head_ref.layer, head_ref.head)
    record_result(record, run)
    assert_supported(record, claim_e.message(record, head_ref.id))
