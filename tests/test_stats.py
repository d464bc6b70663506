"""Statistics of the verdicts (method §7): bootstrap CIs, the test against chance, the two rule
sets, and the p2-code variant (method §8), each against a known answer."""

import json
import math
from pathlib import Path

import pytest
import torch

from checks import stats
from checks.gram import KeyGram
from checks.p2_code import p2_code_metrics, p2_code_values
from checks.row_similarity import direct_cosine
from checks.value_vectors import value_vector_metrics_batched
from claims import chance, claim_v, claim_v_chance, verdicts

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]


# ----------------------------------------------------------------------------- bootstrap
def test_bootstrap_ci_of_a_known_variance_mean_covers_the_true_mean_about_95_percent():
    """200 data sets of 40 draws from N(2, 1): the 95% percentile CI covers 2 in ~95% of them."""
    gen = torch.Generator().manual_seed(11)
    data = 2.0 + torch.randn(200, 40, generator=gen, dtype=torch.float64)
    covered = 0
    for rep in range(200):
        _, (lo, hi) = stats.bootstrap_mean_ci(data[rep], seed=rep)
        covered += int(lo <= 2.0 <= hi)
    # percentile intervals run slightly short at n = 40 (≈ 93-94%); 200 reps: sd ≈ 1.6%
    assert 0.89 <= covered / 200 <= 0.98


def test_an_interval_of_infinite_draws_is_infinite_not_nan():
    draws = torch.tensor([[math.inf, 1.0], [math.inf, 2.0], [math.inf, math.inf]])
    ci = stats.percentile_interval(draws)
    assert ci[0].tolist() == [math.inf, math.inf]
    assert ci[1, 0] > 1.0 and math.isinf(float(ci[1, 1]))


def test_bootstrap_is_reproducible_and_keeps_a_samples_units_together():
    sums = torch.tensor([[2.0], [4.0], [0.0]])
    counts = torch.tensor([2.0, 2.0, 0.0])  # sample 2 has no kept unit
    d1, ci1 = stats.bootstrap_ratio_ci(sums, counts, seed=5)
    d2, ci2 = stats.bootstrap_ratio_ci(sums, counts, seed=5)
    assert torch.equal(ci1, ci2)
    finite = d1[~torch.isnan(d1)]
    assert float(finite.min()) >= 1.0 and float(finite.max()) <= 2.0  # pooled means of 1 and 2
    assert float(ci1[0, 0]) == pytest.approx(1.0) and float(ci1[0, 1]) == pytest.approx(2.0)


# ------------------------------------------------------------------------ test vs chance
@pytest.mark.parametrize("n_samples", [10, 30])  # exact enumeration, Monte Carlo
def test_sign_flip_test_is_calibrated_when_v_is_no_closer_than_chance(n_samples):
    """200 synthetic heads whose metric and null are exchangeable (a random V is as close to V̂
    as to a random basis), 4 metrics each, every head with its own seed: the false-positive rate
    at alpha = 0.05 lies in [0.02, 0.08] (and p is roughly uniform)."""
    torch.manual_seed(n_samples)  # Beta.sample draws from the global generator
    ps = []
    for head in range(200):
        pair = torch.distributions.Beta(2.0, 5.0).sample((2, n_samples, 1, 4))  # skewed metric
        metrics = {}
        for i, m in enumerate(claim_v_chance.CHANCE_METRICS):
            metrics[m], metrics[f"{m}_null"] = pair[0, :, :, i], pair[1, :, :, i]
        keep = torch.ones(n_samples, 1, dtype=torch.bool)
        ps.append(claim_v_chance.chance_pvalues(metrics, keep, seed=head + 1000 * n_samples)[0])
    p = torch.cat(ps)
    assert 0.02 <= float((p < 0.05).to(torch.float64).mean()) <= 0.08
    assert 0.14 <= float((p < 0.2).to(torch.float64).mean()) <= 0.26


def test_sign_flip_exact_p_and_monte_carlo_floor():
    d = torch.ones(6, 1)  # every sample above its null
    assert float(stats.sign_flip_pvalues(d, None, 0)) == pytest.approx(2 ** -6)
    d = torch.ones(40, 1)
    assert float(stats.sign_flip_pvalues(d, None, 0, resamples=999)) == pytest.approx(1 / 1000)
    d = -torch.ones(6, 1)  # every sample below: p = 1
    assert float(stats.sign_flip_pvalues(d, None, 0)) == pytest.approx(1.0)


