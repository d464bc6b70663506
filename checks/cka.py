"""This module owns centred kernel alignment between x (the learned V) and y (V̂ or a null),
``[..., N, d]`` → ``[...]`` (method §2, P2): linear CKA, and kernel CKA with RBF Gram matrices of
median bandwidth, with the squared distances and the bandwidth they use. Scaling and zeros:
:mod:`checks.similarity_scaling`."""

from __future__ import annotations

import numpy as np
import torch

from .gram import center_gram
from .similarity_scaling import centre_tokens, check_pair, peak_one, tiny, unit_frobenius


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear CKA with biased HSIC, computed in feature space, shape [...] (method §2, P2).

    With column-centred Xc, Yc: ‖YcᵀXc‖²_F / (‖XcᵀXc‖_F ‖YcᵀYc‖_F), which equals the N×N form
    ⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F) with K_X = XXᵀ. A zero-variance operand gives 0.

    A rotated copy has linear CKA 1:

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(10, 4, generator=g, dtype=torch.float64)
    >>> rotation, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    >>> round(float(linear_cka(x, x @ rotation)), 12)
    1.0
    """
    check_pair(x, y)
    return linear_cka_pair(linear_cka_operand(peak_one(x)), linear_cka_operand(peak_one(y)))


def linear_cka_operand(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Xc, ‖XcᵀXc‖_F): xs (peak 1) column-centred (H X) at unit Frobenius norm, and its self-term."""
    xc = unit_frobenius(centre_tokens(xs))  # column-centred: H X
    return xc, torch.linalg.matrix_norm(xc.transpose(-1, -2) @ xc)  # ‖XcᵀXc‖_F


def linear_cka_pair(px: tuple[torch.Tensor, torch.Tensor],
                     py: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """‖YcᵀXc‖²_F / (‖XcᵀXc‖_F ‖YcᵀYc‖_F) from two :func:`linear_cka_operand` results."""
    (xc, self_x), (yc, self_y) = px, py
    cross = torch.linalg.matrix_norm(yc.transpose(-1, -2) @ xc) ** 2  # method §2: ‖YcᵀXc‖²_F
    return cross / (self_x * self_y).clamp_min(tiny(xc))


def squared_distances(x: torch.Tensor) -> torch.Tensor:
    """D[..., i, j] = ‖x_i − x_j‖², built as ‖x_i‖² + ‖x_j‖² − 2x_iᵀx_j (method §2, kernel CKA).

    Clamped at 0 and with an exactly zero diagonal (``torch.cdist`` leaves round-off there).

    >>> x = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    >>> squared_distances(x).tolist()
    [[0.0, 25.0], [25.0, 0.0]]
    """
    sq = (x * x).sum(-1)
    d2 = (x @ x.transpose(-1, -2)).mul_(-2.0)  # method §2: ‖x_i‖² + ‖x_j‖² − 2x_iᵀx_j, in place
    d2.add_(sq.unsqueeze(-1)).add_(sq.unsqueeze(-2)).clamp_min_(0.0)
    d2.diagonal(dim1=-2, dim2=-1).zero_()
    return d2


def median_bandwidth(x: torch.Tensor) -> torch.Tensor:
    """σ² = median of ‖x_i − x_j‖² over pairs i < j, the lower middle value (as torch.median), [...].

    Method §2, kernel CKA. Needs N ≥ 2 tokens.

    >>> x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)  # pair distances² 1, 4, 9
    >>> float(median_bandwidth(x))
    4.0
    """
    return _median_pair_distance(squared_distances(x))


def _median_pair_distance(d2: torch.Tensor) -> torch.Tensor:
    """The lower median of the strictly upper triangle of squared distances [..., N, N], [...]."""
    n = d2.shape[-1]
    if n < 2:
        raise ValueError(f"kernel CKA needs at least 2 tokens, got N={n}")
    iu = torch.triu_indices(n, n, offset=1, device=d2.device)
    pairs = d2[..., iu[0], iu[1]]
    if pairs.device.type != "cpu" or pairs.requires_grad or not bool(torch.isfinite(pairs).all()):
        return pairs.median(dim=-1).values  # method §2: lower of the two middle values
    # the same order statistic from NumPy's selection along contiguous rows: the same bits as
    # torch.median (an element of the input, whichever algorithm picks it), measured 1.3x
    # faster on the CPU for the triangles of [3, 10, 3, 197, 197] (26 against 35 ms); a GPU
    # tensor, one that carries a gradient and a non-finite one keep torch's path
    k = (pairs.shape[-1] - 1) // 2
    return torch.from_numpy(np.partition(pairs.numpy(), k, axis=-1)[..., k])


def rbf_gram(x: torch.Tensor) -> torch.Tensor:
    """K[..., i, j] = exp(−‖x_i − x_j‖²/(2σ²)), σ² from :func:`median_bandwidth` (method §2).

    σ² is clamped at finfo.tiny: when more than half the pairs coincide (σ² = 0) coinciding tokens
    get 1 and all others 0, instead of NaN.

    >>> x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    >>> torch.diagonal(rbf_gram(x)).tolist()
    [1.0, 1.0, 1.0]
    >>> round(float(rbf_gram(x)[0, 2]), 12) == round(float(torch.exp(torch.tensor(-9 / 8, dtype=torch.float64))), 12)
    True
    """
    d2 = squared_distances(x)
    sigma2 = _median_pair_distance(d2).clamp_min(tiny(x))
    return d2.div_(-2.0 * sigma2[..., None, None]).exp_()  # method §2: exp(−‖x_i − x_j‖²/(2σ²))


def gram_cka_pair(cx: torch.Tensor, cy: torch.Tensor) -> torch.Tensor:
    """⟨HK_XH, HK_YH⟩_F / (‖HK_XH‖_F ‖HK_YH‖_F) from centred Grams at unit Frobenius norm (method §2)."""
    return (cx * cy).sum(dim=(-2, -1))


def kernel_cka_operand(xs: torch.Tensor) -> torch.Tensor:
    """H K H / ‖H K H‖_F for the RBF Gram K of xs (peak 1; median bandwidth), [..., N, N]."""
    return unit_frobenius(center_gram(rbf_gram(xs)))


def kernel_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CKA with RBF Gram matrices, σ² chosen separately for x and y, shape [...] (method §2, P2).

    Invariant to orthogonal maps and isotropic scaling of either operand.

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(10, 4, generator=g, dtype=torch.float64)
    >>> rotation, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    >>> round(float(kernel_cka(x, 3 * x @ rotation)), 12)
    1.0
    """
    check_pair(x, y)
    return gram_cka_pair(kernel_cka_operand(peak_one(x)), kernel_cka_operand(peak_one(y)))
