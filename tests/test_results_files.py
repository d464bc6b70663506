"""What a run leaves for other tools: JUnit properties a CI dashboard can show, results.json and
the baseline valid against docs/results.schema.json, the summary / method versions / durations,
and the --save-samples JSON Lines file whose means are the records' means."""

from __future__ import annotations

import copy
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema  # the test extra
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "docs" / "results.schema.json").read_text())
MODEL = "random-vit_tiny_patch16_224"
pytest_plugins = ["pytester"]
# one xdist worker builds small_run (a real run) once, not each worker its own
pytestmark = pytest.mark.xdist_group("results-files")


def _validator():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    return jsonschema.Draft202012Validator(SCHEMA)


def _errors(doc) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in _validator().iter_errors(doc)]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One small real run under xdist (records reach the controller from two workers)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("run")
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "claims"), "--rootdir", str(ROOT),
           "-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider", "-q",
           "--models", MODEL, "--layers", "0", "--heads", "0,1", "--n-samples", "4",
           "--out", str(out), "--cache-dir", str(out / "cache"), "--report", "none",
           "--junitxml", str(out / "junit.xml"), "--save-samples", "-n", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_junit_properties_are_scalars_and_test_cases_are_small(small_run):
    root = ET.parse(small_run / "junit.xml").getroot()
    cases = list(root.iter("testcase"))
    judged = [c for c in cases if c.find("properties") is not None]
    assert len(judged) >= 8  # 2 V heads, V model, J layer, J model, 2 E heads, E model
    for case in cases:
        props = case.find("properties")
        for prop in (props if props is not None else []):
            value = prop.get("value")
            assert not value.lstrip().startswith(("{", "[")), (case.get("name"), prop.get("name"))
        props_size = len(ET.tostring(props)) if props is not None else 0
        assert props_size < 1024, case.get("name")
        # the whole test case, its one-line failure included, stays under 2 KB
        assert len(ET.tostring(case)) < 2048, (case.get("name"), len(ET.tostring(case)))
    names = {p.get("name"): p.get("value") for c in judged for p in c.find("properties")}
    assert names["kpca_verdict"] in ("supported", "refuted", "inconclusive", "undetermined")
    from fixtures.plugin import plain_nodeid  # under -n, --dist loadgroup appends @<model>

    v_head = next(c for c in judged if c.get("name").startswith("test_value_vectors[")
                  and plain_nodeid(c.get("name")).endswith("H0]"))
    props = {p.get("name"): p.get("value") for p in v_head.find("properties")}
    record = next(r for r in json.loads((small_run / "results.json").read_text())["records"]
                  if r["claim"] == "V" and r["level"] == "head" and r["head"] == 0)
    assert props["kpca_metric"] == "optimal_cosine"
    assert float(props["kpca_value"]) == record["metrics"]["optimal_cosine"]
    assert float(props["kpca_null"]) == record["null"]["optimal_cosine"]
    # Provenance once per run, as test-suite properties, not per test case.
    suite_props = {p.get("name"): p.get("value") for p in root.iter("property")
                   if p not in {q for c in cases for q in c.iter("property")}}
    assert f"kpca_model_{MODEL}_checkpoint_hash" in suite_props
    assert "kpca_git_commit" in suite_props and "kpca_version_torch" in suite_props
    assert sum(1 for p in root.iter("property") if "checkpoint_hash" in p.get("name")) == 1


@pytest.mark.slow
def test_results_and_baseline_validate_against_the_schema(small_run):
    from report import baseline

    results = json.loads((small_run / "results.json").read_text())
    assert _errors(results) == []
    assert _errors(baseline.make_baseline(results)) == []
    assert _errors(json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())) == []
    # summary, method versions, per-test durations
    assert results["summary"]["records"] == len(results["records"]) == 8
    assert sum(results["summary"]["verdicts"]["V"]["head"].values()) == 2
    assert set(results["methods"]) == {"V", "J", "E", "R"}  # every registered claim
    assert all(m["version"] for m in results["methods"].values())
    assert len(results["durations"]) >= 8 and all(d >= 0 for d in results["durations"].values())
    nodeids = {n.split("::")[-1] for n in results["durations"]}
    assert all(r["test_id"] in nodeids for r in results["records"])  # a duration for each record
    assert len(results["models"]) == 1  # provenance reached the controller once per model


def test_wrong_types_fail_validation_naming_the_field():
    results = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    bad = copy.deepcopy(results)
    bad["records"][0]["n_samples"] = "100"
    assert any(e.startswith("$.records[0].n_samples:") and "integer" in e for e in _errors(bad))
    bad = copy.deepcopy(results)
    bad["records"][1]["verdict"] = "maybe"
    assert any(e.startswith("$.records[1].verdict:") for e in _errors(bad))
    bad = copy.deepcopy(results)
    bad["records"][0]["ci"] = {"optimal_cosine": 0.5}  # an interval is [low, high]
    assert any(e.startswith("$.records[0].ci.optimal_cosine:") for e in _errors(bad))
    from report import baseline

    base = baseline.make_baseline(results)
    base["records"][0]["metrics"] = {"optimal_cosine": [0.1]}
    assert any("optimal_cosine" in e for e in _errors(base))


