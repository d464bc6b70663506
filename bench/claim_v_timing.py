"""Claim V timed stage by stage through the suite's own session, against the plain per-head loop
of :mod:`bench.loop_reference` on a fixed random subset of (sample, layer, head) triples fed the very
k, v and null (token permutation of ΠV̂) our path received, with every compared quantity's agreement checked. What
is timed ("ours") is exactly what ``pytest claims/`` runs: a :class:`fixtures.engine.model_run.ModelRun`
(fresh temporary cache) loads the model, captures Q/K/V through
:func:`fixtures.models.capture_batches.capture_to_layer_files`, then computes every layer's claim-V metrics in the
chunks ``ModelRun._chunks`` picks for ``--max-memory``; finally the records are built
(:mod:`claims.claim_v`) and rendered. Stages (thin wrappers around the suite's functions, each
exclusive, :class:`bench.timing.Timers`): ``gram`` (checks.gram.score_matrix, log_normaliser,
center_gram, undetermined_threshold), ``eigen`` (the top-d eigensolver KeyGram calls, full eigh
below the measured crossover), ``assignment`` (checks.assignment's solver through
checks.row_similarity.optimal_matching; in the session's second thread, so its wall time overlaps),
``p2-code`` (the p2-code variant on its seeded subset of samples, method §8.3, matching apart),
``metrics`` (the rest of value_vector_metrics_batched), ``session`` (the rest of
ModelRun.layer_metrics("V", …) on the main thread: layer file reads, null draws and QR, cache writes,
waiting for the assignment thread) and ``claim V, all heads`` (the whole, wall and process CPU).
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .claims_je_timing import _bench_claim
from .loop_reference import reference_head
from .loop_reference_metrics import METRIC_NAMES
from .timing import (GRAM_STAGES, MIB, ROOT, SMALL, RssSampler, StageClock, Timers, patched,
                     time_layers, tracking_groups)
from .workloads import BenchModel

COMPARED = tuple(METRIC_NAMES) + tuple(f"{n}_null" for n in METRIC_NAMES) + ("mu_d",)


def _subset(total_shape: tuple[int, int, int], fraction: float, minimum: int, seed: int = 0) -> set:
    """A fixed random subset of (sample, layer, head) triples: max(minimum, fraction·total)."""
    b, l, h = total_shape
    total = b * l * h
    count = min(total, max(minimum, int(round(fraction * total))))
    flat = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:count].tolist()
    return {(i // (l * h), (i // h) % l, i % h) for i in flat}


def _agreement(ours: dict[tuple, dict], ref: dict[tuple, dict], rtol: float) -> dict:
    """Largest deviation per compared quantity; undetermined heads compare their nulls only.

    The 16 metrics and μ_d must agree to ``rtol`` and the undetermined flags must be equal. The
    threshold N·ε·‖K_φ‖₂ is reported, not asserted: ours is a Lanczos (Krylov) lower
    bound of ‖K_φ‖₂ that stops on convergence, the reference's is ``eigvalsh``.
    """
    worst: dict[str, dict] = {}
    flag_mismatch, undetermined, failures, thr = 0, 0, [], 0.0
    for key, r in ref.items():
        o = ours[key]
        if bool(o["undetermined"]) != bool(r["undetermined"]):
            flag_mismatch += 1
        thr = max(thr, abs(o["threshold"] - r["threshold"]) / max(abs(r["threshold"]), 1e-300))
        skip_vhat = bool(o["undetermined"]) or bool(r["undetermined"])
        undetermined += skip_vhat
        for name in COMPARED:
            if skip_vhat and not name.endswith("_null"):
                continue  # V̂ is round-off there: different eigensolvers give different V̂
            a, b = float(o[name]), float(r[name])
            floor = 0.0 if name == "mu_d" else SMALL
            err = 0.0 if a == b else abs(a - b) / max(abs(a), abs(b), floor)
            if not math.isfinite(err):
                err = math.inf
            if err > worst.get(name, {"rel_err": -1.0})["rel_err"]:
                worst[name] = {"rel_err": err, "ours": a, "reference": b, "head": list(key)}
            if err > rtol:
                failures.append({"metric": name, "head": list(key), "ours": a, "reference": b,
                                 "rel_err": err})
    return {"n_heads_checked": len(ref), "n_undetermined_nulls_only": undetermined,
            "undetermined_flag_mismatches": flag_mismatch, "rtol": rtol,
            "rule": f"|ours - ref| <= rtol * max(|ours|, |ref|, {SMALL}) for the 16 metrics, "
                    "no floor for mu_d; undetermined heads: null metrics only; flags equal",
            "threshold_max_rel_diff": thr,
            "worst": worst, "n_failures": len(failures), "failures": failures[:20],
            "passed": not failures and flag_mismatch == 0}


def _null_of(kw: dict, i: int, j: int) -> torch.Tensor:
    """The null our path was given for head (i, j): the token permutation of ΠV̂ (method §2.3) or,
    where a caller passes one, the random basis A₀; the reference takes either."""
    null = kw["null_perm"] if kw.get("null_perm") is not None else kw["null_axes"]
    return null[i, j].cpu().clone()


def bench_model(cfg: BenchModel, args, sampler: RssSampler, workdir: Path) -> dict:
    import checks.p2_code
    import checks.row_similarity
    import checks.value_vectors
    from fixtures.models import capture_batches as capture_mod
    from fixtures.models import loading as models_mod
    from fixtures.cache import Cache
    from fixtures.engine.model_run import ModelRun
    from fixtures.engine.run_options import RunOptions


    timers = Timers()
    memory: dict[str, dict] = {}
    options = RunOptions(images=cfg.images, n_samples=cfg.n_samples, seed=0,
                         max_memory=args.max_memory, cache_dir=str(workdir / f"cache-{cfg.name}"),
                         device=getattr(args, "device", "cpu"))
    run = ModelRun(cfg.spec, options, Cache(options.cache_dir))
    kept: dict[str, Any] = {}

    def keep_loaded(orig):
        def load(*a, **k):
            kept["loaded"] = orig(*a, **k)
            return kept["loaded"]
        return timers.wrap("load", load)

    def keep_batches(orig):
        def cap(loaded, batches, *a, **k):
            kept["batches"] = list(batches)
            return orig(loaded, kept["batches"], *a, **k)
        return timers.wrap("capture", cap)  # capture_to_layer_files: forward passes + layer files

    print(f"\n== {cfg.name}: {cfg.spec.key}, {cfg.n_samples} samples", flush=True)
    w0 = time.perf_counter()
    with sampler.window() as mem, patched([(models_mod, "load_model", keep_loaded),
                                           (capture_mod, "capture_to_layer_files", keep_batches)]):
        info = run.prepare()
    prepare_wall = time.perf_counter() - w0
    memory["load+capture"] = mem
    n_b, n_l, n_h = info["input_set"]["n_samples"], info["n_layers"], info["n_heads"]
    lengths = run.layer_qkv(0)["token_mask"].sum(1).tolist()
    layers = list(range(n_l)) if args.layers is None else [x for x in args.layers if x < n_l]
    subset = set() if args.skip_reference else {
        (b, layers[i], h) for b, i, h in _subset((n_b, len(layers), n_h), args.ref_fraction,
                                                 args.ref_min)}

    # ---- ours: claim V, every layer, through the session (fresh cache: nothing reused)
    recorded: dict[tuple, tuple] = {}
    state: dict[str, Any] = {}

    def recording(orig):
        def call(k, v, **kw):
            out = orig(k, v, **kw)
            first = state["heads"].start or 0
            for i, b in enumerate(state["chunk"]):
                for j in range(k.shape[1]):
                    if (b, state["layer"], first + j) in subset:
                        recorded[(b, state["layer"], first + j)] = (
                            k[i, j].cpu().clone(), v[i, j].cpu().clone(),
                            _null_of(kw, i, j))  # the reference runs on the CPU
            return out
        return timers.wrap("vvmb", call)

    def timed(stage: str) -> Callable:  # make(original) → original timed under ``stage``
        return functools.partial(timers.wrap, stage)

    targets = [(importlib.import_module(mod), name, timed(stage))
               for (mod, name), stage in GRAM_STAGES.items()]
    targets += [(checks.p2_code, "p2_code_metrics_on", timed("p2code")),
                (checks.row_similarity, "optimal_matching", timed("assignment")),
                (checks.value_vectors, "value_vector_metrics_batched", recording),
                (run, "_groups", tracking_groups(state))]
    per_layer, memory["claim_v"] = time_layers(run, "V", layers, targets, timers, sampler,
                                               "claim_v")

    # ---- reference on the subset, fed the inputs our path received
    clock, ref_results = StageClock(), {}
    with sampler.window() as mem:
        for key in sorted(recorded):
            k, v, a0 = recorded[key]
            ref_results[key] = reference_head(k, v, a0, scale=info["scale"], clock=clock)
    memory["reference"] = mem
    ours_subset = {key: {name: float(per_layer[key[1]][name][key[0], key[2]])
                         for name in (*COMPARED, "undetermined", "threshold")}
                   for key in ref_results}
    agreement = _agreement(ours_subset, ref_results, args.rtol) if ref_results else None

    # ---- claims J and E, every layer, through the session, and their loop references
    claims_je = {claim: _bench_claim(claim, run, info, layers, subset, sampler, args)
                 for claim in ("J", "E")}

    # ---- reference capture: one sample per forward pass, on a few samples, extrapolated
    ref_capture = None
    if not args.skip_reference and "loaded" in kept:
        ref_capture = _reference_capture(kept["loaded"], kept["batches"], lengths,
                                         args.ref_capture_samples)
    kept.clear()

    # ---- report: records for every head and the model, rendered to HTML
    with sampler.window() as mem:
        w0, c0 = time.perf_counter(), time.process_time()
        html = _render(cfg.spec.key, info, per_layer, options)
        timers.add("report", time.perf_counter() - w0, time.process_time() - c0)
    memory["report"] = mem

    n_heads_total = n_b * len(per_layer) * n_h
    return {
        "model": cfg.spec.key, "label": cfg.spec.label, "n_samples": n_b,
        "n_layers": len(per_layer),
        "n_heads": n_h, "head_dim": info["head_dim"], "n_heads_total": n_heads_total,
        "tokens": {"min": int(min(lengths)), "max": int(max(lengths))},
        "input_notes": cfg.notes + list(info["input_set"]["notes"]),
        "chunks": {"max_memory_bytes": args.max_memory,
                   "samples_per_chunk": sorted(set(state.get("chunks", []))),
                   "n_chunks": len(state.get("chunks", []))},
        "n_undetermined": int(sum(int(m["undetermined"].sum()) for m in per_layer.values())),
        "prepare_wall_s": prepare_wall, "ours": {"wall": timers.wall, "cpu": timers.cpu},
        "reference": {"wall": dict(clock.wall), "cpu": dict(clock.cpu),
                      "n_heads_measured": len(ref_results), "capture": ref_capture},
        "agreement": agreement,
        "claims": claims_je,
        "memory_mb": {k: {"start": v["start"] / MIB, "peak": v["peak"] / MIB,
                          "peak_minus_start": (v["peak"] - v["start"]) / MIB}
                      for k, v in memory.items()},
        "report_html_bytes": len(html.encode()),
    }


def _reference_capture(loaded, batches, lengths, n: int) -> dict | None:
    """Capture one sample per forward pass (padding trimmed) for the first ``n`` samples."""
    from fixtures.models.capture import capture_qkv

    singles = []
    for batch in batches:
        if isinstance(batch, dict):
            m = len(batch["input_ids"])
            singles += [{k: t[i:i + 1] for k, t in batch.items()} for i in range(m)]
        else:
            singles += [batch[i:i + 1] for i in range(len(batch))]
    singles = singles[:n]
    if not singles:
        return None
    w0, c0 = time.perf_counter(), time.process_time()
    for i, one in enumerate(singles):
        if isinstance(one, dict):
            one = {k: t[:, :int(lengths[i])] for k, t in one.items()}
        capture_qkv(loaded, one)
    return {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0,
            "n_samples_measured": len(singles)}


def _render(model: str, info: dict, per_layer: dict, options) -> str:
    from claims import claim_v, verdicts
    from report.render import render_report

    template = json.loads((ROOT / "tests" / "data" / "results_example.json").read_text())
    records, head_verdicts = [], {}
    heads = list(range(info["n_heads"]))
    for layer, metrics in per_layer.items():
        for head in heads:
            rec = claim_v.head_record(model, layer, head, metrics)
            head_verdicts[rec["verdict"]] = head_verdicts.get(rec["verdict"], 0) + 1
            records.append({**rec, "test_id": f"test_value_vectors[{model}-L{layer:02d}-H{head}]",
                            "outcome": "passed" if rec["verdict"] == "supported" else "failed",
                            "options": options.recorded()})
    rec = claim_v.model_record(model, per_layer, heads, head_verdicts)
    records.append({**rec, "test_id": f"test_value_vectors_model[{model}]", "outcome": "failed",
                    "options": options.recorded()})
    results = {**template, "options": options.recorded(), "thresholds": verdicts.load_thresholds(),
               "models": {model: copy.deepcopy(info)}, "records": records, "not_run": [],
               "complete": True}
    return render_report(json.loads(json.dumps(results)))
