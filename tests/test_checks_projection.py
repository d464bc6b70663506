"""Known-answer tests for checks.projection (claim J, method §3), all in float64 on small shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn.functional as F

from checks.errors import NonFiniteError
from checks.gram import KeyGram, standardize_tokens
from checks.projection import (
    bessel_share,
    h_sq_norm,
    head_output,
    log_phi_sq_norm,
    log_phi_sq_norm_p1_code,
    magnitude_log10_ratio,
    p1_logged_value,
    phi_sq_norm,
    projection_terms,
    projection_terms_batched,
)
from checks.projection_summary import spearman_rho, term_attribution
from tests._helpers import F64, cross_path_terms, randn


def _direct_phi_sq(q, k, s):
    """‖φ(q)‖² = exp(s‖q‖²)/(Σ_j exp(s qᵀk_j))², the naive float64 formula."""
    return torch.exp(s * (q * q).sum(-1)) / torch.exp(s * q @ k.transpose(-1, -2)).sum(-1) ** 2


# --- Bessel on a hand-built KPCA head ---------------------------------------------------------

@pytest.mark.parametrize("queries", ["keys", "gaussian", "far", "shrunk_keys"])
def test_kpca_head_obeys_bessel_for_any_query(queries):
    """A head whose V is V̂ in the "kpca" convention (a_m/√μ_m) obeys ‖h_i‖² ≤ ‖φ(q_i)‖².

    With φ(x) = ϕ(x)/g(x) and u_m = Σ_j a_jm φ̃(k_j)/√μ_m (unit and mutually orthogonal, since
    u_mᵀu_n = a_mᵀK̃a_n/√(μ_mμ_n) = δ_mn), the m-th output coordinate is
    h_im = Σ_j softmax_j(s q_iᵀk_j) v̂_jm = φ(q_i)ᵀu_m. So h_i holds the coordinates of φ(q_i) on
    orthonormal axes and Bessel's inequality holds for *any* query, key or not; no centring of
    φ(q) is needed. With all N−1 axes of positive eigenvalue (N = 8 tokens, d = 7), ‖h_i‖² is the
    squared norm of φ(q_i)'s projection on span{φ̃(k_j)}: cᵢᵀK̃⁺cᵢ with c_ij = φ(q_i)ᵀφ̃(k_j)
    = (K_q H)_ij, K_q[i, j] = k(q_i, k_j)/(g(q_i) g_j) — an independent route through the
    pseudo-inverse, checked too. The N-th eigenvalue is ≈ 0 (K̃1 = 0) and is left out: 1/√μ would
    only amplify round-off.
    """
    n, d = 8, 7
    k = randn(n, d, seed=0)
    q = {"keys": k, "gaussian": randn(20, d, seed=1), "far": randn(20, d, seed=2, scale=3.0),
         "shrunk_keys": 0.5 * k + 0.1}[queries]
    kg = KeyGram(k)
    assert not bool(kg.undetermined) and float(kg.eigenvalues[n - 2]) > 1e-4
    v = kg.kpca_values("kpca")
    assert v.shape == (n, n - 1)

    out = projection_terms_batched(q, k, v)
    assert float(out["bessel_share"]) == 1.0
    assert torch.all(out["h_sq"] <= out["phi_sq"] * (1 + 1e-10))
    assert float(out["j_proj"]) >= 0.0

    # independent route: squared norm of the projection onto the centred key feature span
    s = kg.scale
    log_gq = torch.logsumexp(s * q @ k.T, dim=-1)
    kq = torch.exp(s * q @ k.T - log_gq[:, None] - kg.log_g[None, :])
    c = kq - kq.mean(dim=-1, keepdim=True)
    ref = ((c @ torch.linalg.pinv(kg.centred, hermitian=True, rtol=1e-12)) * c).sum(-1)
    torch.testing.assert_close(out["h_sq"], ref, rtol=1e-8, atol=0.0)


def test_bessel_can_fail_for_unnormalised_values():
    """Control: the same head with V̂ scaled ×10 breaks the bound, so the check has teeth."""
    k = randn(8, 7, seed=0)
    v = 10.0 * KeyGram(k).kpca_values("kpca")
    out = projection_terms_batched(k, k, v)
    assert float(out["bessel_share"]) < 1.0 and float(out["j_proj"]) < 0.0


# --- ‖φ(q)‖² in log space -----------------------------------------------------------------------

def test_log_space_phi_equals_direct_formula():
    q, k = randn(2, 3, 10, 6, seed=3), randn(2, 3, 10, 6, seed=4)
    s = 1 / math.sqrt(6)
    torch.testing.assert_close(phi_sq_norm(q, k), _direct_phi_sq(q, k, s), rtol=1e-12, atol=0.0)
    torch.testing.assert_close(phi_sq_norm(q, k, scale=0.3), _direct_phi_sq(q, k, 0.3),
                               rtol=1e-12, atol=0.0)


def test_phi_finite_for_inputs_scaled_by_50_known_answer():
    """q = c(e0 + e1), keys c·{e0, e0 + t·e1, e2, e3, −e0}, s = 1/2, c = 50.

    s c² (q·k) = 1250·{1, 1 + t, 0, 0, −1} and s c²‖q‖² = 2500, so with t = −ln 2/1250 the exact
    answer is ‖φ‖² = 1/(1 + 1/2 + 2e^−1250 + e^−2500)² = 4/9 in float64, while exp(2500) overflows.
    """
    c, t = 50.0, -math.log(2.0) / 1250.0
    e = torch.eye(4, dtype=F64)
    k = c * torch.stack([e[0], e[0] + t * e[1], e[2], e[3], -e[0]])
    q = c * (e[0] + e[1])[None]
    assert not torch.isfinite(_direct_phi_sq(q, k, 0.5)).any()
    torch.testing.assert_close(phi_sq_norm(q, k), torch.tensor([4.0 / 9.0], dtype=F64),
                               rtol=1e-10, atol=0.0)


def test_phi_finite_for_random_inputs_scaled_by_50_against_mpmath():
    mpmath = pytest.importorskip("mpmath")
    q, k = 50.0 * randn(5, 4, seed=5), 50.0 * randn(6, 4, seed=6)
    q = torch.cat([q, k[:2]])  # queries equal to keys too: ‖φ‖² ≤ exp(−s‖k‖²) underflows to 0
    s = 0.5
    assert not torch.isfinite(_direct_phi_sq(q, k, s)).all()
    log_phi = log_phi_sq_norm(q, k)
    phi = phi_sq_norm(q, k)
    assert torch.isfinite(log_phi).all() and torch.isfinite(phi).all()
    mpmath.mp.dps = 60
    for i in range(q.shape[0]):
        qi = [mpmath.mpf(float(x)) for x in q[i]]
        qq = sum(x * x for x in qi)
        g = sum(mpmath.exp(s * sum(a * mpmath.mpf(float(b)) for a, b in zip(qi, kj))) for kj in k)
        ref = s * qq - 2 * mpmath.log(g)
        assert abs(float(log_phi[i]) - float(ref)) <= 1e-12 * max(1.0, abs(float(ref)))
        assert float(phi[i]) == pytest.approx(float(mpmath.exp(ref)), rel=1e-9, abs=1e-300)


def test_phi_beyond_float64_raises_nonfinite():
    q, k = 50.0 * torch.ones(1, 4, dtype=F64), -50.0 * torch.ones(3, 4, dtype=F64)
    assert float(log_phi_sq_norm(q, k)[0]) > 800  # true value exceeds float64
    with pytest.raises(NonFiniteError, match="φ"):
        phi_sq_norm(q, k)


# --- head output ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [None, 0.7])
def test_head_output_equals_torch_sdpa(scale):
    q, k, v = randn(2, 3, 9, 5, seed=7), randn(2, 3, 11, 5, seed=8), randn(2, 3, 11, 4, seed=9)
    ref = F.scaled_dot_product_attention(q, k, v, scale=scale)
    torch.testing.assert_close(head_output(q, k, v, scale), ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(h_sq_norm(q, k, v, scale), (ref * ref).sum(-1), rtol=1e-12, atol=1e-14)


# --- P1's code ----------------------------------------------------------------------------------

def _p1_code_route(q, k, s):
    """P1's formula as its code wrote it: exp(q·q) / exp(2·q·k₀ − log(softmax_0(s·q·k)²))."""
    qk = q @ k.transpose(-1, -2)
    attn = torch.softmax(s * qk, dim=-1)
    num = torch.exp((q * q).sum(-1))
    den = torch.exp(2 * qk[..., 0] - torch.log(attn[..., 0] ** 2))
    return num / den


