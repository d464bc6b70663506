"""The HTML reproducibility report: results.json (schema ``kpca-claims/results/1``) → one HTML file.

The report reads results; it never decides a verdict. Every verdict, metric, null, threshold and
source shown comes from the results file (thresholds from ``results["thresholds"]``, the parsed
``claims/thresholds.toml`` of the run); the claims' titles, statements and sources come from their
registered :class:`~claims.registry.ClaimSpec`.

This module is the core: validation, the order of the parts, the thresholds and provenance
sections, and writing the file. The opening parts are :mod:`report.overview`; each claim's
section is built by the function its spec names (``report_context``, e.g.
:func:`report.sections.claim_v_section.context`) and drawn by its partial (``template``); a claim without
them, or one this process has not registered, gets :mod:`report.sections.generic_section`.

Output: one self-contained HTML file (inline CSS, inline SVG, no script, no external resource
except the links of "method §N" to the method document), byte-identical for the same results (no
clock, sorted iteration everywhere).
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path

import jinja2
from markupsafe import Markup, escape

from claims import registry
from claims.names import RESULTS_SCHEMA as SCHEMA
from claims.records import LEVELS, VERDICTS

from .atomic import atomic_write_text
from .common import LETTERS, VERDICT_HELP, direction, flat, fmt
from .diff import leaves
from .index import Index, spec_of
from .overview import grid_context, not_run_groups, summary_context
from .partial import partial_reasons
from .sections import controls_section, generic_section

TEMPLATES = Path(__file__).with_name("templates")
CHECKOUT = Path(__file__).resolve().parent.parent
#: The method document the "method §N.M" references of the thresholds' sources link to.
METHOD_DOC = CHECKOUT / "docs" / "method.md"
#: Environment variable: the address the report links "method §N.M" to (a URL of docs/method.md,
#: e.g. on the project's forge); default: the path of docs/method.md relative to the report.
METHOD_URL_ENV = "KPCA_METHOD_URL"
#: The link when neither is known (a report rendered in memory): relative to the repository root.
DEFAULT_METHOD_URL = "docs/method.md"
#: The first claim section's number (1 summary, 2 verdict grid).
FIRST_CLAIM_SECTION = 3


# ------------------------------------------------------------------------------------ validation
def validate_results(results) -> None:
    """Raise ValueError naming the first problem that keeps ``results`` from being rendered.

    Checks the schema id, the top-level fields and their types, and every record's claim, level,
    model, layer, head and verdict.
    """
    if not isinstance(results, dict):
        raise ValueError(f"the top level must be a JSON object, not {type(results).__name__}")
    schema = results.get("schema")
    if schema != SCHEMA:
        raise ValueError(f"schema is {schema!r}; this report reads {SCHEMA!r}")
    kinds = {"provenance": dict, "options": dict, "thresholds": dict, "models": dict,
             "records": list, "not_run": list, "complete": bool}
    for name, kind in kinds.items():
        if name not in results:
            raise ValueError(f"the field {name!r} is missing")
        if not isinstance(results[name], kind):
            raise ValueError(f"the field {name!r} must be a {kind.__name__}, "
                             f"not {type(results[name]).__name__}")
    for key, info in results["models"].items():
        if not isinstance(info, dict):
            raise ValueError(f"models[{key!r}] must be an object")
    for i, rec in enumerate(results["records"]):
        where = f"records[{i}]"
        if not isinstance(rec, dict):
            raise ValueError(f"{where} must be an object")
        where += f" ({rec.get('test_id', 'no test_id')})"
        for name in ("claim", "level", "model", "verdict"):
            if not isinstance(rec.get(name), str):
                raise ValueError(f"{where}: {name!r} must be a string, got {rec.get(name)!r}")
        if rec["level"] not in LEVELS:
            raise ValueError(f"{where}: level {rec['level']!r} is not one of {list(LEVELS)}")
        if rec["verdict"] not in VERDICTS:
            raise ValueError(f"{where}: verdict {rec['verdict']!r} is not one of {list(VERDICTS)}")
        for name in ("layer", "head"):
            value = rec.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise ValueError(f"{where}: {name!r} must be a non-negative integer or null, "
                                 f"got {value!r}")
        if rec["level"] == "head" and (rec.get("layer") is None or rec.get("head") is None):
            raise ValueError(f"{where}: a head record needs both 'layer' and 'head'")
        if rec["level"] == "layer" and rec.get("layer") is None:
            raise ValueError(f"{where}: a layer record needs 'layer'")


def load_results(path) -> dict:
    """Read a results.json, parsed strictly and validated against docs/results.schema.json
    (report/validate.py) and :func:`validate_results`; ValueError naming the file and the problem
    otherwise."""
    from . import validate

    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such results file")
    results = validate.read_json(path, "results file")
    try:
        validate_results(results)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    validate.check(results, f"results file {path}", "results")
    return results


# ------------------------------------------------------------------------------------ thresholds
def threshold_rows(thresholds: dict) -> list[dict]:
    """Every threshold entry, flattened: claim section, rule, condition and source.

    A rule is a table with ``value`` and ``direction`` (shown as ``metric direction value``);
    any other table with scalar fields (``max_share``, ``atol``/``rtol``) is shown field by field.
    A table without a ``source`` is shown with "no source recorded".
    """
    rows = []

    def walk(section: str, path: list[str], node: dict) -> None:
        scalars = {k: v for k, v in node.items()
                   if not isinstance(v, dict) and k not in ("source", "description")}
        if scalars or (path and "source" in node):
            if "value" in scalars and "direction" in scalars:
                cond = f"{path[-1]} {direction(scalars['direction'])} {fmt(scalars['value'])}"
            else:
                cond = ", ".join(f"{k} = {flat(v) if isinstance(v, list) else fmt(v)}"
                                 for k, v in sorted(scalars.items()))
            rows.append({"section": section, "rule": " · ".join(path) or "(section)",
                         "condition": cond, "whose": whose_rule(node.get("source") or "",
                                                                "ours" in path),
                         "source": node.get("source") or ("no source recorded" if path else
                                                          "section setting (no source recorded)"),
                         "sourced": bool(node.get("source"))})
        kinds = [k for k in ("supported", "refuted") if isinstance(node.get(k), dict)]
        others = sorted(k for k, v in node.items() if isinstance(v, dict) and k not in kinds)
        for k in kinds + others:
            walk(section, path + [k], node[k])

    for section in sorted(thresholds):
        node = thresholds[section]
        if isinstance(node, dict):
            walk(section, [], node)
    return rows




_FINDING = re.compile(r"operationalising P2 findings? ([0-9][0-9\- ,]*)")


def whose_rule(source: str, ours_set: bool = False) -> str:
    """Whose rule a threshold is, from its source: "P2, as P2 states it", "ours, operationalising
    P2 finding N", "P1", "P2-logs (shown, not judged)" or "ours" (method §9)."""
    text = source.strip()
    found = _FINDING.search(text)
    if found:
        return f"ours, operationalising P2 finding {found.group(1).strip(' ,')}"
    if text.startswith("P2, as P2 states it"):
        return "P2, as P2 states it"
    if text.startswith("P2-logs"):
        return "P2-logs (shown, not judged)"
    if text.startswith("P1"):
        return "P1"
    return "ours" if text or ours_set else "unknown"


