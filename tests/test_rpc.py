"""RPC-Attention and claim R (method §15): robust PCA on hand-built splits, PAP against an
independent per-matrix reference, n_iter = 0 as symmetric softmax attention, shapes and batching,
gradients for the attacks, the digits-C corruptions, the paired interval against SciPy, the
verdict rules on constructed outcomes, the ``rpc`` marker's selection and the report section."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from checks import corruptions
from checks.paired import paired_difference
from checks.pap import (effective_rank, nonzero_share, numerical_rank, pap_attention, pap_mu,
                        principal_component_pursuit, shrink, singular_value_threshold)
from claims import claim_r
from fixtures.training import TrainConfig, build_model, digits_split
from fixtures.training.rpc_attention import RPC_SETTINGS, RPCAttention, rpc_modules

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------ robust PCA
def test_principal_component_pursuit_recovers_a_hand_built_split():
    """Rank-2 L₀ plus 5% sparse spikes S₀: Candès et al.'s ALM recovers both (exact recovery
    regime: low rank, few corruptions)."""
    g = _gen(0)
    n = 60
    low = torch.randn(n, 2, generator=g, dtype=F64) @ torch.randn(2, n, generator=g, dtype=F64)
    sparse = torch.zeros(n, n, dtype=F64)
    where = torch.rand(n, n, generator=g) < 0.05
    sparse[where] = (torch.randint(0, 2, (int(where.sum()),), generator=g) * 2 - 1).to(F64) * 10
    split = principal_component_pursuit(low + sparse, tol=1e-9)
    assert split.residual < 1e-9
    assert float(torch.linalg.matrix_norm(split.low_rank - low) / torch.linalg.matrix_norm(low)) < 1e-5
    assert float((split.sparse - sparse).abs().max()) < 1e-4
    assert int(numerical_rank(split.low_rank, rtol=1e-6)) == 2
    assert torch.equal(split.sparse.abs() > 1e-3, where)


def test_shrink_and_singular_value_threshold_known_answers():
    x = torch.tensor([-3.0, -1.0, 0.5, 2.5], dtype=F64)
    assert shrink(x, 1.0).tolist() == [-2.0, 0.0, 0.0, 1.5]
    u, _ = torch.linalg.qr(torch.randn(5, 3, generator=_gen(1), dtype=F64))
    v, _ = torch.linalg.qr(torch.randn(4, 3, generator=_gen(2), dtype=F64))
    m = u @ torch.diag(torch.tensor([5.0, 2.0, 0.5], dtype=F64)) @ v.T
    expected = u @ torch.diag(torch.tensor([4.0, 1.0, 0.0], dtype=F64)) @ v.T
    assert torch.allclose(singular_value_threshold(m, 1.0), expected, atol=1e-12)


# ------------------------------------------------------------------------------ PAP
def _pap_reference(k: np.ndarray, v: np.ndarray, scale: float, n_iter: int, lam: float,
                   features: int) -> tuple[np.ndarray, np.ndarray | None]:
    """P1's Algorithm 1 for one N×d matrix, in numpy loops (an independent route)."""
    n, d = k.shape
    if n_iter == 0:
        s_ = scale * k @ k.T
        a = np.exp(s_ - s_.max(1, keepdims=True))
        return (a / a.sum(1, keepdims=True)) @ v, None
    mu = n * features / (4 * np.abs(k).sum())
    low, dual, sp = np.zeros_like(k), np.zeros_like(k), None
    for _ in range(n_iter):
        z = k - low + dual / mu
        sp = np.where(z > lam * mu, z - lam * mu, np.where(z < -lam * mu, z + lam * mu, 0.0))
        c = k - sp - dual / mu
        s_ = scale * c @ c.T
        a = np.exp(s_ - s_.max(1, keepdims=True))
        low = (a / a.sum(1, keepdims=True)) @ v
        dual = dual + mu * (k - low - sp)
    return low, sp


