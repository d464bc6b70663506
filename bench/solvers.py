"""``python -m bench.run --solvers``: the assignment solvers and the partial eigensolvers of claim V
measured on real matrices, in one process, per-thread CPU time (wall time on a shared machine
measures the neighbours), best of ``repeats``.

The matrices are the ones the suite solves: one :class:`fixtures.engine.model_run.ModelRun` computes a
layer's claim V while thin wrappers keep every cosine matrix handed to the Hungarian step (against
V̂, against the null V̂₀ and the p2-code variant's, method §2.1, §2.3, §8.3) and every unit-peak
centred Gram matrix handed to the eigensolver. Assignment: SciPy ``linear_sum_assignment`` (the
reference), ``lap.lapjv`` when installed, and the batched torch auction of
:func:`checks.assignment.auction_matching` (its ε schedule stops when the dual bound certifies the
mean matched cosine within ``AUCTION_TOL`` = 1e-9); every solver's mean matched cosine is asserted
within 1e-9 of SciPy's on every matrix before a time is reported. Eigen: the batched full
``torch.linalg.eigh`` against the top-d solvers (``scipy.linalg.eigh(subset_by_index)`` with the
``evr`` and ``evx`` drivers, :func:`checks.topk.subspace_iteration`, ``torch.lobpcg``), each
asserted to give the top-d eigenvalues within 1e-6 relative and the same eigenvector subspace
(largest principal-angle sine ≤ 1e-6).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import scipy.linalg
import torch
from scipy.optimize import linear_sum_assignment

from checks import assignment as assignment_mod

#: Mean matched cosine of every solver vs SciPy's, on every matrix (the auction's certified gap).
ASSIGNMENT_ATOL = 1e-9
#: Top-d eigenvalues (relative) and eigenvector subspaces (sine of the largest angle) vs full eigh.
EIGEN_RTOL = 1e-6
KINDS = ("v_hat", "null", "p2code")


def collect(spec, n_samples: int, layer: int, workdir: Path, images: str | None = None
            ) -> tuple[dict[str, list[torch.Tensor]], list[tuple[torch.Tensor, int]]]:
    """({kind: [cosine matrices [H, N, N]]}, [(centred Gram [b, h, N, N], d)]) of one layer."""
    import checks.gram
    import checks.p2_code
    import checks.topk
    import checks.value_vectors
    from fixtures.cache import Cache
    from fixtures.engine.model_run import ModelRun
    from fixtures.engine.run_options import RunOptions

    from .timing import patched

    options = RunOptions(images=images, n_samples=n_samples, seed=0,
                         cache_dir=str(workdir / "solver-cache"))
    run = ModelRun(spec, options, Cache(options.cache_dir))
    run.prepare()
    cos: dict[str, list[torch.Tensor]] = defaultdict(list)
    grams: list[tuple[torch.Tensor, int]] = []

    def vvmb(orig):
        def call(k, v, **kw):
            out = orig(k, v, **kw)
            for c in out["cosine_matrices"][0]:
                cos["v_hat"].append(c.clone())
            for c in out["cosine_matrices"][1]:
                cos["null"].append(c.clone())
            return out
        return call

    def p2(orig):
        def call(k, v, *a, **kw):
            out = orig(k, v, *a, **kw)
            cos["p2code"].extend(c.clone() for c in out["cosine_matrix"])
            return out
        return call

    def top(orig):
        def call(matrix, m, *a, **kw):
            grams.append((matrix.detach().clone(), m))
            return orig(matrix, m, *a, **kw)
        return call

    # KeyGram looks top_eigh up in checks.gram (imported from checks.topk): both names wrapped
    with patched([(checks.value_vectors, "value_vector_metrics_batched", vvmb),
                  (checks.p2_code, "p2_code_metrics", p2),
                  (checks.topk, "top_eigh", top), (checks.gram, "top_eigh", top)]):
        run.layer_metrics("V", layer)
    return dict(cos), grams


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.thread_time()
        out = fn()
        best = min(best, time.thread_time() - t)
    return best, out


def _scipy(mats: np.ndarray) -> np.ndarray:
    res = np.empty(mats.shape[0])
    for b, c in enumerate(mats):
        rows, cols = linear_sum_assignment(c, maximize=True)
        res[b] = c[rows, cols].mean()
    return res


def _lapjv(mats: np.ndarray) -> np.ndarray:
    res = np.empty(mats.shape[0])
    for b, c in enumerate(mats):
        perm = assignment_mod._lapjv(np.negative(c))[1]
        res[b] = c[np.arange(c.shape[0]), perm].mean()
    return res


def _auction(mats: np.ndarray) -> np.ndarray:
    perm, _, _ = assignment_mod.auction_matching(torch.from_numpy(mats))
    return np.take_along_axis(mats, perm.numpy()[..., None], -1)[..., 0].mean(-1)


def measure_assignment(cos: dict[str, list[torch.Tensor]], repeats: int = 3,
                       auction: bool = True) -> dict:
    """ms per matrix of each solver per kind, and the largest |mean − SciPy's| (asserted)."""
    solvers = {"scipy": _scipy}
    if assignment_mod._lapjv is not None:
        solvers["lapjv"] = _lapjv
    if auction:
        solvers["auction"] = _auction
    out: dict[str, dict] = {}
    for kind in KINDS:
        if not cos.get(kind):
            continue
        by_n: dict[int, list[np.ndarray]] = defaultdict(list)
        for c in cos[kind]:
            by_n[c.shape[-1]].extend(c.reshape(-1, c.shape[-1], c.shape[-1]).double().numpy())
        row: dict[str, dict] = {}
        ref = {n: _scipy(np.stack(m)) for n, m in by_n.items()}
        total = sum(len(m) for m in by_n.values())
        for name, fn in solvers.items():
            seconds, gap = 0.0, 0.0
            for n, mats in by_n.items():
                s, res = _best(lambda: fn(np.stack(mats)), repeats if name != "auction" else 1)
                seconds += s
                gap = max(gap, float(np.abs(res - ref[n]).max()))
            assert gap <= ASSIGNMENT_ATOL, f"{name} on {kind}: mean matched cosine off by {gap:.3g}"
            row[name] = {"ms_per_matrix": 1e3 * seconds / total, "max_gap": gap}
        out[kind] = {"matrices": total, "n": sorted(by_n), **row}
    return out


