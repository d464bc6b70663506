"""Claim V's route through the specification curve (``--multiverse``, method §14.1): its
specifications other than the run's own come from one grid per token set (padding, first token),
one Gram matrix and eigendecomposition per (standardisation, precision) for both axis conventions
and both nulls (claims/claim_v_grid.py), each layer cached; the optimal cosine is matched only
where a verdict depends on its exact value. The grid fills the ``v_hat`` and ``grams`` channels
(``ClaimSpec.provides``) of the specifications whose claims J and E take them.

``route(ctx)`` is declared as claim V's ``ClaimSpec.curve_route``; ``ctx`` is the engine's
:class:`fixtures.engine.multiverse_metrics.CurveContext` (the base run, its derived runs, the
channels' stores, the per-layer cache).
"""

from __future__ import annotations

import torch

from . import claim_v, verdicts
from . import multiverse as mv
from .claim_v_grid import DEFAULT_NULL, NULLS, combo_key, v_grid_layer, v_matched_layer

#: The claim this route computes.
CLAIM = "V"
#: The axes one grid covers itself (one Gram per standardisation and precision, both axis
#: conventions and both nulls from it); every other compute axis (padding, first token, kernel
#: scale, ...) makes a grid of its own, on a run of those options.
GRID_AXES = ("standardize", "dtype", "axis_convention", "null")
#: The module whose code keys the route's cached layers (with claim V's own).
CODE = "claims.claim_v_curve"


def v_outcomes(model: str, per_layer: dict, heads: list[int], rules: str) -> dict:
    """Claim V's head and model records of one compute combination, built as the claim tests
    build them (claims/test_value_vectors.py): ``{"model": record, "units": {name: record}}``."""
    record, heads_of = claim_v.model_over_heads(model, per_layer, heads, rules)
    units = {f"L{layer:02d}-H{head}": rec for (layer, head), rec in heads_of.items()}
    return mv.plain({"model": record, "units": units})


#: The per-(sample, head) upper bounds of the optimal cosine a claim-V layer may carry in place
#: of the matched value (claims/claim_v_grid.py ``v_grid_layer``): ``optimal_cosine`` then holds
#: the lower bound (the identity matching, the direct cosine).
V_UPPER = {"optimal_cosine": "optimal_cosine_hi", "optimal_cosine_null": "optimal_cosine_null_hi"}


def v_outcomes_bounded(model: str, per_layer: dict, heads: list[int], rules: str) -> dict | None:
    """Claim V's records of one compute combination whose optimal cosine is known only between
    bounds, when no verdict depends on where between them it lies (:func:`v_bounded`), else
    None: then the caller matches."""
    outcome, open_units = v_bounded(model, per_layer, heads, rules)
    return outcome if open_units == [] else None


def v_bounded(model: str, per_layer: dict, heads: list[int],
              rules: str) -> tuple[dict | None, list[tuple[int, int]] | None]:
    """Claim V's records of one compute combination whose optimal cosine is known only between
    bounds (lower: the identity matching; upper: the mean row maximum of the cosine matrix; a
    unit whose exact value is known carries it as both), without the Hungarian matching. The
    `ours` rules do not judge the optimal cosine (``[claim_v.ours]``); the `p2` rules judge its
    mean against bars, and their verdict can only rise with it, so a verdict is exact when the
    lower and the upper bound give the same one.

    Returns ``(outcome, open_units)``: the records (:func:`v_outcomes`, built on the lower bound,
    the model record's ``optimal_cosine`` replaced by None and its bounds
    ``optimal_cosine_bounds``) and the (layer, head) units whose p2 verdict differs between the
    bounds (``[]``: every verdict is exact). ``open_units`` is None, and so is the outcome, when
    the model record's verdict differs between the bounds or an `ours` rule judges the optimal
    cosine: then every head needs its exact value."""
    if any(r.metric in V_UPPER for kind in ("supported", "refuted")
           for r in verdicts.ours_rules(claim_v.SECTION, kind)):
        return None, None
    base = {l: {n: t for n, t in m.items() if n not in V_UPPER.values()}
            for l, m in per_layer.items()}
    outcome = v_outcomes(model, base, heads, rules)
    layers = sorted(per_layer)

    def upper_mean(values: torch.Tensor, undetermined: torch.Tensor) -> float:
        keep = ~undetermined.reshape(-1)
        return float(values.reshape(-1).to(torch.float64)[keep].mean())

    def same_at_upper(rec: dict, values: torch.Tensor, undetermined: torch.Tensor) -> bool:
        if rec["verdicts"]["p2"] == verdicts.UNDETERMINED:  # not judged: no bar is applied
            return True
        metrics = {**rec["metrics"], "optimal_cosine": upper_mean(values, undetermined)}
        return verdicts.judge(claim_v.SECTION, metrics).verdict == rec["verdicts"]["p2"]

    hi = torch.cat([per_layer[l]["optimal_cosine_hi"][:, heads] for l in layers], dim=1)
    undet = torch.cat([per_layer[l]["undetermined"][:, heads] for l in layers], dim=1)
    model_rec = outcome["model"]
    if not same_at_upper(model_rec, hi, undet):
        return None, None
    open_units = [(layer, head) for layer in layers for head in heads
                  if not same_at_upper(outcome["units"][f"L{layer:02d}-H{head}"],
                                       per_layer[layer]["optimal_cosine_hi"][:, head],
                                       per_layer[layer]["undetermined"][:, head])]
    lo = model_rec["metrics"]["optimal_cosine"]
    model_rec["metrics"] = {**model_rec["metrics"], "optimal_cosine": None}
    model_rec["optimal_cosine_bounds"] = [lo, upper_mean(hi, undet)]
    return outcome, open_units


