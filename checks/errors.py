"""Errors raised by the pure math: they locate the problem by batch index, never by model name."""

from __future__ import annotations

import torch


class NonFiniteError(FloatingPointError):
    """A NaN or Inf appeared in ``what``; ``index`` is the leading (batch) index of the first one."""

    def __init__(self, what: str, index: tuple[int, ...]):
        self.what = what
        self.index = index
        super().__init__(f"non-finite values in {what} at batch index {index}")


def check_finite(x: torch.Tensor, what: str, batch_dims: int | None = None) -> None:
    """Raise :class:`NonFiniteError` naming the first batch index whose block of ``x`` is not finite.

    ``batch_dims`` leading dimensions index the batch (default: all but the last two).
    """
    finite = torch.isfinite(x)
    if bool(finite.all()):
        return
    nb = x.ndim - 2 if batch_dims is None else batch_dims
    nb = max(nb, 0)
    bad = ~finite.reshape(*x.shape[:nb], -1).all(dim=-1) if nb else torch.tensor(True)
    index = tuple(int(i) for i in torch.nonzero(bad)[0]) if nb else ()
    raise NonFiniteError(what, index)
