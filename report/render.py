"""The HTML reproducibility report: results.json (schema ``kpca-claims/results/1``) → one HTML file.

The report reads results; it never decides a verdict. Every verdict, metric, null, threshold and
source shown comes from the results file (thresholds from ``results["thresholds"]``, the parsed
``claims/thresholds.toml`` of the run). The only constants here are descriptions of the claims and
P2-logs' published reference range for claim J, used when a record does not carry its own.

Output: one self-contained HTML file (inline CSS, inline SVG, no script, no external resource),
byte-identical for the same results (no clock, sorted iteration everywhere).
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path

import jinja2
from markupsafe import Markup

from claims.names import J_METRICS, V_METRICS
from claims.names import RESULTS_SCHEMA as SCHEMA

from . import svg
from .atomic import atomic_write_text

CLAIMS = ("V", "J", "E")
VERDICTS = ("supported", "refuted", "inconclusive", "undetermined")
LEVELS = ("head", "layer", "model", "series")
LETTERS = {"supported": "S", "refuted": "R", "inconclusive": "I", "undetermined": "U"}
E_ROUTES = ("log_raw", "log_standardized", "naive_float32")
E_STATS = ("max", "min", "mean", "median")
E_CONTROLS = (("learned", "learned V"), ("eigen", "eigenvectors (control)"),
              ("perturbed", "perturbed basis (control)"))
# P2-logs (method §3): log10(mean‖h‖² / mean‖φ‖²) after epoch 10, DeiT-Tiny and ViT-Tiny trained from
# scratch. Used only when a claim-J record carries no `reference` of its own.
P2_LOGS_LOG10_RATIO = (2.35, 3.63)
P2_LOGS_SOURCE = "P2-logs: after epoch 10, both models (method §3)"
TEMPLATES = Path(__file__).with_name("templates")

CLAIM_INFO = {
    "V": {"title": "Value vectors are the eigenvectors of the centred key Gram matrix",
          "source": "P1 §2; P2 finding 1; method §2", "unit": "head",
          "statement": "The learned value vectors V of each head equal the kernel-PCA value "
                       "matrix V̂ = G(I − 11ᵀ/N)A built from the keys' centred Gram eigenvectors."},
    "J": {"title": "Attention minimises the KPCA projection loss J_proj",
          "source": "P1 §2.2.1; P2 finding 2; method §3", "unit": "layer",
          "statement": "J_proj = mean over queries of ‖φ(q)‖² − ‖h‖² is a projection error: "
                       "non-negative, and falling over training."},
    "E": {"title": "Gram eigenvalue statistics justify V as eigenvectors",
          "source": "P1 §2.2.2; P2 finding 3; method §4", "unit": "head",
          "statement": "The Gram eigenvalue statistics are reproducible, and γ_i = (K̃â)_i/(N â_i) "
                       "is constant over i for the â recovered from the learned V."},
}
VERDICT_HELP = {
    "supported": "every supported-rule of the claim holds",
    "refuted": "every refuted-rule of the claim holds",
    "inconclusive": "neither set of rules holds in full",
    "undetermined": "the comparison is not determined by the inputs (e.g. V̂ is round-off)",
}


# ------------------------------------------------------------------------------------ formatting
def fmt(x, digits: int = 3) -> str:
    """A number for a table cell: ``digits`` significant digits, scientific outside [1e-3, 1e5);
    ``—`` for a missing value, ``yes``/``no`` for booleans; never a bare ``nan``."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN (non-finite)"
        if math.isinf(x):
            return "+∞" if x > 0 else "−∞"
        if x == 0:
            return "0"
        if 1e-3 <= abs(x) < 1e5:
            return f"{x:.{digits}g}"
        return f"{x:.{max(digits - 1, 0)}e}"
    return str(x)


def direction(d) -> str:
    """A threshold direction as a mathematical sign (``>=`` → ``≥``)."""
    return {">=": "≥", "<=": "≤", ">": ">", "<": "<"}.get(str(d), str(d))


def _mean_std(stat) -> tuple[str, str]:
    """(mean, std) texts from a ``{mean, std}`` dict (claim E statistics); ``—`` where missing."""
    if not isinstance(stat, dict):
        return fmt(stat), "—"
    return fmt(stat.get("mean")), fmt(stat.get("std"))


def slug(text: str) -> str:
    """An HTML id fragment: letters, digits, ``-`` and ``_`` only."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-") or "x"


def _range_text(values: list[float]) -> str:
    vals = [v for v in values if svg.finite(v)]
    if not vals:
        return "—"
    lo, hi = min(vals), max(vals)
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def _mean(values: list) -> float | None:
    vals = [float(v) for v in values if svg.finite(v)]
    return sum(vals) / len(vals) if vals else None


def _median(values: list) -> float | None:
    vals = sorted(float(v) for v in values if svg.finite(v))
    if not vals:
        return None
    m = len(vals) // 2
    return vals[m] if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2


def _log10(x) -> float | None:
    return math.log10(x) if svg.finite(x) and x > 0 else None


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
    """Read and validate a results.json; ValueError naming the file and the problem otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    try:
        results = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno})") from None
    try:
        validate_results(results)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return results


# ------------------------------------------------------------------------------------ indexing
def _unit_key(rec: dict) -> tuple:
    return (-1 if rec.get("layer") is None else rec["layer"],
            -1 if rec.get("head") is None else rec["head"], rec.get("test_id", ""))


