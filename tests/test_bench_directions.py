"""``python -m bench.directions`` (claim V by directions on captures, method §2.6): on a
synthetic layer whose values are V̂ itself every statistic is at its maximum and above the
token-shuffled null's; the command refuses an unknown model with one sentence."""

from __future__ import annotations

import pytest
import torch

from bench import directions
from claims.claim_v_grid import grid_gram, padded_v_hat
from tests._synthetic_run import D, SyntheticRun


def _v_hat_run() -> SyntheticRun:
    """The synthetic layer with V = V̂ of each sample's own tokens (raw keys, float64)."""
    run = SyntheticRun()
    data = run._data
    lengths = data["token_mask"].sum(dim=1).tolist()
    v = torch.zeros_like(data["k"], dtype=torch.float64)
    for b, n in enumerate(lengths):
        k = data["k"][b:b + 1, :, :n]
        v[b, :, :n] = padded_v_hat(grid_gram(k, run.prepare(), False, torch.float64), "p2", D)[0]
    run._data = {**data, "k": data["k"].to(torch.float64), "v": v}
    return run


def test_values_that_are_v_hat_hold_every_direction_and_beat_the_null():
    row = directions.model_summary(_v_hat_run())
    assert row["model"] == "synthetic" and row["head_dim"] == D and row["heads"] == 2
    assert row["weighted"]["median"] == pytest.approx(1.0, abs=1e-9)
    assert row["leading"]["median"] == D and row["angles"]["median"] == D
    for name in ("weighted", "leading", "angles"):
        assert row[name]["null_median"] < row[name]["median"]
        assert row[name]["heads_above_null"] == 2


def test_an_unknown_model_is_refused_with_one_sentence(capsys):
    assert directions.main(["--models", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown model no-such-model" in err and err.count("\n") == 1

