"""The HTML reproducibility report (report/): content, byte stability, partial and bad results
files, size at scale, a headless-Chromium render check and the papermill drill-down notebook.

The browser and notebook tests are marked ``slow`` (deselect with ``-m 'not slow'``).
"""

from __future__ import annotations

import copy
import json
import random
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from markupsafe import escape

from claims.records import VERDICTS, Record
from report.common import LETTERS
from report.sections.claim_j_section import reference_bands
from report.render import render_report, write_report
from report.results_file import load_results
from report.sections.thresholds_section import threshold_rows
from report.svg_colour import VIRIDIS, ColourScale, decade_scale, interpolate, text_colour
from report.svg_heatmap import heatmap
from report.svg_line_plot import Series, line_plot
from report.svg_primitives import MISSING
from tests._browser import chromium

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"
NOTEBOOK = ROOT / "report" / "drilldown.ipynb"
MINI, CTRL = "all-MiniLM-L6-v2", "control-vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def example() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def page(example) -> str:
    return render_report(example)


def element(page: str, tag: str, element_id: str) -> str:
    """The outer text of the first ``<tag id="element_id" ...>...</tag>`` (``tag`` not nested)."""
    m = re.search(rf'<{tag}\b[^>]*\bid="{re.escape(element_id)}"[^>]*>.*?</{tag}>', page, re.S)
    assert m, f"no <{tag} id={element_id!r}> in the report"
    return m.group(0)


def grid_cell(page: str, model: str, claim: str) -> str:
    grid = element(page, "table", "verdict-grid")
    row = re.search(rf'<tr><th class="model" scope="row">{re.escape(model)}.*?</tr>', grid, re.S)
    assert row, f"no grid row for {model}"
    cell = re.search(rf'<td class="cell" data-claim="{claim}".*?</td>', row.group(0), re.S)
    assert cell, f"no grid cell for claim {claim} of {model}"
    return cell.group(0)


def heatmap_letters(page: str, element_id: str) -> list[str]:
    """The verdict letters drawn on a heatmap, in drawing (row-major) order."""
    svg_text = element(page, "svg", element_id)
    group = re.search(r'<g text-anchor="middle" font-size="\d+" font-weight="600"[^>]*>(.*?)</g>',
                      svg_text, re.S)
    return re.findall(r">([SRIUP])</text>", group.group(1)) if group else []


def all_sources(node) -> list[str]:
    if isinstance(node, dict):
        return ([node["source"]] if isinstance(node.get("source"), str) else []) + [
            s for v in node.values() for s in all_sources(v)]
    return []


# ------------------------------------------------------------------------------ the example file
def test_example_file_covers_every_verdict_level_and_claim(example):
    """The hand-made fixture has what the report tests rely on (guards against a thinned file)."""
    recs = example["records"]
    assert {r["verdict"] for r in recs} == set(VERDICTS)
    kinds = {(r["claim"], r["level"]) for r in recs}
    assert {("V", "head"), ("V", "model"), ("J", "layer"), ("J", "model"), ("J", "series"),
            ("E", "model"), ("E", "head")} <= kinds
    assert {r["model"] for r in recs if r["claim"] == "E"} == {MINI}
    assert load_results(EXAMPLE) == example


def test_grid_shows_model_verdicts_counts_and_not_run(page):
    assert 'data-verdict="inconclusive"' in grid_cell(page, MINI, "V")
    assert ("heads: 1 supported, 1 partial, 2 refuted, 1 inconclusive, 1 undetermined"
            in grid_cell(page, MINI, "V"))
    assert 'data-verdict="refuted"' in grid_cell(page, CTRL, "V")
    assert "heads: 4 refuted, 1 inconclusive, 1 undetermined" in grid_cell(page, CTRL, "V")
    assert "layers: 1 supported, 1 inconclusive" in grid_cell(page, CTRL, "J")
    assert "heads: 2 supported, 4 refuted" in grid_cell(page, MINI, "E")
    missing = grid_cell(page, CTRL, "E")
    assert 'data-verdict="not-run"' in missing and ">not run<" in missing
    # real models before controls; every claim column present in order
    grid = element(page, "table", "verdict-grid")
    assert grid.index(MINI) < grid.index(CTRL)
    assert re.findall(r"<th>claim ([VJE])</th>", grid) == ["V", "J", "E"]


