"""The shipped reference results, the README numbers generated from them, and the trained
models' shipped weights and their hashes (docs/reproduce.md, method §13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from report import reference

ROOT = Path(__file__).resolve().parent.parent


def _tiny_results() -> dict:
    recs = []
    for head, (p2, ours) in enumerate([("inconclusive", "refuted"), ("refuted", "refuted")]):
        recs.append({"claim": "V", "level": "head", "model": "m", "layer": 0, "head": head,
                     "test_id": f"test_value_vectors[m-L00-H{head}]", "verdict": ours,
                     "verdicts": {"p2": p2, "ours": ours}, "evidence": "text"})
    recs.append({"claim": "V", "level": "model", "model": "m", "test_id": "v_model[m]",
                 "verdict": "refuted", "verdicts": {"p2": "inconclusive", "ours": "refuted"},
                 "metrics": {"optimal_cosine": 0.2744, "subspace_overlap_excess": 0.103},
                 "ci": {"optimal_cosine": [0.273, 0.2751], "subspace_overlap_excess": [0.0986, 0.107]},
                 "null": {"optimal_cosine": 0.35}})
    recs.append({"claim": "J", "level": "model", "model": "m", "test_id": "j_model[m]",
                 "verdict": "refuted", "verdicts": {"p2": "inconclusive", "ours": "refuted"},
                 "metrics": {"log10_ratio": -29.9, "output_r2_excess": 0.04},
                 "ci": {"log10_ratio": [-30.4, -23.5], "output_r2_excess": [0.01, 0.07]},
                 "output_fit": {"output_r2_null": 0.9632},
                 "tokens": {"median_log10_ratio": 4.47, "p2_appendix_log10_ratio": 4.62}})
    recs.append({"claim": "J", "level": "series", "model": "t", "test_id": "trend[t]",
                 "verdict": "refuted", "verdicts": {"p2": "refuted", "ours": "refuted"},
                 "metrics": {"min_j_proj": -1.5, "spearman_j": 0.95},
                 "series": [{"checkpoint": "/c/trained/x/step_000360.safetensors",
                             "test_accuracy": 0.9138}]})
    recs.append({"claim": "R", "level": "head", "model": "t", "test_id": "r[t]",
                 "verdict": "supported", "verdicts": {"p2": "supported", "ours": "supported"}})
    return {"provenance": {"git_commit": "0123456789abcdef", "date": "2026-11-24T09:00:00",
                           "versions": {"torch": "2.13.0+cpu"}, "workers": 2,
                           "numeric_environment": {"cpu": {"model": "AMD EPYC"},
                                                   "torch_cpu_capability": "AVX2",
                                                   "blas": {"torch": {"blas": "mkl",
                                                                      "mkl_version": "2024.2"}}}},
            "options": {"rules": "ours"}, "models": {"m": {}, "t": {}}, "records": recs,
            "exit_status": 1, "complete": True, "durations": {"x": 1.0}}


def test_readme_block_is_made_from_the_records():
    block = reference.readme_block(_tiny_results())
    assert "commit `0123456789ab`, 2026-11-24, AMD EPYC, torch 2.13.0+cpu (AVX2 kernels, BLAS mkl 2024.2)" in block
    assert "6 claim tests: 1 supported (passed), 5 refuted, 0 inconclusive" in block
    assert ("| m | 1 refuted, 1 inconclusive → **2 refuted** | inconclusive → **refuted**: overlap "
            "excess 0.103 [0.0986, 0.107]; optimal cosine 0.274 (null 0.35) |") in block
    # claim J in robust numbers: the fit's excess with its interval, the per-token medians, and
    # no interval on the pooled ratio of means (issue: a handful of tokens carry it)
    assert ("**refuted**: fit excess 0.04 [0.01, 0.07] (null R² 0.9632); per-token median log10 "
            "ratio 4.47, trimmed 4.62") in block
    assert "−29.9" not in block and "−30.4" not in block
    assert "| t (test acc. 0.914) |" in block
    assert "refuted → **refuted**: min J_proj −1.5, ρ 0.95; fit-excess ρ undefined" in block
    assert block.rstrip().endswith("| R: 1 supported |")


@pytest.mark.parametrize("where", ["top", "middle", "end"])
def test_readme_block_is_rewritten_wherever_it_sits(tmp_path, where):
    markers = f"{reference.BEGIN} old header -->\nold numbers\n{reference.END}\n"
    text = {"top": markers + "# t\nafter\n", "middle": "# t\nbefore\n" + markers + "after\n",
            "end": "# t\nbefore\n" + markers}[where]
    readme = tmp_path / "README.md"
    readme.write_text(text)
    reference.update_readme(_tiny_results(), readme)
    new = readme.read_text()
    assert "old numbers" not in new
    assert reference.readme_section(new) == reference.readme_block(_tiny_results())
    assert new.replace(reference.readme_section(new), "").count("before") == text.count("before")
    reference.update_readme(_tiny_results(), readme)  # idempotent
    assert readme.read_text() == new


def test_readme_without_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no reference block markers"):
        reference.update_readme(_tiny_results(), readme)


def test_judged_part_drops_evidence_timings_and_local_folders():
    part = reference.judged_part(_tiny_results())
    assert "durations" not in part and all("evidence" not in r for r in part["records"])
    series = next(r for r in part["records"] if r["claim"] == "J" and r["level"] == "series")["series"]
    assert series[0]["checkpoint"] == "step_000360.safetensors"
    assert reference.judged_part(part) == part  # idempotent


def _shipped_reference() -> dict:
    if not reference.REFERENCE.is_file():
        pytest.skip("reference/results.json is not generated in this checkout: run "
                    "`python -m report reference --write` (docs/reproduce.md)")
    return json.loads(reference.REFERENCE.read_text())


def test_readme_block_agrees_with_the_shipped_reference():
    """README.md's generated numbers are those of reference/results.json (regenerate both with
    ``python -m report reference --write``; docs/reproduce.md)."""
    ref = _shipped_reference()
    got = reference.readme_section(reference.README.read_text())
    assert got is not None, "README.md lost its reference block markers"
    assert got == reference.readme_block(ref), (
        "README.md's reference block differs from reference/results.json: run "
        "`python -m report reference --write --from reference/results.json`")


def test_shipped_reference_is_command_1_with_its_trained_model_hashes():
    from fixtures.training import shipped_hashes as hashes

    ref = _shipped_reference()
    assert ref["complete"] and "numeric_environment" in ref["provenance"]
    assert ref["options"]["n_samples_requested"] == 100 and ref["options"]["rules"] == "ours"
    shipped = hashes.load()
    trained = {k: m["training"] for k, m in ref["models"].items() if m.get("training")}
    assert trained, "the reference run holds no trained model"
    for key, info in trained.items():
        entry = shipped[info["config_hash"]]
        # the weights the reference run judged are the shipped ones (its own "reference" field
        # says what the hash file held when it ran: "none" for the run that first wrote it)
        assert entry["checkpoints"][str(info["step"])] == info["file_sha256"], key


def test_the_shipped_weights_load_to_the_reference_models_on_any_machine():
    """The default run's trained models are data, not training: every shipped file has its
    recorded sha256, and the last checkpoint of each shipped series loads to the very weights the
    reference run judged (its ``checkpoint_hash``). Nothing here trains or depends on the CPU:
    a sha256 of bytes read from disk, and a state-dict hash of tensors loaded, not computed."""
    from fixtures.engine.claim_session import trained_config
    from fixtures.models import catalogue
    from fixtures.models.checkpoints import state_dict_hash
    from fixtures.training import shipped_hashes, shipped_weights
    from fixtures.training.series import shipped_series

    ref = _shipped_reference()
    trained = {k: m for k, m in ref["models"].items() if m.get("source") == "trained"}
    assert trained, "the reference run holds no trained model"
    total = 0
    for key, model in trained.items():
        config = trained_config(catalogue.REGISTRY[key])
        assert config.config_hash() == model["training"]["config_hash"], key
        series = shipped_series(config)
        assert series is not None and series.origin == "shipped", key
        recorded = shipped_hashes.load()[config.config_hash()]["checkpoints"]
        assert [str(s) for s in series.steps] == sorted(recorded, key=int), key
        assert series.steps[-1] == model["training"]["step"], key
        last = series.load(len(series.checkpoints) - 1)
        assert state_dict_hash(last.state_dict()) == model["checkpoint_hash"], key
        total += sum(path.stat().st_size for _, path, _ in series.checkpoints)
    # the budget of the shipped form (method §13, "The trained models"): well under 100 MB in the repository
    assert total < 90e6, f"the shipped weights take {total / 1e6:.1f} MB"


def test_a_shipped_file_that_is_missing_or_altered_is_named_and_never_trained_over(tmp_path,
                                                                                   monkeypatch):
    """A shipped series is used only when every file has its recorded sha256: an altered or a
    missing file stops with one sentence naming it and how to restore it, both where the
    files are read and in the run's pre-flight check; nothing is trained instead."""
    import shutil

    from fixtures.engine.claim_session import trained_config
    from fixtures.models import catalogue
    from fixtures.plugin import preflight
    from fixtures.training import series as series_module, shipped_weights

    spec = catalogue.REGISTRY["tiny-vit-digits-softmax"]
    config = trained_config(spec)
    copy = tmp_path / "shipped"
    shutil.copytree(shipped_weights.folder_of(config), copy / config.config_hash())
    monkeypatch.setattr(shipped_weights, "SHIPPED_ROOT", copy)
    monkeypatch.setattr(series_module, "train_series", lambda *a, **k: pytest.fail("trained"))
    victim = copy / config.config_hash() / "step_000090.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    victim.write_bytes(bytes(data))
    with pytest.raises(shipped_weights.ShippedWeightsError, match="step_000090.safetensors has "
                       "sha256 .* not the recorded"):
        series_module.cached_series(config, tmp_path / "cache")
    with pytest.raises(pytest.UsageError, match="tiny-vit-digits-softmax: the shipped weights "
                       "file .*step_000090.safetensors"):
        preflight.check_shipped_weights({spec.key: spec})
    victim.unlink()
    with pytest.raises(shipped_weights.ShippedWeightsError, match="step_000090.safetensors is "
                       "missing: restore it with `git checkout"):
        series_module.shipped_series(config)
    assert not (tmp_path / "cache" / "trained" / config.config_hash()).exists()
    assert [p.name for p in (tmp_path / "cache" / "trained").iterdir()
            if not p.name.endswith(".lock")] == []  # no half-copied folder left behind