"""``python -m bench.run --write-table``: the Speed table of docs/performance.md is rewritten from a
results file, and the shipped page holds the table of the shipped bench/results.json."""

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


def test_table_is_rewritten_between_the_markers(tmp_path):
    res = tmp_path / "results.json"
    res.write_text(json.dumps(_results()))
    doc = tmp_path / "performance.md"
    doc.write_text(f"# x\n\nbefore\n{table.TABLE_START}\nold table\n{table.TABLE_END}\nafter\n")
    table.update_doc(res, doc)
    text = doc.read_text()
    assert "old table" not in text and text.startswith("# x\n\nbefore\n") and text.endswith("after\n")
    assert "commit abc1234" in text and "Test CPU" in text
    assert "| V | gram | 1.5 | 4.5* | 3.00 | 2.0 | 3.00 | 700 |" in text
    assert "| E | **claim E, all heads (incl. session)** | 8.0 | 40.0* | **5.00** |" in text
    assert "load model" not in text
    assert "Agreement with the loop (1e-6 relative): V passed, E FAILED." in text
    table.update_doc(res, doc)  # idempotent
    assert doc.read_text() == text


def test_page_without_markers_is_an_error(tmp_path):
    res = tmp_path / "results.json"
    res.write_text(json.dumps(_results()))
    doc = tmp_path / "performance.md"
    doc.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no bench table markers"):
        table.update_doc(res, doc)


def test_the_shipped_page_holds_the_table_of_the_shipped_results():
    """docs/performance.md's generated table is that of bench/results.json (regenerate it with
    ``python -m bench.run --write-table`` after a bench run)."""
    text = table.DOC.read_text(encoding="utf-8")
    assert text.count(table.TABLE_START) == 1 and text.count(table.TABLE_END) == 1
    block = text.split(table.TABLE_START, 1)[1].split(table.TABLE_END, 1)[0]
    shipped = json.loads((table.ROOT / "bench" / "results.json").read_text(encoding="utf-8"))
    assert table.TABLE_START + block + table.TABLE_END == table.speed_table(shipped), (
        "docs/performance.md's Speed table differs from bench/results.json: run "
        "`python -m bench.run --write-table`")