def test_every_verdict_kind_appears_with_word_and_letter(page):
    for verdict, letter in LETTERS.items():
        assert f'class="verdict v-{verdict}">{verdict}</span>' in page
        assert f"({letter})" in element(page, "div", "verdict-legend")
    # heatmap letters in row-major order (layer 0 heads 0-2, layer 1 heads 0-2), from the fixture
    assert heatmap_letters(page, f"heatmap-V-{MINI}") == ["R", "I", "U", "S", "R", "P"]
    assert heatmap_letters(page, f"heatmap-V-{CTRL}") == ["R", "R", "I", "R", "U", "R"]
    assert heatmap_letters(page, f"heatmap-E-{MINI}") == ["R", "R", "S", "R", "S", "R"]


def test_heatmaps_have_one_cell_per_head_and_colour_by_value(page, example):
    v = element(page, "svg", f"heatmap-V-{MINI}")
    fills = re.findall(r'<rect x="\d+" y="\d+" width="\d+" height="\d+" fill="(#[0-9a-f]{6})"', v)
    assert len(fills) == 6
    scale = ColourScale(0.0, 1.0)
    heads = sorted((r["layer"], r["head"], r["metrics"]["optimal_cosine"])
                   for r in example["records"]
                   if r["claim"] == "V" and r["level"] == "head" and r["model"] == MINI)
    assert fills == [scale.colour(x) for _, _, x in heads]
    for name in ("heatmap-E-", "heatmap-E-eigen-", "heatmap-E-perturbed-", "heatmap-J-"):
        assert f'id="{name}{MINI}"' in page
    assert f'id="heatmap-E-{CTRL}"' not in page  # no claim-E record for the control


def test_null_level_and_thresholds_are_marked_on_the_claim_v_scale(page):
    legend = element(page, "svg", f"legend-V-{MINI}")
    assert "null (chance) ≈ 0.318" in legend
    assert "supported ≥ 0.9" in legend and "refuted ≤ 0.32" in legend
    assert "mean 0.318 over heads" in " ".join(page.split())
    assert "null (chance) ≈ 0.32" in element(page, "svg", f"legend-V-{CTRL}")  # 0.3202 mean


def test_claim_j_plots_reference_range_and_negative_j(page):
    assert f'id="jmag-{MINI}"' in page and f'id="jratio-{CTRL}"' in page
    series = element(page, "svg", "jseries-p1-tiny-vit-series-0")
    # |J_proj| markers: black circles, hollow (white fill) where J_proj < 0 (5 of 6 in the fixture)
    circles = re.findall(r'<circle [^>]*fill="(#[0-9a-f]{6})" stroke="#000000"', series)
    assert circles.count("#ffffff") == 5 and circles.count("#000000") == 2  # + the legend marker
    ratio = element(page, "svg", "jseries-ratio-p1-tiny-vit-series-0")
    assert "log10 ratio after epoch 10: 10^2.35–10^3.63" in ratio  # the key in words
    # per-layer plots: the run's thresholds section claim_j_reference (no record reference there)
    assert ("P2-logs, after epoch 10: 10^2.35–10^3.63"
            in element(page, "svg", f"jratio-{MINI}"))
    text = " ".join(page.split())
    assert "(5 of 6 checkpoints)" in text and "hollow marker where J<sub>proj</sub> &lt; 0" in text


def test_claim_e_statistics_table_has_all_routes(page):
    table = element(page, "table", f"e-stats-{MINI}")
    rows = re.findall(r"<tr><td><code>(\w+)</code></td>", table)
    assert rows == ["log_raw", "log_standardized", "naive_float32"]
    assert "0.0412<br><span class=\"pm\">± 0.0031</span>" in table
    assert "exp(S) overflows float32 in layer 1 head 2" in table
    assert re.search(r'naive_float32.*?<td class="num">4</td><td class="num">3</td>', table, re.S)


