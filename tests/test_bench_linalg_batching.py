"""bench.linalg_batching (``python -m bench.run --linalg-batching``): its inputs and the rows it
writes, checked on the CPU (what it measured on a GPU: docs/devices.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.linalg_batching import OPS, _matrices, linalg_batching

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("op", OPS)
def test_inputs_have_the_stated_shape_and_spectrum(op):
    a = _matrices(op, 3, 12, torch.float64, torch.device("cpu"))
    cols = 12 if op == "eigh" else 12 // 4 + 1
    assert a.shape == (3, 12, cols)
    expected = torch.logspace(0, -6, cols, dtype=torch.float64)
    if op == "eigh":
        assert torch.equal(a, a.transpose(-1, -2))
        got = torch.linalg.eigvalsh(a).flip(-1)
    else:
        got = torch.linalg.svdvals(a)
    assert torch.allclose(got, expected.expand_as(got), rtol=1e-8, atol=1e-12)


def test_one_row_per_op_dtype_and_size_with_agreeing_results():
    rows = linalg_batching(torch.device("cpu"), batch=8, sizes=(8, 33), repeats=1)
    assert [(r["op"], r["dtype"], r["n"]) for r in rows] == [
        (op, dtype, n) for op in OPS for dtype in ("float64", "float32") for n in (8, 33)]
    for r in rows:
        assert r["agree"] is True
        assert r["batched_us"] > 0 and r["loop_us"] > 0 and r["quarter_batch_us"] > 0
        assert r["loop_over_batched"] == r["loop_us"] / r["batched_us"]
    assert {tuple(r["shape"]) for r in rows if r["op"] == "qr"} == {(8, 3), (33, 9)}


def test_the_command_writes_its_file_with_the_device_named(tmp_path):
    out = tmp_path / "linalg.json"
    done = subprocess.run([sys.executable, "-m", "bench.run", "--linalg-batching", "--quick",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["device_name"] and res["torch"] == torch.__version__
    assert [(r["op"], r["n"]) for r in res["rows"]] == [
        (op, n) for op in OPS for _ in range(2) for n in (16, 32, 33, 64)]
    assert "microseconds per matrix" in done.stdout
    printed = [line.split()[:3] for line in done.stdout.splitlines()
               if line.split()[:1] and line.split()[0] in OPS]
    assert sorted(printed) == sorted([r["op"], r["dtype"], "x".join(map(str, r["shape"]))]
                                     for r in res["rows"])
