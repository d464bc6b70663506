"""``python -m bench.run``: time the suite's claims V, J and E stage by stage against plain
per-head loops (:mod:`bench.reference`), check that both give the same numbers, and measure
peak memory. ``--readme`` rewrites the README's Speed table from the results file instead.

Claims J and E run after V through ``ModelRun.claim_j_layer`` / ``claim_e_layer`` with the same
wrappers (stages J: ``phi``, ``h``, ``summaries``; E: ``gram``, ``eigen``, ``naive``, ``gamma``),
and their loops (:func:`bench.reference.reference_j_head`, :func:`~bench.reference.reference_e_head`)
are fed the q, k, v (and, for E, P2's perturbed basis, one draw per batch) the session used on
the same subset of heads. Every stage time is exclusive (:class:`Timers`).

What is timed ("ours") is exactly what ``pytest claims/`` runs: a :class:`fixtures.session.ModelRun`
(fresh temporary cache) loads the model, captures Q/K/V through
:func:`fixtures.capture_batches.capture_to_layer_files` (streamed per layer), then computes every layer's claim-V metrics through
:func:`checks.value_vectors.value_vector_metrics_batched` in the chunks ``ModelRun._chunks`` picks
for ``--max-memory``; finally the per-head and per-model records are built
(:mod:`claims.claim_v`) and rendered (:func:`report.render.render_report`). Stage times come from
thin timing wrappers put around the suite's own functions for the duration of the run:

- ``gram``: checks.gram.score_matrix, log_normaliser, center_gram and undetermined_threshold
  (S, log g, K̃, N·ε·‖K_φ‖₂; KeyGram's inline lines, e.g. K_φ itself, count under ``metrics``);
- ``eigen``: checks.topk.top_eigh (KeyGram keeps the top d eigenpairs; the full eigh below the
  measured crossover size) and checks.gram.sorted_eigh;
- ``assignment``: checks.similarity.optimal_matching (the Hungarian solver). The session runs it
  in a second thread while the next batch's tensor math runs, so its wall time overlaps the
  others; CPU times are per thread (``time.thread_time``);
- ``metrics``: the rest of value_vector_metrics_batched (V̂, V̂₀, the metrics of both);
- ``session``: the rest of ModelRun.claim_v_layer on the main thread (layer file reads,
  null-basis draws and QR, cache writes, waiting for the assignment thread);
- ``claim V, all heads``: the whole of ModelRun.claim_v_layer over every layer, wall clock (what a
  run waits for) and process CPU (both threads): the row the speed-up target is about.

The reference runs one head at a time on a fixed random subset of (sample, layer, head) triples,
fed the very k, v and null basis A₀ our path received; its per-head mean is extrapolated to all
heads (labelled). Before any ratio is printed, every metric of every checked head must agree with
ours to ``--rtol`` (relative; absolute below 1e-3). Memory: peak resident set size per phase,
sampled every 20 ms by a psutil thread (torch's CPU allocations are invisible to tracemalloc).

Inputs: the embedded default model (all-MiniLM-L6-v2, real weights, the 100 default texts) and
a seeded random-init timm vit_base_patch16_224 on 100 images: the 21 package images of
:func:`fixtures.inputs.default_images`, each also horizontally flipped and cropped (deterministic
variants, written as PNG to a temporary folder and read back through
:func:`fixtures.inputs.load_image_dir`), 105 candidates of which the seeded selection takes 100.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import math
import os
import platform
import resource
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import fixtures  # noqa: F401  (torchvision shim before timm)

import numpy as np
import torch

from .reference import METRIC_NAMES, StageClock, reference_head

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "kpca-claims/bench/1"
MIB = 1024 ** 2
GRAM_FUNCTIONS = ("score_matrix", "log_normaliser", "center_gram", "undetermined_threshold")
COMPARED = tuple(METRIC_NAMES) + tuple(f"{n}_null" for n in METRIC_NAMES) + ("mu_d",)
SMALL = 1e-3  # below this magnitude the agreement check is absolute (rtol · SMALL)
VARIANTS = ("orig", "hflip", "crop-tl", "crop-br", "hflip-crop-c")


# ------------------------------------------------------------------------------------- helpers
def parse_bytes(text: str) -> int:
    """'512M', '2G', '1.5G', '300000' → bytes (binary units; :func:`fixtures.preflight.size_bytes`)."""
    from fixtures.preflight import size_bytes

    try:
        return size_bytes(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"cannot read a memory size from {text!r}; "
                                         "write e.g. 512M or 2G") from None


class RssSampler:
    """Peak resident set size inside ``with sampler.window() as w:`` blocks (psutil, every 20 ms;
    5 ms sampling was measured to cost up to ~20% wall time on this machine)."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._peak = 0
        self._lock = threading.Lock()  # a window's reset must not be overwritten by a stale max
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        return self._proc.memory_info().rss

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss = self.rss()
            with self._lock:
                self._peak = max(self._peak, rss)
            time.sleep(self._interval)

    @contextlib.contextmanager
    def window(self):
        with self._lock:
            rec = {"start": self.rss()}
            self._peak = rec["start"]
        try:
            yield rec
        finally:
            end = self.rss()
            with self._lock:
                rec["peak"], rec["end"] = max(self._peak, end), end

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class Timers:
    """Accumulated wall and CPU seconds per stage name, fed by the wrappers of :func:`bench_model`.

    Stages are *exclusive*: when a wrapped function calls another wrapped one on the same thread
    (KeyGram's eigensolver inside the metrics, the Lanczos threshold inside γ), the inner call's
    time counts under its own stage only. CPU times are per thread (``time.thread_time``).
    """

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._lock = threading.Lock()  # the assignment runs in the session's second thread
        self._local = threading.local()

    def add(self, name: str, wall: float, cpu: float) -> None:
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append([0.0, 0.0])  # time of nested wrapped calls
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                inner_w, inner_c = stack.pop()
                if stack:
                    stack[-1][0] += wall
                    stack[-1][1] += cpu
                with self._lock:
                    self.add(name, wall - inner_w, cpu - inner_c)
                    if threading.current_thread() is threading.main_thread():
                        self.add(name + "@main", wall - inner_w, cpu - inner_c)
        return timed


