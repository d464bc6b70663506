"""The equivalence margins of the tests against chance are shares of the room the null leaves
(method §7.2, `claims.verdicts.absolute_margin`), so the same head, with the same excess over its
null, gets the same "at chance" statement whatever the sequence length that sets the null; and
claim J's support needs an excess over the null and is never given to a record at chance
(method §3.6)."""

from __future__ import annotations

import pytest
import torch

from claims import claim_j, claim_v, claim_e_gamma_stats, verdicts

F64 = torch.float64
S = 20


def _around(centre: float, spread: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return centre + spread * torch.randn(S, 1, generator=g, dtype=F64)


def _v_at_chance(null: float, excess: float) -> bool:
    """Claim V's "at chance" of a head whose overlap sits ``excess`` of the room above a null of
    ``null``, with per-sample noise a twentieth of the room."""
    room = 1.0 - null
    metrics = {}
    for i, name in enumerate(claim_v.METRICS):
        metrics[f"{name}_null"] = torch.full((S, 1), null, dtype=F64)
        metrics[name] = _around(null + excess * room, 0.05 * room, i)
    metrics["undetermined"] = torch.zeros(S, 1, dtype=torch.bool)
    test = claim_v.head_statistics("m", {0: metrics}, [0])[(0, 0)]["vs_null"]["subspace_overlap"]
    assert test["margin"] == pytest.approx(0.1 * room)
    assert test["margin_share"] == 0.1
    return test["at_chance"]


@pytest.mark.parametrize("excess, expected", [(0.3, False), (0.0, True)])
def test_a_heads_at_chance_statement_does_not_change_with_the_sequence_length(excess, expected):
    """d = 32: the overlap's null is about d/N, 0.94 at N = 34 and 0.25 at N = 130. A head
    sharing 30 % of the room above it is not at chance at either length (with the absolute margin
    0.05 it was at chance at N = 34: its mean difference, 0.018, is inside 0.05); a head at its
    null is at chance at both."""
    statements = {n: _v_at_chance(32 / n, excess) for n in (34, 65, 130)}
    assert set(statements.values()) == {expected}, statements


@pytest.mark.parametrize("anchor", [0.0, 0.03])
def test_gamma_margin_is_a_share_of_the_residual_room_below_the_null(anchor):
    """γ's residual ρ is best at the true eigenvectors' (ρ of span([A, h]), ``anchor``; 0
    without the bias direction): the margin is a tenth of the room between it and the null's
    mean residual, and a head whose residual closes 30 % of it is not at chance whatever that
    null's size."""
    for room in (0.05, 0.5, 2.0):
        t = {"gamma_null_subspace": torch.full((S, 1), anchor + room, dtype=F64),
             "gamma_eigen_subspace": torch.full((S, 1), anchor, dtype=F64),
             "gamma_learned_subspace": anchor + _around(0.7 * room, 0.05 * room, 3)}
        test = claim_e_gamma_stats.chance_tests(t, torch.ones(S, 1, dtype=torch.bool), 0)[0]
        assert test["margin"] == pytest.approx(0.1 * room)
        assert test["at_chance"] is False and test["above_chance"] is True, (room, test)


def _j_terms(r2: torch.Tensor, null: float) -> dict:
    return {"output_r2": r2, "output_r2_null": torch.full((S, 1), null, dtype=F64),
            "n_tokens": torch.full((S, 1), 65.0, dtype=F64)}


@pytest.mark.parametrize("null", [0.66, 0.97, 0.999])
def test_claim_j_at_chance_is_relative_to_the_room_above_the_null(null):
    room = 1.0 - null
    above = claim_j.output_fit_statistics([_j_terms(_around(null + 0.3 * room, 0.05 * room, 1),
                                                    null)], [0], 0)
    at = claim_j.output_fit_statistics([_j_terms(_around(null, 0.02 * room, 2), null)], [0], 0)
    assert above["vs_null"]["margin"] == pytest.approx(0.1 * room, rel=0.05)
    assert above["vs_null"]["at_chance"] is False and above["vs_null"]["above_chance"] is True
    assert at["vs_null"]["at_chance"] is True


def test_a_high_r2_with_little_excess_is_not_claim_j_support():
    """The random-init head at P1's kernel scale: R² 0.985 against a null R² 0.96 (excess 0.6).
    The old bar (R² ≥ 0.9) supported it; the excess bar does not, and a record at chance is never
    supported even where every supported bar holds."""
    metrics = {"output_r2": 0.985, "output_r2_excess": 0.6, "fit_median_log10_ratio": -5.0,
               "fit_bessel_share": 1.0}
    ci = {"output_r2": [0.98, 0.99], "output_r2_excess": [0.55, 0.65]}
    got = verdicts.judge_ours("claim_j", {**_j_metric_defaults(), **metrics}, ci)
    assert got.verdict != verdicts.SUPPORTED
    exact = {**metrics, "output_r2": 1.0, "output_r2_excess": 1.0}
    ci_exact = {"output_r2": [1.0, 1.0], "output_r2_excess": [0.95, 1.0]}
    assert verdicts.judge_ours("claim_j", {**_j_metric_defaults(), **exact},
                               ci_exact).verdict == verdicts.SUPPORTED
    at_chance = verdicts.judge_ours("claim_j", {**_j_metric_defaults(), **exact}, ci_exact,
                                    at_chance={"output_r2": True})
    assert at_chance.verdict == verdicts.REFUTED and "at chance" in at_chance.reason


def _j_metric_defaults() -> dict:
    """The `p2` metrics of a claim-J record, which the `ours` rules do not read."""
    return {"phi_sq_mean": 1.0, "h_sq_mean": 1.0, "j_proj": 0.0, "bessel_share": 1.0,
            "log10_ratio": 0.0}
