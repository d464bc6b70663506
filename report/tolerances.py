"""How far a number of results.json may move between two machines and still count as the same
result: one tolerance per field kind, declared here once (method §13).

Every leaf of a record is of one kind, decided by its path (:func:`kind_of`):

- ``exact``: verdicts, counts, names, hashes, booleans, undefined values (``null``): equal or not;
- ``judged``: the judged metrics and every other measured number (``metrics``, ``per_head``,
  ``series``, ``routes`` …): float64 statistics of float32 activations, which differ between CPUs
  in the last bits of q, k, v (float32 round-off, 6e-8 relative);
- ``interval``: bootstrap confidence-interval bounds (``ci``, ``ci_null``): the same resamples
  of the same numbers, so the same tolerance as the judged metrics;
- ``round_off``: quantities that are round-off by construction, such as the γ eigen control's
  spread of an exact eigenvector basis (~1e-14): only an absolute bound makes sense;
- ``p2_code``: P2's code's values, which keep the solver's eigenvector signs (method §8.3): a
  LAPACK build that picks the other sign of a degenerate pair moves them by O(1), so they are
  compared in absolute value with a loose bound; they are never judged;
- ``text``: the evidence text, made from the numbers above (compared through them, not as text).

Two numbers a and b of a kind with tolerance (rel, abs) agree when
``|a - b| <= abs + rel * max(|a|, |b|)``. The values were measured (method §13): the largest
relative difference of a judged number between torch's DEFAULT and AVX2 kernels on the MiniLM
selection of ``tests/test_cpu_emulation.py`` is below 1e-8; 1e-6 leaves a margin of 100.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    kind: str
    rel: float
    abs: float
    why: str

    def agree(self, a: float, b: float) -> bool:
        """Whether ``a`` and ``b`` are the same result within this tolerance."""
        if self.kind == "p2_code":
            a, b = abs(a), abs(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= self.abs + self.rel * max(abs(a), abs(b))


#: The tolerances, one per field kind (module docstring).
TOLERANCES: dict[str, Tolerance] = {t.kind: t for t in (
    Tolerance("exact", 0.0, 0.0, "verdicts, counts, names and hashes are equal or not"),
    Tolerance("judged", 1e-6, 1e-12,
              "float64 statistics of float32 q, k, v that differ at round-off between CPUs"),
    Tolerance("interval", 1e-6, 1e-12, "bootstrap bounds over the same resamples"),
    Tolerance("round_off", 0.0, 1e-9, "values that are round-off by construction (~1e-14)"),
    Tolerance("p2_code", 1e-6, 1e-3,
              "P2's code keeps the solver's eigenvector signs: compared in absolute value"),
    Tolerance("text", 0.0, 0.0, "evidence text: compared through its numbers"),
)}

#: Which kind a record's leaf is, by its path (list indices dropped, keys joined by dots); the
#: first matching pattern wins; a number matching none is ``judged``, anything else ``exact``.
KIND_RULES: tuple[tuple[str, str], ...] = (
    ("evidence", "text"),
    ("*.eigen", "round_off"),
    ("p2_code.*", "p2_code"),
    ("ci.*", "interval"),
    ("ci_null.*", "interval"),
)

_INDEX = re.compile(r"\[\d+\]")


def kind_of(path: str, value) -> str:
    """The field kind of the leaf at ``path`` (e.g. ``ci.optimal_cosine[0]``) holding ``value``."""
    bare = _INDEX.sub("", path)
    for pattern, kind in KIND_RULES:
        if fnmatch.fnmatchcase(bare, pattern):
            return kind
    if isinstance(value, float) and not isinstance(value, bool):
        return "judged"
    return "exact"


def rel_diff(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|) (0 for two zeros; inf when only one side is finite)."""
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def differences(got, want, prefix: str = "") -> list[str]:
    """Where ``got`` and ``want`` (JSON values) differ beyond the tolerance of each leaf's kind:
    ``["metrics.pearson: 0.1 → 0.2 (judged)", "verdict: refuted → supported", ...]``. Keys, their
    order and the list lengths must be equal; text (evidence) is compared through its numbers,
    so it is skipped. The goldens of the tests compare with this."""
    out: list[str] = []
    if isinstance(want, dict) and isinstance(got, dict):
        if list(got) != list(want):
            out.append(f"{prefix or '<top>'}: keys {list(got)} != {list(want)}")
        for key in want:
            if key in got:
                out += differences(got[key], want[key], f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{prefix}: {len(got)} items != {len(want)}"]
        for i, (a, b) in enumerate(zip(got, want)):
            out += differences(a, b, f"{prefix}[{i}]")
        return out
    kind = kind_of(prefix, want)
    if kind == "text":
        return out
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (got, want))
    if numbers and kind != "exact":
        if not TOLERANCES[kind].agree(float(got), float(want)):
            out.append(f"{prefix}: {got!r} → {want!r} ({kind}, relative {rel_diff(got, want):.2g})")
    elif got != want or type(got) is not type(want):
        out.append(f"{prefix}: {got!r} → {want!r}")
    return out