class Index:
    """The records of a results file, grouped by (claim, model, level), each group sorted."""

    def __init__(self, results: dict):
        self.results = results
        self.groups: dict[tuple[str, str, str], list[dict]] = {}
        for rec in results["records"]:
            self.groups.setdefault((rec["claim"], rec["model"], rec["level"]), []).append(rec)
        for group in self.groups.values():
            group.sort(key=_unit_key)
        self.models_info = results["models"]

    def get(self, claim: str, model: str, level: str) -> list[dict]:
        return self.groups.get((claim, model, level), [])

    def model_record(self, claim: str, model: str) -> dict | None:
        recs = self.get(claim, model, "model")
        return recs[0] if recs else None

    def claims(self) -> list[str]:
        """V, J, E always (a missing one reads "not run"), then any other claim found, sorted."""
        extra = sorted({c for c, _, _ in self.groups} - set(CLAIMS))
        return list(CLAIMS) + extra

    def models(self) -> list[str]:
        """Model keys (not series): the recorded models, then any model only records name;
        real models first, controls after, each group sorted by key."""
        keys = set(self.models_info)
        keys |= {m for (_, m, level) in self.groups if level != "series"}
        return sorted(keys, key=lambda k: (bool(self.models_info.get(k, {}).get("control")), k))

    def series(self) -> list[dict]:
        return sorted((r for (c, _, lv), g in self.groups.items() if lv == "series" for r in g),
                      key=lambda r: (r["claim"], r["model"], r.get("test_id", "")))

    def units(self, claim: str, model: str) -> list[dict]:
        """Head and layer records of a claim for a model."""
        return self.get(claim, model, "head") + self.get(claim, model, "layer")

    def layers_heads(self, model: str) -> tuple[list[int], list[int]]:
        """The layers and heads this run covered for a model (the union over claims, including
        the model records' ``layers``/``heads``); the model's full range when nothing says."""
        layers, heads = set(), set()
        for (_, m, level), group in self.groups.items():
            if m != model or level == "series":
                continue
            for rec in group:
                if rec.get("layer") is not None:
                    layers.add(rec["layer"])
                if rec.get("head") is not None:
                    heads.add(rec["head"])
                if level == "model":
                    layers.update(x for x in rec.get("layers") or [] if isinstance(x, int))
                    heads.update(x for x in rec.get("heads") or [] if isinstance(x, int))
        info = self.models_info.get(model, {})
        if not layers and isinstance(info.get("n_layers"), int):
            layers = set(range(info["n_layers"]))
        if not heads and isinstance(info.get("n_heads"), int):
            heads = set(range(info["n_heads"]))
        return sorted(layers), sorted(heads)


def _count(records: list[dict]) -> dict[str, int]:
    out = {v: 0 for v in VERDICTS}
    for r in records:
        out[r["verdict"]] += 1
    return out


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "none"


# ------------------------------------------------------------------------------------ not run
# The claim each test file of claims/ checks: labels not-run node ids of a claim that left no record.
TEST_FILE_CLAIMS = {"test_value_vectors.py": "V", "test_projection_loss.py": "J",
                    "test_gram_spectrum.py": "E"}


def _test_function(node_id: str) -> str:
    """``claims/test_x.py::test_f[param]`` → ``test_f``."""
    return node_id.split("::")[-1].split("[", 1)[0]


def _node_model(node_id: str, models: list[str]) -> str:
    """The model a node id's parameter names (the longest model key it starts with)."""
    param = node_id.split("[", 1)[1].rstrip("]") if "[" in node_id else ""
    hits = [m for m in models if param == m or param.startswith(m + "-")]
    return max(hits, key=len) if hits else "(unknown model)"


def not_run_groups(index: Index) -> list[dict]:
    """The not-run node ids grouped by (claim, test function, model), with counts and examples."""
    func_claim = {}
    for rec in index.results["records"]:
        func_claim.setdefault(_test_function(rec.get("test_id", "")), rec["claim"])
    models = index.models()
    groups: dict[tuple[str, str, str], list[str]] = {}
    for node in sorted(str(n) for n in index.results["not_run"]):
        func = _test_function(node)
        file_claim = TEST_FILE_CLAIMS.get(node.split("::")[0].rsplit("/", 1)[-1], "?")
        key = (func_claim.get(func, file_claim), func, _node_model(node, models))
        groups.setdefault(key, []).append(node)
    return [{"claim": c, "function": f, "model": m, "count": len(ids), "examples": ids[:3]}
            for (c, f, m), ids in sorted(groups.items())]


