"""This module owns the report's line plots: series, shaded bands and reference lines, axis ticks
(log10 decades or even steps), markers and the legend flowed below the plot."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .svg_primitives import AXIS, FONT, GRID, esc, finite, num, power_label

@dataclass(frozen=True)
class Series:
    """One line of a plot: points (x, y) in plotted units; ``None`` y values leave a gap.

    ``hollow`` marks points drawn with an open marker (e.g. a negative value plotted by its
    magnitude); ``marker`` is one of "circle", "square", "triangle", "diamond".
    """

    label: str
    x: tuple
    y: tuple
    colour: str
    marker: str = "circle"
    hollow: tuple = ()
    dashed: bool = False


@dataclass(frozen=True)
class Band:
    """A shaded horizontal band [lo, hi] in plotted units, labelled in the legend."""

    lo: float
    hi: float
    label: str
    colour: str = "#8da0cb"


@dataclass(frozen=True)
class HLine:
    """A dashed horizontal reference line at ``y`` (plotted units), labelled at its right end."""

    y: float
    label: str
    colour: str = "#b2182b"


def _marker(kind: str, x: float, y: float, colour: str, hollow: bool) -> str:
    fill = "#ffffff" if hollow else colour
    style = f'fill="{fill}" stroke="{colour}" stroke-width="1.3"'
    if kind == "square":
        return f'<rect x="{num(x - 3.2)}" y="{num(y - 3.2)}" width="6.4" height="6.4" {style}/>'
    if kind == "triangle":
        pts = f"{num(x)},{num(y - 4)} {num(x - 4)},{num(y + 3.2)} {num(x + 4)},{num(y + 3.2)}"
        return f'<polygon points="{pts}" {style}/>'
    if kind == "diamond":
        pts = (f"{num(x)},{num(y - 4.2)} {num(x - 4.2)},{num(y)} "
               f"{num(x)},{num(y + 4.2)} {num(x + 4.2)},{num(y)}")
        return f'<polygon points="{pts}" {style}/>'
    return f'<circle cx="{num(x)}" cy="{num(y)}" r="3.3" {style}/>'


def _flow(widths: list[float], avail: float) -> list[tuple[float, int]]:
    """(x offset, row) for items of the given widths laid out left to right, wrapping at
    ``avail`` px (an item wider than ``avail`` gets a row of its own)."""
    out, x, row = [], 0.0, 0
    for w in widths:
        if x > 0 and x + w > avail:
            x, row = 0.0, row + 1
        out.append((x, row))
        x += w
    return out


def _nice_step(span: float, target: int = 6) -> float:
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _range(values: list[float], integer: bool) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if integer:
        lo, hi = math.floor(lo), math.ceil(hi)
        if hi == lo:
            lo, hi = lo - 1, hi + 1
        return float(lo), float(hi)
    if hi == lo:
        return lo - 0.5, hi + 0.5
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def line_plot(series: list[Series], element_id: str, x_label: str, y_label: str,
              y_log10: bool = True, bands: list[Band] | None = None,
              hlines: list[HLine] | None = None, top_marks: list[tuple[float, str]] | None = None,
              x_integer: bool = True, width: int = 620, height: int = 250, title: str = "") -> str:
    """A line plot with markers, optional shaded bands, reference lines and a legend below.

    Parameters
    ----------
    series : the lines; their ``y`` are in plotted units (already log10 when ``y_log10``).
    element_id : the SVG's id.
    x_label, y_label : axis titles.
    y_log10 : when True the y values are log10 of the quantity and the tick labels read 10ᵏ at
        whole decades (a log y scale).
    bands, hlines : reference ranges and lines in plotted units.
    top_marks : (x, text) pairs written along the top edge (e.g. a layer's verdict letter).
    x_integer : x ticks at integers only (layers).
    """
    bands, hlines, top_marks = bands or [], hlines or [], top_marks or []
    xs = [float(x) for s in series for x, y in zip(s.x, s.y) if finite(x) and finite(y)]
    ys = [float(y) for s in series for y in s.y if finite(y)]
    ys += [b.lo for b in bands] + [b.hi for b in bands] + [h.y for h in hlines]
    if not xs:
        xs = [0.0, 1.0]
    if not ys:
        ys = [0.0, 1.0]
    x0, x1 = (min(xs), max(xs)) if max(xs) > min(xs) else (min(xs) - 1, max(xs) + 1)
    xpad = (x1 - x0) * 0.04
    x0, x1 = x0 - xpad, x1 + xpad
    y0, y1 = _range(ys, integer=y_log10)
    left, right = 58, 16 + (max((len(h.label) for h in hlines), default=0) * 5.6 if hlines else 0)
    top = 12 + (14 if title else 0) + (12 if top_marks else 0)
    plot_h = height - top - 34
    legend_items = [(s.label, s) for s in series] + [(b.label, b) for b in bands]
    legend_pos = _flow([24 + 5.6 * len(label) + 14 for label, _ in legend_items], width - left)
    legend_rows = 1 + max((r for _, r in legend_pos), default=0)
    total_h = height + 16 * legend_rows + 6
    plot_w = width - left - right

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{esc(element_id)}" class="plot" '
           f'width="{width}" height="{num(total_h)}" viewBox="0 0 {width} {num(total_h)}" '
           f'role="img" aria-label="{esc(title or element_id)}" font-family="{esc(FONT)}" '
           f'font-size="10">']
    if title:
        out.append(f'<text x="{left}" y="11" font-weight="600">{esc(title)}</text>')
    for b in bands:
        lo, hi = max(min(b.lo, b.hi), y0), min(max(b.lo, b.hi), y1)
        if hi > lo:
            out.append(f'<rect x="{left}" y="{num(py(hi))}" width="{num(plot_w)}" '
                       f'height="{num(py(lo) - py(hi))}" fill="{b.colour}" fill-opacity="0.25"/>')
    # y grid and ticks
    if y_log10:
        step = max(1, math.ceil((y1 - y0) / 8))
        yt = [(float(k), power_label(k)) for k in range(int(y0), int(y1) + 1, step)]
    else:
        st = _nice_step(y1 - y0)
        k0 = math.ceil(y0 / st)
        yt = [(k * st, f"{k * st:.4g}") for k in range(k0, int(math.floor(y1 / st)) + 1)]
    out.append(f'<g font-size="9" fill="{AXIS}" text-anchor="end">')
    for v, lab in yt:
        y = num(py(v))
        out.append(f'<line x1="{left}" x2="{num(left + plot_w)}" y1="{y}" y2="{y}" '
                   f'stroke="{GRID}" stroke-width="0.6"/><text x="{left - 5}" '
                   f'y="{num(py(v) + 3)}">{esc(lab)}</text>')
    out.append("</g>")
    # x ticks
    if x_integer:
        span = x1 - x0
        st = max(1, int(_nice_step(span, 12)))
        xt = [float(k) for k in range(math.ceil(x0), math.floor(x1) + 1) if k % st == 0]
    else:
        st = _nice_step(x1 - x0)
        xt = [k * st for k in range(math.ceil(x0 / st), int(math.floor(x1 / st)) + 1)]
    base = top + plot_h
    out.append(f'<g font-size="9" fill="{AXIS}" text-anchor="middle">')
    for v in xt:
        x = num(px(v))
        out.append(f'<line x1="{x}" x2="{x}" y1="{num(base)}" y2="{num(base + 4)}" '
                   f'stroke="{AXIS}"/>'
                   f'<text x="{x}" y="{num(base + 14)}">{v:.6g}</text>')
    out.append("</g>")
    out.append(f'<rect x="{left}" y="{top}" width="{num(plot_w)}" height="{num(plot_h)}" '
               f'fill="none" stroke="{AXIS}" stroke-width="0.8"/>')
    out.append(f'<text x="{num(left + plot_w / 2)}" y="{num(base + 28)}" text-anchor="middle" '
               f'fill="{AXIS}">{esc(x_label)}</text>')
    out.append(f'<text transform="translate(12 {num(top + plot_h / 2)}) rotate(-90)" '
               f'text-anchor="middle" fill="{AXIS}">{esc(y_label)}</text>')
    for h in hlines:
        if y0 <= h.y <= y1:
            y = num(py(h.y))
            out.append(f'<line x1="{left}" x2="{num(left + plot_w)}" y1="{y}" y2="{y}" '
                       f'stroke="{h.colour}" stroke-width="1.2" stroke-dasharray="5 3"/>'
                       f'<text x="{num(left + plot_w + 3)}" y="{num(py(h.y) + 3)}" '
                       f'fill="{h.colour}" font-size="9">{esc(h.label)}</text>')
    for s in series:
        pts = [(px(x), py(y)) for x, y in zip(s.x, s.y) if finite(x) and finite(y)]
        # a gap in the data breaks the line
        segs, cur = [], []
        for x, y in zip(s.x, s.y):
            if finite(x) and finite(y):
                cur.append(f"{num(px(x))},{num(py(y))}")
            elif cur:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        dash = ' stroke-dasharray="4 2"' if s.dashed else ""
        for seg in segs:
            if len(seg) > 1:
                out.append(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{s.colour}" '
                           f'stroke-width="1.4"{dash}/>')
        hollow = s.hollow or (False,) * len(s.x)
        k = 0
        for (x, y), h in zip(zip(s.x, s.y), hollow):
            if finite(x) and finite(y):
                out.append(_marker(s.marker, pts[k][0], pts[k][1], s.colour, bool(h)))
                k += 1
    if top_marks:
        out.append(f'<g font-size="9" font-weight="600" text-anchor="middle" fill="{AXIS}">')
        for x, text in top_marks:
            if finite(x) and x0 <= x <= x1:
                out.append(f'<text x="{num(px(x))}" y="{top - 3}">{esc(text)}</text>')
        out.append("</g>")
    # legend, flowed left to right in rows
    for (label, item), (lx, row) in zip(legend_items, legend_pos):
        lx += left
        yy = height + 4 + 16 * row
        if isinstance(item, Band):
            out.append(f'<rect x="{num(lx)}" y="{num(yy - 6)}" width="18" height="9" '
                       f'fill="{item.colour}" fill-opacity="0.35"/>')
        else:
            out.append(f'<line x1="{num(lx)}" x2="{num(lx + 18)}" y1="{num(yy - 2)}" '
                       f'y2="{num(yy - 2)}" stroke="{item.colour}" stroke-width="1.4"/>')
            out.append(_marker(item.marker, lx + 9, yy - 2, item.colour, False))
        out.append(f'<text x="{num(lx + 24)}" y="{num(yy + 1.5)}">{esc(label)}</text>')
    out.append("</svg>")
    return "".join(out)
