"""Claim E's controls (method §4): P2's perturbed basis QR(A + 0.1·Z), and the round-off twin of
K̃ with its eigen control (method §13.2). Pure batched tensor math; :mod:`checks.gamma` uses both."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from . import linalg_route as la
from .gamma_precision import canonical_axes, round_off_gram_pattern
from .round_off import ROUND_OFF
from .gram import DEFAULT_DTYPE, KeyGram, fix_signs
from .topk import top_eigh


def perturbed_axes(axes: torch.Tensor, seed: int | Sequence[int] = 0,
                   noise: float = 0.1) -> torch.Tensor:
    """P2's control basis: Q of QR(A + noise·Z), Z ~ N(0, 1) from a generator seeded with ``seed`` (method §4).

    The columns of Q are orthonormal but not eigenvectors of K̃, and (as in P2) not re-centred.
    Signs are fixed as in method §1 (γ does not depend on them). With one int ``seed``, one draw of
    shape ``axes.shape`` covers the whole batch, so an item's noise depends on the batch layout;
    with one seed per item (a sequence over the batch dimensions, flattened in order), each item's
    noise depends on its own seed alone, whatever the batching or device (the claim runs do this).

    Parameters
    ----------
    axes : Tensor [..., N, m]
        A, the true eigenvectors (``KeyGram.axes()``), m ≤ N.
    seed : int or sequence of int, default 0
        One seed for the whole batch, or one per item of ``axes.shape[:-2]``.
    noise : float, default 0.1
        P2's perturbation size.

    Returns
    -------
    Tensor [..., N, m], ``axes``' dtype and device.

    Examples
    --------
    >>> a = torch.linalg.qr(torch.randn(6, 3, generator=torch.Generator().manual_seed(0),
    ...                                  dtype=torch.float64))[0]
    >>> p = perturbed_axes(a, seed=1)
    >>> torch.allclose(p.T @ p, torch.eye(3, dtype=torch.float64), atol=1e-12), torch.allclose(p, a)
    (True, False)
    """
    if axes.ndim < 2 or axes.shape[-1] > axes.shape[-2]:
        raise ValueError(f"axes must be [..., N, m] with m ≤ N, got {tuple(axes.shape)}")
    if isinstance(seed, int):
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        z = torch.randn(axes.shape, generator=gen, dtype=DEFAULT_DTYPE)
    else:
        seeds = [int(x) for x in seed]
        if len(seeds) != math.prod(axes.shape[:-2]):
            raise ValueError(f"{len(seeds)} seeds for {math.prod(axes.shape[:-2])} items of axes "
                             f"{tuple(axes.shape)}: give one seed per item, or one int")
        z = _item_noise(tuple(seeds), tuple(axes.shape[-2:])).reshape(axes.shape)
    z = z.to(axes.device, axes.dtype)
    q, _ = la.qr(axes + noise * z)
    return fix_signs(q)


@functools.lru_cache(maxsize=2)
def _item_noise(seeds: tuple[int, ...], shape: tuple[int, int]) -> torch.Tensor:
    """Z [items, N, m] of :func:`perturbed_axes`, one draw per seed; kept for the next call,
    the round-off twin's control of the same batch (method §13.2), which draws the same Z
    (never written to: callers add it to their axes)."""
    return torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(x),
                                    dtype=DEFAULT_DTYPE) for x in seeds])


def eigen_control_twin(kg: KeyGram, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The round-off twin of K̃ and of its top-m eigen control (method §13.2): K̃ moved by
    :data:`checks.round_off.ROUND_OFF` of its largest entry along a fixed symmetric pattern,
    and that matrix's own top-m eigenvectors (:func:`checks.topk.top_eigh`, made canonical in
    degenerate eigenspaces as the control is)."""
    unit = kg._unit_centred
    e_k = round_off_gram_pattern(unit.shape[-1]).to(unit.device, unit.dtype)
    twin_unit = unit + ROUND_OFF * unit.abs().amax(dim=(-2, -1), keepdim=True) * e_k
    mu, axes = top_eigh(twin_unit, m)
    peak = kg._peak.unsqueeze(-1)
    return twin_unit * peak.unsqueeze(-1), canonical_axes(mu * peak, axes)