def route(ctx) -> "VRoute":
    """Claim V's route for one model's specification curve (``ClaimSpec.curve_route``)."""
    return VRoute(ctx)


def with_matched(bounded: dict, exact: dict, heads: list[int] | None = None) -> dict:
    """A layer of :func:`claims.claim_v_grid.v_grid_layer` (bounds of the optimal cosine) with
    the exact values of :meth:`VRoute.matched` in their place: the layer metrics the claim test
    would compute. With ``heads``, only those heads' values are exact: the layer keeps its
    bounds, the matched heads carrying their exact value as both (for
    :func:`claims.multiverse.v_bounded`)."""
    if heads is None:
        return {n: (exact[n] if n in V_UPPER else t) for n, t in bounded.items()
                if n not in V_UPPER.values()}
    out = dict(bounded)
    for name, upper in V_UPPER.items():
        for n in (name, upper):
            out[n] = bounded[n].clone()
            out[n][:, heads] = exact[name][:, heads]
    return out


class VRoute:
    """Claim V under the non-default compute combinations of one model's curve: call it with a
    specification (axis → value) for its outcome (records, or ``{"error": why}``)."""

    def __init__(self, ctx):
        self.ctx = ctx
        default = ctx.default
        values = {a.name: a.values for a in mv.axes_for(ctx.grid, CLAIM, ctx.modality, ctx.causal)}
        self.combos = sorted({(std == "on", dtype)
                              for std in {*values.get("standardize", ()), default["standardize"]}
                              for dtype in {*values.get("dtype", ()), default["dtype"]}})
        self.own_combo = (default["standardize"] == "on", default["dtype"])
        self.grids: dict[tuple, tuple] = {}  # variant → (per_combo, errors)
        self.exact: dict[tuple, tuple[dict, dict]] = {}  # (variant, std, dtype) → (done, values)
        self.matched: list[str] = []
        ctx.extra["v_matched"] = self.matched

    def variant_of(self, spec: dict) -> tuple:
        """The run a specification's grid is computed on: its compute axes outside
        :data:`GRID_AXES` that differ from the default, as (axis, value) pairs (``()``: the base
        run); also the store group of the channels it fills (``CurveContext.group_of``)."""
        ctx = self.ctx
        return tuple((a, v) for a, v in spec.items() if ctx.grid[a].stage == "compute"
                     and a not in GRID_AXES and ctx.default.get(a) != v)

    def grid(self, variant: tuple) -> tuple[dict, dict]:
        """The grid of one variant (:meth:`variant_of`) over the curve's layers: ``(per_combo,
        errors)``, with ``per_combo[combo_key]`` → {layer: metrics}. Building it fills the
        ``v_hat`` stores of every (standardisation, precision) and the ``grams`` stores of every
        standardisation of this variant but the main run's own (a specification's claim J and E
        take them)."""
        if variant in self.grids:
            return self.grids[variant]
        ctx, own = self.ctx, variant == ()
        v_hats = ctx.open_stores("v_hat", variant,
                                 [c for c in self.combos if not own or c != self.own_combo])
        grams = ctx.open_stores("grams", variant, [(s,) for s in (False, True)
                                                  if not own or s != self.own_combo[0]])
        offer_v_hat = (lambda key, values: ctx.offer("v_hat", v_hats, key, values)) \
            if v_hats else None
        offer_grams = (lambda key, payload: ctx.offer("grams", grams, key, payload)) \
            if grams else None
        convention = ctx.base.options.convention

        def build(lctx):
            metrics, errs = v_grid_layer(lctx, self.combos, offer_v_hat, convention, offer_grams)
            return ({f"{combo}/{name}": t for combo, m in metrics.items() for name, t in m.items()},
                    [[s, t, why] for (s, t), why in errs.items()])

        per_combo: dict[str, dict] = {}
        errors: dict[tuple, str] = {}
        for layer, (flat, errs) in ctx.cached_layers(
                ctx.run_for(variant), ctx.layers, "V-grid", {"combos": sorted(self.combos)},
                build, CLAIM, CODE).items():
            for s, t, why in errs:
                errors.setdefault((bool(s), t), why)
            for name, t in flat.items():
                combo, metric = name.split("/", 1)
                per_combo.setdefault(combo, {}).setdefault(layer, {})[metric] = t
        self.grids[variant] = (per_combo, errors)
        return self.grids[variant]

    def __call__(self, spec: dict) -> dict:
        """Claim V under one non-default compute combination, from the grid of its token set;
        the Hungarian matching only where a verdict depends on the exact optimal cosine."""
        ctx, default = self.ctx, self.ctx.default
        variant = self.variant_of(spec)
        std = spec.get("standardize", default["standardize"]) == "on"
        dtype = spec.get("dtype", default["dtype"])
        conv = spec.get("axis_convention", default["axis_convention"])
        null = spec.get("null", default["null"])
        per_combo, errors = self.grid(variant)
        name = ctx.spec_name({a: v for a, v in spec.items() if default.get(a) != v})
        if (std, dtype) in errors:
            return {"error": f"{errors[(std, dtype)]} (under {name})"}
        per_layer = per_combo[combo_key(std, dtype, conv, null)]
        if variant == () and (std, dtype) == self.own_combo \
                and conv == default["axis_convention"]:
            # the main run's own V̂: its matched optimal cosine is already computed
            per_layer = {layer: {**{n: t for n, t in m.items() if n not in V_UPPER.values()},
                                 "optimal_cosine": ctx.base.layer_metrics(CLAIM, layer)[
                                     "optimal_cosine"]}
                         for layer, m in per_layer.items()}
            return ctx.outcomes(CLAIM, per_layer)
        result, open_units = v_bounded(ctx.model, per_layer, ctx.heads_for(CLAIM), ctx.rules)
        if open_units == []:
            return result
        # some verdict depends on the exact optimal cosine: match the heads whose verdicts do
        # (a unit's verdict), or every head (the model's)
        heads_of = None
        if open_units is not None:
            heads_of = {}
            for layer, head in open_units:
                heads_of.setdefault(layer, []).append(head)
        exact = self.matched_values(variant, std, dtype, heads_of)[(conv, null)]
        self.matched.append(name)
        if heads_of is None:
            per_layer = {layer: with_matched(m, exact[layer]) for layer, m in per_layer.items()}
            return ctx.outcomes(CLAIM, per_layer)
        per_layer = {layer: with_matched(m, exact[layer], heads_of[layer]) if layer in heads_of
                     else m for layer, m in per_layer.items()}
        result, open_units = v_bounded(ctx.model, per_layer, ctx.heads_for(CLAIM), ctx.rules)
        if open_units != []:  # cannot happen: a matched head's bounds are one value
            raise RuntimeError(f"claim V under {name}: heads {open_units} are still undecided "
                               "after their matching")
        return result

    def matched_values(self, variant: tuple, std: bool, dtype: str, heads_of: dict | None) -> dict:
        """The exact optimal cosines of (variant, std, dtype) for the heads ``heads_of``
        ({layer: heads}; None: every head), matched once for both conventions and nulls: the
        heads matched for an earlier specification are not matched again. Returns
        ``{(conv, null): {layer: {"optimal_cosine", "optimal_cosine_null"}}}``."""
        ctx = self.ctx
        done, values = self.exact.setdefault((variant, std, dtype), ({}, {}))
        want = ({layer: list(range(ctx.info["n_heads"])) for layer in ctx.layers}
                if heads_of is None else heads_of)
        need = {layer: [h for h in hs if h not in done.get(layer, set())]
                for layer, hs in want.items()}
        need = {layer: hs for layer, hs in need.items() if hs}
        if need:
            everything = heads_of is None and not done
            fresh = self._match(variant, sorted(need), std, dtype, None if everything else need)
            for pair, by_layer in fresh.items():
                for layer, metrics in by_layer.items():
                    slot = values.setdefault(pair, {}).setdefault(layer, {})
                    for metric, t in metrics.items():
                        if metric not in slot:
                            slot[metric] = t.clone()
                        else:
                            slot[metric][:, need[layer]] = t[:, need[layer]]
            for layer, hs in need.items():
                done.setdefault(layer, set()).update(hs)
        return values

    def _match(self, variant: tuple, layers: list[int], std: bool, dtype: str,
               heads_of: dict | None) -> dict:
        """:func:`claims.claim_v_grid.v_matched_layer` over ``layers``, each layer cached, as
        the exact values of ``optimal_cosine`` and ``optimal_cosine_null`` per (convention,
        null); ``heads_of``: {layer: heads} to match only those (a layer not named is not
        matched); default every head of every layer."""
        run = self.ctx.run_for(variant)
        by_layer = {}
        for layer in layers:
            heads = None if heads_of is None else sorted(heads_of.get(layer, ()))
            if heads == []:
                continue
            by_layer.update(self.ctx.cached_layers(
                run, [layer], "V-match", {"std": std, "dtype": dtype,
                                          **({} if heads is None else {"heads": heads})},
                lambda lctx, heads=heads: (v_matched_layer(lctx, std, dtype, heads), []),
                CLAIM, CODE))
        out: dict = {}
        for layer, (m, _errs) in by_layer.items():
            for conv in ("p2", "kpca"):
                for null in NULLS:
                    out.setdefault((conv, null), {})[layer] = {
                        "optimal_cosine": m[conv],
                        "optimal_cosine_null": m[conv if null == "token-shuffled"
                                                 else "random-basis"]}
        return out


__all__ = ["DEFAULT_NULL", "V_UPPER", "VRoute", "route", "v_bounded", "v_outcomes", "with_matched"]
