"""The claim interface: a claim is a registered ``ClaimSpec``; the session computes
its per-layer metrics generically, the plugin parametrises its tests over its unit, results.json
and the report carry its records. A toy fourth claim, written in one test file and nowhere
else, proves that adding a claim needs no edit to fixtures/ or report/ (docs/architecture.md,
"Adding a claim", is the same example)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import claims
from claims import registry, verdicts

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
# one xdist worker builds toy_run (a real run of the toy claim) once, not each worker its own
pytestmark = pytest.mark.xdist_group("toy-claim")

#: The toy claim, as a user would write it: one test file (the spec, its per-layer computation,
#: its rules, its record and its test). Normalised attention entropy per head, H(softmax(q·k
#: scale)) / log N averaged over queries, judged against a bar of 0.9 (a toy bar).
TOY_CLAIM = '''
    """Toy claim H: "attention is sharper than uniform" (normalised attention entropy < 0.9)."""

    import math

    import pytest
    import torch

    from claims import registry, verdicts
    from claims.outcome import assert_supported

    BAR = {"value": 0.9, "source": "toy bar of tests/test_claim_interface.py"}
    TOY_WHY = "toy: the control's softmax rows are sharper than uniform"


    def layer_metrics(ctx):
        """Normalised attention entropy of every (sample, head) of one layer, [B, H], in the
        run's precision (``--dtype``; the toy axis of the specification curve varies it)."""
        out = {}
        dtype = ctx.options.torch_dtype
        for chunk, heads, q, k, _v in ctx.groups():
            scores = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * ctx.info["scale"]
            p = torch.softmax(scores, dim=-1)
            entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1).mean(-1)
            ctx.fill(out, chunk, heads, {"entropy": entropy / math.log(q.shape[-2])})
        return out


    def sample_rows(record, run):
        """--save-samples: each sample's normalised entropy behind a head record."""
        entropy = run.layer_metrics("H", record["layer"])["entropy"][:, record["head"]]
        return [{"claim": "H", "model": record["model"], "level": "head",
                 "layer": record["layer"], "head": record["head"], "sample": s,
                 "normalised_entropy": float(x)} for s, x in enumerate(entropy)]


    def head_verdict(entropy):
        metrics = {"normalised_entropy": float(entropy.mean())}
        v = verdicts.judge("claim_h", metrics)
        return metrics, v


    def curve(model, per_layer, heads):
        """Its records of one compute combination of the specification curve: one per head."""
        units = {}
        for layer in sorted(per_layer):
            for head in heads:
                metrics, v = head_verdict(per_layer[layer]["entropy"][:, head])
                units[f"L{layer:02d}-H{head}"] = {"metrics": metrics, "verdict": v.verdict,
                                                  "verdicts": {"p2": v.verdict, "ours": v.verdict}}
        return {"model": None, "units": units}


    registry.register(registry.ClaimSpec(
        id="H", section="claim_h", title="Attention entropy is below 0.9",
        statement="Each head's attention is sharper than uniform: its softmax rows have a "
                  "normalised entropy below 0.9.",
        source="toy claim of the interface test", unit="head", levels=("head",),
        layer_metrics=layer_metrics, metrics=("normalised_entropy",),
        thresholds={"claim_h": {
            "supported": {"normalised_entropy": {**BAR, "direction": "<"}},
            "refuted": {"normalised_entropy": {**BAR, "direction": ">="}}}},
        method_version="0.1", record_sections={"head": "claim_h"}, sample_rows=sample_rows,
        # its specification curve: head verdicts only, over an axis of its own
        curve=curve, curve_entries={"H": {"unit": "head", "model_verdict": False}},
        axes={"toy_precision": {
            "label": "hprec", "values": ["float64", "float32"], "stage": "compute",
            "option": "dtype", "why": "the toy's entropy in either precision"}},
        # what it expects of a control: V = V̂'s attention is an ordinary softmax
        controls=lambda: {"vhat": {"head": (("supported",), TOY_WHY)}}))

    pytestmark = pytest.mark.kpca_claim("H")


    class TypedRecord:
        """A typed record (anything with to_json()), which record_result accepts beside a dict."""

        def __init__(self, fields):
            self.fields = fields

        def to_json(self):
            return dict(self.fields)


    def test_attention_entropy(head_ref, claim_session, record_result):
        run = claim_session.run(head_ref.model)
        entropy = run.layer_metrics("H", head_ref.layer)["entropy"][:, head_ref.head]
        metrics, v = head_verdict(entropy)
        record = {"claim": "H", "level": "head", "model": head_ref.model,
                  "layer": head_ref.layer, "head": head_ref.head, "metrics": metrics,
                  "verdict": v.verdict, "verdicts": {"p2": v.verdict, "ours": v.verdict},
                  "rules": run.options.rules, "n_samples": int(entropy.numel()),
                  "evidence": verdicts.format_evidence(v)}
        record_result(TypedRecord(record), run)
        assert_supported(record, f"claim H {head_ref.id}: {v.verdict}\\n{record['evidence']}")