def test_every_threshold_and_source_is_shown(example):
    page = render_report(example, out_path=ROOT / "report.html")  # links relative to the root
    sources = all_sources(example["thresholds"])
    assert len(sources) >= 10
    for source in sources:  # each "method §N.M" in a source links to its anchor of docs/method.md
        linked = re.sub(r"method §(\d+)(?:\.(\d+))?", lambda m: (
            f'<a class="method" href="docs/method.md#s{m.group(1)}'
            f'{"-" + m.group(2) if m.group(2) else ""}">{m.group(0)}</a>'), str(escape(source)))
        assert linked in page, source
    assert "refuted_mode = any" in page  # a section-level setting is shown too
    assert "optimal_cosine ≥ 0.9" in page and "linear_cka ≤ 0.11" in page
    assert "atol = 1.00e-05, rtol = 0.001" in page and "max_share = 0.5" in page
    # the one table of the run's thresholds without a source: claim_e's section-level mode
    assert page.count("no source recorded") == 1
    assert re.search(r"<td>\(section\)</td><td class=\"mono\">refuted_mode = any</td>"
                     r"<td>[^<]*</td><td class=\"unsourced\">section setting, not a bar \(no source "
                     r"recorded\)</td>",
                     page)


def test_reference_range_precedence():
    """Record reference, else the run's claim_j_reference thresholds (P2-logs, method §3), else
    none: the report has no range of its own (thresholds.toml holds it)."""
    assert reference_bands(None, {}) == []
    thr = {"claim_j_reference": {"p2_logs_log10_ratio_x": [3.0, 2.0], "source": "s"}}
    assert [(b.lo, b.hi) for b in reference_bands(None, thr)] == [(2.0, 3.0)]
    rec = Record.from_json({"claim": "J", "level": "series", "model": "s", "reference": {
        "my_log10_ratio": [1, 1.5], "other": [5, 6]}})
    assert [(b.lo, b.hi) for b in reference_bands(rec, thr)] == [(1.0, 1.5)]


def test_empty_and_model_only_results_render(example):
    empty = {**example, "models": {}, "records": [], "complete": False, "exit_status": 2,
             "not_run": [f"claims/test_value_vectors.py::test_value_vectors[{MINI}-L00-H0]"]}
    page = render_report(empty)
    assert "This is a partial run" in page and page.count('class="heatmap"') == 0
    assert "No claim-V record in these results." in page
    only = copy.deepcopy(example)
    only["records"] = [r for r in only["records"] if r["claim"] == "J" and r["level"] == "model"]
    page = render_report(only)
    # the per-layer plot falls back to the model record's per_layer lists: 2 layers, 2 points each
    plot = element(page, "svg", f"jmag-{MINI}")
    assert len(re.findall(r"<circle ", plot)) == 2 + 1  # phi markers, + the legend's
    assert len(re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="6.4"', plot)) == 2 + 1  # h markers
    assert 'data-verdict="refuted"' in grid_cell(page, MINI, "J")
    # only claim J's records and no test of V that did not run: the run did not ask for V
    assert "<th>claim V</th>" not in page and "claim V (" in element(page, "li", "not-requested")


def test_threshold_without_source_is_flagged():
    rows = threshold_rows({"claim_x": {"supported": {"m": {"value": 1, "direction": ">="}}}})
    assert rows == [{"section": "claim_x", "rule": "supported · m", "condition": "m ≥ 1",
                     "whose": "unknown", "source": "no source recorded", "sourced": False,
                     "bar": True}]


def test_provenance_panel(page, example):
    prov = element(page, "section", "provenance")
    for key in ("date", "git_commit", "device", "command", "platform"):
        assert str(escape(str(example["provenance"][key]))) in prov
    for pkg, version in example["provenance"]["versions"].items():
        assert f"<dt>{pkg}</dt><dd>{version}</dd>" in prov
    for info in example["models"].values():
        assert info["checkpoint_hash"] in prov
        assert info["input_set"]["hash"] in prov and info["input_set"]["tensor_hash"] in prov
        for note in info["input_set"]["notes"]:
            assert str(escape(note)) in prov
    assert "<dt>scale</dt><dd>0.1767766952966369</dd>" in prov  # unrounded


def test_summary_reads_setup_from_options_not_constants(example):
    page = render_report(example)
    summary = element(page, "section", "summary")
    assert "<strong>float64</strong>" in summary and "off: raw keys and queries" in summary
    changed = copy.deepcopy(example)
    changed["options"].update(dtype="float32", standardize=True, axis_convention="kpca")
    summary = element(render_report(changed), "section", "summary")
    assert "<strong>float32</strong>" in summary and "float64" not in summary
    assert "on: keys and queries standardised" in summary
    assert "not P2&#39;s convention" in summary or "not P2's convention" in summary
    # the order of sections: the first screen's grid, summary, V, J, E, thresholds, provenance
    # (claim R: not asked for in the example, so no section)
    ids = re.findall(r'<section id="([\w-]+)">', page)
    assert ids == ["grid", "summary", "claim-v", "claim-j", "claim-e", "thresholds", "provenance"]


def test_report_is_self_contained(page):
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert not re.search(r'\bsrc\s*=', page, re.I)
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}
    gradients = {f"#{m}" for m in re.findall(r'<linearGradient id="([^"]+)"', page)}
    assert set(re.findall(r"url\(([^)]*)\)", page)) <= gradients
    assert page.count("<html") == 1 and page.startswith("<!DOCTYPE html>")


