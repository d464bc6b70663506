"""Claim J's report section (method §3): per model, the layer means of ‖φ(q)‖² and ‖h‖², their
ratio beside the reference range of the run's thresholds (``[claim_j_reference]``, P2-logs), a
layer × head heatmap of the ratio, and the training series."""

from __future__ import annotations

import json
import math

from markupsafe import Markup

from claims.names import J_METRICS
from claims.records import Record

from ..common import (LETTERS, count, fmt, log10, range_text, rules_text, slug, threshold_lines,
                      with_ci)
from ..svg_colour import ColourScale, colour_bar
from ..svg_heatmap import fit_cells, heatmap, values_grid
from ..svg_line_plot import Band, Series, line_plot
from ..svg_primitives import Tick, finite, power_label


def band_words(key: str) -> str:
    """A reference range's key as words: ``p2_logs_log10_ratio_after_epoch_10`` → ``P2-logs,
    after epoch 10``; any other key with its underscores as spaces."""
    if key.startswith("p2_logs_log10_ratio"):
        rest = key[len("p2_logs_log10_ratio"):].strip("_").replace("_", " ")
        return "P2-logs" + (f", {rest}" if rest else "")
    return key.replace("_", " ")


def reference_bands(rec: Record | None, thresholds: dict, section: str = "claim_j") -> list[Band]:
    """Reference ranges of log10(‖h‖²/‖φ‖²): entries whose key contains "log10_ratio" with a
    [lo, hi] pair, taken from the record's ``reference``, else from the run's thresholds section
    ``<section>_reference`` (P2-logs' published ranges, method §3); none when neither has one."""
    recorded = rec.reference if rec is not None else None
    for ref in (recorded, thresholds.get(f"{section}_reference")):
        bands = []
        for key in sorted(ref if isinstance(ref, dict) else {}):
            val = ref[key]
            if ("log10_ratio" in key and isinstance(val, (list, tuple)) and len(val) == 2
                    and all(finite(v) for v in val)):
                bands.append(Band(float(min(val)), float(max(val)),
                                  f"{band_words(key)}: 10^{fmt(min(val))}–10^{fmt(max(val))}"))
        if bands:
            return bands
    return []


def _layer_values(layer_recs: list[Record], mrec: Record | None):
    """(layers, per-layer metric dicts, verdict marks): from the layer records, else from the
    model record's per-layer lists."""
    if layer_recs:
        return (tuple(r.layer for r in layer_recs), [r.metrics or {} for r in layer_recs],
                [(r.layer, LETTERS[r.verdict]) for r in layer_recs])
    per = mrec.per_layer or {}
    n = max((len(v) for v in per.values() if isinstance(v, list)), default=0)
    xs = tuple((mrec.layers or list(range(n)))[:n])
    return xs, [{k: (per.get(k) or [None] * n)[i] for k in J_METRICS} for i in range(n)], []


def _heatmap(index, model: str, layer_recs: list[Record], bands: list[Band], sid: str):
    """The layer × head heatmap of the per-head log10 ratio, its legend and its values table."""
    _, heads_all = index.layers_heads(model)
    n_heads = max((len(r.lookup("per_head", "log10_ratio") or []) for r in layer_recs), default=0)
    recorded = layer_recs[0].heads
    heads = (recorded if isinstance(recorded, list) and len(recorded) == n_heads
             else heads_all if len(heads_all) == n_heads else list(range(n_heads)))
    if not n_heads:
        return None, None, None
    layers = [r.layer for r in layer_recs]
    values, tips = [], []
    for r in layer_recs:
        lst = list(r.lookup("per_head", "log10_ratio") or [])
        lst += [None] * (n_heads - len(lst))
        values.append([v if finite(v) else None for v in lst])
        tips.append([f"layer {r.layer} head {h}: log10 ratio {fmt(v)}; layer {r.verdict}"
                     for h, v in zip(heads, lst)])
    finite_vals = [v for row in values for v in row if v is not None]
    lo = math.floor(min(finite_vals + [b.lo for b in bands]))
    hi = math.ceil(max(finite_vals + [b.hi for b in bands]))
    scale = ColourScale(float(lo), float(max(hi, lo + 1)),
                        label="ratio ‖h‖²/‖φ‖² per head (log scale)")
    step = max(1, math.ceil((max(hi, lo + 1) - lo) / 8))  # at most 9 labelled decades: no overlap
    ticks = [Tick(float(k), power_label(k)) for k in range(lo, max(hi, lo + 1) + 1, step)]
    ticks += [Tick(b.lo, f"reference low 10^{fmt(b.lo)}", True) for b in bands[:1]]
    ticks += [Tick(b.hi, f"reference high 10^{fmt(b.hi)}", True) for b in bands[:1]]
    heatmap_svg = Markup(heatmap(
        values, layers, heads, scale, f"heatmap-J-{sid}", tooltips=tips,
        cell=fit_cells(len(layers), len(heads)),
        row_notes=[f"{LETTERS[r.verdict]}" for r in layer_recs]))
    legend = Markup(colour_bar(scale, f"legend-J-{sid}", ticks,
                               note="letter right of a row: the layer's verdict"))
    values_table = Markup(values_grid(
        [[None if v is None else fmt(v) for v in row] for row in values], layers, heads,
        f"values-J-{sid}", f"Values of the claim-J heatmap of {model} as a table",
        note="log10 of the ratio ‖h‖²/‖φ‖² per head"))
    return heatmap_svg, legend, values_table