# ------------------------------------------------------------------------------------ summary
def setup_differences(results: dict, index: Index) -> list[dict]:
    """Where this run's setup differs from P2's, read from the run's options and models.

    Each row: aspect, this run, P2 (as method §8 records it), and whether it differs.
    """
    opts = results["options"]
    infos = [index.models_info.get(m, {}) for m in index.models()]
    text_models = [i.get("key", "?") for i in infos if i.get("modality") == "text"]
    in_model = sorted(i.get("key", "?") for i in infos if i.get("standardized_qk_in_model"))
    dtype = opts.get("dtype") or results["provenance"].get("dtype") or "not recorded"
    std = opts.get("standardize")
    rows = [{
        "aspect": "Eigenvector signs",
        "ours": opts.get("sign_rule") or "each eigenvector's sign fixed so that its entry of "
                                           "largest magnitude is positive (independent of the "
                                           "eigensolver)",
        "p2": "no sign rule stated", "differs": True}]
    rows.append({
        "aspect": "Padding tokens (text models)",
        "ours": (opts.get("padding") or "excluded through the attention mask")
        + (f" — text models in this run: {', '.join(sorted(text_models))}" if text_models
           else " — no text model in this run"),
        "p2": "P2's language scripts include padding (method §1)", "differs": bool(text_models)})
    rows.append({
        "aspect": "Precision of Gram matrices and spectra",
        "ours": f"{dtype}, normalised Gram computed in log space (entries in (0, 1])",
        "p2": "exp(S) directly; P2 reports NaN for some models without key standardisation "
              "(method §1)", "differs": True})
    std_text = ("on: keys and queries standardised per token before the kernel" if std
                else "off: raw keys and queries" if std is not None else "not recorded")
    if in_model:
        std_text += f"; standardised inside the model itself: {', '.join(in_model)}"
    rows.append({
        "aspect": "Key/query standardisation", "ours": std_text,
        "p2": "standardises keys before its eigenvalue statistics (method §1); claim E here "
              "reports raw and standardised routes side by side", "differs": not std})
    conv = opts.get("axis_convention")
    conv_text = {"p2": "unit eigenvectors ‖a_m‖ = 1 (P2's convention)",
                 "kpca": "a_m/√μ_m, unit axes in feature space (not P2's convention)"}
    rows.append({"aspect": "Axis normalisation",
                 "ours": conv_text.get(conv, f"{conv!r}" if conv else "not recorded"),
                 "p2": "unit eigenvectors (method §1)", "differs": conv != "p2"})
    n_req = opts.get("n_samples_requested")
    used = sorted({(i.get("input_set") or {}).get("n_samples") for i in infos} - {None})
    rows.append({"aspect": "Samples per model",
                 "ours": f"{fmt(n_req)} requested" + (f"; used {', '.join(map(str, used))}"
                                                      if used else ""),
                 "p2": "100 (value vectors), 25 (eigenvalue statistics) (method §5)",
                 "differs": n_req != 100})
    rows.append({"aspect": "Chance level",
                 "ours": "every claim-V metric beside its value against a random orthonormal "
                         "basis (seeded from the test id)",
                 "p2": "not part of P2's protocol (method §2: ours)", "differs": True})
    return rows


def summary_context(results: dict, index: Index) -> dict:
    """Scope, method and result counts for the report's opening section."""
    claims = []
    for c in index.claims():
        info = CLAIM_INFO.get(c, {"title": f"claim {c}", "source": "", "unit": "unit",
                                  "statement": ""})
        section = results["thresholds"].get(f"claim_{c.lower()}", {})
        models_run = [m for m in index.models() if index.units(c, m) or index.model_record(c, m)]
        model_counts = _count([r for m in index.models() for r in index.get(c, m, "model")])
        unit_counts = _count([r for m in index.models() for r in index.units(c, m)])
        series = [r for r in index.series() if r["claim"] == c]
        claims.append({
            "letter": c, "title": info["title"] if c in CLAIM_INFO else
            section.get("description", f"claim {c}"),
            "source": info["source"], "statement": info["statement"],
            "models_run": models_run, "model_counts": model_counts,
            "unit_counts": unit_counts, "series_counts": _count(series),
            "n_series": len(series),
            "units": {"head": "heads", "layer": "layers"}.get(info["unit"], "units"),
        })
    models = []
    for m in index.models():
        info = index.models_info.get(m, {})
        inp = info.get("input_set") or {}
        layers, heads = index.layers_heads(m)
        models.append({
            "key": m, "label": info.get("label", "not recorded (no provenance for this model)"),
            "modality": info.get("modality", "—"), "control": bool(info.get("control")),
            "shape": (f"{fmt(info.get('n_layers'))} layers × {fmt(info.get('n_heads'))} heads × "
                      f"head dim {fmt(info.get('head_dim'))}"),
            "selection": f"{len(layers)} layers × {len(heads)} heads checked",
            "inputs": (f"{fmt(inp.get('n_samples'))} {_plural(inp.get('kind'), inp.get('n_samples'))}"
                       f" from {inp.get('source', 'unrecorded source')}") if inp else "not recorded",
        })
    return {"claims": claims, "models": models,
            "differences": setup_differences(results, index),
            "options": results["options"], "n_records": len(results["records"])}


# ------------------------------------------------------------------------------------ grid
def grid_context(results: dict, index: Index, not_run: list[dict]) -> dict:
    """The claims × models verdict grid: the model-level verdict and the unit verdict counts."""
    pending = {(g["claim"], g["model"]) for g in not_run}
    rows = []
    for m in index.models():
        info = index.models_info.get(m, {})
        cells = []
        for c in index.claims():
            rec = index.model_record(c, m)
            units = index.units(c, m)
            counts = _count(units)
            unit_name = {"head": "heads", "layer": "layers"}.get(
                CLAIM_INFO.get(c, {}).get("unit", ""), "units")
            if rec is None and not units:
                cells.append({"claim": c, "verdict": None, "word": "not run",
                              "counts": [], "note": "interrupted" if (c, m) in pending else
                              "no record for this claim and model"})
                continue
            note = "" if rec else ("model-level test not run" if (c, m) in pending or
                                   not results["complete"] else "no model-level record")
            cells.append({"claim": c, "verdict": rec["verdict"] if rec else None,
                          "word": rec["verdict"] if rec else "no model verdict",
                          "counts": [(v, n) for v, n in counts.items() if n],
                          "n_units": len(units), "unit_name": unit_name, "note": note})
        rows.append({"model": m, "control": bool(info.get("control")),
                     "label": info.get("label", ""), "cells": cells})
    return {"claims": index.claims(), "rows": rows}