@pytest.mark.parametrize("standardize", [False, True])
def test_p1_code_variant_matches_closed_form(standardize):
    q, k, v = randn(2, 3, 7, 8, seed=10), randn(2, 3, 7, 8, seed=11), randn(2, 3, 7, 8, seed=12)
    s = 1 / math.sqrt(8)
    out = projection_terms_batched(q, k, v, standardize=standardize, variant="p1-code")
    exact = projection_terms_batched(q, k, v, standardize=standardize)
    qs, ks = (standardize_tokens(q), standardize_tokens(k)) if standardize else (q, k)
    # route 1: P1's code transcribed
    torch.testing.assert_close(out["phi_sq"], _p1_code_route(qs, ks, s), rtol=1e-10, atol=0.0)
    # route 2: closed form exp(q·q − 2(1−s)·q·k₀)/g(q)², g from a plain exp-sum
    g = torch.exp(s * qs @ ks.transpose(-1, -2)).sum(-1)
    qk0 = (qs * ks[..., :1, :]).sum(-1)
    closed = torch.exp((qs * qs).sum(-1) - 2 * (1 - s) * qk0) / g**2
    torch.testing.assert_close(out["phi_sq"], closed, rtol=1e-10, atol=0.0)
    # relative to the exact value: exp((1−s)(q·q − 2 q·k₀))
    ratio = torch.exp((1 - s) * ((qs * qs).sum(-1) - 2 * qk0))
    torch.testing.assert_close(out["phi_sq"] / exact["phi_sq"], ratio, rtol=1e-10, atol=0.0)
    torch.testing.assert_close(out["h_sq"], exact["h_sq"], rtol=0.0, atol=0.0)
    torch.testing.assert_close(torch.exp(log_phi_sq_norm_p1_code(qs, ks)), out["phi_sq"],
                               rtol=1e-14, atol=0.0)


