"""The control ladder (method §12): the kpca-oracle family against float64 references, its
function-preserving twins, its negatives, the expected verdicts and what a run does with a control
whose verdict is not the expected one (exit 8, its own terminal line, a fault entry, headline
counts without controls)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from checks.gram import KeyGram
from claims import registry as claims_registry
from claims.records import VERDICTS
from claims.registry import ClaimSpec
from fixtures.models import controls, catalogue as registry
from fixtures.models.capture import capture_qkv
from fixtures.models.families import kpca_oracle as oracle
from fixtures.models.loading import load_model
from fixtures.plugin.control_outcomes import expectation
from fixtures.plugin.state import EXIT_INSTRUMENT_FAILURE
from fixtures.plugin.terminal import control_lines, verdict_table
from report.summary import summary

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
F64 = torch.float64
#: The (claim, level) units the built-in claims declare expectations for (ClaimSpec.controls).
UNITS = (("V", "head"), ("V", "model"), ("J", "layer"), ("J", "model"), ("E", "model"),
         ("E", "head"))


def _expect(key: str, claim: str, level: str) -> controls.Expectation:
    """Control ``key``'s expectation for (claim, level), as a run looks it up."""
    return expectation(controls.control_of(key), claim, level)


def annotate(record: dict, model: str, bars=None) -> dict:
    """:func:`controls.annotate` with the run's lookup of the claims' declared expectations."""
    return controls.annotate(record, model, bars, expect=expectation)


def _images(n: int = 3, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, oracle.IMAGE_SIZE, oracle.IMAGE_SIZE, generator=gen, dtype=F64)


def _layer0_input(model: oracle.OracleViT, images: torch.Tensor) -> torch.Tensor:
    x = model.patch_embed(images).flatten(2).transpose(1, 2)
    x = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + model.pos_embed
    return model.blocks[0].norm1(x)


def _numpy_kpca_values(k: np.ndarray, scale: float, d: int) -> np.ndarray:
    """V̂ of one head in the kpca convention (method §1.2–§1.4), independently in NumPy float64:
    log-space K_φ, centring by H·K_φ·H, numpy.linalg.eigh, largest-magnitude entry positive."""
    n = k.shape[0]
    s = scale * k @ k.T
    log_g = np.log(np.exp(s - s.max(axis=1, keepdims=True)).sum(axis=1)) + s.max(axis=1)
    k_phi = np.exp(s - log_g[:, None] - log_g[None, :])
    h = np.eye(n) - np.ones((n, n)) / n
    mu, a = np.linalg.eigh(h @ k_phi @ h)
    mu, a = mu[::-1][:d], a[:, ::-1][:, :d]
    a = a * np.sign(a[np.abs(a).argmax(axis=0), np.arange(d)])
    return (h @ a) / np.exp(log_g)[:, None] / np.sqrt(mu)[None, :]


# ------------------------------------------------------------------------------ the oracle
def test_oracle_values_are_the_suites_kpca_values_exactly_in_float64():
    model = oracle.build_oracle("vhat", 0)
    attn = model.blocks[0].attn
    with torch.no_grad():
        x = _layer0_input(model, _images())
        _, k = attn.keys(x)
        v = attn.values(x, k)
    assert v.dtype == F64 and v.shape == (3, oracle.N_HEADS, oracle.N_TOKENS, oracle.HEAD_DIM)
    # the suite's own V̂ (checks/), exactly: same keys, same function, no tolerance
    assert torch.equal(v, KeyGram(k, scale=attn.scale, top=oracle.HEAD_DIM).kpca_values("kpca"))
    # an independent route (NumPy, the full eigendecomposition) to 1e-9 relative
    for b in range(3):
        for h in range(oracle.N_HEADS):
            ref = _numpy_kpca_values(k[b, h].numpy(), attn.scale, oracle.HEAD_DIM)
            assert np.abs(v[b, h].numpy() - ref).max() <= 1e-9 * np.abs(ref).max()
    # keys are standardised per token and already float32 values (what the capture stores)
    assert torch.equal(k, k.float().double())
    assert float(k.mean(-1).abs().max()) < 1e-6