_METHOD_REF = re.compile(r"method §(\d+(?:\.\d+)?)")


def method_links(text: str, method_url: str) -> Markup:
    """``text`` (escaped) with every "method §N.M" a link to its anchor ``#sN-M`` of the method
    document at ``method_url``."""
    out, last = [], 0
    for m in _METHOD_REF.finditer(text):
        anchor = "s" + m.group(1).replace(".", "-")
        out += [escape(text[last:m.start()]),
                Markup('<a class="method" href="{}#{}">{}</a>').format(method_url, anchor,
                                                                        m.group(0))]
        last = m.end()
    return Markup("").join(out + [escape(text[last:])])


def threshold_sections(thresholds: dict, method_url: str = DEFAULT_METHOD_URL) -> list[dict]:
    rows = threshold_rows(thresholds)
    for r in rows:
        r["linked"] = method_links(r["source"], method_url)
    return [{"name": s, "description": (thresholds[s] or {}).get("description", "")
             if isinstance(thresholds[s], dict) else "",
             "rows": [r for r in rows if r["section"] == s]} for s in sorted(thresholds)]


# ------------------------------------------------------------------------------------ provenance
def provenance_context(results: dict, index: Index) -> dict:
    prov = results["provenance"]
    run = [(k, flat(prov[k])) for k in sorted(prov) if k not in ("versions", "numeric_environment")]
    run += [("schema", results["schema"]), ("complete", fmt(results["complete"])),
            ("exit_status", fmt(results.get("exit_status")))]
    versions = sorted((k, v if v is not None else "not installed")
                      for k, v in (prov.get("versions") or {}).items())
    options = [(k, flat(v)) for k, v in sorted(results["options"].items())]
    # CPU, dispatch ISA, BLAS, threads, env variables: beside the versions (method §13)
    numeric = [(k, flat(v)) for k, v in leaves(prov.get("numeric_environment") or {}).items()]
    models = []
    for m in index.models():
        info = index.models_info.get(m)
        if info is None:
            models.append({"key": m, "missing": True})
            continue
        inp = info.get("input_set") or {}
        fields = [(k, flat(info[k])) for k in sorted(info) if k not in ("input_set", "key")]
        inp_fields = [(k, flat(inp[k])) for k in sorted(inp) if k not in ("names", "notes")]
        models.append({"key": m, "missing": False, "fields": fields, "input": inp_fields,
                       "notes": [str(n) for n in inp.get("notes") or []],
                       "names": [str(n) for n in inp.get("names") or []]})
    # options recorded on records that differ from the run's options (never expected)
    odd = sorted({r.test_id or "?" for r in index.records
                  if isinstance(r.options, dict) and r.options != results["options"]})
    return {"run": run, "versions": versions, "numeric": numeric, "options": options,
            "models": models,
            "odd_options": odd[:20], "n_odd_options": len(odd),
            "samples": results.get("samples") if isinstance(results.get("samples"), str) else None}


