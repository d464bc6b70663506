"""The records of results.json, typed: one dataclass per record shape, one ``to_json``, one
``from_json``.

A record is what a claim test writes (through the ``record_result`` fixture) and what the report,
the baseline gate and the drill-down notebook read. Its JSON keys are the dataclass fields, so the
field names below are the one list of record fields; the key order of the JSON object is each
shape's ``_ORDER`` (results.json is written without sorting keys, and must stay byte-stable).

- :class:`Record`: the fields every record has (claim, level, model, layer, head, verdict, ...),
  and the shape of a record whose claim has no class of its own (its other keys in ``extra``).
- :class:`VRecord`: claim V, head and model level (method §2).
- :class:`JRecord`: claim J, layer and model level (method §3); :class:`JTrendRecord`: its
  training series.
- :class:`EModelRecord`: claim E's eigenvalue statistics by route; :class:`EHeadRecord`: its
  γ constancy per head (method §4).

A field whose value is None is left out of the JSON object, except ``layer`` and ``head``, which
every record carries (null above their level). Keys a reader does not know are kept, in order, in
``extra`` and written back after the known ones. A record also reads like the JSON object it
writes (``record["verdict"]``), so code that indexed the former dicts keeps working.

Standard library only: the report reads records without torch.

>>> rec = Record.from_json({"claim": "X", "level": "model", "model": "m", "layer": None,
...                         "head": None, "verdict": "supported", "entropy": 0.5})
>>> type(rec).__name__, rec.verdict, rec.extra
('Record', 'supported', {'entropy': 0.5})
>>> rec.to_json()
{'claim': 'X', 'level': 'model', 'model': 'm', 'layer': None, 'head': None, 'verdict': 'supported', 'entropy': 0.5}
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .registry import UNITS

#: The record levels, finest first (a claim's ``unit`` is one of them): the registry's units.
LEVELS = UNITS
#: The verdicts a record can carry (``claims.verdicts`` decides them).
#: "partial" is claim V's tier between supported and refuted (method §2.6): some of V̂'s top
#: directions shared, above chance and above the random-init twin.
VERDICTS = ("supported", "refuted", "inconclusive", "undetermined", "partial")

#: Fields written even when None (a model record's ``layer`` and ``head`` are null).
_ALWAYS = ("claim", "level", "model", "layer", "head")
#: Fields the ``record_result`` fixture adds to every record, written after the claim's own.
_TAIL = ("test_id", "options")


@dataclass(kw_only=True)
class Record(Mapping):
    """A record of any claim: the fields every record has; any other key sits in ``extra``."""

    claim: str
    level: str
    model: str
    layer: int | None = None
    head: int | None = None
    verdict: str | None = None
    verdicts: dict[str, str] | None = None
    rules: str | None = None
    metrics: dict[str, Any] | None = None
    ci: dict[str, list[float]] | None = None
    evidence: str | None = None
    reason: str | None = None
    undefined: dict[str, str] | None = None
    test_id: str | None = None
    options: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    #: The JSON key order of the shape (its fields; ``extra`` and the tail keys follow).
    _ORDER: ClassVar[tuple[str, ...]] = ("claim", "level", "model", "layer", "head", "verdict",
                                         "verdicts", "rules", "metrics", "ci", "evidence",
                                         "reason", "undefined")

    # ------------------------------------------------------------------ JSON
    def _order(self) -> tuple[str, ...]:
        return self._ORDER

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the record, in its shape's key order (None fields left out,
        except ``layer`` and ``head``)."""
        out = {}
        for name in self._order():
            value = getattr(self, name)
            if value is not None or name in _ALWAYS:
                out[name] = value
        out.update(self.extra)
        for name in _TAIL:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Record:
        """The typed record of a JSON object: the class registered for its (claim, level)
        (:func:`record_class`), or :class:`Record` for one no class is registered for."""
        if cls is Record:
            cls = record_class(obj.get("claim"), obj.get("level"))
        known = cls._fields()
        kwargs = {k: v for k, v in obj.items() if k in known}
        for name in ("claim", "level", "model"):
            if not isinstance(kwargs.get(name), str):
                raise ValueError(f"a record needs a string {name!r}, got {obj.get(name)!r}")
        return cls(**kwargs, extra={k: v for k, v in obj.items() if k not in known})

    # ------------------------------------------------------------------ reading
    def lookup(self, table: str, name: str):
        """``name`` in the record's table ``table`` (a dict field such as ``null``, ``ci``,
        ``vs_null``, or a key of ``extra``); None when the record has no such table or entry."""
        found = getattr(self, table, None) if table in self._fields() else self.extra.get(table)
        return found.get(name) if isinstance(found, dict) else None

    def ci_of(self, name: str, key: str = "ci") -> list[float] | None:
        """The [lo, hi] interval of metric ``name`` in ``ci`` (or ``ci_null``); None if none."""
        return self.lookup(key, name)

    def metric(self, name: str):
        """The value of metric ``name``; None when the record has none."""
        return self.lookup("metrics", name)

    @classmethod
    def _fields(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls)) - {"extra"}

    # A record reads like the JSON object it writes (record["verdict"]).
    def __getitem__(self, key: str):
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(kw_only=True)
class VRecord(Record):
    """Claim V (method §2), a head or a model: metrics beside their nulls, intervals, the test
    against chance; undetermined records carry ``reason`` and ``n_few_tokens`` instead of
    ``evidence``."""

    layers: list[int] | None = None
    heads: list[int] | None = None
    head_verdicts: dict[str, int] | None = None
    head_verdicts_by_rules: dict[str, dict[str, int]] | None = None
    null: dict[str, float] | None = None
    std: dict[str, float] | None = None
    n_used: int | None = None
    ci_null: dict[str, list[float]] | None = None
    vs_null: dict[str, dict[str, Any]] | None = None
    n_samples: int | None = None
    n_undetermined: int | None = None
    n_few_tokens: int | None = None
    mu_d_min: float | None = None
    p2_code: dict[str, float] | None = None
    p2_code_units: int | None = None  # p2_code over a seeded subset of samples (method §8.3)
    p2_code_exact: dict[str, float] | None = None
    effective_rows: float | None = None  # median 1/Σw² of G's 1/g² weights (method §2.2)
    degenerate: bool | None = None  # V_hat carried by about one token: never judged
    #: The random-init twin's means (top-weighted share, shared directions) and the test of the
    #: judged share against it (method §2.6: the tier "partial").
    init_twin: dict[str, Any] | None = None

    _HEAD = ("claim", "level", "model", "layer", "head", "layers", "heads", "head_verdicts",
             "head_verdicts_by_rules")
    _ORDER = (*_HEAD, "verdict", "verdicts", "rules", "metrics", "null", "std", "n_used", "ci",
              "ci_null", "vs_null", "init_twin", "n_samples", "n_undetermined", "evidence",
              "mu_d_min", "p2_code", "p2_code_units", "p2_code_exact", "effective_rows",
              "degenerate")
    #: An unjudged (undetermined) record lists its verdicts after the statistics.
    _UNDETERMINED_ORDER = (*_HEAD, "verdict", "metrics", "null", "std", "n_used", "ci", "ci_null",
                           "verdicts", "rules", "vs_null", "init_twin", "n_samples",
                           "n_undetermined",
                           "n_few_tokens", "reason", "mu_d_min", "p2_code",
                           "p2_code_units", "p2_code_exact", "effective_rows", "degenerate")

    def _order(self) -> tuple[str, ...]:
        # a judged record carries evidence; one left unjudged (too many undetermined samples)
        # carries its reason instead, and lists its verdicts after the statistics
        return self._ORDER if self.evidence is not None else self._UNDETERMINED_ORDER


