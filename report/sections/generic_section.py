"""The section of a claim without a section of its own: a registered claim whose spec names no
``report_context``, or a claim the records name that this process has not registered (a results
file of a third-party claim). Per model: the model-level verdict and metrics beside their
thresholds, and a table of the claim's head, layer and series records with their verdicts and
metrics. It reads only the fields every record has (:class:`claims.records.Record`)."""

from __future__ import annotations

from claims.records import Record

from ..common import count, fmt, rules_text, slug, with_ci

#: At most this many unit rows per model (a run over many heads stays readable).
MAX_ROWS = 200


def _metric_names(spec, records: list[Record]) -> list[str]:
    """The spec's metrics in its order, then any other metric the records carry, sorted."""
    listed = list(spec.metrics) if spec is not None else []
    seen = {k for r in records for k in (r.metrics or {}) if k not in listed}
    return listed + sorted(seen)


def _unit_label(rec: Record) -> str:
    if rec.level == "head":
        return f"layer {rec.layer} head {rec.head}"
    if rec.level == "layer":
        return f"layer {rec.layer}"
    return rec.level


def model_block(results: dict, index, model: str, claim: str, spec, section: str) -> dict | None:
    units = [r for lv in ("head", "layer") for r in index.get(claim, model, lv)]
    mrec = index.model_record(claim, model)
    if not units and mrec is None:
        return None
    names = _metric_names(spec, units + ([mrec] if mrec else []))
    table = [{"metric": k, "value": with_ci(mrec.metric(k), mrec, k),
              "rules": rules_text(results["thresholds"], section, k)}
             for k in names if mrec is not None and mrec.metrics and k in mrec.metrics]
    rows = [{"unit": _unit_label(r), "verdict": r.verdict,
             "cells": [with_ci(r.metric(k), r, k) for k in names]} for r in units[:MAX_ROWS]]
    return {"model": model, "id": f"{slug(claim)}-{slug(model)}", "model_record": mrec,
            "table": table, "names": names, "rows": rows, "n_units": len(units),
            "n_hidden": max(len(units) - MAX_ROWS, 0), "counts": count(units),
            "evidence": (mrec.evidence or mrec.reason) if mrec is not None else None}


def context(results: dict, index, spec, claim: str | None = None) -> dict:
    """A claim's generic section; ``spec`` None for a claim this process has not registered."""
    claim = spec.id if spec is not None else claim
    section = spec.section if spec is not None else f"claim_{claim.lower()}"
    described = results["thresholds"].get(section)
    title = (spec.title if spec is not None else
             described.get("description", "") if isinstance(described, dict) else "")
    series = [r for r in index.series() if r.claim == claim]
    return {"nav": f"Claim {claim}" + (f": {title}" if title else ""),
            "claim": claim, "title": title, "registered": spec is not None,
            "statement": spec.statement if spec is not None else "",
            "source": spec.source if spec is not None else "",
            "blocks": [b for m in index.models()
                       if (b := model_block(results, index, m, claim, spec, section))],
            "series": [{"name": r.model, "verdict": r.verdict,
                        "metrics": [(k, fmt(v)) for k, v in sorted((r.metrics or {}).items())],
                        "evidence": r.evidence or r.reason} for r in series]}
