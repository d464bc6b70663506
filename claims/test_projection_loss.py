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
    _, heads = collected_heads(layer_ref.model)
    record = claim_j.layer_record(layer_ref.model, layer_ref.layer,
                                  run.layer_metrics("J", layer_ref.layer), heads,
                                  rules=run.options.rules)
    record_result(record, run)
    assert_supported(record, claim_j.message(record, layer_ref.id))


def test_projection_loss_model(model_ref, claim_session, record_result, collected_heads):
    run = claim_session.run(model_ref.model)
    layers, heads = collected_heads(model_ref.model)
    record = claim_j.model_record(model_ref.model,
                                  {layer: run.layer_metrics("J", layer) for layer in layers}, heads,
                                  rules=run.options.rules)
    record_result(record, run)
    assert_supported(record, claim_j.message(record, f"model {model_ref.model}"))


def test_projection_trend(series_ref, claim_session, record_result):
    """P1 Fig. 1: J_proj after every epoch on one fixed batch; P2: the fall is ‖h‖² falling."""
    points = []
    for point in claim_session.series(series_ref.name):
        info = point.run.prepare()
        pooled = claim_j.pooled([point.run.layer_metrics("J", layer) for layer in range(info["n_layers"])],
                                list(range(info["n_heads"])))
        points.append({"step": point.step, **point.record_fields(),
                       "test_accuracy": point.sidecar.get("test_accuracy"),
                       "train_loss": point.sidecar.get("train_loss"),
                       "checkpoint_hash": info["checkpoint_hash"],
                       **{k: pooled[k] for k in ("phi_sq_mean", "h_sq_mean", "j_proj",
                                                 "bessel_share", "log10_ratio")},
                       "p1_code_log_mean_error": pooled["p1_log_mean_error"]})
    record = claim_j.trend_record(series_ref.name, points)
    record_result(record, point.run)
    assert_supported(record, claim_j.message(record, f"series {series_ref.name}"))