@pytest.mark.parametrize("n_iter", [0, 1, 2, 4])
def test_pap_matches_a_per_matrix_reference_in_every_batch_entry(n_iter):
    k = torch.randn(2, 3, 9, 4, generator=_gen(3), dtype=F64) * 1.5
    v = torch.randn(2, 3, 9, 4, generator=_gen(4), dtype=F64)
    result = pap_attention(k, v, 0.5, n_iter, lam=0.3, features=12)
    assert result.out.shape == (2, 3, 9, 4) and result.attn.shape == (2, 3, 9, 9)
    for b in range(2):
        for h in range(3):
            out, sp = _pap_reference(k[b, h].numpy(), v[b, h].numpy(), 0.5, n_iter, 0.3, 12)
            np.testing.assert_allclose(result.out[b, h].numpy(), out, rtol=1e-10, atol=1e-12)
            if n_iter:
                np.testing.assert_allclose(result.sparse[b, h].numpy(), sp, rtol=1e-10, atol=1e-12)
    assert (result.sparse is None) == (n_iter == 0)


def test_n_iter_zero_is_symmetric_softmax_attention_in_the_module():
    torch.manual_seed(0)
    attn = RPCAttention(dim=24, num_heads=3, qkv_bias=True, n_iter=0).double()
    x = torch.randn(2, 7, 24, generator=_gen(5), dtype=F64)
    k, v = attn.keys_values(x)
    expected = torch.softmax(k @ k.transpose(-1, -2) / math.sqrt(8), -1) @ v
    expected = attn.proj(expected.transpose(1, 2).reshape(2, 7, 24))
    assert torch.allclose(attn(x), expected, atol=1e-12)
    # symmetric: the attention logits matrix is symmetric before the softmax
    logits = k @ k.transpose(-1, -2)
    assert torch.allclose(logits, logits.transpose(-1, -2))


def test_pap_mu_is_n_c_over_four_l1():
    k = torch.full((1, 1, 5, 2), -0.5, dtype=F64)  # ‖K‖₁ = 5
    assert float(pap_mu(k)) == pytest.approx(5 * 2 / (4 * 5))
    assert float(pap_mu(k, features=8)) == pytest.approx(5 * 8 / (4 * 5))


def test_pap_sparse_part_finds_spiked_keys_and_cleans_the_attention():
    """Keys = a low-rank part + a few large spikes: one PAP step with the soft threshold λμ just
    above every clean entry puts exactly the spikes in S, clips them to the threshold in the
    cleaned keys, and the attention of the cleaned keys is closer to the spike-free attention
    than softmax attention of the raw keys is."""
    g = _gen(6)
    n, d = 16, 8
    base = torch.randn(n, 2, generator=g, dtype=F64) @ torch.randn(2, d, generator=g, dtype=F64)
    where = torch.zeros(n, d, dtype=torch.bool)
    where[torch.arange(0, n, 3), torch.arange(0, n, 3) % d] = True
    k = (base + 30.0 * where)[None, None]
    v = torch.randn(1, 1, n, d, generator=g, dtype=F64)
    tau = float(base.abs().max()) + 0.1
    lam = tau / float(pap_mu(k))  # soft threshold λμ = tau
    result = pap_attention(k, v, d ** -0.5, n_iter=1, lam=lam)
    assert torch.equal(result.sparse[0, 0] != 0, where)
    cleaned = k - result.sparse
    assert torch.allclose(cleaned[0, 0][where], torch.full((int(where.sum()),), tau, dtype=F64))
    assert torch.equal(cleaned[0, 0][~where], base[~where])
    clean = pap_attention(base[None, None], v, d ** -0.5, n_iter=0, lam=1.0).attn
    raw = pap_attention(k, v, d ** -0.5, n_iter=0, lam=1.0).attn
    assert float((result.attn - clean).abs().mean()) < 0.5 * float((raw - clean).abs().mean())
    assert float(nonzero_share(result.sparse)) == pytest.approx(float(where.double().mean()))


