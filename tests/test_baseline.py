"""The CI gate (method §10): a candidate checkpoint against the accepted one (default), the strict
same-checkpoint mode, the policy gate --require, and real `pytest claims/` runs on a tiny ViT."""

import copy
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from claims.verdicts import load_thresholds
from report import baseline, baseline_gate, baseline_matching, require_gate
from report.render import render_report

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"
VIT = "control-vit_tiny_patch16_224"
pytest_plugins = ["pytester"]
# one xdist worker builds gate_env (a real --update-baseline run) once, not each worker its own
pytestmark = pytest.mark.xdist_group("gate")


@pytest.fixture
def results():
    return json.loads(EXAMPLE.read_text())


def _first(results, claim, level, model=VIT):
    return next(r for r in results["records"]
                if r["claim"] == claim and r["level"] == level and r["model"] == model)


def _candidate(results, new_key="checkpoint-run-0042", old_key=VIT):
    """The same run as if made from another checkpoint file of the same architecture."""
    out = copy.deepcopy(results)
    model = out["models"].pop(old_key)
    out["models"][new_key] = {**model, "key": new_key, "checkpoint_hash": "sha256:" + "1" * 64}
    for rec in out["records"]:
        if rec["model"] == old_key:
            rec["model"] = new_key
    return out


def _gate(results, base, mode="candidate", **kw):
    table = "baseline" if mode == "same-checkpoint" else "baseline_candidate"
    return baseline_gate.compare(results, base, load_thresholds()[table], mode=mode, **kw)


# ------------------------------------------------------------------- candidate vs accepted
def test_same_results_pass_in_both_modes(results):
    base = baseline.make_baseline(results)
    for mode in baseline_gate.GATE_MODES:
        out = _gate(results, base, mode)
        assert out.regressions == [] and out.improvements == [] and out.compared == 28


def test_a_new_checkpoint_under_another_file_name_is_compared(results):
    base = baseline.make_baseline(results)
    cand = _candidate(results)
    out = _gate(cand, base)
    pair = next(p for p in out.pairs if p["candidate"] == "checkpoint-run-0042")
    assert pair["baseline"] == VIT
    assert pair["candidate_hash"] != pair["baseline_hash"]        # recorded, not required to match
    assert out.regressions == [] and out.compared == 28
    lines = baseline_gate.summary_lines(out.to_json())
    assert any("checkpoint-run-0042 (111111111111) vs baseline" in line
               and "new checkpoint" in line for line in lines)


def test_a_worse_verdict_is_a_regression_and_a_better_one_an_improvement(results):
    base = baseline.make_baseline(results)
    cand = _candidate(results)
    head = next(r for r in cand["records"] if r["claim"] == "V" and r["level"] == "head"
                and r["model"] == "checkpoint-run-0042" and r["verdict"] != "refuted")
    was = head["verdict"]
    head["verdict"] = "refuted"
    model = _first(cand, "J", "model", "checkpoint-run-0042")
    assert model["verdict"] == "inconclusive"
    model["verdict"] = "supported"
    out = _gate(cand, base)
    assert [str(c) for c in out.regressions] == [
        f"claim V checkpoint-run-0042 head L{head['layer']:02d} H{head['head']}: "
        f"verdict {was} -> refuted"]
    assert [str(c) for c in out.improvements] == [
        "claim J checkpoint-run-0042 model: verdict inconclusive -> supported"]


def test_inconclusive_and_undetermined_are_of_one_rank(results):
    base = baseline.make_baseline(results)
    rec = next(r for r in results["records"] if r["verdict"] == "inconclusive")
    rec["verdict"] = "undetermined"
    out = _gate(results, base)
    assert out.regressions == [] and out.improvements == []
    with_strict = _gate(results, base, "same-checkpoint")
    assert len(with_strict.regressions) == 1                      # the strict gate: any change