@dataclass(kw_only=True)
class JRecord(Record):
    """Claim J (method §3), a layer or a model: pooled magnitudes, their interval, P1's logged
    quantity (``p1_code``) and the reference range the record was judged beside."""

    p1_code: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    per_head: dict[str, list] | None = None
    layers: list[int] | None = None
    heads: list[int] | None = None
    per_layer: dict[str, list] | None = None
    tokens: dict[str, Any] | None = None  # per-token statistics of ||h||^2/||phi||^2 (method §3.7)
    output_fit: dict[str, Any] | None = None  # the KPCA output fit and its null (method §3.6)

    _ORDER = ("claim", "level", "model", "layer", "head", "verdict", "verdicts", "rules",
              "metrics", "p1_code", "reference", "evidence", "ci", "per_head", "layers", "heads",
              "per_layer", "tokens", "output_fit", "undefined", "reason")


@dataclass(kw_only=True)
class JTrendRecord(Record):
    """Claim J over a training series (method §3, P1 Fig. 1): the points and the trend."""

    series: list[dict[str, Any]] | None = None
    trend: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None

    _ORDER = ("claim", "level", "model", "layer", "head", "verdict", "verdicts", "rules",
              "metrics", "series", "trend", "undefined", "reason", "reference", "evidence")


@dataclass(kw_only=True)
class EModelRecord(Record):
    """Claim E's eigenvalue statistics of a model by route (method §4)."""

    routes: dict[str, dict[str, Any]] | None = None
    route_ratios: dict[str, float | None] | None = None
    layers: list[int] | None = None
    heads: list[int] | None = None

    _ORDER = ("claim", "level", "model", "layer", "head", "verdict", "verdicts", "rules",
              "metrics", "ci", "routes", "route_ratios", "layers", "heads", "evidence",
              "undefined", "reason")


