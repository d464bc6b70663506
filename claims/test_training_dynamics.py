"""Claims across training (method §14.4-14.5): claims V, E and J at every checkpoint of a
series, step 0 included, with the paired change from step 0 to the last checkpoint
(``--training-dynamics``); and the tiny ViTs trained with N seeds, each model's verdicts as a
distribution over seeds (``--seeds N``). Analyses, not claim tests: they pass when computed and
write results.json's ``training_dynamics`` and ``seed_spread``."""

import pytest

from claims import claim_j, dynamics, multiverse


@pytest.mark.kpca_opt_in("--training-dynamics")
def test_training_dynamics(series_ref, claim_session, record_extra):
    checkpoints, info = [], None
    for point in claim_session.series(series_ref.name):
        info = point.run.prepare()
        layers = range(info["n_layers"])
        checkpoints.append({"step": point.step, "test_accuracy": point.sidecar.get("test_accuracy"),
                            **{c: {l: point.run.layer_metrics(c, l) for l in layers}
                               for c in ("V", "E", "J")}})
    result = dynamics.series_dynamics(series_ref.name, info["key"], checkpoints,
                                      list(range(info["n_heads"])), info["head_dim"],
                                      rules=claim_session.options.rules)
    record_extra("training_dynamics", result)


@pytest.mark.kpca_opt_in("--seeds")
def test_seed_spread(series_ref, claim_session, seed_runs, collected_heads, record_extra):
    n_seeds, run_of = seed_runs
    spec = claim_session.specs.get(series_ref.name)
    if spec is None or spec.source != "trained":
        pytest.skip(f"--seeds: {series_ref.name} is not a model this suite trains")
    layers, heads = collected_heads(series_ref.name)
    rules = claim_session.options.rules
    rows = []
    for seed in range(n_seeds):
        run = run_of(series_ref.name, seed)
        info = run.prepare()
        v = multiverse.v_outcomes(series_ref.name, {l: run.layer_metrics("V", l) for l in layers},
                                  heads, rules)
        e = multiverse.e_outcomes(series_ref.name, {l: run.layer_metrics("E", l) for l in layers},
                                  heads, info["head_dim"], rules)
        j = claim_j.model_record(series_ref.name, {l: run.layer_metrics("J", l) for l in layers},
                                 heads, rules=rules).to_json()
        rows.append({"seed": seed, "checkpoint_hash": info["checkpoint_hash"],
                     "verdicts": {"V": v["model"]["verdicts"], "J": j["verdicts"],
                                  "E": e["model"]["verdicts"]},
                     "head_verdicts": {
                         "V": {r: multiverse.counts(u["verdicts"][r] for u in v["units"].values())
                               for r in ("p2", "ours")},
                         "E-gamma": {r: multiverse.counts(u["verdicts"][r] for u in e["units"].values())
                                     for r in ("p2", "ours")}},
                     "metrics": {"V": {m: v["model"]["metrics"][m] for m in multiverse.HEADLINE["V"]},
                                 "J": {m: j["metrics"][m] for m in multiverse.HEADLINE["J"]},
                                 "E": {m: e["model"]["metrics"][m] for m in multiverse.HEADLINE["E"]}}})
    record_extra("seed_spread", dynamics.seed_distribution(series_ref.name, rows, rules))
