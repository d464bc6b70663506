"""Top-m eigenpairs without a full eigh (checks/topk.py): against the full eigh and hand-built
spectra, batched against per-item, and the dispatch / error paths. float64, N ≤ 600."""

from __future__ import annotations

import math

import pytest
import torch

from checks import gram, topk
from checks.errors import NonFiniteError
from checks.topk import TopEighNotConverged, top_eigh

F64 = torch.float64


def key_gram(n: int, d: int, seed: int, spread: float = 1.0) -> torch.Tensor:
    """K̃ of keys with an anisotropic covariance (eigenvalues 1 … 10^-1.5) and a shared offset,
    scaled so that s·‖k‖² ≈ spread² (real keys: a few units)."""
    g = torch.Generator().manual_seed(seed)
    cov = torch.logspace(0, -1.5, d, dtype=F64)
    rot = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64)).Q
    k = (torch.randn(n, d, generator=g, dtype=F64) * cov.sqrt()) @ rot.T
    k = k * spread * d ** 0.25 / cov.sum().sqrt() + 0.3 * torch.randn(d, generator=g, dtype=F64)
    s = 1.0 / math.sqrt(d)
    scores = gram.score_matrix(k, s)
    return gram.center_gram(gram.normalized_gram(scores, gram.log_normaliser(scores)))


def known(n: int, eigenvalues: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q diag(λ) Qᵀ with a random orthogonal Q; returns (matrix, Q)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64)).Q
    return (q * eigenvalues) @ q.T, q