def model_block(results: dict, index, model: str, spec) -> dict | None:
    """Claim J for one model: per-layer magnitudes of ‖φ‖² and ‖h‖², their ratio beside P2-logs'
    range, and a layer × head heatmap of the per-head log10 ratio."""
    layer_recs = index.get(spec.id, model, "layer")
    mrec = index.model_record(spec.id, model)
    if not layer_recs and not mrec:
        return None
    thresholds = results["thresholds"]
    sid = slug(model)
    xs, met, verdict_marks = _layer_values(layer_recs, mrec)
    phi = tuple(log10(m.get("phi_sq_mean")) for m in met)
    hsq = tuple(log10(m.get("h_sq_mean")) for m in met)
    ratio = tuple(m.get("log10_ratio") if finite(m.get("log10_ratio")) else None for m in met)
    magnitude = line_plot(
        [Series("mean ‖φ(q)‖²", xs, phi, "#1f78b4", "circle"),
         Series("mean ‖h‖²", xs, hsq, "#e66101", "square")],
        f"jmag-{sid}", "layer", "layer mean (log scale)",
        title="Magnitudes per layer", height=230)
    bands = reference_bands(None, thresholds, spec.section)
    ratio_plot = line_plot(
        [Series("‖h‖² / ‖φ‖² (layer mean)", xs, ratio, "#5e3c99", "diamond")],
        f"jratio-{sid}", "layer", "ratio ‖h‖²/‖φ‖² (log scale)", bands=bands,
        hlines=threshold_lines(thresholds, spec.section, "log10_ratio"),
        top_marks=verdict_marks, title="Ratio per layer (letters: layer verdicts)", height=230)
    heatmap_svg = legend = values_table = None
    if layer_recs:
        heatmap_svg, legend, values_table = _heatmap(index, model, layer_recs, bands, sid)
    table = []
    if mrec:
        for name in J_METRICS:
            if mrec.metrics is not None and name in mrec.metrics:
                table.append({"metric": name, "value": with_ci(mrec.metrics[name], mrec, name),
                              "rules": rules_text(thresholds, spec.section, name)})
        p1 = mrec.p1_code or {}
        note = p1.get("label") if isinstance(p1.get("label"), str) else "P1's logged quantity"
        for name, value in sorted(p1.items()):
            if name != "label":
                table.append({"metric": f"p1-code variant: {name}", "value": fmt(value),
                              "rules": f"{note} (method §3); not judged"})
        for name in ("output_r2", "output_r2_excess", "fit_median_log10_ratio",
                     "fit_bessel_share"):  # the ours rule set's metrics (method §3.6)
            if mrec.metrics is not None and mrec.metrics.get(name) is not None:
                table.append({"metric": f"ours: {name}", "value": with_ci(mrec.metrics[name], mrec, name),
                              "rules": rules_text(thresholds, spec.section, name) or
                              "the ours rule set (method §3.6)"})
    tail = []  # the heavy tail per layer (method §3.7): what the pooled ratio of means hides
    for rec in sorted(layer_recs, key=lambda r: r.layer if r.layer is not None else -1):
        tokens = getattr(rec, "tokens", None) or rec.extra.get("tokens")
        if not isinstance(tokens, dict):
            continue
        m = rec.metrics or {}
        tail.append({"layer": rec.layer, "pooled": fmt(m.get("log10_ratio")),
                     "median": fmt(tokens.get("median_log10_ratio")),
                     "trimmed": fmt(tokens.get("trimmed_mean_log10_ratio")),
                     "top": fmt(tokens.get("top_phi_share")),
                     "appendix": fmt(tokens.get("p2_appendix_log10_ratio")),
                     "r2": fmt(m.get("output_r2")),
                     "verdicts": ", ".join(f"{k} {v}" for k, v in (rec.verdicts or {}).items())})
    return {"model": model, "id": f"jmag-{sid}", "heatmap_id": f"heatmap-J-{sid}",
            "tail": tail,
            "magnitude": Markup(magnitude), "ratio": Markup(ratio_plot),
            "heatmap": heatmap_svg, "legend": legend, "values_table": values_table,
            "counts": count(layer_recs),
            "n_layers": len(layer_recs), "model_record": mrec, "table": table,
            "bands": [b.label for b in bands]}