def _subspace_sine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest sine of the principal angles between span(a) and span(b), [..., N, m] each."""
    s = torch.linalg.svdvals(a.transpose(-1, -2) @ b)
    return float((1 - s.amin(-1).clamp(max=1) ** 2).clamp_min(0).sqrt().max())


def measure_eigen(grams: list[tuple[torch.Tensor, int]], repeats: int = 3, limit: int = 240) -> dict:
    """ms per matrix of the full batched eigh and each top-d solver, on up to ``limit`` matrices
    of the most common N; the agreement of each with the full eigh is asserted."""
    from checks import topk

    by_n: dict[tuple[int, int], list[torch.Tensor]] = defaultdict(list)
    for g, m in grams:
        by_n[(g.shape[-1], m)].extend(g.reshape(-1, g.shape[-1], g.shape[-1]))
    (n, m), mats = max(by_n.items(), key=lambda kv: len(kv[1]))
    batch = torch.stack(mats[:limit]).double()
    count = batch.shape[0]

    def full():
        mu, vec = torch.linalg.eigh(batch)
        return mu.flip(-1)[..., :m], vec.flip(-1)[..., :m]

    def scipy_subset(driver):
        def run():
            mus, vecs = [], []
            for a in batch.numpy():
                w, v = scipy.linalg.eigh(a, subset_by_index=[n - m, n - 1], driver=driver,
                                         check_finite=False)
                mus.append(w[::-1].copy())
                vecs.append(v[:, ::-1].copy())
            return torch.from_numpy(np.stack(mus)), torch.from_numpy(np.stack(vecs))
        return run

    solvers = {"torch eigh (full, batched)": full,
               "numpy eigh (full, per matrix)": lambda: tuple(
                   torch.from_numpy(x) for x in _np_full(batch.numpy(), m)),
               "scipy eigh subset evr": scipy_subset("evr"),
               "scipy eigh subset evx": scipy_subset("evx"),
               "checks.topk subspace": lambda: topk.top_eigh(batch, m, method="subspace"),
               "torch.lobpcg": lambda: topk.top_eigh(batch, m, method="lobpcg")}
    ref_mu, ref_vec = full()
    scale = ref_mu.abs().amax(-1, keepdim=True)
    out = {"n": n, "m": m, "matrices": count}
    for name, fn in solvers.items():
        try:
            seconds, (mu, vec) = _best(fn, repeats)
        except Exception as exc:  # noqa: BLE001 - an iterative solver that fails is a result
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}", "agrees": False}
            continue
        mu_err = float(((mu - ref_mu).abs() / scale).max())
        sine = _subspace_sine(vec, ref_vec)
        out[name] = {"ms_per_matrix": 1e3 * seconds / count, "mu_rel_err": mu_err,
                     "subspace_sine": sine, "agrees": mu_err <= EIGEN_RTOL and sine <= EIGEN_RTOL}
    return out


def _np_full(a: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    mu, vec = np.linalg.eigh(a)
    return mu[..., ::-1][..., :m].copy(), vec[..., ::-1][..., :m].copy()


def solver_benchmark(specs: list[tuple[str, object, int, str | None]], layer: int, workdir: Path,
                     repeats: int = 3) -> dict:
    """Both measurements for each (name, model spec, samples, images) on one layer."""
    out = {}
    for name, spec, n_samples, images in specs:
        cos, grams = collect(spec, n_samples, layer, workdir, images)
        out[name] = {"layer": layer, "samples": n_samples,
                     "assignment": measure_assignment(cos, repeats),
                     "eigen": measure_eigen(grams, repeats)}
    return out


def print_solvers(res: dict) -> None:
    for model, r in res.items():
        print(f"\n{model}, layer {r['layer']}, {r['samples']} samples (CPU ms per matrix)")
        for kind, row in r["assignment"].items():
            cells = ", ".join(f"{s} {v['ms_per_matrix']:.3f} (gap {v['max_gap']:.1e})"
                              for s, v in row.items() if isinstance(v, dict))
            print(f"  assignment {kind:7s} N {row['n'][0]}..{row['n'][-1]}, "
                  f"{row['matrices']} matrices: {cells}")
        e = r["eigen"]
        print(f"  eigen N {e['n']}, top {e['m']}, {e['matrices']} matrices:")
        for name, v in e.items():
            if isinstance(v, dict) and "error" in v:
                print(f"    {name:30s} failed: {v['error']}")
            elif isinstance(v, dict):
                print(f"    {name:30s} {v['ms_per_matrix']:7.3f} ms  mu err {v['mu_rel_err']:.1e}"
                      f"  subspace {v['subspace_sine']:.1e}  {'ok' if v['agrees'] else 'DISAGREES'}")
