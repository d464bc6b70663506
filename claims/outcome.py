"""What a claim test's verdict becomes: its one-line evidence (the terminal, JUnit, the gate) and
its outcome (pass, skip, or a :class:`ClaimNotSupported` the pytest plugin shows without a
traceback)."""

from __future__ import annotations

import math

from .verdicts import SUPPORTED, UNDETERMINED, load_thresholds


ONE_LINE_METRICS = 4


class ClaimNotSupported(AssertionError):
    """A claim test whose verdict is refuted or inconclusive: the expected scientific outcome of
    a run, reported as its evidence (the pytest plugin shows no traceback for it)."""

    def __init__(self, record: dict, message: str):
        super().__init__(message)
        self.record = record
        self.evidence = message
        self.line = one_line(record)


def record_label(record: dict) -> str:
    """``claim V all-MiniLM-L6-v2-L00-H5``; model- and series-level records say so."""
    label = str(record.get("model"))
    if record.get("layer") is not None:
        label += f"-L{int(record['layer']):02d}"
    if record.get("kv_head") is not None:  # a KV head of a grouped-query model (method §5.7)
        label += f"-KV{record['kv_head']}"
    elif record.get("head") is not None:
        label += f"-H{record['head']}"
    if record.get("condition"):  # claim R: one series record per condition
        label += f" [{record['condition']}]"
    elif record.get("level") in ("model", "series"):
        label += f" ({record['level']})"
    return f"claim {record.get('claim')} {label}"


def rule_section(record: dict) -> str:
    """The rule section a record is judged by: its claim's ``ClaimSpec.record_sections`` entry for
    the record's level, else the claim's ``section``; KeyError for a claim not registered."""
    from .registry import get

    spec = get(str(record.get("claim")))
    return spec.record_sections.get(record.get("level"), spec.section)


def _judged(record: dict) -> list[str]:
    """The metrics that lead a record's one-line evidence: those its rule section judges; a
    record without one shows its first metrics."""
    metrics = record.get("metrics") or {}
    names: list[str] = []
    try:
        section = load_thresholds()[rule_section(record)]
        for kind in ("supported", "refuted"):
            names += [m for m in section.get(kind, {}) if m in metrics and m not in names]
    except (KeyError, TypeError, AttributeError):
        pass
    return names or [m for m in metrics if isinstance(metrics[m], (int, float))][:ONE_LINE_METRICS]


def _num(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "undefined"  # method §6.2
    return f"{x:.3g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def one_line(record: dict) -> str:
    """The one-line evidence of a record: ``claim V m-L00-H5: refuted (optimal cosine 0.27
    [0.25, 0.29], null 0.35; linear CKA ...)``. The interval shows when the record has a ``ci``
    for the metric, the null when it has a ``null``; undetermined records give their reason."""
    verdict = record.get("verdict", "?")
    if verdict == UNDETERMINED:
        return f"{record_label(record)}: {verdict} ({record.get('reason', 'no reason recorded')})"
    metrics, ci, null = (record.get(k) or {} for k in ("metrics", "ci", "null"))
    parts = []
    for name in _judged(record):
        text = f"{name.replace('_', ' ').replace(' cka', ' CKA')} {_num(metrics[name])}"
        interval = ci.get(name)
        if isinstance(interval, (list, tuple)) and len(interval) == 2:
            text += f" [{_num(interval[0])}, {_num(interval[1])}]"
        if isinstance(null.get(name), (int, float)) and name in null and null[name] != 0:
            text += f", null {_num(null[name])}"
        parts.append(text)
    twin = record.get("init_twin") or {}
    if "top_weighted_share" in metrics and twin:  # claim V's tier "partial" (method §2.6)
        parts.append(f"{_num(metrics.get('shared_directions'))} directions shared, top-weighted "
                     f"share {_num(metrics['top_weighted_share'])}, null "
                     f"{_num(null.get('top_weighted_share'))}, random-init twin "
                     f"{_num(twin.get('top_weighted_share'))}")
    return f"{record_label(record)}: {verdict}" + (f" ({'; '.join(parts)})" if parts else "")


def outcome_of(verdict: str) -> str:
    """The pytest outcome a claim test gets for ``verdict`` (:func:`assert_supported`):
    ``passed`` when supported, ``skipped`` when undetermined, else ``failed``."""
    return "passed" if verdict == SUPPORTED else "skipped" if verdict == UNDETERMINED else "failed"


def assert_supported(record: dict, message: str) -> None:
    """The outcome of a claim test: pass when supported, skip when undetermined (with the
    reason), otherwise raise :class:`ClaimNotSupported` carrying ``message`` (verdict, metrics,
    thresholds, sources, nulls): the plugin reports it as evidence, without a traceback."""
    __tracebackhide__ = True
    import pytest

    if record["verdict"] == UNDETERMINED:
        pytest.skip(message)
    if record["verdict"] != SUPPORTED:
        raise ClaimNotSupported(record, message)