def test_holm_and_bh_adjustments():
    p = torch.tensor([0.01, 0.04, 0.03, 0.5])
    assert torch.allclose(stats.adjust_pvalues(p, "holm"), torch.tensor([0.04, 0.09, 0.09, 0.5],
                                                                        dtype=torch.float64))
    assert torch.allclose(stats.adjust_pvalues(p, "bh"),
                          torch.tensor([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5], dtype=torch.float64))
    from scipy.stats import false_discovery_control

    rand = torch.rand(3, 50, generator=torch.Generator().manual_seed(2), dtype=torch.float64) ** 3
    assert torch.allclose(stats.adjust_pvalues(rand, "bh"),
                          torch.from_numpy(false_discovery_control(rand.numpy(), axis=-1)))
    with pytest.raises(ValueError, match="unknown correction"):
        stats.adjust_pvalues(p, "bonferroni-ish")


# --------------------------------------------------------------------- known-answer heads
def _layer_dict(k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """Claim-V metrics of one head over samples, shaped as a layer dict [S, 1] (session layout)."""
    s, n, d = k.shape
    a0 = torch.linalg.qr(torch.randn(s, n, d, generator=torch.Generator().manual_seed(3),
                                     dtype=torch.float64)).Q
    m = value_vector_metrics_batched(k, v, null_axes=a0, **verdicts.allclose_tolerance())
    p2 = p2_code_metrics(k, v)
    m.update({f"p2code_{name}": p2[name] for name in claim_v.P2_CODE_METRICS})
    m["n_tokens"] = torch.full((s,), float(n))
    m["few_tokens"] = torch.zeros(s, dtype=torch.bool)
    return {name: t.reshape(s, 1) for name, t in m.items()}


def test_per_model_statistics_live_in_the_callers_cache_not_in_the_process():
    """claim V's tests against chance across a model's heads are kept where the caller says (a
    model run's ``statistics``), computed once there; without one they are computed afresh."""
    from claims import claim_e, claim_e_gamma_stats

    gen = torch.Generator().manual_seed(1)
    k = torch.randn(6, 12, 4, generator=gen, dtype=torch.float64)
    layer = _layer_dict(k, torch.randn(6, 12, 4, generator=gen, dtype=torch.float64))
    cache: dict = {}
    first = claim_v.head_statistics("m", {0: layer}, [0], cache)
    assert claim_v.head_statistics("m", {0: layer}, [0], cache) is first and len(cache) == 1
    fresh = claim_v.head_statistics("m", {0: layer}, [0])
    assert fresh is not first and fresh == first
    other = {0: {name: t.clone() for name, t in layer.items()}}
    assert claim_v.head_statistics("m", other, [0]) == first  # equal tensors, same statistics
    assert not [n for n in (*vars(claim_v), *vars(claim_e), *vars(claim_e_gamma_stats))
                if n.endswith("_CACHE")]


def test_a_head_whose_v_is_v_hat_is_supported_with_its_ci_at_one_and_above_chance():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(8, 24, 4, generator=gen, dtype=torch.float64)
    v = KeyGram(k, top=4).kpca_values("p2")  # V = V̂ exactly
    layer = _layer_dict(k, v)
    batch = claim_v.head_statistics("synthetic", {0: layer}, [0])
    rec = claim_v.head_record("synthetic", 0, 0, layer, statistics=batch[(0, 0)])
    alone = claim_v.head_record("synthetic", 0, 0, layer)  # same resamples: same intervals
    assert alone["ci"] == rec["ci"] and alone["vs_null"] == rec["vs_null"]
    for metric in ("optimal_cosine", "linear_cka", "kernel_cka", "subspace_overlap"):
        lo, hi = rec["ci"][metric]
        assert lo == pytest.approx(1.0, abs=1e-9) and hi == pytest.approx(1.0, abs=1e-9)
    for metric in claim_v_chance.CHANCE_METRICS:  # the optimal cosine ignores token order: no test
        assert rec["vs_null"][metric]["above_chance"]
        assert rec["vs_null"][metric]["p"] == pytest.approx(2 ** -8)
        assert rec["vs_null"][metric]["at_chance"] is False
    assert rec["verdicts"] == {"p2": "supported", "ours": "supported"}
    assert rec["verdict"] == "supported" and rec["rules"] == "ours"
    assert set(rec["ci_null"]) == set(claim_v.METRICS)


def test_a_head_with_random_v_is_refuted_by_ours_and_not_by_p2():
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(12, 24, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(12, 24, 4, generator=gen, dtype=torch.float64)
    layer = _layer_dict(k, v)
    rec = claim_v.head_record("synthetic", 0, 0, layer, rules="p2")
    assert rec["verdicts"]["ours"] == "refuted"
    assert rec["verdict"] == rec["verdicts"]["p2"]  # --rules p2 picks P2's verdict
    assert all(rec["ci"][m][1] < 0.9 for m in ("optimal_cosine", "linear_cka", "kernel_cka"))


# --------------------------------------------------------------------------- rule sets
METRICS = {"optimal_cosine": 0.5, "linear_cka": 0.5, "kernel_cka": 0.5,
           "subspace_overlap_excess": 0.6}


def _ci(lo, hi):
    return {m: [lo, hi] for m in METRICS}


def test_p2_rule_set_is_unchanged_and_ours_is_named_with_sources():
    data = verdicts.load_thresholds()
    assert data["rule_sets"]["default"] == "ours"
    assert {"p2", "ours"} <= set(data["rule_sets"])
    assert all(data["rule_sets"][r]["source"] for r in ("p2", "ours"))
    assert [r.value for r in verdicts.rules("claim_v", "refuted")] == [0.32, 0.11, 0.32]


def test_ours_supported_needs_the_lower_bound_to_pass_the_overlap_bar():
    good = {**METRICS, "optimal_cosine": 0.95, "linear_cka": 0.95, "kernel_cka": 0.95,
            "subspace_overlap_excess": 0.95}
    assert verdicts.judge_ours("claim_v", good, _ci(0.91, 0.99)).verdict == "supported"
    assert verdicts.judge_ours("claim_v", good, _ci(0.85, 0.99)).verdict == "inconclusive"
    assert verdicts.judge("claim_v", good).verdict == "supported"  # p2 judges the means


def test_ours_refutes_at_chance_or_below_the_refuted_bar_never_for_not_above_chance():
    not_above = {m: False for m in ("linear_cka", "kernel_cka", "subspace_overlap")}
    # "not above chance" alone is no evidence of absence (method §7.2)
    assert verdicts.judge_ours("claim_v", METRICS, _ci(0.4, 0.95), not_above).verdict == "inconclusive"
    v = verdicts.judge_ours("claim_v", METRICS, _ci(0.4, 0.95), not_above,
                            at_chance={"subspace_overlap": True})
    assert v.verdict == "refuted" and "at chance" in v.reason
    assert verdicts.judge_ours("claim_v", METRICS, _ci(0.4, 0.5)).verdict == "refuted"
    assert verdicts.judge("claim_v", METRICS).verdict == "inconclusive"


def test_judge_both_reports_both_and_picks_by_rules():
    chosen, both = verdicts.judge_both("claim_v", METRICS, _ci(0.4, 0.5), rules_name="p2")
    assert both == {"p2": "inconclusive", "ours": "refuted"} and chosen.verdict == "inconclusive"
    with pytest.raises(ValueError, match="unknown rule set"):
        verdicts.judge_both("claim_v", METRICS, None, rules_name="strict")


def test_evidence_prints_value_and_interval():
    v = verdicts.judge("claim_v", METRICS)
    text = verdicts.format_evidence(v, ci=_ci(0.41, 0.62))
    assert "0.5 [0.41, 0.62]" in text


def test_too_few_samples_cannot_refute_by_chance_alone():
    assert chance.smallest_p(4) == pytest.approx(0.0625)
    p = torch.full((4,), 0.0625)
    rec = claim_v_chance.vs_null_record(p, p, 4, p, p)
    assert not any(t["can_reject"] for t in rec.values())


# ----------------------------------------------------------------------------- p2-code
def _keys_with_g(log10_g: float, n: int = 10, d: int = 16) -> torch.Tensor:
    """Keys whose normalisers g_j = Σ_m exp(s k_jᵀk_m) sit near 10**log10_g (scale s = 1)."""
    gen = torch.Generator().manual_seed(7)
    k = torch.linalg.qr(torch.randn(d, n, generator=gen, dtype=torch.float64)).Q.T  # orthonormal rows
    return k * (log10_g * 2.302585) ** 0.5  # s‖k_j‖² = ln g, cross terms 0


@pytest.mark.parametrize("log10_g, affected", [(9.0, True), (3.0, False)])
def test_p2_code_row_epsilon_pulls_cosines_of_tiny_v_hat_rows_to_zero(log10_g, affected):
    """A hand-built head with g ≈ 1e9: ‖v̂_j‖ ≈ 1e-10, so x/(‖x‖ + 1e-8) shrinks V̂'s unit rows
    ~100-fold and the direct cosine of V = g·V̂ (exactly 1) collapses; with g ≈ 1e3 it stays 1."""
    k = _keys_with_g(log10_g)
    v_hat, log_g = p2_code_values(k, scale=1.0)
    assert float(log_g.mean()) / 2.302585 == pytest.approx(log10_g, abs=0.05)
    v = (v_hat.to(torch.float64) * torch.exp(log_g).unsqueeze(-1))  # rows of norm ~1, same directions
    exact = float(direct_cosine(v, v_hat.to(torch.float64)))
    p2 = p2_code_metrics(k, v, scale=1.0)
    assert exact == pytest.approx(1.0, abs=1e-5)
    if affected:
        assert float(p2["direct_cosine"]) < 0.2
        assert float(p2["optimal_cosine"]) < 0.2
    else:
        assert float(p2["direct_cosine"]) == pytest.approx(1.0, abs=1e-3)
        assert float(p2["optimal_cosine"]) == pytest.approx(1.0, abs=1e-3)


# ---------------------------------------------------------------- serial vs -n 2, --rules
def _run(pytester, ckpt: Path, out: Path, *extra: str):
    return pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--checkpoint", str(ckpt), "--arch", "vit_tiny_patch16_224", "--layers", "0",
        "--heads", "0,1", "--n-samples", "6", "-k", "value_vectors", "--threads", "1",
        "--out", str(out), "--cache-dir", str(out.parent / "cache"), *extra, timeout=600)


@pytest.mark.slow
def test_serial_and_xdist_give_identical_cis_and_rules_picks_the_verdict(pytester, tiny_checkpoint,
                                                                        tmp_path):
    """--rules picks which of the two verdicts a record judges by and changes neither. (Serial
    and -n 2 give identical records, CIs, tests against chance and both verdicts included, to the
    bit: tests/test_end_to_end.py::test_serial_and_xdist_runs_give_identical_records, each run
    with its own cache; this test made a third such run.)"""
    serial = _run(pytester, tiny_checkpoint, tmp_path / "serial")
    p2 = _run(pytester, tiny_checkpoint, tmp_path / "p2", "--rules", "p2")
    for run in (serial, p2):
        assert run.ret in (0, 1), run.stdout.str()[-3000:]
    a, c = ({r["test_id"]: r for r in json.loads((tmp_path / d / "results.json").read_text())["records"]}
            for d in ("serial", "p2"))
    assert set(a) == set(c) and len(a) == 3
    for tid in a:
        assert a[tid]["ci"] == c[tid]["ci"] and a[tid]["vs_null"] == c[tid]["vs_null"]
        assert a[tid]["verdicts"] == c[tid]["verdicts"]
        assert a[tid]["verdict"] == a[tid]["verdicts"]["ours"] and a[tid]["options"]["rules"] == "ours"
        assert c[tid]["verdict"] == c[tid]["verdicts"]["p2"] and c[tid]["options"]["rules"] == "p2"
        assert set(a[tid]["p2_code"]) == set(claim_v.P2_CODE_METRICS)


def test_an_undetermined_head_still_carries_its_intervals_and_test():
    gen = torch.Generator().manual_seed(4)
    k = torch.randn(6, 24, 4, generator=gen, dtype=torch.float64)
    layer = _layer_dict(k, torch.randn(6, 24, 4, generator=gen, dtype=torch.float64))
    layer["undetermined"] = torch.ones(6, 1, dtype=torch.bool)
    rec = claim_v.head_record("synthetic", 0, 0, layer,
                              statistics=claim_v.head_statistics("synthetic", {0: layer}, [0])[(0, 0)])
    assert rec["verdict"] == "undetermined"
    assert rec["verdicts"] == {"p2": "undetermined", "ours": "undetermined"}
    assert set(rec["ci"]) >= {"optimal_cosine", "linear_cka", "kernel_cka"} and "vs_null" in rec


# -------------------------------------------------- p2-code on a seeded subset (method §8.3)
def test_p2_code_subset_is_every_sample_up_to_its_size_then_a_seeded_draw():
    from checks.p2_code import P2_CODE_SAMPLES, p2_code_subset

    assert p2_code_subset(P2_CODE_SAMPLES, "m").all()
    mask = p2_code_subset(100, "m")
    assert int(mask.sum()) == P2_CODE_SAMPLES and torch.equal(mask, p2_code_subset(100, "m"))
    assert not torch.equal(mask, p2_code_subset(100, "another model"))
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="n_samples must be"):
            p2_code_subset(bad, "m")


