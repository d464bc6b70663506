"""Claim R's report section (method §15): the toy-scale label, one table per family of
conditions (clean; sparse and dense digits-C corruptions; FGSM, PGD and transfer attacks; the
mechanism readout) with each arm's mean, the paired difference over seeds and its 95% interval,
the verdict and the per-seed differences; a forest plot of the accuracy differences; and P1's
claims this check cannot test, with the reason."""

from __future__ import annotations

from markupsafe import Markup, escape

from claims.claim_r import FAMILY_TITLES, LABEL, NOT_CHECKED, PAIR

from ..common import count, fmt, rules_text

#: Families in report order.
ORDER = ("clean", "sparse", "dense", "fgsm", "pgd", "transfer", "sparse_share", "rank")


def _pct(x) -> str:
    return "—" if x is None else f"{100 * float(x):.1f}"


def _signed(x: float, scale: float, digits: int) -> str:
    """Accuracy points with ``digits`` decimals; other quantities (digits 0) to 3 significant
    digits, so that a share of 3·10⁻⁴ does not read as 0."""
    return f"{x * scale:+.{digits}f}" if digits else f"{x:+.3g}"


def _interval(ci, scale: float = 1.0, digits: int = 1) -> str:
    if not (isinstance(ci, (list, tuple)) and len(ci) == 2):
        return "no interval (one seed)"
    return f"[{_signed(float(ci[0]), scale, digits)}, {_signed(float(ci[1]), scale, digits)}]"


def _row(rec) -> dict:
    accuracy = rec.extra.get("family") not in ("sparse_share", "rank")
    scale, digits = (100.0, 1) if accuracy else (1.0, 0)
    metrics = rec.metrics or {}
    arms = ([metrics.get("rpc_symvit"), metrics.get("symvit")] if "rpc_symvit" in metrics
            else [metrics.get("corrupted"), metrics.get("clean")])
    diffs = (rec.extra.get("per_seed") or {}).get("diff") or []
    return {"condition": rec.extra.get("condition", rec.test_id or ""),
            "treated": _pct(arms[0]) if accuracy else fmt(arms[0]),
            "control": _pct(arms[1]) if accuracy else fmt(arms[1]),
            "diff": (_signed(float(metrics["paired_diff"]), scale, digits)
                     if metrics.get("paired_diff") is not None else "—"),
            "ci": _interval(rec.ci_of("paired_diff"), scale, digits),
            "verdict": rec.verdict, "reason": rec.reason,
            "seeds": ", ".join(_signed(d, scale, digits) for d in diffs),
            "evidence": rec.evidence}


def _forest(rows: list) -> Markup:
    """An inline SVG: each accuracy record's paired difference (points) and interval (bars),
    in percentage points, with the zero line."""
    items = [r for r in rows if r.extra.get("family") not in ("sparse_share", "rank")]
    if not items:
        return Markup("")
    values = []
    for r in items:
        ci = r.ci_of("paired_diff")
        d = (r.metrics or {}).get("paired_diff")
        lo, hi = (ci if ci else (d, d))
        values.append((r.extra.get("condition", ""), d, lo, hi, r.verdict))
    finite = [v for _, d, lo, hi, _ in values for v in (d, lo, hi) if isinstance(v, (int, float))]
    # half-width in points: the widest interval end, at least 5 and at most 100 points
    span = min(1.0, max(0.05, max(abs(v) for v in finite) if finite else 0.05)) * 100
    width, left, right, row_h = 720, 190, 20, 16
    height = row_h * len(values) + 40
    plot = width - left - right

    def x(v: float) -> float:
        return left + plot * (v * 100 + span) / (2 * span)

    colour = {"supported": "#1a7f37", "refuted": "#cf222e", "inconclusive": "#9a6700",
              "undetermined": "#57606a"}
    parts = [f'<svg class="forest" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f'<title>claim R: paired accuracy differences RPC-SymViT − SymViT, percentage points, '
             f'95% intervals over seeds</title>',
             f'<line x1="{x(0):.1f}" y1="8" x2="{x(0):.1f}" y2="{height - 28}" stroke="#888" '
             f'stroke-dasharray="3,3"/>']
    for i, (label, d, lo, hi, verdict) in enumerate(values):
        y = 16 + i * row_h
        c = colour.get(verdict, "#57606a")
        parts.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end" font-size="11">'
                     f'{escape(label)}</text>')
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
            parts.append(f'<line x1="{x(max(lo, -span / 100)):.1f}" y1="{y}" '
                         f'x2="{x(min(hi, span / 100)):.1f}" y2="{y}" stroke="{c}" stroke-width="2"/>')
        if isinstance(d, (int, float)):
            parts.append(f'<circle cx="{x(d):.1f}" cy="{y}" r="3.5" fill="{c}">'
                         f'<title>{escape(label)}: {d * 100:+.2f} points ({verdict})</title></circle>')
    axis_y = height - 22
    for tick in (-span, -span / 2, 0, span / 2, span):
        parts.append(f'<text x="{x(tick / 100):.1f}" y="{axis_y + 12}" text-anchor="middle" '
                     f'font-size="10">{tick:+.0f}</text>')
    parts.append(f'<text x="{left + plot / 2:.1f}" y="{height - 1}" text-anchor="middle" '
                 f'font-size="10">RPC-SymViT − SymViT accuracy, percentage points '
                 f'(right: RPC-SymViT better)</text></svg>')
    return Markup("".join(parts))


def context(results: dict, index, spec) -> dict:
    """Claim R's section: the label, the tables per family, the forest plot, not-checked list."""
    records = index.get(spec.id, PAIR, "series")
    by_family: dict[str, list] = {}
    for rec in records:
        by_family.setdefault(rec.extra.get("family", "other"), []).append(rec)
    families = [{"key": f, "title": FAMILY_TITLES.get(f, f),
                 "rules": rules_text(results["thresholds"], by_family[f][0].extra.get("section", ""),
                                     "paired_diff"),
                 "accuracy": f not in ("sparse_share", "rank"),
                 "rows": [_row(r) for r in by_family[f]], "counts": count(by_family[f])}
                for f in ORDER if f in by_family]
    info = index.models_info.get(PAIR) or {}
    settings = info.get("rpc_settings") or {}
    timing = info.get("timing") or {}
    first = records[0] if records else None
    return {"nav": f"Claim {spec.id}: RPC-Attention ({LABEL})", "label": LABEL,
            "statement": spec.statement, "source": spec.source,
            "families": families, "counts": count(records), "n": len(records),
            "forest": _forest([r for f in ORDER for r in by_family.get(f, [])]),
            "settings": settings, "n_seeds": first.extra.get("n_seeds") if first else None,
            "final_accuracy": info.get("final_test_accuracy") or {},
            "timing": timing, "not_checked": NOT_CHECKED}
