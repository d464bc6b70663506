"""Shared argument checks for ``checks`` and ``fixtures``: one wording for "must be an int", "must
have shape [..., N, d]" and "must share leading dims". Each check raises :class:`ValueError` with a
one-sentence message that names the argument, what it must be and the value (or shape) found, so a
caller's message stays as specific as a hand-written one while the test itself exists once (style
guide §3 item 3). Nothing here knows about claims: tensors and ints in, None or ValueError out.

>>> check_int(3, "n", min_val=1)
>>> check_int(True, "n", min_val=1)
Traceback (most recent call last):
...
ValueError: n must be a positive int, got True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["check_int", "check_ndim", "check_same_batch"]


def check_int(value: object, name: str, *, min_val: int | None = None, max_val: int | None = None,
              allow_none: bool = False, expected: str | None = None) -> None:
    """Raise ValueError unless ``value`` is an int (never a bool) in ``[min_val, max_val]``.

    Parameters
    ----------
    value : object
        The argument to check.
    name : str
        Its name, as the message shows it.
    min_val, max_val : int, optional
        The smallest and largest allowed values; no bound when None.
    allow_none : bool, default False
        Whether None is accepted.
    expected : str, optional
        What the message says ``value`` must be (e.g. ``"a positive int or None (all)"``); by
        default "an int", "a positive int" (``min_val=1``) or "an int ≥ min_val", plus
        " ≤ max_val" and " or None" where they apply.

    Examples
    --------
    >>> check_int(None, "n", min_val=1, allow_none=True)
    >>> check_int(0, "size", min_val=1)
    Traceback (most recent call last):
    ...
    ValueError: size must be a positive int, got 0
    >>> check_int(2.0, "max_length", min_val=3, expected="an int > 2")
    Traceback (most recent call last):
    ...
    ValueError: max_length must be an int > 2, got 2.0
    """
    if value is None and allow_none:
        return
    if (isinstance(value, bool) or not isinstance(value, int)
            or (min_val is not None and value < min_val)
            or (max_val is not None and value > max_val)):
        if expected is None:
            expected = ("an int" if min_val is None else "a positive int" if min_val == 1
                        else f"an int ≥ {min_val}")
            expected += "" if max_val is None else f" ≤ {max_val}"
            expected += " or None" if allow_none else ""
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_ndim(x: torch.Tensor, name: str, *, min_ndim: int = 2, shape: str = "[..., N, d]",
               note: str = "") -> None:
    """Raise ValueError unless ``x`` has at least ``min_ndim`` dimensions.

    The message reads "``name`` must have shape ``shape````note``, got (shape found)".

    >>> check_ndim(torch.zeros(4, 3), "keys")
    >>> check_ndim(torch.zeros(3), "keys")
    Traceback (most recent call last):
    ...
    ValueError: keys must have shape [..., N, d], got (3,)
    """
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have shape {shape}{note}, got {tuple(x.shape)}")


def check_same_batch(x: torch.Tensor, y: torch.Tensor, names: Sequence[str], *,
                     may_differ: int = -1, min_ndim: int = 2, what: str = "leading dims and N",
                     message: str | None = None) -> None:
    """Raise ValueError unless ``x`` and ``y`` have the same number of dimensions (at least
    ``min_ndim``) and the same size along every axis but ``may_differ``.

    ``may_differ=-1`` (default) is the "same batch and tokens" rule of keys [..., N, d] and values
    [..., N, d_v]; ``may_differ=-2`` the rule of queries [..., N, d] and keys [..., M, d]. The
    default message is "``names[0]`` and ``names[1]`` must share ``what``; got (x shape) and
    (y shape)"; ``message`` replaces it, with ``{x}`` and ``{y}`` standing for the two shapes.

    Examples
    --------
    >>> check_same_batch(torch.zeros(2, 5, 3), torch.zeros(2, 5, 4), ("k", "v"))
    >>> check_same_batch(torch.zeros(2, 5, 3), torch.zeros(2, 4, 3), ("q", "k"), may_differ=-2)
    >>> check_same_batch(torch.zeros(2, 5, 3), torch.zeros(2, 4, 3), ("k [..., N, d]", "v [..., N, d_v]"))
    Traceback (most recent call last):
    ...
    ValueError: k [..., N, d] and v [..., N, d_v] must share leading dims and N; got (2, 5, 3) and (2, 4, 3)
    """
    ok = x.ndim == y.ndim and x.ndim >= min_ndim
    if ok:
        axis = may_differ % x.ndim
        ok = all(a == b for i, (a, b) in enumerate(zip(x.shape, y.shape)) if i != axis)
    if not ok:
        sx, sy = tuple(x.shape), tuple(y.shape)
        if message is None:
            raise ValueError(f"{names[0]} and {names[1]} must share {what}; got {sx} and {sy}")
        raise ValueError(message.format(x=sx, y=sy))


def printable(text: object) -> str:
    """``text`` safe to print on a terminal: every control character (C0 but tab, DEL, C1: the
    ESC of a colour or cursor code in a file name, a carriage return that hides what precedes it)
    written as its escape, ``\\x1b``, so a one-sentence error shows a name as it is instead of
    letting the terminal act on it.

    >>> printable("run\\x1b[2J.json")
    'run\\\\x1b[2J.json'
    >>> printable("plain name.json")
    'plain name.json'
    """
    out = []
    for ch in str(text):
        code = ord(ch)
        if (code < 0x20 and ch != "\t") or 0x7F <= code <= 0x9F:
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)
