"""Helpers shared by the project's own tests: the float64 dtype, seeded generators and random
tensors, and the two relative-error comparisons the known-answer tests use.

Import them as ``from tests._helpers import F64, randn, rel_err`` (the checkout is on ``sys.path``
when pytest runs from it). Keeping them here means one definition of "a seeded float64 normal
tensor" and of "relative error", instead of a copy per test file.
"""

from __future__ import annotations

import torch

__all__ = ["EPS32", "F64", "close", "gen", "randn", "rel_err"]

#: The dtype of every reference computation in the tests.
F64 = torch.float64
#: float32's machine epsilon, the unit of float32 tolerances.
EPS32 = torch.finfo(torch.float32).eps


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: the same draws on every run and platform."""
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0, scale: float = 1.0, dtype: torch.dtype = F64) -> torch.Tensor:
    """``scale`` × standard normal draws of ``shape`` from :func:`gen` (``seed``), float64 by default."""
    return scale * torch.randn(*shape, generator=gen(seed), dtype=dtype)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|: the largest error relative to the reference ``b``'s largest entry."""
    return float((a - b).abs().max() / b.abs().max())


def close(a: float, b: float, rtol: float, floor: float = 1e-3) -> bool:
    """|a − b| ≤ rtol · max(|a|, |b|, floor): relative agreement, absolute below ``floor``."""
    return abs(a - b) <= rtol * max(abs(a), abs(b), floor)