# ------------------------------------------------------------------------------------ rendering
def gate_context(results: dict) -> dict | None:
    """The CI gate's outcome (``results["gate"]``, written by ``--baseline``/``--require``): what
    was compared with what, verdict moves and metric deltas with their tolerances."""
    gate = results.get("gate")
    if not isinstance(gate, dict):
        return None
    path = gate.get("baseline") or ""
    name = Path(path).name if path else ""  # the report names files, never absolute paths
    if "error" in gate:
        error = gate["error"].replace(path, name) if path else gate["error"]
        return {"error": error, "summary": error, "pairs": [], "rows": [],
                "mode": gate.get("mode", ""), "compared": 0}

    def row(c: dict, kind: str) -> dict:
        metric = c.get("what") != "verdict"
        delta = (c["new"] - c["old"]) if metric and isinstance(c.get("new"), (int, float)) \
            and isinstance(c.get("old"), (int, float)) else None
        return {"kind": kind, "record": c["record"], "what": c["what"], "old": c["old"],
                "new": c["new"], "delta": delta, "tolerance": c.get("tolerance")}

    rows = [row(c, "regression") for c in gate.get("regressions", [])]
    rows += [row(c, "requirement not met") for c in gate.get("require", [])]
    rows += [row(c, "improvement") for c in gate.get("improvements", [])]
    summary = gate.get("summary", "").replace(path, name) if path else gate.get("summary", "")
    return {"error": None, "summary": summary, "mode": gate.get("mode", ""),
            "baseline": name, "pairs": gate.get("pairs", []),
            "compared": gate.get("compared", 0), "require": gate.get("require_text"),
            "rows": rows}


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["fmt"] = fmt
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


def claim_sections(results: dict, index: Index, first: int = FIRST_CLAIM_SECTION) -> list[dict]:
    """One section per claim of :meth:`Index.claims`, numbered from ``first``
    (:data:`FIRST_CLAIM_SECTION`, one more after a Controls section): its spec's
    ``report_context`` and ``template``, else the generic section."""
    out = []
    generic_partial = str(TEMPLATES / "sections" / "generic.html.j2")
    for number, claim in enumerate(index.claims(), start=first):
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


def build_context(results: dict, method_url: str = DEFAULT_METHOD_URL) -> dict:
    """Everything the template shows, computed from a validated results dict. The controls'
    records (method §12) make the Controls section; the summary, the grid and the claim sections
    show the models under test only; the provenance lists every model."""
    full_index = Index(results)
    control_section = controls_section.context(results)
    results, _ = controls_section.split(results)
    index = Index(results)
    not_run = not_run_groups(index)
    first = FIRST_CLAIM_SECTION + (1 if control_section else 0)
    sections = claim_sections(results, index, first)
    from .sections.opt_in_sections import context as opt_in_context

    opt = opt_in_context(results)  # --multiverse, --training-dynamics, --seeds (if run)
    return {
        "title": "Self-attention as kernel PCA: a reproducibility report",
        "date": results["provenance"].get("date", "not recorded"),
        "complete": results["complete"], "exit_status": results.get("exit_status"),
        "not_run": not_run, "n_not_run": len(results["not_run"]),
        "skipped": skipped_groups(results.get("skipped") or {}),
        "partial_reasons": partial_reasons(results, count_not_run=False),
        "merged": bool(results["provenance"].get("merged_from")),
        "summary": summary_context(results, index),
        "gate": gate_context(results),
        "controls": control_section,
        "grid_number": first - 1,
        "grid": grid_context(results, index, not_run),
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


def safe_link(url: str) -> bool:
    """Whether ``url`` may be an ``href`` of the report: an http(s) address with a host, or a
    relative reference (a path, ``#anchor`` or ``?query``). Anything else (``javascript:``,
    ``data:``, ``file:``, a scheme-relative ``//host``, control characters or spaces, which
    browsers strip before reading the scheme) is refused."""
    from urllib.parse import urlsplit

    url = str(url)
    if not url or any(ord(c) <= 32 or ord(c) == 127 for c in url) or url.startswith(("//", "\\")):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if parts.scheme:
        return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)
    return ":" not in url.split("/", 1)[0].split("#", 1)[0].split("?", 1)[0]


