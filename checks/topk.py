"""Top-m eigenpairs of symmetric positive semi-definite matrices without a full eigendecomposition.

For long sequences (text up to N = 4096 tokens) the full ``torch.linalg.eigh`` of the centred Gram
matrix K̃ costs O(N³) per head, while claim V needs only its top d eigenpairs (method §1: A = the d
leading unit eigenvectors, sign-fixed). :func:`top_eigh` returns those, batched over any leading
dimensions, by one of

- ``"full"``: ``checks.gram.sorted_eigh`` and the first m columns (exact reference);
- ``"subspace"``: block subspace iteration with Rayleigh–Ritz, batched in torch: each outer step
  applies a Chebyshev polynomial filter of the matrix (``degree`` products) to the current Ritz
  block of m + p vectors, re-orthonormalises it (QR), takes its Ritz pairs, and stops an item
  when the residuals of its m leading Ritz pairs are small (``degree=1``: plain block power
  iteration, much slower on the flat spectra of real key Gram matrices);
- ``"lobpcg"``: ``torch.lobpcg`` one matrix at a time (it does not batch; the only per-item loop
  here), needs N ≥ 3m;
- ``"auto"``: ``"full"`` up to :data:`AUTO_CROSSOVER_N` tokens, ``"subspace"`` above, with a full
  eigh for any item the iteration did not converge on (a warning names how many).

The iterative methods find the eigenvalues of largest magnitude: for the PSD matrices this module
is meant for (K̃, K_φ) those are the largest ones. For an indefinite matrix use ``"full"``.
"""

from __future__ import annotations

import math
import warnings

import torch

from . import linalg_route as la
from ._validation import check_int
from .errors import check_finite
from .eigen import eigh, fix_signs, sorted_eigh

METHODS = ("auto", "full", "subspace", "lobpcg")

#: ``"auto"`` uses the full eigh up to this N and subspace iteration above it: the crossover
#: measured by ``python -m bench.run --topk-crossover`` (float64, m = 64, one thread; the timings,
#: the agreement with the full eigh and the N from which the iteration wins are in
#: ``bench/topk_crossover.json``).
AUTO_CROSSOVER_N = 1024

DEFAULT_TOL = 1e-12
DEFAULT_MAX_ITER = 100
DEFAULT_DEGREE = 8


