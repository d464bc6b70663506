"""What the report's sections share: number formatting, verdict letters and counts, the threshold
texts of a metric, and the layer × head layout of head records.

Every section module (``report/sections/``) and the core renderer (``report/render.py``) format
through here, so a number, a verdict or a rule reads the same everywhere in the report.
"""

from __future__ import annotations

import json
import math
import re

from claims.records import VERDICTS, Record

from .svg_line_plot import HLine
from .svg_primitives import Tick, finite

#: The order verdict counts are shown in: from supported down, partial between (method §2.6).
COUNT_ORDER = ("supported", "partial", "refuted", "inconclusive", "undetermined")
assert set(COUNT_ORDER) == set(VERDICTS)
LETTERS = {"supported": "S", "refuted": "R", "inconclusive": "I", "undetermined": "U",
           "partial": "P"}
VERDICT_HELP = {
    "supported": "every supported-rule of the claim holds",
    "refuted": "every refuted-rule of the claim holds",
    "inconclusive": "neither set of rules holds in full",
    "undetermined": "the comparison is not determined by the inputs (e.g. V̂ is round-off)",
    "partial": "claim V: not supported, but some of V̂'s top directions are shared, above chance "
               "and above the same architecture at random initialisation (method §2.6)",
}


# ------------------------------------------------------------------------------------ numbers
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


def flat(value) -> str:
    """A value in full: strings as they are, numbers unrounded, containers as JSON."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return fmt(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def direction(d) -> str:
    """A threshold direction as a mathematical sign (``>=`` → ``≥``)."""
    return {">=": "≥", "<=": "≤", ">": ">", "<": "<"}.get(str(d), str(d))


def slug(text: str) -> str:
    """An HTML id fragment: letters, digits, ``-`` and ``_`` only."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-") or "x"


def range_text(values: list) -> str:
    vals = [v for v in values if finite(v)]
    if not vals:
        return "—"
    lo, hi = min(vals), max(vals)
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def mean(values: list) -> float | None:
    vals = [float(v) for v in values if finite(v)]
    return sum(vals) / len(vals) if vals else None


def median(values: list) -> float | None:
    vals = sorted(float(v) for v in values if finite(v))
    if not vals:
        return None
    m = len(vals) // 2
    return vals[m] if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2


def log10(x) -> float | None:
    return math.log10(x) if finite(x) and x > 0 else None


# ------------------------------------------------------------------------------------ records
def count(records: list[Record]) -> dict[str, int]:
    """How many records carry each verdict (every verdict listed, in the order of
    :data:`COUNT_ORDER`: claim V's partial after supported)."""
    out = {v: 0 for v in COUNT_ORDER}
    for r in records:
        out[r.verdict] += 1
    return out


def round_off_note(records: list[Record]) -> str | None:
    """A sentence naming the records with a number that round-off decides beyond the judged
    tolerance (a ``round_off`` width, method §13.2, that the declared factor makes wider than
    the kind's tolerance), over the numbers a verdict can rest on (not the controls' round-off
    or solver-dependent values), and the largest relative width; None when there is none."""
    from .diff import leaves
    from .tolerances import ROUND_OFF_FACTOR, TOLERANCES, kind_of

    def wide(r: Record) -> dict[str, float]:
        out = {}
        flat_record = {}
        for path, width in (r.extra.get("round_off") or {}).items():
            kind = kind_of(path, 0.0)
            if kind not in ("judged", "interval", "column_wise"):
                continue
            if not flat_record:
                flat_record = leaves(r.to_json())
            value = flat_record.get(path)
            if not isinstance(value, (int, float)):
                continue
            tol = TOLERANCES[kind]
            if ROUND_OFF_FACTOR * width > tol.abs + tol.rel * abs(value):
                out[path] = width / abs(value) if value else math.inf
        return out
    found = [(r, wide(r)) for r in records]
    found = [(r, w) for r, w in found if w]
    if not found:
        return None
    names = [f"L{r.layer:02d}-H{r.head}" if r.layer is not None else r.level for r, _ in found]
    worst, where = max((rel, f"{path} of {name}") for (r, w), name in zip(found, names)
                       for path, rel in w.items())
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (f"Round-off decides some numbers of {len(found)} record(s) ({shown}) beyond the "
            f"judged tolerance: each record carries how far round-off alone moves them (its "
            f"round-off twin), about as far as two machines' values may differ; largest "
            f"relative width {fmt(worst, 2)} ({where}); method §13.2.")