def method_url_for(out_path=None) -> str:
    """Where the report links "method §N.M": ``$KPCA_METHOD_URL`` if set; else docs/method.md
    relative to the report's folder when the report is written inside this checkout; else
    :data:`DEFAULT_METHOD_URL` (relative to the repository root)."""
    if os.environ.get(METHOD_URL_ENV):
        url = os.environ[METHOD_URL_ENV]
        if safe_link(url):
            return url
        import warnings

        warnings.warn(f"{METHOD_URL_ENV}={url[:80]!r} is neither an http(s) address nor a "
                      "relative path: the report links the method document relative to the "
                      "report instead", UserWarning, stacklevel=2)
    if out_path is not None:
        folder = Path(out_path).resolve().parent
        try:
            folder.relative_to(CHECKOUT)
        except ValueError:
            return DEFAULT_METHOD_URL
        return Path(os.path.relpath(METHOD_DOC, folder)).as_posix()
    return DEFAULT_METHOD_URL


def render_report(results: dict, *, method_url: str | None = None) -> str:
    """The report for a results dict, as one self-contained HTML document.

    ``method_url``: where "method §N.M" in the thresholds' sources links (default
    :func:`method_url_for`, without a report path).

    Raises
    ------
    ValueError
        When ``results`` does not follow the results schema (the message names the problem).
    """
    validate_results(results)
    if method_url is not None and not safe_link(method_url):
        raise ValueError(f"the method link {method_url[:80]!r} is neither an http(s) address "
                         "nor a relative path")
    context = _scrub(build_context(results, method_url or method_url_for()))
    return _environment().get_template("report.html.j2").render(**context)


# ------------------------------------------------------------------------- machine paths
HASH_LIMIT = 64 * 1024**2  # files larger than this are named without a hash (checkpoints carry theirs)
# An absolute POSIX path of at least two components, not inside a URL or a word ("s/layer").
_ABS_PATH = re.compile(r"""(?<![\w/:.~-])/(?:[^\s/<>"'`;,()]+/)+[^\s/<>"'`;,()]*""")


@lru_cache(maxsize=256)
def display_path(path: str) -> str:
    """How the report names a path: relative inside the checkout, the file name and its short
    sha256 outside (so no machine's folder layout is published)."""
    p = Path(path)
    try:
        return p.resolve().relative_to(CHECKOUT).as_posix() or "."
    except (ValueError, OSError, RuntimeError):
        pass
    name = p.name or path
    try:
        if p.is_file() and p.stat().st_size <= HASH_LIMIT:
            import hashlib

            digest = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
            return f"{name} (sha256 {digest})"
    except OSError:
        pass
    return name + ("/" if path.endswith("/") or p.is_dir() else "")


def scrub_paths(text: str) -> str:
    """``text`` with every absolute path in it replaced by :func:`display_path`."""
    return _ABS_PATH.sub(lambda m: display_path(m.group(0)), text)


def _scrub(obj):
    """The template context with absolute paths scrubbed from every plain string (inline SVG and
    other markup is left alone)."""
    if isinstance(obj, Markup):
        return obj
    if isinstance(obj, str):
        return scrub_paths(obj) if "/" in obj else obj
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_scrub(v) for v in obj)
    return obj



def write_report(results_path, out_path) -> Path:
    """Render ``results_path`` (a results.json) to ``out_path`` atomically; return ``out_path``.

    The HTML is written to a temporary file in the target folder and moved into place with
    ``os.replace``, so a reader never sees a half-written report.

    Raises
    ------
    ValueError
        When the results file is missing, unreadable, not JSON, or not in the results schema;
        the message names the file, and nothing is written.
    """
    results = load_results(results_path)
    return atomic_write_text(out_path, render_report(results, method_url=method_url_for(out_path)))
