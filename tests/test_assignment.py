"""The assignment solvers behind the optimal cosine (checks/assignment.py) against SciPy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from checks import assignment
from checks.row_similarity import matched_cosine


def _cosines(b: int, n: int, d: int, seed: int, decimals: int | None = None) -> torch.Tensor:
    """Cosine matrices of rank ≤ d between two sets of n token rows (the claim-V shape): many
    near-ties; with ``decimals`` rounded, so exact ties as well."""
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.normalize(torch.randn(b, n, d, generator=g, dtype=torch.float64), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(b, n, d, generator=g, dtype=torch.float64), dim=-1)
    c = (x @ y.transpose(-1, -2)).clamp(-1, 1)
    return c if decimals is None else torch.round(c, decimals=decimals)


def _scipy_mean(c: torch.Tensor) -> np.ndarray:
    out = []
    for m in c.reshape(-1, *c.shape[-2:]).numpy():
        r, k = linear_sum_assignment(m, maximize=True)
        out.append(m[r, k].mean())
    return np.array(out).reshape(c.shape[:-2])


def _mean(c: torch.Tensor, perm: torch.Tensor) -> np.ndarray:
    return torch.gather(c, -1, perm.unsqueeze(-1)).squeeze(-1).mean(-1).numpy()


CASES = [(3, 1, 4, 0, None), (4, 2, 2, 1, None), (6, 23, 8, 2, None), (4, 70, 32, 3, None),
         (2, 197, 64, 4, None), (4, 40, 3, 5, 1), (3, 30, 30, 6, 2)]


@pytest.mark.parametrize("solver", ["lapjv", "scipy", "auction"])
@pytest.mark.parametrize("b,n,d,seed,decimals", CASES)
def test_solvers_reach_scipys_optimum(solver, b, n, d, seed, decimals):
    if solver == "lapjv" and assignment._lapjv is None:
        pytest.skip("lap is not installed")
    c = _cosines(b, n, d, seed, decimals)
    perm = assignment.optimal_matching(c, solver=solver)
    assert perm.shape == c.shape[:-1] and perm.dtype == torch.long
    assert bool((perm.sort(-1).values == torch.arange(n)).all()), "not a permutation"
    tol = assignment.AUCTION_TOL if solver == "auction" else 1e-13
    np.testing.assert_allclose(_mean(c, perm), _scipy_mean(c), rtol=0, atol=tol)


def test_auction_certificate_brackets_the_optimum():
    c = _cosines(5, 60, 16, 7)
    perm, primal, dual = assignment.auction_matching(c)
    ref = torch.from_numpy(_scipy_mean(c))
    assert bool((primal <= ref + 1e-15).all()) and bool((ref <= dual + 1e-15).all())
    assert float((dual - primal).max()) <= assignment.AUCTION_TOL
    np.testing.assert_array_equal(_mean(c, perm), primal.numpy())


def test_matched_cosine_uses_the_default_solver_and_keeps_leading_dims():
    c = _cosines(6, 20, 5, 8).reshape(2, 3, 20, 20)
    np.testing.assert_allclose(matched_cosine(c).numpy(), _scipy_mean(c), rtol=0, atol=1e-13)
    assert assignment.DEFAULT_SOLVER == "scipy"  # lapjv keeps the GIL (checks/assignment.py)


def test_bad_solver_and_bad_input_are_named():
    with pytest.raises(ValueError, match="unknown assignment solver 'hungarian'"):
        assignment.optimal_matching(torch.zeros(2, 2), solver="hungarian")
    with pytest.raises(ValueError, match="square matrices"):
        assignment.optimal_matching(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN or Inf"):
        assignment.optimal_matching(torch.tensor([[0.0, float("nan")], [0.0, 0.0]]))


def test_lapjv_without_lap_says_what_to_do(monkeypatch):
    monkeypatch.setattr(assignment, "_lapjv", None)
    with pytest.raises(ValueError, match="needs the 'lap' package"):
        assignment.optimal_matching(torch.zeros(2, 2), solver="lapjv")


def test_bench_solvers_times_each_solver_and_asserts_its_optimum_against_scipy():
    """``python -m bench.run --solvers``: every solver's mean matched cosine agrees with SciPy's
    to 1e-9 on every matrix before a time is reported (the auction by its dual certificate)."""
    from bench.solvers import ASSIGNMENT_ATOL, measure_assignment

    gen = torch.Generator().manual_seed(2)
    rows = torch.nn.functional.normalize(torch.randn(3, 2, 16, 4, generator=gen, dtype=torch.float64), dim=-1)
    cos = [rows[i] @ rows[(i + 1) % 3].transpose(-1, -2) for i in range(3)]  # [2, 16, 16], rank 4
    res = measure_assignment({"v_hat": cos, "null": cos[:1]}, repeats=1)
    assert set(res) == {"v_hat", "null"} and res["v_hat"]["matrices"] == 6
    for row in res.values():
        assert {"scipy", "auction"} <= set(row)
        for solver in ("scipy", "lapjv", "auction"):
            if solver in row:
                assert row[solver]["max_gap"] <= ASSIGNMENT_ATOL and row[solver]["ms_per_matrix"] >= 0