def test_capture_records_the_keys_and_values_the_oracle_used():
    loaded = load_model(registry.REGISTRY["kpca-oracle"])
    out = capture_qkv(loaded, _images(2).float())
    assert out["v"].shape == (2, 2, oracle.N_HEADS, oracle.N_TOKENS, oracle.HEAD_DIM)
    assert out["standardized_qk"] is True
    k = out["k"].double()  # float32 keys, exactly those the model used
    v_hat = KeyGram(k, scale=loaded.scale, top=oracle.HEAD_DIM).kpca_values("kpca")
    assert torch.allclose(out["v"].double(), v_hat, rtol=1e-6, atol=1e-7 * float(v_hat.abs().max()))
    # to the bit, layer by layer: the model's V is V̂ of those float32 keys, rounded once. So the
    # capture's float64 forward keeps the oracle's own rounding of its keys to float32 (the
    # oracle's family does not ask for wide_forward's rule, under which .float() is float64)
    for layer in range(2):
        want = KeyGram(k[layer], scale=loaded.scale, top=oracle.HEAD_DIM).kpca_values("kpca")
        assert torch.equal(out["v"][layer], want.float()), layer
    assert loaded.scale == oracle.ORACLE_SCALE


TWINS = ("rotated", "mixed-cond10", "mixed-cond100", "mixed-cond1000", "scaled-10", "scaled-100",
         "scaled-1000", "signs", "permuted")


def test_function_preserving_twins_compute_the_same_network_as_vhat():
    images = _images(2, seed=1)
    with torch.no_grad():
        ref = oracle.build_oracle("vhat", 0).features(images)
        ref_logits = oracle.build_oracle("vhat", 0)(images)
        for name in TWINS:
            twin = oracle.build_oracle(name, 0)
            out = twin.features(images)
            assert float((out - ref).abs().max()) <= 1e-10 * float(ref.abs().max()), name
            assert torch.allclose(twin(images), ref_logits, rtol=0, atol=1e-10), name
        # the check can fail: values that are not a twin change the output far beyond it
        for name in ("noise-1pct", "null", "random-init"):
            out = oracle.build_oracle(name, 0).features(images)
            assert float((out - ref).abs().max()) > 1e-6 * float(ref.abs().max()), name


