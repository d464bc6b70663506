"""How far a number of results.json may move between two machines and still count as the same
result: one tolerance per field kind, declared here once (method §13).

Every leaf of a record is of one kind, decided by its path (:func:`kind_of`):

- ``exact``: verdicts, counts, names, hashes, booleans, undefined values (``null``): equal or not;
- ``judged``: the judged metrics and every other measured number (``metrics``, ``per_head``,
  ``series``, ``routes`` …): float64 statistics of float32 activations, which differ between CPUs
  in the last bits of q, k, v (float32 round-off, 6e-8 relative);
- ``interval``: bootstrap confidence-interval bounds (``ci``, ``ci_null``): the same resamples
  of the same numbers, so the same tolerance as the judged metrics;
- ``round_off``: quantities that are round-off by construction, such as the absolute γ spread
  and the subspace measures of the exact eigenvector basis (~1e-14 and below): only an absolute
  bound makes sense;
- ``solver_dependent``: numbers that are not functions of the inputs at float64 but of the
  eigensolver's code path, never judged, so compared across machines for presence and
  finiteness only (same-machine runs stay bitwise in the tests that check them):
  P2's code's values (``p2_code.*``; method §8.3), which keep the solver's eigenvector signs and,
  inside (nearly) degenerate eigenspaces, its basis: MKL on SSE4.2 against the native dispatch
  moved them by up to 0.89 absolute (a cosine of 3e-4 became 3e-3, a Pearson r changed sign);
  and the measured γ spread of the eigen control (``metrics.eigen``, ``ci.eigen``), the solver's
  round-off amplified by 1/(μ_k·â_ik), 3.2e-3 against 2.4e-3 on a head with a graded spectrum,
  which is why the γ positions anchor at the exact value 0 instead (method §4.2);
- ``ill_conditioned``: reported but not judged numbers that round-off alone moves, with a measured
  tolerance: the direction overlaps ω moved to ``directions_imprecise`` (method §4.2,
  "Precision"), whose per-sample values moved by up to 3.3e-2 relative (their means by 1.6e-3)
  between MKL on SSE4.2 (CBWR) and the native dispatch: 0.1 relative;
- ``column_wise``: claim V's column-by-column measures, the direct cosine and Pearson's r
  (``*.direct_cosine``, ``*.pearson``: metrics, intervals, nulls), which compare each learned
  column with one eigenvector: the trailing eigenvectors of a graded spectrum (eigenvalues down to
  1e-7 of the largest, gaps of 1e-8) carry the eigensolver's round-off amplified by 1/gap, so
  values near 0 move in absolute terms: measured 5.4e-9 on a Pearson r of 1.5e-3 (MKL on SSE4.2
  with CBWR against the native dispatch); the judged tolerance with an absolute floor of 1e-7;
- ``float32``: claim E's naive float32 route (``routes.naive_float32.*``) and the route ratios it
  enters (``metrics.max_route_ratio``, ``ci.max_route_ratio``): float32 eigenvalues of a matrix
  whose smallest top-d eigenvalue is ~1e-6 of the largest, so the LAPACK build's float32 round-off
  shows: measured at most 2.5e-5 relative across the emulated settings (MKL on SSE4.2 with CBWR;
  0 under ATEN DEFAULT, oneDNN SSE4.1, libm without FMA), tolerance 1e-3 (a margin of 40);
- ``text``: the evidence text, made from the numbers above (compared through them, not as text),
  and the reasons of undefined numbers (compared through the number being None); likewise the
  round-off widths (``round_off``, ``round_off_verdict``), estimates that widen the tolerances.

A record built from the round-off twins of its per-sample numbers (method §13.2) carries, in
``round_off``, how far each of its numbers moved: where round-off decides a number, two machines
give values about that far apart. Every number of a metric with such a width in either record
agrees within its kind's tolerance plus :data:`ROUND_OFF_FACTOR` times the width.

Two numbers a and b of a kind with tolerance (rel, abs) agree when
``|a - b| <= abs + rel * max(|a|, |b|)``; of kind ``solver_dependent``, when both are finite (or
both the same non-finite value). The values were measured (method §13): the largest
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

    @property
    def by_value(self) -> bool:
        """False for the kinds compared for presence and finiteness only."""
        return self.kind != "solver_dependent"

    def describe(self) -> str:
        """The tolerance in words, as ``report diff`` prints it."""
        if not self.by_value:
            return "presence and finiteness only"
        return f"rel {self.rel:g} abs {self.abs:g}"

    def agree(self, a: float, b: float, width: float = 0.0) -> bool:
        """Whether ``a`` and ``b`` are the same result within this tolerance, widened by
        :data:`ROUND_OFF_FACTOR` times the number's round-off ``width`` (method §13.2)."""
        if not self.by_value:
            return math.isfinite(a) == math.isfinite(b) and (math.isfinite(a) or a == b
                                                             or (a != a and b != b))
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= self.abs + self.rel * max(abs(a), abs(b)) + ROUND_OFF_FACTOR * width


