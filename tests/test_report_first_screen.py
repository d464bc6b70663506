"""The report's first screen and its links (issue 44): the verdict grid, the controls' state, the
reference and the completeness lines are within the top 1000 px at 1400 px width, before any
method text, for the default run's report (``reference/results.json``) and for a merge of its
shards; every link of a report written inside or outside the checkout, merged or not, resolves.

The browser test is marked ``slow``; it leaves screenshots of the top 1000 px in its tmp folder,
and writes them to docs/ (``docs/report-first-screen*.png``, shown in the README) when
``KPCA_UPDATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests._browser import chromium, run

from report.merge import merge_files
from report.method_link import METHOD_URL_ENV
from report.render import render_report, write_report
from report.summary import summary

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reference" / "results.json"
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"
#: The elements of the first screen, by id, and what must come after them (the method text).
FIRST_SCREEN = ("verdict-grid", "controls-state", "reproduce-state", "completeness-state")


def shards_of(results: dict, count: int) -> list[dict]:
    """``results`` cut into ``count`` shards by model, as ``--shard K/N`` writes them."""
    models = sorted(results["models"])
    out = []
    for k in range(1, count + 1):
        mine = models[k - 1::count]
        records = [r for r in results["records"] if r["model"] in mine]
        prov = {**results["provenance"], "shard": {"index": k, "count": count, "models": mine,
                                                   "declared_models": models}}
        out.append({**results, "provenance": prov, "records": records, "not_run": [],
                    "models": {m: results["models"][m] for m in mine},
                    "summary": summary(records, [])})
    return out


def merged_report(results: dict, folder: Path, count: int = 2) -> Path:
    paths = []
    for k, shard in enumerate(shards_of(results, count), start=1):
        path = folder / f"shard-{k}" / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(shard), encoding="utf-8")
        paths.append(path)
    _, report, _ = merge_files(paths, folder / "merged", "python -m report merge …")
    return report


# ------------------------------------------------------------------------------------ links
def _targets(html: str) -> list[str]:
    return re.findall(r'\bhref="([^"]*)"', html)


def _assert_every_link_resolves(report: Path) -> int:
    """Open every ``href`` of ``report``: a fragment names an id of the page, a relative path a
    file that exists from the report's folder, and its fragment an id of that file."""
    html = report.read_text(encoding="utf-8")
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    n = 0
    for href in _targets(html):
        parts = urlsplit(href)
        assert parts.scheme in ("", "https", "http"), href
        if parts.scheme:
            continue  # an address the user configured: not opened offline
        n += 1
        if not parts.path:
            assert parts.fragment in ids, f"{report}: {href} names no element of the page"
            continue
        target = (report.parent / unquote(parts.path)).resolve()
        assert target.is_file(), f"{report}: {href} resolves to {target}, which does not exist"
        if parts.fragment:
            text = target.read_text(encoding="utf-8")
            assert f'id="{parts.fragment}"' in text, f"{report}: {href}: no such anchor"
    return n


@pytest.fixture(scope="module")
def example() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


@pytest.fixture
def inside():
    """A folder inside the checkout (under runs/, which git ignores), removed afterwards."""
    folder = ROOT / "runs" / f"test-links-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_every_link_resolves_inside_and_outside_the_checkout_merged_or_not(example, inside,
                                                                            tmp_path, monkeypatch):
    monkeypatch.delenv(METHOD_URL_ENV, raising=False)
    source = tmp_path / "results.json"
    source.write_text(json.dumps(example), encoding="utf-8")
    reports = {"inside": write_report(source, inside / "deep" / "report.html"),
               "outside": write_report(source, tmp_path / "out" / "report.html"),
               "merged inside": merged_report(example, inside / "m"),
               "merged outside": merged_report(example, tmp_path / "m")}
    for where, report in reports.items():
        html = report.read_text(encoding="utf-8")
        n = _assert_every_link_resolves(report)
        method = re.findall(r'href="([^"#]*method\.md)#', html)
        if where.endswith("inside"):
            assert method and n > len(method), where  # links to the method and within the page
        else:  # no address known: the references stay text, with their section numbers
            assert not method and re.search(r'<span class="method" title="section [\d.]+ of '
                                            r'docs/method.md[^"]*">method §[\d.]+</span>', html)
    monkeypatch.setenv(METHOD_URL_ENV, "https://forge.example/kpca/blob/main/docs/method.md")
    merged = merged_report(example, tmp_path / "m2")
    html = merged.read_text(encoding="utf-8")
    assert 'href="https://forge.example/kpca/blob/main/docs/method.md#s2"' in html
    _assert_every_link_resolves(merged)