def test_twins_values_are_vhat_times_their_matrix():
    images = _images(2, seed=2)
    with torch.no_grad():
        base = oracle.build_oracle("vhat", 0)
        x = _layer0_input(base, images)
        _, k = base.blocks[0].attn.keys(x)
        v_hat = base.blocks[0].attn.values(x, k)
        for name, check in (("rotated", "orthogonal"), ("mixed-cond100", 100.0),
                            ("mixed-cond1000", 1000.0), ("scaled-100", "scale"),
                            ("signs", "signs"), ("permuted", "permutation")):
            attn = oracle.build_oracle(name, 0).blocks[0].attn
            assert torch.equal(attn.keys(x)[1], k), name  # same base weights: same keys
            mix = attn.mix
            assert torch.allclose(attn.values(x, k), v_hat @ mix, rtol=0, atol=1e-15), name
            eye = torch.eye(oracle.HEAD_DIM, dtype=F64).expand_as(mix)
            if check == "orthogonal":
                assert torch.allclose(mix @ mix.transpose(-1, -2), eye, atol=1e-12)
            elif check == "scale":
                assert torch.equal(mix, 100.0 * eye)
            elif check == "signs":
                assert torch.equal(mix.abs(), eye)
                assert (torch.diagonal(mix, dim1=-2, dim2=-1) < 0).sum(-1).tolist() == \
                    [oracle.HEAD_DIM // 2] * oracle.N_HEADS
            elif check == "permutation":
                ones = torch.ones(oracle.N_HEADS, oracle.HEAD_DIM, dtype=F64)
                assert torch.equal(mix.sum(-1), ones)
                assert float(torch.diagonal(mix, dim1=-2, dim2=-1).abs().sum()) == 0.0
            else:
                assert torch.allclose(torch.linalg.cond(mix), torch.full((oracle.N_HEADS,), check,
                                                                          dtype=F64), rtol=1e-8)


def test_negative_controls_values_do_not_depend_on_the_keys():
    with torch.no_grad():
        null = oracle.build_oracle("null", 0).blocks[0].attn
        x1 = _layer0_input(oracle.build_oracle("null", 0), _images(2, seed=3))
        x2 = _layer0_input(oracle.build_oracle("null", 0), _images(2, seed=4))
        k1, k2 = null.keys(x1)[1], null.keys(x2)[1]
        assert not torch.allclose(k1, k2)
        v1, v2 = null.values(x1, k1), null.values(x2, k2)
        assert torch.equal(v1, v2) and torch.equal(v1[0], null.null_values)
        # its entries are Gaussian with the variance of an initialised value projection
        assert abs(float(null.null_values.var()) - oracle.NULL_VARIANCE) < 0.05
        rand = oracle.build_oracle("random-init", 0).blocks[0].attn
        v = rand.values(x1, k1)
        assert torch.equal(v, rand._split(rand.v(x1)))  # X·W_V: a function of X, not of V̂
        # V = X·W_V stays the same when the key projection changes; V̂ does not
        rand.k.weight.add_(0.5)
        assert torch.equal(rand.values(x1, rand.keys(x1)[1]), v)


# ------------------------------------------------------------------------------ expectations
def test_every_ladder_member_is_registered_in_the_controls_group_with_expectations():
    keys = [spec.key for spec in registry.group_members("controls")]
    assert keys == [controls.ladder_key(name) for name in oracle.MEMBERS]
    assert set(controls.LADDER) == set(oracle.MEMBERS)
    default = {spec.key for spec in registry.group_members("default")}
    assert set(keys) <= default
    for key in keys:
        spec = registry.REGISTRY[key]
        assert spec.control and spec.family == "kpca-oracle"
        assert (spec.n_layers, spec.n_heads, spec.head_dim) == (2, 4, 8)
        control = controls.control_of(key)
        assert control.role in controls.ROLES
        for unit in UNITS:
            exp = _expect(key, *unit)
            assert set(exp.verdicts) <= set(VERDICTS) and exp.why
    # each built-in claim declares every control kind, at every level it expects of a control
    for claim in ("V", "J", "E"):
        table = claims_registry.resolve(claims_registry.get(claim).controls)()
        assert set(table) == set(controls.KINDS), claim
        assert {(claim, lv) for per in table.values() for lv in per} <= set(UNITS), claim
    for key in ("control-vit_tiny_patch16_224", "control-bert-minilm-shape"):
        assert controls.control_of(key).role == "negative"
        # not true nulls (values and keys share X's dominant subspace, method §12.5)
        assert _expect(key, "V", "head").verdicts == controls.NOT_SUPPORTED
        # γ: the span holds X's dominant directions (small ρ) but is not invariant direction by
        # direction (ω), method §4.2, §12.5
        assert _expect(key, "E", "head").verdicts == controls.NOT_SUPPORTED
    assert controls.control_of("all-MiniLM-L6-v2") is None


def test_positive_controls_expect_support_and_negatives_refutation():
    for name, (role, _) in controls.LADDER.items():
        key = controls.ladder_key(name)
        if role == "positive":
            assert all(_expect(key, *u).verdicts == ("supported",) for u in UNITS)
        elif role == "negative":
            if name != "keys-p1":  # V = K·R: no expectation for V and γ (method §12.4)
                for unit in (("V", "head"), ("V", "model"), ("E", "head")):
                    assert _expect(key, *unit).verdicts == ("refuted",)
            assert "supported" not in _expect(key, "J", "layer").verdicts
            assert "supported" not in _expect(key, "J", "model").verdicts
    # the true null: claim J's output fit is at chance, shown by the equivalence test (§3.6) for
    # the model; a single layer's interval is wider than the relative margin (§12.4)
    null = controls.ladder_key("null")
    assert _expect(null, "J", "model").verdicts == ("refuted",)
    assert _expect(null, "J", "layer").verdicts == controls.NOT_SUPPORTED
    assert {"vhat", "rotated", "mixed-cond1000", "scaled-1000", "signs", "permuted"} <= {
        n for n, (role, _) in controls.LADDER.items() if role == "positive"}
    assert {n for n, (role, _) in controls.LADDER.items() if role == "negative"} == {
        "null", "random-init", "random-init-p1", "keys-p1"}
    # the negatives at P1's kernel (raw q, k; s = 1/sqrt(d)) exist for claim J's specificity
    for name in ("random-init-p1", "keys-p1"):
        assert _expect(controls.ladder_key(name), "J", "layer").verdicts == controls.NOT_SUPPORTED


# ------------------------------------------------------------------------------ plumbing
def _record(model, verdict, claim="V", level="head", layer=0, head=0, ours=None):
    return {"claim": claim, "level": level, "model": model, "layer": layer, "head": head,
            "verdict": verdict, "verdicts": {"p2": verdict, "ours": ours or verdict},
            "outcome": "passed", "test_id": f"t[{model}-{layer}-{head}]"}


def test_annotate_records_role_and_expected_verdict_beside_the_verdict():
    assert annotate(_record("all-MiniLM-L6-v2", "refuted"), "all-MiniLM-L6-v2") == \
        _record("all-MiniLM-L6-v2", "refuted")
    ok = annotate(_record("kpca-oracle-null", "refuted"), "kpca-oracle-null")
    assert ok["control"] == "negative"
    assert ok["expected"] == {"verdict": "refuted", "verdicts": ["refuted"], "rules": "ours",
                              "got": "refuted", "met": True, "why": ok["expected"]["why"],
                              "outcome": "as_expected"}
    # the expectation is stated for 'ours', whatever --rules chose as the record's verdict
    bad = annotate(_record("kpca-oracle", "supported", ours="inconclusive"), "kpca-oracle")
    assert bad["expected"]["got"] == "inconclusive" and bad["expected"]["met"] is False
    assert controls.instrument_failed(bad) and not controls.instrument_failed(ok)
    dose = annotate(_record("kpca-oracle-noise-100pct", "refuted"),
                             "kpca-oracle-noise-100pct")
    assert dose["expected"]["met"] is True and dose["control"] == "dose-response"
    assert dose["expected"]["verdict"] == "not supported"
    turning = annotate(_record("kpca-oracle-noise-20pct", "refuted"), "kpca-oracle-noise-20pct")
    assert turning["expected"]["met"] is False  # claim V at ε = 0.2 is expected supported
    unstated = annotate(_record("kpca-oracle-keys-p1", "refuted"), "kpca-oracle-keys-p1")
    assert unstated["expected"]["met"] is None
    entry = controls.failure_entry({**bad, "test_id": "test_value_vectors[kpca-oracle-L00-H0]"})
    assert entry["kind"] == "instrument" and entry["expected"] == "supported"
    assert entry["got"] == "inconclusive" and entry["role"] == "positive"
    assert entry["error"] == ("INSTRUMENT FAILURE: claim V kpca-oracle-L00-H0 (positive control): "
                              "expected supported under 'ours', got inconclusive")


def test_headline_counts_and_verdict_table_exclude_controls():
    records = [_record("m", "refuted"), _record("m", "supported", head=1),
               annotate(_record("kpca-oracle-null", "refuted"), "kpca-oracle-null"),
               annotate(_record("kpca-oracle", "inconclusive"), "kpca-oracle"),
               annotate(_record("kpca-oracle-noise-100pct", "refuted"),
                                 "kpca-oracle-noise-100pct")]
    counts = summary(records, [])
    assert counts["records"] == 2
    assert counts["verdicts"] == {"V": {"head": {"refuted": 1, "supported": 1}}}
    assert counts["controls"] == {
        "negative": {"records": 1, "as_expected": 1, "instrument_failures": 0, "no_expectation": 0},
        "positive": {"records": 1, "as_expected": 0, "instrument_failures": 1, "no_expectation": 0},
        "dose-response": {"records": 1, "as_expected": 1, "instrument_failures": 0,
                          "no_expectation": 0}}
    table = "\n".join(verdict_table([r for r in records if not controls.is_control(r)]))
    assert "kpca-oracle" not in table and "2 heads: 1 supported, 1 refuted" in table
    lines = control_lines([r for r in records if controls.is_control(r)])
    assert lines[0].startswith("kpca-claims controls (not counted above)")
    assert "  negative: 1 models, 1 records: 1 as expected, 0 instrument failures" in lines
    assert lines[-1].startswith("INSTRUMENT FAILURE: claim V kpca-oracle-L00-H0")
    assert summary(records[:2], []).get("controls") is None


# ------------------------------------------------------------------------------ a claim's own
TOY_WHY = "toy: the true null supports the toy claim by construction"


def _toy_expectations() -> dict:
    return {"null": {"head": (("supported",), TOY_WHY)}}


@pytest.fixture
def toy_claim():
    """Register a toy claim ``TOY`` (levels head, model) whose ``controls`` is the given table;
    removed again at the end."""

    def register(table) -> ClaimSpec:
        claims_registry.unregister("TOY")
        return claims_registry.register(ClaimSpec(
            id="TOY", section="claim_toy", title="a toy claim", statement="toy holds",
            source="tests/test_controls.py", unit="head", levels=("head", "model"),
            controls=table))

    try:
        yield register
    finally:
        claims_registry.unregister("TOY")


def test_a_claim_declares_its_own_expectations_on_the_controls(toy_claim):
    """A new claim states what it expects of a control in its own spec (``controls``): the run's
    annotation of its record on that control carries that expectation and its outcome."""
    toy_claim(_toy_expectations)
    null = controls.ladder_key("null")
    met = annotate(_record(null, "supported", claim="TOY"), null)
    assert met["control"] == "negative"
    assert met["expected"] == {"verdict": "supported", "verdicts": ["supported"], "rules": "ours",
                               "got": "supported", "met": True, "why": TOY_WHY,
                               "outcome": "as_expected"}
    missed = annotate(_record(null, "refuted", claim="TOY"), null)
    assert missed["expected"] == {**met["expected"], "got": "refuted", "met": False,
                                  "outcome": "instrument_failure"}
    assert controls.instrument_failed(missed) and not controls.instrument_failed(met)
    assert controls.failure_entry(missed)["error"] == (
        f"INSTRUMENT FAILURE: claim TOY {null}-L00-H0 (negative control): expected supported "
        "under 'ours', got refuted")
    # a control kind or level the claim leaves out: no expectation, with the reason
    for key, level in (("kpca-oracle", "head"), (null, "model")):
        free = annotate(_record(key, "refuted", claim="TOY", level=level), key)["expected"]
        assert free["outcome"] == "no_expectation" and free["met"] is None
        assert free["why"] == f"no expectation declared for claim TOY at level {level}"
    # the built-in claims' expectations on the same control are their own
    assert annotate(_record(null, "refuted"), null)["expected"]["outcome"] == "as_expected"


@pytest.mark.parametrize("table, message", [
    ({"no-such-control": {"head": (("supported",), "why")}},
     "claim 'TOY': its controls name an unknown control 'no-such-control'"),
    ({"null": {"head": (("proven",), "why")}},
     "claim 'TOY', control 'null', level 'head': unknown verdict word(s) ['proven']"),
    ({"null": {"layer": (("supported",), "why")}},
     "claim 'TOY', control 'null', level 'layer': 'layer' is not among the claim's levels"),
    ({"null": {"head": "supported"}},
     "claim 'TOY', control 'null', level 'head': the expectation must be (verdicts tuple, why"),
], ids=["unknown-control", "unknown-verdict", "unknown-level", "not-a-pair"])
def test_a_claim_declaring_an_unknown_control_or_verdict_gets_a_clear_error(toy_claim, table,
                                                                             message):
    toy_claim(lambda: table)
    null = controls.ladder_key("null")
    with pytest.raises(ValueError) as err:
        annotate(_record(null, "refuted", claim="TOY"), null)
    assert message in str(err.value)


# ------------------------------------------------------------------------------ end to end
WRONG_EXPECTATION = '''
import sys

sys.path.insert(0, {root!r})  # loaded by -p before the checkout's conftest puts it on the path
from fixtures.models import controls  # noqa: E402

# a deliberately wrong expectation in claim E's declaration: V̂'s γ heads are supported by
# construction (and today); its spec names the function, looked up when first used
import claims.claim_e_controls as _e  # noqa: E402

_right = _e.expectations


def _wrong():
    table = _right()
    return {**table, "vhat": {**table["vhat"], "head": (("refuted",), "deliberately wrong")}}


_e.expectations = _wrong
'''


def _ladder_run(pytester, out: Path, *extra: str):
    return pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--models", "kpca-oracle", "--layers", "0", "--heads", "0,1", "--n-samples", "4",
        "-k", "gamma_constancy", "--out", str(out), "--cache-dir", str(out / "cache"),
        "-p", "no:cacheprovider", *extra, timeout=600)