def test_rpc_attention_shapes_batching_and_gradients():
    torch.manual_seed(1)
    attn = RPCAttention(dim=32, num_heads=4, qkv_bias=True, n_iter=4, lam=4.0)
    x = torch.randn(3, 10, 32, generator=_gen(7), requires_grad=True)
    out = attn(x)
    assert out.shape == (3, 10, 32) and torch.isfinite(out).all()
    # batching: each sample alone gives the same output (μ is per sample and head)
    for b in range(3):
        assert torch.allclose(attn(x[b:b + 1]), out[b:b + 1], atol=1e-6)
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all() and float(x.grad.abs().sum()) > 0
    assert attn.mu_features == 32  # P1's code: μ from the embedding dimension
    with pytest.raises(NotImplementedError, match="attention mask"):
        attn(x.detach(), attn_mask=torch.ones(10, 10, dtype=torch.bool))


def test_variants_put_pap_where_p1_recommends():
    common = dict(depth=2, embed_dim=32, num_heads=4, img_size=16, patch_size=4)
    sym = build_model(TrainConfig(variant="symvit", **common))
    rpc = build_model(TrainConfig(variant="rpc-symvit", **common))
    assert [m.n_iter for _, m in rpc_modules(sym)] == [0, 0]
    assert [m.n_iter for _, m in rpc_modules(rpc)] == [
        RPC_SETTINGS["n_iter"] if i in RPC_SETTINGS["layers"] else 0 for i in range(2)]
    assert sym.state_dict().keys() == rpc.state_dict().keys()
    x = torch.randn(2, 1, 16, 16, generator=_gen(8))
    assert sym(x).shape == rpc(x).shape == (2, 10)


def test_readout_rank_helpers_known_answers():
    assert float(effective_rank(torch.eye(3, dtype=F64))) == pytest.approx(3.0)
    rank1 = torch.ones(4, 3, dtype=F64)
    assert float(effective_rank(rank1)) == pytest.approx(1.0)
    assert int(numerical_rank(rank1)) == 1
    assert float(effective_rank(torch.zeros(3, 3, dtype=F64))) == 0.0


# ------------------------------------------------------------------------------ attacks, data
def _linear_model():
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)).double()


def test_fgsm_and_pgd_stay_in_the_ball_and_raise_the_loss():
    from fixtures.engine.rpc_study import fgsm, pgd

    model = _linear_model()
    x = torch.rand(8, 1, 4, 4, generator=_gen(9), dtype=F64)
    y = model(x).argmax(-1)
    for adv in (fgsm(model, x, y, 0.05), pgd(model, x, y, 0.05, steps=10, seed=1)):
        assert float((adv - x).abs().max()) <= 0.05 + 1e-12
        assert adv.min() >= 0 and adv.max() <= 1
        loss = torch.nn.functional.cross_entropy
        with torch.no_grad():
            assert float(loss(model(adv), y)) > float(loss(model(x), y))
    # FGSM on a linear model moves every pixel by ε in the sign of the gradient (unless clipped)
    adv = fgsm(model, x, y, 0.05)
    inside = (x > 0.05) & (x < 0.95)
    assert torch.allclose((adv - x).abs()[inside], torch.full_like(x, 0.05)[inside])
    # PGD is deterministic given its seed
    assert torch.equal(pgd(model, x, y, 0.05, 3, seed=4), pgd(model, x, y, 0.05, 3, seed=4))


def test_pixel_digits_are_what_the_models_see():
    from fixtures.engine.rpc_study import RECIPE, pixel_digits

    config = TrainConfig(variant="symvit", **RECIPE)
    x, y, mean, std = pixel_digits(config)
    split = digits_split(config)
    assert torch.allclose((x - mean) / std, split.test_images, atol=1e-6)
    assert torch.equal(y, split.test_labels)
    assert float(x.min()) >= 0 and float(x.max()) <= 1