def test_p2_code_metrics_on_rows_equal_the_whole_batch_there_and_are_nan_elsewhere():
    from checks.p2_code import p2_code_metrics_on
    from checks.row_similarity import matched_cosine

    gen = torch.Generator().manual_seed(5)
    k, v = (torch.randn(4, 2, 12, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    whole = p2_code_metrics(k, v)
    part, cos = p2_code_metrics_on(k, v, [1, 3])
    assert len(cos) == 2 and tuple(cos[0].shape) == (2, 12, 12)
    for name in ("direct_cosine", "pearson"):
        assert part[name][[0, 2]].isnan().all()
        torch.testing.assert_close(part[name][[1, 3]], whole[name][[1, 3]], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.stack([matched_cosine(c) for c in cos]),
                               whole["optimal_cosine"][[1, 3]], rtol=1e-6, atol=1e-7)
    empty, none = p2_code_metrics_on(k, v, [])
    assert none == [] and empty["pearson"].isnan().all() and tuple(empty["pearson"].shape) == (4, 2)


def test_p2_code_on_a_subset_is_recorded_with_its_units_and_the_exact_means_there():
    gen = torch.Generator().manual_seed(6)
    k = torch.randn(8, 24, 4, generator=gen, dtype=torch.float64)
    layer = _layer_dict(k, torch.randn(8, 24, 4, generator=gen, dtype=torch.float64))
    full = claim_v.head_record("synthetic", 0, 0, layer)
    assert "p2_code_units" not in full and "p2_code_exact" not in full  # every sample: as before
    subset = [0, 3, 5]
    for name in claim_v.P2_CODE_METRICS:
        t = torch.full_like(layer[f"p2code_{name}"], float("nan"))
        t[subset] = layer[f"p2code_{name}"][subset]
        layer[f"p2code_{name}"] = t
    rec = claim_v.head_record("synthetic", 0, 0, layer)
    assert rec["p2_code_units"] == 3
    for name in claim_v.P2_CODE_METRICS:
        assert rec["p2_code"][name] == pytest.approx(float(layer[f"p2code_{name}"][subset].mean()))
        assert rec["p2_code_exact"][name] == pytest.approx(float(layer[name][subset].mean()))
        assert rec["metrics"][name] == full["metrics"][name]  # the judged means: every sample
    model = claim_v.model_record("synthetic", {0: layer}, [0], {})
    assert model["p2_code_units"] == 3 and model["p2_code"] == pytest.approx(rec["p2_code"])


@pytest.mark.parametrize("resamples", [1, 2, 37, 999, 1000, 1001])
def test_percentile_interval_has_torch_quantiles_bits(resamples):
    """The interval's order statistics come from ``topk``; the values are torch.quantile's to the
    bit, ties, both tails, 1-D and 3-D draws, every level included."""
    for trial in range(12):
        g = torch.Generator().manual_seed(resamples * 100 + trial)
        shape = [(resamples,), (resamples, 1), (resamples, 17), (resamples, 5, 3)][trial % 4]
        draws = torch.randn(*shape, generator=g, dtype=torch.float64) * 10.0 ** (trial % 5 - 2)
        if trial % 3 == 0:
            draws = draws.round(decimals=1)  # ties
        for level in (0.95, 0.5, 0.9, 0.999):
            q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
            expected = torch.quantile(draws, q, dim=0).movedim(0, -1)
            assert torch.equal(stats.percentile_interval(draws, level), expected)