def test_counts_and_colours_mean_one_thing(example):
    """A control record without an expectation is neither hit nor miss; an underpowered one is
    counted apart; a threshold row without a source is not in the alarm style."""
    from fixtures.models import controls
    from fixtures.plugin.control_outcomes import expectation

    results = json.loads(json.dumps(example))
    results["records"] = [controls.annotate(r, r["model"], expect=expectation)
                          for r in results["records"]]
    ctrl = [r for r in results["records"] if r.get("control")]
    ctrl[0]["expected"] = {**ctrl[0]["expected"], "met": None, "verdict": None, "verdicts": [],
                           "outcome": "no_expectation"}
    ctrl[1]["expected"] = {**ctrl[1]["expected"], "met": None, "outcome": "underpowered",
                           "underpowered": "too few samples"}  # as fixtures/models/controls.py
    html = render_report(results)
    state = re.search(r'<li id="controls-state".*?</li>', html, re.S).group(0)
    met = sum(1 for r in ctrl[2:] if r["expected"].get("met") is True)
    failed = sum(1 for r in ctrl[2:] if r["expected"].get("met") is False)
    assert f"{met} of {met + failed} control records with an expectation" in state or (
        not failed and f"all {met} control records with an expectation" in state)
    assert "1 underpowered" in state and "1 without an expectation" in state
    assert re.search(r'id="controls-apart">Counted apart', html)
    assert 'class="nosource">' not in html and 'class="unsourced">' in html
    # only a bar without a source is a fault (alarm style); a setting says why it has none
    from report.sections.thresholds_section import threshold_rows
    rows = threshold_rows({"baseline": {"metrics": {"V.x": {"regression": "decrease"}}},
                           "claim_x": {"refuted_mode": "any",
                                       "supported": {"m": {"value": 1, "direction": ">="}}}})
    why = {r["rule"]: (r["source"], r["bar"]) for r in rows}
    assert why["metrics · V.x"] == ("a setting of the CI gate (which way this metric regresses), "
                                    "not a bar: no source needed (docs/gate.md)", False)
    assert why["(section)"] == ("section setting, not a bar (no source recorded)", False)
    assert why["supported · m"] == ("no source recorded", True)


# ------------------------------------------------------------------------------------ the browser
PROBE = """<script>
window.addEventListener("load", () => {
  const out = {height: document.documentElement.scrollHeight,
               width: document.documentElement.scrollWidth, boxes: {}};
  for (const id of %s) {
    const e = document.getElementById(id);
    out.boxes[id] = e ? [e.getBoundingClientRect().top, e.getBoundingClientRect().bottom] : null;
  }
  const s = document.getElementById("summary");
  out.method_text = s ? s.getBoundingClientRect().top : null;
  const pre = document.createElement("pre"); pre.id = "kpca-probe";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def _measure(binary: str, report: Path, tmp: Path) -> dict:
    html = report.read_text(encoding="utf-8")
    assert "<script" not in html  # the report itself has none: only the test's copy
    probe = tmp / f"probe-{report.parent.name}.html"
    probe.write_text(html.replace("</body>", PROBE % json.dumps(FIRST_SCREEN) + "</body>"),
                     encoding="utf-8")
    dom = run(binary, tmp / "profile", probe.as_uri(), "--window-size=1400,1000", "--dump-dom")
    found = re.search(r'<pre id="kpca-probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.mark.slow
def test_the_first_screen_answers_within_1000_px_for_the_default_run_and_a_merge(tmp_path):
    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    results = json.loads(REFERENCE.read_text(encoding="utf-8"))
    reports = {"report-first-screen.png": write_report(REFERENCE, tmp_path / "run" / "report.html"),
               "report-first-screen-merged.png": merged_report(results, tmp_path / "shards")}
    for name, report in reports.items():
        m = _measure(binary, report, tmp_path)
        print(f"\n{name}: page {m['height']} px at 1400 px, {report.stat().st_size} bytes; {m}")
        assert m["width"] <= 1400
        for element_id, box in m["boxes"].items():
            assert box is not None, f"{name}: no #{element_id}"
            assert 0 <= box[0] < box[1] <= 1000, f"{name}: #{element_id} at {box}, not in 1000 px"
            assert box[1] <= m["method_text"], f"{name}: #{element_id} after the method text"
        html = report.read_text(encoding="utf-8")
        assert "REPRODUCES the shipped reference" in html  # the default selection, compared
        assert 'id="completeness-state" class="state state-ok"' in html
        assert '<details id="provenance-details">' in html
        shot = tmp_path / name
        pic = run(binary, tmp_path / "profile-shot", report.as_uri(), f"--screenshot={shot}",
                   "--window-size=1400,1000")
        assert pic.returncode == 0 and shot.stat().st_size > 10_000, pic.stderr[-2000:]
        if os.environ.get("KPCA_UPDATE_SCREENSHOTS") == "1":
            shutil.copyfile(shot, ROOT / "docs" / name)


def test_colour_bar_labels_cross_no_marker_line():
    """The reference range's two marks on claim J's colour bar (before: the lower label, drawn
    leftwards under the higher one, crossed its line), and three close marks near an edge."""
    from report.svg_colour import CHAR_PX, mark_layout

    for xs, labels in (([216.0, 248.0], ["reference low 10^2.35", "reference high 10^3.63"]),
                       ([40.0, 300.0, 330.0], ["median eigen 8.64e-13", "median learned 0.848",
                                               "median perturbed 0.923"])):
        layout = mark_layout(xs, labels, 384)
        for i, (row_i, _) in enumerate(layout):
            for j, (row_j, anchor) in enumerate(layout):
                if row_j < row_i:  # i's line runs down through j's row
                    w = CHAR_PX * len(labels[j])
                    lo, hi = ((xs[j] + 3, xs[j] + 3 + w) if anchor == "start"
                              else (xs[j] - 3 - w, xs[j] - 3))
                    assert not lo - 2 <= xs[i] <= hi + 2, (xs, layout)


def test_names_read_as_words_and_narrow_columns_break_only_between_words(example):
    html = render_report(example)
    section = re.search(r'<section id="claim-v">.*?</section>', html, re.S).group(0)
    assert '<td title="results.json: optimal_cosine">optimal cosine</td>' in section
    assert "P2-logs, after epoch 10: 10^2.35" in html and "p2_logs_log10_ratio_after" not in (
        re.sub(r"<(code|details)[^>]*>.*?</\1>", "", html, flags=re.S))
    assert "td code, td.mono { overflow-wrap: break-word; }" in html
