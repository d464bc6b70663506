"""Optimal one-to-one token matching for the optimal-cosine metric (method §2, P2's protocol).

Three solvers of the same problem, max over permutations π of Σ_j cos[j, π(j)]:

- ``"lapjv"``: Jonker–Volgenant (``lap.lapjv``, PyPI package ``lap``), one matrix at a time;
- ``"scipy"``: ``scipy.optimize.linear_sum_assignment`` (the reference path, and the fallback
  when ``lap`` is not installed), one matrix at a time;
- ``"auction"``: a batched ε-scaling forward auction in torch (:func:`auction_matching`) over all
  matrices at once, on any device, stopped when its dual bound certifies the mean matched score
  within ``AUCTION_TOL`` of the optimum.

Measured on real cosine matrices (``python -m bench.run --solvers``, ``bench/solvers.json``;
per-thread CPU time per matrix, 1 thread, best of 3, on the loaded 2-core machine, layer 0):
random vit_base N = 197, d = 64 (48 matrices per kind): SciPy 4.8–5.8 ms, lapjv 5.9–6.8 ms,
auction 37–47 ms; all-MiniLM-L6-v2 N = 74–88, d = 32 (240 per kind): SciPy 0.36–0.39 ms, lapjv
0.29–0.56 ms, auction 11–88 ms. Earlier, on a quiet machine, over the 12 layers of vit_base: SciPy
2.2–2.6 ms, lapjv 1.8–2.5 ms. Every solver gave the same optimal sums (the auction within its
certified 1e-9; ``bench.solvers`` asserts 1e-9 against SciPy on every matrix). The auction spends
its time in thousands of bidding rounds whatever the batch, so it is the candidate for an
accelerator, where all heads of a layer bid at once, not for the CPU.

``"scipy"`` is the default (:data:`DEFAULT_SOLVER`): it was faster than lapjv on five of the six
kinds of matrix measured above (lapjv won on MiniLM's null matrices, 0.29 against 0.36 ms), and
the session runs the assignment in a second
thread beside the next batch's tensor math, where ``lap.lapjv``, which holds the GIL while it
solves (SciPy releases it), stalled the main thread's torch calls (3,000 small torch calls beside
a solving thread: 1.1–1.2 s with lapjv, 0.7–0.9 s with SciPy, 0.4–0.6 s alone). ``lap`` is
optional.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

try:  # optional: no faster than scipy's on our matrices, and it keeps the GIL (module docstring)
    from lap import lapjv as _lapjv
except ImportError:  # pragma: no cover - depends on the environment
    _lapjv = None

SOLVERS = ("lapjv", "scipy", "auction")
#: The solver :func:`optimal_matching` uses when none is named (see the module docstring for why
#: not the slightly faster ``"lapjv"``).
DEFAULT_SOLVER = "scipy"
#: Largest gap between the auction's mean matched score and the optimum (certified by its dual).
AUCTION_TOL = 1e-9


def _check(cos) -> int:
    if not isinstance(cos, torch.Tensor) or cos.ndim < 2 or cos.shape[-1] != cos.shape[-2]:
        shape = tuple(cos.shape) if isinstance(cos, torch.Tensor) else type(cos).__name__
        raise ValueError(f"cos must be a tensor of square matrices [..., N, N], got {shape}")
    if not bool(torch.isfinite(cos).all()):
        raise ValueError("cos contains NaN or Inf; the assignment needs finite scores")
    return cos.shape[-1]


def optimal_matching(cos: torch.Tensor, solver: str | None = None) -> torch.Tensor:
    """The permutation π maximising Σ_j cos[j, π(j)], for every leading index.

    Parameters
    ----------
    cos : Tensor [..., N, N]
        Square score matrices (for claim V: cos(v_j, v̂_k)), finite.
    solver : {"lapjv", "scipy", "auction"}, optional
        Default :data:`DEFAULT_SOLVER`. ``"lapjv"`` needs the ``lap`` package.

    Returns
    -------
    Tensor [..., N], dtype long, on ``cos``'s device
        ``π[..., j]`` is the column matched to row j (method §2.1, optimal cosine). When several permutations tie, which one is
        returned is the solver's choice; the optimal sum is unique. ``"auction"`` returns a
        permutation whose mean score is within :data:`AUCTION_TOL` of the optimum.

    Examples
    --------
    >>> cos = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.2, 0.1], [0.0, 0.3, 0.7]])
    >>> optimal_matching(cos).tolist()
    [1, 0, 2]
    """
    solver = DEFAULT_SOLVER if solver is None else solver
    if solver not in SOLVERS:
        raise ValueError(f"unknown assignment solver {solver!r}; use one of {SOLVERS}")
    if solver == "lapjv" and _lapjv is None:
        raise ValueError("solver 'lapjv' needs the 'lap' package (pip install lap); "
                         "or use solver='scipy'")
    n = _check(cos)
    if solver == "auction":
        perm = auction_matching(cos.detach().reshape(-1, n, n))[0]
        return perm.reshape(cos.shape[:-1])
    flat = cos.detach().to("cpu", torch.float64).reshape(-1, n, n).numpy()
    perms = np.empty((flat.shape[0], n), dtype=np.int64)
    for b in range(flat.shape[0]):  # the one allowed per-item loop (these solvers take one matrix)
        if solver == "lapjv":
            perms[b] = _lapjv(np.negative(flat[b]))[1]  # lapjv minimises: −cos
        else:
            rows, cols = linear_sum_assignment(flat[b], maximize=True)
            perms[b, rows] = cols
    return torch.from_numpy(perms).reshape(cos.shape[:-1]).to(cos.device)


def auction_matching(cos: torch.Tensor, tol: float = AUCTION_TOL, factor: float = 8.0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched ε-scaling forward auction (Bertsekas; Jacobi bidding) maximising Σ_j cos[j, π(j)].

    Every unassigned row ("person") of every matrix bids at once for its best column ("object")
    at price p: it raises that price by (best − second best value) + ε; each object goes to its
    highest bidder. A phase ends when every row is assigned (ε-complementary slackness); ε then
    shrinks by ``factor``, prices are kept. After each phase the dual bound
    D = Σ_j p_j + Σ_i max_j (cos_ij − p_j) ≥ optimum ≥ P (the matched sum) is checked; it stops
    once (D − P)/N ≤ ``tol`` for every matrix, so the mean matched score is certified within
    ``tol`` of the optimum (ε-CS alone bounds the gap by N·ε).

    Parameters
    ----------
    cos : Tensor [B, N, N], finite, any device.

    Returns
    -------
    (perm [B, N] long, primal [B], dual [B]): the matching, its mean score P/N, and the dual bound
    D/N (float64), with primal ≤ optimum/N ≤ dual and dual − primal ≤ ``tol``.
    """
    b, n, _ = cos.shape
    c = cos.to(torch.float64)
    dev = c.device
    prices = torch.zeros(b, n, dtype=c.dtype, device=dev)
    if n == 1:
        zero = torch.zeros(b, 1, dtype=torch.long, device=dev)
        return zero, c[:, 0, 0], c[:, 0, 0]
    span = float((c.amax() - c.amin()).clamp_min(torch.finfo(c.dtype).tiny)) if b else 1.0
    eps, final = span / 4, tol / 2
    while True:
        owner = torch.full((b, n), -1, dtype=torch.long, device=dev)  # object → row
        match = torch.full((b, n), -1, dtype=torch.long, device=dev)  # row → object
        while True:
            free = (match < 0).nonzero()  # [K, 2]: (matrix, row) still unassigned
            if free.shape[0] == 0:
                break
            fb, fi = free[:, 0], free[:, 1]
            top = (c[fb, fi] - prices[fb]).topk(2, dim=-1)
            j = top.indices[:, 0]
            bid = prices[fb, j] + (top.values[:, 0] - top.values[:, 1]) + eps
            flat = fb * n + j
            best = torch.full((b * n,), -math.inf, dtype=c.dtype, device=dev)
            best.scatter_reduce_(0, flat, bid, "amax")
            win = bid == best[flat]
            who = torch.full((b * n,), n, dtype=torch.long, device=dev)
            who.scatter_reduce_(0, flat[win], fi[win], "amin")  # ties: the lowest row wins
            won = (who < n).nonzero().squeeze(-1)
            wb, wj, wi = won // n, won % n, who[won]
            prev = owner[wb, wj]
            had = prev >= 0
            match[wb[had], prev[had]] = -1  # outbid rows bid again next round
            owner[wb, wj] = wi
            match[wb, wi] = wj
            prices[wb, wj] = best[won]
        primal = c.gather(-1, match.unsqueeze(-1)).squeeze(-1).sum(-1)
        dual = prices.sum(-1) + (c - prices.unsqueeze(-2)).amax(-1).sum(-1)
        if bool(((dual - primal) <= tol * n).all()) or eps <= final:
            return match, primal / n, dual / n
        eps = max(eps / factor, final)
