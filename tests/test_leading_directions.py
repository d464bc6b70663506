"""Claim V by directions (checks/leading_directions.py, method §2.5): known answers on heads built
from V̂'s own directions (issue 41: a head holding V̂'s top 16 of 32 directions, one holding its
bottom 16, one whose every direction is tilted half-way), the maps the network cannot see, and
the chance level of a span unrelated to V̂, against an independent route (principal angles)."""

from __future__ import annotations

import math

import pytest
import torch

from checks.leading_directions import leading_capture, nested_directions
from checks.matrix_similarity import subspace_overlap

N, D = 65, 32


def _orthonormal_centred(n: int, k: int, seed: int) -> torch.Tensor:
    """k orthonormal columns in R^n, each orthogonal to the all-ones vector."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k + 1, generator=g, dtype=torch.float64)
    z[:, 0] = 1.0
    q, _ = torch.linalg.qr(z)
    return q[:, 1:]


@pytest.fixture(scope="module")
def heads():
    """V̂ (orthonormal centred directions, in eigenvalue order, decaying eigenvalues) and the
    learned V of each synthetic head, V̂'s directions mixed by an invertible M and shifted by a
    value bias (which the network cannot see)."""
    basis = _orthonormal_centred(N, 2 * D, seed=1)  # all of 1⊥ in R^65
    y, other = basis[:, :D], basis[:, D:]
    extra = other  # "random" directions: orthogonal to every direction of V̂
    g = torch.Generator().manual_seed(2)
    mix = torch.randn(D, D, generator=g, dtype=torch.float64) + 4 * torch.eye(D, dtype=torch.float64)
    bias = torch.randn(1, D, generator=g, dtype=torch.float64)
    mu = torch.tensor([0.8 ** m for m in range(D)], dtype=torch.float64)
    half = D // 2
    learned = {
        "exact": y,
        "top16+random16": torch.cat([y[:, :half], extra[:, :half]], -1),
        "bottom16+random16": torch.cat([y[:, half:], extra[:, :half]], -1),
        "tilted": (y + other) / math.sqrt(2.0),  # every principal angle 45°: cos² = 1/2
        "unrelated": other,
    }
    return y, mu, {name: v @ mix + bias for name, v in learned.items()}


def test_each_direction_of_v_hat_is_held_or_not_as_built(heads):
    y, mu, v = heads
    out = {name: leading_capture(x, y, mu) for name, x in v.items()}
    assert torch.allclose(out["exact"]["capture"], torch.ones(D, dtype=torch.float64), atol=1e-9)
    top = out["top16+random16"]["capture"]
    assert torch.allclose(top[:16], torch.ones(16, dtype=torch.float64), atol=1e-9)
    assert float(top[16:].abs().max()) < 1e-9  # the random 16 are orthogonal to V̂ here
    bottom = out["bottom16+random16"]["capture"]
    assert float(bottom[:16].abs().max()) < 1e-9
    assert torch.allclose(bottom[16:], torch.ones(16, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(out["tilted"]["capture"], torch.full((D,), 0.5, dtype=torch.float64),
                          atol=1e-9)
    assert [int(out[k]["shared"]) for k in ("exact", "top16+random16", "bottom16+random16",
                                            "tilted", "unrelated")] == [32, 16, 16, 0, 0]


def test_the_weighted_capture_ranks_top_directions_above_bottom_and_tilted(heads):
    """The issue's ranking: top-16 + random-16 above the tilted head above bottom-16; the one
    overlap number cannot separate them (0.5, 0.5, 0.5)."""
    y, mu, v = heads
    w = {name: float(leading_capture(x, y, mu)["weighted"]) for name, x in v.items()}
    top_share = float(mu[:16].sum() / mu.sum())
    assert w["exact"] == pytest.approx(1.0, abs=1e-9)
    assert w["top16+random16"] == pytest.approx(top_share, abs=1e-9)
    assert w["tilted"] == pytest.approx(0.5, abs=1e-9)
    assert w["bottom16+random16"] == pytest.approx(1.0 - top_share, abs=1e-9)
    assert w["top16+random16"] > w["tilted"] > w["bottom16+random16"] > w["unrelated"]
    overlaps = [float(subspace_overlap(v[k], y)) for k in ("top16+random16", "tilted",
                                                           "bottom16+random16")]
    assert overlaps == pytest.approx([0.5, 0.5, 0.5], abs=1e-9)


def test_the_captures_agree_with_principal_angles_where_directions_are_orthogonal(heads):
    """An independent route: with V̂'s directions orthonormal, the captures are the squared
    singular values of Q_Vᵀ V̂ when V holds whole directions, so their sum is d × the overlap."""
    y, mu, v = heads
    for name, x in v.items():
        c = leading_capture(x, y, mu)["capture"]
        assert float(c.sum()) == pytest.approx(D * float(subspace_overlap(x, y)), abs=1e-8), name


def test_an_unrelated_span_holds_about_d_over_n_of_each_direction():
    """Chance level: span(V) of d random directions holds about d/(N − 1) of each of V̂'s."""
    g = torch.Generator().manual_seed(5)
    y = torch.randn(400, N, D, generator=g, dtype=torch.float64)
    x = torch.randn(400, N, D, generator=g, dtype=torch.float64)
    mu = torch.ones(400, D, dtype=torch.float64)
    out = leading_capture(x, y, mu)
    assert float(out["capture"].mean()) == pytest.approx(D / (N - 1), abs=0.01)
    assert float(out["weighted"].mean()) == pytest.approx(D / (N - 1), abs=0.01)


def test_directions_past_the_token_count_or_round_off_are_not_counted():
    g = torch.Generator().manual_seed(7)
    y = torch.randn(6, 8, generator=g, dtype=torch.float64)  # N = 6 < d = 8
    q, valid = nested_directions(y)
    assert q.shape == (6, 8) and valid.tolist() == [True] * 5 + [False] * 3  # rank N − 1 once centred
    out = leading_capture(y, y, torch.ones(8, dtype=torch.float64))
    assert int(out["directions"]) == 5 and int(out["shared"]) == 5
    assert torch.isnan(out["capture"][5:]).all() and float(out["weighted"]) == pytest.approx(1.0)
    zero = leading_capture(y, y, torch.zeros(8, dtype=torch.float64))
    assert math.isnan(float(zero["weighted"]))  # no direction has weight: nothing to average


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="weights"):
        leading_capture(torch.zeros(5, 3), torch.zeros(5, 3), torch.zeros(2))


def test_the_principal_angle_count_finds_shared_directions_in_any_order(heads):
    """The principal-angle count: top 16 and bottom 16 both share 16 directions, the tilted head
    none (every cos² is 1/2), V̂ itself all 32."""
    from checks.leading_directions import principal_angle_count

    y, _mu, v = heads
    counts = {name: int(principal_angle_count(x, y)) for name, x in v.items()}
    assert counts == {"exact": 32, "top16+random16": 16, "bottom16+random16": 16, "tilted": 0,
                      "unrelated": 0}