@contextlib.contextmanager
def patched(targets: list[tuple[Any, str, Callable]]):
    """Replace ``getattr(obj, name)`` by ``make(original)`` for each target; restore on exit."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
    try:
        for (obj, name, make), (_, _, orig) in zip(targets, saved):
            setattr(obj, name, make(orig))
        yield
    finally:
        for obj, name, orig in saved:
            setattr(obj, name, orig)


def set_threads(n: int) -> dict:
    """torch intra-op threads and every BLAS/OpenMP pool (threadpoolctl) set to ``n``.

    threadpoolctl only limits libraries already loaded: scipy's own OpenBLAS is loaded first.
    """
    import scipy.linalg  # noqa: F401
    import scipy.optimize  # noqa: F401
    import scipy.spatial  # noqa: F401

    torch.set_num_threads(n)
    info = {"torch": n}
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
        info["blas_pools"] = n
    except ImportError:
        info["blas_pools"] = "threadpoolctl missing: numpy's BLAS pool left as is"
    return info


def expanded_image_folder(folder: Path) -> list[str]:
    """Write each default package image in the deterministic variants :data:`VARIANTS` as PNG.

    Crops keep 75% (tl, br) or 60% (centre) of each side; ``hflip`` mirrors left-right. Returns
    notes describing the set.
    """
    from PIL import Image

    from fixtures import inputs

    base = inputs.default_images(None, seed=0)
    folder.mkdir(parents=True, exist_ok=True)
    for name, img in zip(base.names, base.items):
        w, h = img.size
        flip = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        variants = {
            "orig": img,
            "hflip": flip,
            "crop-tl": img.crop((0, 0, int(0.75 * w), int(0.75 * h))),
            "crop-br": img.crop((w - int(0.75 * w), h - int(0.75 * h), w, h)),
            "hflip-crop-c": flip.crop((int(0.2 * w), int(0.2 * h), int(0.2 * w) + int(0.6 * w),
                                       int(0.2 * h) + int(0.6 * h))),
        }
        stem = name.replace(":", "_").replace(".", "_")
        for variant in VARIANTS:
            variants[variant].save(folder / f"{stem}__{variant}.png")
    return [f"{len(base.names)} package images (fixtures.inputs.default_images) x {len(VARIANTS)} "
            f"deterministic variants {VARIANTS} = {len(base.names) * len(VARIANTS)} candidates; "
            "the seeded selection of fixtures.inputs.load_image_dir takes n of them"]


# ------------------------------------------------------------------------------- model configs
@dataclass
class BenchModel:
    name: str
    spec: Any
    n_samples: int
    images: str | None = None
    notes: list[str] = field(default_factory=list)


def model_configs(which: list[str], quick: bool, workdir: Path) -> list[BenchModel]:
    from fixtures.registry import REGISTRY, ModelSpec

    out = []
    for name in which:
        if name == "minilm":
            out.append(BenchModel("minilm", REGISTRY["all-MiniLM-L6-v2"], 8 if quick else 100,
                                  notes=["default texts (fixtures/data/sentences.txt)"]))
        elif name == "vit_base":
            spec = ModelSpec(key="bench-vit_base_patch16_224-random", family="timm-vit",
                             source="random", arch="vit_base_patch16_224", modality="image",
                             n_layers=12, n_heads=12, head_dim=64, seed=0, control=True,
                             label="timm vit_base_patch16_224, random init (seed 0), "
                                   "benchmark only")
            folder = workdir / "images"
            notes = expanded_image_folder(folder)
            out.append(BenchModel("vit_base", spec, 3 if quick else 100, images=str(folder),
                                  notes=notes))
        else:
            raise SystemExit(f"unknown benchmark model {name!r}; use minilm and/or vit_base")
    return out


# ------------------------------------------------------------------------------------ one model
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


def _tracking_groups(run, state: dict):
    """``run._groups`` and a wrapper of it that notes, in ``state``, the layer, samples and heads
    of the batch being computed (and every batch's sample count under ``"chunks"``), so the
    recorders can key what the session's math saw by (sample, layer, head)."""
    orig_groups = run._groups

    def groups(layer):
        for item in orig_groups(layer):
            state["layer"], state["chunk"], state["heads"] = layer, list(item[0]), item[1]
            state.setdefault("chunks", []).append(len(item[0]))
            yield item

    return orig_groups, groups


def bench_model(cfg: BenchModel, args, sampler: RssSampler, workdir: Path) -> dict:
    import checks.gram
    import checks.similarity
    import checks.topk
    import checks.value_vectors
    from fixtures import capture_batches as capture_mod
    from fixtures import models as models_mod
    from fixtures.cache import Cache
    from fixtures.session import ModelRun, RunOptions

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
    orig_groups, groups = _tracking_groups(run, state)
    run._groups = groups

    def recording(orig):
        def call(k, v, **kw):
            out = orig(k, v, **kw)
            first = state["heads"].start or 0
            for i, b in enumerate(state["chunk"]):
                for j in range(k.shape[1]):
                    if (b, state["layer"], first + j) in subset:
                        recorded[(b, state["layer"], first + j)] = (
                            k[i, j].cpu().clone(), v[i, j].cpu().clone(),
                            kw["null_axes"][i, j].cpu().clone())  # the reference runs on the CPU
            return out
        return timers.wrap("vvmb", call)

    def timed(stage: str) -> Callable:  # make(original) → original timed under ``stage``
        return functools.partial(timers.wrap, stage)

    targets = [(checks.gram, name, timed("gram")) for name in GRAM_FUNCTIONS]
    targets += [(checks.gram, "sorted_eigh", timed("eigen")),
                (checks.topk, "top_eigh", timed("eigen")),
                (checks.similarity, "optimal_matching", timed("assignment")),
                (checks.value_vectors, "value_vector_metrics_batched", recording)]
    per_layer = {}
    with sampler.window() as mem, patched(targets):
        w0, c0 = time.perf_counter(), time.process_time()  # process: both threads
        for layer in layers:
            t = time.perf_counter()
            per_layer[layer] = run.claim_v_layer(layer)
            print(f"   L{layer:02d}: {time.perf_counter() - t:6.1f} s", flush=True)
        timers.add("claim_v", time.perf_counter() - w0, time.process_time() - c0)
    run._groups = orig_groups
    memory["claim_v"] = mem

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


#: Stages of claims J and E: (module, function) → stage; every one is exclusive (Timers).
J_STAGES = {("checks.projection", "log_phi_sq_norm"): "phi",
            ("checks.projection", "log_phi_sq_norm_p1_code"): "phi",
            ("checks.projection", "h_sq_norm"): "h",
            ("checks.projection", "projection_terms_batched"): "summaries"}
E_STAGES = {**{("checks.gram", name): "gram" for name in GRAM_FUNCTIONS},
            ("checks.gram", "sorted_eigh"): "eigen", ("checks.gram", "sorted_eigvalsh"): "eigen",
            ("checks.topk", "top_eigh"): "eigen",
            ("checks.spectrum", "naive_gram_spectrum"): "naive",
            ("checks.gamma", "gamma_spread_batched"): "gamma"}


def _bench_claim(claim: str, run, info: dict, layers: list[int], subset: set, sampler,
                 args) -> dict:
    """Claim J or E over ``layers`` through ``run`` (fresh cache), stage by stage, then the plain
    per-head loop (:func:`bench.reference.reference_j_head` / ``reference_e_head``) on ``subset``,
    fed the inputs the session used, and the agreement of every compared quantity."""
    import importlib

    from .reference import E_NAMES, J_NAMES, reference_e_head, reference_j_head

    timers = Timers()
    stages = J_STAGES if claim == "J" else E_STAGES
    recorded: dict[tuple, tuple] = {}
    state: dict[str, Any] = {}
    orig_groups, groups = _tracking_groups(run, state)

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
    compute = run.claim_j_layer if claim == "J" else run.claim_e_layer
    per_layer = {}
    run._groups = groups
    try:
        with sampler.window() as mem, patched(targets):
            w0, c0 = time.perf_counter(), time.process_time()
            for layer in layers:
                t = time.perf_counter()
                per_layer[layer] = compute(layer)
                print(f"   claim {claim} L{layer:02d}: {time.perf_counter() - t:6.1f} s", flush=True)
            timers.add("total", time.perf_counter() - w0, time.process_time() - c0)
    finally:
        run._groups = orig_groups
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


def _reference_capture(loaded, batches, lengths, n: int) -> dict | None:
    """Capture one sample per forward pass (padding trimmed) for the first ``n`` samples."""
    from fixtures.capture import capture_qkv

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


# ------------------------------------------------------------------------------------- the table
def stage_rows(res: dict) -> list[dict]:
    """Per-stage rows (seconds, ratio reference/ours) for one model's result."""
    ow, oc = res["ours"]["wall"], res["ours"]["cpu"]
    rw, rc = res["reference"]["wall"], res["reference"]["cpu"]
    n_ref = res["reference"]["n_heads_measured"]
    factor = res["n_heads_total"] / n_ref if n_ref else None
    g = lambda d, k: d.get(k, 0.0)  # noqa: E731
    main = ("gram@main", "eigen@main", "vvmb@main", "assignment@main")  # exclusive stages
    ours = {
        "gram": (g(ow, "gram"), g(oc, "gram")),
        "eigen": (g(ow, "eigen"), g(oc, "eigen")),
        "metrics": (g(ow, "vvmb"), g(oc, "vvmb")),
        "assignment": (g(ow, "assignment"), g(oc, "assignment")),
    }
    rows = [{"stage": "load model", "ours_wall_s": g(ow, "load"), "ours_cpu_s": g(oc, "load")}]
    cap = res["reference"].get("capture")
    row = {"stage": "capture", "ours_wall_s": g(ow, "capture"), "ours_cpu_s": g(oc, "capture")}
    if cap:
        f = res["n_samples"] / cap["n_samples_measured"]
        row.update(ref_wall_s=cap["wall"] * f, ref_cpu_s=cap["cpu"] * f, ref_extrapolated=f > 1,
                   ref_measured=f"{cap['n_samples_measured']} samples, 1 per forward pass")
    rows.append(row)
    for stage, (w, c) in ours.items():
        label = stage if stage != "assignment" or g(ow, "assignment@main") else \
            "assignment (2nd thread, overlapped)"
        row = {"stage": label, "ours_wall_s": w, "ours_cpu_s": c}
        if factor:
            row.update(ref_wall_s=g(rw, stage) * factor, ref_cpu_s=g(rc, stage) * factor,
                       ref_extrapolated=factor > 1, ref_measured=f"{n_ref} heads")
        rows.append(row)
    rows.append({"stage": "session (nulls, layer I/O, cache, waits)",
                 "ours_wall_s": g(ow, "claim_v") - sum(g(ow, k) for k in main),
                 "ours_cpu_s": None})
    row = {"stage": "claim V, all heads (incl. session)", "ours_wall_s": g(ow, "claim_v"),
           "ours_cpu_s": g(oc, "claim_v")}
    if factor:
        row.update(ref_wall_s=sum(rw.values()) * factor, ref_cpu_s=sum(rc.values()) * factor,
                   ref_extrapolated=factor > 1, ref_measured=f"{n_ref} heads")
    rows.append(row)
    rows.append({"stage": "report (records + HTML)", "ours_wall_s": g(ow, "report"),
                 "ours_cpu_s": g(oc, "report")})
    for row in rows:
        row.setdefault("claim", "V")
    ok = res["agreement"] is None or res["agreement"]["passed"]
    for row in rows:
        if "ref_wall_s" in row and row["ours_wall_s"] > 0:
            row["ratio_wall"] = row["ref_wall_s"] / row["ours_wall_s"] if ok else None
            row["ratio_cpu"] = row["ref_cpu_s"] / max(row["ours_cpu_s"], 1e-9) if ok else None
    mem = res["memory_mb"]
    for row in rows:
        phase = {"load model": "load+capture", "capture": "load+capture",
                 "report (records + HTML)": "report"}.get(row["stage"], "claim_v")
        row["peak_rss_mb"] = mem[phase]["peak"]
        row["rss_phase"] = phase
    for claim, c in res.get("claims", {}).items():
        rows += claim_rows(claim, c)
    return rows


CLAIM_STAGES = {"J": ("phi", "h", "summaries"), "E": ("gram", "eigen", "naive", "gamma")}


def claim_rows(claim: str, c: dict) -> list[dict]:
    """Rows of claim J or E: each stage (exclusive), the session's rest, and the total."""
    ow, oc = c["ours"]["wall"], c["ours"]["cpu"]
    rw, rc = c["reference"]["wall"], c["reference"]["cpu"]
    n_ref = c["reference"]["n_heads_measured"]
    factor = c["n_heads_total"] / n_ref if n_ref else None
    g = lambda d, k: d.get(k, 0.0)  # noqa: E731
    stages = CLAIM_STAGES[claim]
    rows = []
    for stage in stages:
        rows.append({"stage": stage, "ours_wall_s": g(ow, stage), "ours_cpu_s": g(oc, stage),
                     "ref_wall_s": g(rw, stage) * factor if factor else None,
                     "ref_cpu_s": g(rc, stage) * factor if factor else None})
    rows.append({"stage": "session (layer I/O, cache, chunking)",
                 "ours_wall_s": g(ow, "total") - sum(g(ow, s) for s in stages),
                 "ours_cpu_s": None})
    rows.append({"stage": f"claim {claim}, all heads (incl. session)",
                 "ours_wall_s": g(ow, "total"), "ours_cpu_s": g(oc, "total"),
                 "ref_wall_s": sum(rw.values()) * factor if factor else None,
                 "ref_cpu_s": sum(rc.values()) * factor if factor else None})
    ok = c["agreement"] is None or c["agreement"]["passed"]
    for row in rows:
        row["claim"] = claim
        if row.get("ref_wall_s") is None:
            row.pop("ref_wall_s", None), row.pop("ref_cpu_s", None)
            continue
        row.update(ref_extrapolated=factor > 1, ref_measured=f"{n_ref} heads")
        if row["ours_wall_s"] > 0:
            row["ratio_wall"] = row["ref_wall_s"] / row["ours_wall_s"] if ok else None
            row["ratio_cpu"] = row["ref_cpu_s"] / max(row["ours_cpu_s"], 1e-9) if ok else None
        row["peak_rss_mb"] = c["memory_mb"]["peak"]
        row["rss_phase"] = f"claim_{claim}"
    for row in rows:
        row.setdefault("peak_rss_mb", c["memory_mb"]["peak"])
    return rows


def _fmt(x, digits=1) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}"


