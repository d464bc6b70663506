"""Claims across training (method §14.4-14.5): claims V, E and J at every checkpoint of a
series, step 0 included, with the paired change from step 0 to the last checkpoint
(``--training-dynamics``); and the tiny ViTs trained with N seeds, each model's verdicts as a
distribution over seeds (``--seeds N``). Analyses, not claim tests: they pass when computed and
write results.json's ``training_dynamics`` and ``seed_spread``."""

import pytest

from claims import dynamics


@pytest.mark.kpca_opt_in("--training-dynamics")
def test_training_dynamics(series_ref, claim_session, record_extra):
    record_extra("training_dynamics", dynamics.dynamics_of_series(
        series_ref.name, claim_session.series(series_ref.name), claim_session.options.rules))


@pytest.mark.kpca_opt_in("--seeds")
def test_seed_spread(series_ref, claim_session, seed_runs, collected_heads, record_extra):
    n_seeds, run_of = seed_runs
    spec = claim_session.specs.get(series_ref.name)
    if spec is None or spec.source != "trained":
        pytest.skip(f"--seeds: {series_ref.name} is not a model this suite trains")
    layers, heads = collected_heads(series_ref.name)
    rules = claim_session.options.rules
    rows = [dynamics.seed_row(series_ref.name, seed, run_of(series_ref.name, seed), layers, heads,
                              rules) for seed in range(n_seeds)]
    record_extra("seed_spread", dynamics.seed_distribution(series_ref.name, rows, rules))