def test_p1_logged_value():
    q, k, v = randn(2, 6, 8, seed=13), randn(2, 6, 8, seed=14), 0.1 * randn(2, 6, 8, seed=15)
    q, k = standardize_tokens(q), standardize_tokens(k)
    out = projection_terms_batched(q, k, v, variant="p1-code")
    err = (out["phi_sq"] - out["h_sq"]).numpy()
    assert float(p1_logged_value(out["phi_sq"], out["h_sq"])) == pytest.approx(
        np.log(err.mean()), rel=1e-12)
    np.testing.assert_allclose(p1_logged_value(out["phi_sq"], out["h_sq"], dim=-1).numpy(),
                               np.log(err.mean(-1)), rtol=1e-12)
    with pytest.raises(ValueError, match="mean error is ≤ 0"):
        p1_logged_value(torch.tensor([1e-3, 1e-3], dtype=F64), torch.tensor([1.0, 2.0], dtype=F64))


# --- summaries ------------------------------------------------------------------------------------

def test_bessel_share_and_magnitude_known_answers():
    phi = torch.tensor([[1e-3, 1e-3, 1e-3, 1e-3], [1.0, 2.0, 3.0, 4.0]], dtype=F64)
    h = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.5, 2.0, 3.5, 5.0]], dtype=F64)
    torch.testing.assert_close(bessel_share(phi, h), torch.tensor([0.0, 0.5], dtype=F64))
    torch.testing.assert_close(bessel_share(phi, h, rtol=0.2), torch.tensor([0.0, 0.75], dtype=F64))
    ratio = magnitude_log10_ratio(phi, h)  # means: 1/1e-3 and 2.75/2.5
    torch.testing.assert_close(ratio, torch.tensor([3.0, math.log10(1.1)], dtype=F64))
    torch.testing.assert_close(magnitude_log10_ratio(phi, h, log_phi_sq=phi.log()), ratio)
    # log-space mean survives ‖φ‖² that underflow to 0
    log_phi = torch.full((3,), -800.0, dtype=F64)
    assert float(magnitude_log10_ratio(log_phi.exp(), torch.ones(3, dtype=F64), log_phi)) == \
        pytest.approx(800 / math.log(10), rel=1e-14)
    with pytest.raises(ValueError, match="undefined"):
        magnitude_log10_ratio(phi, torch.zeros_like(h))