@pytest.mark.slow
def test_a_control_with_a_wrong_expectation_exits_8_with_its_line_and_fault_entry(pytester,
                                                                                 tmp_path):
    # the right expectation: V̂'s γ heads are supported, the controls pass, exit 0
    good = _ladder_run(pytester, tmp_path / "good")
    assert good.ret == 0, good.stdout.str()[-3000:]
    results = json.loads((tmp_path / "good" / "results.json").read_text())
    assert [r["expected"]["met"] for r in results["records"]] == [True, True]
    assert "instrument_failures" not in results and results["summary"]["records"] == 0
    # the wrong one: the same verdicts are now instrument failures
    pytester.makepyfile(wrong_expectation=WRONG_EXPECTATION.replace("{root!r}", repr(str(ROOT))))
    bad = _ladder_run(pytester, tmp_path / "bad", "-p", "wrong_expectation")
    assert bad.ret == EXIT_INSTRUMENT_FAILURE == 8, bad.stdout.str()[-3000:]
    text = bad.stdout.str()
    for head in (0, 1):
        assert (f"INSTRUMENT FAILURE: claim E kpca-oracle-L00-H{head} (positive control): "
                f"expected refuted under 'ours', got supported") in text
    results = json.loads((tmp_path / "bad" / "results.json").read_text())
    assert results["exit_status"] == 8 and results["complete"]
    assert [(f["kind"], f["model"], f["claim"], f["level"], f["head"], f["expected"], f["got"])
            for f in results["instrument_failures"]] == [
        ("instrument", "kpca-oracle", "E", "head", h, "refuted", "supported") for h in (0, 1)]
    assert all(r["verdict"] == "supported" and r["expected"]["met"] is False
               for r in results["records"])
    assert results["summary"]["verdicts"] == {}  # not a refutation, not a verdict of a model
    assert results["summary"]["controls"]["positive"]["instrument_failures"] == 2


