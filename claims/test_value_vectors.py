"""Claim V: "value vectors are the eigenvectors of the centred key Gram matrix" (P1 §2; P2 finding 1).

Each test passes when the claim is supported for its head (or model), fails when it is refuted or
inconclusive, and is skipped when V̂ is undetermined. Thresholds: claims/thresholds.toml.
"""

import pytest

from claims import claim_v
from claims.outcome import assert_supported

pytestmark = pytest.mark.kpca_claim("V")  # the claim these tests judge (claims/registry.py)


def test_value_vectors(head_ref, claim_session, record_result, collected_heads):
    run = claim_session.run(head_ref.model)
    record = claim_v.record_for_head(run, head_ref.model, head_ref.layer, head_ref.head,
                                     *collected_heads(head_ref.model))
    record_result(record, run)
    assert_supported(record, claim_v.message(record, head_ref.id))


def test_value_vectors_model(model_ref, claim_session, record_result, collected_heads):
    run = claim_session.run(model_ref.model)
    record = claim_v.record_for_model(run, model_ref.model, *collected_heads(model_ref.model))
    record_result(record, run)
    assert_supported(record, claim_v.model_message(record))