def default_oversample(m: int) -> int:
    """Extra block vectors of the subspace iteration: max(8, m // 2)."""
    return max(8, m // 2)


class TopEighNotConverged(RuntimeError):
    """The iteration stopped at ``max_iter`` before every item converged.

    ``items`` are the flat batch indices that did not converge, ``residuals`` their largest
    relative residual ‖K a − μ a‖/|μ_1| over the m leading pairs.
    """

    def __init__(self, items: list[int], residuals: list[float], max_iter: int, tol: float):
        self.items, self.residuals = items, residuals
        worst = max(residuals) if residuals else float("nan")
        super().__init__(
            f"top_eigh: {len(items)} matrices (flat batch indices {items[:10]}"
            f"{' ...' if len(items) > 10 else ''}) did not converge in max_iter={max_iter} "
            f"iterations (largest relative residual {worst:.2e} > tol={tol:g}); raise max_iter, "
            "loosen tol, or use method='full'")


def _validate(matrix: torch.Tensor, m: int, method: str, tol: float, max_iter: int,
              oversample: int, degree: int) -> None:
    square = isinstance(matrix, torch.Tensor) and matrix.ndim >= 2
    if not square or matrix.shape[-1] != matrix.shape[-2]:
        shape = tuple(matrix.shape) if isinstance(matrix, torch.Tensor) else type(matrix).__name__
        raise ValueError(f"matrix must be a tensor of square matrices [..., N, N], got {shape}")
    if not matrix.is_floating_point():
        raise ValueError(f"matrix must be floating point, got {matrix.dtype}")
    n = matrix.shape[-1]
    check_int(m, "m", min_val=1, max_val=n, expected=f"an int with 1 <= m <= N = {n}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    if not (isinstance(tol, (int, float)) and tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol must be a positive finite number, got {tol!r}")
    check_int(max_iter, "max_iter", min_val=1)
    check_int(oversample, "oversample", min_val=0, expected="a non-negative int")
    check_int(degree, "degree", min_val=1)
    check_finite(matrix, "matrix")


def _ritz(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rayleigh–Ritz on the block x (orthonormal columns) with y = K x: (θ descending, X W, Y W)."""
    t = x.transpose(-1, -2) @ y  # the projected matrix XᵀKX
    theta, w = eigh(0.5 * (t + t.transpose(-1, -2)))
    theta, w = theta.flip(-1), w.flip(-1)
    return theta, x @ w, y @ w


def chebyshev_filter(mats: torch.Tensor, x: torch.Tensor, lower: torch.Tensor,
                     upper: torch.Tensor, top: torch.Tensor, degree: int) -> torch.Tensor:
    """p(K) X with p the degree-q Chebyshev polynomial of [lower, upper], scaled so p(top) = 1.

    Eigen-directions with eigenvalues in [lower, upper] are damped (|p| ≤ 1/T_q(...)), those
    above ``upper`` amplified the more the further they lie: q products with K per call, the
    three-term recurrence in its scaled form (entries stay O(1) whatever q). ``lower``,
    ``upper``, ``top`` have shape [B, 1, 1] with lower < upper < top; degree 1 is K X up to a
    shift and scale (a plain power step).
    """
    half_width = (upper - lower) / 2
    centre = (upper + lower) / 2
    sigma = half_width / (top - centre)
    sigma_first = sigma
    prev, cur = x, (mats @ x - centre * x) * (sigma / half_width)
    for _ in range(degree - 1):
        sigma_next = 1.0 / (2.0 / sigma_first - sigma)
        nxt = (2.0 * (mats @ cur - centre * cur) * (sigma_next / half_width)
               - (sigma * sigma_next) * prev)
        prev, cur, sigma = cur, nxt, sigma_next
    return cur


def subspace_iteration(matrix: torch.Tensor, m: int, tol: float = DEFAULT_TOL,
                       max_iter: int = DEFAULT_MAX_ITER, oversample: int | None = None,
                       degree: int = DEFAULT_DEGREE, seed: int = 0
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chebyshev-filtered block subspace iteration with Rayleigh–Ritz, batched.

    Each outer iteration filters the current Ritz block X (k = m + oversample columns) with
    the Chebyshev polynomial that damps [0, θ_k] and equals 1 at θ_1 (θ the current Ritz
    values, descending; 0 is the lower end of a PSD spectrum), orthonormalises it (QR), and
    takes the Ritz pairs of the new block. ``degree`` 1 is plain block power iteration.

    Parameters
    ----------
    matrix : Tensor [B, N, N]
        Symmetric PSD matrices (a flat batch).
    m : int
        Number of eigenpairs.
    tol : float
        An item has converged when ‖K a_i − θ_i a_i‖ ≤ tol·|θ_1| for its m leading Ritz pairs.
    max_iter : int
        Most outer iterations per item (each costs ``degree`` + 1 products K·X).
    oversample : int, optional
        Extra block columns; default max(8, m // 2). Pair i converges like
        (μ_{k+1}/μ_i)^{iterations} for plain iteration, much faster with the filter.
    degree : int
        Chebyshev degree per outer iteration.
    seed : int
        Seed of the Gaussian start block (CPU generator: the same start on every device).

    Returns
    -------
    (θ [B, m] descending, A [B, N, m] unit columns (signs not fixed), converged bool [B],
    relative residual [B] (largest over the m leading pairs)).
    """
    b, n, _ = matrix.shape
    k = min(n, m + (default_oversample(m) if oversample is None else oversample))
    dtype, device = matrix.dtype, matrix.device
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    start = torch.randn(b, n, k, generator=gen, dtype=torch.float64).to(device, dtype)
    theta_out = torch.zeros(b, m, dtype=dtype, device=device)
    vec_out = torch.zeros(b, n, m, dtype=dtype, device=device)
    residual_out = torch.full((b,), math.inf, dtype=dtype, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    tiny = torch.finfo(dtype).tiny
    # `mats` holds the matrices of the items `rows`; converged items ride along (their results
    # frozen) until they are half of the batch, then `mats` is compacted: at most twice the
    # necessary products, and no copy of the matrices per iteration.
    rows, mats = torch.arange(b, device=device), matrix
    x = la.qr(start).Q
    for it in range(max_iter + 1):
        theta, xr, yr = _ritz(x, mats @ x)
        res = torch.linalg.vector_norm(yr[..., :m] - xr[..., :m] * theta[:, None, :m], dim=-2)
        scale = theta[:, 0].abs().clamp_min(tiny)
        rel = res.amax(-1) / scale
        live = ~done[rows]
        idx = rows[live]
        theta_out[idx], vec_out[idx] = theta[live, :m], xr[live, :, :m]
        residual_out[idx] = rel[live]
        done[idx[rel[live] <= tol]] = True
        live = ~done[rows]
        n_live = int(live.sum())
        if n_live == 0 or it == max_iter:
            break
        if n_live <= rows.numel() // 2:
            rows, theta, xr, scale = rows[live], theta[live], xr[live], scale[live]
            mats = matrix[rows]
        top = theta[:, :1, None]
        upper = theta[:, -1:, None].clamp_min(0.0)
        lower = torch.zeros_like(upper)
        # keep lower < upper < top: a flat block (θ_k ≈ θ_1) leaves no interval to damp, and a
        # block reaching the null space (θ_k ≈ 0) must not shrink the interval below round-off
        upper = torch.minimum(upper, top - 1e-3 * scale[:, None, None])
        upper = torch.maximum(upper, lower + n * torch.finfo(dtype).eps * scale[:, None, None])
        x = la.qr(chebyshev_filter(mats, xr, lower, upper, top, degree)).Q
    return theta_out, vec_out, done, residual_out


def _lobpcg(matrix: torch.Tensor, m: int, tol: float, max_iter: int, seed: int):
    b, n, _ = matrix.shape
    if n < 3 * m:
        raise ValueError(f"method='lobpcg' needs N >= 3m (torch.lobpcg); got N={n}, m={m}: use "
                         "'subspace' or 'full'")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    mus, vecs = [], []
    for i in range(b):  # torch.lobpcg takes one matrix at a time
        x0 = torch.randn(n, m, generator=gen, dtype=torch.float64).to(matrix.device, matrix.dtype)
        mu, vec = torch.lobpcg(matrix[i], k=m, X=x0, niter=max_iter, tol=tol, largest=True)
        order = mu.argsort(descending=True)
        mus.append(mu[order])
        vecs.append(vec[:, order])
    return torch.stack(mus), torch.stack(vecs)


def top_eigh(matrix: torch.Tensor, m: int, method: str = "auto", tol: float = DEFAULT_TOL,
             max_iter: int = DEFAULT_MAX_ITER, oversample: int | None = None,
             degree: int = DEFAULT_DEGREE, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The m leading eigenpairs of symmetric PSD matrices, batched over leading dimensions.

    Parameters
    ----------
    matrix : Tensor [..., N, N]
        Symmetric (it is symmetrised as ½(M + Mᵀ)) and, for the iterative methods, positive
        semi-definite up to round-off (e.g. the centred Gram matrix K̃ of method §1); finite.
    m : int
        Number of eigenpairs, 1 ≤ m ≤ N.
    method : {"auto", "full", "subspace", "lobpcg"}
        See the module docstring. ``"auto"``: ``"full"`` when N ≤ :data:`AUTO_CROSSOVER_N` or
        the block m + oversample reaches N, else ``"subspace"`` with a full eigh for any item
        that did not converge (with a RuntimeWarning).
    tol : float
        Iterative methods: stop when every leading residual ‖K a_i − μ_i a_i‖ ≤ tol·|μ_1|. The
        eigenvalue error is then about (tol·μ_1)²/gap_i and the angle of a_i about tol·μ_1/gap_i
        (gap_i: distance of μ_i to the rest of the spectrum), as for a backward-stable full eigh
        when tol ≈ ε.
    max_iter : int
        Most outer iterations per matrix (``"lobpcg"``: its ``niter``).
    oversample : int, optional
        Extra block vectors of the subspace iteration; default max(8, m // 2).
    degree : int
        Chebyshev degree per outer iteration of ``"subspace"`` (1: plain block power iteration).
    seed : int
        Seed of the random start block (results agree across seeds to the tolerance).

    Returns
    -------
    mu : Tensor [..., m]
        Eigenvalues, descending.
    axes : Tensor [..., N, m]
        Unit eigenvectors, signs fixed by :func:`checks.gram.fix_signs` (method §1): they equal
        the first m columns of ``checks.gram.sorted_eigh`` wherever the eigenvalues are distinct.

    Raises
    ------
    ValueError
        Malformed input: not square, not floating point, m out of range, unknown method, a bad
        tol/max_iter/oversample/degree, or N < 3m for ``"lobpcg"``.
    checks.errors.NonFiniteError
        The matrix holds NaN or Inf.
    TopEighNotConverged
        ``"subspace"`` did not converge on some item within ``max_iter``.
    """
    oversample = default_oversample(m) if oversample is None else oversample
    _validate(matrix, m, method, tol, max_iter, oversample, degree)
    batch, n = matrix.shape[:-2], matrix.shape[-1]
    sym = 0.5 * (matrix + matrix.transpose(-1, -2))
    if method == "full" or (method == "auto" and (n <= AUTO_CROSSOVER_N or m + oversample >= n)):
        return sorted_eigh(sym, m)
    flat = sym.reshape(-1, n, n)
    if method == "lobpcg":
        mu, vecs = _lobpcg(flat, m, tol, max_iter, seed)
    else:
        mu, vecs, done, residual = subspace_iteration(flat, m, tol, max_iter, oversample, degree,
                                                      seed)
        if not bool(done.all()):
            bad = torch.nonzero(~done).flatten()
            if method == "subspace":
                raise TopEighNotConverged(bad.tolist(), residual[bad].tolist(), max_iter, tol)
            warnings.warn(f"top_eigh: subspace iteration did not converge on {bad.numel()} of "
                          f"{flat.shape[0]} matrices within max_iter={max_iter}; those use the "
                          "full eigh", RuntimeWarning, stacklevel=2)
            mu[bad], vecs[bad] = sorted_eigh(flat[bad], m)
    return mu.reshape(*batch, m), fix_signs(vecs).reshape(*batch, n, m)
