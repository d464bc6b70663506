"""Claim R: "RPC-Attention is competitive on clean data and more robust under contamination"
(P1 Algorithm 1 and its experiments; method §15), a toy-scale mechanism check.

SymViT and RPC-SymViT are trained on digits with ``--rpc-seeds`` seeds each (cached); each test
judges one condition by the paired difference over seeds and its 95% interval. Selected only
with ``pytest claims/ -m rpc`` (fixtures/plugin/rpc.py). Thresholds: ``[claim_r_*]`` of
thresholds.toml.
"""

import pytest

from checks.corruptions import SEVERITIES
from claims import claim_r
from claims.outcome import assert_supported

# the claim these tests judge (claims/registry.py); `rpc`: run only with -m rpc; one worker
pytestmark = [pytest.mark.kpca_claim("R"), pytest.mark.rpc, pytest.mark.xdist_group("rpc")]

CORRUPTIONS = [pytest.param(name, level, kind, id=f"{name}-s{level + 1}")
               for name, (kind, levels) in SEVERITIES.items() for level in range(len(levels))]
EPS = [pytest.param(eps, id=f"eps{eps:g}") for eps in claim_r.EPSILONS]


def _judge(record, rpc_study, record_result):
    record_result(record, rpc_study)
    assert_supported(record, claim_r.message(record))


def test_clean_accuracy(rpc_study, record_result):
    """R1: RPC-SymViT is not worse than SymViT on clean test digits by more than the margin."""
    _judge(claim_r.clean_record(rpc_study.study, rpc_study.options.rules), rpc_study,
           record_result)


@pytest.mark.parametrize("name, level, kind", CORRUPTIONS)
def test_corruption(name, level, kind, rpc_study, record_result):
    """R2: more accurate under a digits-C corruption (sparse or dense) at one severity."""
    _judge(claim_r.corruption_record(rpc_study.study, name, level, kind,
                                     rpc_study.options.rules), rpc_study, record_result)


@pytest.mark.parametrize("attack", ["fgsm", "pgd"])
@pytest.mark.parametrize("eps", EPS)
def test_white_box_attack(attack, eps, rpc_study, record_result):
    """R3: more accurate under white-box FGSM / PGD (gradients through every PAP iteration)."""
    _judge(claim_r.attack_record(rpc_study.study, attack, eps, rpc_study.options.rules),
           rpc_study, record_result)


@pytest.mark.parametrize("eps", EPS)
def test_transfer_attack(eps, rpc_study, record_result):
    """R3: more accurate under PGD examples transferred from SymViT (exposes gradient masking)."""
    if not rpc_study.study["transfer"]:
        pytest.skip("the transfer attack needs --rpc-seeds 2 or more (a second SymViT)")
    _judge(claim_r.attack_record(rpc_study.study, "transfer", eps, rpc_study.options.rules),
           rpc_study, record_result)


def test_sparse_part_absorbs_sparse_corruption(rpc_study, record_result):
    """Mechanism: PAP's S has more non-zero entries on impulse-corrupted than on clean digits."""
    _judge(claim_r.sparse_share_record(rpc_study.study, rules=rpc_study.options.rules),
           rpc_study, record_result)


def test_low_rank_part(rpc_study, record_result):
    """Mechanism: PAP's attention output L has a lower effective rank than SymViT's."""
    _judge(claim_r.rank_record(rpc_study.study, rules=rpc_study.options.rules), rpc_study,
           record_result)
