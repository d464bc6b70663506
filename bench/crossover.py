"""``python -m bench.run --topk-crossover``: the full ``eigh`` against
:func:`checks.topk.top_eigh` (block subspace iteration) for N = 256 … 4096 and m = 64, on real
all-MiniLM-L6-v2 keys pooled over texts and on synthetic keys, one matrix at a time; each
iterative result is checked against the full one. The measured crossover is what
:data:`checks.topk.AUTO_CROSSOVER_N` records.
"""

from __future__ import annotations

import time

import numpy as np
import torch


CROSSOVER_SIZES = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
CROSSOVER_HEADS = ((0, 0), (3, 6), (5, 11))  # (layer, head) of all-MiniLM-L6-v2


def _pooled_minilm_keys() -> tuple[dict, float]:
    """Real all-MiniLM-L6-v2 keys of the default texts, pooled per (layer, head) over all real
    tokens of all texts and shuffled (seed 0): {(layer, head): [T, d]}, and the softmax scale."""
    from fixtures.models import capture_batches, loading as models
    from fixtures import inputs
    from fixtures.models.catalogue import REGISTRY

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
