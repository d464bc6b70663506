"""The registry of claims: one :class:`ClaimSpec` per claim, registered where the claim is defined.

A claim is one module (``claims/claim_v.py``) that registers its spec with :func:`register`, plus
its math in ``checks/``, its rules in ``claims/thresholds.toml`` and, if it wants more than the
generic report section, a Jinja partial. Everything else (batching, caching, device, non-finite
checks, progress, parametrisation over models × layers × heads, results, report) iterates over
this registry; no other module names a claim.

This module itself uses the standard library only; ``import claims`` registers the built-in claims
(V, J, E). The spec's callables are given as ``"module:function"`` strings, imported on first use
(:func:`resolve`), so that a spec can name code (a report section, say) in a layer above it
without importing it.

>>> spec = ClaimSpec(id="X", section="claim_x", title="a toy claim", statement="x holds",
...                  source="method §1", unit="head", levels=("head",),
...                  layer_metrics="claims.claim_x:layer_metrics")
>>> spec.id, spec.section
('X', 'claim_x')
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

#: The units a claim test can be parametrised over, finest first.
UNITS = ("head", "layer", "model", "series")


@dataclass(frozen=True)
class ClaimSpec:
    """What the rest of kpca-claims needs to know about one claim.

    Attributes
    ----------
    id : str
        Short id used in records (``"claim"`` field), verdict tables and test ids: ``"V"``.
    section : str
        Its section of ``claims/thresholds.toml`` and its cache folder: ``"claim_v"``.
    title, statement, source : str
        One-line title, one-sentence statement and where it comes from (P1/P2 and method §N).
    unit : str
        The finest unit it is judged on (one of :data:`UNITS`).
    levels : tuple of str
        Every record level its tests write (e.g. ``("head", "model")``).
    layer_metrics : str, callable or None
        ``"module:function"`` (or the function itself): the batched per-layer computation.
        The session calls it generically as ``layer_metrics(ctx)`` with a
        :class:`fixtures.engine.layer_context.LayerContext` (the layer, the model's info, the run options,
        ``ctx.groups()`` over batches of q, k, v on the device, ``ctx.fill``/``ctx.located``),
        and caches, checks (non-finite values) and reports progress on what it returns:
        ``{name: tensor [samples, heads, ...]}``. None: the claim needs no per-layer metrics.
    code : tuple of str
        Project modules (``"claims.claim_r"``; a ``.py`` path is taken too) whose code keys its
        cached per-layer metrics, besides the module of ``layer_metrics`` and the generic
        batching code; the modules these import count too (``fixtures.cache.code_fingerprint``).
    metrics : tuple of str
        Its judged metric names, in report order.
    report_context : str or None
        ``"module:function"`` building the context of its report section; None: generic section.
    template : str or None
        Its Jinja partial (a path relative to the project root); None: the generic partial.
    nonfinite_ok : tuple of str
        Per-layer metrics that may hold NaN (computed on a subset of samples only); every other
        per-layer metric must be finite, or the run stops naming model, layer, head and sample.
    extra : dict
        Anything else a consumer wants to know (free-form, not read by the runtime).
    settings : str, callable or None
        ``"module:function"`` (or the function) returning a JSON-able dict of the settings its
        cached per-layer metrics depend on beyond the run options (claim V: the allclose
        tolerances of ``[claim_v.allclose]``); part of the cache key.
    thresholds : dict, str or None
        The rule sections of a claim whose rules are not in ``claims/thresholds.toml`` (a claim
        from outside this repository): ``{section: {...}}`` shaped like the TOML file's sections,
        or the path of a TOML file holding them. :func:`claims.verdicts.load_thresholds` adds
        them to the file's sections (a section of the same name that differs is an error).
    tests : str or None
        The test module that judges it (``"claims/test_value_vectors.py"``), for tables that
        group tests by claim.
    method_version : str
        The version of its method (metrics, nulls, verdict rules), recorded in results.json's
        ``methods``: bump it when a metric's definition changes, so that records of two versions
        are not compared as equals (the code and threshold digests beside it change with any edit).
    record_sections : dict
        ``{level: section}``: the rule section a record of that level is judged by, where it is not
        ``section`` (claim J's series records: ``"claim_j_trend"``); its judged metrics lead the
        record's one-line evidence (:func:`claims.outcome.one_line`).
    sample_rows : str, callable or None
        ``"module:function"`` (or the function) giving the ``--save-samples`` rows behind one of
        its records: ``sample_rows(record, run) -> list[dict]``, ``run`` the record's
        :class:`fixtures.engine.model_run.ModelRun` (``run.layer_metrics(id, layer)``,
        ``run.prepare()``); ``[]`` for a record without rows. None: its records have no rows.
    curve : str, callable or None
        ``"module:function"`` (or the function): the claim's records of one compute combination
        of the specification curve (``--multiverse``, method §14), from its per-layer metrics,
        called with the arguments it names among ``model``, ``per_layer`` ({layer: metrics}),
        ``heads``, ``rules`` and ``info`` (the model's facts); returns ``{"model": record,
        "units": {name: record}}`` as JSON objects. None: the claim has no curve.
    curve_entries : dict
        ``{entry: {"unit": level or None, "headline": (metric, ...), "model_verdict": bool}}``:
        the curve entries the claim contributes (claim E: its eigenvalue statistics, judged per
        model, and its γ, judged per head), each with the unit its unit verdicts count (None:
        none), the metrics each specification shows, and whether the model verdict is judged
        (default true). Empty: one entry named by the id, model verdict only.
    curve_route : str, callable or None
        ``"module:function"``: a factory ``route(ctx) -> compute(spec) -> outcome`` for a claim
        that computes its specifications other than the run's own itself (claim V's grid: one
        eigendecomposition per (standardisation, precision) for every axis convention and null),
        ``ctx`` the engine's :class:`fixtures.engine.multiverse_metrics.CurveContext`; None: each
        specification's per-layer metrics come from ``layer_metrics`` under its options.
    curve_decide : str, callable or None
        ``"module:function"``: ``decide(record, decide, rule_set) -> (verdict, metrics) | None``,
        the claim's own decision under the decide-stage axis values ``decide`` (claim J's
        ``j_statistic``): None where the record's verdict under ``rule_set`` stands, else the
        verdict and the headline metrics it was judged on. None: the rule set decides.
    axes : dict
        Specification axes of the claim's own, ``{name: table}`` shaped like a
        ``claims/specifications.toml`` ``[axes.<name>]`` table without ``claims`` (the claim
        itself): :func:`claims.multiverse.load_grid` adds them to the file's axes.
    provides, takes, intake : dict
        What a claim's curve route shares with another claim's specification runs, through named
        channels (method §14.1: claim J of a specification takes V̂ from claim V's grid).
        ``provides``: ``{channel: (run option, ...)}``, the channels its route fills and the run
        options that key a taker's store (``{"v_hat": ("standardize", "dtype")}``). ``takes``:
        ``{channel: tag}``, the channels it reads in a specification's run; its cached metrics
        carry ``{channel: tag}`` in their key when one is given. ``intake``: ``{channel:
        "module:function"}``, turning the provider's offer of one batch into the values the taker
        stores: ``intake(payload, keys) -> {key: value}`` (none: the offer is ``{key: value}``).
    init_twin : bool
        True: its ``layer_metrics`` reads the model's random-init twin on the same inputs
        (``ctx.init_twin()``, method §2.6: claim V's tier "partial" is judged against it); the
        engine then keys its cached metrics by the twin's capture too.
    records : dict
        ``{level: "module:function"}``: the function that makes a record of that level from a
        model run, called with the arguments it names among ``run``, ``model``, ``layer``,
        ``head``, ``layers`` and ``heads`` (:func:`claims.stored_run.rebuild`). The merge of layer
        shards (``--shard-by layers``) rebuilds a model's records with them from the per-layer
        metrics the shards stored; a claim without it cannot be sharded by layers.
    heads : {"query", "kv"}
        What its head unit is on a grouped-query model (method §5.7): ``"kv"`` when it reads the
        keys and values only (claims V and E: the Gram, V̂ and γ are the same for every query
        head of a group), so that it is judged once per (layer, KV head), test id
        ``model-Lxx-KVy``; ``"query"`` (the default) when it reads the queries, once per query
        head (``model-Lxx-Hz``), query head h reading KV head h // n_rep.
    controls : str, callable or None
        ``"module:function"`` (or the function) returning its expected verdicts on the controls
        (method §12), under the rule set ``ours``: ``{kind: {level: (verdicts, why)}}``. The kinds
        are the ladder members' names (``fixtures.models.families.kpca_oracle.MEMBERS``:
        ``"vhat"``, ``"rotated"``, ..., ``"null"``, ``"random-init"``, ``"random-init-p1"``,
        ``"keys-p1"``) and ``"random-init-model"`` (the default run's random-initialised
        models); ``verdicts`` a tuple drawn from ``"supported"``, ``"refuted"``,
        ``"inconclusive"``, ``"undetermined"`` (empty: no expectation), ``why`` one sentence
        saying why. A kind or level it leaves out has no expectation. Checked where it is used
        (:func:`fixtures.plugin.control_outcomes.expectation`): an unknown kind, a level not
        among its ``levels`` or an unknown verdict word is a ValueError naming the claim.
        None: no expectation on any control (claims/claim_v_controls.py is an example).
    """

    id: str
    section: str
    title: str
    statement: str
    source: str
    unit: str
    levels: tuple[str, ...]
    layer_metrics: str | Callable | None = None
    code: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    report_context: str | None = None
    template: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    settings: str | Callable | None = None
    thresholds: dict | str | None = None
    tests: str | None = None
    nonfinite_ok: tuple[str, ...] = ()
    method_version: str = "1"
    record_sections: dict[str, str] = field(default_factory=dict)
    sample_rows: str | Callable | None = None
    curve: str | Callable | None = None
    curve_entries: dict[str, dict] = field(default_factory=dict)
    curve_route: str | Callable | None = None
    curve_decide: str | Callable | None = None
    axes: dict[str, dict] = field(default_factory=dict)
    provides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    takes: dict[str, str] = field(default_factory=dict)
    intake: dict[str, str | Callable] = field(default_factory=dict)
    heads: str = "query"
    init_twin: bool = False
    records: dict[str, str] = field(default_factory=dict)
    controls: str | Callable | None = None

    def __post_init__(self) -> None:
        if self.heads not in ("query", "kv"):
            raise ValueError(f"claim {self.id!r}: heads {self.heads!r} is not 'query' or 'kv'")
        if self.unit not in UNITS:
            raise ValueError(f"claim {self.id!r}: unit {self.unit!r} is not one of {UNITS}")
        bad = [lv for lv in self.levels if lv not in UNITS]
        if bad:
            raise ValueError(f"claim {self.id!r}: levels {bad} are not among {UNITS}")
        for name, table in (("record_sections", self.record_sections), ("records", self.records)):
            stray = [lv for lv in table if lv not in self.levels]
            if stray:
                raise ValueError(f"claim {self.id!r}: {name} names levels {stray} that are not "
                                 f"among its levels {self.levels}")
        for entry, table in self.curve_entries.items():
            unit = table.get("unit")
            if unit is not None and unit not in self.levels:
                raise ValueError(f"claim {self.id!r}: curve entry {entry!r} counts unit {unit!r}, "
                                 f"which is not among its levels {self.levels}")
        stray = [c for c in self.intake if c not in self.takes]
        if stray:
            raise ValueError(f"claim {self.id!r}: intake names channels {stray} it does not take")
        if not isinstance(self.method_version, str) or not self.method_version:
            raise ValueError(f"claim {self.id!r}: method_version must be a non-empty string, "
                             f"not {self.method_version!r}")


_CLAIMS: dict[str, ClaimSpec] = {}


def register(spec: ClaimSpec) -> ClaimSpec:
    """Register ``spec``; registering the same spec again is a no-op, another spec under a
    taken id or section is an error naming both."""
    for other in _CLAIMS.values():
        if other == spec:
            return spec
        if other.id == spec.id or other.section == spec.section:
            raise ValueError(f"claim {spec.id!r} ({spec.section}) clashes with the registered "
                             f"claim {other.id!r} ({other.section}); pick another id and section")
    _CLAIMS[spec.id] = spec
    return spec


def unregister(claim_id: str) -> None:
    """Remove a claim (tests that register a toy claim clean up with this)."""
    _CLAIMS.pop(claim_id, None)


def get(claim_id: str) -> ClaimSpec:
    """The spec registered under ``claim_id``; an unknown id names the registered ones."""
    try:
        return _CLAIMS[claim_id]
    except KeyError:
        raise KeyError(f"no claim {claim_id!r} is registered; registered: "
                       f"{', '.join(_CLAIMS) or 'none'}") from None


def entries_of(spec: ClaimSpec) -> dict[str, dict]:
    """The specification-curve entries of ``spec`` (``ClaimSpec.curve_entries``; by default one
    entry named by its id, model verdict only), each with ``unit``, ``headline`` and
    ``model_verdict`` filled in; ``{}`` for a claim without a curve."""
    if spec.curve is None:
        return {}
    tables = spec.curve_entries or {spec.id: {}}
    return {entry: {"unit": t.get("unit"), "headline": tuple(t.get("headline", ())),
                    "model_verdict": bool(t.get("model_verdict", True)), "claim": spec.id}
            for entry, t in tables.items()}


def provider_of(channel: str) -> ClaimSpec:
    """The registered claim whose curve route fills ``channel`` (``ClaimSpec.provides``)."""
    found = [s for s in _CLAIMS.values() if channel in s.provides]
    if len(found) != 1:
        raise KeyError(f"channel {channel!r} is provided by {len(found)} registered claims "
                       f"({', '.join(s.id for s in found) or 'none'}); exactly one must provide it")
    return found[0]


def all_claims() -> tuple[ClaimSpec, ...]:
    """Every registered claim, in registration order (V, J, E first)."""
    return tuple(_CLAIMS.values())


def resolve(target: str | Callable) -> Callable:
    """Import ``"package.module:function"`` and return the function (a callable is returned
    as it is)."""
    if callable(target):
        return target
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"{target!r} is not of the form 'module:function'")
    return getattr(importlib.import_module(module), name)
