"""The HTML reproducibility report: results.json (schema ``kpca-claims/results/1``) → one HTML file.

The report reads results; it never decides a verdict. Every verdict, metric, null, threshold and
source shown comes from the results file (thresholds from ``results["thresholds"]``, the parsed
``claims/thresholds.toml`` of the run); the claims' titles, statements and sources come from their
registered :class:`~claims.registry.ClaimSpec`.

This module owns the page: the order of its parts, each claim's section dispatched to the
function its spec names (``report_context``, e.g. :func:`report.sections.claim_v_section.context`)
and drawn by its partial (``template``; a claim without them, or one this process has not
registered, gets :mod:`report.sections.generic_section`), rendering and writing the file. The
results file is read and checked by :mod:`report.results_file`; the opening parts are
:mod:`report.overview`; the Controls, opt-in, gate, thresholds and provenance sections are in
:mod:`report.sections`; links to the method document are :mod:`report.method_link`; machine
paths are scrubbed by :mod:`report.path_scrub`.

Output: one self-contained HTML file (inline CSS, inline SVG, no script, no external resource
except the links of "method §N" to the method document), byte-identical for the same results (no
clock, sorted iteration everywhere).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from claims import registry
from claims.records import VERDICTS

from .atomic import atomic_write_text
from .common import LETTERS, VERDICT_HELP, fmt
from .first_screen import (claim_lines, completeness_state, controls_state, enrich_grid,
                           metric_words, reproduce_state, requested_claims)
from .index import Index, spec_of
from .method_link import method_url_for, safe_link
from .overview import grid_context, not_run_groups, summary_context
from .partial import partial_reasons
from .path_scrub import CHECKOUT, scrub_context
from .results_file import load_results, validate_results
from .sections import controls_section, generic_section
from .sections.gate_section import gate_context
from .sections.opt_in_sections import context as opt_in_context
from .sections.provenance_section import provenance_context
from .sections.thresholds_section import threshold_sections

TEMPLATES = Path(__file__).with_name("templates")
#: The first claim section's number (1 summary; the verdict grid is on the first screen, above
#: the numbered sections).
FIRST_CLAIM_SECTION = 2


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["fmt"] = fmt
    env.filters["words"] = metric_words  # a metric key as words (its key in the cell's title)
    return env


# ------------------------------------------------------------------------------------ claim sections
@lru_cache(maxsize=64)
def _partial(path: str) -> jinja2.Template:
    """A claim's Jinja partial: ``path`` relative to the project root (or absolute)."""
    p = Path(path)
    p = p if p.is_absolute() else CHECKOUT / p
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"the report partial {path!r} of a registered claim cannot be read "
                         f"({exc.strerror}); fix the claim's ClaimSpec.template") from None
    return _environment().from_string(text)


def claim_sections(results: dict, index: Index, first: int = FIRST_CLAIM_SECTION,
                   claims: list[str] | None = None) -> list[dict]:
    """One section per claim of ``claims`` (default :meth:`Index.claims`), numbered from
    ``first`` (:data:`FIRST_CLAIM_SECTION`, one more after a Controls section): its spec's
    ``report_context`` and ``template``, else the generic section."""
    out = []
    generic_partial = str(TEMPLATES / "sections" / "generic.html.j2")
    for number, claim in enumerate(index.claims() if claims is None else claims, start=first):
        spec = spec_of(claim)
        if spec is not None and spec.report_context:
            context = registry.resolve(spec.report_context)(results, index, spec)
        else:
            context = generic_section.context(results, index, spec, claim)
        template = (spec.template if spec is not None and spec.report_context and spec.template
                    else generic_partial)
        out.append({"claim": claim, "number": number, "anchor": f"claim-{claim.lower()}",
                    "nav": context["nav"], "context": context, "spec": spec,
                    "template": _partial(template)})
    return out


def skipped_groups(skipped: dict) -> list[dict]:
    """Claim tests skipped without a record (results.json ``skipped``), grouped by reason."""
    groups: dict[str, list[str]] = {}
    for node, reason in sorted(skipped.items()):
        groups.setdefault(str(reason), []).append(str(node).split("::")[-1])
    return [{"reason": r, "count": len(ids), "examples": ids[:3]} for r, ids in groups.items()]


