"""Scale: ``--shard K/N``, ``python -m report merge``, ``--device`` and the developer switch
``KPCA_ACCELERATOR_PATH=1`` that runs the accelerator code path on the CPU."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fixtures  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]
SMALL = ("--models", "random-vit_tiny_patch16_224,random-bert-minilm-shape", "--n-samples", "4",
         "--layers", "0", "--heads", "0,1", "--threads", "1")


# ----------------------------------------------------------------------------------- shards
def test_parse_shard_accepts_k_of_n_and_refuses_the_rest():
    from fixtures.plugin.shard import parse_shard

    assert parse_shard("1/1") == (1, 1) and parse_shard(" 3 / 4 ") == (3, 4)
    for bad in ("0/2", "3/2", "1/0", "x", "1-2", "", "-1/2", "1/2/3"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_shards_cover_every_model_once_and_balance_the_estimated_cost(count):
    from fixtures.models import catalogue as registry
    from fixtures.plugin.shard import assign, model_cost

    specs = registry.resolve_models(["paper", "default"])
    costs = {s.key: model_cost(s, s.n_layers, s.n_heads, 100, 128) for s in specs}
    plan = assign(costs, count)
    assert set(plan) == set(costs) and set(plan.values()) == set(range(1, count + 1))
    assert plan == assign(dict(reversed(list(costs.items()))), count)  # order-independent
    loads = [sum(c for k, c in costs.items() if plan[k] == s) for s in range(1, count + 1)]
    # greedy largest-first: no shard exceeds the mean by more than the largest single model
    assert max(loads) <= sum(loads) / count + max(costs.values())
    # the ViT cost is layers × heads × samples × 197²: vit_large is 24 × 16 × 100 × 197²
    assert costs["vit_large_patch16_224"] == 24 * 16 * 100 * 197 ** 2
    assert costs["bert-base-uncased"] == 12 * 12 * 100 * 128 ** 2


def _claims(pytester, *args, env=None, timeout=600):
    if env:
        for k, v in env.items():
            pytester._monkeypatch.setenv(k, v)
    return pytester.runpytest_subprocess(
        str(ROOT / "claims"), "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
        *args, timeout=timeout)


@pytest.mark.parametrize("value, words", [
    ("x", "is not K/N"), ("3/2", "between 1 and N"), ("0/2", "between 1 and N"),
    ("1/3", "2 model(s)"),
])
def test_bad_shard_values_stop_with_one_sentence(pytester, tmp_path, value, words):
    result = _claims(pytester, "--models", "random-vit_tiny_patch16_224,random-bert-minilm-shape",
                     "--shard", value, "--out", str(tmp_path / "out"), "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [x for x in result.stderr.str().splitlines() if x.startswith("ERROR:")]
    assert len(lines) == 1 and words in lines[0] and "--shard" in lines[0], result.stderr.str()
    assert "Traceback" not in result.stderr.str()


def test_shards_split_collection_by_whole_models(pytester):
    ids = {}
    for k in (1, 2):
        result = _claims(pytester, *SMALL, "--shard", f"{k}/2", "--collect-only", "-q")
        assert result.ret == 0, result.stdout.str()[-2000:]
        ids[k] = {line for line in result.stdout.lines if "::" in line}
    everything = _claims(pytester, *SMALL, "--collect-only", "-q")
    assert ids[1] and ids[2] and not ids[1] & ids[2]
    assert ids[1] | ids[2] == {line for line in everything.stdout.lines if "::" in line}
    # a model's tests (heads, layers, model level) all land on one shard
    for shard in ids.values():
        models = {m for m in ("random-vit_tiny_patch16_224", "random-bert-minilm-shape")
                  if any(m in line for line in shard)}
        assert len(models) == 1


# ---------------------------------------------------------------- one run = shards + merge
def _merge(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "report", "merge", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_one_run_equals_two_shards_merged(pytester, tmp_path):
    """One run vs --shard 1/2 + --shard 2/2 + merge, each with its own cache
    (so every number is computed again) at one thread: bitwise the same records, the same
    verdicts, a merged report, and the baseline gate passes on the merged result. A fourth run
    takes the accelerator code path on the CPU (KPCA_ACCELERATOR_PATH=1): records to 1e-10
    (at the default --max-memory both paths batch these 4 samples alike, so claim E's γ
    controls, drawn per batch, compare too; smaller device batches: the next tests)."""
    from report import baseline, baseline_gate

    runs = {}
    for name, extra, env in (("one", (), None), ("s1", ("--shard", "1/2"), None),
                             ("s2", ("--shard", "2/2"), None),
                             ("accel", (), {"KPCA_ACCELERATOR_PATH": "1"})):
        out = tmp_path / name
        result = _claims(pytester, *SMALL, *extra, "--out", str(out),
                         "--cache-dir", str(tmp_path / f"cache-{name}"), env=env)
        assert result.ret in (0, 1), result.stdout.str()[-3000:]
        if env:
            pytester._monkeypatch.delenv("KPCA_ACCELERATOR_PATH")
        runs[name] = json.loads((out / "results.json").read_text())
    one, s1, s2 = runs["one"], runs["s1"], runs["s2"]
    assert s1["provenance"]["shard"]["index"] == 1 and s2["provenance"]["shard"]["count"] == 2
    assert set(s1["models"]).isdisjoint(s2["models"]) and s1["complete"] and not s1["not_run"]
    merged_dir = tmp_path / "merged"
    done = _merge(str(tmp_path / "s1" / "results.json"), str(tmp_path / "s2" / "results.json"),
                  "-o", str(merged_dir))
    assert done.returncode == 0, done.stderr
    merged = json.loads((merged_dir / "results.json").read_text())
    assert merged["records"] == one["records"]  # bitwise: floats compared exactly
    assert [r["verdict"] for r in merged["records"]] == [r["verdict"] for r in one["records"]]
    assert merged["models"] == one["models"] and merged["options"] == one["options"]
    assert merged["complete"] and merged["not_run"] == [] and merged["exit_status"] == one["exit_status"]
    assert merged["provenance"]["missing_models"] == [] and merged["provenance"]["missing_shards"] == []
    assert set(merged) >= set(one)  # the shape of a results.json
    html = (merged_dir / "report.html").read_text()
    assert "Complete run" in html and "random-bert-minilm-shape" in html
    # the gate reads a merged result as it reads one run
    tolerances = json.loads(json.dumps(one["thresholds"]))["baseline"]
    gate = baseline_gate.compare(merged, baseline.make_baseline(one), tolerances)
    assert gate.regressions == [] and gate.compared == len(one["records"])
    # the accelerator code path on the CPU: same records to 1e-10, same verdicts
    accel = runs["accel"]
    assert accel["provenance"]["accelerator_path"] is True
    assert [r["verdict"] for r in accel["records"]] == [r["verdict"] for r in one["records"]]
    for a, b in zip(accel["records"], one["records"]):
        assert a.keys() == b.keys() and a["test_id"] == b["test_id"]
        for field in ("metrics", "abs"):
            for metric, x in (b.get(field) or {}).items():
                y = a[field][metric]
                if isinstance(x, float):
                    assert y == pytest.approx(x, rel=1e-10, abs=1e-10), (a["test_id"], metric)
                else:
                    assert y == x, (a["test_id"], metric)


# --------------------------------------------------------------------------- bad merges
def _fake_results(shard: int | None, count: int = 2, models=("m-a", "m-b")) -> dict:
    """A small valid results.json holding one model's records (shard k holds models[k-1])."""
    from fixtures.plugin import RESULTS_SCHEMA

    mine = [models[shard - 1]] if shard else list(models)
    recs = [{"claim": "V", "level": "head", "model": m, "layer": 0, "head": h, "verdict": "supported",
             "metrics": {"x": 0.5 + h}, "test_id": f"test_value_vectors[{m}-L00-H{h}]",
             "options": {"seed": 0}} for m in mine for h in (0, 1)]
    prov = {"date": "2026-01-01T00:00:00+00:00", "command": "pytest claims/", "git_commit": "abc",
            "versions": {"torch": "2"}, "platform": "x", "device": "cpu", "dtype": "float64",
            "workers": 0}
    if shard:
        prov["shard"] = {"index": shard, "count": count, "models": mine,
                         "declared_models": sorted(models)}
    return {"schema": RESULTS_SCHEMA, "provenance": prov, "options": {"seed": 0},
            "thresholds": {"V": {"x": 0.5}}, "records": recs, "not_run": [], "complete": True,
            "exit_status": 0,
            "models": {m: {"key": m, "checkpoint_hash": "c-" + m, "n_layers": 1, "n_heads": 2,
                           "input_set": {"kind": "image", "source": "skimage", "hash": "h1",
                                         "n_samples": 4, "names": []}} for m in mine}}