def test_text_is_escaped(example):
    evil = copy.deepcopy(example)
    evil["models"][MINI]["label"] = "<b onmouseover=alert(1)>x</b>"
    evil["provenance"]["command"] = "pytest '<script>'"
    page = render_report(evil)
    assert "<b onmouseover" not in page and "&lt;b onmouseover=alert(1)&gt;" in page
    assert "<script>" not in page


def test_non_finite_metric_is_never_coloured_as_data(example):
    odd = copy.deepcopy(example)
    head = next(r for r in odd["records"] if r["claim"] == "V" and r["level"] == "head"
                and r["model"] == MINI and (r["layer"], r["head"]) == (0, 0))
    head["metrics"]["optimal_cosine"] = float("nan")
    v = element(render_report(odd), "svg", f"heatmap-V-{MINI}")
    first = re.search(r"<rect x=[^>]*>", v.split("</g><g stroke=")[1]).group(0)
    assert f'fill="{MISSING}"' in first
    assert "optimal cosine NaN (non-finite)" in v


# ------------------------------------------------------------------------------ byte stability
def test_byte_stable_and_independent_of_input_order(example, page, tmp_path):
    assert render_report(example) == page
    shuffled = copy.deepcopy(example)
    random.Random(0).shuffle(shuffled["records"])
    shuffled["models"] = dict(reversed(list(shuffled["models"].items())))
    shuffled["thresholds"] = {k: dict(reversed(list(v.items())))
                              for k, v in reversed(list(shuffled["thresholds"].items()))}
    shuffled["options"] = dict(reversed(list(shuffled["options"].items())))
    assert render_report(shuffled) == page
    a, b = tmp_path / "a.html", tmp_path / "b" / "b.html"
    assert write_report(EXAMPLE, a) == a and write_report(EXAMPLE, b) == b
    assert a.read_bytes() == b.read_bytes() == page.encode("utf-8")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.html", "b.html"]