@pytest.mark.slow
def test_the_ladder_runs_end_to_end_through_results_and_report(pytester, tmp_path):
    """`pytest claims/ --models controls` (small selection): every control's records carry their
    role and expectation, the exit code is 8 exactly when a control missed (else 0: nothing under
    test), results.json validates against its schema, and the report shows the Controls section
    before the grid. Independent of what the rules decide."""
    import jsonschema

    out = tmp_path / "ladder"
    run = pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "--models", "controls", "--layers", "0", "--heads", "0,1", "--n-samples", "4",
        "--threads", "1", "--out", str(out), "--cache-dir", str(out / "cache"),
        "-p", "no:cacheprovider", timeout=900)
    results = json.loads((out / "results.json").read_text())
    failures = results.get("instrument_failures", [])
    assert run.ret == (8 if failures else 0) == results["exit_status"], run.stdout.str()[-3000:]
    assert results["complete"] and not results["not_run"]
    assert set(results["models"]) == {controls.ladder_key(n) for n in oracle.MEMBERS}
    members = len(oracle.MEMBERS)  # 18: the ladder of method §12
    # each model x (2 V heads + V model + 1 J layer + J model + 2 γ heads + E model)
    assert len(results["records"]) == members * 8
    for rec in results["records"]:
        assert rec["control"] == controls.control_of(rec["model"]).role
        assert rec["expected"]["got"] == rec["verdicts"]["ours"]
        assert rec["expected"]["met"] in (True, False, None)
        assert (rec["outcome"] == "failed") == (rec["expected"]["met"] is False)
    assert len(failures) == sum(r["expected"]["met"] is False for r in results["records"])
    assert results["summary"]["records"] == 0 and results["summary"]["verdicts"] == {}
    assert sum(c["records"] for c in results["summary"]["controls"].values()) == members * 8
    schema = json.loads((ROOT / "docs" / "results.schema.json").read_text())
    jsonschema.validate(results, schema)
    text = run.stdout.str()
    assert "kpca-claims controls (not counted above)" in text
    assert text.count("INSTRUMENT FAILURE: claim") == len(failures)
    html = (out / "report.html").read_text()
    assert html.index('id="grid"') < html.index('id="controls-state"') < html.index('id="controls"')
    assert html.count('<tr class="role-') == members
    assert html.count("ctl-cell ctl-failed") == len({(f["model"], f["claim"], f["level"])
                                                     for f in failures})