def test_metric_tolerance_of_a_new_checkpoint_is_one_sided(results):
    table = load_thresholds()["baseline_candidate"]
    tol = table["metrics"]["V.optimal_cosine"].get("abs", table["abs"])  # the table's default
    base = baseline.make_baseline(results)
    rec = _first(results, "V", "head")
    old = rec["metrics"]["optimal_cosine"]
    rec["metrics"]["optimal_cosine"] = old - tol / 2                # retraining noise: tolerated
    assert _gate(results, base).regressions == []
    rec["metrics"]["optimal_cosine"] = old - 2 * tol                # a lost property
    out = _gate(results, base)
    assert len(out.regressions) == 1
    text = str(out.regressions[0])
    assert text.startswith(f"claim V {VIT} head L{rec['layer']:02d} H{rec['head']}: optimal_cosine")
    assert f"tolerance {tol:.3g}" in text and "regression when decrease" in text
    rec["metrics"]["optimal_cosine"] = old + 2 * tol                # better: listed, not failed
    out = _gate(results, base)
    assert out.regressions == [] and [c.what for c in out.improvements] == ["optimal_cosine"]


def test_a_judged_metric_that_becomes_undefined_is_named(results):
    base = baseline.make_baseline(results)
    rec = _first(results, "J", "layer")
    was = rec["metrics"]["bessel_share"]
    rec["metrics"]["bessel_share"] = "nan"
    out = _gate(results, base)
    assert [str(c).split(": ", 1)[1] for c in out.regressions] == [
        f"bessel_share {was} -> nan, not a finite number on one side"]


def test_a_metric_regression_needs_to_leave_both_cis_when_both_runs_have_them(results):
    tol = load_thresholds()["baseline_candidate"]["metrics"]["J.log10_ratio"]["abs"]
    rec = _first(results, "J", "model")
    old = rec["metrics"]["log10_ratio"]
    rec["ci"] = {"log10_ratio": [old - 0.5, old + 0.5]}
    base = baseline.make_baseline(results)
    rec["metrics"]["log10_ratio"] = old + 3 * tol
    rec["ci"] = {"log10_ratio": [old - 0.4, old + 0.6]}             # overlapping uncertainty
    assert _gate(results, base).regressions == []
    rec["ci"] = {"log10_ratio": [old + 2 * tol, old + 4 * tol]}       # both values outside both CIs
    base["records"] = [{**r, "ci": {"log10_ratio": [old - tol, old + tol]}}
                       if r["claim"] == "J" and r["level"] == "model" and r["model"] == VIT else r
                       for r in base["records"]]
    assert [c.what for c in _gate(results, base).regressions] == ["log10_ratio"]
    del rec["ci"]                                   # one side without a CI: the tolerance alone
    assert [c.what for c in _gate(results, base).regressions] == ["log10_ratio"]


# ----------------------------------------------------------------------- not comparable: 4
def test_another_architecture_is_refused_naming_it(results):
    base = baseline.make_baseline(results)
    cand = _candidate(results)
    cand["models"]["checkpoint-run-0042"]["arch"] = "deit_tiny_patch16_224"
    with pytest.raises(baseline.BaselineMismatch, match="no model of architecture deit_tiny"):
        _gate(cand, base)
    cand = _candidate(results)
    cand["models"]["checkpoint-run-0042"]["n_heads"] = 6
    with pytest.raises(baseline.BaselineMismatch, match="architecture differs: n_heads"):
        _gate(cand, base)


@pytest.mark.parametrize("edit, match", [
    (lambda r: r["options"].update(seed=1), "the option seed differs"),
    (lambda r: r["thresholds"]["claim_v"]["supported"]["optimal_cosine"].update(value=0.8),
     "thresholds differ: claim_v.supported.optimal_cosine.value"),
    (lambda r: r["models"][VIT]["input_set"].update(hash="sha256:other"),
     "input set differs: input set hash"),
    (lambda r: r.update(records=[x for x in r["records"] if x["claim"] != "E"]),
     "claim set differs"),
    (lambda r: r.update(records=[x for x in r["records"] if x.get("head") != 1]),
     "selection differs"),
])
def test_runs_that_differ_in_more_than_the_checkpoint_are_refused(results, edit, match):
    base = baseline.make_baseline(results)
    edit(results)
    with pytest.raises(baseline.BaselineMismatch, match=match):
        _gate(results, base)


def test_threshold_sources_may_change_without_refusal(results):
    base = baseline.make_baseline(results)
    results["thresholds"]["claim_v"]["supported"]["optimal_cosine"]["source"] = "reworded"
    assert _gate(results, base).regressions == []


