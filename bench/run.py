"""``python -m bench.run``: time the suite's claims V, J and E stage by stage against plain
per-head loops (:mod:`bench.loop_reference`), check that both give the same numbers, and measure
peak memory. ``--pipeline`` times the whole per-model pipeline of ``pytest claims/`` stage by stage
instead (:mod:`bench.pipeline`, :mod:`bench.attribution`), then the kernels against the loop in the
same run. ``--write-table`` rewrites the Speed tables of docs/performance.md from the results files instead;
``--topk-crossover`` measures the eigensolver crossover (:mod:`bench.crossover`); ``--solvers``
measures the assignment solvers and the partial eigensolvers on real matrices
(:mod:`bench.solvers`); ``--linalg-batching`` whether batched ``eigh``, ``qr`` and ``svd`` beat a
loop of single calls on ``--device`` (:mod:`bench.linalg_batching`). The jobs live in their
modules: the instruments in :mod:`bench.timing`,
the inputs in :mod:`bench.workloads`, claim V in :mod:`bench.claim_v_timing`, claims J and E in
:mod:`bench.claims_je_timing`, the table and its page in :mod:`bench.table`. Before any ratio is
printed, every compared quantity of every checked head must agree with the loop to ``--rtol``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
from pathlib import Path

import fixtures  # noqa: F401  (torchvision shim before timm)

import numpy as np
import torch

from .claim_v_timing import bench_model
from .crossover import topk_crossover
from .linalg_batching import HEADER as LINALG_HEADER, SIZES as LINALG_SIZES, linalg_batching
from .linalg_batching import format_row as format_linalg_row
from .workloads import model_configs
from .table import print_table, stage_rows, update_doc, update_pipeline_doc
from .timing import ROOT, RssSampler, cpu_model, parse_bytes, provenance, set_threads

SCHEMA = "kpca-claims/bench/1"
#: Where ``--pipeline`` writes (``--out`` overrides) and ``--write-table`` reads the pipeline table.
PIPELINE_JSON = ROOT / "bench" / "pipeline.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="CI size: 8 texts, 3 images (a couple of minutes)")
    p.add_argument("--out", default=None,
                   help="JSON output (default bench/results.json; with --topk-crossover "
                        "bench/topk_crossover.json)")
    p.add_argument("--max-memory", type=parse_bytes, default=parse_bytes("2G"),
                   help="RunOptions.max_memory, the session's chunking bound (default 2G)")
    p.add_argument("--models", default=None,
                   help="minilm, vit_base (comma-separated; default both, with --pipeline "
                        "minilm; 'none' with --pipeline: no kernel comparison)")
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
    p.add_argument("--solvers", action="store_true",
                   help="measure the assignment solvers and the partial eigensolvers on the real "
                        "matrices of one layer (--layers, default 0; bench/solvers.json)")
    p.add_argument("--linalg-batching", action="store_true",
                   help="batched torch.linalg eigh, qr and svd against loops of single calls on "
                        "--device, n 16..256, float64 and float32 (bench/linalg_batching.json)")
    p.add_argument("--skip-reference", action="store_true",
                   help="time and measure our path only (memory runs)")
    p.add_argument("--device", default="cpu",
                   help="where our path's math runs: cpu (default), cuda, cuda:N or mps, as "
                        "`pytest claims/ --device` (the reference stays on the CPU)")
    p.add_argument("--pipeline", action="store_true",
                   help="the whole per-model pipeline of `pytest claims/` (command 1), stage by "
                        "stage, each model in a fresh process (bench.pipeline), then the kernels "
                        "of --models against the loop; written to bench/pipeline.json")
    p.add_argument("--pipeline-models", default=None,
                   help="with --pipeline: comma-separated models or groups, each timed in its own "
                        "process (default: command 1's default models, the 18-model control "
                        "ladder as one group 'controls')")
    p.add_argument("--n-samples", type=int, default=None,
                   help="with --pipeline: samples per model (default 100 as command 1; --quick 8)")
    p.add_argument("--pytest-arg", action="append", default=None,
                   help="with --pipeline: one more argument for each `pytest claims/` run "
                        "(repeatable), e.g. --pytest-arg=--layers=0")
    p.add_argument("--write-table", action="store_true",
                   help="no run: rewrite the Speed tables of docs/performance.md from the "
                        "results file (--out, default bench/results.json) and from "
                        "bench/pipeline.json when it exists")
    args = p.parse_args(argv)
    if args.write_table:
        update_doc(Path(args.out or "bench/results.json"))
        print("docs/performance.md: Speed table rewritten from", args.out or "bench/results.json")
        if PIPELINE_JSON.is_file():
            update_pipeline_doc(PIPELINE_JSON)
            print("docs/performance.md: pipeline table rewritten from", PIPELINE_JSON)
        return 0
    from fixtures.engine.device import resolve_device

    try:
        args.device = resolve_device(args.device)
    except ValueError as exc:
        p.exit(4, f"{p.prog}: error: {exc}\n")
    if args.pipeline:
        args.ref_min = min(args.ref_min, 24) if args.quick else args.ref_min
        args.ref_capture_samples = (min(args.ref_capture_samples, 2) if args.quick
                                    else args.ref_capture_samples)
        from .pipeline import pipeline_main

        return pipeline_main(args, set_threads(args.threads))
    if args.models is None:
        args.models = "minilm,vit_base"
    if args.out is None:
        args.out = ("bench/topk_crossover.json" if args.topk_crossover else
                    "bench/solvers.json" if args.solvers else
                    "bench/linalg_batching.json" if args.linalg_batching else "bench/results.json")
    if args.quick:
        args.ref_min = min(args.ref_min, 24)
        args.ref_capture_samples = min(args.ref_capture_samples, 2)

    threads = set_threads(args.threads)
    if args.topk_crossover:
        res = {"schema": SCHEMA + "/topk-crossover", "threads": threads,
               "load_before": [round(x, 2) for x in os.getloadavg()], **topk_crossover(args),
               "load_after": [round(x, 2) for x in os.getloadavg()]}
        out = _write_json(args.out, res)
        print("median seconds per matrix (full, subspace): "
              + ", ".join(f"N={n}: {v[0]:.3f}/{v[1]:.3f}" for n, v in res["median_s"].items()))
        print(f"iterative faster from N = {res['iterative_wins_from_n']} on "
              f"(AUTO_CROSSOVER_N is {res['current_constant']}); written: {out}")
        return 0
    if args.solvers:
        return solvers_main(args, threads)
    if args.linalg_batching:
        return linalg_batching_main(args, threads)
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
    out = _write_json(args.out, results)
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


def solvers_main(args, threads: dict) -> int:
    """``--solvers``: :func:`bench.solvers.solver_benchmark` on one layer of each model (all-MiniLM-L6-v2:
    20 texts; vit_base: 4 images; --quick: 8 and 2), written to ``--out``."""
    from .solvers import print_solvers, solver_benchmark

    layer = args.layers[0] if args.layers else 0
    with tempfile.TemporaryDirectory(prefix="kpca-bench-") as tmp:
        specs = [(cfg.spec.key, cfg.spec, (8 if args.quick else 20) if cfg.name == "minilm"
                  else (2 if args.quick else 4), cfg.images)
                 for cfg in model_configs([m.strip() for m in args.models.split(",") if m.strip()],
                                          args.quick, Path(tmp))]
        res = {"schema": SCHEMA + "/solvers", "threads": threads, **provenance(),
               "load_before": [round(x, 2) for x in os.getloadavg()],
               "models": solver_benchmark(specs, layer, Path(tmp)),
               "load_after": [round(x, 2) for x in os.getloadavg()]}
    out = _write_json(args.out, res)
    print_solvers(res["models"])
    print(f"\nwritten: {out}")
    return 0


def linalg_batching_main(args, threads: dict) -> int:
    """``--linalg-batching``: :func:`bench.linalg_batching.linalg_batching` on ``--device``,
    written to ``--out`` with the device named."""
    device = torch.device(args.device)
    named = (torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model())
    print(f"torch.linalg on {device} ({named}): microseconds per matrix, each row as it is done")
    print(LINALG_HEADER, flush=True)
    res = {"schema": SCHEMA + "/linalg-batching", "threads": threads, **provenance(),
           "device": str(device), "device_name": named, "torch": torch.__version__,
           "rows": linalg_batching(device, sizes=(16, 32, 33, 64) if args.quick else
                                   LINALG_SIZES,
                                   progress=lambda r: print(format_linalg_row(r), flush=True))}
    out = _write_json(args.out, res)
    print(f"\nwritten: {out}")
    return 0


def _write_json(path, res: dict) -> Path:
    """Write a benchmark's results to ``path`` (its folder made if missing); returns the path.
    Values JSON does not know (a path, a dtype) are written as their ``str``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    return out


if __name__ == "__main__":
    sys.exit(main())