def test_corruptions():
    x = torch.rand(4, 1, 16, 16, generator=_gen(10))
    hit = corruptions.corrupt(x, "impulse", 0.2, seed=3)
    changed = (hit != x).double().mean()
    assert 0.15 < float(changed) < 0.25 and torch.equal(hit, corruptions.corrupt(x, "impulse", 0.2, seed=3))
    patched = corruptions.corrupt(x, "patch", 2, seed=1, patch_size=4)
    per_patch = (patched != x).view(4, 4, 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(4, 16, 16).any(-1)
    assert per_patch.sum(1).tolist() == [2, 2, 2, 2]
    flat = torch.full((1, 1, 16, 16), 0.4)
    assert torch.allclose(corruptions.corrupt(flat, "blur", 1.5), flat)
    assert torch.allclose(corruptions.corrupt(flat, "contrast", 0.3), flat)
    lowered = corruptions.corrupt(x, "contrast", 0.5)
    assert torch.allclose(lowered.mean((1, 2, 3)), x.mean((1, 2, 3)), atol=1e-6)
    noisy = corruptions.corrupt(x, "gaussian", 0.3, seed=0)
    assert noisy.min() >= 0 and noisy.max() <= 1 and not torch.equal(noisy, x)
    with pytest.raises(ValueError, match="unknown corruption"):
        corruptions.corrupt(x, "fog", 1)
    with pytest.raises(ValueError, match="patch_size"):
        corruptions.corrupt(x, "patch", 1)


# ------------------------------------------------------------------------------ statistics, verdicts
def test_paired_interval_matches_scipy_ttest_rel():
    a = [0.91, 0.88, 0.93, 0.90, 0.92]
    b = [0.90, 0.89, 0.90, 0.88, 0.91]
    r = paired_difference(a, b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert r["ci"] == pytest.approx([ci.low, ci.high], rel=1e-12)
    assert r["n"] == 5 and paired_difference([1.0], [0.5])["ci"] is None
    with pytest.raises(ValueError, match="seed 1"):
        paired_difference([0.1, float("nan")], [0.1, 0.2])


def _study(treated, control, **more):
    seeds = len(treated)
    study = {"clean": {"rpc-symvit": treated, "symvit": control}, "n_test": 360, "n_attack": 360,
             "settings": {"severities": {"impulse": [0.03, 0.08, 0.16]}, "pgd_steps": 20},
             "corruption": {"impulse/0": {"rpc-symvit": treated, "symvit": control}},
             "pgd": {"0.02": {"rpc-symvit": treated, "symvit": control}},
             "transfer": {"0.02": {"rpc-symvit": treated, "symvit": control}}}
    study.update(more)
    assert seeds
    return study


@pytest.mark.parametrize("treated, control, clean, robust", [
    # identical arms (the null): non-inferior on clean data, no robustness gain either way
    ([0.9, 0.8, 0.85, 0.82, 0.88], [0.9, 0.8, 0.85, 0.82, 0.88], "supported", "inconclusive"),
    # a clear gain on every seed
    ([0.95, 0.86, 0.9, 0.87, 0.93], [0.9, 0.8, 0.85, 0.82, 0.88], "supported", "supported"),
    # a clear loss on every seed
    ([0.85, 0.74, 0.80, 0.77, 0.83], [0.9, 0.8, 0.85, 0.82, 0.88], "refuted", "refuted"),
    # noisy: gains and losses of a few points
    ([0.93, 0.76, 0.88, 0.79, 0.9], [0.9, 0.8, 0.85, 0.82, 0.88], "inconclusive", "inconclusive"),
])
def test_claim_r_verdicts_on_constructed_outcomes(treated, control, clean, robust):
    study = _study(treated, control)
    assert claim_r.clean_record(study)["verdict"] == clean
    for rec in (claim_r.corruption_record(study, "impulse", 0, "sparse"),
                claim_r.attack_record(study, "pgd", 0.02),
                claim_r.attack_record(study, "transfer", 0.02)):
        assert rec["verdict"] == robust, rec["evidence"]
        assert rec["label"] == claim_r.LABEL and rec["level"] == "series"
        assert rec["per_seed"]["diff"] == pytest.approx([a - b for a, b in zip(treated, control)])


def test_claim_r_with_one_seed_is_undetermined_under_ours():
    rec = claim_r.clean_record(_study([0.9], [0.8]))
    assert rec["verdict"] == "undetermined" and "one seed" in rec["reason"]
    assert claim_r.clean_record(_study([0.9], [0.8]), rules="p2")["verdict"] == "supported"


# ------------------------------------------------------------------------------ selection, report
class _Item:
    def __init__(self, name: str, rpc: bool):
        self.name, self.rpc = name, rpc

    def get_closest_marker(self, name: str):
        return object() if (name == "rpc" and self.rpc) else None


class _Config:
    def __init__(self, markexpr: str):
        from types import SimpleNamespace

        self.option = SimpleNamespace(markexpr=markexpr)
        self.deselected: list = []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))


