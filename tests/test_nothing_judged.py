"""An exit code that says whether anything was judged (issue 45, item 5): a run in which no claim
test reached a verdict exits 9, not 0; a control whose samples are too few to reach its
expected verdict is *underpowered* (``expected.outcome``), counted apart and never an instrument
failure (fixtures/models/controls.py :func:`underpowered`); docs/bad-inputs.md, section 8."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.models.controls import annotate, instrument_failed, is_underpowered
from fixtures.plugin.control_outcomes import expectation, ours_bars
from fixtures.plugin.state import EXIT_NOTHING_JUDGED, judged

ROOT = Path(__file__).resolve().parent.parent
NULL = "kpca-oracle-null"


def _j_layer(n: int, verdict: str, interval: list[float]) -> dict:
    """A claim-J model record of the null control (expected refuted: output_r2_excess <= 0.1;
    its layers are expected only "not supported", method §12.4)."""
    return {"claim": "J", "level": "model", "model": NULL, "layer": None, "head": None,
            "verdict": verdict, "verdicts": {"p2": "inconclusive", "ours": verdict},
            "ci": {"output_r2_excess": interval}, "options": {"n_samples_requested": n}}


def test_a_control_whose_interval_straddles_its_bar_at_few_samples_is_underpowered():
    """The miss the README's quick selection met (6 samples: the interval [0.021, 0.248] of the
    null control's output-fit excess contains its refuted bar 0.1): underpowered, not exit 8."""
    rec = annotate(_j_layer(6, "inconclusive", [0.021, 0.248]), NULL, ours_bars,
                   expect=expectation)
    assert is_underpowered(rec) and not instrument_failed(rec)
    assert rec["expected"]["outcome"] == "underpowered" and rec["expected"]["met"] is None
    assert "contains the bar <= 0.1" in rec["expected"]["underpowered"]


def test_a_control_miss_is_still_an_instrument_failure_when_its_samples_decide():
    """At the design sample count, with an interval wholly on the wrong side, or with the
    opposite verdict, a miss stays an instrument failure."""
    for rec in (_j_layer(100, "inconclusive", [0.15, 0.2]),  # the controls' design count
                _j_layer(6, "inconclusive", [0.15, 0.3]),  # wholly above the refuted bar
                _j_layer(6, "supported", [0.95, 0.99])):  # the opposite verdict
        out = annotate(rec, NULL, ours_bars, expect=expectation)
        assert instrument_failed(out) and out["expected"]["outcome"] == "instrument_failure", rec


def test_one_sample_makes_every_control_underpowered_by_its_missing_interval():
    rec = annotate(_j_layer(1, "undetermined", None), NULL, ours_bars, expect=expectation)
    assert is_underpowered(rec) and "no 95% interval" in rec["expected"]["underpowered"]


def test_a_run_judged_nothing_when_every_record_under_test_is_undetermined():
    under = {"claim": "V", "level": "head", "verdict": "undetermined"}
    weak = {**under, "verdict": "undetermined", "control": "positive",
            "expected": {"outcome": "underpowered", "met": None}}
    met = {**under, "verdict": "refuted", "control": "negative",
           "expected": {"outcome": "as_expected", "met": True}}
    assert not judged([under, under, met])  # the controls do not judge the models under test
    assert judged([under, {**under, "verdict": "inconclusive"}])
    assert not judged([weak])  # a run of controls, all underpowered
    assert judged([weak, met])
    assert EXIT_NOTHING_JUDGED == 9


def _claims(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "claims/", "-p", "no:cacheprovider",
                           "-n", "0", "--out", str(tmp_path / "out"),
                           "--cache-dir", str(tmp_path / "cache"), *args],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_one_sample_on_controls_exits_9_with_underpowered_controls_not_instrument_failures(
        tmp_path):
    """Before: exit 8 with one INSTRUMENT FAILURE line per control record (42 on the ladder)."""
    run = _claims(tmp_path, "--models", f"kpca-oracle,{NULL}", "--layers", "0", "--heads", "0",
                  "--n-samples", "1")
    text = run.stdout + run.stderr
    assert run.returncode == 9, text[-3000:]
    assert "INSTRUMENT FAILURE" not in text
    assert "NOTHING JUDGED (exit 9, not a verdict)" in text
    assert "underpowered controls (" in text
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["exit_status"] == 9 and results["complete"]
    assert not results.get("instrument_failures")
    outcomes = {r["expected"]["outcome"] for r in results["records"]}
    assert "underpowered" in outcomes and "instrument_failure" not in outcomes
    controls = results["summary"]["controls"]
    assert sum(role.get("underpowered", 0) for role in controls.values()) > 0


@pytest.mark.slow
def test_a_quick_look_at_six_samples_exits_0_or_1_and_names_its_underpowered_controls(tmp_path):
    """The README's quick look at 6 samples, on the control it missed: before, exit 8 (claim J
    of kpca-oracle-null L01 inconclusive: 'INSTRUMENT FAILURE'; that layer is now expected only
    "not supported", method §12.4); no miss is an instrument failure, each is named."""
    run = _claims(tmp_path, "--models", NULL, "--layers", "0,1", "--n-samples", "6")
    text = run.stdout + run.stderr
    assert run.returncode in (0, 1), text[-3000:]
    assert "INSTRUMENT FAILURE" not in text
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    weak = [r for r in results["records"] if r["expected"]["outcome"] == "underpowered"]
    missed = [r for r in results["records"] if r["expected"]["outcome"] == "instrument_failure"]
    assert not missed
    # every control that missed at 6 samples is named underpowered in the closing lines
    if weak:
        assert "underpowered controls (" in text and "kpca-oracle-null (" in text


@pytest.mark.slow
def test_one_rpc_seed_trains_and_exits_9_judging_nothing(tmp_path):
    """``--rpc-seeds 1``: claim R's intervals are over seeds, so one seed judges nothing (before:
    exit 0 after training)."""
    run = _claims(tmp_path, "-m", "rpc", "--rpc-seeds", "1", "--rpc-epochs", "1",
                  "--rpc-attack-samples", "10", "--rpc-pgd-steps", "1")
    text = run.stdout + run.stderr
    assert run.returncode == 9, text[-3000:]
    assert "NOTHING JUDGED (exit 9, not a verdict)" in text
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["records"] and {r["verdict"] for r in results["records"]} == {"undetermined"}
    assert results["exit_status"] == 9
