"""Claims J and E timed stage by stage through ``ModelRun.layer_metrics("J"|"E", layer)``
(stages J: ``phi``, ``h``, ``summaries``; E: ``gram``, ``eigen``, ``naive``, ``gamma``), after
claim V on the same session, and their plain per-head loops
(:func:`bench.loop_reference.reference_j_head`, :func:`~bench.loop_reference.reference_e_head`) fed the
q, k, v (and, for E, P2's perturbed basis, one draw per batch) the session used on the same
subset of heads, with every compared quantity's agreement checked (:func:`_agreement_je`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .timing import GRAM_STAGES, MIB, SMALL, StageClock, Timers, time_layers, tracking_groups


#: Stages of claims J and E: (module, function) → stage; every one is exclusive (Timers).
J_STAGES = {("checks.projection", "log_phi_sq_norm"): "phi",
            ("checks.projection", "log_phi_sq_norm_p1_code"): "phi",
            ("checks.projection", "h_sq_norm"): "h",
            ("checks.projection", "projection_terms_batched"): "summaries",
            # the output fit (method §3.6): ours only, the loop reference has none
            ("claims.claim_j_layer", "output_fit_terms"): "output fit"}
E_STAGES = {**GRAM_STAGES, ("checks.spectrum", "naive_gram_spectrum"): "naive",
            ("checks.gamma", "gamma_spread_batched"): "gamma"}


def _bench_claim(claim: str, run, info: dict, layers: list[int], subset: set, sampler,
                 args) -> dict:
    """Claim J or E over ``layers`` through ``run`` (fresh cache), stage by stage, then the plain
    per-head loop (:func:`bench.loop_reference.reference_j_head` / ``reference_e_head``) on ``subset``,
    fed the inputs the session used, and the agreement of every compared quantity."""
    import importlib

    from .loop_reference import E_NAMES, J_NAMES, reference_e_head, reference_j_head

    timers = Timers()
    stages = J_STAGES if claim == "J" else E_STAGES
    recorded: dict[tuple, tuple] = {}
    state: dict[str, Any] = {}

    def record(q, k, v, extra=None):
        first = state["heads"].start or 0
        for i, b in enumerate(state["chunk"]):
            for j in range(k.shape[1]):
                key = (b, state["layer"], first + j)
                if key in subset and key not in recorded:
                    recorded[key] = (None if q is None else q[i, j].clone(), k[i, j].clone(),
                                     v[i, j].clone(), None if extra is None else extra[i, j].clone())

    def make(stage: str, name: str):
        def wrap(orig):
            if name == "projection_terms_batched":
                def call(q, k, v, **kw):
                    record(q, k, v)
                    return orig(q, k, v, **kw)
            elif name == "gamma_spread_batched":
                def call(k, v, **kw):
                    out = orig(k, v, **kw)
                    record(None, k, v, state.pop("perturbed"))
                    return out
            elif name == "perturbed_axes":
                def call(*a, **kw):
                    state["perturbed"] = orig(*a, **kw)
                    return state["perturbed"]
            else:
                call = orig
            return timers.wrap(stage, call) if stage else call
        return wrap

    targets = [(importlib.import_module(mod), name, make(stage, name))
               for (mod, name), stage in stages.items()]
    if claim == "E":
        targets.append((importlib.import_module("checks.gamma"), "perturbed_axes",
                        make("", "perturbed_axes")))
    targets.append((run, "_groups", tracking_groups(state)))
    per_layer, mem = time_layers(run, claim, layers, targets, timers, sampler, "total",
                                 label=f"claim {claim} ")
    clock, ref = StageClock(), {}
    for key in sorted(recorded):
        q, k, v, extra = recorded[key]
        ref[key] = (reference_j_head(q, k, v, scale=info["scale"], clock=clock) if claim == "J"
                    else reference_e_head(k, v, extra, scale=info["scale"], clock=clock))
    names = J_NAMES if claim == "J" else E_NAMES
    ours = {key: {name: per_layer[key[1]][name][key[0], key[2]].numpy() for name in names}
            for key in ref}
    n_total = info["input_set"]["n_samples"] * len(layers) * info["n_heads"]
    return {"ours": {"wall": timers.wall, "cpu": timers.cpu},
            "reference": {"wall": dict(clock.wall), "cpu": dict(clock.cpu),
                          "n_heads_measured": len(ref)},
            "n_heads_total": n_total, "agreement": _agreement_je(ours, ref, args.rtol) if ref else None,
            "memory_mb": {k: v / MIB for k, v in mem.items()}}


#: Quantities compared with a looser, float32 tolerance (the naive route runs in float32 by
#: design: torch's and NumPy's float32 eigensolvers differ by round-off of order N·ε₃₂·|μ₁|).
FLOAT32_RTOL = 1e-4


def _agreement_je(ours: dict, ref: dict, rtol: float) -> dict:
    """Largest deviation per quantity of claim J or E, ours against the plain loop.

    Rule: |ours − ref| ≤ rtol · max(|ours|, |ref|, floor) elementwise, floor = 1e-3 for the
    bounded quantities and 1e-3·max|μ| of the head for spectra (eigenvalues far below the top
    one are round-off-limited in both); the naive float32 spectrum at :data:`FLOAT32_RTOL`; flags
    equal. The eigen control's γ spreads are round-off by construction (γ of an exact
    eigenvector is constant), so they are reported (``reported_not_asserted``), not asserted.
    """
    worst, failures, reported = {}, [], {}
    for key, r in ref.items():
        o = ours[key]
        undetermined = bool(r.get("undetermined", 0.0)) or bool(o.get("undetermined", False))
        for name in r:
            a, b = np.asarray(o[name], dtype=np.float64), np.asarray(r[name], dtype=np.float64)
            if name in ("undetermined", "naive_finite"):
                err = float(bool(a) != bool(b))
                tol = 0.0
            elif name.startswith("gamma_eigen"):
                # The eigen control's γ is μ_m/N up to the eigensolver's round-off: its spread
                # measures that round-off (torch's and NumPy's eigh differ), so it is reported,
                # not asserted.
                scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), SMALL)
                err = float(np.max(np.abs(a - b) / scale))
                if not undetermined:
                    reported[name] = max(reported.get(name, 0.0), err)
                continue
            else:
                floor = 1e-3 * float(np.abs(b).max()) if name.startswith("mu_") else SMALL
                tol = FLOAT32_RTOL if name == "mu_naive_float32" else rtol
                scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), max(floor, 1e-300))
                err = float(np.max(np.abs(a - b) / scale))
            if err > worst.get(name, {"rel_err": -1.0})["rel_err"]:
                worst[name] = {"rel_err": err, "head": list(key)}
            if err > tol:
                failures.append({"quantity": name, "head": list(key), "rel_err": err})
    return {"n_heads_checked": len(ref), "rtol": rtol, "float32_rtol": FLOAT32_RTOL,
            "rule": "|ours - ref| <= rtol * max(|ours|, |ref|, floor); floor 1e-3 (1e-3 max|mu| "
                    "for spectra); naive float32 spectrum at float32_rtol; flags equal",
            "worst": worst, "n_failures": len(failures), "failures": failures[:20],
            "reported_not_asserted": reported, "passed": not failures}
