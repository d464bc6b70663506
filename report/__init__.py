"""The kpca-claims reproducibility report: one self-contained HTML file from a results.json.

>>> from report import write_report
>>> write_report("runs/latest/results.json", "runs/latest/report.html")  # doctest: +SKIP

Command line: ``python -m report RESULTS -o OUT.html``. Drill into one head:
``report/drilldown.ipynb`` (papermill parameters results_path, model, layer, head).
"""

from .render import render_report, write_report
from .results_file import load_results, validate_results

__all__ = ["load_results", "render_report", "validate_results", "write_report"]