def test_several_models_of_one_architecture_need_baseline_model(results):
    twin = _candidate(results, new_key="checkpoint-run-0031")
    twin["models"][VIT] = results["models"][VIT]
    twin["records"] += [r for r in results["records"] if r["model"] == VIT]
    base = baseline.make_baseline(twin)
    cand = _candidate(results)
    with pytest.raises(baseline.BaselineMismatch, match="several models.*--baseline-model"):
        _gate(cand, base)
    out = _gate(cand, base, chosen=baseline_matching.parse_baseline_model("checkpoint-run-0031"))
    assert {p["candidate"]: p["baseline"] for p in out.pairs}["checkpoint-run-0042"] == \
        "checkpoint-run-0031"
    pairs = baseline_matching.parse_baseline_model("checkpoint-run-0042=" + VIT)
    assert {p["candidate"]: p["baseline"] for p in _gate(cand, base, chosen=pairs).pairs}[
        "checkpoint-run-0042"] == VIT
    with pytest.raises(baseline.BaselineMismatch, match="--baseline-model nope: .*no such model"):
        _gate(cand, base, chosen=baseline_matching.parse_baseline_model("nope"))


# --------------------------------------------------------------------- same-checkpoint mode
def test_same_checkpoint_mode_requires_the_hash(results):
    base = baseline.make_baseline(results)
    with pytest.raises(baseline.BaselineMismatch, match="same-checkpoint: the checkpoint hash"):
        _gate(_candidate(results, new_key=VIT), base, "same-checkpoint")


def test_same_checkpoint_mode_tolerates_round_off_only(results):
    base = baseline.make_baseline(results)
    rec = _first(results, "V", "head")
    rec["metrics"]["optimal_cosine"] += 1e-9                        # round-off
    rec["metrics"]["linear_cka"] += 0.05                            # toward support: one-sided
    assert _gate(results, base, "same-checkpoint").regressions == []
    rec["metrics"]["optimal_cosine"] -= 0.01                        # fine for a new checkpoint,
    assert _gate(results, base).regressions == []                   # not for the same one
    out = _gate(results, base, "same-checkpoint")
    assert len(out.regressions) == 1 and "optimal_cosine" in str(out.regressions[0])


def test_missing_or_old_baseline_file_is_a_clear_error(tmp_path):
    with pytest.raises(baseline.BaselineMismatch, match="does not exist.*--update-baseline"):
        baseline.load_baseline(tmp_path / "nope.json")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": "kpca-claims/baseline/1"}))
    with pytest.raises(baseline.BaselineMismatch, match="regenerate it with --update-baseline"):
        baseline.load_baseline(old)


# ----------------------------------------------------------------------------- policy gate
def test_require_parses_and_judges_model_level_verdicts(results):
    rules = require_gate.parse_require("V>=inconclusive, J=supported")
    assert rules == [("V", ">=", "inconclusive"), ("J", "=", "supported")]
    levels = {(r["model"], r["claim"]): r["verdict"] for r in results["records"]
              if r["level"] == "model"}
    expected = {f"claim J {m} model" for (m, c), v in levels.items()
                if c == "J" and v != "supported"}
    expected |= {f"claim V {m} model" for (m, c), v in levels.items()
                 if c == "V" and v == "refuted"}
    assert expected and {c.record for c in require_gate.check_require(results, rules)} == expected
    assert require_gate.check_require(results,
                                      require_gate.parse_require("V>=refuted,J>=refuted")) == []
    with pytest.raises(baseline.BaselineMismatch, match="no model-level verdict of claim E"):
        require_gate.check_require({**results, "records": [r for r in results["records"]
                                                           if r["claim"] != "E"]},
                                   require_gate.parse_require("E=supported"))


@pytest.mark.parametrize("text, match", [
    ("V>=great", "'great' is not a verdict"), ("X=supported", "'X' is not a claim"),
    ("V supported", "no >= or ="), (",", "names no claim")])
def test_require_bad_syntax_is_one_sentence(text, match):
    with pytest.raises(require_gate.RequireError, match=match):
        require_gate.parse_require(text)