def test_projection_terms_single_head_and_shapes():
    q, k, v = randn(6, 4, seed=16), randn(6, 4, seed=17), randn(6, 4, seed=18)
    out = projection_terms(q.float(), k.float(), v.float())
    assert set(out) == {"phi_sq", "h_sq", "j_proj"}
    assert out["phi_sq"].dtype == F64 and out["phi_sq"].shape == (6,) and out["h_sq"].shape == (6,)
    assert isinstance(out["j_proj"], float)
    ref = _direct_phi_sq(q.float().double(), k.float().double(), 0.5)
    torch.testing.assert_close(out["phi_sq"], ref, rtol=1e-12, atol=0.0)
    assert out["j_proj"] == pytest.approx(float((out["phi_sq"] - out["h_sq"]).mean()), rel=1e-15)


def test_batched_equals_per_item():
    q, k, v = randn(2, 3, 7, 5, seed=19), randn(2, 3, 7, 5, seed=20), randn(2, 3, 7, 5, seed=21)
    for variant in ("exact", "p1-code"):
        out = projection_terms_batched(q, k, v, standardize=True, variant=variant)
        assert out["j_proj"].shape == (2, 3) and out["phi_sq"].shape == (2, 3, 7)
        for b in range(2):
            for h in range(3):
                one = projection_terms(q[b, h], k[b, h], v[b, h], standardize=True, variant=variant)
                torch.testing.assert_close(out["phi_sq"][b, h], one["phi_sq"], rtol=1e-14, atol=0.0)
                torch.testing.assert_close(out["h_sq"][b, h], one["h_sq"], rtol=1e-14, atol=0.0)
                assert float(out["j_proj"][b, h]) == pytest.approx(one["j_proj"], rel=1e-13)


def test_scale_invariance():
    """Scaling q and k by c is the same as scaling s by c²."""
    q, k, v = randn(3, 6, 4, seed=22), randn(3, 6, 4, seed=23), randn(3, 6, 4, seed=24)
    a = projection_terms_batched(2.0 * q, 2.0 * k, v, scale=0.3)
    b = projection_terms_batched(q, k, v, scale=1.2)
    for key in ("phi_sq", "h_sq", "j_proj", "log10_ratio"):
        torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=1e-15)


def test_bad_inputs_raise():
    q, k, v = randn(2, 5, 4, seed=25), randn(2, 5, 4, seed=26), randn(2, 5, 3, seed=27)
    with pytest.raises(ValueError, match="variant"):
        projection_terms_batched(q, k, v, variant="p1")
    with pytest.raises(ValueError, match="head dimension"):
        projection_terms_batched(q, k[..., :3], v)
    with pytest.raises(ValueError, match="values"):
        projection_terms_batched(q, k, v[:, :4])
    with pytest.raises(ValueError, match="one head"):
        projection_terms(q, k, v)
    with pytest.raises(ValueError, match="scale"):
        projection_terms_batched(q, k, v, scale=-1.0)
    bad = q.clone()
    bad[1, 2, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"queries at batch index \(1,\)"):
        projection_terms_batched(bad, k, v)


