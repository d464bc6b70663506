"""Round-off twins and widths (method §13.2): a number that round-off decides carries how far
round-off moves it, measured by computing it again from inputs moved by round-off alone; a
determined number carries nothing; ``report diff`` and the goldens widen the tolerance of the
first kind only, by a declared factor."""

from __future__ import annotations

import copy

import pytest
import torch

from checks.gamma import gamma_spread_batched
from checks.gram import KeyGram
from checks.round_off import ROUND_OFF, relative_twin, value_twin_inputs
from checks.row_similarity import matched_cosine, matched_cosine_twin
from checks.value_vectors import DIRECTION_NAMES, METRIC_NAMES, value_vector_metrics_batched
from claims import round_off_widths as round_off
from claims.records import VRecord
from report import diff
from report.tolerances import ROUND_OFF_FACTOR, differences, round_off_widths

F64 = torch.float64
TOL = {"atol": 1e-5, "rtol": 1e-3}


def _keys(shape, seed=0, spread=1.0):
    return spread * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_a_twin_moves_every_element_by_round_off_of_itself_and_keeps_zeros():
    x = _keys((3, 5, 4))
    x[0, 0, 0] = 0.0
    twin = relative_twin(x, 1)
    rel = ((twin - x) / x.where(x != 0, torch.ones_like(x))).abs()
    assert twin[0, 0, 0] == 0.0 and 0 < float(rel.max()) < 10 * ROUND_OFF
    assert torch.equal(relative_twin(x, 1), twin)  # a fixed pattern
    # the pattern depends on the item's shape only, not on its batch: the same twin per item
    assert torch.equal(relative_twin(x[1:2], 1), twin[1:2])


def test_a_well_conditioned_head_has_twins_equal_to_its_metrics():
    """Keys with a spread-out spectrum and V = V̂: every metric is determined at float64."""
    k = _keys((2, 12, 4))
    v = KeyGram(k).kpca_values()
    m = value_vector_metrics_batched(k, v, round_off=True, **TOL)
    # the direction metrics have twins too: a direction at the shared bar is the machine's call
    for name in (*METRIC_NAMES, *DIRECTION_NAMES):
        for key in (name, f"{name}_null"):
            assert torch.allclose(m[f"twin_{key}"], m[key], rtol=1e-9, atol=1e-12), key
    assert torch.allclose(m["twin_optimal_cosine"], torch.ones(2, dtype=F64), atol=1e-9)


def test_twins_do_not_depend_on_how_samples_were_batched():
    k, v = _keys((3, 10, 4)), _keys((3, 10, 4), seed=1)
    both = value_vector_metrics_batched(k, v, round_off=True, null_seed=3, **TOL)
    for i in range(3):
        one = value_vector_metrics_batched(k[i:i + 1], v[i:i + 1], round_off=True, null_seed=3,
                                           null_axes=None, **TOL)
        assert torch.allclose(one["twin_subspace_overlap"][0], both["twin_subspace_overlap"][i],
                              rtol=0, atol=1e-13)
    k2, v2 = value_twin_inputs(k, v)
    assert not torch.equal(k2, k) and not torch.equal(v2, v)


def test_the_optimal_cosines_twin_follows_its_matching():
    cos = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.2, 0.1], [0.0, 0.3, 0.7]], dtype=F64)
    twin = cos + 1e-9 * torch.arange(9, dtype=F64).reshape(3, 3)
    value, moved = matched_cosine_twin(cos, twin)
    assert float(value) == pytest.approx(float(matched_cosine(cos)), abs=1e-15)
    # along the matching 0→1, 1→0, 2→2: entries 1, 3 and 8 of the added ramp
    assert float(moved - value) == pytest.approx(1e-9 * (1 + 3 + 8) / 3, rel=1e-6)


def test_a_span_that_round_off_decides_moves_its_twin():
    """Few tokens carry g (one key far longer than the rest): the learned span has directions
    at round-off and ρ of it moves under the twin; the eigen control's own twin is an
    eigenvector basis of the moved K̃, so its ρ (of span([A, h]), the value bias's direction h
    included, method §4.2) moves by round-off only."""
    k = _keys((12, 4), seed=2)
    v = _keys((12, 4), seed=3)
    calm = gamma_spread_batched(k, v, round_off=True)
    assert abs(float(calm["learned_subspace_twin"] - calm["learned_subspace"])) < 1e-12
    assert abs(float(calm["eigen_subspace_twin"] - calm["eigen_subspace"])) < 1e-12
    k_peaked = k.clone()
    k_peaked[0] *= 40.0  # exp(s·k_0·k_j) dwarfs the others: g spans hundreds of decades
    peaked = gamma_spread_batched(k_peaked, v, round_off=True)
    assert abs(float(peaked["eigen_subspace_twin"] - peaked["eigen_subspace"])) < 1e-12
    moved = abs(float(peaked["learned_subspace_twin"] - peaked["learned_subspace"]))
    assert moved > 1e-10 * float(peaked["learned_subspace"])