# ------------------------------------------------------------------------------------ claim V
def _with_ci(value, rec: dict | None, name: str, key: str = "ci") -> str:
    """``value [lo, hi]``: a metric with its 95% bootstrap CI from ``rec[key]`` (method §7),
    or the value alone for records without one."""
    ci = ((rec or {}).get(key) or {}).get(name)
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return f"{fmt(value)} [{fmt(ci[0])}, {fmt(ci[1])}]"
    return fmt(value)


def _chance_text(rec: dict | None, name: str) -> str:
    """The test against chance of one metric: "yes (p_adj 0.001)" / "no (...)" / "—"."""
    test = ((rec or {}).get("vs_null") or {}).get(name)
    if not isinstance(test, dict):
        return "—"
    word = "yes" if test.get("above_chance") else "no"
    if test.get("can_reject") is False:
        word += ", too few samples to reject"
    return f"{word} (adjusted p {fmt(test.get('p_adjusted'))})"


def _p2_code_rows(mrec: dict | None) -> list[dict]:
    """Exact vs P2-code values (method §8) of claim V's sign-dependent metrics, model level."""
    p2 = (mrec or {}).get("p2_code") or {}
    # on a subset of samples (method §8.3) the exact column is over the same units
    exact_means = (mrec or {}).get("p2_code_exact") or (mrec or {}).get("metrics") or {}
    rows = []
    for name in ("direct_cosine", "optimal_cosine", "pearson"):
        exact, other = exact_means.get(name), p2.get(name)
        if isinstance(other, (int, float)) and isinstance(exact, (int, float)):
            rows.append({"metric": name, "exact": fmt(exact, 4), "p2_code": fmt(other, 4),
                         "diff": fmt(other - exact, 2)})
    return rows


def _head_matrix(records: list[dict], layers: list[int], heads: list[int], value_fn):
    """``value_fn(record)`` placed at (layer, head); None where there is no record."""
    at = {(r["layer"], r["head"]): r for r in records}
    return [[value_fn(at[(lay, h)]) if (lay, h) in at else None for h in heads] for lay in layers]


def _rule_marks(thresholds: dict, section: str, metric: str) -> list[svg.Tick]:
    """Colour-bar marks for every threshold on ``metric`` in a thresholds section."""
    out = []
    for kind in ("supported", "refuted"):
        rule = thresholds.get(section, {}).get(kind, {}).get(metric)
        if isinstance(rule, dict) and svg.finite(rule.get("value")):
            label = f"{kind} {direction(rule.get('direction'))} {fmt(rule['value'])}"
            out.append(svg.Tick(float(rule["value"]), label, True))
    return out


def _rules_text(thresholds: dict, section: str, metric: str) -> str:
    parts = []
    for kind in ("supported", "refuted"):
        rule = thresholds.get(section, {}).get(kind, {}).get(metric)
        if isinstance(rule, dict):
            parts.append(f"{kind} if {direction(rule.get('direction', '?'))} "
                         f"{fmt(rule.get('value'))}")
    return "; ".join(parts) or "—"


def _tooltip(rec: dict | None, text: str) -> str:
    """A heatmap cell's hover text (the model is the heatmap's own, so it is not repeated)."""
    if rec is None:
        return ""
    return f"layer {rec['layer']} head {rec['head']}: {text}; {rec['verdict']}"