# --- trend statistics ---------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_spearman_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=12)
    if seed % 2:  # ties in both series
        values = np.round(values)
        steps = np.repeat(np.arange(6), 2).astype(float)
    else:
        steps = rng.permutation(12).astype(float) * 100
    ref = scipy.stats.spearmanr(values, steps).statistic
    assert spearman_rho(torch.tensor(values), torch.tensor(steps)) == pytest.approx(ref, abs=1e-14)


def test_spearman_monotone_and_degenerate():
    steps = torch.arange(10, dtype=F64)
    falling = torch.exp(-steps) + 3.0  # strictly decreasing, non-linear
    assert spearman_rho(falling, steps) == pytest.approx(-1.0, abs=1e-15)
    assert spearman_rho(-falling, steps) == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError, match="constant"):
        spearman_rho(torch.ones(5, dtype=F64), torch.arange(5.0))
    with pytest.raises(ValueError, match="T ≥ 2"):
        spearman_rho(torch.ones(1, dtype=F64), torch.ones(1, dtype=F64))


def test_term_attribution_known_answers():
    # only ‖h‖² falls (P2-logs shape: ‖φ‖² flat at 1e-3, ‖h‖² 4.90 → 1.86)
    out = term_attribution(torch.full((5,), 1e-3, dtype=F64),
                           torch.tensor([4.90, 3.2, 2.5, 2.0, 1.86], dtype=F64))
    assert float(out["share_h"]) == 1.0 and float(out["share_phi"]) == 0.0
    assert float(out["delta_j"]) == pytest.approx(3.04, rel=1e-12) and bool(out["defined"])
    # both move; batched over two layers: φ +1, h −3 → ΔJ = 4; and only φ moves
    phi = torch.tensor([[1.0, 1.5, 2.0], [0.0, 0.5, 2.0]], dtype=F64)
    h = torch.tensor([[5.0, 3.0, 2.0], [1.0, 1.0, 1.0]], dtype=F64)
    out = term_attribution(phi, h)
    torch.testing.assert_close(out["share_phi"], torch.tensor([0.25, 1.0], dtype=F64))
    torch.testing.assert_close(out["share_h"], torch.tensor([0.75, 0.0], dtype=F64))
    torch.testing.assert_close(out["share_phi"] + out["share_h"], torch.ones(2, dtype=F64))
    torch.testing.assert_close(out["j_last"] - out["j_first"], out["delta_j"])
    # ΔJ = 0: terms cancel, or nothing moves → shares 0, flagged, no NaN
    out = term_attribution(torch.tensor([[1.0, 2.0], [1.0, 1.0]], dtype=F64),
                           torch.tensor([[3.0, 4.0], [3.0, 3.0]], dtype=F64))
    assert not out["defined"].any()
    assert torch.equal(out["share_phi"], torch.zeros(2, dtype=F64))
    assert torch.equal(out["share_h"], torch.zeros(2, dtype=F64))
    with pytest.raises(ValueError, match="same shape"):
        term_attribution(torch.ones(3, dtype=F64), torch.ones(4, dtype=F64))


# --- The output fit (method §3.6): a head's numbers do not depend on its batch beyond round-off

