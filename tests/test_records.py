"""Typed records (claims/records.py): the claim modules' records written through the dataclasses
are the JSON objects of before, key for key, value for value, in the same order.

``tests/data/records_golden.json`` holds what the dict-building claim modules of commit 6070d57
returned for the cases below (real computations on seeded synthetic tensors, every branch: judged,
undetermined, undefined values, p2-code, few tokens); results.json is written from these objects
without sorting keys, so the order is compared too. Regenerate only for a deliberate change:
``python -m tests.test_records``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from claims import claim_e, claim_j, claim_v
from claims.records import (EHeadRecord, EModelRecord, JRecord, JTrendRecord, Record, VRecord,
                            as_json, record_class, register_record)
from report.tolerances import differences

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "records_golden.json"
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"
F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _v_layer(s: int, h: int, seed: int, undetermined_rows: int = 0, p2code: bool = False,
             few: bool = False) -> dict:
    g = _gen(seed)
    m = {}
    for name in claim_v.METRICS:
        m[name] = torch.rand(s, h, generator=g, dtype=F64)
        m[f"{name}_null"] = 0.3 * torch.rand(s, h, generator=g, dtype=F64)
    m["undetermined"] = torch.zeros(s, h, dtype=torch.bool)
    m["undetermined"][:undetermined_rows] = True
    m["mu_d"] = torch.rand(s, h, generator=g, dtype=F64)
    m["threshold"] = torch.zeros(s, h, dtype=F64)
    if few:
        m["few_tokens"] = m["undetermined"].clone()
        m["n_tokens"] = torch.full((s, h), 5, dtype=torch.long)
    if p2code:
        for name in claim_v.P2_CODE_METRICS:
            m[f"p2code_{name}"] = torch.rand(s, h, generator=g, dtype=F64)
    return m


def _v_model(undetermined_rows: int = 0) -> dict:
    per_layer = {0: _v_layer(6, 2, 10, undetermined_rows, p2code=True, few=True),
                 1: _v_layer(6, 2, 11, undetermined_rows, p2code=True, few=True)}
    return claim_v.model_record("m", per_layer, [0, 1], {"supported": 1, "refuted": 3},
                                head_verdicts_by_rules={"p2": {"refuted": 4}})


def _j_terms(seed: int, s: int = 5, h: int = 2) -> dict:
    g = _gen(seed)
    return {"log_phi_sq_mean": torch.randn(s, h, generator=g, dtype=F64),
            "h_sq_mean": 10 * torch.rand(s, h, generator=g, dtype=F64),
            "bessel_share": torch.rand(s, h, generator=g, dtype=F64),
            "n_tokens": torch.full((s, h), 7.0, dtype=F64),
            "p1_log_phi_sq_mean": torch.randn(s, h, generator=g, dtype=F64)}


def _points(j: list[float]) -> list[dict]:
    return [{"step": 10 * i, "j_proj": v, "phi_sq_mean": 2.0 + v, "h_sq_mean": 2.0,
             "log10_ratio": 0.1 * i, "test_accuracy": 0.5} for i, v in enumerate(j)]


def _e_model(nonfinite: bool = False) -> dict:
    g = _gen(5)
    s, n = 8, 4
    per_layer = {}
    for layer in (0, 1):
        base = torch.rand(s, 2, n, generator=g, dtype=F64) + 0.5
        finite = torch.ones(s, 2, dtype=torch.bool)
        if nonfinite:
            finite[:3, 1] = False
        per_layer[layer] = {"mu_log_raw": base, "mu_log_standardized": 1.1 * base,
                            "mu_naive_float32": base * 0.99, "naive_finite": finite,
                            "naive_bad_exp": ~finite}
    return claim_e.model_record("m", per_layer, [0, 1], n)


def _gamma(undetermined_rows: int = 0, contrast: bool = True) -> dict:
    g = _gen(7)
    s, h = 6, 2
    t = {"undetermined": torch.zeros(s, h, dtype=torch.bool)}
    t["undetermined"][:undetermined_rows] = True
    for name, scale in (("learned", 0.4), ("eigen", 0.05), ("perturbed", 1.0 if contrast else 0.01)):
        t[f"gamma_{name}"] = scale * torch.rand(s, h, generator=g, dtype=F64)
        t[f"gamma_{name}_abs"] = torch.rand(s, h, generator=g, dtype=F64)
    return t


CASES = {
    "V head judged": lambda: claim_v.head_record("m", 1, 0, _v_layer(8, 2, 1)),
    "V head p2-code, few tokens": lambda: claim_v.head_record(
        "m", 0, 1, _v_layer(8, 2, 2, undetermined_rows=1, p2code=True, few=True)),
    "V head undetermined": lambda: claim_v.head_record(
        "m", 0, 1, _v_layer(8, 2, 3, undetermined_rows=7, few=True)),
    "V head p2 rules": lambda: claim_v.head_record("m", 2, 0, _v_layer(8, 2, 4), rules="p2"),
    "V model judged": lambda: _v_model(),
    "V model undetermined": lambda: _v_model(undetermined_rows=6),
    "J layer": lambda: claim_j.layer_record("m", 3, _j_terms(1), [0, 1]),
    "J model": lambda: claim_j.model_record("m", {0: _j_terms(2), 1: _j_terms(3)}, [0, 1]),
    "J layer undefined ratio": lambda: claim_j.layer_record(
        "m", 0, {**_j_terms(4), "h_sq_mean": torch.zeros(5, 2, dtype=F64)}, [0, 1]),
    "J trend": lambda: claim_j.trend_record("s", _points([3.0, 2.0, 1.5, 0.5])),
    "J trend constant": lambda: claim_j.trend_record("s", _points([1.0, 1.0, 1.0])),
    "E model": lambda: _e_model(),
    "E model non-finite naive": lambda: _e_model(nonfinite=True),
    "E head judged": lambda: claim_e.head_record("m", 1, 1, _gamma()),
    "E head undetermined": lambda: claim_e.head_record("m", 1, 0, _gamma(undetermined_rows=5)),
    "E head no contrast": lambda: claim_e.head_record("m", 0, 0, _gamma(contrast=False)),
}


def _text(obj) -> str:
    return json.dumps(obj, indent=1)  # as results.json: no key sorting, order compared


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_typed_record_writes_the_json_of_before(case, golden):
    """The claim module's record, through ``to_json``, is the dict the module built before."""
    record = CASES[case]()
    # keys and their order exactly; numbers within the tolerance of their kind (method §13:
    # the golden was written on another CPU), everything else exactly
    assert differences(as_json(record), golden[case]) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_keeps_keys_order_and_values(case, golden):
    obj = golden[case]
    rec = Record.from_json(obj)
    assert isinstance(rec, record_class(obj["claim"], obj["level"])) and rec.extra == {}
    assert list(rec.to_json().items()) == list(obj.items())


