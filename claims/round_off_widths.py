"""A record's round-off widths (method §13.2): the record built a second time from its round-off
twin, and how far each number moved.

A claim's per-layer metrics carry, beside each per-sample number that round-off can move, its
twin (``twin_<name>``: the number again from inputs moved by round-off alone, see
:mod:`checks.round_off`). A claim builds its record once from the metrics and once from the
twins (:func:`twin_layers`), and :func:`attach` keeps in the record every number that moved
(``round_off``: path → |moved|) and the twin's verdict where it differs
(``round_off_verdict``). Where round-off decides a number, two machines give values about that
far apart; ``report diff`` and the goldens widen that number's tolerance by it
(report/tolerances.py).
"""

from __future__ import annotations

import math

from checks.round_off import MOVE_ABS, MOVE_REL

#: The prefix of a twin in a claim's per-layer metrics.
TWIN = "twin_"
#: Record fields that are not compared with the twin's (text, and the widths themselves).
_SKIP = ("evidence", "reason", "round_off", "round_off_verdict", "undefined")


def is_twin(name: str) -> bool:
    """Whether a per-layer metric is a round-off twin (left out of the record's own numbers)."""
    return name.startswith(TWIN)


def twin_metrics(metrics: dict) -> dict | None:
    """``metrics`` with every number that has a twin replaced by it (and the twins dropped);
    None when it has no twin (float32 runs, old caches)."""
    twins = {name[len(TWIN):]: value for name, value in metrics.items() if is_twin(name)}
    if not twins:
        return None
    return {**{k: v for k, v in metrics.items() if not is_twin(k)}, **twins}


def widths(record: dict, twin: dict) -> dict[str, float]:
    """Every numeric leaf (path as ``report diff`` writes it, e.g. ``ci.optimal_cosine[0]``) where
    ``twin`` differs from ``record`` by more than MOVE_ABS + MOVE_REL·max(|a|, |b|): |a − b|.

    >>> widths({"metrics": {"x": 1.0, "y": 2.0}, "ci": {"x": [0.5, 1.5]}},
    ...        {"metrics": {"x": 1.0, "y": 2.1}, "ci": {"x": [0.5, 1.5]}})
    {'metrics.y': 0.1}
    """
    out: dict[str, float] = {}

    def walk(a, b, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in a:
                if key in b and key not in _SKIP:
                    walk(a[key], b[key], f"{path}.{key}" if path else str(key))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif (isinstance(a, (int, float)) and isinstance(b, (int, float))
              and not isinstance(a, bool) and not isinstance(b, bool)):
            a, b = float(a), float(b)
            if math.isfinite(a) and math.isfinite(b) and \
                    abs(a - b) > MOVE_ABS + MOVE_REL * max(abs(a), abs(b)):
                out[path] = float(f"{abs(a - b):.3g}")

    walk(record, twin, "")
    return out


def twin_layers(per_layer: dict[int, dict]) -> dict[int, dict] | None:
    """:func:`twin_metrics` of every layer; None unless every layer carries twins."""
    twins = {layer: twin_metrics(m) for layer, m in per_layer.items()}
    return None if any(t is None for t in twins.values()) else twins


def twin_cache(cache: dict | None) -> dict | None:
    """Where a run keeps the statistics of its twin records, apart from its own (``cache``)."""
    return None if cache is None else cache.setdefault(("round-off twin",), {})


def attach(record, twin):
    """``record`` with its round-off widths against ``twin``, the same record built from the
    twins (:func:`twin_metrics`): ``round_off`` (path → |moved|, where any number moved) and
    ``round_off_verdict`` (the twin's verdict, where it differs). ``twin`` None: unchanged."""
    if twin is None:
        return record
    moved = widths(record.to_json(), twin.to_json())
    if moved:
        record.extra["round_off"] = moved
    if twin.verdict != record.verdict:
        record.extra["round_off_verdict"] = twin.verdict
    return record