def test_widths_keep_only_numbers_that_moved_and_the_twins_verdict():
    rec = VRecord(claim="V", level="head", model="m", layer=0, head=0, verdict="refuted",
                  metrics={"optimal_cosine": 0.3, "kernel_cka": 0.5},
                  ci={"optimal_cosine": [0.29, 0.31]}, evidence="x")
    twin = copy.deepcopy(rec)
    twin.metrics["optimal_cosine"] = 0.3 + 1e-5
    twin.ci["optimal_cosine"] = [0.29, 0.31 + 2e-5]
    twin.metrics["kernel_cka"] = 0.5 * (1 + 1e-10)  # below MOVE_REL: determined
    out = round_off.attach(copy.deepcopy(rec), twin).to_json()
    assert out["round_off"] == {"metrics.optimal_cosine": pytest.approx(1e-5),
                                "ci.optimal_cosine[1]": pytest.approx(2e-5)}
    assert "round_off_verdict" not in out
    twin.verdict = "inconclusive"
    assert round_off.attach(copy.deepcopy(rec), twin).to_json()["round_off_verdict"] == \
        "inconclusive"
    assert "round_off" not in round_off.attach(copy.deepcopy(rec), None).to_json()


def test_twin_metrics_swap_in_the_twins_and_drop_them():
    m = {"x": 1, "twin_x": 2, "y": 3}
    assert round_off.twin_metrics(m) == {"x": 2, "y": 3}
    assert round_off.twin_metrics({"x": 1}) is None
    assert round_off.twin_layers({0: m, 1: {"x": 1}}) is None


def _record(value: float, width: float | None) -> dict:
    rec = {"claim": "V", "level": "head", "model": "m", "layer": 0, "head": 0,
           "test_id": "test_value_vectors[m-L00-H0]", "verdict": "refuted",
           "verdicts": {"ours": "refuted"}, "metrics": {"optimal_cosine": value},
           "ci": {"optimal_cosine": [value - 0.01, value + 0.01]},
           "vs_null": {"optimal_cosine": {"p": 0.01}}}
    if width is not None:
        rec["round_off"] = {"metrics.optimal_cosine": width}
    return rec


@pytest.mark.parametrize("times, agrees", [(0.5, True), (0.9 * ROUND_OFF_FACTOR, True),
                                           (1.5 * ROUND_OFF_FACTOR, False)])
def test_a_width_widens_every_number_of_its_metric_by_the_declared_factor(times, agrees):
    width = 1e-4
    ref = _record(0.3, width)
    run = _record(0.3 + times * width, None)  # the width of either record counts
    run["vs_null"]["optimal_cosine"]["p"] += times * width
    assert round_off_widths(run, ref) == {"optimal_cosine": width}
    assert (differences(run, ref) == []) is agrees
    assert (not differences(ref, run)) is agrees  # symmetric, whichever record carries it


def test_without_a_width_the_kinds_tolerance_still_holds():
    ref, run = _record(0.3, None), _record(0.3 * (1 + 1e-5), None)
    assert differences(run, ref) and differences(_record(0.3 * (1 + 1e-7), None), ref) == []
    # a width of another metric does not widen this one
    other = _record(0.3, None)
    other["round_off"] = {"metrics.kernel_cka": 1.0}
    assert differences(run, other)


def test_report_diff_applies_the_widths_and_ignores_them_as_results():
    base = {"schema": "kpca-claims/results/1", "provenance": {}, "options": {}, "thresholds": {},
            "models": {"m": {}}, "complete": True}
    ref = {**base, "records": [_record(0.3, 1e-4)]}
    near = {**base, "records": [_record(0.3 + 5e-4, 2e-4)]}  # widths differ: not a result
    far = {**base, "records": [_record(0.3 + 5e-2, 2e-4)]}
    assert diff.compare(near, ref).status == diff.REPRODUCES
    d = diff.compare(far, ref)
    assert d.status == diff.CHANGED and "round-off width" in d.outside[0]


@pytest.mark.parametrize("claim", ["V", "E"])
def test_derived_runs_skip_the_twins_under_their_own_cache_key(tmp_path, claim):
    """The main run's metrics carry twins; a specification or checkpoint run's do not (they feed
    summaries, never a diff), with every other number the same to the bit and cached apart, so
    neither reads the other's entry."""
    from fixtures.cache import Cache

    from tests._synthetic_run import SyntheticRun

    cache = Cache(str(tmp_path))
    main, derived = SyntheticRun(cache=cache), SyntheticRun(cache=cache, tag="step 45")
    assert main.round_off_twins and not derived.round_off_twins
    with_twins, without = main.layer_metrics(claim, 0), derived.layer_metrics(claim, 0)
    assert any(round_off.is_twin(n) for n in with_twins)
    assert not any(round_off.is_twin(n) for n in without)
    assert set(without) == {n for n in with_twins if not round_off.is_twin(n)}
    for name, value in without.items():
        assert torch.equal(value, with_twins[name]), name
    assert len(list((tmp_path / f"claim_{claim}").glob("*/metrics.safetensors"))) == 2