def with_ci(value, rec: Record | None, name: str, key: str = "ci") -> str:
    """``value [lo, hi]``: a metric with its 95% bootstrap CI from ``rec``'s ``key`` table
    (method §7), or the value alone for records without one."""
    ci = rec.lookup(key, name) if rec is not None else None
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return f"{fmt(value)} [{fmt(ci[0])}, {fmt(ci[1])}]"
    return fmt(value)


def head_column(record: Record):
    """The heatmap column of a head record: ``KVy`` for a record judged per KV head of a
    grouped-query model (its ``kv_head``, method §5.7), else its query head."""
    kv = record.get("kv_head")
    return record.head if kv is None else f"KV{kv}"


def head_columns(records: list[Record], heads: list) -> tuple[list, str]:
    """(columns, axis title) of a claim's layer × head heatmap: on a grouped-query model, the KV
    heads its records are judged on (``KV0``, ``KV1``, ...), each drawn once, never once per query
    head of its group; otherwise ``heads``, the query heads."""
    kv = sorted({r.get("kv_head") for r in records if r.get("kv_head") is not None})
    return ([f"KV{k}" for k in kv], "KV head") if kv else (heads, "head")


def head_matrix(records: list[Record], layers: list[int], heads: list, value_fn):
    """``value_fn(record)`` placed at (layer, column), the column its :func:`head_column`; None
    where there is no record."""
    at = {(r.layer, head_column(r)): r for r in records}
    return [[value_fn(at[(lay, h)]) if (lay, h) in at else None for h in heads] for lay in layers]


def tooltips(records: list[Record], layers: list[int], heads: list, text_fn) -> list[list]:
    """A heatmap's hover texts: ``text_fn(record)`` with the head and its verdict at (layer,
    head), "" where there is no record (the model is the heatmap's own, so it is not repeated)."""
    def tip(r):
        kv = r.get("kv_head")
        head = f"head {r.head}" if kv is None else f"KV head {kv}"
        return f"layer {r.layer} {head}: {text_fn(r)}; {r.verdict}"
    tips = head_matrix(records, layers, heads, tip)
    return [[t or "" for t in row] for row in tips]


# ------------------------------------------------------------------------------------ rules
def _rule(thresholds: dict, section: str, kind: str, metric: str):
    node = thresholds.get(section)
    node = node.get(kind) if isinstance(node, dict) else None
    return node.get(metric) if isinstance(node, dict) else None


def rules_text(thresholds: dict, section: str, metric: str) -> str:
    """The supported/refuted bars on ``metric`` in a thresholds section, as text."""
    parts = []
    for kind in ("supported", "refuted"):
        rule = _rule(thresholds, section, kind, metric)
        if isinstance(rule, dict):
            parts.append(f"{kind} if {direction(rule.get('direction', '?'))} "
                         f"{fmt(rule.get('value'))}")
    return "; ".join(parts) or "—"


def rule_marks(thresholds: dict, section: str, metric: str) -> list[Tick]:
    """Colour-bar marks for every threshold on ``metric`` in a thresholds section."""
    out = []
    for kind in ("supported", "refuted"):
        rule = _rule(thresholds, section, kind, metric)
        if isinstance(rule, dict) and finite(rule.get("value")):
            label = f"{kind} {direction(rule.get('direction'))} {fmt(rule['value'])}"
            out.append(Tick(float(rule["value"]), label, True))
    return out


def threshold_lines(thresholds: dict, section: str, metric: str) -> list[HLine]:
    """Dashed lines for every threshold on a log10 metric, labelled as powers of ten."""
    out = []
    colours = {"supported": "#1b7837", "refuted": "#b2182b"}
    for kind in ("supported", "refuted"):
        rule = _rule(thresholds, section, kind, metric)
        if isinstance(rule, dict) and finite(rule.get("value")):
            out.append(HLine(float(rule["value"]),
                             f"{kind} {direction(rule.get('direction'))} "
                             f"10^{fmt(rule['value'])}", colours[kind]))
    return out
