"""The report in a real browser (headless Chromium) at 1400 px and 800 px: it uses the window's
width (full width for tables and grids, a readable measure for prose), and every heatmap's values
are in a keyboard-reachable table. Screenshots are left in the test's tmp folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests._browser import chromium, run

from report.render import write_report

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "data" / "results_example.json"

# Measures the laid-out page and writes the numbers into the DOM (dumped with --dump-dom). Only
# the test's copy of the page gets it: the report itself has no script.
PROBE = """<script>
window.addEventListener("load", () => {
  const W = window.innerWidth, out = {W};
  out.scroll = document.documentElement.scrollWidth;
  const tables = [...document.querySelectorAll("body > section table, body table")]
    .filter(t => !t.closest("details"));
  out.widest_table = Math.max(...tables.map(t => t.getBoundingClientRect().width));
  const shape = [...document.querySelectorAll("td")].find(td => /layers × .* heads ×/.test(td.textContent));
  if (shape) {  // line boxes of the cell's text (the cell's height is its row's)
    const range = document.createRange(); range.selectNodeContents(shape);
    out.shape_lines = new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
  }
  out.prose = Math.max(...[...document.querySelectorAll("p")].map(p => p.getBoundingClientRect().width));
  out.em = parseFloat(getComputedStyle(document.querySelector("p")).fontSize);
  out.heatmap_groups = document.querySelectorAll("figure svg.heatmap").length;
  const details = [...document.querySelectorAll("details.values")];
  out.value_tables = details.length;
  out.focusable = details.filter(d => { const s = d.querySelector("summary"); s.focus();
                                        return document.activeElement === s; }).length;
  details.forEach(d => d.open = true);
  out.value_cells = details.map(d => d.querySelectorAll("td").length);
  const pre = document.createElement("pre"); pre.id = "kpca-probe";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


@pytest.mark.slow
@pytest.mark.parametrize("width", [1400, 800])
def test_report_uses_the_width_and_has_keyboard_value_tables(tmp_path, width):
    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    report = write_report(EXAMPLE, tmp_path / "report.html")
    html = report.read_text(encoding="utf-8")
    assert "<script" not in html
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = run(binary, tmp_path / "profile", probe.as_uri(), f"--window-size={width},1200",
               "--dump-dom")
    found = re.search(r'<pre id="kpca-probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    m = json.loads(found.group(1).replace("&quot;", '"'))
    print(f"\n{width} px: {m}")
    assert m["W"] == width
    assert m["scroll"] <= width  # nothing wider than the window
    if width == 1400:
        assert m["widest_table"] >= 1100  # tables and grids use the window, not a 600 px column
        assert m["shape_lines"] == 1      # "6 layers × 12 heads × head dim 32" on one line
    assert m["prose"] <= 53 * m["em"]     # prose keeps a readable measure
    # every heatmap figure has its values in a <details> table whose summary takes focus
    assert m["value_tables"] >= 1 and m["focusable"] == m["value_tables"]
    assert m["value_tables"] == len(re.findall(r'<details class="values"', html))
    assert all(n > 0 for n in m["value_cells"])
    shot = tmp_path / f"report-{width}.png"
    pic = run(binary, tmp_path / "profile-shot", report.as_uri(), f"--screenshot={shot}",
               f"--window-size={width},2400")
    assert pic.returncode == 0 and shot.stat().st_size > 10_000, pic.stderr[-2000:]
    print(f"screenshot: {shot}")
