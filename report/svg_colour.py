"""This module owns the report's colour scales: the viridis map, value → colour (linear or log10),
the readable text colour on a fill, decade scales, colour-bar ticks and the colour bar itself."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .svg_primitives import AXIS, FONT, MISSING, Tick, esc, finite, num, power_label

# Colour stops of the viridis map (perceptually uniform, readable in greyscale: dark = low).
VIRIDIS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e",
           "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")


def _hex_to_rgb(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def interpolate(stops: tuple[str, ...], t: float) -> str:
    """The colour at position ``t`` in [0, 1] along evenly spaced hex ``stops`` (linear in sRGB)."""
    t = min(max(float(t), 0.0), 1.0) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    a, b = _hex_to_rgb(stops[i]), _hex_to_rgb(stops[i + 1])
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def text_colour(fill: str) -> str:
    """Black or white, whichever reads better on ``fill`` (WCAG relative luminance)."""
    def lin(c: int) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in _hex_to_rgb(fill))
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#000000" if lum > 0.18 else "#ffffff"


@dataclass(frozen=True)
class ColourScale:
    """A map from values to colours: linear on [vmin, vmax], or linear in log10 when ``log``.

    Values outside the range are clamped to its ends (the legend says so).
    """

    vmin: float
    vmax: float
    log: bool = False
    label: str = ""
    stops: tuple[str, ...] = VIRIDIS

    def __post_init__(self):
        if not (finite(self.vmin) and finite(self.vmax)) or self.vmax <= self.vmin:
            raise ValueError(f"colour scale needs finite vmin < vmax, got {self.vmin}, {self.vmax}")
        if self.log and self.vmin <= 0:
            raise ValueError(f"a log colour scale needs vmin > 0, got {self.vmin}")

    def position(self, value) -> float | None:
        """Where ``value`` sits on the scale, in [0, 1]; None when it cannot be drawn."""
        if not finite(value) or (self.log and value <= 0):
            return None
        if self.log:
            lo, hi, v = math.log10(self.vmin), math.log10(self.vmax), math.log10(value)
        else:
            lo, hi, v = self.vmin, self.vmax, float(value)
        return min(max((v - lo) / (hi - lo), 0.0), 1.0)

    def colour(self, value) -> str:
        """The fill for ``value``; ``MISSING`` when it cannot be drawn."""
        p = self.position(value)
        return MISSING if p is None else interpolate(self.stops, p)


def decade_scale(values, label: str = "", floor: float = 1e-16) -> ColourScale:
    """A log10 colour scale spanning whole decades around the positive finite ``values``.

    ``floor`` bounds the lower end (exact zeros from an exact control would otherwise stretch the
    scale without limit; they are drawn at the floor and the legend says "≤").
    """
    pos = [float(v) for v in values if finite(v) and v > 0]
    if not pos:
        return ColourScale(floor, 1.0, log=True, label=label)
    lo = math.floor(math.log10(max(min(pos), floor)))
    hi = math.ceil(math.log10(max(pos)))
    if hi <= lo:
        hi = lo + 1
    return ColourScale(10.0 ** lo, 10.0 ** hi, log=True, label=label)


def scale_ticks(scale: ColourScale, n: int = 5) -> list[Tick]:
    """Ticks for a colour bar: whole decades on a log scale, ``n`` even steps on a linear one."""
    if scale.log:
        lo, hi = round(math.log10(scale.vmin)), round(math.log10(scale.vmax))
        step = max(1, math.ceil((hi - lo) / 8))
        return [Tick(10.0 ** k, power_label(k)) for k in range(lo, hi + 1, step)]
    return [Tick(scale.vmin + (scale.vmax - scale.vmin) * i / (n - 1),
                 f"{scale.vmin + (scale.vmax - scale.vmin) * i / (n - 1):.3g}") for i in range(n)]


#: The width of a character of a colour bar's labels (10 px sans-serif), for their layout.
CHAR_PX = 5.8


def mark_layout(xs: list[float], labels: list[str], total_w: float) -> list[tuple[int, str]]:
    """(row, text-anchor) of each marked value of a colour bar, row 0 nearest the bar. A mark's
    line runs from its label's row down to the bar, so it crosses every label in a lower row
    whose text spans its x; the layout with the fewest such crossings, then the least text
    outside the picture, then the most labels pointing to the middle, wins (every order and
    side is tried for up to 5 marks; more keep the value order)."""
    from itertools import permutations, product

    n = len(xs)
    default = ["start" if x < total_w / 2 else "end" for x in xs]
    if n == 0 or n > 5:
        return [(n - 1 - i, default[i]) for i in range(n)]

    def span(i: int, anchor: str) -> tuple[float, float]:
        w = CHAR_PX * len(labels[i])
        return (xs[i] + 3, xs[i] + 3 + w) if anchor == "start" else (xs[i] - 3 - w, xs[i] - 3)

    best = None
    for order in permutations(range(n)):  # order[r]: the mark in row r
        for anchors in product(("start", "end"), repeat=n):
            spans = {i: span(i, anchors[i]) for i in range(n)}
            crossings = sum(1 for r, i in enumerate(order) for j in order[:r]
                            if spans[j][0] - 2 <= xs[i] <= spans[j][1] + 2)
            outside = sum(max(0.0, -lo) + max(0.0, hi - total_w) for lo, hi in spans.values())
            turned = sum(a != d for a, d in zip(anchors, default))
            key = (crossings, round(outside), turned, order[::-1])
            if best is None or key < best[0]:
                best = (key, order, anchors)
    _, order, anchors = best
    row = {i: r for r, i in enumerate(order)}
    return [(row[i], anchors[i]) for i in range(n)]


def colour_bar(scale: ColourScale, element_id: str, ticks: list[Tick] | None = None,
               width: int = 320, note: str = "") -> str:
    """A horizontal colour bar with tick labels below and marked values (lines) above.

    Parameters
    ----------
    scale : the scale to draw.
    element_id : the SVG's id (also prefixes its gradient's id, so it must be unique in the page).
    ticks : tick values and labels; ``mark=True`` ticks (e.g. a null level or a threshold) are
        drawn as a dark line across the bar with their label above it. Default: :func:`scale_ticks`.
    width : the bar's width in px.
    note : a line of text under the bar (e.g. how out-of-range values are drawn).
    """
    ticks = scale_ticks(scale) if ticks is None else ticks
    marks = [t for t in ticks if t.mark]
    left, bar_h = 12, 12
    top = 16 + 12 * len(marks)
    height = top + bar_h + 20 + (14 if note else 0) + (14 if scale.label else 0)
    total_w = width + 2 * left + 40
    gid = f"{element_id}-g"
    stops = "".join(f'<stop offset="{i / (len(scale.stops) - 1):.3f}" stop-color="{c}"/>'
                    for i, c in enumerate(scale.stops))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{esc(element_id)}" class="colour-bar" '
           f'width="{total_w}" height="{height}" viewBox="0 0 {total_w} {height}" role="img" '
           f'aria-label="{esc("colour scale: " + scale.label)}" font-family="{esc(FONT)}" '
           f'font-size="10">',
           f'<defs><linearGradient id="{esc(gid)}" x1="0" x2="1" y1="0" y2="0">{stops}'
           f'</linearGradient></defs>']
    y = 11
    if scale.label:
        out.append(f'<text x="{left}" y="{y}" font-weight="600">{esc(scale.label)}</text>')
        y += 14
        top += 14
    out.append(f'<rect x="{left}" y="{top}" width="{width}" height="{bar_h}" '
               f'fill="url(#{esc(gid)})" stroke="{AXIS}" stroke-width="0.5"/>')
    for t in ticks:
        p = scale.position(t.value)
        if p is None:
            continue
        x = num(left + p * width)
        if t.mark:
            continue
        out.append(f'<line x1="{x}" x2="{x}" y1="{top + bar_h}" y2="{top + bar_h + 4}" '
                   f'stroke="{AXIS}"/>'
                   f'<text x="{x}" y="{top + bar_h + 14}" text-anchor="middle">'
                   f'{esc(t.label)}</text>')
    placed = [(t, left + p * width) for t in sorted(marks, key=lambda m: (m.value, m.label))
              if (p := scale.position(t.value)) is not None]
    for (t, x), (row, anchor) in zip(placed, mark_layout([x for _, x in placed],
                                                         [t.label for t, _ in placed], total_w)):
        ly = top - 4 - 12 * row
        dx = 3 if anchor == "start" else -3
        out.append(f'<line x1="{num(x)}" x2="{num(x)}" y1="{num(ly + 2)}" y2="{top + bar_h}" '
                   f'stroke="#000000" stroke-width="1.5"/>'
                   f'<text x="{num(x + dx)}" y="{num(ly)}" text-anchor="{anchor}">'
                   f'{esc(t.label)}</text>')
    if note:
        out.append(f'<text x="{left}" y="{top + bar_h + 30}" fill="#555555">{esc(note)}</text>')
    out.append("</svg>")
    return "".join(out)