# ------------------------------------------------------------------------------ partial results
def test_partial_results_render_and_say_what_is_missing(example):
    part = copy.deepcopy(example)
    dropped = [r for r in part["records"] if r["claim"] == "E" and r["model"] == MINI
               and (r["level"] == "model" or r.get("layer") == 1)]
    part["records"] = [r for r in part["records"] if r not in dropped]
    part["not_run"] = sorted(
        [f"claims/test_gram_spectrum.py::test_gamma_constancy[{MINI}-L01-H{h}]" for h in range(3)]
        + [f"claims/test_gram_spectrum.py::test_eigenvalue_statistics[{MINI}]"]
        + [f"claims/test_projection_loss.py::test_projection_loss_series[p1-series-b]"])
    part["complete"], part["exit_status"] = False, 2
    page = render_report(part)
    banner = element(page, "div", "partial-banner")
    assert "This is a partial run" in banner and "5 collected claim tests did not run" in banner
    assert re.search(r"<td>E</td><td><code>test_gamma_constancy</code></td><td>all-MiniLM-L6-v2"
                     r"</td><td class=\"num\">3</td>", banner)
    assert re.search(r"<td>E</td><td><code>test_eigenvalue_statistics</code></td>", banner)
    # a test function with no record at all: its claim comes from its file, its model is unknown
    assert re.search(r"<td>J</td><td><code>test_projection_loss_series</code></td>"
                     r"<td>\(unknown model\)</td>", banner)
    cell = grid_cell(page, MINI, "E")
    assert "no model verdict" in cell and "model-level test not run" in cell
    assert "heads: 1 supported, 2 refuted" in cell
    assert heatmap_letters(page, f"heatmap-E-{MINI}") == ["R", "R", "S"]
    assert "Partial run" in page.split("</header>")[0]
    assert "Complete run" not in page


# ------------------------------------------------------------------------------ bad files
@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ('{"schema": "something-else/1"}', "schema is 'something-else/1'"),
    (None, "no such results file"),
    ("[1, 2]", "must be a JSON object"),
])
def test_bad_file_is_a_clear_error_and_writes_nothing(tmp_path, content, problem):
    bad = tmp_path / "results.json"
    if content is not None:
        bad.write_text(content)
    out = tmp_path / "out" / "report.html"
    with pytest.raises(ValueError, match=re.escape(problem)) as info:
        write_report(bad, out)
    assert str(bad) in str(info.value)
    assert not out.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit, problem", [
    (lambda r: r.pop("records"), "the field 'records' is missing"),
    (lambda r: r.update(complete="yes"), "'complete' must be a bool"),
    (lambda r: r["records"][3].update(verdict="passed"), "verdict 'passed' is not one of"),
    (lambda r: r["records"][0].update(level="token"), "level 'token' is not one of"),
    (lambda r: r["records"][0].update(layer=-1), "'layer' must be a non-negative integer"),
])
def test_malformed_results_name_the_problem(example, tmp_path, edit, problem):
    bad = copy.deepcopy(example)
    edit(bad)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bad))
    out = tmp_path / "report.html"
    with pytest.raises(ValueError, match=re.escape(problem)) as info:
        write_report(path, out)
    assert str(path) in str(info.value)
    assert list(tmp_path.iterdir()) == [path]


def test_record_error_names_the_test(example):
    bad = copy.deepcopy(example)
    bad["records"][5]["verdict"] = "maybe"
    with pytest.raises(ValueError, match=re.escape(f"records[5] ({bad['records'][5]['test_id']})")):
        render_report(bad)