@pytest.mark.parametrize("n", [65, 79, 80])
def test_output_fit_of_one_head_alone_agrees_with_the_same_head_inside_a_batch(n):
    """claims.claim_j_layer.output_fit_terms gives a head alone ([1, 1, n, d], as a
    --max-memory split gives it) the numbers it has inside a batch of 2 samples × 5 heads, and in
    the reversed head order, within tests._helpers.cross_path_terms (1e-12 relative; method §6.1).
    Odd n is the case where the bits may differ: every second n×n matrix of the batch does not
    start on a 16-byte boundary, and MKL's eigh and products round it differently (~1e-16 in V̂).
    The values also agree with an independent route: each head's V̂ from NumPy's eigh of the
    explicitly centred Gram (bench.loop_reference_kpca), then checks.output_fit.kpca_output_fit."""
    from checks.nulls import shuffled_token_null, token_permutations
    from checks.output_fit import kpca_output_fit
    from claims.claim_j_layer import output_fit_terms

    b, h, d = 2, 5, 32
    q, k, v = (randn(b, h, n, d, seed=n + i) for i in range(3))
    s = d ** -0.5
    perm = token_permutations(n, n, (b, h))
    whole = output_fit_terms(q, k, v, s, "p2", perm)
    assert {name: tuple(x.shape) for name, x in whole.items()} == {
        "r2": (b, h), "r2_null": (b, h), "fitted_h_sq": (b, h, n)}
    for i in range(b):
        for j in range(h):
            one = output_fit_terms(q[i:i + 1, j:j + 1], k[i:i + 1, j:j + 1], v[i:i + 1, j:j + 1],
                                   s, "p2", perm[i:i + 1, j:j + 1])
            for name, value in whole.items():
                torch.testing.assert_close(one[name][0, 0], value[i, j],
                                           **cross_path_terms(value[i, j]), msg=name)
    flipped = output_fit_terms(q.flip(1), k.flip(1), v.flip(1), s, "p2", perm.flip(1))
    for name, value in whole.items():
        torch.testing.assert_close(flipped[name].flip(1), value, **cross_path_terms(value),
                                   msg=name)
    # an independent route: V̂ head by head from NumPy's eigh of the explicitly centred Gram
    # (bench.loop_reference_kpca); the fit is invariant to the eigenvectors' signs
    from bench.loop_reference_kpca import centred_gram, centring_matrix

    def plain_v_hat(keys: torch.Tensor) -> torch.Tensor:
        _, k_centred, log_g = centred_gram(keys.numpy(), s)
        vecs = np.linalg.eigh(k_centred)[1][:, ::-1][:, :d]
        return torch.from_numpy(np.exp(-log_g)[:, None] * (centring_matrix(n) @ vecs))

    v_hat = torch.stack([torch.stack([plain_v_hat(k[i, j]) for j in range(h)]) for i in range(b)])
    probs = torch.softmax(s * q @ k.transpose(-1, -2), dim=-1)
    batched = kpca_output_fit(probs, v, v_hat, shuffled_token_null(v, perm))
    for name, value in whole.items():
        torch.testing.assert_close(value, batched[name], rtol=1e-9, atol=1e-12, msg=name)
    assert float(whole["r2"].min()) > 0.0 and float(whole["r2"].max()) < 1.0  # a real fit


def test_the_output_fits_least_squares_is_gelsds_on_every_kind_of_item():
    """checks/output_fit.py ``least_squares_fit``: Q(Qᵀt) where the R of x's QR certifies full
    rank, gelsd elsewhere; on a batch of full-rank, rank-deficient, ill-conditioned (σ ratio
    1e-9, still full rank by gelsd's rule) and zero items it equals the fit of gelsd itself."""
    from checks.output_fit import least_squares_fit

    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 2, 40, 8, generator=g, dtype=torch.float64)
    x[1, 0, :, 3] = 2.0 * x[1, 0, :, 1] - x[1, 0, :, 5]         # rank 7
    x[2, 1, :, :4] = 0.0                                          # rank 4
    x[3, 0] = x[3, 0] @ torch.diag(torch.logspace(0, -9, 8, dtype=torch.float64))
    x[4, 1] = 0.0                                                 # nothing to fit with
    t = torch.randn(6, 1, 40, 5, generator=g, dtype=torch.float64).expand(6, 2, 40, 5)
    ref = x @ torch.linalg.lstsq(x, t, driver="gelsd").solution
    got = least_squares_fit(x, t)
    assert torch.allclose(got, ref, rtol=0, atol=1e-10 * float(t.abs().max()))
    assert float(got[4, 1].abs().max()) == 0.0