def series_block(results: dict, rec: Record, n: int, section: str = "claim_j") -> dict:
    """A training series (claim J, method §3): J_proj, ‖φ‖², ‖h‖² against step on a log y scale."""
    points = rec.series or []
    pts = sorted((p for p in points if isinstance(p, dict)),
                 key=lambda p: (p.get("step") if finite(p.get("step")) else math.inf))
    steps = tuple(p.get("step") for p in pts)
    j = [p.get("j_proj") for p in pts]
    sid = f"{slug(rec.model)}-{n}"
    neg = tuple(finite(v) and v < 0 for v in j)
    terms = line_plot(
        [Series("|J_proj| (hollow: J_proj < 0)", steps,
                tuple(log10(abs(v)) if finite(v) else None for v in j), "#000000",
                "circle", hollow=neg),
         Series("‖φ(q)‖²", steps, tuple(log10(p.get("phi_sq_mean")) for p in pts),
                "#1f78b4", "triangle", dashed=True),
         Series("‖h‖²", steps, tuple(log10(p.get("h_sq_mean")) for p in pts),
                "#e66101", "square", dashed=True)],
        f"jseries-{sid}", "training step", "value (log scale)",
        x_integer=all(isinstance(s, int) for s in steps), title="J_proj and its two terms")
    bands = reference_bands(rec, results["thresholds"], section)
    ratio = line_plot(
        [Series("‖h‖²/‖φ‖²", steps,
                tuple(p.get("log10_ratio") if finite(p.get("log10_ratio")) else None
                      for p in pts), "#5e3c99", "diamond")],
        f"jseries-ratio-{sid}", "training step", "ratio ‖h‖²/‖φ‖² (log scale)", bands=bands,
        hlines=threshold_lines(results["thresholds"], section, "log10_ratio"),
        x_integer=all(isinstance(s, int) for s in steps), title="Ratio against P2-logs' range")
    trend = rec.trend or {}
    reference = rec.reference or {}
    acc = [p.get("test_accuracy") for p in pts]
    return {"name": rec.model, "id": f"jseries-{sid}", "verdict": rec.verdict,
            "terms": Markup(terms), "ratio": Markup(ratio), "n_points": len(pts),
            "n_negative": sum(neg), "steps": range_text(list(steps)),
            "accuracy": range_text(acc),
            "trend": [(k, fmt(trend[k]) if not isinstance(trend[k], str) else trend[k])
                      for k in sorted(trend)],
            "reference": [(k, json.dumps(v, sort_keys=True) if not isinstance(v, str) else v)
                          for k, v in sorted(reference.items())],
            "bands": [b.label for b in bands],
            "evidence": rec.evidence or rec.reason}


def context(results: dict, index, spec) -> dict:
    """Claim J's section: one block per model with claim-J records, one per training series."""
    return {"nav": f"Claim {spec.id}: projection loss",
            "blocks": [b for m in index.models() if (b := model_block(results, index, m, spec))],
            "series": [series_block(results, r, i, spec.section)
                       for i, r in enumerate(x for x in index.series() if x.claim == spec.id)]}
