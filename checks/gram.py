"""The normalised, centred key Gram matrix of one attention head and its KPCA value matrix.

Every function is batched over any leading dimensions: keys of shape ``[..., N, d]`` (for example
``[samples, heads, N, d]``) give Gram matrices ``[..., N, N]``. Formulas and names follow
method §1 (``docs/method.md``); nothing here loops over heads or samples.
"""

from __future__ import annotations

import functools
import math

import torch

from . import linalg_route as la
from ._validation import check_int, check_ndim
from .eigen import eigvalsh, fix_signs, sorted_eigh, sorted_eigvalsh  # noqa: F401  (part of this API)
from .errors import check_finite
from .similarity_scaling import centre_tokens
from .topk import top_eigh

DEFAULT_DTYPE = torch.float64


def resolve_scale(d: int, scale: float | None) -> float:
    """The softmax scale s: the module's own scale if given, else 1/√d (method §1).

    >>> resolve_scale(64, None), resolve_scale(64, 0.5)
    (0.125, 0.5)
    """
    if scale is None:
        return 1.0 / math.sqrt(d)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return float(scale)


def standardize_tokens(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Per-token standardisation over the feature axis: (x − mean)/(std + eps), unbiased std (method §1).

    >>> x = standardize_tokens(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64))
    >>> [round(v, 6) for v in x[0].tolist()]
    [-1.0, 0.0, 1.0]
    """
    mean = x.mean(dim=-1, keepdim=True)
    std = x.std(dim=-1, keepdim=True, unbiased=True)
    return (x - mean) / (std + eps)


def score_matrix(k: torch.Tensor, scale: float) -> torch.Tensor:
    """S = s·K Kᵀ, shape [..., N, N] (method §1).

    >>> score_matrix(torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64), 0.5).tolist()
    [[0.5, 0.5], [0.5, 1.0]]
    """
    return scale * (k @ k.transpose(-1, -2))


def log_normaliser(scores: torch.Tensor) -> torch.Tensor:
    """log g_j = logsumexp_m S_jm, shape [..., N] (method §1).

    >>> round(float(log_normaliser(torch.zeros(1, 4, dtype=torch.float64))[0]), 12) == round(math.log(4), 12)
    True
    """
    return torch.logsumexp(scores, dim=-1)


def log_normalized_gram(scores: torch.Tensor, log_g: torch.Tensor) -> torch.Tensor:
    """log K_φ[i, j] = S_ij − log g_i − log g_j, shape [..., N, N] (method §1)."""
    return (scores - log_g.unsqueeze(-1)).sub_(log_g.unsqueeze(-2))


def normalized_gram(scores: torch.Tensor, log_g: torch.Tensor) -> torch.Tensor:
    """K_φ[i, j] = exp(S_ij − log g_i − log g_j), computed in log space; entries in (0, 1] (method §1).

    Zero scores give K_φ = 1/N² everywhere; huge scores give no overflow (entries ≤ 1):

    >>> s = torch.zeros(2, 2, dtype=torch.float64)
    >>> normalized_gram(s, log_normaliser(s)).tolist()
    [[0.25, 0.25], [0.25, 0.25]]
    >>> big = torch.tensor([[1000.0, 0.0], [0.0, 1000.0]], dtype=torch.float64)
    >>> float(normalized_gram(big, log_normaliser(big)).max()) <= 1.0
    True
    """
    return log_normalized_gram(scores, log_g).exp_()


def center_gram(gram: torch.Tensor) -> torch.Tensor:
    """K̃ = H K H with H = I − 11ᵀ/N, by subtracting row and column means (method §1).

    >>> center_gram(torch.full((3, 3), 0.5, dtype=torch.float64)).abs().max().item()
    0.0
    """
    row = gram.mean(dim=-1, keepdim=True)
    col = gram.mean(dim=-2, keepdim=True)
    out = gram - row  # one N×N temporary, then in place
    return out.sub_(col).add_(row.mean(dim=-2, keepdim=True))


def kpca_values(axes: torch.Tensor, log_g: torch.Tensor) -> torch.Tensor:
    """V̂ = G (I − 11ᵀ/N) A with G = diag(1/g_j): v̂_j = (a_j − mean_m a_m)/g_j (P1 Eq. 6; method §1).

    ``axes`` is A, shape [..., N, m]; ``log_g`` is log g, shape [..., N].

    >>> a = torch.tensor([[1.0], [0.0]], dtype=torch.float64)  # one axis over N = 2 tokens
    >>> log_g = torch.log(torch.tensor([2.0, 4.0], dtype=torch.float64))
    >>> kpca_values(a, log_g).tolist()  # (a_j − mean a)/g_j
    [[0.25], [-0.125]]
    """
    return centre_tokens(axes) * torch.exp(-log_g).unsqueeze(-1)


def psd_spectral_norm(gram: torch.Tensor, max_steps: int = 96, rtol: float = 1e-13) -> torch.Tensor:
    """‖K‖₂ of symmetric PSD matrices [..., N, N]: the top Ritz value of a Krylov subspace.

    Lanczos with full re-orthogonalisation from the all-ones vector (for K_φ, with positive
    entries, the Perron vector is positive, so the start is never orthogonal to it). Every 8
    products K q the largest eigenvalue of QᵀKQ is taken; it stops once no item's value moved by
    more than ``rtol`` relative since the last look, or after min(max_steps, N) products. A lower
    bound on ‖K‖₂ that converges far faster than power iteration when λ₂/λ₁ is close to 1 (0.96
    for some all-MiniLM-L6-v2 heads, where 50 power steps leave 3e-6 relative; 16–24 Krylov
    steps agree with ``eigvalsh`` to round-off). Returns [...].
    """
    n = gram.shape[-1]
    m = min(max_steps, n)
    tiny = torch.finfo(gram.dtype).tiny
    basis = torch.empty(*gram.shape[:-1], m, dtype=gram.dtype, device=gram.device)
    images = torch.empty_like(basis)
    basis[..., 0] = 1.0 / math.sqrt(n)
    top = None
    for j in range(m):
        w = gram @ basis[..., j:j + 1]
        images[..., j:j + 1] = w
        if (j + 1) % 8 == 0 or j + 1 == m:
            projected = basis[..., : j + 1].transpose(-1, -2) @ images[..., : j + 1]  # QᵀKQ
            ritz = eigvalsh(0.5 * (projected + projected.transpose(-1, -2)))[..., -1]
            if j + 1 == m or (top is not None
                              and bool(((ritz - top).abs() <= rtol * ritz.abs()).all())):
                return ritz
            top = ritz
        done = basis[..., : j + 1]
        scale = torch.linalg.vector_norm(w, dim=-2, keepdim=True)
        for _ in range(2):  # classical Gram–Schmidt, twice, against every earlier vector
            w = w - done @ (done.transpose(-1, -2) @ w)
        norm = torch.linalg.vector_norm(w, dim=-2, keepdim=True)
        # An exhausted Krylov space (what is left is round-off): continue with a zero vector,
        # which adds a zero row and column to QᵀKQ and changes no Ritz value.
        alive = norm > 1e3 * torch.finfo(gram.dtype).eps * scale
        basis[..., j + 1:j + 2] = torch.where(alive, w / norm.clamp_min(tiny), 0.0)
    raise AssertionError("unreachable: the loop returns at its last step")


def undetermined_threshold(gram: torch.Tensor) -> torch.Tensor:
    """N·ε·‖K_φ‖₂, below which an eigenvalue of K̃ is round-off (method §2, "Undetermined heads")."""
    n = gram.shape[-1]
    eps = torch.finfo(gram.dtype).eps
    return n * eps * psd_spectral_norm(gram)


class KeyGram:
    """Everything claim V, J and E need from one batch of keys, computed once.

    Attributes (shapes for keys [..., N, d]): ``scale`` (float), ``scores`` S [..., N, N],
    ``log_g`` [..., N], ``gram`` K_φ [..., N, N], ``centred`` K̃ [..., N, N],
    ``eigenvalues`` μ [..., M] (descending), ``eigenvectors`` A [..., N, M] (sign-fixed),
    ``threshold`` N·ε·‖K_φ‖₂ [...], ``undetermined`` (μ_d ≤ threshold) bool [...].

    M = N by default (the full spectrum, which claim E needs). ``top=m`` keeps only the m ≤ N
    leading eigenpairs (M = min(m, N)), found by :func:`checks.topk.top_eigh` with
    ``eigen_method`` ("auto": the full eigh up to its measured crossover size, subspace iteration
    above): claim V needs only the top d, and for long sequences that avoids the O(N³) full
    decomposition. ``eigenvectors=False`` computes eigenvalues only (``eigvalsh``; ``eigenvectors``
    is then None). ``threshold`` and ``undetermined`` are computed on first access.
    """

    def __init__(self, k: torch.Tensor, scale: float | None = None, standardize: bool = False,
                 dtype: torch.dtype = DEFAULT_DTYPE, top: int | None = None,
                 eigen_method: str = "auto", eigenvectors: bool = True):
        check_ndim(k, "keys")
        n, d = k.shape[-2], k.shape[-1]
        self.n, self.d = n, d
        self.scale = resolve_scale(d, scale)
        k = k.to(dtype)
        check_finite(k, "keys")
        if standardize:
            k = standardize_tokens(k)
        self.keys = k
        self.scores = score_matrix(k, self.scale)
        self.log_g = log_normaliser(self.scores)
        # The spectrum is taken of K_φ / max K_φ (exact in log space) and scaled back: keys with
        # s·‖k‖² beyond the dtype's exponent range leave K_φ subnormal or zero, where eigh sees
        # only round-off. Eigenvectors and the undetermined test are scale-free. K_φ and K̃ are
        # derived from the unit-peak matrix, so each N×N matrix is built and centred once.
        log_unit = log_normalized_gram(self.scores, self.log_g)
        log_peak = log_unit.amax(dim=(-2, -1))
        unit = log_unit.sub_(log_peak[..., None, None]).exp_()  # K_φ / max K_φ: max entry 1
        unit_centred = center_gram(unit)
        check_finite(unit_centred, "centred Gram matrix")
        peak = torch.exp(log_peak)
        self._unit, self._unit_centred, self._peak = unit, unit_centred, peak
        check_int(top, "top", min_val=1, allow_none=True,
                  expected="a positive int (eigenpairs to keep)")
        if not eigenvectors:  # eigenvalues only (claim E's routes): no eigenvector work at all
            mu = sorted_eigvalsh(unit_centred, None if top is None else min(top, n))
            self.eigenvectors = None
        elif top is None:
            mu, self.eigenvectors = sorted_eigh(unit_centred)
        else:
            mu, self.eigenvectors = top_eigh(unit_centred, min(top, n), method=eigen_method)
        self._unit_mu = mu
        self.eigenvalues = mu * peak.unsqueeze(-1)

    @functools.cached_property
    def _unit_threshold(self) -> torch.Tensor:
        """N·ε·‖K_φ/max K_φ‖₂ (Lanczos), computed on first use: a caller that needs only the
        spectrum (claim E's routes) never pays for it."""
        return undetermined_threshold(self._unit)

    @property
    def threshold(self) -> torch.Tensor:
        """N·ε·‖K_φ‖₂ [...] (method §2, "Undetermined heads")."""
        return self._unit_threshold * self._peak

    @functools.cached_property
    def undetermined(self) -> torch.Tensor:
        """μ_d ≤ N·ε·‖K_φ‖₂, bool [...]; always True when N < d (V̂ cannot have d columns).

        The Lanczos estimate of ‖K_φ‖₂ is computed only for the items whose answer needs it:
        K_φ has positive entries, so ‖K_φ‖₂ is at most its largest row sum, and μ_d above N·ε
        times that is determined whatever the estimate (a lower bound of ‖K_φ‖₂) would be."""
        if self.d > self.n:
            return torch.ones(self._peak.shape, dtype=torch.bool, device=self._peak.device)
        mu = self._unit_mu[..., self.d - 1]
        if "_unit_threshold" in self.__dict__:  # already estimated (``threshold`` was read)
            return mu <= self._unit_threshold
        unit = self._unit
        bound = self.n * torch.finfo(unit.dtype).eps * unit.sum(-1).amax(-1)
        out = torch.zeros(mu.shape, dtype=torch.bool, device=mu.device)
        need = mu <= bound
        if bool(need.any()):
            out[need] = mu[need] <= undetermined_threshold(unit[need])
        return out

    @property
    def gram(self) -> torch.Tensor:
        """K_φ [..., N, N] (built on first use from the unit-peak matrix)."""
        return self._unit * self._peak[..., None, None]

    @property
    def centred(self) -> torch.Tensor:
        """K̃ = H K_φ H [..., N, N]."""
        return self._unit_centred * self._peak[..., None, None]

    def axes(self, m: int | None = None) -> torch.Tensor:
        """A = [a_1 … a_m], the top-m unit eigenvectors (m = d by default), shape [..., N, m]."""
        m = min(self.d if m is None else m, self.n)
        if self.eigenvectors is None:
            raise ValueError("this KeyGram was built with eigenvectors=False (eigenvalues only)")
        available = self.eigenvectors.shape[-1]
        if m > available:
            raise ValueError(f"only the top {available} eigenvectors were computed (top=...), "
                             f"not {m}")
        return self.eigenvectors[..., :m]

    def kpca_values(self, convention: str = "p2") -> torch.Tensor:
        """V̂ [..., N, min(d, N)]. ``"p2"``: unit a_m (the thresholds' convention); ``"kpca"``: a_m/√μ_m."""
        axes = self.axes()
        if convention == "kpca":
            mu = self.eigenvalues[..., : axes.shape[-1]]
            axes = axes / mu.clamp_min(torch.finfo(mu.dtype).tiny).sqrt().unsqueeze(-2)
        elif convention != "p2":
            raise ValueError(f"unknown axis convention {convention!r}; use 'p2' or 'kpca'")
        return kpca_values(axes, self.log_g)


def orthonormalize(x: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis [..., N, m] of the column space of x [..., N, m] (QR), sign-fixed.

    >>> q = orthonormalize(torch.tensor([[3.0, 1.0], [4.0, 1.0], [0.0, 2.0]], dtype=torch.float64))
    >>> torch.allclose(q.T @ q, torch.eye(2, dtype=torch.float64), atol=1e-12)
    True
    """
    return fix_signs(la.qr(x).Q)