def test_round_trip_of_the_example_results():
    """Every record of the report's example file (with test_id and options) reads back as typed
    and writes the same object (the file is hand-made, so its key order is its own)."""
    for obj in json.loads(EXAMPLE.read_text(encoding="utf-8"))["records"]:
        rec = Record.from_json(obj)
        assert type(rec) is not Record, (obj["claim"], obj["level"])
        assert rec.to_json() == obj, obj.get("test_id")  # hand-made: its own key order


def test_classes_by_claim_and_level():
    assert record_class("V", "head") is VRecord and record_class("V", "model") is VRecord
    assert record_class("J", "layer") is JRecord and record_class("J", "series") is JTrendRecord
    assert record_class("E", "model") is EModelRecord and record_class("E", "head") is EHeadRecord
    assert record_class("Z", "head") is Record


def test_unknown_claim_keeps_its_fields_in_extra():
    obj = {"claim": "Z", "level": "head", "model": "m", "layer": 0, "head": 1, "verdict": "refuted",
           "entropy": [1, 2], "metrics": {"entropy": 0.5}, "test_id": "t", "options": {"a": 1}}
    rec = Record.from_json(obj)
    assert rec.extra == {"entropy": [1, 2]} and rec.metric("entropy") == 0.5
    assert rec.metric("missing") is None and rec.ci_of("entropy") is None
    assert rec.to_json() == obj and rec["verdict"] == "refuted" and dict(rec) == obj


def test_a_record_without_model_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="'model'"):
        Record.from_json({"claim": "V", "level": "head", "layer": 0, "head": 0})


def test_register_record_for_a_new_claim():
    class ZRecord(Record):
        pass

    register_record("Z", "model", ZRecord)
    try:
        assert isinstance(Record.from_json({"claim": "Z", "level": "model", "model": "m"}), ZRecord)
    finally:
        from claims import records
        records._CLASSES.pop(("Z", "model"))
    with pytest.raises(TypeError, match="not a subclass"):
        register_record("Z", "model", dict)


if __name__ == "__main__":
    GOLDEN.write_text(_text({name: as_json(make()) for name, make in CASES.items()}) + "\n",
                      encoding="utf-8")
    print(f"wrote {GOLDEN}")