@pytest.mark.parametrize("markexpr, runs", [("", False), ("not slow", False), ("rpc", True),
                                            ("rpc and not slow", True), ("not rpc", True)])
def test_rpc_tests_run_only_when_the_mark_expression_names_them(markexpr, runs):
    """Without ``-m`` naming ``rpc`` claim R's tests are deselected (reported as such); with it,
    pytest's own ``-m`` decides (``not rpc`` then deselects them itself)."""
    from fixtures.plugin.rpc import pytest_collection_modifyitems

    items = [_Item("test_value_vectors", False), _Item("test_clean_accuracy", True)]
    config = _Config(markexpr)
    pytest_collection_modifyitems(config, items)
    assert [i.name for i in items] == (["test_value_vectors", "test_clean_accuracy"] if runs
                                       else ["test_value_vectors"])
    assert [i.name for i in config.deselected] == ([] if runs else ["test_clean_accuracy"])


def test_rpc_test_module_covers_every_condition():
    import ast

    tree = ast.parse((ROOT / "claims" / "test_rpc_attention.py").read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"test_clean_accuracy", "test_corruption", "test_white_box_attack",
            "test_transfer_attack", "test_sparse_part_absorbs_sparse_corruption",
            "test_low_rank_part"} <= names


def test_report_section_shows_the_label_records_and_not_checked(tmp_path):
    from report.render import render_report

    results = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    study = _study([0.95, 0.86, 0.9, 0.87, 0.93], [0.9, 0.8, 0.85, 0.82, 0.88])
    results["records"] += [claim_r.clean_record(study),
                           claim_r.attack_record(study, "transfer", 0.02)]
    from claims.verdicts import load_thresholds

    results["thresholds"] = {**results["thresholds"],
                             **{k: v for k, v in load_thresholds().items()
                                if k.startswith("claim_r")}}
    page = render_report(results)
    assert claim_r.LABEL in page and "R1 clean accuracy" in page
    assert "transfer ε=0.02" in page and "+5.0" in page
    for item in claim_r.NOT_CHECKED:
        assert item["claim"].split(" (")[0] in page
    empty = render_report(json.loads((ROOT / "tests" / "data" / "results_example.json").read_text()))
    assert "pytest claims/ -m rpc" in empty


def test_terminal_verdict_table_counts_claim_r_conditions():
    from fixtures.plugin.terminal import verdict_table

    study = _study([0.95, 0.86, 0.9, 0.87, 0.93], [0.9, 0.8, 0.85, 0.82, 0.88])
    records = [claim_r.clean_record(study), claim_r.attack_record(study, "pgd", 0.02),
               claim_r.attack_record(_study([0.9] * 5, [0.9] * 5), "pgd", 0.02)]
    line = next(row for row in verdict_table(records) if row.startswith("R "))
    assert "3 conditions: 2 supported, 1 inconclusive" in line and "(trend)" not in line


@pytest.mark.parametrize("option, value", [("--rpc-seeds", 0), ("--rpc-epochs", -1),
                                           ("--rpc-pgd-steps", 0), ("--rpc-attack-samples", -2)])
def test_bad_rpc_options_are_usage_errors_naming_the_option(option, value):
    from types import SimpleNamespace

    from fixtures.plugin.rpc import settings_from

    given = {"--rpc-seeds": 5, "--rpc-epochs": 15, "--rpc-attack-samples": 0,
             "--rpc-pgd-steps": 20, option: value}
    config = SimpleNamespace(getoption=given.__getitem__)
    with pytest.raises(pytest.UsageError, match=f"^{option} must be an integer >= "):
        settings_from(config)
    assert settings_from(SimpleNamespace(getoption={**given, option: 2}.__getitem__)).seeds >= 1
