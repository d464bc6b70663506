"""This module owns the report's "Thresholds and sources" section: every threshold of the run's
``results["thresholds"]`` flattened to one row (claim section, rule, condition, source), whose rule
it is (method §9), and the sources' "method §N.M" linked to the method document."""

from __future__ import annotations

import re

from ..common import direction, flat, fmt
from ..method_link import method_links


def unsourced_why(section: str, path: list[str], bar: bool) -> str:
    """Why a threshold table has no source of its own, in words. Only a bar (a value and a
    direction a verdict rests on) without a source is a fault ("no source recorded"); a setting
    (the CI gate's regression directions, a section's mode) is not a bar and needs none."""
    if bar:
        return "no source recorded"
    if section == "baseline" and path[:1] == ["metrics"]:
        return ("a setting of the CI gate (which way this metric regresses), not a bar: no "
                "source needed (docs/gate.md)")
    if not path:
        return "section setting, not a bar (no source recorded)"
    return "a setting, not a bar (no source recorded)"


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
            bar = "value" in scalars and "direction" in scalars
            rows.append({"section": section, "rule": " · ".join(path) or "(section)",
                         "condition": cond, "whose": whose_rule(node.get("source") or "",
                                                                "ours" in path),
                         "source": node.get("source") or unsourced_why(section, path, bar),
                         "sourced": bool(node.get("source")), "bar": bar})
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


def threshold_sections(thresholds: dict, method_url: str | None = None) -> list[dict]:
    rows = threshold_rows(thresholds)
    for r in rows:
        r["linked"] = method_links(r["source"], method_url)
    return [{"name": s, "description": (thresholds[s] or {}).get("description", "")
             if isinstance(thresholds[s], dict) else "",
             "rows": [r for r in rows if r["section"] == s]} for s in sorted(thresholds)]
