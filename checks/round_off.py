"""What float64 determines of a per-sample number (method §13.2, "Round-off twins"): compute it
again from inputs moved by round-off alone, its *twin*, and see how far it moves. Where few tokens
carry g or the spectrum has a long tail at round-off, some numbers (cosines with trailing
eigenvectors, ρ of an ill-conditioned span) are decided by round-off, and two CPUs, two BLAS
builds or two GPUs give values about as far apart as a number and its twin. The claims build each
record a second time from the twins and keep how far its numbers moved (``round_off``:
claims/round_off_widths.py); ``report diff`` and the goldens widen those numbers' tolerances by it.

Claim V's twin (:func:`value_twin_inputs`) moves the keys and values; claim E's
(:func:`checks.gamma_controls.eigen_control_twin`) moves K̃ and recomputes its eigen control,
and moves the recovered axes with :func:`relative_twin`. The patterns are fixed, the same for
every head and batch, so a twin does not depend on how heads and samples were grouped. Pure
tensor math.
"""

from __future__ import annotations

import functools

import torch

#: The relative size of the round-off perturbation of each input element (about 4.5 ulps of
#: float64: the size of the round-off that scores, exponentials and centring leave in them);
#: also the size of K̃'s perturbation in :func:`checks.gamma_precision.overlap_precision`.
ROUND_OFF = 1e-15

#: A record keeps a number's round-off width only where its twin differs by more than
#: MOVE_ABS + MOVE_REL·|value|: a hundredth of the judged cross-machine tolerance (method §13),
#: so that determined numbers carry none.
MOVE_REL = 1e-8
MOVE_ABS = 1e-14


@functools.lru_cache(maxsize=16)
def round_off_pattern(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A fixed standard-Gaussian pattern [rows, cols] (float64, CPU) for one twin input."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(rows, cols, generator=gen, dtype=torch.float64)


def relative_twin(x: torch.Tensor, seed: int) -> torch.Tensor:
    """x [..., R, C] with every element moved by ROUND_OFF of itself along a fixed pattern:
    x·(1 + ROUND_OFF·E), E of :func:`round_off_pattern` broadcast over the leading dimensions.
    Zeros stay zero and every element keeps its relative precision, as rounding leaves it."""
    e = round_off_pattern(x.shape[-2], x.shape[-1], seed).to(x.device, x.dtype)
    return x * (1.0 + ROUND_OFF * e)


def value_twin_inputs(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Claim V's twin inputs: the keys and values [..., N, d] each moved by round-off
    (:func:`relative_twin`, patterns of seeds 1 and 2)."""
    return relative_twin(k, 1), relative_twin(v, 2)