def build_context(results: dict, method_url: str | None = None) -> dict:
    """Everything the template shows, computed from a validated results dict. The first screen
    (:mod:`report.first_screen`) comes first; the controls' records (method §12) make the
    Controls section; the summary, the grid and the claim sections show the models under test
    only; the provenance lists every model. ``method_url``: where "method §N.M" links (None:
    plain text, :mod:`report.method_link`)."""
    full = results
    full_index = Index(results)
    requested, not_requested = requested_claims(full, full_index)
    control_section = controls_section.context(results)
    results, _ = controls_section.split(results)
    index = Index(results)
    not_run = not_run_groups(index)
    first = FIRST_CLAIM_SECTION + (1 if control_section else 0)
    sections = claim_sections(results, index, first, requested)
    opt = opt_in_context(results)  # --multiverse, --training-dynamics, --seeds (if run)
    reproduce = reproduce_state(full)
    return {
        "title": "Self-attention as kernel PCA: a reproducibility report",
        "date": results["provenance"].get("date", "not recorded"),
        "complete": results["complete"], "exit_status": results.get("exit_status"),
        # models (under test or controls) whose weights are not the shipped reference's
        "weights_notes": reproduce["notes"],
        "state": {"controls": controls_state(full), "reproduce": reproduce,
                  "complete": completeness_state(full, partial_reasons(full))},
        "claim_lines": claim_lines(full, requested, not_requested),
        "not_run": not_run, "n_not_run": len(results["not_run"]),
        "skipped": skipped_groups(results.get("skipped") or {}),
        "partial_reasons": partial_reasons(results, count_not_run=False),
        "merged": bool(results["provenance"].get("merged_from")),
        "summary": summary_context(results, index, requested),
        "gate": gate_context(results),
        "controls": control_section,
        "grid": enrich_grid(grid_context(results, index, not_run), results, index, requested),
        # a series record that judges one condition (claim R: "pgd ε=0.02") names it
        "series_rows": [{"name": r.model + (f" — {r.extra['condition']}"
                                            if r.extra.get("condition") else ""),
                         "claim": r.claim, "verdict": r.verdict,
                         "n": len(r.series or []) if hasattr(r, "series") else 0}
                        for r in index.series()],
        "claim_sections": sections,
        "opt": opt, "opt_number": first + len(sections),
        "thresholds_number": first + len(sections) + opt["n"],
        "thresholds": threshold_sections(results["thresholds"], method_url),
        "provenance": provenance_context(results, full_index),
        "verdicts": [(v, LETTERS[v], VERDICT_HELP[v]) for v in VERDICTS],
    }


def render_report(results: dict, *, method_url: str | None = None, out_path=None) -> str:
    """The report for a results dict, as one self-contained HTML document.

    ``method_url``: where "method §N.M" in the thresholds' sources links (default
    :func:`method_url_for` of ``out_path``, where the report will be written: relative to it
    inside the checkout, else ``$KPCA_METHOD_URL``, else plain text).

    Raises
    ------
    ValueError
        When ``results`` does not follow the results schema (the message names the problem).
    """
    validate_results(results)
    if method_url is not None and not safe_link(method_url):
        raise ValueError(f"the method link {method_url[:80]!r} is neither an http(s) address "
                         "nor a relative path")
    context = scrub_context(build_context(results, method_url or method_url_for(out_path)))
    return _environment().get_template("report.html.j2").render(**context)


def write_report(results_path, out_path, schema_checked: bool = False) -> Path:
    """Render ``results_path`` (a results.json) to ``out_path`` atomically; return ``out_path``.

    The HTML is written to a temporary file in the target folder and moved into place with
    ``os.replace``, so a reader never sees a half-written report. ``schema_checked``: the caller
    wrote this file from content it has just validated against the schema (the run itself), so
    that check is not made twice (:func:`report.results_file.load_results`).

    Raises
    ------
    ValueError
        When the results file is missing, unreadable, not JSON, or not in the results schema;
        the message names the file, and nothing is written.
    """
    results = load_results(results_path, schema=not schema_checked)
    return atomic_write_text(out_path, render_report(results, out_path=out_path))
