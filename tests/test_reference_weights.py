"""A run whose models are not the shipped reference's says so while it runs: one terminal line
per such model, the same lines among the closing lines, ``models.<key>.reference_weights`` in
results.json, and a note at the top of the report (report/reference_weights.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fixtures  # noqa: F401  (torchvision shim before timm)
from report import reference_weights as rw

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]

REFERENCE = {"tiny-vit-digits-softmax": "55fb", "all-MiniLM-L6-v2": "001f"}


def _model(source: str, digest: str, **extra) -> dict:
    return {"source": source, "arch": extra.pop("arch", "a"), "checkpoint_hash": digest, **extra}


@pytest.mark.parametrize("key, model, status", [
    ("tiny-vit-digits-softmax", _model("trained", "55fb", training={"origin": "shipped"}),
     "reference"),
    ("tiny-vit-digits-softmax", _model("trained", "9999", training={
        "origin": "trained", "reference": "differs", "differing_steps": [45, 90]}), "other"),
    ("user-ckpt", _model("checkpoint", "aaaa", arch="vit_tiny_patch16_224"), "user"),
    ("hub-model", _model("hub", "bbbb", arch="org/model"), "user"),
    ("seed-model", _model("trained", "cccc", training={"origin": "trained"}), "trained"),
    ("random-vit_tiny_patch16_224", _model("random", "dddd"), "own"),
    ("all-MiniLM-L6-v2", _model("package", ""), "unknown"),
])
def test_each_kind_of_model_gets_its_status(key, model, status):
    got = rw.assess(key, model, REFERENCE)
    assert got["status"] == status and got["sentence"].startswith(f"{key}: ")
    said = rw.not_reference(rw.annotate({key: model}, REFERENCE))
    assert said == ([got["sentence"]] if status in rw.SAID else [])


def test_the_sentence_of_other_weights_names_both_hashes_the_origin_and_the_consequence():
    model = _model("trained", "9999aaaabbbbcccc", training={
        "origin": "trained", "reference": "differs", "differing_steps": [45, 90]})
    sentence = rw.assess("tiny-vit-digits-softmax", model, REFERENCE)["sentence"]
    assert "checkpoint hash 9999aaaabbbb… against 55fb…" in sentence
    assert "trained on this machine, not reproducing the shipped files at steps 45, 90" in sentence
    assert sentence.endswith("will say NOT COMPARABLE")


def test_no_readable_reference_compares_nothing(tmp_path):
    assert rw.reference_models(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert rw.reference_models(tmp_path / "bad.json") is None
    assert rw.assess("m", _model("checkpoint", "aa"), None)["status"] == "unknown"


def test_the_shipped_reference_holds_the_hash_of_every_default_model():
    models = rw.reference_models()
    assert models and all(isinstance(h, str) and len(h) == 64 for h in models.values())
    assert {"all-MiniLM-L6-v2", "tiny-vit-digits-softmax",
            "tiny-vit-digits-p1-standardized"} <= set(models)


@pytest.mark.slow
def test_a_user_checkpoint_run_says_so_while_it_runs_at_its_end_and_atop_its_report(
        pytester, tmp_path, tiny_checkpoint):
    """The whole path, as a user meets it: a ``--checkpoint`` run prints the line when the
    model's first record arrives and among the closing lines, writes ``reference_weights`` into
    results.json (valid against the schema) and shows the note at the top of the report."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    result = pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        "-p", "no:cacheprovider", "--checkpoint", str(tiny_checkpoint), "--arch",
        "vit_tiny_patch16_224", "--layers", "0", "--heads", "0", "--n-samples", "4",
        "-k", "test_value_vectors", "--out", str(out), "--cache-dir", str(cache), timeout=600)
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    results = json.loads((out / "results.json").read_text())
    (key, model), = results["models"].items()
    assert model["reference_weights"]["status"] == "user"
    sentence = model["reference_weights"]["sentence"]
    lines = result.stdout.lines
    assert f"kpca-claims weights: {sentence}" in lines  # while it ran
    closing = lines.index("kpca-claims weights that are not the shipped reference's "
                          "(docs/reproduce.md):")
    assert lines[closing + 1] == f"  {sentence}"
    assert closing < next(i for i, line in enumerate(lines) if line.startswith("results: "))
    html = (out / "report.html").read_text()
    assert html.index('id="reference-weights"') < html.index('id="summary"')
    assert f"{key}: not a model of the shipped reference" in html
