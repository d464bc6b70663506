"""bench/capture_memory.py: its reference route captures what the suite's route captures (so
the two differ only in when layers are let go), one measurement in process gives a consistent
row, the table states the ratio, and bad input stops before anything runs. Memory figures are the
benchmark's to print (docs/performance.md), never a test's to assert."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from bench import capture_memory
from fixtures.models import capture, capture_batches
from tests.test_capture_layers import _cases

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the benchmark reads Linux's /proc")
TINY = capture_memory.Shape(hidden=32, heads=4, kv_heads=2, tokens=8, samples=4, batch=2, vocab=64)


def test_the_held_reference_writes_the_same_layer_files(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    for name, loaded, batch in _cases(tmp_path):
        streamed = capture_batches.capture_to_layer_files(loaded, [batch], tmp_path / name / "s")
        monkeypatch.setattr(capture_batches, "capture_qkv", capture_memory.held_capture(capture.capture_qkv))
        held = capture_batches.capture_to_layer_files(loaded, [batch], tmp_path / name / "h")
        monkeypatch.undo()
        assert held == streamed
        for layer in range(streamed["n_layers"]):
            a = load_file(str(tmp_path / name / "s" / f"layer_{layer:02d}.safetensors"))
            b = load_file(str(tmp_path / name / "h" / f"layer_{layer:02d}.safetensors"))
            assert sorted(a) == sorted(b) == ["k", "q", "token_mask", "v"]
            for key in a:
                torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=0)


def test_one_measurement_and_the_table():
    row = capture_memory.measure("streamed", 2, TINY)
    assert row["layers"] == 2 and row["route"] == "streamed"
    assert row["peak_bytes"] >= row["loaded_bytes"] > 0
    assert row["growth_bytes"] == row["peak_bytes"] - row["loaded_bytes"]
    # (4 query heads + 2 × 2 KV heads) × samples·tokens·d × 4 B
    assert row["qkv_bytes_per_layer"] == (4 + 2 * 2) * 4 * 8 * 8 * 4
    mb = 2 ** 20
    rows = [dict(row, layers=n, route=r, growth_bytes=g * mb, float64_copy_bytes=mb)
            for n, r, g in ((4, "streamed", 11), (4, "held", 21), (8, "streamed", 11), (8, "held", 41))]
    text = capture_memory.table({"date_utc": "d", "commit": "c", "cpu": "cpu", "torch": "t",
                                 "shape": vars(TINY), "rows": rows})
    assert text.startswith(capture_memory.START) and text.endswith(capture_memory.END)
    assert "| 4 |" in text and text.count("| 2.0× |") == 1 and text.count("| 4.0× |") == 1


def test_bad_depths_stop_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "memory.json"
    for bad in ("4,x", "0,4"):
        with pytest.raises(SystemExit) as exc:
            capture_memory.main(["--layers", bad, "--out", str(out)])
        assert exc.value.code == 4
        assert "--layers" in capsys.readouterr().err
    assert not out.exists()


def test_the_shipped_figures_are_the_page_s_table():
    results = json.loads(capture_memory.OUT.read_text())
    page = Path(capture_memory.DOC).read_text()
    assert capture_memory.table(results) in page
    assert {(r["layers"], r["route"]) for r in results["rows"]} == {
        (n, route) for n in (4, 8, 16, 32) for route in capture_memory.ROUTES}