def projector_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖AAᵀ − BBᵀ‖₂ = sin of the largest principal angle between the column spaces."""
    diff = a @ a.transpose(-1, -2) - b @ b.transpose(-1, -2)
    return float(torch.linalg.matrix_norm(diff, ord=2).max())


def separated(mu: torch.Tensor, m: int, rel: float) -> torch.Tensor:
    """Bool [m]: μ_i is at least rel·μ_1 away from its neighbours (within the first m + 1)."""
    gaps = (mu[: m + 1, None] - mu[None, : m + 1]).abs() + torch.eye(m + 1, dtype=F64) * 1e300
    return gaps.min(-1).values[:m] >= rel * mu[0]


@pytest.mark.parametrize("n, m", [(300, 32), (520, 64)])
def test_subspace_matches_full_eigh_on_key_gram(n, m):
    mat = key_gram(n, 64, seed=n)
    mu_full, vec_full = gram.sorted_eigh(mat)
    mu, vec = top_eigh(mat, m, method="subspace")
    assert mu.shape == (m,) and vec.shape == (n, m)
    assert torch.allclose(mu, mu_full[:m], rtol=1e-8, atol=0)
    assert projector_gap(vec, vec_full[:, :m]) <= 1e-6
    ok = separated(mu_full, m, 1e-3)
    assert ok.sum() >= m // 2  # the test is not vacuous
    assert torch.allclose(vec[:, ok], vec_full[:, :m][:, ok], atol=1e-6, rtol=0)  # same signs


def test_known_spectrum_and_signs():
    n, m = 400, 24
    lam = torch.cat([0.8 ** torch.arange(m + 8, dtype=F64),
                     torch.full((n - m - 8,), 1e-4, dtype=F64)])
    mat, q = known(n, lam, seed=1)
    mu, vec = top_eigh(mat, m, method="subspace")
    assert torch.allclose(mu, lam[:m], rtol=1e-10, atol=0)
    assert torch.allclose(vec, gram.fix_signs(q[:, :m]), atol=1e-8, rtol=0)
    assert torch.allclose(vec.T @ vec, torch.eye(m, dtype=F64), atol=1e-12)


def test_batched_equals_per_item():
    mats = torch.stack([key_gram(300, 32, seed=s) for s in range(4)]).reshape(2, 2, 300, 300)
    mu, vec = top_eigh(mats, 16, method="subspace")
    assert mu.shape == (2, 2, 16) and vec.shape == (2, 2, 300, 16)
    for i in range(2):
        for j in range(2):
            mu1, vec1 = top_eigh(mats[i, j], 16, method="subspace")
            assert torch.allclose(mu[i, j], mu1, rtol=1e-10, atol=0)
            assert torch.allclose(vec[i, j], vec1, atol=1e-8, rtol=0)


def test_plain_power_iteration_converges_on_a_separated_spectrum():
    n, m = 300, 8
    lam = torch.cat([2.0 ** -torch.arange(m + 4, dtype=F64), torch.zeros(n - m - 4, dtype=F64)])
    mat, q = known(n, lam, seed=2)
    mu, vec = top_eigh(mat, m, method="subspace", degree=1, max_iter=200)
    assert torch.allclose(mu, lam[:m], rtol=1e-10, atol=0)
    assert projector_gap(vec, q[:, :m]) <= 1e-8


def test_rank_deficient_matrix_block_reaching_the_null_space():
    n, m = 300, 8  # rank 12 < block of m + oversample = 16 columns: θ_k is round-off
    lam = torch.cat([2.0 ** -torch.arange(12, dtype=F64), torch.zeros(n - 12, dtype=F64)])
    mat, q = known(n, lam, seed=4)
    mu, vec = top_eigh(mat, m, method="subspace")
    assert torch.allclose(mu, lam[:m], rtol=1e-10, atol=0)
    assert torch.allclose(vec, gram.fix_signs(q[:, :m]), atol=1e-8, rtol=0)


def test_auto_dispatch_and_fallback(monkeypatch):
    mat = key_gram(320, 32, seed=5)
    full = gram.sorted_eigh(mat)
    mu, vec = top_eigh(mat, 16)  # N below the crossover: the full eigh itself
    assert torch.equal(mu, full[0][:16]) and torch.equal(vec, full[1][:, :16])
    monkeypatch.setattr(topk, "AUTO_CROSSOVER_N", 100)
    mu, vec = top_eigh(mat, 16)  # now the iterative path
    assert torch.allclose(mu, full[0][:16], rtol=1e-8, atol=0)
    with pytest.warns(RuntimeWarning, match="did not converge on 1 of 1"):
        mu, vec = top_eigh(mat, 16, max_iter=1, tol=1e-15)
    assert torch.allclose(mu, full[0][:16], rtol=1e-12, atol=0)  # fell back to the full eigh
    with pytest.raises(TopEighNotConverged, match="did not converge"):
        top_eigh(mat, 16, method="subspace", max_iter=1, tol=1e-15)


def test_zero_matrix_gives_zeros_not_nan():
    mu, vec = top_eigh(torch.zeros(2, 200, 200, dtype=F64), 4, method="subspace")
    assert torch.equal(mu, torch.zeros(2, 4, dtype=F64))
    gram = vec.transpose(-1, -2) @ vec
    assert torch.allclose(gram, torch.eye(4, dtype=F64).expand(2, 4, 4), atol=1e-12)


def test_lobpcg_matches_full():
    n, m = 300, 6
    lam = torch.cat([torch.tensor([10.0, 8.0, 6.0, 5.0, 4.0, 3.0, 1.0], dtype=F64),
                     torch.full((n - 7,), 0.1, dtype=F64)])
    mat, q = known(n, lam, seed=3)
    mu, vec = top_eigh(mat, m, method="lobpcg", tol=1e-10, max_iter=500)
    assert torch.allclose(mu, lam[:m], rtol=1e-8, atol=0)
    assert torch.allclose(vec, gram.fix_signs(q[:, :m]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(matrix=torch.zeros(3, 4, dtype=F64), m=2), ValueError, "square"),
    (dict(matrix=torch.zeros(4, 4, dtype=torch.long), m=2), ValueError, "floating"),
    (dict(matrix=torch.zeros(4, 4, dtype=F64), m=0), ValueError, "1 <= m <= N"),
    (dict(matrix=torch.zeros(4, 4, dtype=F64), m=5), ValueError, "1 <= m <= N"),
    (dict(matrix=torch.zeros(4, 4, dtype=F64), m=2, method="arpack"), ValueError, "unknown method"),
    (dict(matrix=torch.zeros(4, 4, dtype=F64), m=2, tol=0.0), ValueError, "tol"),
    (dict(matrix=torch.zeros(4, 4, dtype=F64), m=2, degree=0), ValueError, "degree"),
    (dict(matrix=torch.zeros(30, 30, dtype=F64), m=11, method="lobpcg"), ValueError, "N >= 3m"),
    (dict(matrix=torch.full((1, 4, 4), float("nan"), dtype=F64), m=2), NonFiniteError, "matrix"),
])
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        top_eigh(**kwargs)


def test_bench_solvers_checks_every_partial_eigensolver_against_the_full_eigh():
    """``python -m bench.run --solvers``: each top-m solver's eigenvalues and subspace are
    compared with the full batched eigh; one that fails to converge is a result, not a crash."""
    from bench.solvers import EIGEN_RTOL, measure_eigen

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 48, 48, generator=gen, dtype=torch.float64)
    spectrum = torch.logspace(0, -8, 48, dtype=torch.float64)
    q = torch.linalg.qr(x).Q
    mats = q @ torch.diag_embed(spectrum) @ q.transpose(-1, -2)
    res = measure_eigen([(mats, 8)], repeats=1)
    assert (res["n"], res["m"], res["matrices"]) == (48, 8, 4)
    assert res["torch eigh (full, batched)"]["agrees"]
    for name in ("numpy eigh (full, per matrix)", "scipy eigh subset evr", "scipy eigh subset evx"):
        assert res[name]["agrees"] and res[name]["mu_rel_err"] <= EIGEN_RTOL, name
    assert all("agrees" in row for row in res.values() if isinstance(row, dict))