#: How many times its round-off width (a record's ``round_off``, method §13.2) a number may move
#: between machines beyond its kind's tolerance: the width is one draw of round-off, the twin's.
#: Measured on the softmax ViT's claim V and γ records (MKL on SSE4.2 with CBWR against the
#: native dispatch): every number outside its kind's tolerance moved by at most 1.23 times the
#: largest width of its metric (p-values: 0.95 times); 10 leaves a margin of 8.
ROUND_OFF_FACTOR = 10.0


def metric_of(path: str) -> str:
    """The metric a leaf's round-off width is kept under: the key after the record's table,
    indices dropped (``ci.optimal_cosine[0]`` → ``optimal_cosine``,
    ``vs_null.subspace_overlap.p`` → ``subspace_overlap``).

    >>> metric_of("ci.optimal_cosine[0]"), metric_of("vs_null.kernel_cka.p"), metric_of("n_used")
    ('optimal_cosine', 'kernel_cka', 'n_used')
    """
    parts = _INDEX.sub("", path).split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def round_off_widths(*records) -> dict[str, float]:
    """Per metric (:func:`metric_of`), the largest round-off width any of ``records`` (JSON
    records) carries for any of its numbers (method §13.2): every number of that metric, in
    its interval, null and tests too, may move by :data:`ROUND_OFF_FACTOR` times it."""
    out: dict[str, float] = {}
    for record in records:
        widths = record.get("round_off") if isinstance(record, dict) else None
        for path, width in (widths or {}).items():
            if isinstance(width, (int, float)) and math.isfinite(width):
                name = metric_of(path)
                out[name] = max(out.get(name, 0.0), float(width))
    return out


#: The tolerances, one per field kind (module docstring).
TOLERANCES: dict[str, Tolerance] = {t.kind: t for t in (
    Tolerance("exact", 0.0, 0.0, "verdicts, counts, names and hashes are equal or not"),
    Tolerance("judged", 1e-6, 1e-12,
              "float64 statistics of float32 q, k, v that differ at round-off between CPUs"),
    Tolerance("interval", 1e-6, 1e-12, "bootstrap bounds over the same resamples"),
    Tolerance("round_off", 0.0, 1e-9, "values that are round-off by construction (~1e-14)"),
    Tolerance("solver_dependent", math.inf, math.inf,
              "functions of the eigensolver's code path (its signs and its basis inside degenerate "
              "eigenspaces, its amplified round-off), not of the inputs: never judged, compared "
              "for presence and finiteness only"),
    Tolerance("ill_conditioned", 0.1, 1e-9,
              "reported, not judged: round-off alone moves them; measured at most 3.3e-2 relative "
              "between emulated CPUs"),
    Tolerance("column_wise", 1e-6, 1e-7,
              "cosines and correlations in [-1, 1] of each learned column with one eigenvector: "
              "the trailing eigenvectors of a graded spectrum carry the solver's round-off "
              "amplified by 1/gap, measured 5.4e-9 absolute"),
    Tolerance("float32", 1e-3, 1e-12,
              "claim E's naive float32 route: measured at most 2.5e-5 relative between emulated CPUs"),
    Tolerance("text", 0.0, 0.0, "evidence text: compared through its numbers"),
)}