def claim_v_section(results: dict, index: Index, model: str) -> dict | None:
    """Claim V for one model: heatmap of optimal cosine with its null, and the model table."""
    heads_recs = index.get("V", model, "head")
    mrec = index.model_record("V", model)
    if not heads_recs and not mrec:
        return None
    layers, heads = index.layers_heads(model)
    sid = slug(model)
    values = _head_matrix(heads_recs, layers, heads,
                          lambda r: (r.get("metrics") or {}).get("optimal_cosine"))
    marks = _head_matrix(heads_recs, layers, heads, lambda r: LETTERS[r["verdict"]])
    tips = _head_matrix(heads_recs, layers, heads, lambda r: _tooltip(
        r, f"optimal cosine {_with_ci((r.get('metrics') or {}).get('optimal_cosine'), r, 'optimal_cosine')} "
                  f"(null {fmt((r.get('null') or {}).get('optimal_cosine'))}, above chance: "
                  f"{_chance_text(r, 'optimal_cosine')}), "
                  f"{fmt(r.get('n_used'))}/{fmt(r.get('n_samples'))} used"))
    tips = [[t or "" for t in row] for row in tips]
    nulls = [(r.get("null") or {}).get("optimal_cosine") for r in heads_recs]
    null_mean = _mean(nulls)
    scale = svg.ColourScale(0.0, 1.0, label="optimal cosine (mean over determined samples)")
    ticks = svg.scale_ticks(scale)
    if null_mean is not None:
        ticks.append(svg.Tick(null_mean, f"null (chance) ≈ {fmt(null_mean)}", True))
    ticks += _rule_marks(results["thresholds"], "claim_v", "optimal_cosine")
    cell = svg.fit_cells(len(layers), len(heads))
    table = []
    if mrec:
        for name in V_METRICS:
            if name in (mrec.get("metrics") or {}):
                table.append({"metric": name,
                              "value": _with_ci(mrec["metrics"][name], mrec, name),
                              "null": _with_ci((mrec.get("null") or {}).get(name), mrec, name,
                                               "ci_null"),
                              "std": fmt((mrec.get("std") or {}).get(name)),
                              "chance": _chance_text(mrec, name),
                              "rules": _rules_text(results["thresholds"], "claim_v", name)})
    return {
        "model": model, "id": f"heatmap-V-{sid}",
        "heatmap": Markup(svg.heatmap(values, layers, heads, scale, f"heatmap-V-{sid}",
                                      marks=marks, tooltips=tips, cell=cell)),
        "legend": Markup(svg.colour_bar(scale, f"legend-V-{sid}", ticks,
                                        note="white cell: no record for that head")),
        "null_mean": fmt(null_mean), "null_range": _range_text(nulls),
        "counts": _count(heads_recs), "n_heads": len(heads_recs),
        "model_record": mrec, "table": table, "p2_code": _p2_code_rows(mrec),
        "verdicts": (mrec or {}).get("verdicts") or {},
        "head_verdicts_by_rules": (mrec or {}).get("head_verdicts_by_rules") or {},
        "values_table": Markup(svg.values_grid(
            _head_matrix(heads_recs, layers, heads, lambda r: (
                f"{fmt((r.get('metrics') or {}).get('optimal_cosine'))} {LETTERS[r['verdict']]} "
                f"(null {fmt((r.get('null') or {}).get('optimal_cosine'))})")),
            layers, heads, f"values-V-{sid}", f"Values of the claim-V heatmap of {model} as a table",
            note="optimal cosine, the head's verdict letter, and its null (chance) level")),
        "undetermined_reason": next((r.get("reason") for r in heads_recs
                                     if r["verdict"] == "undetermined" and r.get("reason")), None),
    }


# ------------------------------------------------------------------------------------ claim J
def _reference_bands(rec: dict | None, thresholds: dict) -> list[svg.Band]:
    """Reference ranges of log10(‖h‖²/‖φ‖²): entries whose key contains "log10_ratio" with a
    [lo, hi] pair, taken from the record's ``reference``, else from the run's thresholds section
    ``claim_j_reference``, else P2-logs' published range (method §3)."""
    for ref in ((rec or {}).get("reference"), thresholds.get("claim_j_reference")):
        bands = []
        for key in sorted(ref or {}):
            val = ref[key]
            if ("log10_ratio" in key and isinstance(val, (list, tuple)) and len(val) == 2
                    and all(svg.finite(v) for v in val)):
                bands.append(svg.Band(float(min(val)), float(max(val)),
                                      f"{key}: 10^{fmt(min(val))}–10^{fmt(max(val))}"))
        if bands:
            return bands
    lo, hi = P2_LOGS_LOG10_RATIO
    return [svg.Band(lo, hi, f"P2-logs 10^{lo}–10^{hi} (after epoch 10)")]


def _threshold_lines(thresholds: dict, section: str, metric: str) -> list[svg.HLine]:
    """Dashed lines for every threshold on a log10 metric, labelled as powers of ten."""
    out = []
    colours = {"supported": "#1b7837", "refuted": "#b2182b"}
    for kind in ("supported", "refuted"):
        rule = thresholds.get(section, {}).get(kind, {}).get(metric)
        if isinstance(rule, dict) and svg.finite(rule.get("value")):
            out.append(svg.HLine(float(rule["value"]),
                                 f"{kind} {direction(rule.get('direction'))} "
                                 f"10^{fmt(rule['value'])}", colours[kind]))
    return out