def _timed(data: dict, drop: int = 0, extra: str | None = None, drop_durations: int = 0) -> dict:
    """``data`` with the durations of its tests (as a run writes them), then ``drop`` records
    removed by hand, or ``drop_durations`` durations removed."""
    data = copy.deepcopy(data)
    data["durations"] = {f"claims/test_value_vectors.py::{r['test_id']}": 0.5 for r in data["records"]}
    data["skipped"] = {}
    for _ in range(drop):
        data["records"].pop()
    for key in list(data["durations"])[:drop_durations]:
        del data["durations"][key]
    return data


def _write(path: Path, data) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _changed(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    target = data
    for p in parents:
        target = target[p]
    target[last] = value
    return data


BAD_SECOND = {
    "options": (lambda d: _changed(d, "options.seed", 1), "differ in options.seed (0 and 1)"),
    "thresholds": (lambda d: _changed(d, "thresholds.V.x", 0.6),
                   "differ in thresholds.V.x (0.5 and 0.6)"),
    "string metric": (lambda d: _changed(d, "records", [{**d["records"][0], "metrics": {
        "optimal_cosine": "0.9"}}]), '.metrics.optimal_cosine is "0.9", not a cosine'),
    "script metric": (lambda d: _changed(d, "records", [{**d["records"][0], "metrics": {
        "x": "<script>alert(1)</script>"}}]), ".metrics.x is \"<script>"),
    "record removed": (lambda d: _timed(d, drop=1), "test_value_vectors[m-b-L00-H1] under "
                       "durations (it ran) but holds no record of it"),
    "record added": (lambda d: _timed(d, extra="claims/test_value_vectors.py::x[m-b-L00-H0]",
                                      drop_durations=1), "a test its durations do not list"),
    "code version": (lambda d: _changed(d, "provenance.git_commit", "def"), "provenance.git_commit"),
    "input set": (lambda d: _changed(d, "models.m-b.input_set.hash", "h2"), "input_set.hash"),
    "same shard twice": (lambda d: _fake_results(1), "both shard 1/2"),
    "other run": (lambda d: _fake_results(2, count=3, models=("m-a", "m-b", "m-c")),
                  "provenance.shard.count"),
    "duplicate records": (lambda d: {**d, "records": d["records"] + _fake_results(1)["records"][:1]},
                          "duplicate records"),
    "truncated": (lambda d: json.dumps(d)[:200], "truncated"),
    "not results": (lambda d: {"schema": "something-else/1", "records": []}, "not a kpca-claims results"),
    "not an object": (lambda d: [1, 2, 3], "not a kpca-claims results"),
    "incomplete results": (lambda d: {k: v for k, v in d.items() if k != "records"}, "'records'"),
}


@pytest.mark.parametrize("case", sorted(BAD_SECOND))
def test_bad_merge_inputs_exit_4_with_one_sentence_and_write_nothing(tmp_path, case):
    make, words = BAD_SECOND[case]
    a = _write(tmp_path / "s1" / "results.json", _fake_results(1))
    b = _write(tmp_path / "s2" / "results.json", make(_fake_results(2)))
    out = tmp_path / "merged"
    done = _merge(a, b, "-o", str(out))
    assert done.returncode == 4, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not out.exists()


def test_the_same_file_twice_and_a_missing_file_are_refused(tmp_path):
    a = _write(tmp_path / "s1" / "results.json", _fake_results(1))
    for args, words in (((a, a), "given twice"), ((a, str(tmp_path / "nope.json")), "no such file")):
        done = _merge(*args, "-o", str(tmp_path / "merged"))
        assert done.returncode == 4 and words in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "merged").exists()


