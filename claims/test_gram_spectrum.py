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
    layers, heads = collected_heads(model_ref.model)
    record = claim_e.model_record(model_ref.model,
                                  {layer: run.layer_metrics("E", layer) for layer in layers}, heads,
                                  run.prepare()["head_dim"], rules=run.options.rules)
    record_result(record, run)
    assert_supported(record, claim_e.message(record, f"model {model_ref.model}"))


def test_gamma_constancy(head_ref, claim_session, record_result):
    run = claim_session.run(head_ref.model)
    record = claim_e.head_record(head_ref.model, head_ref.layer, head_ref.head,
                                 run.layer_metrics("E", head_ref.layer), rules=run.options.rules)
    record_result(record, run)
    assert_supported(record, claim_e.message(record, head_ref.id))
