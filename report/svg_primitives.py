"""This module owns the SVG primitives every chart of the report shares: XML escaping, stable
coordinates, the finite-number test, power-of-ten labels, the palette's fixed colours and the
labelled tick.

Every function here is pure and deterministic (same input, same bytes): coordinates are rounded to
one decimal, nothing depends on time or on iteration order of unordered containers. Text placed in
an SVG is XML-escaped by :func:`esc`, so callers may pass raw strings. Values that cannot be drawn
(``None``, NaN, infinities, non-positive numbers on a log scale) are never coloured as if they were
data: they get the :data:`MISSING` fill and the caller's tooltip says why. The charts are in
:mod:`report.svg_colour` (colour scales, colour bars), :mod:`report.svg_heatmap` and
:mod:`report.svg_line_plot`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

FONT = "system-ui, 'Segoe UI', 'Helvetica Neue', Arial, sans-serif"
MISSING = "#ffffff"
AXIS = "#444444"
GRID = "#dddddd"

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def esc(text) -> str:
    """XML-escape ``text`` (quotes included) for use in SVG text and attributes."""
    return escape(str(text), quote=True)


def num(x: float) -> str:
    """A coordinate with at most one decimal, without a trailing ``.0`` (stable bytes)."""
    r = round(float(x), 1)
    if r == 0:
        r = 0.0  # no "-0"
    return str(int(r)) if r == int(r) else f"{r:.1f}"


def finite(x) -> bool:
    """True for a real, finite number (bools excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def power_label(k: int) -> str:
    """``10`` with the integer exponent ``k`` as Unicode superscript, e.g. ``10⁻³``."""
    return "10" + str(int(k)).translate(_SUPERSCRIPT)


@dataclass(frozen=True)
class Tick:
    """A labelled value on an axis or colour bar; ``mark`` ticks are drawn as a line across."""

    value: float
    label: str
    mark: bool = False