def print_table(results: dict) -> None:
    print("\n" + "=" * 118)
    print(f"threads {results['machine']['threads']}, load average before/after "
          f"{results['machine']['load_before']} / {results['machine']['load_after']}; "
          "ref* = extrapolated from a measured subset; ratio = reference / ours")
    for res in results["models"]:
        print(f"\n{res['model']}: {res['n_samples']} samples x {res['n_layers']} layers x "
              f"{res['n_heads']} heads = {res['n_heads_total']} heads, N {res['tokens']['min']}-"
              f"{res['tokens']['max']}, d {res['head_dim']}; max_memory "
              f"{res['chunks']['max_memory_bytes'] / MIB:.0f} MiB -> chunks of "
              f"{res['chunks']['samples_per_chunk']} samples")
        print(f"  {'claim':5s} {'stage':40s} {'ours s':>9s} {'ours cpu':>9s} {'ref s':>10s} {'ref cpu':>10s} "
              f"{'ratio':>7s} {'ratio cpu':>9s} {'peak RSS MiB':>13s}")
        for row in res["stages"]:
            star = "*" if row.get("ref_extrapolated") else " "
            ref = _fmt(row.get("ref_wall_s")) + (star if "ref_wall_s" in row else " ")
            refc = _fmt(row.get("ref_cpu_s")) + (star if "ref_cpu_s" in row else " ")
            print(f"  {row['claim']:5s} {row['stage']:40s} {_fmt(row['ours_wall_s'], 2):>9s} "
                  f"{_fmt(row['ours_cpu_s'], 2):>9s} {ref:>10s} {refc:>10s} "
                  f"{_fmt(row.get('ratio_wall'), 2):>7s} {_fmt(row.get('ratio_cpu'), 2):>9s} "
                  f"{row['peak_rss_mb']:13.0f}")
        ag = res["agreement"]
        if ag:
            worst = (max(ag["worst"].items(), key=lambda kv: kv[1]["rel_err"])
                     if ag["worst"] else None)
            print(f"  agreement on {ag['n_heads_checked']} heads (rtol {ag['rtol']:g}): "
                  f"{'PASSED' if ag['passed'] else 'FAILED'}; worst "
                  f"{worst[0] if worst else '-'} {worst[1]['rel_err'] if worst else 0:.2e}; "
                  f"{ag['n_undetermined_nulls_only']} undetermined (nulls only); threshold "
                  f"(Lanczos vs eigvalsh) max rel diff {ag['threshold_max_rel_diff']:.1e}")
        for claim, c in res.get("claims", {}).items():
            ag = c["agreement"]
            if ag:
                worst = max(ag["worst"].items(), key=lambda kv: kv[1]["rel_err"], default=None)
                print(f"  claim {claim} agreement on {ag['n_heads_checked']} heads (rtol "
                      f"{ag['rtol']:g}): {'PASSED' if ag['passed'] else 'FAILED'}; worst "
                      f"{worst[0] if worst else '-'} {worst[1]['rel_err'] if worst else 0:.2e}")
        print("  memory (MiB): " + ", ".join(
            f"{k}: start {v['start']:.0f} peak {v['peak']:.0f} (+{v['peak_minus_start']:.0f})"
            for k, v in res["memory_mb"].items()))


