"""Claim V's grid of the specification curve (method §14.1): one Gram matrix per (standardise,
dtype) for every (axis convention, null) pair, checked against the claim test's own computation
(claims/claim_v.py ``layer_metrics``) and against ``checks.value_vectors`` per head, an
independent route; and the optimal cosine's bounds, which decide a `p2` verdict only when both
ends give the same one."""

import dataclasses

import pytest
import torch

from checks.value_vectors import value_vector_metrics_batched
from claims import claim_e_layer, claim_v, claim_v_layer, verdicts
from claims import claim_v_curve as mv
from claims import claim_v_grid as fmv
from fixtures.engine.layer_context import LayerContext
from tests._synthetic_run import B, D, H, N, SyntheticRun

def _ctx(run, layer: int = 0) -> LayerContext:
    """The layer context the grid gets (as the curve's cached layers build it)."""
    return LayerContext(run, layer, run.prepare())


S, R, I, U = verdicts.SUPPORTED, verdicts.REFUTED, verdicts.INCONCLUSIVE, verdicts.UNDETERMINED
COMBOS = [(False, "float64"), (True, "float64"), (False, "float32")]


@pytest.fixture(scope="module")
def grids():
    run = SyntheticRun()
    bounded, errors = fmv.v_grid_layer(_ctx(run), COMBOS)
    matched = {}  # the bounds replaced by the matched values, as specification_curve does
    for std, dtype in COMBOS:
        exact = fmv.v_matched_layer(_ctx(run), std, dtype)
        for conv in ("p2", "kpca"):
            for null in fmv.NULLS:
                key = fmv.combo_key(std, dtype, conv, null)
                matched[key] = mv.with_matched(bounded[key], {
                    "optimal_cosine": exact[conv],
                    "optimal_cosine_null": exact[conv if null == "token-shuffled" else "random-basis"]})
    main = claim_v_layer.layer_metrics(LayerContext(run, 0, run.prepare()))
    assert not errors
    return run, bounded, matched, main


def test_the_default_combination_equals_the_claim_tests_own_metrics(grids):
    _run, bounded, matched, main = grids
    key = fmv.combo_key(False, "float64", "p2", "token-shuffled")
    for name, t in main.items():
        if name.startswith(("p2code_", "twin_")) or name == "threshold":  # never judged,
            continue  # or the round-off twins (method §13.2): the grid has neither
        assert torch.allclose(matched[key][name].to(torch.float64), t.to(torch.float64),
                              atol=1e-12, rtol=0), name
    exact = main["optimal_cosine"]
    lo, hi = bounded[key]["optimal_cosine"], bounded[key]["optimal_cosine_hi"]
    assert bool((lo <= exact + 1e-12).all()) and bool((exact <= hi + 1e-12).all())
    assert torch.allclose(lo, main["direct_cosine"], atol=1e-12)  # the identity matching
    assert bool((hi < lo + 1e-9).sum() < hi.numel())  # the bounds are not all tight


@pytest.mark.parametrize("std,dtype", COMBOS)
def test_the_matching_sees_the_suites_own_cosine_matrices(grids, std, dtype):
    """v_matched_layer's optimal cosines are bit for bit the matching of the cosine matrices of
    the grid's metric suite (the same targets), per convention and for the random-basis null."""
    from checks import metric_suite, row_similarity
    from checks.gram import KeyGram

    run = grids[0]
    tdtype = {"float64": torch.float64, "float32": torch.float32}[dtype]
    got = fmv.v_matched_layer(_ctx(run), std, dtype)
    info = run.prepare()
    for chunk, heads, k, v, perm, a0 in fmv._v_batches(_ctx(run)):
        gram = KeyGram(k, scale=info["scale"], standardize=std, dtype=tdtype, top=D)
        vv, targets = fmv._v_targets(info, gram, k, v, a0, tdtype)
        _suite, cos = metric_suite.metric_suite(vv, targets, **verdicts.allclose_tolerance())
        for ti, name in enumerate(fmv.TARGETS):
            want = torch.stack([row_similarity.matched_cosine(c) for c in cos[ti]]).to(torch.float64)
            assert torch.equal(got[name][chunk, heads], want), name
    assert not torch.equal(got["p2"], got["random-basis"])