# ----------------------------------------------------------------------- tolerances, report
def test_candidate_tolerances_have_sources_and_exceed_round_off():
    data = tomllib.loads((ROOT / "claims" / "thresholds.toml").read_text())
    strict, loose = data["baseline"], data["baseline_candidate"]
    assert "ours" in loose["source"] and "CI" in loose["source"]
    assert set(loose["metrics"]) == set(strict["metrics"])
    for metric, rule in loose["metrics"].items():
        assert rule["source"].startswith("ours") and rule["regression"] in ("increase", "decrease")
        assert rule["regression"] == strict["metrics"][metric]["regression"]
        assert rule.get("abs", loose["abs"]) + rule.get("rel", loose["rel"]) > \
            50 * (strict["abs"] + strict["rel"])


def test_report_lists_what_changed(results):
    base = baseline.make_baseline(results)
    cand = _candidate(results)
    _first(cand, "V", "head", "checkpoint-run-0042")["metrics"]["optimal_cosine"] -= 0.3
    gate = _gate(cand, base, path="/ci/b.json").to_json()
    gate["summary"] = f"1 regressions against baseline {gate['baseline']} (candidate)"
    html = render_report({**cand, "gate": gate})
    assert 'id="gate"' in html and "1 regressions against baseline b.json" in html
    assert "/ci/" not in html
    assert "optimal_cosine" in html and "regression" in html and "0.02" in html
    assert 'id="gate"' not in render_report(results)
    error = render_report({**cand, "gate": {"error": "baseline /ci/b.json: the option seed differs",
                                            "baseline": "/ci/b.json"}})
    assert "baseline b.json: the option seed differs" in error and "/ci/" not in error


# ----------------------------------------------------------------- real runs on a tiny ViT
def _save(state, path):
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))


def _args(ckpt, tmp, *extra, arch="vit_tiny_patch16_224"):
    return [str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            "--checkpoint", str(ckpt), "--arch", arch, "--layers", "0", "--heads", "0,1",
            "--n-samples", "4", "--cache-dir", str(tmp / "cache"),
            # the gate compares whatever verdicts a rule set gives; these cases were built on P2's
            "--rules", "p2",
            # one thread, as an xdist worker's: a serial run's default (all cores) spin-waits
            # beside the other test worker on 2 cores; the gate does not depend on it
            "--threads", "1", *extra]


@pytest.fixture(scope="module")
def gate_env(tmp_path_factory):
    """Accepted checkpoint A (old/run-0031), its baseline, and candidate B = A + 1e-4 noise on
    the qkv weights (new/run-0042): the usual case of a checkpoint that changes between runs."""
    import torch

    import fixtures  # noqa: F401  (torchvision shim before timm)
    import timm

    tmp = tmp_path_factory.mktemp("gate")
    torch.manual_seed(0)
    state = timm.create_model("vit_tiny_patch16_224").state_dict()
    a, b = tmp / "old" / "run-0031.safetensors", tmp / "new" / "run-0042.safetensors"
    _save(state, a)
    g = torch.Generator().manual_seed(1)
    _save({k: v + 1e-4 * torch.randn(v.shape, generator=g) if "qkv.weight" in k else v
           for k, v in state.items()}, b)
    # C: layer 0's value projection ×3, so ||h||^2 ×9 and claim J's log10 ratio rises by 0.95
    c = tmp / "new" / "run-0099.safetensors"
    dim = state["blocks.0.attn.qkv.weight"].shape[1]
    scaled = dict(state)
    for name in ("blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias"):
        t = scaled[name].clone()
        t[2 * dim:] *= 3.0
        scaled[name] = t
    _save(scaled, c)
    base = tmp / "baseline.json"
    run = subprocess.run([sys.executable, "-m", "pytest", *_args(a, tmp, "--baseline", str(base),
                                                                "--update-baseline", "--out",
                                                                str(tmp / "a"))],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and base.exists(), run.stdout[-2000:] + run.stderr[-2000:]
    return {"tmp": tmp, "a": a, "b": b, "c": c, "base": base}


def _run(pytester, env, ckpt, *extra, **kw):
    return pytester.runpytest_subprocess(*_args(ckpt, env["tmp"], *extra, **kw), timeout=600)


def _edited_baseline(env, name, edit):
    data = json.loads(env["base"].read_text())
    edit(data)
    path = env["tmp"] / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow
def test_candidate_with_small_noise_and_another_file_name_passes(pytester, gate_env):
    out = gate_env["tmp"] / "b"
    res = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
               "--out", str(out), "--junitxml", str(out / "junit.xml"))
    text = res.stdout.str()
    assert res.ret == 0, text[-3000:]
    assert "no regression against baseline" in text
    assert "gate: checkpoint-run-0042 (" in text and "vs baseline checkpoint-run-0031 (" in text
    assert "new checkpoint" in text
    assert text.index("gate: no regression") < text.index("results: ")  # the table before the paths
    data = json.loads((out / "results.json").read_text())
    assert data["exit_status"] == 0 and data["gate"]["compared"] == 8
    assert data["gate"]["pairs"][0]["baseline_hash"] != data["gate"]["pairs"][0]["candidate_hash"]
    assert 'id="gate"' in (out / "report.html").read_text()
    assert 'name="kpca_gate" value="no regression against baseline' in \
        (out / "junit.xml").read_text()


