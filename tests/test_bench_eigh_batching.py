"""bench.eigh_batching (``python -m bench.run --eigh-batching``): the rows it writes, checked on
the CPU (the GPU figures it produced are bench/h200/eigh_batching.json, docs/devices.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from bench.eigh_batching import _matrices, eigh_batching

ROOT = Path(__file__).resolve().parent.parent


def test_inputs_are_symmetric_with_the_stated_spectrum():
    a = _matrices(3, 12, torch.float64, torch.device("cpu"))
    assert torch.equal(a, a.transpose(-1, -2))
    mu = torch.linalg.eigvalsh(a)
    expected = torch.logspace(0, -6, 12, dtype=torch.float64).flip(0)
    assert torch.allclose(mu, expected.expand_as(mu), rtol=1e-9, atol=1e-12)


def test_one_row_per_dtype_and_size_with_agreeing_eigenvalues():
    rows = eigh_batching(torch.device("cpu"), batch=8, sizes=(8, 33), repeats=1)
    assert [(r["dtype"], r["n"]) for r in rows] == [("float64", 8), ("float64", 33),
                                                    ("float32", 8), ("float32", 33)]
    for r in rows:
        assert r["eigenvalues_agree"] is True
        assert r["batched_us"] > 0 and r["loop_us"] > 0 and r["quarter_batch_us"] > 0
        assert r["loop_over_batched"] == r["loop_us"] / r["batched_us"]


def test_the_command_writes_its_file_with_the_device_named(tmp_path):
    out = tmp_path / "eigh.json"
    done = subprocess.run([sys.executable, "-m", "bench.run", "--eigh-batching", "--quick",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["device_name"] and res["torch"] == torch.__version__
    assert [r["n"] for r in res["rows"]] == [16, 32, 33, 64] * 2
    assert "microseconds per matrix" in done.stdout
