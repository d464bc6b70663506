"""``python -m bench.run --pipeline``: the whole per-model pipeline of command 1 (``pytest claims/``)
timed stage by stage, as users run it.

Each model (the ladder of 18 ``kpca-oracle`` controls as one group) runs in a fresh Python process
(``python -m bench.pipeline --worker``), which calls ``pytest.main(["claims/", "--models", M, "-n",
"0", "--threads", "1", "--cache-dir", <fresh temporary folder>, "--out", <temporary folder>])`` in
process, with the suite's own functions wrapped from the outside by :mod:`bench.attribution`
(:data:`STAGES`: which function is which stage): each stage's exclusive per-thread CPU time, a
stage nested in another counted once. What no wrapper covers is ``other``: the process's CPU
time (every thread) less the stages'. Nothing in checks/ or claims/ knows it is measured.

The parent process writes ``bench/pipeline.json`` (commit, date, machine) and prints the per-model ×
stage table; ``python -m bench.run --write-table`` puts it in docs/performance.md. The same run
also times the kernels against the loop reference (:func:`bench.claim_v_timing.bench_model`,
``--models``, default minilm) and prints that ratio beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .attribution import Attribution, Stage, patch_everywhere

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "kpca-claims/bench/pipeline/1"
#: The ladder of method §12, timed as one group (18 small models).
LADDER = "controls"

LOAD, INPUTS, CAPTURE, IO = ("load model", "inputs & prepare (rest)",
                             "capture (forward passes, layer files)", "layer I/O & metrics cache")
EIGEN, GRAM, BASES = "eigendecompositions", "Gram matrices & threshold", "column bases (QR, rank)"
V_METRICS, V_TWIN, V_MATCH, V_P2 = ("V metrics (similarity suite, null)", "V round-off twin",
                                   "V Hungarian assignment", "V p2-code variant")
J_TERMS, J_FIT, J_TREND = "J terms (φ, h)", "J output fit", "J trend checkpoints"
E_NAIVE, E_GAMMA, E_SUBSPACE, E_TWIN = ("E naive float32 spectrum", "E γ spreads",
                                        "E γ invariant subspace", "E round-off twin (eigen control)")
STATS, RECORDS, RESULTS = ("statistics (bootstrap, tests vs chance, TOST, BH)",
                           "records & verdicts", "results.json & report")
PYTEST_START, PYTEST_LOOP = "pytest collection", "pytest test loop (rest)"
IMPORTS, OTHER, CHILDREN = "python start & imports", "other (unattributed)", "child processes"


def _per_layer(args: tuple, kwargs: dict) -> tuple[str, str | None]:
    """``ModelRun.compute_layer(self, claim, layer)``: the claim's per-layer code outside the
    wrapped stages (null draws, batching, filling, waiting for the assignment thread)."""
    claim = args[1] if len(args) > 1 else kwargs.get("claim")
    return f"claim {claim} per-layer rest (nulls, batching, waits)", str(claim)


def _stages(label: str, targets: list[str], **kw) -> list[Stage]:
    return [Stage(t, label, **kw) for t in targets]


#: Which function is which stage. Functions are named where they are defined; every name a
#: project module binds them to is wrapped (:func:`bench.attribution.patch_everywhere`). A target
#: that no longer exists is reported under ``missing_targets`` and its time falls to its caller.
STAGES: list[Stage] = [
    *_stages(LOAD, ["fixtures.models.loading:load_model", "fixtures.models.loading:wrap_model",
                    # the models this suite trains: the shipped or cached series, checked, loaded
                    "fixtures.training.series:cached_series",
                    "fixtures.training.series:TrainedSeries.load"]),
    *_stages(INPUTS, ["fixtures.engine.model_run:ModelRun.prepare",
                      "fixtures.engine.claim_session:_digits_inputs"]),
    Stage("fixtures.models.capture_batches:capture_to_layer_files", CAPTURE),
    *_stages(IO, ["fixtures.engine.model_run:ModelRun.layer_metrics",
                  "fixtures.engine.model_run:ModelRun._capture_layer"]),
    Stage("fixtures.engine.model_run:ModelRun.compute_layer", _per_layer),
    # shared kernels, labelled by the claim they run for
    *_stages(EIGEN, ["checks.eigen:sorted_eigh", "checks.eigen:sorted_eigvalsh",
                     "checks.topk:top_eigh"], shared=True),
    *_stages(GRAM, ["checks.gram:score_matrix", "checks.gram:log_normaliser",
                    "checks.gram:center_gram", "checks.gram:undetermined_threshold"], shared=True),
    Stage("checks.matrix_similarity:orthonormal_column_basis", BASES, shared=True),
    # claim V
    Stage("checks.value_vectors:value_vector_metrics_batched", V_METRICS, claim="V"),
    Stage("checks.value_vectors:_twin", V_TWIN, claim="V", absorb=True),
    *_stages(V_MATCH, ["checks.row_similarity:matched_cosine",
                       "checks.row_similarity:matched_cosine_twin",
                       "checks.assignment:optimal_matching"], claim="V"),
    Stage("checks.p2_code:p2_code_metrics_on", V_P2, claim="V"),
    # claim J
    *_stages(J_TERMS, ["checks.projection:projection_terms_batched",
                       "checks.projection:log_phi_sq_norm_p1_code"], claim="J"),
    Stage("claims.claim_j_layer:output_fit_terms", J_FIT, claim="J", absorb=True),
    Stage("claims.claim_j:trend_point", J_TREND, claim="J", absorb=True),
    # claim E
    Stage("checks.spectrum:naive_gram_spectrum", E_NAIVE, claim="E"),
    *_stages(E_GAMMA, ["checks.gamma:gamma_spread_batched",
                       "checks.gamma_precision:overlap_precision"], claim="E"),
    Stage("checks.invariant_subspace:subspace_measures", E_SUBSPACE, claim="E"),
    Stage("checks.gamma_controls:eigen_control_twin", E_TWIN, claim="E", absorb=True),
    # statistics over samples: intervals, tests against chance, equivalence, multiplicity
    *_stages(STATS, ["claims.claim_v_chance:interval_stats", "claims.claim_v_chance:chance_pvalues",
                     "claims.claim_v_chance:equivalence_margins", "claims.claim_v:head_statistics",
                     "claims.claim_e_gamma_stats:imprecise_overlaps", "claims.claim_e_gamma_stats:subspace_summary",
                     "claims.claim_e_gamma_stats:chance_tests", "claims.claim_e_gamma_stats:gamma_ci",
                     "claims.claim_j:pooled_ci", "claims.claim_j:output_fit_statistics",
                     "claims.claim_j:token_statistics", "claims.claim_e:route_ci",
                     "checks.spectrum:eigenvalue_statistics", "checks.spectrum:route_comparison",
                     "checks.stats:bootstrap_indices", "checks.stats:bootstrap_weights",
                     "checks.stats:percentile_interval", "checks.stats:bootstrap_ratio_ci",
                     "checks.stats:bootstrap_mean_ci", "checks.stats:sign_flip_pvalues",
                     "checks.stats:adjust_pvalues", "checks.nulls:tost_pvalues"]),
    # records: verdicts, round-off widths, JSON, attaching to the test report
    *_stages(RECORDS, ["claims.claim_v:record_for_head", "claims.claim_v:record_for_model",
                       "claims.claim_j:record_for_layer", "claims.claim_j:record_for_model",
                       "claims.claim_j:record_for_series", "claims.claim_e:record_for_head",
                       "claims.claim_e:record_for_model", "claims.round_off_widths:attach",
                       "claims.records:as_json", "fixtures.models.controls:annotate",
                       "fixtures.plugin.transport:attach"]),
    Stage("fixtures.plugin.results:write_results", RESULTS),
]


class _PytestPhases:
    """A pytest plugin timing pytest's own phases as stages, and patching again after collection
    (modules the test files import late)."""

    def __init__(self, attribution: Attribution, patches) -> None:
        self.att, self.patches = attribution, patches

    def _timed(self, label: str):
        return self.att.stage(label)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection(self, session):
        with self._timed(PYTEST_START):
            result = yield
        self.patches.apply()
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session):
        with self._timed(PYTEST_LOOP):
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        with self._timed(RESULTS):
            return (yield)


def _import_targets() -> None:
    """Import the project modules before patching, so every name binding exists."""
    import importlib
    import pkgutil

    import fixtures  # noqa: F401  (torchvision shim before timm)

    for pkg in ("checks", "claims", "fixtures.engine", "fixtures.plugin", "fixtures.models"):
        mod = importlib.import_module(pkg)
        for info in pkgutil.iter_modules(mod.__path__, pkg + "."):
            if info.name.rsplit(".", 1)[-1].startswith("test_") or info.ispkg:
                continue
            try:
                importlib.import_module(info.name)
            except Exception:  # an optional module (a missing extra): its names are not patched
                pass


def stage_totals(att: Attribution, import_cpu: float, run_cpu: float,
                 child_cpu: float = 0.0) -> dict[str, float]:
    """Each stage's CPU seconds for one process, largest first: the wrapped stages of ``att``,
    :data:`IMPORTS` (before the run), :data:`OTHER` (``run_cpu``, the process's CPU time during the
    run, less every stage's) and :data:`CHILDREN`; they add up to ``import_cpu + run_cpu +
    child_cpu``."""
    stages = dict(att.cpu)
    stages[IMPORTS] = import_cpu
    stages[OTHER] = run_cpu - sum(att.cpu.values())
    if child_cpu > 0.005:
        stages[CHILDREN] = child_cpu
    return {k: round(v, 4) for k, v in sorted(stages.items(), key=lambda kv: -kv[1])}


def worker(models: str, n_samples: int | None, out: Path, extra: list[str]) -> int:
    """One ``pytest claims/`` run of ``models`` in this process, stage by stage, into ``out``."""
    t_start = time.perf_counter()
    _import_targets()
    import_cpu = time.process_time()  # interpreter start and imports, before pytest runs
    att = Attribution()
    with tempfile.TemporaryDirectory(prefix="kpca-pipeline-") as tmp:
        argv = ["claims/", "--models", models, "-n", "0", "--threads", "1",
                "--cache-dir", str(Path(tmp) / "cache"), "--out", str(Path(tmp) / "out"),
                "-p", "no:cacheprovider", "-q", "--no-header", "-W", "ignore",
                *(["--n-samples", str(n_samples)] if n_samples else []), *extra]
        with patch_everywhere(att, STAGES) as patches:
            c0, w0 = time.process_time(), time.perf_counter()
            code = pytest.main(list(argv), plugins=[_PytestPhases(att, patches)])
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            wrapped = patches.names()
            missing = list(patches.missing)
        results = json.loads((Path(tmp) / "out" / "results.json").read_text()) \
            if (Path(tmp) / "out" / "results.json").is_file() else {}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    measured = att.totals()
    child = children.ru_utime + children.ru_stime
    stages = stage_totals(att, import_cpu, cpu, child)
    records = results.get("records", [])
    res = {"models": models, "pytest_exit": int(code), "argv": argv,
           "cpu_s": round(import_cpu + cpu + child, 3), "pytest_cpu_s": round(cpu, 3),
           "wall_s": round(time.perf_counter() - t_start, 3), "pytest_wall_s": round(wall, 3),
           "stages_cpu_s": stages,
           "stages_wall_s": measured["wall_s"], "calls": measured["calls"],
           "absorbed_detail_cpu_s": measured["detail_cpu_s"],
           "n_records": len(records),
           "model_keys": sorted(results.get("models", {})),
           "n_samples": sorted({(m.get("input_set") or {}).get("n_samples")
                                for m in results.get("models", {}).values()} - {None}),
           "wrapped_names": wrapped, "missing_targets": missing}
    out.write_text(json.dumps(res, indent=1))
    return 0


# ------------------------------------------------------------------------------- the parent
def default_groups() -> list[str]:
    """Command 1's default models, the ladder as one group (:data:`LADDER`)."""
    from fixtures.models.catalogue import REGISTRY

    named = [k for k, s in REGISTRY.items() if "default" in s.groups and LADDER not in s.groups]
    return named + [LADDER]


def run_group(models: str, n_samples: int | None, log_dir: Path, extra: list[str]) -> dict:
    """:func:`worker` in a fresh Python process (as each xdist worker of command 1 is)."""
    out = log_dir / f"{models.replace(',', '+')}.json"
    log = log_dir / f"{models.replace(',', '+')}.log"
    cmd = [sys.executable, "-m", "bench.pipeline", "--worker", "--models", models,
           "--out", str(out), *(["--n-samples", str(n_samples)] if n_samples else []),
           *[f"--pytest-arg={a}" for a in extra]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0 or not out.is_file():
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"pipeline worker for {models} failed (exit {proc.returncode}):\n{tail}")
    res = json.loads(out.read_text())
    res["label"] = f"kpca-oracle ladder ({len(res['model_keys'])} models)" if models == LADDER \
        else models
    return res


def kernel_ratios(res: dict) -> dict:
    """The ``claim X, all heads`` rows of a kernel benchmark model (:func:`bench.table.stage_rows`):
    ours and the loop's CPU seconds and their ratio, per claim."""
    out = {}
    for row in res["stages"]:
        if "all heads" in row["stage"]:
            out[row["claim"]] = {"ours_cpu_s": row["ours_cpu_s"], "loop_cpu_s": row.get("ref_cpu_s"),
                                 "ratio_cpu": row.get("ratio_cpu"),
                                 "loop_extrapolated": row.get("ref_extrapolated", False)}
    return out


def pipeline_main(args, threads: dict) -> int:
    """``python -m bench.run --pipeline``: every group, then the kernels against the loop."""
    import platform

    import numpy as np
    import torch

    from .claim_v_timing import bench_model
    from .table import print_pipeline, stage_rows
    from .timing import RssSampler, cpu_model, provenance
    from .workloads import model_configs

    groups = ([g.strip() for g in args.pipeline_models.split(",") if g.strip()]
              if args.pipeline_models else default_groups())
    n_samples = args.n_samples or (8 if args.quick else None)
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = {"schema": SCHEMA, "command": " ".join(["python", "-m", "bench.run", *sys.argv[1:]]),
               **provenance(),
               "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
                           "platform": platform.platform(), "python": platform.python_version(),
                           "torch": torch.__version__, "numpy": np.__version__,
                           "threads": threads, "load_before": load_before},
               "n_samples": n_samples or 100,
               "method": "each model in a fresh process: pytest.main(claims/ --models M -n 0 "
                         "--threads 1, fresh --cache-dir); per-thread CPU seconds (time.thread_time) "
                         "of wrapped functions, exclusive (nested stages counted once); 'other' = "
                         "the process's CPU time less the stages'",
               "models": []}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kpca-pipeline-logs-") as logs:
        for group in groups:
            print(f"== pipeline: {group}", flush=True)
            res = run_group(group, n_samples, Path(logs), args.pytest_arg or [])
            print(f"   {res['cpu_s']:.1f} CPU s, {res['wall_s']:.1f} s wall, pytest exit "
                  f"{res['pytest_exit']}, {res['n_records']} records", flush=True)
            if res["missing_targets"]:
                print(f"   not wrapped (missing): {res['missing_targets']}", flush=True)
            results["models"].append(res)
    results["pipeline_wall_s"] = round(time.perf_counter() - t0, 1)
    measured = sorted({n for r in results["models"] for n in r["n_samples"]})
    if measured:  # what the runs used (a --pytest-arg may have set it)
        results["n_samples"] = measured[0] if len(measured) == 1 else measured
    kernel_names = [m.strip() for m in (args.models or "minilm").split(",")
                    if m.strip() and m.strip() != "none"]
    results["kernels"] = []
    if kernel_names:
        sampler = RssSampler()
        with tempfile.TemporaryDirectory(prefix="kpca-bench-") as tmp:
            for cfg in model_configs(kernel_names, args.quick, Path(tmp)):
                res = bench_model(cfg, args, sampler, Path(tmp))
                res["stages"] = stage_rows(res)
                agree = [res["agreement"], *(c["agreement"] for c in res["claims"].values())]
                results["kernels"].append({
                    "model": res["model"], "n_samples": res["n_samples"],
                    "n_heads_total": res["n_heads_total"], "claims": kernel_ratios(res),
                    "agreement_passed": all(a is None or a["passed"] for a in agree)})
        sampler.close()
    results["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out or "bench/pipeline.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print_pipeline(results)
    print(f"\nwritten: {out}")
    failed = [k["model"] for k in results["kernels"] if not k["agreement_passed"]]
    if failed:
        print(f"AGREEMENT FAILED for the kernels of {failed}: ratios withheld", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pipeline",
                                description="one pipeline worker (python -m bench.run --pipeline "
                                            "starts these)")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--n-samples", type=int, default=None)
    p.add_argument("--pytest-arg", action="append", default=[])
    args = p.parse_args(argv)
    return worker(args.models, args.n_samples, args.out, args.pytest_arg)


if __name__ == "__main__":
    sys.exit(main())