@pytest.mark.slow
def test_candidate_that_lost_a_property_fails_naming_head_and_metric(pytester, gate_env):
    def accepted_was_better(data):  # A, as accepted, had head L00 H1 supported with a high cosine
        rec = next(r for r in data["records"]
                   if r["claim"] == "V" and r["level"] == "head" and r["head"] == 1)
        rec["verdict"] = "supported"
        rec["metrics"]["optimal_cosine"] += 0.3
        if "optimal_cosine" in rec.get("ci", {}):  # its interval moved with it (method §10)
            rec["ci"]["optimal_cosine"] = [x + 0.3 for x in rec["ci"]["optimal_cosine"]]

    base = _edited_baseline(gate_env, "better.json", accepted_was_better)
    res = _run(pytester, gate_env, gate_env["b"], "--baseline", str(base),
               "--out", str(gate_env["tmp"] / "c"))
    text = res.stdout.str()
    assert res.ret == 6, text[-3000:]
    assert "REGRESSION claim V checkpoint-run-0042 head L00 H1: verdict supported -> inconclusive" \
        in text
    assert "REGRESSION claim V checkpoint-run-0042 head L00 H1: optimal_cosine" in text
    assert "gate: 2 regressions against baseline" in text


@pytest.mark.slow
def test_candidate_with_scaled_values_fails_on_claim_j_ratio(pytester, gate_env):
    res = _run(pytester, gate_env, gate_env["c"], "--baseline", str(gate_env["base"]),
               "--out", str(gate_env["tmp"] / "c2"))
    text = res.stdout.str()
    assert res.ret == 6, text[-3000:]
    for rec in ("layer L00", "model"):
        line = next(x for x in text.splitlines()
                    if x.startswith(f"REGRESSION claim J checkpoint-run-0099 {rec}: log10_ratio"))
        delta = float(line.split("(change ")[1].split(",")[0])
        assert delta == pytest.approx(2 * math.log10(3), abs=1e-3)  # printed to 3 digits
    moved = {x.split(": ")[1].split()[0] for x in text.splitlines() if x.startswith("REGRESSION")}
    assert moved <= {"log10_ratio", "relative_frobenius"}  # cosine, CKA, gamma: scale-free, held


@pytest.mark.slow
def test_candidate_that_improved_passes_and_lists_it(pytester, gate_env):
    def accepted_was_worse(data):
        rec = next(r for r in data["records"] if r["claim"] == "V" and r["level"] == "model")
        rec["verdict"] = "refuted"
        ci = rec.get("ci", {}).get("linear_cka")
        shift = 0.1 + (ci[1] - ci[0] if ci else 0.0)  # beyond the tolerance and both intervals
        # a CKA stays in [0, 1] (the schema refuses a baseline outside it): the accepted value
        # is lowered towards 0, never below
        rec["metrics"]["linear_cka"] = max(rec["metrics"]["linear_cka"] - shift, 0.0)
        if ci:
            rec["ci"]["linear_cka"] = [max(x - shift, 0.0) for x in ci]

    base = _edited_baseline(gate_env, "worse.json", accepted_was_worse)
    res = _run(pytester, gate_env, gate_env["b"], "--baseline", str(base),
               "--out", str(gate_env["tmp"] / "d"))
    text = res.stdout.str()
    assert res.ret == 0, text[-3000:]
    assert "improvement claim V checkpoint-run-0042 model: verdict refuted -> inconclusive" in text
    assert "improvement claim V checkpoint-run-0042 model: linear_cka" in text
    assert "gate: no regression against baseline" in text and "2 improvements" in text