def claim_j_section(results: dict, index: Index, model: str) -> dict | None:
    """Claim J for one model: per-layer magnitudes of ‖φ‖² and ‖h‖², their ratio beside P2-logs'
    range, and a layer × head heatmap of the per-head log10 ratio."""
    layer_recs = index.get("J", model, "layer")
    mrec = index.model_record("J", model)
    if not layer_recs and not mrec:
        return None
    sid = slug(model)
    if layer_recs:
        xs = tuple(r["layer"] for r in layer_recs)
        met = [r.get("metrics") or {} for r in layer_recs]
        verdict_marks = [(r["layer"], LETTERS[r["verdict"]]) for r in layer_recs]
    else:  # only the model record: its per-layer lists
        per = mrec.get("per_layer") or {}
        n = max((len(v) for v in per.values() if isinstance(v, list)), default=0)
        xs = tuple((mrec.get("layers") or list(range(n)))[:n])
        met = [{k: (per.get(k) or [None] * n)[i] for k in J_METRICS} for i in range(n)]
        verdict_marks = []
    phi = tuple(_log10(m.get("phi_sq_mean")) for m in met)
    hsq = tuple(_log10(m.get("h_sq_mean")) for m in met)
    ratio = tuple(m.get("log10_ratio") if svg.finite(m.get("log10_ratio")) else None for m in met)
    magnitude = svg.line_plot(
        [svg.Series("mean ‖φ(q)‖²", xs, phi, "#1f78b4", "circle"),
         svg.Series("mean ‖h‖²", xs, hsq, "#e66101", "square")],
        f"jmag-{sid}", "layer", "layer mean (log scale)",
        title="Magnitudes per layer", height=230)
    bands = _reference_bands(None, results["thresholds"])
    ratio_plot = svg.line_plot(
        [svg.Series("‖h‖² / ‖φ‖² (layer mean)", xs, ratio, "#5e3c99", "diamond")],
        f"jratio-{sid}", "layer", "ratio ‖h‖²/‖φ‖² (log scale)", bands=bands,
        hlines=_threshold_lines(results["thresholds"], "claim_j", "log10_ratio"),
        top_marks=verdict_marks, title="Ratio per layer (letters: layer verdicts)", height=230)
    # per-head heatmap of log10 ratio
    heatmap = legend = values_table = None
    if layer_recs:
        _, heads_all = index.layers_heads(model)
        n_heads = max((len((r.get("per_head") or {}).get("log10_ratio") or [])
                       for r in layer_recs), default=0)
        recorded = layer_recs[0].get("heads")
        heads = (recorded if isinstance(recorded, list) and len(recorded) == n_heads
                 else heads_all if len(heads_all) == n_heads else list(range(n_heads)))
        if n_heads:
            layers = [r["layer"] for r in layer_recs]
            values, tips = [], []
            for r in layer_recs:
                lst = list((r.get("per_head") or {}).get("log10_ratio") or [])
                lst += [None] * (n_heads - len(lst))
                values.append([v if svg.finite(v) else None for v in lst])
                tips.append([f"layer {r['layer']} head {h}: log10 ratio {fmt(v)}; layer "
                             f"{r['verdict']}" for h, v in zip(heads, lst)])
            finite_vals = [v for row in values for v in row if v is not None]
            lo = math.floor(min(finite_vals + [b.lo for b in bands]))
            hi = math.ceil(max(finite_vals + [b.hi for b in bands]))
            scale = svg.ColourScale(float(lo), float(max(hi, lo + 1)),
                                    label="ratio ‖h‖²/‖φ‖² per head (log scale)")
            ticks = [svg.Tick(float(k), svg.power_label(k)) for k in range(lo, max(hi, lo + 1) + 1)]
            ticks += [svg.Tick(b.lo, f"reference low 10^{fmt(b.lo)}", True) for b in bands[:1]]
            ticks += [svg.Tick(b.hi, f"reference high 10^{fmt(b.hi)}", True) for b in bands[:1]]
            heatmap = Markup(svg.heatmap(
                values, layers, heads, scale, f"heatmap-J-{sid}", tooltips=tips,
                cell=svg.fit_cells(len(layers), len(heads)),
                row_notes=[f"{LETTERS[r['verdict']]}" for r in layer_recs]))
            legend = Markup(svg.colour_bar(scale, f"legend-J-{sid}", ticks,
                                           note="letter right of a row: the layer's verdict"))
            values_table = Markup(svg.values_grid(
                [[None if v is None else fmt(v) for v in row] for row in values], layers, heads,
                f"values-J-{sid}", f"Values of the claim-J heatmap of {model} as a table",
                note="log10 of the ratio ‖h‖²/‖φ‖² per head"))
    table = []
    if mrec:
        for name in J_METRICS:
            if name in (mrec.get("metrics") or {}):
                table.append({"metric": name, "value": _with_ci(mrec["metrics"][name], mrec, name),
                              "rules": _rules_text(results["thresholds"], "claim_j", name)})
        p1 = mrec.get("p1_code") or {}
        note = p1.get("label") if isinstance(p1.get("label"), str) else "P1's logged quantity"
        for name, value in sorted(p1.items()):
            if name != "label":
                table.append({"metric": f"p1-code variant: {name}", "value": fmt(value),
                              "rules": f"{note} (method §3); not judged"})
    return {"model": model, "id": f"jmag-{sid}", "heatmap_id": f"heatmap-J-{sid}",
            "magnitude": Markup(magnitude), "ratio": Markup(ratio_plot),
            "heatmap": heatmap, "legend": legend, "values_table": values_table,
            "counts": _count(layer_recs),
            "n_layers": len(layer_recs), "model_record": mrec, "table": table,
            "bands": [b.label for b in bands]}