@dataclass(kw_only=True)
class EHeadRecord(Record):
    """Claim E's γ constancy of one head (method §4): relative spreads of the learned V beside
    its two controls."""

    abs: dict[str, float] | None = None
    closer_to_eigen_share: float | None = None
    n_samples: int | None = None
    n_undetermined: int | None = None
    effective_rows: float | None = None  # median 1/Σw² of G's 1/g² weights (method §2.2)
    degenerate: bool | None = None
    subspace: dict[str, float] | None = None  # invariant-subspace residuals (method §4.2)

    _ORDER = ("claim", "level", "model", "layer", "head", "metrics", "abs",
              "closer_to_eigen_share", "n_samples", "n_undetermined", "ci", "rules", "verdict",
              "verdicts", "evidence", "undefined", "reason", "effective_rows", "degenerate",
              "subspace")


_CLASSES: dict[tuple[str, str], type[Record]] = {
    ("V", "head"): VRecord, ("V", "model"): VRecord,
    ("J", "layer"): JRecord, ("J", "model"): JRecord, ("J", "series"): JTrendRecord,
    ("E", "model"): EModelRecord, ("E", "head"): EHeadRecord,
}


def register_record(claim: str, level: str, cls: type[Record]) -> None:
    """Read records of ``claim`` at ``level`` as ``cls`` (a claim with a record shape of its
    own registers it next to its :class:`~claims.registry.ClaimSpec`)."""
    if not (isinstance(cls, type) and issubclass(cls, Record)):
        raise TypeError(f"{cls!r} is not a subclass of claims.records.Record")
    _CLASSES[(claim, level)] = cls


def record_class(claim, level) -> type[Record]:
    """The record class of (claim, level); :class:`Record` when none is registered."""
    return _CLASSES.get((claim, level), Record)


def as_json(record) -> dict[str, Any]:
    """A record as its JSON object: a typed record's :meth:`Record.to_json`, a dict as it is."""
    return record.to_json() if hasattr(record, "to_json") else dict(record)


def finite_or_none(x) -> float | None:
    """A number for a JSON row: the float, or None when it is not finite (method §6.2).

    >>> finite_or_none(0.5), finite_or_none(float("nan")), finite_or_none(float("-inf"))
    (0.5, None, None)
    """
    x = float(x)
    return x if x == x and abs(x) != float("inf") else None


def head_sample_rows(claim: str, record: dict, names: list, undetermined, used) -> list[dict]:
    """The keys of the ``--save-samples`` rows behind a head record, one row per sample: the
    record's claim, model, level, layer and head, the sample's index and name, and whether it is
    undetermined and whether it enters the record's means (``used``); the claim adds its values.

    >>> import torch
    >>> rows = head_sample_rows("V", {"model": "m", "layer": 1, "head": 2}, ["a"],
    ...                         torch.tensor([False, True]), torch.tensor([True, False]))
    >>> [(r["sample"], r["sample_name"], r["undetermined"], r["used"]) for r in rows]
    [(0, 'a', False, True), (1, None, True, False)]
    """
    return [{"claim": claim, "model": record["model"], "level": "head", "layer": record["layer"],
             "head": record["head"], "sample": s, "sample_name": names[s] if s < len(names) else None,
             "undetermined": bool(undetermined[s]), "used": bool(used[s])}
            for s in range(int(undetermined.numel()))]


def plain(obj):
    """Convert to JSON/execnet-safe Python types (no tensors, no numpy scalars): what a record
    becomes in results.json, with :func:`undefined_intervals`."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if obj != obj else ("inf" if obj > 0 else "-inf")  # JSON has no inf/NaN
    return obj


def undefined_intervals(rec: dict) -> dict:
    """An interval that could not be computed (fewer than 2 usable samples: method §7) is
    recorded as null, with the reason under ``undefined["ci"]``, never as a point or "nan"."""
    gone = []
    for field in ("ci", "ci_null"):
        table = rec.get(field)
        if not isinstance(table, dict):
            continue
        for name, bounds in table.items():
            if isinstance(bounds, list) and bounds and all(b in ("nan", None) for b in bounds):
                table[name] = None
                gone.append(name if field == "ci" else f"{name} (null)")
    if gone:
        rec["undefined"] = {**(rec.get("undefined") or {}), "ci": (
            f"no 95% interval of {', '.join(dict.fromkeys(gone))}: a bootstrap interval needs at "
            f"least 2 usable samples, this record has {rec.get('n_used', rec.get('n_samples', 'fewer'))}")}
    return rec