@pytest.mark.slow
def test_same_checkpoint_mode_passes_on_a_and_refuses_b(pytester, gate_env):
    # under -n 2: the start-up checks of the controller let a fitting baseline through
    same = _run(pytester, gate_env, gate_env["a"], "--baseline", str(gate_env["base"]),
                "--gate", "same-checkpoint", "--out", str(gate_env["tmp"] / "e"), "-n", "2")
    assert same.ret == 0, same.stdout.str()[-3000:]
    assert "same checkpoint" in same.stdout.str()
    other = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
                 "--gate", "same-checkpoint", "--out", str(gate_env["tmp"] / "f"))
    assert other.ret == 4 and "same-checkpoint: the checkpoint hash" in other.stderr.str()


def _nothing_ran(res, out: Path, cache: Path) -> None:
    """No claim test ran: none reported, no model was captured (every claim test needs its
    model's capture, and the run's own cache folder holds none), no results.json."""
    text = res.stdout.str()
    assert not any(word in text for word in (" PASSED", " FAILED", "passed", "failed", "refuted",
                                             "ready in")), text[-2000:]
    assert not (cache / "capture").exists() and not (out / "results.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_same_checkpoint_gate_refuses_other_weights_before_any_test(pytester, gate_env, workers):
    """--gate same-checkpoint with the weights of B against A's baseline: the weight hash is
    known once B is loaded, so the controller loads it at start-up and refuses (exit 4, one
    sentence naming both hashes and the remedy) before any claim test, serially and under -n 2."""
    from safetensors.torch import load_file

    from fixtures.models.checkpoints import state_dict_hash

    name = "xdist" if workers else "serial"
    out, cache = gate_env["tmp"] / f"same-{name}", gate_env["tmp"] / f"same-{name}-cache"
    res = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
               "--gate", "same-checkpoint", "--out", str(out), "--cache-dir", str(cache), *workers)
    err = [line for line in res.stderr.str().splitlines() if line.strip()]
    assert res.ret == 4, res.stdout.str()[-3000:] + res.stderr.str()[-2000:]
    hash_a = json.loads(gate_env["base"].read_text())["identity"]["models"][
        "checkpoint-run-0031"]["checkpoint_hash"]
    hash_b = state_dict_hash(load_file(str(gate_env["b"])))  # the file's tensors: another route
    assert err == [f"ERROR: baseline {gate_env['base']}: --gate same-checkpoint: the checkpoint "
                   f"hash of checkpoint-run-0042 (file run-0042.safetensors) is {hash_b}, the "
                   f"baseline's (checkpoint-run-0031) {hash_a}: use the default --gate candidate "
                   "to gate a new checkpoint, or regenerate the baseline with --update-baseline"]
    assert hash_a != hash_b
    _nothing_ran(res, out, cache)


@pytest.mark.slow
def test_another_arch_and_bad_options_stop_before_any_model_runs(pytester, gate_env):
    arch = _run(pytester, gate_env, gate_env["a"], "--baseline", str(gate_env["base"]),
                arch="deit_tiny_patch16_224")
    assert arch.ret == 4
    assert "holds no model of architecture deit_tiny_patch16_224" in arch.stderr.str()
    seed = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
                "--seed", "3")
    assert seed.ret == 4 and "the option seed differs" in seed.stderr.str()
    pick = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
                "--baseline-model", "checkpoint-nope")
    assert pick.ret == 4 and "--baseline-model checkpoint-nope: the baseline has no such model" \
        in pick.stderr.str()
    bad = _run(pytester, gate_env, gate_env["b"], "--require", "V>=great")
    assert bad.ret == 4 and "'great' is not a verdict" in bad.stderr.str()
    refused = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
                   "--update-baseline", "-n", "2")
    assert refused.ret == 4 and "serially" in refused.stderr.str()