def test_report_shows_controls_apart_before_the_models_under_test():
    """The example results with their control's records annotated as a run writes them: the
    first screen's grid leaves the control out and states the controls in one line; the
    Controls section comes before the claim sections; the control leaves the summary counts,
    the grid and the claim sections, and stays in the provenance."""
    from report.render import render_report

    results = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    plain = render_report(results)
    ctrl = "control-vit_tiny_patch16_224"
    results["records"] = [annotate(r, r["model"]) for r in results["records"]]
    n_ctrl = sum(r["model"] == ctrl for r in results["records"])
    assert n_ctrl and all("expected" in r for r in results["records"] if r["model"] == ctrl)
    html = render_report(results)
    assert 'id="controls"' not in plain and 'id="controls"' in html
    assert html.index('id="grid"') < html.index('id="controls"') < html.index('id="claim-v"')
    def grid(page):
        start = page.index('id="verdict-grid"')
        return page[start:page.index("</table>", start)]
    assert ctrl not in grid(html) and ctrl in grid(plain)
    assert 'id="controls-state" class="state state-' in html[:html.index('id="summary"')]
    assert f'id="heatmap-V-{ctrl}"' not in html and f'id="heatmap-V-{ctrl}"' in plain
    n_all = len(results["records"])
    assert f"{n_all} records in the results file" in plain
    assert f"{n_all - n_ctrl} records in the results file" in html
    assert html.count('<tr class="role-negative') == 1
    assert f"<h4>{ctrl}</h4>" in html  # provenance still lists every model
    # the claim sections are numbered after the Controls section (2) when there is one
    assert "<h2>3. Claim V" in html and "<h2>2. Claim V" in plain


