"""``python -m bench.run --readme``: the README's Speed table is rewritten from a results file."""

from __future__ import annotations

import json

import pytest

from bench import table


def _results() -> dict:
    rows = [{"claim": "V", "stage": "gram", "ours_wall_s": 2.0, "ours_cpu_s": 1.5,
             "ref_wall_s": 6.0, "ref_cpu_s": 4.5, "ref_extrapolated": True, "ratio_wall": 3.0,
             "ratio_cpu": 3.0, "peak_rss_mb": 700.0},
            {"claim": "E", "stage": "claim E, all heads (incl. session)", "ours_wall_s": 10.0,
             "ours_cpu_s": 8.0, "ref_wall_s": 60.0, "ref_cpu_s": 40.0, "ref_extrapolated": True,
             "ratio_wall": 6.0, "ratio_cpu": 5.0, "peak_rss_mb": 710.0},
            {"claim": "V", "stage": "load model", "ours_wall_s": 1.0, "ours_cpu_s": 1.0,
             "peak_rss_mb": 600.0}]
    model = {"model": "m", "n_samples": 4, "n_heads_total": 48, "tokens": {"min": 5, "max": 9},
             "head_dim": 8, "stages": rows, "agreement": {"passed": True},
             "claims": {"E": {"agreement": {"passed": False}}}}
    return {"commit": "abc1234", "date_utc": "2026-11-22 23:00", "repeats": 1,
            "machine": {"cpus": 2, "cpu_model": "Test CPU", "threads": {"torch": 1},
                        "load_before": [1.0], "load_after": [2.0]}, "models": [model]}


def test_readme_table_is_rewritten_between_the_markers(tmp_path):
    res = tmp_path / "results.json"
    res.write_text(json.dumps(_results()))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{table.README_START}\nold table\n{table.README_END}\nafter\n")
    table.update_readme(res, readme)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# x\n\nbefore\n") and text.endswith("after\n")
    assert "commit abc1234" in text and "Test CPU" in text
    assert "| V | gram | 1.5 | 4.5* | 3.00 | 2.0 | 3.00 | 700 |" in text
    assert "| E | **claim E, all heads (incl. session)** | 8.0 | 40.0* | **5.00** |" in text
    assert "load model" not in text
    assert "Agreement with the loop (1e-6 relative): V passed, E FAILED." in text
    table.update_readme(res, readme)  # idempotent
    assert readme.read_text() == text


def test_readme_without_markers_is_an_error(tmp_path):
    res = tmp_path / "results.json"
    res.write_text(json.dumps(_results()))
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no bench table markers"):
        table.update_readme(res, readme)