@pytest.mark.slow
def test_require_fails_when_a_model_verdict_is_below_its_floor(pytester, gate_env):
    res = _run(pytester, gate_env, gate_env["b"], "--require", "V>=inconclusive,J=supported",
               "--out", str(gate_env["tmp"] / "g"))
    text = res.stdout.str()
    assert res.ret == 6, text[-3000:]
    assert "REGRESSION claim J checkpoint-run-0042 model: verdict required =supported -> refuted" \
        in text
    assert "REGRESSION claim V" not in text                         # V is inconclusive: enough


@pytest.mark.slow
def test_the_startup_weight_hash_of_a_checkpoint_is_the_one_its_run_recorded(gate_env):
    from fixtures.engine import weight_identity as identity
    from fixtures.models import loading as models

    spec = models.spec_for_checkpoint(gate_env["a"], "vit_tiny_patch16_224")
    got = identity.weight_identity(spec, gate_env["tmp"] / "cache")
    recorded = json.loads(gate_env["base"].read_text())["identity"]["models"][
        "checkpoint-run-0031"]["checkpoint_hash"]  # written by A's run, after loading A
    assert (got.hash, got.origin) == (recorded, "file run-0031.safetensors")


REFERENCE = ROOT / "reference" / "results.json"


@pytest.mark.parametrize("key", ["all-MiniLM-L6-v2", "control-vit_tiny_patch16_224"])
def test_the_startup_weight_hash_is_the_one_the_reference_run_recorded(key, tmp_path):
    """A package model and a seeded random control: the hash computed at start-up is the one
    the reference run (reference/results.json) recorded after its loads; the random state of
    the caller is untouched, and another seed is another identity."""
    import dataclasses

    import torch

    from fixtures.engine import weight_identity as identity

    from fixtures.models import catalogue as registry

    spec = registry.REGISTRY[key]
    state = torch.random.get_rng_state()
    got = identity.weight_identity(spec, tmp_path)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert got.hash == json.loads(REFERENCE.read_text())["models"][key]["checkpoint_hash"]
    if spec.source == "random":
        assert got.origin == f"{spec.arch} initialised with seed {spec.seed}"
        other = identity.weight_identity(dataclasses.replace(spec, seed=spec.seed + 1), tmp_path)
        assert other.hash is not None and other.hash != got.hash