def test_every_dose_of_the_ladder_has_an_expectation_that_never_rises_with_the_dose():
    """Issue 41: each dose states what the calibration of the bars implies (method §12.2), and
    the allowed verdicts never get better as the dose grows (the gates' rank,
    report.baseline_gate.VERDICT_RANK: refuted < inconclusive = undetermined < partial <
    supported). Claim J's largest dose alone has none, with its reason: claim J reads the head's
    output, in which the attention averages the row noise."""
    from claims import claim_e_controls, claim_j_controls, claim_v_controls
    from claims import control_vocabulary as vocabulary
    from report.baseline_gate import VERDICT_RANK as rank

    for claim, module, level in (("V", claim_v_controls, "head"), ("E", claim_e_controls, "head"),
                                 ("J", claim_j_controls, "layer")):
        table = module.expectations()
        best = [max((rank[v] for v in table[kind][level][0]), default=None)
                for kind in ("noise-1pct", *vocabulary.DOSES)]
        stated = [b for b in best if b is not None]
        assert stated == sorted(stated, reverse=True), (claim, best)
        missing = [kind for kind in vocabulary.DOSES if not table[kind][level][0]]
        assert missing == ([] if claim != "J" else ["noise-100pct"]), (claim, missing)
        for kind in missing:
            assert "no expectation" in table[kind][level][1]


def test_the_claims_verdict_sets_are_the_controls_own():
    """claims/control_vocabulary.py (the claims' expectations) and fixtures/models/controls.py
    (which labels them and may not import claims) name the same verdict sets."""
    from claims import control_vocabulary as vocabulary

    assert (vocabulary.SUPPORTED, vocabulary.REFUTED, vocabulary.NOT_SUPPORTED,
            vocabulary.NOT_REFUTED) == (controls.SUPPORTED, controls.REFUTED,
                                        controls.NOT_SUPPORTED, controls.NOT_REFUTED)
    assert set(vocabulary.POSITIVE) | {"noise-1pct"} == {
        name for name, (role, _) in controls.LADDER.items() if role == "positive"}
    assert set(vocabulary.DOSES) == {
        name for name, (role, _) in controls.LADDER.items() if role == "dose-response"}