@pytest.mark.parametrize("std,dtype", COMBOS)
@pytest.mark.parametrize("conv", ["p2", "kpca"])
def test_each_combination_equals_value_vector_metrics_per_head(grids, std, dtype, conv):
    run, _bounded, matched, _main = grids
    data = run.layer_qkv(0)
    tol = verdicts.allclose_tolerance()
    tdtype = {"float64": torch.float64, "float32": torch.float32}[dtype]
    atol = 1e-10 if dtype == "float64" else 2e-4
    for b in (0, 5):
        n = int(data["token_mask"][b].sum())
        for h in range(H):
            k, v = data["k"][b, h, :n], data["v"][b, h, :n]
            a0 = fmv.random_basis_axes(lambda h: f"synthetic-L00-H{h}", slice(h, h + 1), [b], n, min(n, D), H)[0, 0]
            ref = value_vector_metrics_batched(k, v, standardize=std, convention=conv,
                                               null_axes=a0, dtype=tdtype, **tol)
            got = matched[fmv.combo_key(std, dtype, conv, "random-basis")]
            for name in ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap",
                         "subspace_overlap_null", "linear_cka_null", "kernel_cka_null",
                         "optimal_cosine_null", "direct_cosine", "pearson"):
                assert float(got[name][b, h]) == pytest.approx(float(ref[name]), abs=atol), name


def test_the_two_nulls_differ_and_the_convention_leaves_the_overlap_alone(grids):
    _run, _bounded, matched, _main = grids
    tok = matched[fmv.combo_key(False, "float64", "p2", "token-shuffled")]
    rnd = matched[fmv.combo_key(False, "float64", "p2", "random-basis")]
    kpca = matched[fmv.combo_key(False, "float64", "kpca", "token-shuffled")]
    assert not torch.allclose(tok["subspace_overlap_null"], rnd["subspace_overlap_null"])
    assert torch.equal(tok["subspace_overlap"], rnd["subspace_overlap"])  # V vs V̂: no null in it
    # span(V̂) does not change when its columns are rescaled (a_m vs a_m/√μ_m)
    assert torch.allclose(tok["subspace_overlap"], kpca["subspace_overlap"], atol=1e-10)
    assert not torch.allclose(tok["linear_cka"], kpca["linear_cka"])


def _layer(oc_lo: float, oc_hi: float, lin: float, ker: float) -> dict:
    """A synthetic claim-V layer ([B, H] tensors) with the given means and no spread."""
    full = lambda x: torch.full((B, H), float(x), dtype=torch.float64)  # noqa: E731
    out = {name: full(0.3) for m in claim_v.METRICS for name in (m, f"{m}_null")}
    out.update({"linear_cka": full(lin), "kernel_cka": full(ker), "optimal_cosine": full(oc_lo),
                "optimal_cosine_null": full(oc_lo), "optimal_cosine_hi": full(oc_hi),
                "optimal_cosine_null_hi": full(oc_hi), "subspace_overlap": full(0.40),
                "subspace_overlap_null": full(0.40),
                "undetermined": torch.zeros(B, H, dtype=torch.bool),
                "mu_d": full(1.0), "threshold": full(1e-12), "effective_rows": full(N),
                "n_tokens": full(N), "few_tokens": torch.zeros(B, H, dtype=torch.bool)})
    out["subspace_overlap"][::2] += 0.01  # some spread, so the tests against chance run
    out["subspace_overlap"][1::2] -= 0.01
    return out


def test_bounds_that_give_one_p2_verdict_give_it_without_matching():
    # linear CKA above P2's refute bar (0.11): p2 cannot refute, and cannot support below 0.9,
    # whatever the optimal cosine is
    per_layer = {0: _layer(0.0, 0.95, lin=0.5, ker=0.5)}
    out = mv.v_outcomes_bounded("m", per_layer, [0, 1], "ours")
    assert out is not None
    assert out["model"]["verdicts"]["p2"] == I
    assert out["model"]["metrics"]["optimal_cosine"] is None
    assert out["model"]["optimal_cosine_bounds"] == pytest.approx([0.0, 0.95])
    # the verdicts are those of the exact records at any value between the bounds
    for oc in (0.0, 0.5, 0.95):
        exact = mv.v_outcomes("m", {0: {n: t for n, t in _layer(oc, oc, 0.5, 0.5).items()
                                        if n not in mv.V_UPPER.values()}}, [0, 1], "ours")
        assert exact["model"]["verdicts"] == out["model"]["verdicts"]
        assert [u["verdicts"] for u in exact["units"].values()] == \
            [u["verdicts"] for u in out["units"].values()]


def test_bounds_that_straddle_a_p2_bar_ask_for_the_matching():
    # CKAs below P2's refute bars: p2 refutes when the optimal cosine is <= 0.32, not above
    assert mv.v_outcomes_bounded("m", {0: _layer(0.1, 0.6, lin=0.05, ker=0.1)}, [0, 1],
                                 "ours") is None
    both_below = mv.v_outcomes_bounded("m", {0: _layer(0.1, 0.3, lin=0.05, ker=0.1)}, [0, 1],
                                       "ours")
    assert both_below is not None and both_below["model"]["verdicts"]["p2"] == R
    assert all(u["verdicts"]["p2"] == R for u in both_below["units"].values())