def test_command_line(tmp_path):
    out = tmp_path / "r.html"
    ok = subprocess.run([sys.executable, "-m", "report", str(EXAMPLE), "-o", str(out)], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(out) and out.read_bytes() == render_report(
        json.loads(EXAMPLE.read_text())).encode()
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    fail = subprocess.run([sys.executable, "-m", "report", str(bad), "-o",
                           str(tmp_path / "x.html")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert fail.returncode == 2 and not (tmp_path / "x.html").exists()
    lines = fail.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "not valid JSON" in lines[0]


# ------------------------------------------------------------------------------ svg helpers
def test_colour_scale_known_values():
    lin = ColourScale(0.0, 1.0)
    assert lin.position(0.25) == 0.25 and lin.position(-3) == 0.0 and lin.position(7) == 1.0
    assert lin.colour(0.0) == VIRIDIS[0] and lin.colour(1.0) == VIRIDIS[-1]
    assert lin.colour(None) == lin.colour(float("nan")) == MISSING
    log = ColourScale(1e-6, 1.0, log=True)
    assert log.position(1e-3) == pytest.approx(0.5) and log.colour(0.0) == MISSING
    assert decade_scale([0.0, 2e-13, 0.8]).vmin == pytest.approx(1e-13)
    assert decade_scale([0.0, 2e-13, 0.8]).vmax == 1.0
    assert text_colour("#000000") == "#ffffff" and text_colour("#fde725") == "#000000"
    assert interpolate(("#000000", "#ffffff"), 0.5) == "#808080"
    with pytest.raises(ValueError, match="vmin < vmax"):
        ColourScale(1.0, 1.0)
    with pytest.raises(ValueError, match="3 rows x 2 columns"):
        heatmap([[1, 2]], [0, 1, 2], [0, 1], lin, "h")


def test_line_plot_maps_log_values_to_decades():
    out = line_plot([Series("a", (0, 1), (-3.0, 0.0), "#000000")], "p", "x", "y")
    assert "10⁻³" in out and "10⁰" in out
    # y = -3 sits on the bottom edge of the plot frame, y = 0 on the top edge
    frame = re.search(r'<rect x="58" y="(\d+)" width="[\d.]+" height="([\d.]+)" fill="none"', out)
    top, height = float(frame.group(1)), float(frame.group(2))
    pts = re.search(r'<polyline points="([^"]+)"', out).group(1).split()
    ys = [float(p.split(",")[1]) for p in pts]
    assert ys == [pytest.approx(top + height), pytest.approx(top)]


# ------------------------------------------------------------------------------ scale
def synthetic_results(n_models: int = 10, n_layers: int = 24, n_heads: int = 16,
                      seed: int = 0) -> dict:
    """A results dict of realistic shape: every claim for every model at full size."""
    rng = random.Random(seed)
    example = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    verdicts = list(VERDICTS)
    records, models = [], {}
    for m in range(n_models):
        key = f"vit_synthetic_{m:02d}_patch16_224"
        info = copy.deepcopy(example["models"][CTRL])
        info.update(key=key, n_layers=n_layers, n_heads=n_heads, control=m == n_models - 1)
        info["input_set"]["names"] = [f"image_{i:03d}.JPEG" for i in range(100)]
        models[key] = info
        for layer in range(n_layers):
            ratios = [rng.uniform(1.5, 3.5) for _ in range(n_heads)]
            records.append({
                "claim": "J", "level": "layer", "model": key, "layer": layer, "head": None,
                "verdict": rng.choice(verdicts[:3]), "test_id": f"test_j[{key}-L{layer:02d}]",
                "metrics": {"phi_sq_mean": 1e-3, "h_sq_mean": 10 ** sum(ratios) / n_heads * 1e-3,
                            "j_proj": -1.0, "bessel_share": 0.0,
                            "log10_ratio": sum(ratios) / n_heads},
                "per_head": {"log10_ratio": ratios}})
            for head in range(n_heads):
                oc = rng.uniform(0.2, 0.5)
                records.append({
                    "claim": "V", "level": "head", "model": key, "layer": layer, "head": head,
                    "verdict": rng.choice(verdicts),
                    "test_id": f"test_v[{key}-L{layer:02d}-H{head}]",
                    "metrics": {"optimal_cosine": oc}, "null": {"optimal_cosine": 0.32},
                    "n_used": 100, "n_samples": 100})
                records.append({
                    "claim": "E", "level": "head", "model": key, "layer": layer, "head": head,
                    "verdict": rng.choice(verdicts[:2]),
                    "test_id": f"test_e[{key}-L{layer:02d}-H{head}]",
                    "metrics": {"learned": rng.uniform(0.1, 1),
                                "eigen": 10 ** rng.uniform(-14, -12),
                                "perturbed": rng.uniform(0.5, 1)}, "abs": {},
                    "closer_to_eigen_share": 0.0})
        for claim in ("V", "J", "E"):
            rec = copy.deepcopy(next(r for r in example["records"]
                                     if r["claim"] == claim and r["level"] == "model"))
            rec.update(model=key, test_id=f"test_{claim}_model[{key}]")
            records.append(rec)
    records.append(next(r for r in example["records"] if r["level"] == "series"))
    return {**example, "models": models, "records": records}


def test_report_at_scale_stays_small_and_aggregated():
    results = synthetic_results()
    page = render_report(results)
    size = len(page.encode("utf-8"))
    print(f"\nreport for 10 models x 24x16 heads x 3 claims: {size / 1e6:.2f} MB")
    assert size < 5_000_000
    one = element(page, "svg", "heatmap-V-vit_synthetic_03_patch16_224")
    assert len(re.findall(r"<rect ", one)) == 24 * 16  # one rect per head, nothing else
    assert len(heatmap_letters(page, "heatmap-V-vit_synthetic_03_patch16_224")) == 24 * 16
    visible = re.sub(r'<details class="values".*?</details>', "", page, flags=re.S)
    assert visible.count("<tr") < 400  # tables aggregate; no row per test
    # the heatmaps' keyboard-reachable value tables: one row per layer (+ header), not per test
    grid = element(page, "details", "values-V-vit_synthetic_03_patch16_224")
    assert grid.count("<tr") == 24 + 1 and grid.count("<td") == 24 * 16
    assert page.count('class="heatmap"') == 10 * (1 + 3 + 1)  # V, E x3 panels, J per model


# ------------------------------------------------------------------------------ browser
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]


def _run_chromium(binary: str, profile: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=120)


def console_messages(stderr: str) -> list[str]:
    """Chromium's console lines from its stderr log. The report has no script, so any console
    message is the browser complaining about the page (an invalid SVG attribute, a blocked or
    missing resource) and counts as an error; this Chromium logs every console level as INFO."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _png_size_and_variety(path: Path) -> tuple[int, int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw[::101]))


@pytest.mark.slow
def test_report_renders_in_headless_chromium(tmp_path, example):
    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    # the console check must be able to fail: a page with a broken SVG attribute and a script error
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><body><svg xmlns="http://www.w3.org/2000/svg" '
                       'width="9" height="9"><rect width="-3" height="2"/></svg>'
                       '<script>console.error("kpca-control-error")</script></body></html>')
    ctl = _run_chromium(binary, tmp_path / "profile-control", control.as_uri(), "--dump-dom")
    found = "\n".join(console_messages(ctl.stderr))
    assert "negative value" in found and "kpca-control-error" in found, ctl.stderr[-2000:]

    report = write_report(EXAMPLE, tmp_path / "report.html")
    dom = _run_chromium(binary, tmp_path / "profile", report.as_uri(), "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []
    expected = ["verdict-grid", f"heatmap-V-{MINI}", f"heatmap-V-{CTRL}", f"heatmap-J-{MINI}",
                f"heatmap-J-{CTRL}", f"heatmap-E-{MINI}", f"heatmap-E-eigen-{MINI}",
                f"heatmap-E-perturbed-{MINI}", f"jmag-{MINI}", f"jratio-{CTRL}",
                "jseries-p1-tiny-vit-series-0", f"e-stats-{MINI}"]
    for element_id in expected:
        assert f'id="{element_id}"' in dom.stdout, f"{element_id} missing from the rendered DOM"
    # the browser parsed every heatmap cell as an SVG rect
    v = re.search(rf'<svg[^>]*id="heatmap-V-{MINI}".*?</svg>', dom.stdout, re.S).group(0)
    assert len(re.findall(r"<rect ", v)) == 6

    shot = tmp_path / "report.png"
    pic = _run_chromium(binary, tmp_path / "profile-shot", report.as_uri(),
                        f"--screenshot={shot}", "--window-size=1400,3000")
    assert pic.returncode == 0 and shot.exists(), pic.stderr[-2000:]
    assert console_messages(pic.stderr) == []
    width, height, variety = _png_size_and_variety(shot)
    assert (width, height) == (1400, 3000) and variety > 20  # not a blank page
    print(f"\nscreenshot: {shot}")


# ------------------------------------------------------------------------------ notebook
@pytest.fixture(scope="session")
def python3_kernel():
    pytest.importorskip("papermill", reason="papermill is not installed (pip install papermill)")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install ipykernel)")
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        done = subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or "python3" not in KernelSpecManager().find_kernel_specs():
            pytest.skip("no python3 Jupyter kernel, and installing one failed: "
                        f"{done.stderr[-300:]}")
    return "python3"


def _outputs(nb) -> str:
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.slow
def test_drilldown_notebook_runs_under_papermill(tmp_path, python3_kernel):
    import nbformat
    import papermill

    source = nbformat.read(NOTEBOOK, as_version=4)
    assert source.metadata["kernelspec"]["name"] == "python3"
    tagged = [c for c in source.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and all(p in tagged[0].source
                                    for p in ("results_path", "model", "layer", "head"))
    out = tmp_path / "drilldown.ipynb"
    nb = papermill.execute_notebook(
        str(NOTEBOOK), str(out), kernel_name=python3_kernel, progress_bar=False, cwd=str(tmp_path),
        parameters={"results_path": str(EXAMPLE), "model": MINI, "layer": 0, "head": 2})
    text = _outputs(nb)
    assert f"claim V, {MINI} layer 0 head 2: undetermined" in text
    assert "optimal_cosine                   0.337       0.318" in text  # value beside its null
    assert "refuted if <= 0.32  [P2 abstract: optimal cosine" in text  # the example file's own sources
    assert f"claim J, {MINI} layer 0 (verdicts are per layer): refuted" in text
    assert f"claim E (gamma constancy), {MINI} layer 0 head 2: supported" in text
    assert " * head   2  U     0.337 (0.318)" in text  # the layer's other heads, this one starred
    assert "   head   0  R     0.281 (0.318)" in text
    assert example_hash(MINI) in text

    # a model without claim E: the notebook says which claims it has, and still runs
    nb = papermill.execute_notebook(
        str(NOTEBOOK), str(tmp_path / "ctrl.ipynb"), kernel_name=python3_kernel, progress_bar=False,
        cwd=str(tmp_path), parameters={"results_path": str(EXAMPLE), "model": CTRL, "layer": 1,
                                       "head": 1})
    text = _outputs(nb)
    assert "claims with records for this model: V, J\n" in text
    assert f"claim V, {CTRL} layer 1 head 1: undetermined" in text

    with pytest.raises(papermill.PapermillExecutionError, match="model 'nope' is not in"):
        papermill.execute_notebook(
            str(NOTEBOOK), str(tmp_path / "bad.ipynb"), kernel_name=python3_kernel,
            progress_bar=False, cwd=str(tmp_path),
            parameters={"results_path": str(EXAMPLE), "model": "nope", "layer": 0, "head": 0})


def example_hash(model: str) -> str:
    return json.loads(EXAMPLE.read_text())["models"][model]["checkpoint_hash"]


def test_the_schema_check_is_skipped_only_for_a_file_its_writer_checked(example, tmp_path,
                                                                      monkeypatch):
    """The run checks its own results.json against the schema before writing it and renders its
    page with ``schema_checked``: that page is made without a second schema check (4.7 s for
    command 1's results), while every other caller's file is checked, and the semantic checks of
    validate_results run either way."""
    from report import validate

    path = tmp_path / "results.json"
    path.write_text(json.dumps(example))
    calls = []
    real = validate.check
    monkeypatch.setattr(validate, "check", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    write_report(path, tmp_path / "a.html", schema_checked=True)
    assert calls == []
    write_report(path, tmp_path / "b.html")
    assert len(calls) == 1 and str(path) in calls[0]
    bad = copy.deepcopy(example)
    bad["records"][3].update(verdict="passed")
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="verdict 'passed' is not one of"):
        write_report(path, tmp_path / "c.html", schema_checked=True)