def claim_j_series(results: dict, rec: dict, n: int) -> dict:
    """A training series (claim J, method §3): J_proj, ‖φ‖², ‖h‖² against step on a log y scale."""
    pts = sorted((p for p in rec.get("series") or [] if isinstance(p, dict)),
                 key=lambda p: (p.get("step") if svg.finite(p.get("step")) else math.inf))
    steps = tuple(p.get("step") for p in pts)
    j = [p.get("j_proj") for p in pts]
    sid = f"{slug(rec['model'])}-{n}"
    neg = tuple(svg.finite(v) and v < 0 for v in j)
    terms = svg.line_plot(
        [svg.Series("|J_proj| (hollow: J_proj < 0)", steps,
                    tuple(_log10(abs(v)) if svg.finite(v) else None for v in j), "#000000",
                    "circle", hollow=neg),
         svg.Series("‖φ(q)‖²", steps, tuple(_log10(p.get("phi_sq_mean")) for p in pts),
                    "#1f78b4", "triangle", dashed=True),
         svg.Series("‖h‖²", steps, tuple(_log10(p.get("h_sq_mean")) for p in pts),
                    "#e66101", "square", dashed=True)],
        f"jseries-{sid}", "training step", "value (log scale)",
        x_integer=all(isinstance(s, int) for s in steps), title="J_proj and its two terms")
    bands = _reference_bands(rec, results["thresholds"])
    ratio = svg.line_plot(
        [svg.Series("‖h‖²/‖φ‖²", steps,
                    tuple(p.get("log10_ratio") if svg.finite(p.get("log10_ratio")) else None
                          for p in pts), "#5e3c99", "diamond")],
        f"jseries-ratio-{sid}", "training step", "ratio ‖h‖²/‖φ‖² (log scale)", bands=bands,
        hlines=_threshold_lines(results["thresholds"], "claim_j", "log10_ratio"),
        x_integer=all(isinstance(s, int) for s in steps), title="Ratio against P2-logs' range")
    trend = rec.get("trend") or {}
    acc = [p.get("test_accuracy") for p in pts]
    return {"name": rec["model"], "id": f"jseries-{sid}", "verdict": rec["verdict"],
            "terms": Markup(terms), "ratio": Markup(ratio), "n_points": len(pts),
            "n_negative": sum(neg), "steps": _range_text(list(steps)),
            "accuracy": _range_text(acc),
            "trend": [(k, fmt(trend[k]) if not isinstance(trend[k], str) else trend[k])
                      for k in sorted(trend)],
            "reference": [(k, json.dumps(v, sort_keys=True) if not isinstance(v, str) else v)
                          for k, v in sorted((rec.get("reference") or {}).items())],
            "bands": [b.label for b in bands],
            "evidence": rec.get("evidence") or rec.get("reason")}


