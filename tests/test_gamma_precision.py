"""What claim E's γ judges is a function of the head at float64, not of the eigensolver's code
path (method §4.2, "Precision"): the basis inside a degenerate eigenspace, the γ positions'
anchor, and the direction overlap ω where round-off decides it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from checks.gamma import gamma_spread_batched, perturbed_axes, recover_axes
from checks.gamma_precision import OVERLAP_PRECISION_BAR, canonical_axes, overlap_precision
from checks.gram import KeyGram
from checks.invariant_subspace import invariance_overlap
from claims import claim_e
from tests._helpers import CROSS_PATH_UNIT

F64 = torch.float64
N = 8
MU = [5.0, 3.0, 3.0, 2.0, 1.0, 0.5, 0.2]  # an exactly degenerate pair, μ_2 = μ_3


def _centred_basis(seed: int = 0) -> torch.Tensor:
    """N−1 orthonormal columns orthogonal to the constant vector (K̃'s trivial null vector)."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.eye(N, dtype=F64) - 1.0 / N
    q, _ = torch.linalg.qr(h @ torch.randn(N, N - 1, generator=gen, dtype=F64))
    return q


def _rotated(u: torch.Tensor, angle: float, cols=(1, 2)) -> torch.Tensor:
    """u with columns ``cols`` rotated by ``angle`` inside their plane."""
    c, s = math.cos(angle), math.sin(angle)
    out = u.clone()
    i, j = cols
    out[:, i], out[:, j] = c * u[:, i] + s * u[:, j], -s * u[:, i] + c * u[:, j]
    return out


def _gram_with_basis(u: torch.Tensor, mu: list[float]) -> SimpleNamespace:
    """A stand-in for the KeyGram of a hand-built K̃ = U diag(μ) Uᵀ whose eigensolver returned
    the basis ``u``: what gamma_spread_batched reads of a KeyGram."""
    mu_t = torch.tensor(mu, dtype=F64)
    centred = u @ torch.diag(mu_t) @ u.T
    return SimpleNamespace(n=N, log_g=torch.zeros(N, dtype=F64), eigenvalues=mu_t,
                           centred=0.5 * (centred + centred.T),
                           axes=lambda m: u[:, :m], undetermined=torch.tensor(False))


def _values(seed: int = 1, d_v: int = 4) -> torch.Tensor:
    return torch.randn(N, d_v, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize("angle", [0.7, 2.0, -1.3])
def test_judged_gamma_quantities_do_not_depend_on_the_basis_inside_a_degenerate_pair(angle):
    u, v = _centred_basis(), _values()
    keys = torch.zeros(N, 3, dtype=F64)  # only their shape is read with a gram given
    base = gamma_spread_batched(keys, v, seed=5, gram=_gram_with_basis(u, MU))
    turned = gamma_spread_batched(keys, v, seed=5, gram=_gram_with_basis(_rotated(u, angle), MU))
    # the judged inputs: the spreads placed on the position (learned, perturbed), ρ and ω
    for name in ("learned", "perturbed", "perturbed_subspace", "perturbed_directions",
                 "learned_subspace", "learned_directions", "eigen_subspace", "eigen_directions"):
        assert torch.allclose(turned[name], base[name], rtol=1e-12, atol=1e-14), name
    position = base["learned"].mean() / base["perturbed"].mean()
    assert torch.allclose(turned["learned"].mean() / turned["perturbed"].mean(), position,
                          rtol=1e-12)
    # the canonical basis is still an eigenvector basis: the eigen control stays at round-off
    assert float(turned["eigen"].max()) < 1e-10
    # the test has teeth: P2's perturbed control on the solver's two bases differs by far more
    k = _gram_with_basis(u, MU).centred
    from checks.gamma import gamma_vectors, pairwise_spread
    spreads = [pairwise_spread(*gamma_vectors(k, perturbed_axes(b[:, :4], seed=5))).mean()
               for b in (u, _rotated(u, angle))]
    assert abs(float(spreads[0] - spreads[1])) > 1e-3


def test_canonical_axes_depend_on_the_eigenspace_alone():
    u = _centred_basis(3)
    mu = torch.tensor(MU, dtype=F64)
    first = canonical_axes(mu, u)
    for angle in (0.3, 1.9):
        assert torch.allclose(canonical_axes(mu, _rotated(u, angle)), first, atol=1e-14)
    # the pair's columns span the same eigenspace, orthonormal, and every other column is the input
    pair = first[:, 1:3]
    assert torch.allclose(pair @ pair.T, u[:, 1:3] @ u[:, 1:3].T, atol=1e-14)
    assert torch.allclose(first.T @ first, torch.eye(N - 1, dtype=F64), atol=1e-14)
    assert torch.equal(first[:, [0, 3, 4, 5, 6]], u[:, [0, 3, 4, 5, 6]])
    # a nearly degenerate pair (gap 1e-13·μ_1) is one eigenspace too; batched items independent:
    # each is what it is alone, to round-off (the batched products and QR may take other kernels
    # than the single call's on another CPU: an Intel Xeon's MKL gave other last bits)
    near = mu.clone()
    near[2] = 3.0 - 5e-13
    batch = canonical_axes(torch.stack([near, near]), torch.stack([u, _rotated(u, 0.4)]))
    assert torch.allclose(batch[0], batch[1], atol=1e-14)
    torch.testing.assert_close(batch[0], canonical_axes(near, u), **CROSS_PATH_UNIT)


def test_a_pair_cut_by_the_last_column_keeps_the_solvers_columns():
    u = _centred_basis(4)
    mu = torch.tensor(MU[:3], dtype=F64)  # m = 3: μ_3 = μ_2 may continue beyond the cut
    assert torch.equal(canonical_axes(mu, u[:, :3]), u[:, :3])


def test_a_non_degenerate_head_is_unchanged_to_the_bit(monkeypatch):
    gen = torch.Generator().manual_seed(7)
    k = torch.randn(3, 2, 20, 6, generator=gen, dtype=F64)
    v = torch.randn(3, 2, 20, 6, generator=gen, dtype=F64)
    kg = KeyGram(k)
    assert torch.equal(canonical_axes(kg.eigenvalues[..., :6], kg.axes(6)), kg.axes(6))
    out = gamma_spread_batched(k, v, gram=kg, seed=list(range(6)))
    import checks.gamma
    monkeypatch.setattr(checks.gamma, "canonical_axes", lambda mu, axes: axes)  # the solver's basis
    before = gamma_spread_batched(k, v, gram=kg, seed=list(range(6)))
    for name in ("learned", "eigen", "perturbed", "perturbed_subspace", "perturbed_directions"):
        assert torch.equal(out[name], before[name]), name


def test_round_off_precision_of_omega_separates_determined_from_undetermined_spans():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(12, 12, generator=gen, dtype=F64)
    k = x @ x.T
    good = torch.randn(12, 3, generator=gen, dtype=F64)
    assert float(overlap_precision(k, good)) < 1e-12
    # a third column equal to the first up to 1e-14: its direction in the span is round-off
    bad = torch.cat([good[:, :2], good[:, :1] + 1e-14 * torch.randn(12, 1, generator=gen,
                                                                    dtype=F64)], dim=1)
    assert float(overlap_precision(k, bad)) > OVERLAP_PRECISION_BAR
    # batched: each item's estimate is its own, whatever the batch. The determined item's
    # estimate is itself round-off (~2e-15), which batched and single products round differently
    # on some code paths (MKL on SSE4.2 with CBWR: 2.29e-15 against 2.47e-15): an absolute floor
    # far below the bar
    both = overlap_precision(torch.stack([k, k]), torch.stack([good, bad]))
    assert torch.allclose(both, torch.stack([overlap_precision(k, good), overlap_precision(k, bad)]),
                          rtol=1e-12, atol=1e-13)
    # given ω, the same
    assert torch.equal(overlap_precision(k, bad, invariance_overlap(k, bad)),
                       overlap_precision(k, bad))


def _terms(s: int = 8, precision: float = 0.0, eigen: float = 0.0) -> dict:
    """Per-sample γ terms of one head (what claim E's layer pass hands to head_record)."""
    t = {"undetermined": torch.zeros(s, 1, dtype=torch.bool)}
    ramp = 0.01 * torch.arange(s, dtype=F64).unsqueeze(1)
    for name, spread, rho, omega in (("learned", 0.3, 0.5, 0.6), ("eigen", eigen, 0.0, 1.0),
                                     ("perturbed", 0.8, 0.9, 0.4), ("null", None, 0.95, 0.45)):
        if spread is not None:
            t[f"gamma_{name}"] = spread + ramp
            t[f"gamma_{name}_abs"] = spread + ramp
        t[f"gamma_{name}_subspace"] = rho + ramp
        t[f"gamma_{name}_directions"] = omega + ramp
    for name in ("learned", "null"):
        t[f"gamma_{name}_directions_precision"] = torch.zeros(s, 1, dtype=F64)
    t["gamma_learned_directions_precision"][3, 0] = precision
    return t


def test_gamma_positions_anchor_at_the_exact_eigenvectors_not_the_measured_control():
    """The per-column spread's position is anchored at the true eigenvectors' exact spread 0,
    not at the measured control (round-off amplified). ρ's and ω's are anchored at the measured
    eigen control: they judge span([A, h]) with the value bias's direction h, whose value is not
    0 but is computed to round-off (method §4.2)."""
    exact = claim_e.head_record("m", 0, 0, _terms(eigen=0.0)).to_json()
    noisy = claim_e.head_record("m", 1, 0, _terms(eigen=3e-3)).to_json()  # amplified round-off
    assert noisy["metrics"]["eigen"] == pytest.approx(3e-3 + 0.035)
    learned, perturbed = 0.3 + 0.035, 0.8 + 0.035
    # ρ: learned 0.535, eigen 0.035, perturbed 0.935; 1 − ω: 0.365, −0.035, 0.565 (means)
    for rec in (exact, noisy):
        assert rec["metrics"]["gamma_position"] == pytest.approx(learned / perturbed, rel=1e-12)
        assert rec["metrics"]["gamma_subspace_position"] == pytest.approx(0.5 / 0.9, rel=1e-12)
        assert rec["metrics"]["gamma_direction_position"] == pytest.approx(0.4 / 0.6, rel=1e-12)
        for name in ("gamma_subspace_position", "gamma_direction_position"):
            low, high = rec["ci"][name]
            assert low <= rec["metrics"][name] <= high, (name, rec["ci"][name])
    # the interval too: the same resamples (the seed is per model and layer), the same bounds
    same_layer = claim_e.head_record("m", 0, 0, _terms(eigen=3e-3)).to_json()
    assert same_layer["ci"]["gamma_position"] == exact["ci"]["gamma_position"]
    # the measured control still says whether there is a contrast at all: a perturbed control
    # no farther from constant than the true eigenvectors gives no position
    flat = claim_e.head_record("m", 0, 0, _terms(eigen=0.9)).to_json()
    assert flat["metrics"]["gamma_position"] is None
    assert "no contrast" in flat["undefined"]["gamma_position"]


def test_omega_moved_by_round_off_is_reported_not_judged():
    fine = claim_e.head_record("m", 0, 0, _terms(precision=0.5 * OVERLAP_PRECISION_BAR)).to_json()
    assert fine["metrics"]["gamma_direction_position"] is not None
    assert "learned" in fine["directions"] and "directions_imprecise" not in fine
    rec = claim_e.head_record("m", 0, 0, _terms(precision=3e-4)).to_json()
    assert rec["metrics"]["gamma_direction_position"] is None
    assert "gamma_direction_position" not in rec["ci"]
    assert "not determined at float64 in 1 of 8 samples" in rec["undefined"]["gamma_direction_position"]
    assert rec["directions_imprecise"] == {"learned": pytest.approx(0.635)}
    assert "learned" not in rec["directions"] and rec["directions"]["null"] == pytest.approx(0.485)
    # ρ still judges: this head is refuted by its subspace position, whatever ω
    assert rec["verdicts"]["ours"] == fine["verdicts"]["ours"] == "refuted"
