"""Errors raised by the pure math: they locate the problem by batch index, never by model name."""

from __future__ import annotations

import math

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
    # A NaN or ±Inf anywhere makes the sum NaN or ±Inf, so a finite sum proves every element
    # finite in one pass without a mask (11x faster on [30, 3, 197, 197]); a sum that overflows
    # only sends the check down the exact path.
    if x.is_floating_point() and bool(torch.isfinite(x.sum())):
        return
    finite = torch.isfinite(x)
    if bool(finite.all()):
        return
    nb = x.ndim - 2 if batch_dims is None else batch_dims
    nb = max(nb, 0)
    bad = ~finite.reshape(*x.shape[:nb], -1).all(dim=-1) if nb else torch.tensor(True)
    index = tuple(int(i) for i in torch.nonzero(bad)[0]) if nb else ()
    raise NonFiniteError(what, index)


class UndefinedValueError(ValueError):
    """A quantity that has no value for these inputs (method §6.2): a zero variance, a constant
    series, the log of a non-positive mean, a mean that is not finite in float64.

    The math raises it with a sentence saying why; :func:`defined` turns it into "no value, with a
    reason" for records, and the verdict of a unit that needs the value is *undetermined*.
    """


def defined(name: str, compute, reasons: dict[str, str]) -> float | None:
    """``compute()`` as a finite float, or None with ``reasons[name]`` set (method §6.2).

    The one conversion of an undefined value into a record entry: an :class:`UndefinedValueError`
    raised by ``compute`` or a non-finite result gives None (JSON ``null``), never NaN, never ±inf
    and never a made-up 0.0; the reason says why.

    >>> reasons = {}
    >>> defined("ratio", lambda: 3.0, reasons), reasons
    (3.0, {})
    >>> defined("log_mean", lambda: float("-inf"), reasons), reasons["log_mean"]
    (None, 'log_mean is not finite (-inf)')
    """
    try:
        value = compute()
    except UndefinedValueError as exc:
        reasons[name] = str(exc)
        return None
    if value is None:
        reasons.setdefault(name, f"{name} has no value")
        return None
    value = float(value)
    if not math.isfinite(value):
        reasons[name] = f"{name} is not finite ({value})"
        return None
    return value


def defined_values(values: dict, reasons: dict[str, str]) -> dict:
    """``values`` with every None or non-finite float replaced by None, each with a reason in
    ``reasons`` (an existing reason is kept). Other entries pass unchanged (method §6.2).

    >>> reasons = {}
    >>> defined_values({"a": 1.5, "b": float("inf"), "c": None}, reasons)
    {'a': 1.5, 'b': None, 'c': None}
    >>> sorted(reasons)
    ['b', 'c']
    """
    out = {}
    for name, value in values.items():
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            out[name] = defined(name, lambda v=value: v, reasons) if name not in reasons else None
        else:
            out[name] = value
    return out
