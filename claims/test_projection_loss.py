"""Claim J: "attention minimises the KPCA projection loss J_proj" (P1 §2.2.1; P2 finding 2).

Per layer and per model: the magnitudes of mean‖φ(q)‖² and mean‖h‖² and the Bessel share; per
checkpoint series: the trend of J_proj and which term carries it. Thresholds: thresholds.toml.
"""

import pytest

from claims import claim_j
from claims.outcome import assert_supported

pytestmark = pytest.mark.kpca_claim("J")  # the claim these tests judge (claims/registry.py)


def test_projection_loss(layer_ref, claim_session, record_result, collected_heads):
    run = claim_session.run(layer_ref.model)
    record = claim_j.record_for_layer(run, layer_ref.model, layer_ref.layer,
                                      collected_heads(layer_ref.model)[1])
    record_result(record, run)
    assert_supported(record, claim_j.message(record, layer_ref.id))


def test_projection_loss_model(model_ref, claim_session, record_result, collected_heads):
    run = claim_session.run(model_ref.model)
    record = claim_j.record_for_model(run, model_ref.model, *collected_heads(model_ref.model))
    record_result(record, run)
    assert_supported(record, claim_j.message(record, f"model {model_ref.model}"))


def test_projection_trend(series_ref, claim_session, record_result):
    """P1 Fig. 1: J_proj after every epoch on one fixed batch; P2: the fall is ‖h‖² falling."""
    record, run = claim_j.record_for_series(series_ref.name, claim_session.series(series_ref.name))
    record_result(record, run)
    assert_supported(record, claim_j.message(record, f"series {series_ref.name}"))
