"""The CI gate: baseline pass, verdict change, tolerance breach, wrong checkpoint, and a real
--update-baseline / --baseline cycle through `pytest claims/`."""

import copy
import json
from pathlib import Path

import pytest

from claims.verdicts import load_thresholds
from report import baseline

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"
pytest_plugins = ["pytester"]


@pytest.fixture
def results():
    return json.loads(EXAMPLE.read_text())


def _first(results, claim, level):
    return next(r for r in results["records"] if r["claim"] == claim and r["level"] == level)


def test_same_results_pass(results):
    assert baseline.compare(results, baseline.make_baseline(results),
                            load_thresholds()["baseline"]) == []


def test_round_off_is_tolerated_and_support_ward_moves_are_not_regressions(results):
    base = baseline.make_baseline(results)
    rec = _first(results, "V", "head")
    rec["metrics"]["optimal_cosine"] += 1e-9                # round-off
    rec["metrics"]["linear_cka"] += 0.05                    # toward support: one-sided rule
    assert baseline.compare(results, base, load_thresholds()["baseline"]) == []


def test_verdict_change_is_a_regression(results):
    base = baseline.make_baseline(results)
    rec = _first(results, "V", "head")
    old = rec["verdict"]
    rec["verdict"] = "supported" if old != "supported" else "refuted"
    out = baseline.compare(results, base, load_thresholds()["baseline"])
    assert len(out) == 1 and f"verdict changed from {old}" in str(out[0])


def test_tolerance_breach_names_metric_and_tolerance(results):
    base = baseline.make_baseline(results)
    _first(results, "V", "head")["metrics"]["optimal_cosine"] -= 0.01
    out = baseline.compare(results, base, load_thresholds()["baseline"])
    assert len(out) == 1
    assert "optimal_cosine moved" in str(out[0]) and "tolerance" in str(out[0])


def test_baseline_of_another_checkpoint_is_a_clear_error(results):
    base = baseline.make_baseline(results)
    other = copy.deepcopy(results)
    key = next(iter(other["models"]))
    other["models"][key]["checkpoint_hash"] = "0" * 64
    with pytest.raises(baseline.BaselineMismatch, match=f"different checkpoint hash of {key}"):
        baseline.compare(other, base, load_thresholds()["baseline"])


def test_missing_baseline_file_is_a_clear_error(tmp_path):
    with pytest.raises(baseline.BaselineMismatch, match="does not exist.*--update-baseline"):
        baseline.load_baseline(tmp_path / "nope.json")


@pytest.mark.slow
def test_update_then_gate_through_pytest(pytester, tmp_path):
    import torch
    from safetensors.torch import save_file

    import fixtures  # noqa: F401
    import timm

    torch.manual_seed(0)
    ckpt = tmp_path / "gate.safetensors"
    save_file({k: v.contiguous() for k, v in
               timm.create_model("vit_tiny_patch16_224").state_dict().items()}, str(ckpt))
    base = tmp_path / "baseline.json"
    common = [str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
              "--checkpoint", str(ckpt), "--arch", "vit_tiny_patch16_224", "--layers", "0",
              "--heads", "0", "--n-samples", "2", "-k", "value_vectors",
              "--cache-dir", str(tmp_path / "cache"), "--baseline", str(base)]
    first = pytester.runpytest_subprocess(*common, "--update-baseline", "--out",
                                          str(tmp_path / "a"), timeout=300)
    assert first.ret == 0 and base.exists(), first.stdout.str()[-2000:]
    gate = pytester.runpytest_subprocess(*common, "--out", str(tmp_path / "b"), timeout=300)
    assert gate.ret == 0, gate.stdout.str()[-2000:]
    assert "no regression against baseline" in gate.stdout.str()
    # Tamper with one stored metric: the same run now regresses, and says where.
    data = json.loads(base.read_text())
    key = next(k for k in data["records"] if "H0" in k)
    data["records"][key]["metrics"]["optimal_cosine"] += 0.2
    base.write_text(json.dumps(data))
    bad = pytester.runpytest_subprocess(*common, "--out", str(tmp_path / "c"), timeout=300)
    assert bad.ret == 6
    assert "REGRESSION" in bad.stdout.str() and "optimal_cosine moved" in bad.stdout.str()
    # --update-baseline refuses to run under xdist.
    refused = pytester.runpytest_subprocess(*common, "--update-baseline", "-n", "2", timeout=300)
    assert refused.ret == 4 and "serially" in refused.stderr.str()
