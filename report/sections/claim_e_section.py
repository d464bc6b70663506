"""Claim E's report section (method §4): per model, the relative γ spread of the learned V beside
its two controls (three heatmaps on one log colour scale), and P2's eigenvalue statistics by
route with the route ratios the verdict reads."""

from __future__ import annotations

from markupsafe import Markup

from claims.names import E_ROUTES, E_STATISTICS

from ..common import (LETTERS, count, fmt, head_columns, head_matrix, median, round_off_note,
                      rules_text, slug, tooltips, with_ci)
from ..svg_colour import colour_bar, decade_scale, scale_ticks
from ..svg_heatmap import fit_cells, heatmap, values_grid
from ..svg_primitives import Tick

#: The γ spreads of a head record: the learned V and its two controls, with their panel labels.
CONTROLS = (("learned", "learned V"), ("eigen", "eigenvectors (control)"),
            ("perturbed", "perturbed basis (control)"))


def mean_std(stat) -> tuple[str, str]:
    """(mean, std) texts of a ``{mean, std}`` statistic; ``—`` where missing."""
    if not isinstance(stat, dict):
        return fmt(stat), "—"
    return fmt(stat.get("mean")), fmt(stat.get("std"))


def _panels(index, model: str, head_recs: list, sid: str):
    layers, heads = index.layers_heads(model)
    heads, head_title = head_columns(head_recs, heads)  # KV0.. per KV head (method §5.7)
    everything = [r.metric(k) for r in head_recs for k, _ in CONTROLS]
    scale = decade_scale(everything, label="relative γ spread (log scale)")
    cell = fit_cells(len(layers), len(heads), panels=3)
    panels = []
    for key, label in CONTROLS:
        values = head_matrix(head_recs, layers, heads, lambda r, k=key: r.metric(k))
        marks = (head_matrix(head_recs, layers, heads, lambda r: LETTERS[r.verdict])
                 if key == "learned" else None)
        tips = None
        if key == "learned":  # one tooltip per head carries all three spreads
            tips = tooltips(head_recs, layers, heads, lambda r: (
                "relative spread learned {}, eigen {}, perturbed {}; absolute learned {}; "
                "position {}; closer to eigen in {} of samples").format(
                *(fmt(r.metric(k)) for k, _ in CONTROLS), fmt(r.lookup("abs", "learned")),
                with_ci(r.metric("gamma_position"), r, "gamma_position"),
                fmt(r.closer_to_eigen_share)))
        panels.append({"label": label, "svg": Markup(heatmap(
            values, layers, heads, scale,
            f"heatmap-E-{sid}" if key == "learned" else f"heatmap-E-{key}-{sid}",
            marks=marks, tooltips=tips, cell=cell, title=label, col_title=head_title))})
    ticks = scale_ticks(scale)
    for key, label in CONTROLS:
        med = median([r.metric(key) for r in head_recs])
        if med is not None and med > 0:
            ticks.append(Tick(med, f"median {key} {fmt(med)}", True))
    legend = Markup(colour_bar(
        scale, f"legend-E-{sid}", ticks,
        note=f"values at or below {fmt(scale.vmin)} drawn at the low end; white: no record"))
    values_table = Markup(values_grid(
        head_matrix(head_recs, layers, heads, lambda r: " / ".join(
            fmt(r.metric(k)) for k, _ in CONTROLS) + f" {LETTERS[r.verdict]}"),
        layers, heads, f"values-E-{sid}", f"Values of the claim-E heatmaps of {model} as a table",
        col_title=head_title,
        note="relative γ spread: " + " / ".join(k for k, _ in CONTROLS)
             + ", then the head's verdict letter"))
    return panels, legend, values_table


def _routes(mrec) -> list[dict]:
    """The eigenvalue statistics by route: the known routes in order, then any other, sorted."""
    r_all = mrec.routes or {}
    routes = []
    for name in list(E_ROUTES) + sorted(set(r_all) - set(E_ROUTES)):
        if name not in r_all:
            continue
        route = r_all[name] if isinstance(r_all[name], dict) else {}
        stats = route.get("stats") if isinstance(route.get("stats"), dict) else {}
        routes.append({"name": name,
                       "stats": [mean_std(stats.get(s)) for s in E_STATISTICS],
                       "n_samples": fmt(route.get("n_samples")),
                       "n_nonfinite": fmt(route.get("n_nonfinite")),
                       "nonfinite_where": route.get("nonfinite_where")})
    return routes


def model_block(results: dict, index, model: str, spec) -> dict | None:
    """Claim E for one model: learned relative γ spread beside its two controls, and the
    eigenvalue-statistics table of all three routes."""
    head_recs = index.get(spec.id, model, "head")
    mrec = index.model_record(spec.id, model)
    if not head_recs and not mrec:
        return None
    sid = slug(model)
    panels, legend, values_table = [], None, None
    if head_recs:
        panels, legend, values_table = _panels(index, model, head_recs, sid)
    routes = _routes(mrec) if mrec else []
    ratios = [fmt(mrec.lookup("route_ratios", s)) for s in E_STATISTICS] if mrec else []
    metrics = [{"metric": k, "value": with_ci(v, mrec, k),
                "rules": rules_text(results["thresholds"], spec.section, k)}
               for k, v in sorted((mrec.metrics or {}).items())] if mrec else []
    return {"model": model, "id": f"heatmap-E-{sid}", "table_id": f"e-stats-{sid}",
            "values_table": values_table, "panels": panels, "legend": legend,
            "counts": count(head_recs), "n_heads": len(head_recs), "model_record": mrec,
            "routes": routes, "ratios": ratios, "metrics": metrics,
            "round_off": round_off_note(head_recs)}


def context(results: dict, index, spec) -> dict:
    """Claim E's section: one block per model with claim-E records."""
    return {"nav": f"Claim {spec.id}: eigenvalue statistics and γ",
            "blocks": [b for m in index.models() if (b := model_block(results, index, m, spec))]}