def test_a_missing_shard_gives_a_partial_merge_that_names_the_missing_models(tmp_path):
    a = _write(tmp_path / "s1" / "results.json", _fake_results(1, count=3, models=("m-a", "m-b", "m-c")))
    c = _write(tmp_path / "s3" / "results.json", _fake_results(3, count=3, models=("m-a", "m-b", "m-c")))
    out = tmp_path / "merged"
    done = _merge(a, c, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "m-b" in done.stderr and "partial" in done.stderr
    merged = json.loads((out / "results.json").read_text())
    assert merged["complete"] is False
    assert merged["provenance"]["missing_models"] == ["m-b"]
    assert merged["provenance"]["missing_shards"] == [2]
    assert [r["model"] for r in merged["records"]] == ["m-a", "m-a", "m-c", "m-c"]
    assert "Partial run" in (out / "report.html").read_text()


def test_report_without_merge_still_renders_one_results_file(tmp_path):
    a = _write(tmp_path / "s1" / "results.json", _fake_results(None))
    done = subprocess.run([sys.executable, "-m", "report", a], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "s1" / "report.html").exists()


# ------------------------------------------------------------------------------- devices
def test_resolve_device_refuses_what_this_machine_cannot_run(monkeypatch):
    from fixtures.engine.device import resolve_device

    assert resolve_device(None) == "cpu" and resolve_device("CPU") == "cpu"
    for bad, words in (("tpu", "is not a device"), ("cuda:x", "is not a device"),
                       ("mps:0", "is not a device")):
        with pytest.raises(ValueError, match=words):
            resolve_device(bad)
    with pytest.raises(ValueError, match="drop one of them"):
        resolve_device("cpu", gpu=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device cuda:1 was given, but torch finds no CUDA"):
        resolve_device("cuda:1")
    with pytest.raises(ValueError, match="run without --gpu"):
        resolve_device(None, gpu=True)
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="no Apple MPS device"):
            resolve_device("mps")


def test_cuda_maps_workers_to_gpus_and_cuda_n_pins_one(monkeypatch):
    from fixtures.engine.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert resolve_device("cuda") == resolve_device(None, gpu=True) == "cuda:1"
    assert resolve_device("cuda:0") == resolve_device("cuda:0", gpu=True) == "cuda:0"
    with pytest.raises(ValueError, match="CUDA devices 0..1"):
        resolve_device("cuda:2")


def test_device_cuda_without_cuda_stops_the_run_with_one_sentence(pytester, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = _claims(pytester, "--device", "cuda", "--out", str(tmp_path / "out"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [x for x in result.stderr.str().splitlines() if x.startswith("ERROR:")]
    assert len(lines) == 1 and "--device cuda" in lines[0] and "--device cpu" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_switch_sends_the_cpu_down_the_accelerator_path(monkeypatch):
    from fixtures.engine import layer_context as session
    from fixtures.engine.device import ACCELERATOR_PATH_ENV, on_accelerator_path

    monkeypatch.setattr(session.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    monkeypatch.delenv(ACCELERATOR_PATH_ENV, raising=False)
    assert not on_accelerator_path("cpu") and on_accelerator_path("cuda:0")
    assert session.assignment_threads("cpu") == 1
    monkeypatch.setenv(ACCELERATOR_PATH_ENV, "1")
    assert on_accelerator_path("cpu") and session.assignment_threads("cpu") == 15


def test_accelerator_path_on_the_cpu_gives_the_cpu_numbers(tmp_path, monkeypatch):
    """Device batching to --max-memory (here one head per batch), the assignment threads beside
    a device and the transfers, run on the CPU: claim V, J and E metrics equal the CPU path's to
    1e-10, whatever the batching (claim E's perturbed control draws one seed per (sample, head)).
    The p2-code values keep the eigensolver's own signs (P2's convention, method §8), so they are
    compared only where both paths batch alike (the default --max-memory here)."""
    from fixtures.cache import Cache
    from fixtures.engine.device import ACCELERATOR_PATH_ENV
    from fixtures.models.catalogue import REGISTRY
    from fixtures.engine.model_run import ModelRun
    from fixtures.engine.run_options import RunOptions

    spec = REGISTRY["random-vit_tiny_patch16_224"]
    monkeypatch.delenv(ACCELERATOR_PATH_ENV, raising=False)
    cache = Cache(str(tmp_path / "cache"))
    opts = RunOptions(n_samples=4, seed=0, cache_dir=str(tmp_path / "cache"))
    cpu_run = ModelRun(spec, opts, cache)
    cpu = {c: cpu_run.compute_layer(c, 0) for c in "VJE"}
    cpu_chunks = cpu_run._chunks([0, 1, 2, 3], 3, 197)
    monkeypatch.setenv(ACCELERATOR_PATH_ENV, "1")
    for max_memory, same_batches in ((3 * 1024**2, False), (2 * 1024**3, True)):
        run = ModelRun(spec, RunOptions(n_samples=4, seed=0, cache_dir=str(tmp_path / "cache"),
                                        max_memory=max_memory), cache)
        chunks = run._chunks([0, 1, 2, 3], 3, 197)
        if not same_batches:  # the device budget, not the CPU's cache-sized one, sets the batches
            assert len(chunks) == 12 and len(cpu_chunks) == 1
        accel = {c: run.compute_layer(c, 0) for c in "VJE"}
        for claim in "VJE":
            assert accel[claim].keys() == cpu[claim].keys()
            for key, value in cpu[claim].items():
                if key.startswith("p2code") and not same_batches:
                    continue
                if value.dtype == torch.bool:
                    assert torch.equal(value, accel[claim][key]), (claim, key)
                else:
                    rtol, atol = (1e-5, 1e-6) if key == "mu_naive_float32" else (1e-10, 1e-10)
                    torch.testing.assert_close(accel[claim][key], value, rtol=rtol, atol=atol,
                                               msg=f"{claim} {key} (max_memory {max_memory})")


# (scripts/slurm-shards.sh: tests/test_cluster.py, and on a real Slurm tests/test_slurm_real.py)


def test_bench_run_device_is_checked_like_the_suites(capsys):
    from bench.run import main

    for value, words in (("tpu", "is not a device"), ("cuda:x", "is not a device")):
        with pytest.raises(SystemExit) as exc:
            main(["--device", value, "--quick"])
        assert exc.value.code == 4 and words in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exc:
            main(["--device", "cuda", "--quick"])
        assert exc.value.code == 4 and "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("args, words", [
    ((str(ROOT / "claims"), "--models", "random-vit_tiny_patch16_224,random-bert-minilm-shape",
      "--baseline", "b.json", "--update-baseline"), "without --shard"),
    ((str(ROOT / "tests" / "test_cache.py"),), "use it with `pytest claims/`"),
])
def test_shard_outside_a_whole_claim_run_is_refused(pytester, tmp_path, args, words):
    result = pytester.runpytest_subprocess(
        *args, "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), "--shard", "1/2",
        "--out", str(tmp_path / "out"), "--collect-only", timeout=300)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [x for x in result.stderr.str().splitlines() if x.startswith("ERROR:")]
    assert len(lines) == 1 and words in lines[0], result.stderr.str()


def test_samples_of_the_shards_are_joined_or_the_merge_is_refused(tmp_path):
    """--save-samples shards: their samples.jsonl are joined into the merge's (before: silently
    dropped); a shard without one, or a file that is not there, refuses the merge."""
    paths = []
    for k in (1, 2):
        data = _timed(_fake_results(k))
        data["samples"] = "samples.jsonl"
        rows = [{"claim": "V", "model": r["model"], "level": "head", "layer": 0,
                 "head": r["head"], "sample": s} for r in data["records"] for s in range(3)]
        folder = tmp_path / f"s{k}"
        paths.append(_write(folder / "results.json", data))
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "merged"
    done = _merge(*paths, "-o", str(out))
    assert done.returncode == 0, done.stderr
    merged = json.loads((out / "results.json").read_text())
    assert merged["samples"] == "samples.jsonl"
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {r["model"] for r in rows} == {"m-a", "m-b"}
    (tmp_path / "s2" / "samples.jsonl").unlink()
    done = _merge(*paths, "-o", str(tmp_path / "m2"))
    assert done.returncode == 4 and "which does not exist" in done.stderr, done.stderr
    plain = json.loads(Path(paths[1]).read_text())
    del plain["samples"]
    _write(tmp_path / "s2" / "results.json", plain)
    done = _merge(*paths, "-o", str(tmp_path / "m3"))
    assert done.returncode == 4 and "run every shard with --save-samples, or none" in done.stderr
    assert not (tmp_path / "m2").exists() and not (tmp_path / "m3").exists()


def test_the_forward_pass_counts_in_a_models_cost():
    """fixtures/plugin/shard.py: a decoder checked at its last layer pays the forward pass through
    every layer before it (twice: its random-init twin), which its few heads do not say."""
    from fixtures.models import catalogue as registry
    from fixtures.plugin.shard import FORWARD_COST_PER_FLOP, model_cost

    spec = registry.REGISTRY["smollm2-135m-instruct-q4"]
    gram = model_cost(spec, 2, 9, 100, 128)
    assert gram == 2 * 9 * 100 * 128 ** 2
    deep, shallow = (model_cost(spec, 2, 9, 100, 128, forward_layers=f) for f in (30, 1))
    width = spec.n_heads * spec.head_dim
    assert deep - gram == int(2 * 100 * 128 * 30 * 24 * width ** 2 * FORWARD_COST_PER_FLOP)
    assert deep > 4 * gram and (shallow - gram) * 30 == pytest.approx(deep - gram, rel=1e-6)


def test_workers_take_the_models_most_expensive_first(pytester, tmp_path):
    """fixtures/plugin/schedule.py: the claim tests come grouped by model, the costliest model's
    first (SmolLM2 to layer 29 before MiniLM, though MiniLM has far more tests), each model's
    tests in their own order; xdist is told to keep that order."""
    result = _claims(pytester, "--models", "all-MiniLM-L6-v2,smollm2-135m-instruct-q4",
                     "--out", str(tmp_path / "out"), "--collect-only", "-q", "-n", "0")
    assert result.ret == 0, result.stdout.str()[-2000:]
    ids = [x for x in result.stdout.str().splitlines() if "::" in x]
    models = [("smollm2" if "smollm2" in x else "minilm") for x in ids]
    first_minilm = models.index("minilm")
    assert models[0] == "smollm2" and "smollm2" not in models[first_minilm:], models
    files = [x.split("::")[0] for x in ids[:first_minilm]]
    assert files == sorted(files)  # a model's tests keep the collection's order of the files
