"""The report iterates over registered claims: a claim's section comes from its spec
(``report_context`` + ``template``); a registered claim without them, and a claim the records
name that is not registered, get the generic section; "method §N.M" in the thresholds' sources
links to its section of docs/method.md."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from claims import registry
from claims.records import Record
from report import render
from report.index import Index
from report.method_link import DEFAULT_METHOD_URL, METHOD_URL_ENV, method_links, method_url_for
from report.render import render_report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"
MINI = "all-MiniLM-L6-v2"


def _with_toy_records(claim: str) -> dict:
    results = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    for head, verdict in ((0, "supported"), (1, "refuted")):
        results["records"].append({
            "claim": claim, "level": "head", "model": MINI, "layer": 0, "head": head,
            "verdict": verdict, "metrics": {"entropy": 0.25 + head}, "ci": {"entropy": [0.2, 0.3]},
            "test_id": f"test_toy[{MINI}-L00-H{head}]"})
    results["records"].append({
        "claim": claim, "level": "model", "model": MINI, "layer": None, "head": None,
        "verdict": "refuted", "metrics": {"entropy": 0.75}, "evidence": "entropy 0.75 > 0.5",
        "test_id": f"test_toy_model[{MINI}]"})
    results["thresholds"]["claim_t"] = {
        "description": "attention entropy is low",
        "supported": {"entropy": {"value": 0.5, "direction": "<=", "source": "toy (method §2)"}}}
    return results


def _section(page: str, claim: str) -> str:
    m = re.search(rf'<section id="claim-{claim.lower()}">.*?</section>', page, re.S)
    assert m, f"no section for claim {claim}"
    return m.group(0)


@pytest.fixture
def toy_spec():
    spec = registry.register(registry.ClaimSpec(
        id="T", section="claim_t", title="Attention entropy is below a bar",
        statement="Each head's attention entropy is at most 0.5 nats.", source="toy, method §2",
        unit="head", levels=("head", "model"), metrics=("entropy",)))
    yield spec
    registry.unregister("T")


def test_a_registered_claim_without_a_partial_gets_the_generic_section(toy_spec):
    page = render_report(_with_toy_records("T"))
    section = _section(page, "T")
    assert "5. Claim T: Attention entropy is below a bar" in section  # after V, J, E (R not asked for)
    assert "Each head&#39;s attention entropy is at most 0.5 nats." in section
    assert "not registered" not in section
    assert "entropy 0.75 &gt; 0.5" in section and "supported if ≤ 0.5" in section
    assert "0.25 [0.2, 0.3]" in section and "layer 0 head 1" in section
    assert '<li><a href="#claim-t">Claim T: Attention entropy is below a bar</a></li>' in page
    assert "<h2>6. Thresholds and their sources</h2>" in page and "<h2>7. Provenance</h2>" in page
    assert "<th>claim T</th>" in page  # a grid column, as for V, J, E


def test_a_registered_claim_the_run_did_not_ask_for_is_named_not_missing(toy_spec):
    """No record, no test that did not run, no skip: the run never asked for claim T. It gets no
    grid column and no section, and one line says so; it is never shown as missing."""
    results = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    page = render_report(results)
    assert '<section id="claim-t">' not in page and "<th>claim T</th>" not in page
    line = re.search(r'<li class="muted" id="not-requested">(.*?)</li>', page, re.S).group(1)
    assert "claim T (Attention entropy is below a bar)" in line and "not missing" in line
    results["not_run"] = [f"claims/test_toy.py::test_toy[{MINI}-L00-H0]"]
    results["complete"] = False  # a test of claim T collected and not run: asked for
    from claims import registry as reg
    spec = reg.get("T")
    object.__setattr__(spec, "tests", "claims/test_toy.py")
    page = render_report(results)
    assert "No claim-T record in these results." in _section(page, "T")


def test_records_of_an_unregistered_claim_are_shown_never_a_crash():
    """``python -m report`` on a results file of a third-party claim: the generic section."""
    assert "Q" not in {s.id for s in registry.all_claims()}
    results = _with_toy_records("Q")
    results["thresholds"]["claim_q"] = results["thresholds"].pop("claim_t")
    page = render_report(results)
    section = _section(page, "Q")
    assert "5. Claim Q: attention entropy is low" in section  # the thresholds' description
    assert "not registered where the report was rendered" in section
    assert "entropy 0.75 &gt; 0.5" in section
    odd = copy.deepcopy(results)  # records of a shape no one knows: extra keys, no metrics
    odd["records"] = [{"claim": "Q", "level": "series", "model": "s", "layer": None, "head": None,
                       "verdict": "inconclusive", "points": [1, 2]}]
    assert "Claim Q" in render_report(odd)


def test_the_built_in_claims_come_from_their_specs():
    results = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    asked = {r["claim"] for r in results["records"]}
    page = render_report(results)
    for spec in registry.all_claims():
        assert spec.report_context and spec.template, spec.id
        assert (f'<section id="claim-{spec.id.lower()}">' in page) == (spec.id in asked)
        assert spec.title in page  # a section, or the line of claims not asked for


def test_an_unreadable_partial_is_an_error_naming_the_spec_field():
    with pytest.raises(ValueError, match="ClaimSpec.template"):
        render._partial("report/templates/sections/no_such_partial.html.j2")


def test_method_references_link_to_their_anchor():
    html = str(method_links("P2 §3; method §2.3, ours (method §7) <b>", "docs/method.md"))
    assert html == ('P2 §3; <a class="method" href="docs/method.md#s2-3">method §2.3</a>, ours '
                    '(<a class="method" href="docs/method.md#s7">method §7</a>) &lt;b&gt;')
    anchors = set(re.findall(r'<a id="(s[\d-]+)"></a>',
                             (ROOT / "docs" / "method.md").read_text(encoding="utf-8")))
    page = render_report(json.loads(EXAMPLE.read_text(encoding="utf-8")),
                         out_path=ROOT / "report.html")
    linked = re.findall(r'<a class="method" href="docs/method.md#(s[\d-]+)">', page)
    assert linked and set(linked) <= anchors  # every link lands on a section that exists


def test_method_url_is_relative_to_the_report_or_configured(tmp_path, monkeypatch):
    monkeypatch.delenv(METHOD_URL_ENV, raising=False)
    assert method_url_for(ROOT / "runs" / "x" / "report.html") == "../../docs/method.md"
    assert method_url_for(ROOT / "report.html") == "docs/method.md"
    assert method_url_for(tmp_path / "report.html") is None  # outside: plain text, no link
    assert method_url_for() is None  # rendered without a path
    assert DEFAULT_METHOD_URL == "docs/method.md"
    monkeypatch.setenv(METHOD_URL_ENV, "https://example.org/method.md")
    assert method_url_for(tmp_path / "r.html") == "https://example.org/method.md"
    out = ROOT / "runs" / "test-report-sections" / "report.html"
    made_runs = not out.parent.parent.exists()
    try:
        monkeypatch.delenv(METHOD_URL_ENV)
        render.write_report(EXAMPLE, out)
        assert 'href="../../docs/method.md#s2' in out.read_text(encoding="utf-8")
    finally:
        out.unlink(missing_ok=True)
        out.parent.rmdir()
        if made_runs:
            out.parent.parent.rmdir()


def test_index_reads_typed_records():
    results = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    index = Index(results)
    assert all(isinstance(r, Record) for r in index.records)
    assert index.claims()[:3] == ["V", "J", "E"]


def test_the_report_declares_no_claim_of_its_own():
    """Claim ids, titles, metric names, routes and reference ranges come from claims/ (the
    registry, claims/names.py, the run's thresholds): none is re-declared under report/."""
    sources = {p: p.read_text(encoding="utf-8") for p in (ROOT / "report").rglob("*.py")}
    for path, text in sources.items():
        for literal in ('("V", "J", "E")', "CLAIM_INFO", "TEST_FILE_CLAIMS", "P2_LOGS_",
                        '"log_raw", "log_standardized"', "2.35, 3.63", "Value vectors are the"):
            assert literal not in text, f"{path.relative_to(ROOT)} re-declares {literal}"


def _gqa_results() -> dict:
    """The example results with MiniLM's claim-V and claim-E head records relabelled as a
    grouped-query model's: KV heads 0, 1, 2 of 4 query heads each, judged on the group's first
    query head (records at heads 0, 4, 8 with ``kv_head`` 0, 1, 2, as the claim tests write
    them, method §5.7)."""
    results = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    results["models"][MINI]["n_kv_heads"] = 3
    for rec in results["records"]:
        if rec["model"] == MINI and rec["claim"] in ("V", "E") and rec["level"] == "head":
            rec["kv_head"], rec["head"] = rec["head"], rec["head"] * 4
    return results


def test_kv_head_claims_are_drawn_once_per_kv_head_with_kv_labels():
    """Claims V and E judged per KV head: one heatmap column per KV head labelled KV0..KV2 (not
    twelve query-head columns with the KV results among them); claim J keeps query heads."""
    from report.sections import claim_e_section, claim_j_section, claim_v_section

    results = _gqa_results()
    index = Index(results)
    for module, claim in ((claim_v_section, "V"), (claim_e_section, "E")):
        block = module.model_block(results, index, MINI, registry.get(claim))
        svg = str(block["heatmap"] if claim == "V" else block["panels"][0]["svg"])
        labels = re.findall(r'<text x="[^"]+" y="\d+">([^<]+)</text>', svg)
        assert labels[:3] == ["KV0", "KV1", "KV2"] and not {"4", "8"} & set(labels), labels
        assert ">KV head</text>" in svg
        assert "KV head 1" in svg and "head 4:" not in svg
        assert "<th scope=\"col\" class=\"num\">KV2</th>" in str(block["values_table"])
        assert "<th scope=\"col\" class=\"num\">3</th>" not in str(block["values_table"])
    j = claim_j_section.context(results, index, registry.get("J"))
    svg = next(str(b["heatmap"]) for b in j["blocks"] if b["model"] == MINI and b["heatmap"])
    assert "KV" not in svg and ">head</text>" in svg  # claim J stays per query head