'''

#: A model family that declares claim V unsupported (families add ``unsupported_claims`` to
#: ModelSpec; here a plugin sets it on the selected spec after the kpca plugin resolved it).
FAKE_FAMILY = '''
    import dataclasses

    import pytest

    from fixtures.models import families

    from fixtures import plugin
    from fixtures.models.families.timm_vit import TimmViT


    @families.register
    class NoValueViT(TimmViT):
        """timm ViT attention, declaring claim V unsupported (a test family)."""
        name = "timm-vit-no-v"
        unsupported_claims = {"V": "a causal mask leaves no key Gram matrix per head"}


    @pytest.hookimpl(trylast=True)
    def pytest_configure(config):
        specs = config.stash.get(plugin._SPECS, None)
        if specs is None:
            return
        for key, spec in list(specs.items()):
            specs[key] = dataclasses.replace(spec, family=NoValueViT.name)
'''

SMALL = ("--models", "tiny-vit-digits-softmax", "--layers", "0", "--heads", "0,1",
         "--n-samples", "4", "--threads", "1")


def _trained_cache(cache: Path) -> None:
    """A fresh cache: the trained ViT is the shipped one, copied in and verified by the run."""
    cache.mkdir(parents=True)


def _run(pytester, tmp_path, *args):
    cache, out = tmp_path / "cache", tmp_path / "out"
    _trained_cache(cache)
    result = pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "-p", "no:cacheprovider", *SMALL, "--out", str(out), "--cache-dir", str(cache), *args,
        timeout=600)
    return result, out


# ------------------------------------------------------------------------------- the registry
def test_import_claims_registers_v_j_e_with_their_computations():
    assert [s.id for s in registry.all_claims()][:3] == ["V", "J", "E"]
    for spec in registry.all_claims()[:3]:
        assert spec is registry.get(spec.id) and claims.builtin
        assert callable(registry.resolve(spec.layer_metrics))
        assert (ROOT / spec.tests).exists() and spec.section == f"claim_{spec.id.lower()}"
        assert spec.section in verdicts.load_thresholds()


def test_a_spec_may_give_its_computation_as_a_callable():
    def compute(ctx):
        return {}

    assert registry.resolve(compute) is compute
    assert registry.resolve("claims.claim_v_layer:layer_metrics").__name__ == "layer_metrics"


def test_the_built_in_claims_carry_their_method_version_sections_and_sample_rows():
    from claims import outcome

    v, j, e = (registry.get(c) for c in ("V", "J", "E"))
    assert (v.method_version, j.method_version, e.method_version) == ("1", "1", "1")
    # the rule section of each kind of record, as the one-line evidence reads it
    sections = {(c, level): outcome.rule_section({"claim": c, "level": level})
                for c in ("V", "J", "E") for level in registry.get(c).levels}
    assert sections == {("V", "head"): "claim_v", ("V", "model"): "claim_v",
                        ("J", "layer"): "claim_j", ("J", "model"): "claim_j",
                        ("J", "series"): "claim_j_trend",
                        ("E", "head"): "claim_e_gamma", ("E", "model"): "claim_e"}
    assert all(s in verdicts.load_thresholds() for s in sections.values())
    assert v.sample_rows == "claims.claim_v:sample_rows" and e.sample_rows and j.sample_rows is None
    assert callable(registry.resolve(v.sample_rows)) and callable(registry.resolve(e.sample_rows))


def test_sample_rows_are_the_claims_own_and_none_for_others():
    from fixtures.plugin.transport import sample_rows

    seen = []
    spec = registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                              unit="head", levels=("head",),
                              sample_rows=lambda record, run: seen.append(run) or [{"x": 1}])
    registry.register(spec)
    try:
        assert sample_rows({"claim": "T", "level": "head"}, "the run") == [{"x": 1}]
        assert seen == ["the run"]
    finally:
        registry.unregister("T")
    assert sample_rows({"claim": "T", "level": "head"}, None) == []  # not registered
    assert sample_rows({"claim": "J", "level": "layer"}, None) == []  # J declares none
    assert sample_rows({"claim": "V", "level": "model"}, None) == []  # V: head records only


def test_a_spec_names_only_its_own_levels_and_a_version():
    with pytest.raises(ValueError, match=r"claim 'T': record_sections names levels \['model'\]"):
        registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                           unit="head", levels=("head",), record_sections={"model": "claim_t"})
    with pytest.raises(ValueError, match="claim 'T': method_version must be a non-empty string"):
        registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                           unit="head", levels=("head",), method_version=2)


def test_a_claims_own_thresholds_join_the_files_and_may_not_contradict_it():
    rule = {"value": 0.5, "direction": "<", "source": "toy"}
    spec = registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                              unit="head", levels=("head",),
                              thresholds={"claim_t": {"supported": {"x": rule}}})
    registry.register(spec)
    try:
        assert verdicts.load_thresholds()["claim_t"]["supported"]["x"] == rule
        assert verdicts.judge("claim_t", {"x": 0.1}).verdict == verdicts.SUPPORTED
        assert "claim_t" not in verdicts._parse_thresholds(str(verdicts.THRESHOLDS_FILE))
    finally:
        registry.unregister("T")
    assert "claim_t" not in verdicts.load_thresholds()
    clash = registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                               unit="head", levels=("head",),
                               thresholds={"claim_v": {"supported": {"x": rule}}})
    registry.register(clash)
    try:
        with pytest.raises(ValueError, match=r"\[claim_v\] that differs"):
            verdicts.load_thresholds()
    finally:
        registry.unregister("T")


def test_a_claims_thresholds_are_validated_like_the_files():
    bad = registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                             unit="head", levels=("head",),
                             thresholds={"claim_t": {"supported": {"x": {"value": 1}}}})
    registry.register(bad)
    try:
        with pytest.raises(ValueError, match=r"claim 'T'.*\[claim_t.supported.x\] lacks"):
            verdicts.load_thresholds()
    finally:
        registry.unregister("T")


def test_the_cache_key_of_a_claims_metrics_covers_its_own_code(tmp_path):
    import importlib.util

    from fixtures.engine.model_run import _claim_code

    assert _claim_code(registry.get("V")) == ("fixtures.engine.model_run", "claims.claim_v_layer")
    assert _claim_code(registry.get("J"))[-1] == "claims.claim_j_layer"
    assert "fixtures.engine.rpc_study" in _claim_code(registry.get("R"))
    # a claim defined outside the project: its file, by absolute path
    (tmp_path / "my_claim.py").write_text("def layer_metrics(ctx):\n    return {}\n")
    found = importlib.util.spec_from_file_location("my_claim", tmp_path / "my_claim.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    spec = registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                              unit="head", levels=("head",), layer_metrics=module.layer_metrics)
    assert _claim_code(spec)[-1] == str((tmp_path / "my_claim.py").resolve())


def test_a_claim_without_a_per_layer_computation_says_so(tmp_path):
    from fixtures.cache import Cache
    from fixtures.engine.model_run import ModelRun
    from fixtures.engine.run_options import RunOptions

    registry.register(registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t",
                                         source="t", unit="model", levels=("model",)))
    try:
        run = ModelRun(SimpleNamespace(key="m"), RunOptions(cache_dir=str(tmp_path)),
                       Cache(str(tmp_path)))
        with pytest.raises(ValueError, match="claim 'T' declares no per-layer computation"):
            run.compute_layer("T", 0)
    finally:
        registry.unregister("T")


# ------------------------------------------------------------------ unsupported claims (family)
def test_a_family_that_declares_a_claim_unsupported_gets_a_skip_with_its_reason():
    from fixtures.plugin import _unsupported

    spec = SimpleNamespace(unsupported_claims={"V": "no key Gram matrix under a causal mask"})
    (mark,) = _unsupported(spec, "V", "gpt2-tiny")
    assert mark.name == "skip"
    assert mark.kwargs["reason"] == ("claim V is not supported for gpt2-tiny: no key Gram "
                                     "matrix under a causal mask")
    assert _unsupported(spec, "J", "gpt2-tiny") == []
    assert _unsupported(SimpleNamespace(), "V", "m") == []  # a spec without the attribute
    assert _unsupported(SimpleNamespace(unsupported_claims=None), "V", "m") == []
    assert _unsupported(spec, None, "m") == []  # a test that names no claim


@pytest.mark.slow
def test_unsupported_claim_tests_are_skipped_with_the_reason_in_a_run(pytester, tmp_path,
                                                                      monkeypatch):
    pytester.makepyfile(fakefamily=textwrap.dedent(FAKE_FAMILY))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # -p imports it before the root conftest runs
    result, out = _run(pytester, tmp_path, "-p", "fakefamily", "-k", "value_vectors",
                       "-rs", "--report", "none")
    # every selected test skipped as unsupported: nothing judged, exit 9 (README, Exit codes)
    assert result.ret == 9, result.stdout.str()[-3000:]
    text = result.stdout.str()
    assert "3 skipped" in text  # two heads and the model
    assert "claim V is not supported for tiny-vit-digits-softmax: a causal mask leaves no " \
           "key Gram matrix per head" in text
    results = json.loads((out / "results.json").read_text())
    assert results["records"] == [] and results["not_run"] == []


def test_a_test_naming_an_unregistered_claim_is_a_collection_error(pytester, tmp_path):
    pytester.makepyfile(test_nobody='''
        import pytest

        pytestmark = pytest.mark.kpca_claim("Q")

        def test_q(head_ref):
            pass
    ''')
    result, _ = _run(pytester, tmp_path, str(pytester.path / "test_nobody.py"), "-k", "test_q")
    assert result.ret not in (0, 1), result.stdout.str()[-2000:]
    assert "test_nobody.py::test_q: no claim 'Q' is registered; registered: V, J, E" \
        in result.stdout.str()


# ------------------------------------------------------------------------- the toy claim
def _toy_subprocess(tmp_path_factory, name: str, models: str, *args: str) -> SimpleNamespace:
    """One run of the toy claim's test file beside claims/ in a fresh process, on ``models``,
    with its own cache and output folder: ``(proc, out, cache)``."""
    import subprocess
    import sys

    base = tmp_path_factory.mktemp(name)
    (base / "test_entropy_claim.py").write_text(textwrap.dedent(TOY_CLAIM))
    cache, out = base / "cache", base / "out"
    _trained_cache(cache)
    small = list(SMALL)
    small[small.index("--models") + 1] = models
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "claims"), str(base / "test_entropy_claim.py"),
           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider",
           *small, "--out", str(out), "--cache-dir", str(cache), *args]
    proc = subprocess.run(cmd, cwd=base, capture_output=True, text=True, timeout=600)
    return SimpleNamespace(proc=proc, out=out, cache=cache)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """One run of the toy claim's test file beside claims/ (-k keeps only its tests)."""
    return _toy_subprocess(tmp_path_factory, "toy", "tiny-vit-digits-softmax",
                           "-k", "attention_entropy", "-v", "--save-samples")


@pytest.mark.slow
def test_a_toy_claim_from_one_test_file_runs_through_the_interface(toy_run):
    proc, out = toy_run.proc, toy_run.out
    assert proc.returncode in (0, 1), (proc.stdout + proc.stderr)[-3000:]
    # its tests: one per selected head, named like the built-in claims' head tests
    for head in (0, 1):
        assert f"test_attention_entropy[tiny-vit-digits-softmax-L00-H{head}]" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    records = results["records"]
    assert [(r["claim"], r["level"], r["head"]) for r in records] == [("H", "head", 0),
                                                                      ("H", "head", 1)]
    for rec in records:
        assert 0.0 < rec["metrics"]["normalised_entropy"] <= 1.0
        assert rec["verdict"] in ("supported", "refuted")
        assert rec["test_id"].startswith("test_attention_entropy[")
    assert results["complete"] and results["not_run"] == []
    # its rules are recorded with the file's, and its method digest with the built-in claims'
    assert results["thresholds"]["claim_h"]["supported"]["normalised_entropy"]["value"] == 0.9
    assert "claim_v" in results["thresholds"]
    assert set(results["methods"]) == {"V", "J", "E", "R", "H"}
    assert results["methods"]["H"]["version"] == "0.1"  # ClaimSpec.method_version
    # --save-samples: its rows, as its spec's sample_rows gives them, beside V's and E's
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    toy = [r for r in rows if r["claim"] == "H"]
    assert sorted((r["head"], r["sample"]) for r in toy) == [(h, s) for h in (0, 1) for s in range(4)]
    for rec in records:  # the record's value is the mean of its rows
        mine = [r["normalised_entropy"] for r in toy if r["head"] == rec["head"]]
        assert rec["metrics"]["normalised_entropy"] == pytest.approx(sum(mine) / len(mine))
    # its per-layer metrics were computed once and cached under its own folder, like V's
    assert len(list((toy_run.cache / "claim_H").glob("*/metrics.safetensors"))) == 1
    # the verdict table names it
    assert any(line.startswith("H ") and "tiny-vit-digits-softmax" in line
               for line in proc.stdout.splitlines())


@pytest.fixture(scope="module")
def toy_curve_run(tmp_path_factory):
    """The toy claim's test file with ``--multiverse``: its specification curve beside V, J, E's,
    on a model and a control (the toy's expectation)."""
    return _toy_subprocess(tmp_path_factory, "toy-curve", "tiny-vit-digits-softmax,kpca-oracle",
                           "--report", "none", "--multiverse",
                           "-k", "attention_entropy or specification_curve")


@pytest.mark.slow
def test_a_toy_claims_own_axis_is_in_its_specification_curve(toy_curve_run):
    """The toy claim declares its curve function, its entry and an axis of its own (its
    precision) in its spec alone: the curve judges it under both values, recomputing its
    metrics in float32 from the same capture, and its default equals its head records."""
    proc, out = toy_curve_run.proc, toy_curve_run.out
    results = json.loads((out / "results.json").read_text())
    # the toy's expectation on the control, from its spec alone: met or an instrument failure
    oracle = [r for r in results["records"] if r["claim"] == "H" and r["model"] == "kpca-oracle"]
    assert len(oracle) == 2 and all(r["control"] == "positive" for r in oracle)
    for rec in oracle:
        met = rec["verdict"] == "supported"
        assert rec["expected"]["verdicts"] == ["supported"] and rec["expected"]["met"] is met
        assert rec["expected"]["why"] == "toy: the control's softmax rows are sharper than uniform"
        assert rec["expected"]["outcome"] == ("as_expected" if met else "instrument_failure")
    failed = not all(r["expected"]["met"] for r in oracle)
    assert proc.returncode == (8 if failed else 0) or (not failed and proc.returncode == 1), \
        (proc.stdout + proc.stderr)[-3000:]
    curve = results["specification_curve"]
    model = curve["models"]["tiny-vit-digits-softmax"]
    toy = model["entries"]["H"]
    assert (toy["claim"], toy["unit"], toy["axes"]) == ("H", "head", ["toy_precision"])
    rows = toy["specifications"]
    assert [r["name"] for r in rows] == ["hprec=float64", "hprec=float32"]
    assert all(len(r["units"]) == 2 and "verdict" not in r for r in rows)  # head verdicts only
    assert toy["units"]["names"] == ["L00-H0", "L00-H1"] and "model" not in toy
    assert set(toy["units"]["axis_effects"]) == {"toy_precision"}
    assert curve["entries"]["H"] == {"claim": "H", "unit": "head"}
    # the built-in entries are untouched by the toy's axis, and the toy by theirs
    assert "toy_precision" not in model["entries"]["V"]["axes"]
    # its default specification is its head records (unit verdicts compared, none missing)
    assert curve["default_matches_main"]["equal"], curve["default_matches_main"]
    heads = [r for r in results["records"] if r["claim"] == "H"]
    assert [r["verdict"] for r in heads if r["model"] == "tiny-vit-digits-softmax"] == rows[0]["units"]
    # the float32 specification was computed, not copied: its own cache entry
    assert len(list((toy_curve_run.cache / "claim_H").glob("*/metrics.safetensors"))) == 4


@pytest.mark.slow
def test_a_toy_claims_section_is_in_the_report(toy_run):
    html = (toy_run.out / "report.html").read_text()
    assert "Attention entropy is below 0.9" in html
    assert "normalised_entropy" in html or "normalised entropy" in html


def test_every_declared_record_function_resolves_and_names_only_run_arguments():
    """``ClaimSpec.records`` (the layer-shard merge rebuilds records with them): each resolves,
    and takes only arguments :func:`claims.stored_run.rebuild` gives."""
    import inspect

    from claims.stored_run import ARGUMENTS

    declared = {spec.id: spec.records for spec in registry.all_claims() if spec.records}
    assert set(declared) >= {"V", "J", "E"}
    for claim, table in declared.items():
        for level, target in table.items():
            params = inspect.signature(registry.resolve(target)).parameters
            assert set(params) <= set(ARGUMENTS), (claim, level, sorted(params))
    with pytest.raises(ValueError, match=r"claim 'T': records names levels \['model'\]"):
        registry.ClaimSpec(id="T", section="claim_t", title="t", statement="t", source="t",
                           unit="head", levels=("head",), records={"model": "claims.x:y"})
