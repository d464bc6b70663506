"""Verdict rules: the thresholds file, boundaries, and the claim-V head/model decisions."""

import pytest
import torch

from claims import claim_v, verdicts


def test_thresholds_file_has_sources_for_every_rule():
    data = verdicts.load_thresholds()
    sup = verdicts.rules("claim_v", "supported")
    ref = verdicts.rules("claim_v", "refuted")
    assert {r.metric for r in ref} == {"optimal_cosine", "linear_cka", "kernel_cka"}
    assert [r.value for r in ref] == [0.32, 0.11, 0.32]  # P2 abstract
    assert all(r.source for r in sup + ref)
    assert all("P2" in r.source for r in ref)
    assert data["claim_v"]["undetermined"]["max_share"] == 0.5


def test_bad_thresholds_file_is_rejected(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text('[claim_v.supported.x]\nvalue = 1\ndirection = ">="\n')
    with pytest.raises(ValueError, match="lacks.*source"):
        verdicts.load_thresholds(str(bad))


@pytest.mark.parametrize("values, expected", [
    ((0.95, 0.95, 0.95, 0.6), "supported"),
    ((0.90, 0.90, 0.90, 0.5), "supported"),     # the bars are inclusive
    ((0.95, 0.95, 0.95, 0.4), "inconclusive"),  # overlap too close to its null
    ((0.32, 0.11, 0.32, 0.0), "refuted"),       # P2's bounds, inclusive
    ((0.33, 0.05, 0.10, 0.0), "inconclusive"),
    ((0.10, 0.05, float("nan"), 0.0), "undetermined"),  # no value: undetermined (method §6.2)
])
def test_judge_boundaries(values, expected):
    names = ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap_excess")
    assert verdicts.judge("claim_v", dict(zip(names, values))).verdict == expected


def test_missing_metric_is_an_error():
    with pytest.raises(KeyError, match="kernel_cka"):
        verdicts.judge("claim_v", {"optimal_cosine": 1, "linear_cka": 1,
                                   "subspace_overlap_excess": 1})


def _layer_metrics(n_samples, n_heads, value, null, undetermined=None):
    m = {}
    for name in claim_v.METRICS:
        m[name] = torch.full((n_samples, n_heads), value, dtype=torch.float64)
        m[f"{name}_null"] = torch.full((n_samples, n_heads), null, dtype=torch.float64)
    m["relative_frobenius"] = torch.zeros(n_samples, n_heads, dtype=torch.float64)
    m["undetermined"] = (torch.zeros(n_samples, n_heads, dtype=torch.bool)
                         if undetermined is None else undetermined)
    m["mu_d"] = torch.ones(n_samples, n_heads, dtype=torch.float64)
    m["threshold"] = torch.zeros(n_samples, n_heads, dtype=torch.float64)
    return m


def test_head_record_supported_and_message():
    rec = claim_v.head_record("m", 1, 0, _layer_metrics(4, 2, 1.0, 0.3))
    assert rec["verdict"] == "supported" and rec["metrics"]["subspace_overlap_excess"] == 1.0
    rec = claim_v.head_record("m", 1, 0, _layer_metrics(4, 2, 0.1, 0.3))
    text = claim_v.message(rec, "m-L01-H0")
    assert rec["verdict"] == "refuted"
    assert "refuted" in text and "P2, as P2 states it" in text and "chance level 0.3" in text
    assert ">= 0.9" in text and "<= 0.11" in text


def test_undetermined_samples_are_excluded_then_the_head_is_undetermined():
    und = torch.zeros(4, 1, dtype=torch.bool)
    m = _layer_metrics(4, 1, 1.0, 0.3, und)
    m["optimal_cosine"][0, 0] = -5.0  # a round-off sample: must not enter the mean
    und[0, 0] = True
    rec = claim_v.head_record("m", 0, 0, m)
    assert rec["verdict"] == "supported" and rec["n_undetermined"] == 1 and rec["n_used"] == 3
    und[:3, 0] = True
    rec = claim_v.head_record("m", 0, 0, m)
    assert rec["verdict"] == "undetermined" and "mu_d" in claim_v.message(rec, "x")


def test_model_record_averages_over_layers_heads_samples():
    per_layer = {0: _layer_metrics(3, 2, 0.2, 0.3), 1: _layer_metrics(3, 2, 0.4, 0.3)}
    rec = claim_v.model_record("m", per_layer, [0, 1], {"refuted": 2, "inconclusive": 2})
    assert rec["level"] == "model"
    assert rec["metrics"]["optimal_cosine"] == pytest.approx(0.3)
    assert rec["n_samples"] == 12
