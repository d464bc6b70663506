"""Values checked by type, not by form: ini keys parsed exactly as their command-line twins,
results/baseline/shard files validated against docs/results.schema.json (finite numbers, ranges)
before they are used, gate expressions that select nothing refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.plugin import ini

ROOT = Path(__file__).resolve().parent.parent
MODEL = "control-vit_tiny_patch16_224"


@pytest.fixture
def flags(pytestconfig) -> dict:
    """The switches of the kpca-claims option group, as this pytest defines them (the root
    conftest loads the plugin)."""
    group = pytestconfig._parser.getgroup(ini.GROUP).options  # the options' definitions
    return {o.dest: o for o in group if ini.flag_value(o) is not None}


def test_every_switch_is_known_as_a_switch(flags):
    """pytest 9 gives no ``action`` key: the switches are found by what their action does."""
    assert set(flags) == {"gpu", "standardize", "update_baseline", "save_samples", "multiverse",
                          "training_dynamics"}


@pytest.mark.parametrize("raw, value", [("true", True), ("TRUE", True), ("1", True), ("yes", True),
                                        ("false", False), ("False", False), ("0", False),
                                        ("no", False), (" no ", False)])
def test_ini_switch_values_parse_like_the_command_line(flags, raw, value):
    for option in flags.values():
        assert ini._convert(option, raw) is value, (option.dest, raw)


@pytest.mark.parametrize("raw", ["", "on", "off", "maybe", "2", "falsy"])
def test_any_other_ini_switch_value_is_a_usage_error_naming_the_key(flags, raw):
    for dest, option in flags.items():
        with pytest.raises(pytest.UsageError, match=f"ini key kpca_{dest} = {raw!r}: "
                                                    r"--[a-z-]+ is a switch; write true or false"):
            ini._convert(option, raw)


def _collect(tmp_path: Path, *extra: str, **keys: str) -> subprocess.CompletedProcess:
    lines = ["[tool.pytest.ini_options]", f'kpca_models = "{MODEL}"', 'kpca_layers = "0"',
             'kpca_heads = "0"'] + [f'{k} = "{v}"' for k, v in keys.items()]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return subprocess.run([sys.executable, "-m", "pytest", "claims/", "-c",
                           str(tmp_path / "pyproject.toml"), "--rootdir", str(ROOT),
                           "--confcutdir", str(ROOT), "--collect-only", "-q", "-p",
                           "no:cacheprovider", "--out", str(tmp_path / "out"), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_false_in_the_ini_file_leaves_a_switch_off(tmp_path):
    """``kpca_gpu = "false"`` used to turn --gpu on ("--gpu was given" on a machine without
    CUDA); ``kpca_update_baseline = "false"`` used to overwrite the baseline."""
    run = _collect(tmp_path, kpca_gpu="false", kpca_update_baseline="false",
                   kpca_standardize="no", kpca_save_samples="0")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    run = _collect(tmp_path, kpca_gpu="on")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "ini key kpca_gpu = 'on': --gpu is a switch; write true or false" in run.stderr


# ------------------------------------------------------------------------------ report links
@pytest.mark.parametrize("url, ok", [
    ("https://forge.example/kpca/blob/main/docs/method.md", True), ("http://h/m.md", True),
    ("docs/method.md", True), ("../docs/method.md", True), ("#s11", True),
    ("javascript:alert(1)", False), ("JavaScript:alert(1)", False), (" javascript:x", False),
    ("java\tscript:x", False), ("data:text/html,x", False), ("file:///etc/passwd", False),
    ("//evil.example/m.md", False), ("https://", False), ("", False), ("vbscript:x", False)])
def test_report_links_are_http_or_relative_only(url, ok):
    from report.method_link import safe_link

    assert safe_link(url) is ok


def test_an_unsafe_method_url_never_becomes_a_link(monkeypatch):
    import json

    from report import method_link, render

    results = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    monkeypatch.setenv(method_link.METHOD_URL_ENV, "javascript:alert(document.cookie)")
    with pytest.warns(UserWarning, match="neither an http"):
        page = render.render_report(results)
    # refused: rendered without a path, the references stay text with their section numbers
    assert "javascript:" not in page.lower() and 'href="docs/method.md#s' not in page
    assert '<span class="method" title="section 2 of docs/method.md' in page
    with pytest.raises(ValueError, match="neither an http"):
        render.render_report(results, method_url="javascript:alert(1)")


# ------------------------------------------------------------------- a hub model out of reach
@pytest.mark.slow
def test_a_hub_model_that_cannot_be_downloaded_is_one_sentence_and_exit_4(tmp_path):
    """Offline, with an empty hub cache: exit 4 at load, one sentence naming the model, the
    repository, the revision and what to do; the run stops (before: exit 3, "this is a bug of
    kpca-claims", two tracebacks per test, 3,250 lines)."""
    import json
    import os

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "claims/", "-p", "no:cacheprovider",
                          "--models", "bert-base-uncased", "--layers", "0", "--heads", "0",
                          "--n-samples", "2", "--revision", "v9-nope", "--out",
                          str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    text = run.stdout + run.stderr
    assert run.returncode == 4, text[-3000:]
    assert "Traceback" not in text and "this is a bug" not in text and len(text.splitlines()) < 40
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("ERROR (exit 4")]
    assert ("model bert-base-uncased cannot be loaded from the Hugging Face hub (repository "
            "bert-base-uncased, revision v9-nope)") in line
    assert "huggingface-cli download bert-base-uncased --revision v9-nope" in line
    assert "HF_HUB_OFFLINE=1" in line and "6 claim tests did not run" in line
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["exit_status"] == 4 and results["complete"] is False
    assert [e["kind"] for e in results["errors"]] == ["usage"] and len(results["not_run"]) == 6