def test_only_the_heads_whose_p2_verdict_straddles_are_matched():
    """A unit whose bounds straddle a p2 bar is open; the others and the model are decided by the
    bounds. Matching just the open head (its exact value as both bounds) decides every verdict,
    and they equal the records built on the exact values of every head."""
    layer = _layer(0.1, 0.2, lin=0.05, ker=0.1)  # both bounds <= 0.32: p2 refutes
    layer["optimal_cosine_hi"][:, 1] = 0.4  # head 1 straddles P2's refute bar; the model
    layer["optimal_cosine_null_hi"][:, 1] = 0.4  # (mean of the heads, at most 0.3) does not
    outcome, open_units = mv.v_bounded("m", {0: layer}, [0, 1], "ours")
    assert open_units == [(0, 1)] and outcome is not None
    assert mv.v_outcomes_bounded("m", {0: layer}, [0, 1], "ours") is None
    for oc, verdict in ((0.2, R), (0.35, I)):  # the open head's exact value decides its verdict
        exact = {"optimal_cosine": torch.full((B, H), oc, dtype=torch.float64),
                 "optimal_cosine_null": torch.full((B, H), oc, dtype=torch.float64)}
        partial = mv.with_matched(layer, exact, [1])
        assert torch.equal(partial["optimal_cosine"][:, 0], layer["optimal_cosine"][:, 0])
        assert torch.equal(partial["optimal_cosine_hi"][:, 1], exact["optimal_cosine"][:, 1])
        got, still_open = mv.v_bounded("m", {0: partial}, [0, 1], "ours")
        assert still_open == []
        assert got["units"]["L00-H1"]["verdicts"]["p2"] == verdict
        assert got["units"]["L00-H0"]["verdicts"]["p2"] == R
        # the same verdicts as the records on exact values everywhere (head 0 anywhere in its bounds)
        for oc0 in (0.1, 0.2):
            full = {n: t.clone() for n, t in layer.items() if n not in mv.V_UPPER.values()}
            full["optimal_cosine"][:, 0], full["optimal_cosine"][:, 1] = oc0, oc
            ref = mv.v_outcomes("m", {0: full}, [0, 1], "ours")
            assert [u["verdicts"] for u in ref["units"].values()] == \
                [u["verdicts"] for u in got["units"].values()]
            assert ref["model"]["verdicts"] == got["model"]["verdicts"]


def test_a_straddling_model_verdict_asks_for_every_head():
    # both heads straddle, and so does the model's mean: no partial matching can decide it
    outcome, open_units = mv.v_bounded("m", {0: _layer(0.1, 0.6, lin=0.05, ker=0.1)}, [0, 1],
                                       "ours")
    assert outcome is None and open_units is None


def test_partial_matching_gives_the_full_matchings_values_for_its_heads():
    run = SyntheticRun()
    full = fmv.v_matched_layer(_ctx(run), False, "float64")
    part = fmv.v_matched_layer(_ctx(run), False, "float64", heads=[1])
    for name in fmv.TARGETS:
        assert torch.isnan(part[name][:, 0]).all()
        torch.testing.assert_close(part[name][:, 1], full[name][:, 1], rtol=0, atol=1e-12)


def test_a_float32_failure_is_an_error_of_that_combination_only():
    run = SyntheticRun()
    # keys beyond the float32 range (a capture in float64): the float32 route cannot hold them
    run._data = {**run._data, "k": run._data["k"].to(torch.float64) * 1e39}
    metrics, errors = fmv.v_grid_layer(_ctx(run), COMBOS)
    assert (False, "float32") in errors and "synthetic" in errors[(False, "float32")]
    assert fmv.combo_key(False, "float64", "p2", "random-basis") in metrics
    assert not any("dtype=float32" in key for key in metrics)


def test_the_undetermined_flag_skips_lanczos_only_where_the_row_sum_bound_decides(monkeypatch):
    from checks import gram as gram_module
    from checks.gram import KeyGram

    g = torch.Generator().manual_seed(1)
    k = torch.randn(3, 2, 10, 4, generator=g, dtype=torch.float64)
    k[0, 0] = k[0, 0, :1].expand(10, 4)  # one repeated key: rank 1, μ_d at round-off
    k[1, 1, :, 1:] = 0.0  # keys on a line: a fast-decaying spectrum, decided by the bound
    estimated = []
    real = gram_module.undetermined_threshold
    monkeypatch.setattr(gram_module, "undetermined_threshold",
                        lambda unit: estimated.append(unit.shape[0]) or real(unit))
    for dtype in (torch.float64, torch.float32):
        estimated.clear()
        fast = KeyGram(k, dtype=dtype, top=4).undetermined
        assert len(estimated) == 1 and 1 <= estimated[0] < 6  # Lanczos only where undecided
        full = KeyGram(k, dtype=dtype, top=4)
        full.threshold  # the estimate of every item first: the decision of the method's rule
        assert torch.equal(fast, full.undetermined)
        assert bool(fast[0, 0]) and not bool(fast[2, 0])
    estimated.clear()
    assert not bool(KeyGram(k[2:], top=4).undetermined.any()) and estimated == []
    short = KeyGram(k[..., :3, :], top=4)  # N = 3 < d = 4: never determined
    assert bool(short.undetermined.all())