# ------------------------------------------------------------------------- top-k eigh crossover
CROSSOVER_SIZES = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
CROSSOVER_HEADS = ((0, 0), (3, 6), (5, 11))  # (layer, head) of all-MiniLM-L6-v2


def _pooled_minilm_keys() -> tuple[dict, float]:
    """Real all-MiniLM-L6-v2 keys of the default texts, pooled per (layer, head) over all real
    tokens of all texts and shuffled (seed 0): {(layer, head): [T, d]}, and the softmax scale."""
    from fixtures import capture_batches, inputs, models
    from fixtures.registry import REGISTRY

    loaded = models.load_model(REGISTRY["all-MiniLM-L6-v2"])
    texts = inputs.default_texts(None, seed=0)
    encoded, _ = inputs.tokenize_texts(loaded.tokenizer, texts.items, max_length=128)
    cap = capture_batches.capture_in_batches(loaded, [encoded], batch_size=32, dtype=torch.float64)
    mask = cap["token_mask"]
    out = {}
    gen = torch.Generator().manual_seed(0)
    for layer, head in CROSSOVER_HEADS:
        k = cap["k"][layer, :, head][mask]  # [T, d] real tokens only
        out[(layer, head)] = k[torch.randperm(len(k), generator=gen)]
    return out, loaded.scale


