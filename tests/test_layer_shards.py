"""Layer shards: ``pytest claims/ --shard K/N --shard-by layers`` splits each model's layers over N
jobs, and ``python -m report merge`` rebuilds the records one run over every layer gives, from the
per-layer metrics the shards leave beside their results.json (fixtures/plugin/layer_parts.py,
report/merge_layers.py, claims/stored_run.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.plugin.shard import layer_ranges

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("layer_shards")  # one module fixture of real runs
RUN = ("--models", "random-vit_tiny_patch16_224", "--n-samples", "4",
       "--layers", "0,1,2", "--heads", "0,1", "--threads", "1", "-p", "no:cacheprovider", "-q")


def _claims(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "claims"), "--rootdir",
                           str(ROOT), "-c", str(ROOT / "pyproject.toml"), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=900)


def _merge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "report", "merge", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_layer_ranges_are_contiguous_and_even():
    assert layer_ranges([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert layer_ranges([3, 7, 9], 3) == [[3], [7], [9]]
    assert layer_ranges(list(range(30)), 4) == [list(range(0, 8)), list(range(8, 16)),
                                                list(range(16, 23)), list(range(23, 30))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run over layers 0-2, and the same run as two layer shards (one of them with 2
    workers), one cache. (A grouped-query decoder's layer shards, SmolLM2's, were checked the
    same way by hand: 14 records equal to the bit; too slow for the suite.)"""
    base = tmp_path_factory.mktemp("layer-shards")
    cache = ("--cache-dir", str(base / "cache"))
    for name, extra in (("one", ("-n", "0")), ("s1", ("--shard", "1/2", "-n", "0")),
                        ("s2", ("--shard", "2/2", "-n", "2"))):
        sharded = ("--shard-by", "layers") if name != "one" else ()
        done = _claims(*RUN, *cache, *extra, *sharded, "--out", str(base / name))
        assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    return base


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_two_layer_shards_merged_equal_one_run_to_the_bit(runs):
    one, s1 = _load(runs / "one" / "results.json"), _load(runs / "s1" / "results.json")
    shard = s1["provenance"]["shard"]
    assert shard["by"] == "layers" and shard["layers"]["random-vit_tiny_patch16_224"] == [0, 1]
    assert shard["declared_layers"]["random-vit_tiny_patch16_224"] == [0, 1, 2]
    assert {r["layer"] for r in s1["records"] if r.get("layer") is not None} == {0, 1}
    files = {(row["model"], row["claim"], row["layer"]) for row in shard["layer_metrics"]}
    assert ("random-vit_tiny_patch16_224", "V", 1) in files and all(f[2] in (0, 1) for f in files)
    done = _merge(str(runs / "s1" / "results.json"), str(runs / "s2" / "results.json"),
                  "-o", str(runs / "merged"))
    assert done.returncode == 0, done.stderr
    merged = _load(runs / "merged" / "results.json")
    # claim V's head tests are adjusted across every layer and the model records aggregate
    # them: rebuilt, every record equals the one run's, floats compared exactly
    assert merged["records"] == one["records"]
    assert merged["summary"] == one["summary"] and merged["exit_status"] == one["exit_status"]
    assert merged["complete"] and merged["provenance"]["missing_layers"] == {}
    model = merged["models"]["random-vit_tiny_patch16_224"]
    assert model["capture_key"].count("+") == 1
    assert {k: v for k, v in model.items() if k != "capture_key"} == {
        k: v for k, v in one["models"]["random-vit_tiny_patch16_224"].items() if k != "capture_key"}
    durations = merged["durations"]
    model_test = next(t for t in durations if t.endswith("test_value_vectors_model"
                                                         "[random-vit_tiny_patch16_224]"))
    assert durations[model_test] == pytest.approx(
        sum(_load(runs / s / "results.json")["durations"][model_test] for s in ("s1", "s2")))


def test_a_missing_layer_shard_is_a_partial_merge_naming_its_layers(runs):
    s1 = _load(runs / "s1" / "results.json")
    done = _merge(str(runs / "s1" / "results.json"), "-o", str(runs / "half"))
    assert done.returncode == 0, done.stderr
    half = _load(runs / "half" / "results.json")
    assert not half["complete"] and half["provenance"]["missing_shards"] == [2]
    assert half["provenance"]["missing_layers"]["random-vit_tiny_patch16_224"] == [2]
    # over the layers it has, the records are the shard's own
    assert half["records"] == s1["records"]


@pytest.mark.parametrize("damage", ["altered", "removed"])
def test_a_damaged_layer_metrics_file_refuses_the_merge_and_names_it(runs, tmp_path, damage):
    copy = tmp_path / "s2"
    shutil.copytree(runs / "s2", copy)
    row = _load(copy / "results.json")["provenance"]["shard"]["layer_metrics"][0]
    target = copy / row["file"]
    if damage == "altered":
        blob = bytearray(target.read_bytes())
        blob[-1] ^= 1
        target.write_bytes(bytes(blob))
    else:
        target.unlink()
    done = _merge(str(runs / "s1" / "results.json"), str(copy / "results.json"),
                  "-o", str(tmp_path / "out"))
    assert done.returncode == 4 and not (tmp_path / "out").exists(), done.stderr
    assert row["file"].rsplit("/", 1)[-1] in done.stderr
    assert ("sha256 differs" if damage == "altered" else "not a file beside it") in done.stderr


def test_layer_shards_do_not_merge_with_model_shards_or_twice(runs, tmp_path):
    one = _merge(str(runs / "s1" / "results.json"), str(runs / "one" / "results.json"),
                 "-o", str(tmp_path / "a"))
    assert one.returncode == 4 and "is not a layer shard" in one.stderr
    twice = _merge(str(runs / "s1" / "results.json"), str(runs / "s1" / "results.json"),
                   "-o", str(tmp_path / "b"))
    assert twice.returncode == 4 and "given twice" in twice.stderr


@pytest.mark.parametrize("models, layers, extra, words", [
    (None, "0,1,2", (), "give --out DIR"),
    (None, "0,1,2", ("--multiverse",), "--multiverse needs every layer"),
    ("kpca-oracle", "0,1", (), "is a control"),
    (None, "0", (), "fewer than 2 shards"),
])
def test_bad_layer_shards_stop_with_one_sentence(tmp_path, models, layers, extra, words):
    base = [a for a in RUN if a != "-q"]
    base[base.index("--layers") + 1] = layers
    if models:
        base[base.index("--models") + 1] = models
    out = ("--out", str(tmp_path / "o")) if words != "give --out DIR" else ()
    done = _claims(*base, "--shard", "1/2", "--shard-by", "layers", *out, *extra,
                   "--collect-only", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], done.stderr