# ------------------------------------------------------------------------------------ claim E
def claim_e_section(results: dict, index: Index, model: str) -> dict | None:
    """Claim E for one model: learned relative γ spread beside its two controls (three heatmaps
    on one log colour scale), and the eigenvalue-statistics table of all three routes."""
    head_recs = index.get("E", model, "head")
    mrec = index.model_record("E", model)
    if not head_recs and not mrec:
        return None
    sid = slug(model)
    panels, legend = [], None
    if head_recs:
        layers, heads = index.layers_heads(model)
        everything = [(r.get("metrics") or {}).get(k) for r in head_recs for k, _ in E_CONTROLS]
        scale = svg.decade_scale(everything, label="relative γ spread (log scale)")
        cell = svg.fit_cells(len(layers), len(heads), panels=3)
        for key, label in E_CONTROLS:
            values = _head_matrix(head_recs, layers, heads,
                                  lambda r, k=key: (r.get("metrics") or {}).get(k))
            marks = (_head_matrix(head_recs, layers, heads, lambda r: LETTERS[r["verdict"]])
                     if key == "learned" else None)
            tips = None
            if key == "learned":  # one tooltip per head carries all three spreads
                tips = _head_matrix(head_recs, layers, heads, lambda r: _tooltip(r, (
                    "relative spread learned {}, eigen {}, perturbed {}; absolute learned {}; "
                    "position {}; closer to eigen in {} of samples").format(
                    *(fmt((r.get("metrics") or {}).get(k)) for k, _ in E_CONTROLS),
                    fmt((r.get("abs") or {}).get("learned")),
                    _with_ci((r.get("metrics") or {}).get("gamma_position"), r, "gamma_position"),
                    fmt(r.get("closer_to_eigen_share")))))
                tips = [[t or "" for t in row] for row in tips]
            panels.append({"label": label, "svg": Markup(svg.heatmap(
                values, layers, heads, scale,
                f"heatmap-E-{sid}" if key == "learned" else f"heatmap-E-{key}-{sid}",
                marks=marks, tooltips=tips, cell=cell, title=label))})
        ticks = svg.scale_ticks(scale)
        for key, label in E_CONTROLS:
            med = _median([(r.get("metrics") or {}).get(key) for r in head_recs])
            if med is not None and med > 0:
                ticks.append(svg.Tick(med, f"median {key} {fmt(med)}", True))
        legend = Markup(svg.colour_bar(
            scale, f"legend-E-{sid}", ticks,
            note=f"values at or below {fmt(scale.vmin)} drawn at the low end; white: no record"))
    routes = []
    if mrec:
        r_all = mrec.get("routes") or {}
        for name in list(E_ROUTES) + sorted(set(r_all) - set(E_ROUTES)):
            if name not in r_all:
                continue
            route = r_all[name] or {}
            stats = route.get("stats") or {}
            routes.append({"name": name,
                           "stats": [_mean_std(stats.get(s)) for s in E_STATS],
                           "n_samples": fmt(route.get("n_samples")),
                           "n_nonfinite": fmt(route.get("n_nonfinite")),
                           "nonfinite_where": route.get("nonfinite_where")})
    ratios = [fmt((mrec or {}).get("route_ratios", {}).get(s)) for s in E_STATS] if mrec else []
    metrics = [{"metric": k, "value": _with_ci(v, mrec, k),
                "rules": _rules_text(results["thresholds"], "claim_e", k)}
               for k, v in sorted(((mrec or {}).get("metrics") or {}).items())]
    values_table = None
    if head_recs:
        layers, heads = index.layers_heads(model)
        values_table = Markup(svg.values_grid(
            _head_matrix(head_recs, layers, heads, lambda r: " / ".join(
                fmt((r.get("metrics") or {}).get(k)) for k, _ in E_CONTROLS)
                + f" {LETTERS[r['verdict']]}"),
            layers, heads, f"values-E-{sid}", f"Values of the claim-E heatmaps of {model} as a table",
            note="relative γ spread: " + " / ".join(k for k, _ in E_CONTROLS)
                 + ", then the head's verdict letter"))
    return {"model": model, "id": f"heatmap-E-{sid}", "table_id": f"e-stats-{sid}",
            "values_table": values_table, "panels": panels, "legend": legend, "counts": _count(head_recs),
            "n_heads": len(head_recs), "model_record": mrec, "routes": routes,
            "ratios": ratios, "metrics": metrics}


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
                cond = ", ".join(f"{k} = {_flat(v) if isinstance(v, list) else fmt(v)}"
                                 for k, v in sorted(scalars.items()))
            rows.append({"section": section, "rule": " · ".join(path) or "(section)",
                         "condition": cond,
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


def threshold_sections(thresholds: dict) -> list[dict]:
    rows = threshold_rows(thresholds)
    return [{"name": s, "description": (thresholds[s] or {}).get("description", "")
             if isinstance(thresholds[s], dict) else "",
             "rows": [r for r in rows if r["section"] == s]} for s in sorted(thresholds)]


# ------------------------------------------------------------------------------------ provenance
def _flat(value) -> str:
    """A provenance value in full: strings as they are, numbers unrounded, containers as JSON."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return fmt(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def provenance_context(results: dict, index: Index) -> dict:
    prov = results["provenance"]
    run = [(k, _flat(prov[k])) for k in sorted(prov) if k != "versions"]
    run += [("schema", results["schema"]), ("complete", fmt(results["complete"])),
            ("exit_status", fmt(results.get("exit_status")))]
    versions = sorted((k, v if v is not None else "not installed")
                      for k, v in (prov.get("versions") or {}).items())
    options = [(k, _flat(v)) for k, v in sorted(results["options"].items())]
    models = []
    for m in index.models():
        info = index.models_info.get(m)
        if info is None:
            models.append({"key": m, "missing": True})
            continue
        inp = info.get("input_set") or {}
        fields = [(k, _flat(info[k])) for k in sorted(info) if k not in ("input_set", "key")]
        inp_fields = [(k, _flat(inp[k])) for k in sorted(inp) if k not in ("names", "notes")]
        models.append({"key": m, "missing": False, "fields": fields, "input": inp_fields,
                       "notes": [str(n) for n in inp.get("notes") or []],
                       "names": [str(n) for n in inp.get("names") or []]})
    # options recorded on records that differ from the run's options (never expected)
    odd = sorted({r.get("test_id", "?") for r in results["records"]
                  if isinstance(r.get("options"), dict) and r["options"] != results["options"]})
    return {"run": run, "versions": versions, "options": options, "models": models,
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


def build_context(results: dict) -> dict:
    """Everything the template shows, computed from a validated results dict."""
    index = Index(results)
    not_run = not_run_groups(index)
    models = index.models()
    return {
        "title": "Self-attention as kernel PCA: a reproducibility report",
        "date": results["provenance"].get("date", "not recorded"),
        "complete": results["complete"], "exit_status": results.get("exit_status"),
        "not_run": not_run, "n_not_run": len(results["not_run"]),
        "summary": summary_context(results, index),
        "gate": gate_context(results),
        "grid": grid_context(results, index, not_run),
        "series_rows": [{"name": r["model"], "claim": r["claim"], "verdict": r["verdict"],
                         "n": len(r.get("series") or [])} for r in index.series()],
        "v": [s for m in models if (s := claim_v_section(results, index, m))],
        "j": [s for m in models if (s := claim_j_section(results, index, m))],
        "j_series": [claim_j_series(results, r, i)
                     for i, r in enumerate(x for x in index.series() if x["claim"] == "J")],
        "e": [s for m in models if (s := claim_e_section(results, index, m))],
        "thresholds": threshold_sections(results["thresholds"]),
        "provenance": provenance_context(results, index),
        "verdicts": [(v, LETTERS[v], VERDICT_HELP[v]) for v in VERDICTS],
        "claim_info": CLAIM_INFO,
    }


def render_report(results: dict) -> str:
    """The report for a results dict, as one self-contained HTML document.

    Raises
    ------
    ValueError
        When ``results`` does not follow the results schema (the message names the problem).
    """
    validate_results(results)
    return _environment().get_template("report.html.j2").render(**_scrub(build_context(results)))


# ------------------------------------------------------------------------- machine paths
CHECKOUT = Path(__file__).resolve().parent.parent
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


def _plural(kind: str | None, n) -> str:
    """``image`` → ``images`` for a count other than 1 (the input set records its kind singular)."""
    if not kind:
        return "inputs"
    return kind if n == 1 or kind.endswith("s") else f"{kind}s"


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
    return atomic_write_text(out_path, render_report(results))