def _synthetic_keys(n: int, d: int = 64, seed: int = 0) -> torch.Tensor:
    """Gaussian keys with an anisotropic covariance (eigenvalues 1 … 10^-1.5), a shared offset,
    and s·‖k‖² of a few units, like real keys."""
    g = torch.Generator().manual_seed(seed)
    cov = torch.logspace(0, -1.5, d, dtype=torch.float64)
    rot = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
    k = (torch.randn(n, d, generator=g, dtype=torch.float64) * cov.sqrt()) @ rot.T
    return k * d ** 0.25 / cov.sum().sqrt() + 0.3 * torch.randn(d, generator=g, dtype=torch.float64)


def _centred_gram(k: torch.Tensor, scale: float) -> torch.Tensor:
    from checks import gram

    scores = gram.score_matrix(k, scale)
    return gram.center_gram(gram.normalized_gram(scores, gram.log_normaliser(scores)))


def topk_crossover(args) -> dict:
    """Time the full eigh against top_eigh(method="subspace") for N in CROSSOVER_SIZES, m = 64,
    one matrix at a time, and check the iterative result against the full one."""
    from checks import gram, topk

    m = 64
    sizes = CROSSOVER_SIZES[:5] if args.quick else CROSSOVER_SIZES
    pooled, scale = _pooled_minilm_keys()
    rows = []
    for n in sizes:
        sources = [(f"minilm-L{l}H{h}", pooled[(l, h)][:n], scale) for l, h in CROSSOVER_HEADS]
        sources.append(("synthetic-d64", _synthetic_keys(n), 1 / 8))
        if n > 1024:  # one real and one synthetic matrix where the full eigh takes minutes
            sources = [sources[0], sources[-1]]
        for name, keys, s in sources:
            mat = _centred_gram(keys, s)
            w0 = time.perf_counter()
            mu_full, vec_full = gram.sorted_eigh(mat)
            t_full = time.perf_counter() - w0
            w0 = time.perf_counter()
            mu, vec = topk.top_eigh(mat, m, method="subspace")
            t_sub = time.perf_counter() - w0
            proj = vec @ vec.T - vec_full[:, :m] @ vec_full[:, :m].T
            row = {"n": n, "matrix": name, "full_s": t_full, "subspace_s": t_sub,
                   "eig_rel_err": float(((mu - mu_full[:m]).abs() / mu_full[:m].abs()).max()),
                   "projector_gap": float(torch.linalg.matrix_norm(proj, ord=2)),
                   "mu_m_over_mu_1": float(mu_full[m - 1] / mu_full[0]),
                   "mu_m1_over_mu_m": float(mu_full[m] / mu_full[m - 1])}
            rows.append(row)
            print(f"  N {n:5d} {name:16s} full {t_full:8.3f} s  subspace {t_sub:8.3f} s  "
                  f"eig err {row['eig_rel_err']:.1e}  subspace gap {row['projector_gap']:.1e}  "
                  f"mu_m/mu_1 {row['mu_m_over_mu_1']:.1e}", flush=True)
    medians = {}
    for n in sizes:
        sel = [r for r in rows if r["n"] == n]
        medians[n] = (float(np.median([r["full_s"] for r in sel])),
                      float(np.median([r["subspace_s"] for r in sel])))
    wins = [n for n in sizes if all(medians[x][1] < medians[x][0] for x in sizes if x >= n)]
    return {"m": m, "rows": rows, "median_s": {str(n): v for n, v in medians.items()},
            "iterative_wins_from_n": wins[0] if wins else None,
            "current_constant": topk.AUTO_CROSSOVER_N}