# ------------------------------------------------------------- too few samples for an interval
def test_one_sample_gives_no_interval_and_no_certain_verdict():
    import math

    import torch

    from checks.stats import percentile_interval
    from claims import verdicts

    draws = torch.full((1000, 3), 0.7, dtype=torch.float64)
    assert percentile_interval(draws, n=2).tolist() == [[0.7, 0.7]] * 3
    assert all(math.isnan(x) for row in percentile_interval(draws, n=1).tolist() for x in row)
    metrics = {"log10_ratio": 3.5, "bessel_share": 0.0}
    v, both = verdicts.judge_both("claim_j", metrics, {"log10_ratio": [math.nan, math.nan]},
                                  rules_name="ours")
    assert v.verdict == "undetermined" and both["p2"] != "undetermined"
    assert "no 95% interval of log10_ratio: a bootstrap interval needs at least 2 samples" in v.reason
    assert verdicts.format_ci(3.5, [math.nan, math.nan]) == "3.5 [no 95% interval]"


@pytest.mark.slow
def test_a_run_of_one_sample_records_undefined_intervals_with_a_word(tmp_path):
    """--n-samples 1 (before: every "95%" interval a point [x, x], and ours judged one sample as
    certain, without a word)."""
    import json
    import os

    from report import validate

    run = subprocess.run([sys.executable, "-m", "pytest", "claims/", "-p", "no:cacheprovider",
                          "--models", MODEL, "--layers", "0", "--heads", "0", "--n-samples", "1",
                          "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=600)
    # a control alone, every verdict undetermined: nothing judged, exit 9 (issue 45)
    assert run.returncode == 9, run.stdout[-3000:] + run.stderr[-2000:]
    assert "--n-samples 1: one sample gives no 95% interval" in run.stdout + run.stderr
    results = validate.load(tmp_path / "out" / "results.json", "results file", "results")
    assert {r["claim"] for r in results["records"]} == {"V", "J", "E"}
    for rec in results["records"]:
        assert rec["ci"] and all(b is None for b in rec["ci"].values()), rec["ci"]
        assert rec["verdicts"]["ours"] == "undetermined", rec
        assert "needs at least 2 usable samples" in rec["undefined"]["ci"]
    assert "[no 95% interval]" in run.stdout + json.dumps(results)


def test_python_m_report_refuses_a_results_file_outside_the_schema(tmp_path):
    """``python -m report`` on a results.json whose metric is a string: exit 2, one sentence."""
    import json

    data = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    data["records"][0]["metrics"]["optimal_cosine"] = "<script>alert(1)</script>"
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps(data))
    run = subprocess.run([sys.executable, "-m", "report", str(bad)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"python -m report: error: results file {bad} does not fit "
                           "docs/results.schema.json: records[0].metrics.optimal_cosine is ")
    assert not (tmp_path / "report.html").exists()