def test_a_specifications_claim_j_takes_v_hat_from_the_grid_with_the_same_bits_as_its_own():
    """A specification's claim J takes V̂ from claim V's grid (one batched eigendecomposition per
    batch) instead of its own: the same bits as computing that batched V̂ itself (a grid
    read back from the cache leaves none behind), each batch's V̂ taken out of the store, and
    the claim tests' route's numbers to round-off."""
    from fixtures.engine.model_run import ModelRun

    def j_run(store):
        run = SyntheticRun(tag="specification std=on")
        run._info = {**run._info, "scale": 0.5}
        run.options = dataclasses.replace(run.options, standardize=True)
        run.shared = None if store is None else {"v_hat": store}
        return run

    store: dict = {}
    grid_run = j_run(None)
    fmv.v_grid_layer(_ctx(grid_run), [(True, "float64"), (False, "float64")],
                     v_hat_out=lambda key, values: store.update(
                         {key: values[(True, "float64")]} if (True, "float64") in values else {}),
                     convention="p2")
    assert len(store) == 2  # one V̂ per batch (two token counts), only for the asked combination
    shared = j_run(store).compute_layer("J", 0)
    assert store == {}  # taken out as used
    own_batched = j_run({}).compute_layer("J", 0)
    per_head = j_run(None).compute_layer("J", 0)
    assert set(shared) == set(per_head)
    for name, value in shared.items():
        torch.testing.assert_close(value, own_batched[name], rtol=0, atol=0, equal_nan=True,
                                   msg=name)
        torch.testing.assert_close(value, per_head[name], rtol=1e-9, atol=1e-12, equal_nan=True,
                                   msg=name)
    assert ModelRun.shared is None  # the claim tests' runs: the fit computes its own V̂


@pytest.mark.parametrize("standardize", [False, True])
def test_a_specifications_claim_e_takes_its_values_from_the_grid_with_the_same_bits_as_its_own(
        standardize):
    """A specification's claim E takes each batch's values from claim V's grid of its padding
    (the grid's two float64 Gram matrices: one eigendecomposition per key route, shared with
    claim V): the same bits as computing them itself from the same Grams (a grid read back from
    the cache leaves none behind), each batch taken out of the store, and the claim test's own
    route (the other route's eigenvalues from ``eigvalsh``) to round-off."""
    from fixtures.engine.model_run import ModelRun

    def e_run(store):
        run = SyntheticRun(tag="specification std=" + ("on" if standardize else "off"))
        run._info = {**run._info, "scale": 0.5}
        run.options = dataclasses.replace(run.options, standardize=standardize)
        run.shared = None if store is None else {"grams": store}
        return run

    store: dict = {}
    fmv.v_grid_layer(_ctx(e_run(None)), COMBOS, offer_grams=lambda key, payload: store.update(
        {key: claim_e_layer.values_from_grams(payload, [(standardize,)])[(standardize,)]}))
    assert len(store) == 2  # one entry per batch (two token counts)
    shared = e_run(store).compute_layer("E", 0)
    assert store == {}  # taken out as used
    own = e_run({}).compute_layer("E", 0)
    claim_test = e_run(None).compute_layer("E", 0)
    assert set(shared) == set(own) and "gamma_learned" in shared and "mu_log_raw" in shared
    assert not any(name.startswith("twin_") for name in shared)  # a specification: no twins
    for name, value in shared.items():
        torch.testing.assert_close(value, own[name], rtol=0, atol=0, equal_nan=True, msg=name)
        torch.testing.assert_close(value, claim_test[name], rtol=1e-9, atol=1e-12,
                                   equal_nan=True, msg=name)
    assert ModelRun.shared is None  # the claim tests' runs: claim E computes its own


def test_the_grid_leaves_claim_e_alone_without_both_float64_grams():
    store: dict = {}
    fmv.v_grid_layer(_ctx(SyntheticRun()), [(False, "float64"), (False, "float32")],
                     offer_grams=lambda key, payload: store.update({key: payload}))
    assert store == {}  # claim E needs the raw and the standardised Gram: it computes its own