# ------------------------------------------------------------------------ provenance and README
def provenance() -> dict:
    """The commit measured (``-dirty`` when the work tree differs), the UTC date, and how many
    times each model was run (one: every number is a single run; see the README for the spread)."""
    import subprocess

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                                   timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    return {"commit": commit, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "repeats": 1}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


README_START = "<!-- bench-table:start (python -m bench.run --readme) -->"
README_END = "<!-- bench-table:end -->"


def readme_table(results: dict) -> str:
    """The README's Speed table, from a bench results file: per model and claim, each stage's
    seconds (ours / loop, CPU), the ratio, and peak memory."""
    m = results["machine"]
    lines = [README_START,
             f"Measured {results.get('date_utc', '?')} UTC at commit {results.get('commit', '?')}, "
             f"{m['cpus']} CPUs ({m.get('cpu_model', '?')}), torch/BLAS threads "
             f"{m['threads'].get('torch')}, {results.get('repeats', 1)} run; load average before "
             f"/ after {m['load_before'][0]} / {m['load_after'][0]}. Seconds are per-thread CPU "
             "time (wall time on a shared machine measures the neighbours); `*` = the loop was "
             "timed on a subset of heads and extrapolated.", ""]
    for res in results["models"]:
        lines += [f"**{res['model']}**: {res['n_samples']} samples, {res['n_heads_total']:,} "
                  f"heads, N {res['tokens']['min']}–{res['tokens']['max']}, d {res['head_dim']}.",
                  "", "| claim | stage | ours CPU s | loop CPU s | ratio CPU | ours wall s | "
                  "ratio wall | peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
        for row in res["stages"]:
            if row["stage"] in ("load model", "report (records + HTML)"):
                continue
            star = "*" if row.get("ref_extrapolated") else ""
            ref = f"{row['ref_cpu_s']:.1f}{star}" if row.get("ref_cpu_s") is not None else "–"
            bold = "**" if "all heads" in row["stage"] else ""
            lines.append(
                f"| {row['claim']} | {bold}{row['stage']}{bold} | {_fmt(row['ours_cpu_s'])} | "
                f"{ref} | {bold}{_fmt(row.get('ratio_cpu'), 2)}{bold} | "
                f"{_fmt(row['ours_wall_s'])} | {_fmt(row.get('ratio_wall'), 2)} | "
                f"{row['peak_rss_mb']:.0f} |")
        agree = [f"V {'passed' if (res['agreement'] or {}).get('passed') else 'FAILED'}"]
        agree += [f"{c} {'passed' if (x['agreement'] or {}).get('passed') else 'FAILED'}"
                  for c, x in res.get("claims", {}).items()]
        lines += ["", "Agreement with the loop (1e-6 relative): " + ", ".join(agree) + ".", ""]
    lines.append(README_END)
    return "\n".join(lines)


def update_readme(results_path: Path, readme: Path = ROOT / "README.md") -> None:
    """Replace the block between :data:`README_START` and :data:`README_END` in the README by
    :func:`readme_table` of ``results_path``."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{readme} has no bench table markers ({README_START!r} ... "
                         f"{README_END!r}); add them where the table belongs")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    table = readme_table(json.loads(results_path.read_text()))
    readme.write_text(head + table + tail)


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="CI size: 8 texts, 3 images (a couple of minutes)")
    p.add_argument("--out", default=None,
                   help="JSON output (default bench/results.json; with --topk-crossover "
                        "bench/topk_crossover.json)")
    p.add_argument("--max-memory", type=parse_bytes, default=parse_bytes("2G"),
                   help="RunOptions.max_memory, the session's chunking bound (default 2G)")
    p.add_argument("--models", default="minilm,vit_base", help="minilm, vit_base (comma-separated)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch and BLAS threads (default 1: with 2 threads, batched LAPACK "
                        "calls ran 10-400x slower whenever other processes shared the 2 cores, "
                        "and no faster on an idle machine)")
    p.add_argument("--ref-fraction", type=float, default=0.02,
                   help="share of (sample, layer, head) triples the reference computes "
                        "(default 2%%)")
    p.add_argument("--ref-min", type=int, default=48, help="at least this many reference heads")
    p.add_argument("--ref-capture-samples", type=int, default=8,
                   help="samples captured one per forward pass for the reference capture")
    p.add_argument("--rtol", type=float, default=1e-6, help="agreement tolerance (default 1e-6)")
    p.add_argument("--layers", type=lambda t: [int(x) for x in t.split(",")], default=None,
                   help="claim-V layers to time, e.g. 0,1 (default: all)")
    p.add_argument("--topk-crossover", action="store_true",
                   help="measure full eigh vs checks.topk subspace iteration for N 256..4096, m 64")
    p.add_argument("--skip-reference", action="store_true",
                   help="time and measure our path only (memory runs)")
    p.add_argument("--device", default="cpu",
                   help="where our path's math runs: cpu (default), cuda, cuda:N or mps, as "
                        "`pytest claims/ --device` (the reference stays on the CPU)")
    p.add_argument("--readme", action="store_true",
                   help="no run: rewrite the README's Speed table from the results file "
                        "(--out, default bench/results.json)")
    args = p.parse_args(argv)
    if args.readme:
        update_readme(Path(args.out or "bench/results.json"))
        print("README.md: Speed table rewritten from", args.out or "bench/results.json")
        return 0
    from fixtures.device import resolve_device

    try:
        args.device = resolve_device(args.device)
    except ValueError as exc:
        p.exit(4, f"{p.prog}: error: {exc}\n")
    if args.out is None:
        args.out = "bench/topk_crossover.json" if args.topk_crossover else "bench/results.json"
    if args.quick:
        args.ref_min = min(args.ref_min, 24)
        args.ref_capture_samples = min(args.ref_capture_samples, 2)

    threads = set_threads(args.threads)
    if args.topk_crossover:
        res = {"schema": SCHEMA + "/topk-crossover", "threads": threads,
               "load_before": [round(x, 2) for x in os.getloadavg()], **topk_crossover(args),
               "load_after": [round(x, 2) for x in os.getloadavg()]}
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
        print("median seconds per matrix (full, subspace): "
              + ", ".join(f"N={n}: {v[0]:.3f}/{v[1]:.3f}" for n, v in res["median_s"].items()))
        print(f"iterative faster from N = {res['iterative_wins_from_n']} on "
              f"(AUTO_CROSSOVER_N is {res['current_constant']}); written: {out}")
        return 0
    sampler = RssSampler()
    load_before = [round(x, 2) for x in os.getloadavg()]
    command = " ".join([sys.executable, "-m", "bench.run", *sys.argv[1:]])
    results = {"schema": SCHEMA, "command": command, **provenance(),
               "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "threads": threads,
                           "platform": platform.platform(),
                           "python": platform.python_version(), "torch": torch.__version__,
                           "numpy": np.__version__, "load_before": load_before},
               "options": {k: v for k, v in vars(args).items()},
               "memory_method": "psutil RSS sampled every 20 ms in a thread (peak per phase); "
                                "ru_maxrss at exit as a cross-check",
               "models": []}
    with tempfile.TemporaryDirectory(prefix="kpca-bench-") as tmp:
        for cfg in model_configs([m.strip() for m in args.models.split(",") if m.strip()],
                                 args.quick, Path(tmp)):
            res = bench_model(cfg, args, sampler, Path(tmp))
            res["stages"] = stage_rows(res)
            results["models"].append(res)
    sampler.close()
    results["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    results["ru_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    print(f"\nwritten: {out}")
    failed = [f"{r['model']} claim {claim}" for r in results["models"]
              for claim, ag in (("V", r["agreement"]),
                                *((c, x["agreement"]) for c, x in r.get("claims", {}).items()))
              if ag and not ag["passed"]]
    if failed:
        print(f"AGREEMENT FAILED for {failed}: ratios withheld (see 'failures' in {out})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