def test_the_startup_weight_hash_of_a_trained_model_is_known_once_it_is_trained(tmp_path,
                                                                                monkeypatch):
    """A model of ours: no identity before its training (the gate checks after the run), then
    the hash of the last checkpoint of its series in the cache, the weights the run loads."""
    from fixtures.engine import weight_identity as identity, claim_session as session
    from fixtures.models import catalogue as registry
    from fixtures import training
    from fixtures.models.checkpoints import state_dict_hash

    config = training.TrainConfig(variant="softmax", epochs=1, batch_size=64, depth=1,
                                  embed_dim=48, num_heads=6, img_size=16, patch_size=4,
                                  mlp_ratio=2.0, lr=3e-3, warmup_epochs=0.5, threads=1,
                                  numerics="native")  # about a second to train
    monkeypatch.setattr(session, "trained_config", lambda spec: config)
    spec = registry.REGISTRY["tiny-vit-digits-softmax"]
    before = identity.weight_identity(spec, tmp_path)
    assert before.hash is None and "is not trained in the cache" in before.reason
    series = training.train_series(config, tmp_path / "trained" / config.config_hash())
    after = identity.weight_identity(spec, tmp_path)
    assert after.hash == state_dict_hash(series.load(len(series.checkpoints) - 1).state_dict())
    assert after.hash != state_dict_hash(series.load(0).state_dict())  # trained, not initial


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_baseline_of_another_selection_or_claim_set_stops_before_any_test(pytester, gate_env,
                                                                            workers):
    """The baseline holds heads 0,1 of layer 0; a run of head 0 only, or of claim V only, is not
    comparable: refused at start-up (no test runs, no results.json), not after the run; under
    -n 2 by the controller, on the positions its first worker collected, before it schedules
    any test. (The claim set under -n 2 is not run again: the controller makes the one check
    (startup_checks.check_collected → check_baseline) that the head run shows it reach, on
    positions after -k, which the -n 2 run of the next test shows (its -k leaves --require
    nothing); the claim-set sentence is the serial run's.)"""
    name = "xdist" if workers else "serial"
    out, cache = gate_env["tmp"] / f"sel-{name}", gate_env["tmp"] / f"sel-{name}-cache"
    heads = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
                 "--heads", "0", "--out", str(out), "--cache-dir", str(cache), *workers)
    err = heads.stderr.str()
    assert heads.ret == 4, heads.stdout.str()[-3000:] + err[-2000:]
    assert "the selection differs: the baseline holds claims E, J, V, layers 0, heads 0,1" in err
    assert "this run would write claims E, J, V, layers 0, heads 0" in err
    assert "use the --layers/--heads of the baseline run" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    _nothing_ran(heads, out, cache)
    if workers:
        return
    claims = _run(pytester, gate_env, gate_env["b"], "--baseline", str(gate_env["base"]),
                  "-k", "value_vectors", "--out", str(out), "--cache-dir", str(cache))
    assert claims.ret == 4 and "the claim set differs" in claims.stderr.str()
    _nothing_ran(claims, out, cache)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_require_clause_that_selects_nothing_is_a_usage_error(pytester, gate_env, workers):
    name = "xdist" if workers else "serial"
    out, cache = gate_env["tmp"] / f"req-{name}", gate_env["tmp"] / f"req-{name}-cache"
    if not workers:  # a syntax error: pytest_configure, before any worker exists
        empty = _run(pytester, gate_env, gate_env["b"], "--require", "", "--out", str(out))
        assert empty.ret == 4 and "--require '' names no claim" in empty.stderr.str()
    none = _run(pytester, gate_env, gate_env["b"], "--require", "V>=inconclusive",
                "-k", "gram_spectrum", "--out", str(out), "--cache-dir", str(cache), *workers)
    assert none.ret == 4, none.stdout.str()[-2000:]
    assert ("--require 'V>=inconclusive': the clause V>=inconclusive selects nothing: no "
            "model-level test of claim V is collected") in none.stderr.str()
    _nothing_ran(none, out, cache)


@pytest.mark.slow
@pytest.mark.parametrize("text, fragment", [
    ("[1, 2]", "holds a JSON list ([1, 2]), not an object"),
    ('{"schema": "kpca-claims/baseline/2", "x": 1e999}', "holds the number 1e999"),
    ('{"schema": "kpca-claims/baseline/2", "x": ' + "7" * 401 + "}", "a 401-digit integer"),
    (None, "].metrics.optimal_cosine is 1e+300, outside its range (it must be in [-1, 1])"),
], ids=["json-list", "1e999", "401-digits", "cosine-1e300"])
def test_a_baseline_of_the_wrong_type_or_range_stops_at_startup(pytester, gate_env, text, fragment):
    """Valid JSON of the wrong type, numbers beyond float64 or out of a metric's range: one
    sentence and exit 4 before any test (before: INTERNALERROR, a traceback after the run with
    no results.json, or 'no regression' for a cosine of 1e300)."""
    path = gate_env["tmp"] / "typed.json"
    if text is None:
        data = json.loads(gate_env["base"].read_text())
        next(r for r in data["records"] if "optimal_cosine" in r["metrics"])["metrics"][
            "optimal_cosine"] = 1e300
        text = json.dumps(data)
    path.write_text(text)
    out = gate_env["tmp"] / "typed"
    res = _run(pytester, gate_env, gate_env["b"], "--baseline", str(path), "--out", str(out))
    err = [line for line in res.stderr.str().splitlines() if line.strip()]
    assert res.ret == 4, res.stdout.str()[-2000:] + res.stderr.str()[-2000:]
    assert len(err) == 1 and err[0].startswith("ERROR: --baseline: ") and fragment in err[0], err
    assert "Traceback" not in res.stdout.str() + res.stderr.str()
    assert not (out / "results.json").exists()
