"""The exact random initialisation (fixtures/models/families/exact_random.py, method §13): its arithmetic
against known answers and independent routes (libm, SciPy, NumPy's own uniforms), the laws it
draws, the build context (what it replaces, what it refuses, what it leaves alone) and the
kpca-oracle's exact linear algebra. That the weights are the same under other CPU settings is
tests/test_cpu_emulation.py::test_random_init_weights_are_the_same_under_every_setting.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch
from torch import nn

from fixtures.models.families import exact_random as xr
from fixtures.models.families import kpca_oracle as oracle


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / np.spacing(np.abs(b))


def test_log_and_exp_agree_with_libm_within_two_ulps_and_hit_known_values():
    x = np.concatenate([np.logspace(-300, 300, 4001), np.linspace(0.5, 2.0, 4001)])
    assert _ulps(xr.log(x), np.array([math.log(v) for v in x]))[x != 1.0].max() <= 2.0
    y = np.linspace(-700.0, 700.0, 14001)
    assert _ulps(xr.exp(y), np.array([math.exp(v) for v in y])).max() <= 2.0
    assert xr.log(1.0) == 0.0 and xr.exp(0.0) == 1.0
    k = np.arange(-60, 61, dtype=np.float64)
    assert np.allclose(xr.log(np.ldexp(1.0, k.astype(int))), k * 0.6931471805599453, rtol=4e-16, atol=0)
    with pytest.raises(ValueError, match="outside"):
        xr.exp(800.0)


def test_ndtri_and_erfinv_agree_with_scipy_within_acklams_bound():
    p = np.concatenate([np.logspace(-300, -1, 3000), np.linspace(1e-6, 1 - 1e-6, 100001),
                        1.0 - np.logspace(-16, -1, 1000)])
    got, ref = xr.ndtri(p), scipy.special.ndtri(p)
    keep = ref != 0.0
    assert (np.abs(got - ref)[keep] / np.abs(ref[keep])).max() < 1.2e-9  # Acklam's stated bound
    assert xr.ndtri(0.5) == 0.0
    assert xr.ndtri(np.array([0.0, 1.0])).tolist() == [-math.inf, math.inf]
    y = np.linspace(-0.999999, 0.999999, 20001)
    assert np.allclose(xr.erfinv(y), scipy.special.erfinv(y), rtol=1.2e-9, atol=1e-15)
    with pytest.raises(ValueError, match="outside"):
        xr.ndtri(1.5)


def test_uniforms_are_numpys_pcg64_uniforms_on_the_midpoint_grid_and_chunking_changes_no_bit():
    ours = xr.ExactRandom(7).uniform(200_003)
    numpy_route = np.random.Generator(np.random.PCG64(7)).random(200_003)  # (raw >> 11)·2⁻⁵³
    assert np.array_equal(ours, (np.floor(numpy_route * 2.0 ** 52) + 0.5) * 2.0 ** -52)
    assert 0.0 < ours.min() and ours.max() < 1.0
    rng = xr.ExactRandom(7)
    parts = np.concatenate([rng.uniform(5), rng.uniform(70_000), rng.uniform(130_000 - 2)])
    assert np.array_equal(parts, ours)
    a, b = xr.ExactRandom(3).normal(10_000, 1.5, 0.25), xr.ExactRandom(3).normal(10_000, 1.5, 0.25)
    assert np.array_equal(a, b) and not np.array_equal(a, xr.ExactRandom(4).normal(10_000, 1.5, 0.25))


def test_normal_draws_follow_the_normal_law():
    z = xr.ExactRandom(11).normal(200_000)
    assert abs(z.mean()) < 5 / math.sqrt(z.size) and abs(z.std() - 1.0) < 0.01
    assert scipy.stats.kstest(z, "norm").pvalue > 1e-3
    u = xr.ExactRandom(12).uniform(200_000, -2.0, 3.0)
    assert -2.0 < u.min() and u.max() < 3.0 and scipy.stats.kstest(u, "uniform", (-2.0, 5.0)).pvalue > 1e-3


def test_permutations_are_permutations_and_vary():
    rng = xr.ExactRandom(5)
    perms = [tuple(rng.permutation(8)) for _ in range(200)]
    assert all(sorted(p) == list(range(8)) for p in perms)
    firsts = np.bincount([p[0] for p in perms], minlength=8)
    assert firsts.min() > 5 and len(set(perms)) > 190  # each first element drawn; nearly all distinct


def test_the_init_laws_of_torch_and_timm_are_kept_inside_the_context():
    import timm.layers

    before = torch.random.get_rng_state()
    with xr.exact_init(0):
        lin = nn.Linear(400, 300)  # kaiming_uniform_(a=√5): U(±1/√400) weights and biases
        ln = nn.LayerNorm(300)
        trunc = nn.init.trunc_normal_(torch.empty(50_000), mean=0.1, std=0.5, a=-0.3, b=0.6)
        timm_trunc = timm.layers.trunc_normal_(torch.empty(50_000), std=0.02)
        normal = nn.init.normal_(torch.empty(50_000, dtype=torch.float64), mean=2.0, std=3.0)
        randn = torch.randn(4, 5, dtype=torch.float64)
        rand = torch.rand(3, 7)
    assert torch.equal(before, torch.random.get_rng_state())
    bound = 1 / math.sqrt(400)
    assert lin.weight.abs().max() <= bound and lin.weight.abs().max() > 0.99 * bound
    assert abs(float(lin.weight.detach().std()) - bound / math.sqrt(3)) < 0.01 * bound
    assert torch.equal(ln.weight, torch.ones(300)) and torch.equal(ln.bias, torch.zeros(300))
    assert float(trunc.min()) >= -0.3 and float(trunc.max()) <= 0.6
    law = scipy.stats.truncnorm((-0.3 - 0.1) / 0.5, (0.6 - 0.1) / 0.5, loc=0.1, scale=0.5)
    assert scipy.stats.kstest(trunc.double().numpy(), law.cdf).pvalue > 1e-3
    assert abs(float(timm_trunc.std()) - 0.02) < 0.0005 and abs(float(timm_trunc.mean())) < 0.0005
    assert abs(float(normal.mean()) - 2.0) < 0.05 and abs(float(normal.std()) - 3.0) < 0.05
    assert randn.shape == (4, 5) and randn.dtype == torch.float64
    assert rand.dtype == torch.float32 and 0 <= float(rand.min()) and float(rand.max()) < 1
    with xr.exact_init(0):
        again = nn.Linear(400, 300)
    assert torch.equal(again.weight, lin.weight) and torch.equal(again.bias, lin.bias)


def test_outside_the_context_torch_is_untouched():
    originals = {name: getattr(torch.Tensor, name) for name in ("uniform_", "normal_", "erfinv_")}
    randn = torch.randn
    with xr.exact_init(0):
        assert torch.Tensor.uniform_ is not originals["uniform_"] and torch.randn is not randn
    assert {name: getattr(torch.Tensor, name) for name in originals} == originals
    assert torch.randn is randn and "uniform_" not in torch.Tensor.__dict__


@pytest.mark.parametrize("call, name", [
    (lambda: torch.randperm(5), "torch.randperm"),
    (lambda: torch.empty(3).bernoulli_(0.5), "Tensor.bernoulli_"),
    (lambda: torch.empty(3).random_(), "Tensor.random_"),
    (lambda: nn.init.orthogonal_(torch.empty(4, 4)), "torch.linalg.qr"),
])
def test_random_ops_without_an_exact_form_are_refused_inside_the_context(call, name):
    with xr.exact_init(0):
        with pytest.raises(RuntimeError, match=f"{name.replace('.', '[.]')} was called while "
                                               "building a model from a seed"):
            call()
    call()  # and work again outside it


def test_other_threads_keep_torchs_own_functions_during_a_build():
    from concurrent.futures import ThreadPoolExecutor

    with xr.exact_init(0), ThreadPoolExecutor(1) as pool:
        got = pool.submit(lambda: torch.randperm(6, generator=torch.Generator().manual_seed(1))).result()
        with pytest.raises(RuntimeError, match="torch[.]randperm was called"):
            torch.randperm(6)  # refused in the building thread only
    assert torch.equal(got, torch.randperm(6, generator=torch.Generator().manual_seed(1)))


def test_one_context_at_a_time_and_a_bad_seed_is_refused():
    with xr.exact_init(0):
        with pytest.raises(RuntimeError, match="already active"):
            with xr.exact_init(1):
                pass
    with pytest.raises(ValueError, match="integer ≥ 0"):
        xr.ExactRandom(-1)


def test_exact_matmul_and_orthogonal_against_numpy():
    rng = xr.ExactRandom(9)
    a, b = rng.normal(3 * 5 * 4).reshape(3, 5, 4), rng.normal(3 * 4 * 6).reshape(3, 4, 6)
    assert np.allclose(xr.matmul(a, b), a @ b, rtol=0, atol=1e-13)
    q = xr.orthogonal(8, rng)
    assert np.abs(q.T @ q - np.eye(8)).max() < 1e-14
    x = rng.normal(12).reshape(3, 4)
    assert np.allclose(xr.row_norms(x)[:, 0], np.linalg.norm(x, axis=1), rtol=1e-15)


@pytest.mark.parametrize("name", ["rotated", "mixed-cond10", "mixed-cond1000", "scaled-100",
                                  "signs", "permuted"])
def test_oracle_mixing_pairs_are_inverse_and_have_their_condition(name):
    member = oracle.MEMBERS[name]
    m, inv = oracle.mixing_pair(member, 8, xr.ExactRandom(2))
    m, inv = m.numpy(), inv.numpy()
    scale = max(1.0, float(member.value)) if member.mix in ("cond", "scale") else 1.0
    assert np.abs(m @ inv - np.eye(8)).max() < 1e-12 * scale
    sv = np.linalg.svd(m, compute_uv=False)  # an independent route to cond(M)
    want = float(member.value) if member.mix == "cond" else 1.0
    assert sv[0] / sv[-1] == pytest.approx(want, rel=1e-9)
    if member.mix == "cond":
        assert abs(np.linalg.det(m)) == pytest.approx(1.0, rel=1e-9)
    if member.mix == "permutation":
        assert not np.any(np.diag(m))  # no column stays
    if member.mix == "signs":
        assert sorted(np.diag(m).tolist()) == [-1.0] * 4 + [1.0] * 4