def test_optional_record_fields_of_other_options_validate():
    results = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    rec = next(r for r in results["records"] if r["claim"] == "V")
    rec.update({"ci": {"optimal_cosine": [0.2, 0.3]}, "ci_null": {"optimal_cosine": [0.1, 0.2]},
                "vs_null": {"optimal_cosine": {"p": 0.01, "p_adjusted": 0.04, "above_chance": True}},
                "verdicts": {"p2": "refuted", "ours": "inconclusive"}, "rules": "ours",
                "p2_code": {"optimal_cosine": 0.25}})
    results["provenance"]["shard"] = "1/4"
    assert _errors(results) == []


@pytest.mark.slow
def test_saved_samples_load_in_one_call_and_give_the_records_means(small_run):
    results = json.loads((small_run / "results.json").read_text())
    assert results["samples"] == "samples.jsonl"
    path = small_run / results["samples"]
    every = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [r for r in every if r["claim"] == "V"]
    assert len(rows) == 2 * 4  # 2 heads x 4 samples
    for rec in (r for r in results["records"] if r["claim"] == "E" and r["level"] == "head"):
        mine = [r for r in every if r["claim"] == "E" and r["head"] == rec["head"] and r["used"]]
        assert len(mine) == 4
        for name in ("learned", "eigen", "perturbed"):
            got = math.fsum(r[name] for r in mine) / len(mine)
            assert abs(got - rec["metrics"][name]) <= 1e-12, (rec["test_id"], name, got)
    from claims.claim_v import METRICS

    heads = [r for r in results["records"] if r["claim"] == "V" and r["level"] == "head"]
    for rec in heads:
        mine = [r for r in rows if (r["model"], r["layer"], r["head"]) ==
                (rec["model"], rec["layer"], rec["head"]) and r["used"]]
        assert len(mine) == rec["n_used"]
        for name in METRICS:
            for col, want in ((name, rec["metrics"][name]), (f"{name}_null", rec["null"][name])):
                got = math.fsum(r[col] for r in mine) / len(mine)
                assert abs(got - want) <= 1e-12, (rec["test_id"], col, got, want)
    model = next(r for r in results["records"] if r["claim"] == "V" and r["level"] == "model")
    used = [r for r in rows if not r["undetermined"]]
    got = math.fsum(r["optimal_cosine"] for r in used) / len(used)
    assert abs(got - model["metrics"]["optimal_cosine"]) <= 1e-12
    from report.render import write_report  # the report says where the file is and how to load it

    page = write_report(small_run / "results.json", small_run / "report.html").read_text()
    assert 'id="samples"' in page and "pandas.read_json(path, lines=True)" in page


@pytest.mark.slow
def test_saved_samples_load_with_one_pandas_call(small_run):
    import pandas as pd  # the test extra: what a user loads samples.jsonl with
    path = small_run / "samples.jsonl"
    rows = path.read_text().splitlines()
    frame = pd.read_json(path, lines=True)
    assert len(frame) == len(rows) and "optimal_cosine_null" in frame.columns


def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    yield path


def test_the_inlined_schema_reports_what_the_referencing_one_reports(monkeypatch):
    """report.validate checks against the schema with its $defs references inlined (2.4 times
    faster on a full results.json): 200 seeded corruptions of a real results file (wrong types,
    out-of-range numbers, nulls, keys removed) get the same sentence, or pass, both ways."""
    import random

    from report import validate

    data = json.loads((ROOT / "reference" / "smoke.json").read_text())
    data["records"] = data["records"][:12]
    paths = [p for p in _leaves(data) if p]
    plain = jsonschema.validators.validator_for(validate.schema())(validate.schema(),
                                                                    format_checker=None)
    inlined = validate._validator()
    assert "$ref" not in json.dumps({k: v for k, v in inlined.schema.items() if k != "$defs"})

    def sentence(doc, validator):
        monkeypatch.setattr(validate, "_validator", lambda: validator)
        try:
            validate.check(doc, "results.json")
        except validate.InvalidFile as exc:
            return str(exc)
        return None

    gen = random.Random(0)
    failures = 0
    for _ in range(200):
        doc = copy.deepcopy(data)
        *parent_path, last = gen.choice(paths)
        parent = doc
        for part in parent_path:
            parent = parent[part]
        if isinstance(parent, dict) and gen.random() < 0.25:
            del parent[last]
        else:
            parent[last] = gen.choice(["x", -1e9, 1e9, None, {}, [], True, 0.5])
        got, want = sentence(doc, inlined), sentence(doc, plain)
        assert got == want
        failures += got is not None
    assert failures > 60  # many corruptions are errors: the comparison is not vacuous
