"""Claim V's report section (method §2): per model, a layer × head heatmap of the optimal cosine
beside its null, and the model-level metrics with intervals, tests against chance and the p2-code
variants (method §8)."""

from __future__ import annotations

from markupsafe import Markup

from claims.names import V_METRICS, V_P2_CODE_METRICS
from claims.records import Record

from ..common import (LETTERS, count, fmt, head_columns, head_matrix, mean, range_text, round_off_note,
                      rule_marks, rules_text, slug, tooltips, with_ci)
from ..svg_colour import ColourScale, colour_bar, scale_ticks
from ..svg_heatmap import fit_cells, heatmap, values_grid
from ..svg_primitives import Tick


def chance_text(rec: Record | None, name: str) -> str:
    """The test against chance of one metric: "yes (p_adj 0.001)" / "no (...)" / "—"."""
    test = rec.lookup("vs_null", name) if rec is not None else None
    if not isinstance(test, dict):
        return "—"
    word = "yes" if test.get("above_chance") else "no"
    if test.get("can_reject") is False:
        word += ", too few samples to reject"
    return f"{word} (adjusted p {fmt(test.get('p_adjusted'))})"


def p2_code_rows(mrec: Record | None) -> list[dict]:
    """Exact vs P2-code values (method §8) of claim V's sign-dependent metrics, model level."""
    rows = []
    for name in V_P2_CODE_METRICS:
        if mrec is None:
            break
        # on a seeded subset of samples (method §8.3) the exact column is over the same units
        exact = mrec.lookup("p2_code_exact", name)
        exact = mrec.metric(name) if exact is None else exact
        other = mrec.lookup("p2_code", name)
        if isinstance(other, (int, float)) and isinstance(exact, (int, float)):
            rows.append({"metric": name, "exact": fmt(exact, 4), "p2_code": fmt(other, 4),
                         "diff": fmt(other - exact, 2)})
    return rows


def model_block(results: dict, index, model: str, spec) -> dict | None:
    """Claim V for one model: heatmap of optimal cosine with its null, and the model table."""
    heads_recs = index.get(spec.id, model, "head")
    mrec = index.model_record(spec.id, model)
    if not heads_recs and not mrec:
        return None
    thresholds = results["thresholds"]
    layers, heads = index.layers_heads(model)
    heads, head_title = head_columns(heads_recs, heads)  # KV0.. per KV head (method §5.7)
    sid = slug(model)
    values = head_matrix(heads_recs, layers, heads, lambda r: r.metric("optimal_cosine"))
    marks = head_matrix(heads_recs, layers, heads, lambda r: LETTERS[r.verdict])
    tips = tooltips(heads_recs, layers, heads, lambda r: (
        f"optimal cosine {with_ci(r.metric('optimal_cosine'), r, 'optimal_cosine')} "
        f"(null {fmt(r.lookup('null', 'optimal_cosine'))}, above chance: "
        f"{chance_text(r, 'optimal_cosine')}), "
        f"{fmt(r.n_used)}/{fmt(r.n_samples)} used"))
    nulls = [r.lookup("null", "optimal_cosine") for r in heads_recs]
    null_mean = mean(nulls)
    scale = ColourScale(0.0, 1.0, label="optimal cosine (mean over determined samples)")
    ticks = scale_ticks(scale)
    if null_mean is not None:
        ticks.append(Tick(null_mean, f"null (chance) ≈ {fmt(null_mean)}", True))
    ticks += rule_marks(thresholds, spec.section, "optimal_cosine")
    cell = fit_cells(len(layers), len(heads))
    table = []
    if mrec:
        for name in V_METRICS:
            if mrec.metrics is not None and name in mrec.metrics:
                table.append({"metric": name,
                              "value": with_ci(mrec.metrics[name], mrec, name),
                              "null": with_ci(mrec.lookup("null", name), mrec, name, "ci_null"),
                              "std": fmt(mrec.lookup("std", name)),
                              "chance": chance_text(mrec, name),
                              "rules": rules_text(thresholds, spec.section, name)})
    return {
        "model": model, "id": f"heatmap-V-{sid}",
        "heatmap": Markup(heatmap(values, layers, heads, scale, f"heatmap-V-{sid}",
                                  marks=marks, tooltips=tips, cell=cell,
                                  col_title=head_title)),
        "legend": Markup(colour_bar(scale, f"legend-V-{sid}", ticks,
                                    note="white cell: no record for that head")),
        "null_mean": fmt(null_mean), "null_range": range_text(nulls),
        "counts": count(heads_recs), "n_heads": len(heads_recs),
        "model_record": mrec, "table": table, "p2_code": p2_code_rows(mrec),
        "verdicts": (mrec.verdicts if mrec is not None and mrec.verdicts else {}),
        "head_verdicts_by_rules": (mrec.head_verdicts_by_rules if mrec is not None
                                   and mrec.head_verdicts_by_rules else {}),
        "values_table": Markup(values_grid(
            head_matrix(heads_recs, layers, heads, lambda r: (
                f"{fmt(r.metric('optimal_cosine'))} {LETTERS[r.verdict]} "
                f"(null {fmt(r.lookup('null', 'optimal_cosine'))})")),
            layers, heads, f"values-V-{sid}", f"Values of the claim-V heatmap of {model} as a table",
            col_title=head_title,
            note="optimal cosine, the head's verdict letter, and its null (chance) level")),
        "undetermined_reason": next((r.reason for r in heads_recs
                                     if r.verdict == "undetermined" and r.reason), None),
        "round_off": round_off_note([*heads_recs, *([mrec] if mrec else [])]),
    }


def context(results: dict, index, spec) -> dict:
    """Claim V's section: one block per model with claim-V records."""
    return {"nav": f"Claim {spec.id}: value vectors",
            "blocks": [b for m in index.models() if (b := model_block(results, index, m, spec))]}