#: Which kind a record's leaf is, by its path (list indices dropped, keys joined by dots); the
#: first matching pattern wins; a number matching none is ``judged``, anything else ``exact``.
KIND_RULES: tuple[tuple[str, str], ...] = (
    ("evidence", "text"),
    ("round_off.*", "text"),       # the round-off widths are estimates, not results
    ("round_off_verdict", "text"),
    ("undefined.*", "text"),       # why a number is undefined: that it is, is compared (None)
    ("metrics.eigen", "solver_dependent"),
    ("ci.eigen", "solver_dependent"),
    ("*.eigen", "round_off"),
    ("p2_code.*", "solver_dependent"),
    ("*.pearson", "column_wise"),
    ("*.direct_cosine", "column_wise"),
    ("directions_imprecise.*", "ill_conditioned"),
    ("routes.naive_float32.*", "float32"),
    ("metrics.max_route_ratio", "float32"),
    ("ci.max_route_ratio", "float32"),
    ("ci.*", "interval"),
    ("ci_null.*", "interval"),
)

#: Fields a reference written before them lacks (method §7.2: every ``vs_null`` entry has the
#: same fields since issue 46): ``report diff`` counts them where only the run has them, and
#: compares them, by their kind, where both have them; any other field on one side only differs.
ADDED_FIELDS = ("vs_null.*.smallest_p", "vs_null.*.n_samples", "output_fit.vs_null.p_adjusted",
                "output_fit.vs_null.tost_p_adjusted", "output_fit.vs_null.can_reject",
                "output_fit.vs_null.smallest_p")

_INDEX = re.compile(r"\[\d+\]")
#: A record's round-off widths and its twin's verdict (method §13.2): estimates, not results.
_WIDTH_KEYS = ("round_off", "round_off_verdict")


def kind_of(path: str, value) -> str:
    """The field kind of the leaf at ``path`` (e.g. ``ci.optimal_cosine[0]``) holding ``value``."""
    bare = _INDEX.sub("", path)
    for pattern, kind in KIND_RULES:
        if fnmatch.fnmatchcase(bare, pattern):
            return kind
    if isinstance(value, float) and not isinstance(value, bool):
        return "judged"
    return "exact"


def added_since(path: str) -> bool:
    """Whether the leaf at ``path`` is one of :data:`ADDED_FIELDS`."""
    return any(fnmatch.fnmatchcase(_INDEX.sub("", path), p) for p in ADDED_FIELDS)


def rel_diff(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|) (0 for two zeros; inf when only one side is finite)."""
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def differences(got, want, prefix: str = "", widths: dict[str, float] | None = None) -> list[str]:
    """Where ``got`` and ``want`` (JSON values) differ beyond the tolerance of each leaf's kind:
    ``["metrics.pearson: 0.1 → 0.2 (judged)", "verdict: refuted → supported", ...]``. Keys, their
    order and the list lengths must be equal; text (evidence) is compared through its numbers,
    so it is skipped; so are the round-off widths, which widen the tolerance of every number of
    their metric in either record (:func:`round_off_widths`). The goldens of the tests compare
    with this."""
    out: list[str] = []
    if isinstance(want, dict) and isinstance(got, dict):
        if widths is None and not prefix:
            widths = round_off_widths(got, want)
        keys = [[k for k in d if k not in _WIDTH_KEYS] for d in (got, want)]
        if keys[0] != keys[1]:
            out.append(f"{prefix or '<top>'}: keys {keys[0]} != {keys[1]}")
        for key in want:
            if key in got and key not in _WIDTH_KEYS:
                out += differences(got[key], want[key], f"{prefix}.{key}" if prefix else str(key),
                                   widths)
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{prefix}: {len(got)} items != {len(want)}"]
        for i, (a, b) in enumerate(zip(got, want)):
            out += differences(a, b, f"{prefix}[{i}]", widths)
        return out
    kind = kind_of(prefix, want)
    if kind == "text":
        return out
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (got, want))
    if numbers and kind != "exact":
        width = (widths or {}).get(metric_of(prefix), 0.0)
        if not TOLERANCES[kind].agree(float(got), float(want), width):
            out.append(f"{prefix}: {got!r} → {want!r} ({kind}, relative {rel_diff(got, want):.2g})")
    elif got != want or type(got) is not type(want):
        out.append(f"{prefix}: {got!r} → {want!r}")
    return out
