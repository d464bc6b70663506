"""The specification curve and claims across training (method §14): known answers for the share
computation, the axis attribution and the paired change over training; the grid file's checks;
the option checks (exit 4); and small end-to-end runs of --multiverse, --training-dynamics and
--seeds whose default specification must equal the main records."""

import json
import os
from pathlib import Path

import pytest
import torch

from claims import dynamics, verdicts
from claims import multiverse as mv

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
S, R, I, U = verdicts.SUPPORTED, verdicts.REFUTED, verdicts.INCONCLUSIVE, verdicts.UNDETERMINED


# ---------------------------------------------------------------------------- shares, effects
def test_shares_are_the_fraction_of_each_verdict():
    assert mv.shares([S, R, R, I]) == {S: 0.25, verdicts.PARTIAL: 0.0, I: 0.25, R: 0.5, U: 0.0}
    assert sum(mv.shares([R, U, U]).values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        mv.shares([])


def _grid(*axes):
    """Specifications of a full grid over ``axes`` ({name: values}), in product order."""
    import itertools

    names = [n for n, _ in axes]
    return [dict(zip(names, combo)) for combo in itertools.product(*[v for _, v in axes])]


def test_an_axis_that_alone_decides_moves_every_pair_and_the_others_none():
    specs = _grid(("conv", ("p2", "kpca")), ("std", ("off", "on")), ("rules", ("ours", "p2")))
    # the verdict is refuted under p2 axes and inconclusive under kpca axes, whatever else
    outcomes = [(R,) if s["conv"] == "p2" else (I,) for s in specs]
    effects = mv.axis_effects(specs, outcomes)
    assert effects["conv"] == {"pairs": 4, "comparisons": 4, "flips": 4, "share": 1.0}
    assert effects["std"] == {"pairs": 4, "comparisons": 4, "flips": 0, "share": 0.0}
    assert effects["rules"]["flips"] == 0


def test_an_interaction_moves_only_the_pairs_where_it_acts():
    specs = _grid(("a", ("0", "1")), ("b", ("0", "1")))
    # supported only when both a and b are 1: each axis flips one pair out of its two
    outcomes = [(S,) if s["a"] == s["b"] == "1" else (R,) for s in specs]
    effects = mv.axis_effects(specs, outcomes)
    assert effects["a"]["pairs"] == 2 and effects["a"]["flips"] == 1 and effects["a"]["share"] == 0.5
    assert effects["b"]["flips"] == 1


def test_unit_level_effects_count_units_and_survivors_name_robust_units():
    specs = _grid(("dtype", ("float64", "float32")), ("rules", ("ours", "p2")))
    # unit 0 refuted everywhere; unit 1 flips with the rule set; unit 2 flips with the dtype
    outcomes = [(R, S if s["rules"] == "ours" else I, R if s["dtype"] == "float64" else U)
                for s in specs]
    effects = mv.axis_effects(specs, outcomes)
    assert effects["rules"] == {"pairs": 2, "comparisons": 6, "flips": 2, "share": 2 / 6}
    assert effects["dtype"]["flips"] == 2
    assert mv.survivors(outcomes) == [R, None, None]
    summary = mv.summarize({}, specs, None, outcomes, ["u0", "u1", "u2"])
    assert summary["units"]["robust"] == 1 and summary["units"]["robust_counts"][R] == 1
    assert summary["units"]["shares"][R] == pytest.approx((4 + 2) / 12)


def test_summary_of_model_verdicts_names_the_survivor_only_when_all_agree():
    specs = _grid(("rules", ("ours", "p2")))
    same = mv.summarize({}, specs, [R, R], None, None)
    assert same["model"]["survives"] == R and same["model"]["default_verdict"] == R
    split = mv.summarize({}, specs, [R, I], None, None)
    assert split["model"]["survives"] is None
    assert split["model"]["axis_effects"]["rules"]["flips"] == 1


def test_mismatched_outcomes_are_refused():
    with pytest.raises(ValueError):
        mv.axis_effects([{"a": "0"}, {"a": "1"}], [(R,)])
    with pytest.raises(ValueError):
        mv.axis_effects([{"a": "0"}, {"a": "1"}], [(R,), (R, R)])


# ---------------------------------------------------------------------------- the grid
def test_the_grid_file_declares_each_axis_with_its_claims_and_reason():
    grid = mv.load_grid()
    assert {"axis_convention", "standardize", "dtype", "padding", "null", "rules",
            "j_statistic"} <= set(grid)
    for axis in grid.values():
        assert axis.why and len(axis.values) >= 2
    assert grid["padding"].modality == "text"
    assert grid["rules"].stage == "decide"
    assert grid["null"].claims == ("V",) and grid["null"].stage == "compute"
    assert grid["null"].values[0] == "token-shuffled"  # the claim tests' null (method §2.3)


def test_specifications_put_the_default_first_and_follow_the_modality():
    grid = mv.load_grid()
    default = {"axis_convention": "p2", "standardize": "off", "dtype": "float64",
               "padding": "out", "null": "token-shuffled", "kernel_scale": "1.0", "rules": "ours",
               "j_statistic": "pooled-means"}
    image_v = mv.specifications(grid, "V", "image", default)
    text_v = mv.specifications(grid, "V", "text", default)
    # axes x std x dtype x null x rules; text models add padding; the kernel scale is varied
    # alone (crossed = false): its two other values add one specification each, at the end
    assert len(image_v) == 2 * 2 * 2 * 2 * 2 + 2 and len(text_v) == 2 * 2 ** 5 + 2
    assert image_v[0] == {k: v for k, v in default.items() if k not in ("padding", "j_statistic")}
    for spec, scale in zip(image_v[-2:], ("0.5", "2.0")):
        assert spec == {**image_v[0], "kernel_scale": scale}
    assert [s["kernel_scale"] for s in image_v[:-2]] == ["1.0"] * 32
    assert "axis_convention" not in mv.specifications(grid, "J", "image", default)[0]
    assert "null" not in mv.specifications(grid, "J", "image", default)[0]
    assert "dtype" not in mv.specifications(grid, "E", "text", default)[0]
    j = mv.specifications(grid, "J", "image", {**default, "j_statistic": "pooled-means"})
    assert len(j) == 2 * 2 * 2 * 3 + 2  # std x dtype x rules x claim-J statistic, + kscale
    assert len({mv.spec_name(grid, s) for s in text_v}) == len(text_v)  # names are unique
    # a run with other options has those options as its default
    other = mv.specifications(grid, "V", "image", {**default, "standardize": "on"})
    assert other[0]["standardize"] == "on" and len(other) == len(image_v)
    # at --kernel-scale 0.5 the grid's other values are 1.0 and 2.0
    halved = mv.specifications(grid, "E", "image", {**default, "kernel_scale": "0.5"})
    assert [s["kernel_scale"] for s in halved] == ["0.5"] * 4 + ["1.0", "2.0"]


@pytest.mark.parametrize("body, message", [
    ("[axes.x]\nlabel='x'\nvalues=['a']\nclaims=['V']\nstage='compute'\noption='dtype'\nwhy='w'",
     "at least two"),
    ("[axes.x]\nlabel='x'\nvalues=['a','b']\nclaims=['V']\nstage='later'\noption='dtype'\nwhy='w'",
     "stage"),
    ("[axes.x]\nlabel='x'\nvalues=['a','b']\nclaims=['V']\nstage='compute'\noption='dtype'", "why"),
    ("title = 'no axes'", "no [axes"),
    ("[axes.x]\nlabel='x'\nvalues=['a','b']\nclaims=['V']\nstage='compute'\noption='dtype'\n"
     "why='w'\ncrossed='no'", "crossed must be true or false"),
])
def test_a_bad_grid_is_refused_naming_the_axis(tmp_path, body, message):
    path = tmp_path / "grid.toml"
    path.write_text(body)
    with pytest.raises(mv.GridError, match=message.replace("[", r"\[")):
        mv.load_grid(path)


def test_an_uncomputable_specification_is_undetermined_with_its_reason():
    res = mv.judged({"error": "phi beyond float32"}, "V", {"rules": "p2"}, ["L00-H0", "L00-H1"])
    assert res["verdict"] == U and res["units"] == [U, U] and "float32" in res["reason"]


# ---------------------------------------------------------------------------- training
def _change(lo: float, hi: float) -> dict:
    return {"ci": [lo, hi], "delta": (lo + hi) / 2}


def test_training_verdict_judges_the_overlap_excess_over_its_null():
    """[claim_v_training] judges the measure of claim V's ours rule (method §2.4, §14.4)."""
    section = verdicts.load_thresholds()["claim_v_training"]
    assert section["metrics"] == ["subspace_overlap_excess"]
    assert set(section["evidence"]) == {"optimal_cosine", "linear_cka", "kernel_cka"}


@pytest.mark.parametrize("excess, p2, expected", [
    ((0.01, 0.3), (-0.4, -0.2), S),    # the excess rises; P2's metrics fall: shown, not judged
    ((-0.3, -0.01), (0.2, 0.4), R),    # the excess falls whatever P2's metrics do
    ((-0.2, 0.1), (0.2, 0.4), I),      # its interval straddles 0
    ((0.0, 0.1), (0.2, 0.4), I),       # a lower end at 0 is not above 0
])
def test_training_verdict_on_the_excess_alone(excess, p2, expected):
    changes = {"subspace_overlap_excess": _change(*excess),
               **{m: _change(*p2) for m in ("optimal_cosine", "linear_cka", "kernel_cka")}}
    out = dynamics.training_verdict(changes)
    assert out["verdict"] == expected
    assert out["judged"] == ["subspace_overlap_excess"]
    assert out["shown"]["linear_cka"] == {"delta": _change(*p2)["delta"], "ci": list(p2)}


def test_training_verdict_names_a_missing_change():
    with pytest.raises(KeyError, match="subspace_overlap_excess"):
        dynamics.training_verdict({"optimal_cosine": _change(0.1, 0.2)})


def _v_layers(gen, n_samples=8, n_heads=3, undetermined_share=0.2, shift=0.0):
    from claims import claim_v

    out = {}
    for layer in (0, 1):
        m = {n: torch.rand(n_samples, n_heads, generator=gen, dtype=torch.float64)
             for name in sorted({*dynamics.V_METRICS, *claim_v.METRICS})
             for n in (name, f"{name}_null")}
        m["subspace_overlap"] = (m["subspace_overlap"] + shift).clamp(0, 1)
        m["undetermined"] = torch.rand(n_samples, n_heads, generator=gen) < undetermined_share
        out[layer] = m
    return out


def test_overlap_excess_pools_as_claim_v_does():
    """The excess [claim_v_training] judges is claim V's: (x − x₀)/(1 − x₀) of the means over
    the determined (layer, head, sample) units (claims/claim_v.py summarize), independent route."""
    from claims import claim_v

    gen = torch.Generator().manual_seed(3)
    per_layer, heads = _v_layers(gen), [0, 2]
    values = dynamics.v_per_sample(per_layer, heads)
    every = torch.arange(8).unsqueeze(0)
    stacked = {n: torch.cat([per_layer[l][n][:, heads] for l in (0, 1)], dim=1).reshape(-1)
               for n in per_layer[0]}
    keep = ~stacked["undetermined"]
    assert 0 < int(keep.sum()) < keep.numel()
    want = claim_v.summarize(stacked, keep)["metrics"]["subspace_overlap_excess"]
    assert float(dynamics.excess_draws(values, every)[0]) == pytest.approx(want, rel=1e-12)


def test_overlap_excess_change_is_paired():
    gen = torch.Generator().manual_seed(4)
    first = _v_layers(gen, undetermined_share=0.0)
    last = {l: {**m, "subspace_overlap": (m["subspace_overlap"] + 0.1).clamp(max=1.0)}
            for l, m in first.items()}
    a, b = dynamics.v_per_sample(first, [0, 1, 2]), dynamics.v_per_sample(last, [0, 1, 2])
    idx = dynamics.resamples(8, "test-series")
    same = dynamics.excess_change(a, a, idx)
    assert same["delta"] == 0.0 and same["ci"] == [0.0, 0.0]  # paired: no change, no spread
    up = dynamics.excess_change(a, b, idx)
    assert up["delta"] > 0 and 0 < up["ci"][0] <= up["delta"] <= up["ci"][1]
    assert up["first"] == pytest.approx(float(dynamics.excess_draws(a, torch.arange(8)[None])[0]))
    assert dynamics.training_verdict({"subspace_overlap_excess": up})["verdict"] == S


def test_paired_change_known_answers():
    n = 20
    idx = dynamics.resamples(n, "test-series")
    first = torch.linspace(0.0, 1.0, n, dtype=torch.float64)
    # a constant shift: every pair moves by exactly 0.25, so the interval is that point
    shifted = dynamics.paired_change(first, first + 0.25, idx, seed=1)
    assert shifted["delta"] == pytest.approx(0.25) and shifted["ci"] == pytest.approx([0.25, 0.25])
    assert shifted["p_rises"] < 1e-3 and shifted["p_falls"] == 1.0
    # no change: interval [0, 0], nothing rises
    same = dynamics.paired_change(first, first.clone(), idx, seed=1)
    assert same["delta"] == 0.0 and same["ci"] == [0.0, 0.0]
    # pairing matters: a large between-sample spread, a small paired shift, a narrow interval
    noisy = torch.randn(n, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 10
    paired = dynamics.paired_change(noisy, noisy + 0.1, idx, seed=1)
    assert paired["ci"][0] > 0.0


def test_j_draws_pool_tokens_like_the_claim_records():
    from claims import claim_j

    gen = torch.Generator().manual_seed(0)
    terms = {"log_phi_sq_mean": torch.randn(6, 2, generator=gen, dtype=torch.float64) - 3,
             "h_sq_mean": torch.rand(6, 2, generator=gen, dtype=torch.float64),
             "bessel_share": torch.rand(6, 2, generator=gen, dtype=torch.float64),
             "n_tokens": torch.tensor([[5.0, 5.0], [7, 7], [9, 9], [5, 5], [6, 6], [8, 8]]),
             "p1_log_phi_sq_mean": torch.zeros(6, 2, dtype=torch.float64)}
    pooled = claim_j.pooled([terms], [0, 1])
    all_samples = torch.arange(6).unsqueeze(0)  # one "resample": every sample once
    j = dynamics.j_draws(dynamics.j_per_sample({0: terms}, [0, 1]), all_samples)
    assert float(j[0]) == pytest.approx(pooled["j_proj"], rel=1e-12)


def test_gamma_position_is_zero_at_the_eigenvectors_and_one_at_the_control():
    g = {"learned": torch.full((4,), 0.3, dtype=torch.float64),
         "eigen": torch.full((4,), 0.3, dtype=torch.float64),
         "perturbed": torch.full((4,), 0.9, dtype=torch.float64)}
    assert dynamics.position(g) == 0.0
    assert dynamics.position({**g, "learned": g["perturbed"]}) == 1.0
    assert dynamics.position({**g, "perturbed": g["eigen"]}) is None


def test_seed_distribution_counts_seeds_per_verdict():
    rows = [{"seed": s, "verdicts": {"V": {"p2": R, "ours": R},
                                     "J": {"p2": I if s else R, "ours": I}},
             "metrics": {"V": {"linear_cka": 0.1 * (s + 1)}, "J": {}}} for s in range(3)]
    out = dynamics.seed_distribution("m", rows, "ours")
    assert out["distribution"]["V"]["ours"] == {R: 3}
    assert out["distribution"]["J"]["p2"] == {R: 1, I: 2}
    assert out["unanimous"]["V"]["p2"] == R and out["unanimous"]["J"]["p2"] is None
    assert out["metric_spread"]["V"]["linear_cka"]["mean"] == pytest.approx(0.2)


# ---------------------------------------------------------------------------- the plugin
def _run(pytester, out: Path, *args: str):
    return pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--out", str(out), "-p", "no:cacheprovider", *args, timeout=1200)


def _ran_on_the_workers_thread(results: dict) -> None:
    """Under xdist a nested run takes the worker's one thread (tests/conftest.py): with two
    OpenMP pools on two cores these runs took 40 times as long and CI timed them out."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert results["provenance"]["numeric_environment"]["threads"]["intra_op"] == 1


@pytest.mark.parametrize("args, message", [
    (("--seeds", "0"), "--seeds 0: give a number of training seeds from 1"),
    (("--seeds", "51"), "from 1 to 50"),
    (("--seeds", "2", "--models", "all-MiniLM-L6-v2"), "--seeds trains the tiny ViTs"),
    (("--training-dynamics", "--models", "all-MiniLM-L6-v2"), "--training-dynamics follows"),
])
def test_bad_opt_in_options_are_usage_errors(pytester, tmp_path, args, message):
    result = _run(pytester, tmp_path / "out", *args)
    assert result.ret == 4, result.stdout.str()[-2000:]
    assert message in result.stdout.str() + result.stderr.str()


def test_a_non_integer_seed_count_is_a_usage_error(pytester, tmp_path):
    result = _run(pytester, tmp_path / "out", "--seeds", "five")
    assert result.ret == 4
    assert "--seeds" in result.stderr.str()


def test_opt_in_analyses_are_not_collected_without_their_option(pytester, tmp_path):
    result = pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--models", "tiny-vit-digits-softmax", "--collect-only", "-q", "-p", "no:cacheprovider")
    text = result.stdout.str()
    assert "test_projection_trend" in text
    for name in ("test_specification_curve", "test_training_dynamics", "test_seed_spread"):
        assert name not in text


@pytest.mark.slow
def test_multiverse_end_to_end_default_specification_equals_the_main_records(pytester, tmp_path):
    out = tmp_path / "mv"
    result = _run(pytester, out, "--models", "tiny-vit-digits-softmax,all-MiniLM-L6-v2",
                  "--layers", "0", "--heads", "0,1", "--n-samples", "6", "--multiverse",
                  "-k", "not trend")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((out / "results.json").read_text())
    _ran_on_the_workers_thread(results)
    curve = results["specification_curve"]
    assert curve["default_matches_main"]["equal"], curve["default_matches_main"]
    assert curve["default_matches_main"]["missing"] == 0
    records = {(r["claim"], r["model"], r["level"], r.get("layer"), r.get("head")): r
               for r in results["records"]}
    for model, data in curve["models"].items():
        v = data["entries"]["V"]
        default = v["specifications"][0]
        assert default["axes"]["rules"] == results["options"]["rules"]
        main = records[("V", model, "model", None, None)]
        assert default["verdict"] == main["verdict"]
        assert default["metrics"] == {m: main["metrics"][m] for m in default["metrics"]}
        n_specs = 34 if data["modality"] == "image" else 66  # 2**5 (2**6) + 2 kernel scales
        assert v["n_specifications"] == n_specs == len(v["specifications"])
        assert sum(v["model"]["shares"].values()) == pytest.approx(1.0)
        assert set(v["model"]["axis_effects"]) == set(default["axes"])
    assert (out / "report.html").read_text().count('id="specification-curve"') == 1


@pytest.mark.slow
def test_training_dynamics_and_one_seed_end_to_end(pytester, tmp_path):
    out = tmp_path / "td"
    result = _run(pytester, out, "--models", "tiny-vit-digits-softmax", "--n-samples", "6",
                  "--training-dynamics", "--seeds", "1", "-k", "dynamics or seed")
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((out / "results.json").read_text())
    _ran_on_the_workers_thread(results)
    series = results["training_dynamics"]["series"]["tiny-vit-digits-softmax"]
    assert series["steps"][0] == 0 and len(series["trajectory"]) == len(series["steps"])
    for name in ("optimal_cosine", "linear_cka", "kernel_cka"):
        change = series["change"]["V"][name]
        assert change["ci"][0] <= change["delta"] <= change["ci"][1]
    # judged on the overlap's excess over its token-shuffled null (claim V's ours measure)
    judged = series["change"]["V"]["subspace_overlap_excess"]
    excess = judged["ci"]
    # the change's end points are claim V's own model-level excess at those checkpoints
    for end, row in (("first", series["trajectory"][0]), ("last", series["trajectory"][-1])):
        assert judged[end] == pytest.approx(row["V"]["metrics"]["subspace_overlap_excess"]["value"])
    assert series["training_moves_v_towards_v_hat"]["verdict"] == (
        S if excess[0] > 0 else R if excess[1] < 0 else I)
    seeds = results["seed_spread"]["models"]["tiny-vit-digits-softmax"]
    assert seeds["n_seeds"] == 1 and seeds["seeds"][0]["seed"] == 0
    assert (out / "report.html").read_text().count('id="training-dynamics"') == 1


def test_a_new_seed_trains_the_default_recipe_with_only_the_seed_changed(monkeypatch, tmp_path):
    from fixtures.engine import seed_runs as seeds
    from fixtures import training
    from fixtures.models.catalogue import REGISTRY
    from fixtures.engine.run_options import RunOptions
    from fixtures.engine.claim_session import ClaimSession, trained_config

    spec = REGISTRY["tiny-vit-digits-softmax"]
    session = ClaimSession({spec.key: spec}, RunOptions(cache_dir=str(tmp_path)))
    asked = []

    def fake_cached_series(config, root, progress=None):
        asked.append(config)
        raise RuntimeError("stop before training")

    monkeypatch.setattr(training, "cached_series", fake_cached_series)
    assert seeds.seed_run(session, spec.key, 0) is session.run(spec.key)
    run = seeds.seed_run(session, spec.key, 3)
    with pytest.raises(RuntimeError, match="stop before training"):
        run.prepare()
    import dataclasses

    assert asked[0] == dataclasses.replace(trained_config(spec), seed=3)


def test_the_claim_j_statistic_axis_rejudges_with_a_per_token_statistic():
    from claims.names import J_METRICS

    metrics = {name: 1.0 for name in J_METRICS}
    metrics.update(log10_ratio=3.0, bessel_share=1.0)  # pooled means: refuted by P2's bar
    record = {"metrics": metrics, "verdicts": {"p2": R, "ours": R}, "verdict": R, "rules": "p2",
              "tokens": {"median_log10_ratio": -1.0, "p2_appendix_log10_ratio": 1.0}}
    outcome = {"model": record, "units": {"L00": record}}
    pooled = mv.judged(outcome, "J", {"rules": "p2", "j_statistic": "pooled-means"}, ["L00"])
    median = mv.judged(outcome, "J", {"rules": "p2", "j_statistic": "per-token-median"}, ["L00"])
    p2med = mv.judged(outcome, "J", {"rules": "p2", "j_statistic": "p2-trimmed-median"}, ["L00"])
    assert pooled["verdict"] == R  # the record's own verdict, untouched
    assert median["verdict"] == S and median["metrics"]["log10_ratio"] == -1.0
    assert p2med["verdict"] == I  # 0 < 1 < 2: neither bar
    no_tokens = {**record, "tokens": None}
    assert mv.judged({"model": no_tokens, "units": {}}, "J",
                     {"rules": "p2", "j_statistic": "per-token-median"}, [])["verdict"] == U


def test_claim_js_default_statistic_is_the_grids_default():
    """Claim J's decision (``curve_decide``) leaves the records' verdicts alone at the
    ``j_statistic`` axis's declared default, the value the default specification carries."""
    from claims.claim_j_curve import J_DEFAULT_STATISTIC, J_STATISTICS

    axis = mv.load_grid()["j_statistic"]
    assert axis.default == J_DEFAULT_STATISTIC
    assert set(axis.values) == {J_DEFAULT_STATISTIC, *J_STATISTICS}


@pytest.mark.parametrize("axes, message", [
    ({"null": {"label": "n2", "values": ["a", "b"], "stage": "decide", "option": "x",
               "why": "w"}}, "is already an axis of the grid"),
    ({"toy": {"label": "std", "values": ["a", "b"], "stage": "decide", "option": "x",
              "why": "w"}}, "label 'std' is used by another axis"),
    ({"toy": {"label": "ty", "values": ["a", "b"], "stage": "decide", "option": "x",
              "default": "c", "why": "w"}}, "default 'c' is not among its values"),
    ({"toy": {"label": "ty", "values": ["a"], "stage": "decide", "option": "x", "why": "w"}},
     "at least two distinct strings"),
])
def test_a_claims_own_axis_is_checked_like_the_files(axes, message):
    """``ClaimSpec.axes`` join the grid through the same checks as claims/specifications.toml's
    axes, and may not take a name or label the grid has: the error names the claim and axis."""
    from claims import registry

    spec = registry.register(registry.ClaimSpec(
        id="T", section="claim_t", title="t", statement="t", source="t", unit="head",
        levels=("head",), curve=lambda: {}, axes=axes))
    try:
        with pytest.raises(mv.GridError, match=message) as info:
            mv.load_grid()
        assert "claim T" in str(info.value) and next(iter(axes)) in str(info.value)
    finally:
        registry.unregister(spec.id)
    assert "toy" not in mv.load_grid()


def test_an_axis_of_no_run_option_needs_a_default():
    from fixtures.engine.multiverse_metrics import default_specification
    from fixtures.engine.run_options import RunOptions

    grid = dict(mv.load_grid())
    grid["odd"] = mv.Axis(name="odd", label="odd", values=("a", "b"), claims=("V",),
                          stage="compute", option="no_such_option", why="w")
    with pytest.raises(mv.GridError, match="axis 'odd' names 'no_such_option', which is not a run "
                                          "option.*give the axis a default"):
        default_specification(RunOptions(), grid)
    grid["odd"] = mv.Axis(name="odd", label="odd", values=("a", "b"), claims=("V",),
                          stage="compute", option="no_such_option", why="w", default="b")
    assert default_specification(RunOptions(), grid)["odd"] == "b"


def test_the_curve_counts_a_kv_claims_heads_once_per_kv_head():
    """On a grouped-query model the specification curve aggregates a claim that reads keys and
    values only (claims V and E) over one query head per KV head, as its tests do (method §5.7),
    and every other claim over every selected head: SmolLM2's default specification then equals
    its main records (it did not: claim V's model overlap excess 0.3295 against 0.3371)."""
    from types import SimpleNamespace

    from fixtures.engine.multiverse_metrics import CurveContext

    ctx = SimpleNamespace(base=SimpleNamespace(spec=SimpleNamespace(n_rep=3)), heads=[0, 1, 2, 4, 8])
    assert CurveContext.heads_for(ctx, "V") == [0, 3, 6]
    assert CurveContext.heads_for(ctx, "E") == [0, 3, 6]
    assert CurveContext.heads_for(ctx, "J") == [0, 1, 2, 4, 8]
    ctx.base.spec.n_rep = 1
    assert CurveContext.heads_for(ctx, "V") == [0, 1, 2, 4, 8]
