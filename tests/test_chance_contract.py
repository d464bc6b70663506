"""The test against chance is one test (method §7.2, ``claims/chance.py``): every ``vs_null``
entry of claims V, J and E's γ, in records built here from small synthetic metrics and in the
real records of ``tests/data/claim_identity.json``, has exactly the fields §7.2 lists (in any
order: results.json may sort a record's keys)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from claims import chance, claim_e, claim_j, claim_v
from claims.records import as_json

ROOT = Path(__file__).resolve().parent.parent
F64 = torch.float64


def method_fields() -> list[str]:
    """The fields §7.2 of docs/method.md names after "has the same fields:", in its order."""
    text = (ROOT / "docs" / "method.md").read_text(encoding="utf-8")
    section = text[text.index('<a id="s7-2">'):text.index('<a id="s7-3">')]
    listed = re.search(r"has the same fields:(.*?)\.", section, re.S)
    assert listed, "method §7.2 lists the fields of a vs_null entry"
    return re.findall(r"`(\w+)`", listed.group(1))


def vs_null_entries(record: dict) -> list[dict]:
    """Every test against chance of a JSON record: ``vs_null`` per metric, and claim J's
    ``output_fit.vs_null`` (the output fit's R²)."""
    out = list((record.get("vs_null") or {}).values())
    fit = record.get("output_fit") or {}
    return out + ([fit["vs_null"]] if "vs_null" in fit else [])


def _v_layer(samples: int, heads: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    m = {}
    for name in claim_v.METRICS:
        m[name] = 0.5 + 0.1 * torch.rand(samples, heads, generator=g, dtype=F64)
        m[f"{name}_null"] = 0.3 * torch.rand(samples, heads, generator=g, dtype=F64)
    m["undetermined"] = torch.zeros(samples, heads, dtype=torch.bool)
    m["mu_d"] = torch.ones(samples, heads, dtype=F64)
    m["threshold"] = torch.zeros(samples, heads, dtype=F64)
    return m


def _j_terms(samples: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    shape, n_tok = (samples, 1), 10
    return {"log_phi_sq_mean": torch.zeros(shape, dtype=F64),
            "h_sq_mean": torch.full(shape, 0.5, dtype=F64),
            "bessel_share": torch.ones(shape, dtype=F64),
            "n_tokens": torch.full(shape, float(n_tok), dtype=F64),
            "p1_log_phi_sq_mean": torch.zeros(shape, dtype=F64),
            "token_log_phi_sq": torch.zeros(samples, 1, n_tok, dtype=F64),
            "token_h_sq": torch.full((samples, 1, n_tok), 0.5, dtype=F64),
            "token_fit_h_sq": torch.full((samples, 1, n_tok), 0.5, dtype=F64),
            "output_r2": 0.7 + 0.05 * torch.rand(shape, generator=g, dtype=F64),
            "output_r2_null": 0.2 + 0.05 * torch.rand(shape, generator=g, dtype=F64)}


def _gamma_tensors(samples: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    t = {"undetermined": torch.zeros(samples, 1, dtype=torch.bool)}
    for name, value in (("learned", 0.3), ("eigen", 0.0), ("perturbed", 1.0)):
        t[f"gamma_{name}"] = torch.full((samples, 1), value, dtype=F64)
        t[f"gamma_{name}_abs"] = torch.full((samples, 1), value, dtype=F64)
    for name, value in (("learned", 0.3), ("eigen", 0.0), ("perturbed", 1.0), ("null", 0.9)):
        t[f"gamma_{name}_subspace"] = value + 0.01 * torch.rand(samples, 1, generator=g, dtype=F64)
    return t


def synthetic_records() -> dict[str, dict]:
    """A record of every kind that carries a test against chance, as JSON."""
    per_layer = {0: _v_layer(8, 2, 1), 1: _v_layer(8, 2, 2)}
    stats = claim_v.head_statistics("m", per_layer, [0, 1])
    terms = _j_terms()
    return {"V head (adjusted across heads)": claim_v.head_record("m", 0, 1, per_layer[0],
                                                                  statistics=stats[(0, 1)]),
            "V head (alone)": claim_v.head_record("m", 1, 0, per_layer[1]),
            "V model": claim_v.model_record("m", per_layer, [0, 1], {"refuted": 4}),
            "J layer": claim_j.layer_record("m", 0, terms, [0]),
            "J model": claim_j.model_record("m", {0: terms, 1: _j_terms()}, [0]),
            "E head": claim_e.head_record("m", 0, 0, _gamma_tensors())}


@pytest.fixture(scope="module")
def records() -> dict[str, dict]:
    return {name: as_json(rec) for name, rec in synthetic_records().items()}


def test_method_lists_the_fields_of_the_one_result_type():
    assert method_fields() == list(chance.ChanceTest.__annotations__)


@pytest.mark.parametrize("kind", ["V head (adjusted across heads)", "V head (alone)", "V model",
                                  "J layer", "J model", "E head"])
def test_every_vs_null_entry_has_the_fields_of_method_7_2(records, kind):
    entries = vs_null_entries(records[kind])
    assert entries, f"{kind}: no test against chance"
    for entry in entries:
        assert set(entry) == set(method_fields()), kind


def test_a_record_tested_alone_adjusts_over_itself(records):
    """Claim J's output fit, a model record and a head tested alone are families of one."""
    for kind in ("V head (alone)", "V model", "J layer", "J model"):
        for entry in vs_null_entries(records[kind]):
            assert entry["p_adjusted"] == entry["p"] and entry["tost_p_adjusted"] == entry["tost_p"]
            assert entry["can_reject"] == (entry["smallest_p"] < chance.chance_settings().alpha)
            assert entry["smallest_p"] == chance.smallest_p(entry["n_samples"])


def test_the_real_records_have_the_fields_of_method_7_2():
    golden = json.loads((ROOT / "tests" / "data" / "claim_identity.json").read_text("utf-8"))
    seen = {}
    for record in golden["records"]:
        for entry in vs_null_entries(record):
            assert set(entry) == set(method_fields()), record.get("test_id")
            seen[record["claim"]] = seen.get(record["claim"], 0) + 1
    assert set(seen) == {"V", "J", "E"}, seen
