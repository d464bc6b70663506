"""Inline SVG for the report: colour scales, heatmaps and line plots, as plain strings.

Every function here is pure and deterministic (same input, same bytes): coordinates are rounded to
one decimal, nothing depends on time or on iteration order of unordered containers. Text placed in
the SVG is XML-escaped here, so callers may pass raw strings. Values that cannot be drawn (``None``,
NaN, infinities, non-positive numbers on a log scale) are never coloured as if they were data:
they get the ``MISSING`` fill and the caller's tooltip says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

FONT = "system-ui, 'Segoe UI', 'Helvetica Neue', Arial, sans-serif"
MISSING = "#ffffff"
AXIS = "#444444"
GRID = "#dddddd"

# Colour stops of the viridis map (perceptually uniform, readable in greyscale: dark = low).
VIRIDIS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e",
           "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")

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


@dataclass(frozen=True)
class Tick:
    """A labelled value on an axis or colour bar; ``mark`` ticks are drawn as a line across."""

    value: float
    label: str
    mark: bool = False


def scale_ticks(scale: ColourScale, n: int = 5) -> list[Tick]:
    """Ticks for a colour bar: whole decades on a log scale, ``n`` even steps on a linear one."""
    if scale.log:
        lo, hi = round(math.log10(scale.vmin)), round(math.log10(scale.vmax))
        step = max(1, math.ceil((hi - lo) / 8))
        return [Tick(10.0 ** k, power_label(k)) for k in range(lo, hi + 1, step)]
    return [Tick(scale.vmin + (scale.vmax - scale.vmin) * i / (n - 1),
                 f"{scale.vmin + (scale.vmax - scale.vmin) * i / (n - 1):.3g}") for i in range(n)]


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
    for i, t in enumerate(sorted(marks, key=lambda m: (m.value, m.label))):
        p = scale.position(t.value)
        if p is None:
            continue
        x = left + p * width
        ly = top - 4 - 12 * (len(marks) - 1 - i)
        anchor = "start" if p < 0.5 else "end"
        dx = 3 if p < 0.5 else -3
        out.append(f'<line x1="{num(x)}" x2="{num(x)}" y1="{num(ly + 2)}" y2="{top + bar_h}" '
                   f'stroke="#000000" stroke-width="1.5"/>'
                   f'<text x="{num(x + dx)}" y="{num(ly)}" text-anchor="{anchor}">'
                   f'{esc(t.label)}</text>')
    if note:
        out.append(f'<text x="{left}" y="{top + bar_h + 30}" fill="#555555">{esc(note)}</text>')
    out.append("</svg>")
    return "".join(out)


def heatmap(values: list[list], rows: list[int], cols: list[int], scale: ColourScale,
            element_id: str, marks: list[list[str]] | None = None,
            tooltips: list[list[str]] | None = None, row_title: str = "layer",
            col_title: str = "head", cell: tuple[int, int] = (18, 14),
            row_notes: list[str] | None = None, title: str = "") -> str:
    """A grid of coloured cells, one ``<rect>`` per (row, column), with optional letters on top.

    Parameters
    ----------
    values : ``values[i][j]`` the value of row ``rows[i]``, column ``cols[j]``; ``None`` for no
        record (white cell, with a thin grey outline).
    rows, cols : the row (layer) and column (head) numbers, for the axis labels.
    scale : value → colour.
    element_id : the SVG's id.
    marks : optional ``marks[i][j]`` short text (a verdict letter) centred in each cell, drawn in
        black or white, whichever reads on the cell's colour.
    tooltips : optional ``tooltips[i][j]`` text shown on hover (SVG ``<title>``).
    cell : (width, height) of a cell in px.
    row_notes : optional text after each row (e.g. a layer's verdict letter).
    title : an optional caption line drawn above the grid.
    """
    if len(values) != len(rows) or any(len(r) != len(cols) for r in values):
        raise ValueError(f"heatmap {element_id}: values must be {len(rows)} rows x "
                         f"{len(cols)} columns")
    cw, ch = cell
    left = 46
    top = 30 + (14 if title else 0)
    right = 10 + (max((len(n) for n in row_notes), default=0) * 7 + 8 if row_notes else 0)
    width = max(left + cw * len(cols) + right, left + int(6.2 * len(title)) if title else 0)
    height = top + ch * len(rows) + 6
    fs = max(7, min(11, ch - 4, cw - 2))
    label_every = 1 if cw >= 14 else 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{esc(element_id)}" class="heatmap" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{esc(title or element_id)}" font-family="{esc(FONT)}" font-size="10">']
    if title:
        out.append(f'<text x="{left}" y="11" font-weight="600">{esc(title)}</text>')
    grid_top = top
    out.append(f'<text x="{num(left + cw * len(cols) / 2)}" y="{grid_top - 18}" '
               f'text-anchor="middle" fill="{AXIS}">{esc(col_title)}</text>')
    out.append(f'<text transform="translate(11 {num(grid_top + ch * len(rows) / 2)}) rotate(-90)" '
               f'text-anchor="middle" fill="{AXIS}">{esc(row_title)}</text>')
    out.append(f'<g text-anchor="middle" fill="{AXIS}" font-size="9">')
    for j, c in enumerate(cols):
        if j % label_every == 0:
            out.append(f'<text x="{num(left + cw * j + cw / 2)}" y="{grid_top - 4}">{c}</text>')
    out.append('</g><g text-anchor="end" fill="#444444" font-size="9">')
    row_every = 1 if ch >= 10 else 2
    for i, r in enumerate(rows):
        if i % row_every == 0:
            out.append(f'<text x="{left - 4}" y="{num(grid_top + ch * i + ch / 2 + 3)}">{r}</text>')
    out.append(f'</g><g stroke="#ffffff" stroke-width="0.5">')
    letters = []
    for i in range(len(rows)):
        y = grid_top + ch * i
        for j in range(len(cols)):
            x = left + cw * j
            v = values[i][j]
            fill = scale.colour(v)
            stroke = f' stroke="{GRID}"' if fill == MISSING else ""
            tip = tooltips[i][j] if tooltips else ""
            rect = f'<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="{fill}"{stroke}'
            out.append(f"{rect}><title>{esc(tip)}</title></rect>" if tip else f"{rect}/>")
            if marks and marks[i][j]:
                white = ' fill="#ffffff"' if text_colour(fill) == "#ffffff" else ""
                letters.append(f'<text x="{num(x + cw / 2)}" y="{num(y + ch / 2 + fs * 0.36)}"'
                               f'{white}>{esc(marks[i][j])}</text>')
    out.append("</g>")
    if letters:
        out.append(f'<g text-anchor="middle" font-size="{fs}" font-weight="600" fill="#000000" '
                   f'pointer-events="none">{"".join(letters)}</g>')
    if row_notes:
        out.append(f'<g font-size="9" fill="{AXIS}">')
        for i, note in enumerate(row_notes):
            if note:
                out.append(f'<text x="{left + cw * len(cols) + 5}" '
                           f'y="{num(grid_top + ch * i + ch / 2 + 3)}">{esc(note)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


# ------------------------------------------------------------------------------------ line plots
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


def fit_cells(n_rows: int, n_cols: int, max_width: int = 640, panels: int = 1) -> tuple[int, int]:
    """A (width, height) cell size so ``panels`` heatmaps of ``n_cols`` columns fit side by side in
    ``max_width`` px: between 9 and 30 px wide, between 9 and 16 px high."""
    avail = (max_width - panels * 60) / max(panels * n_cols, 1)
    w = int(min(30, max(9, avail)))
    h = int(min(16, max(9, 360 / max(n_rows, 1))))
    return w, h



def values_grid(cells: list[list], rows: list[int], cols: list[int], element_id: str,
                summary: str, row_title: str = "layer", col_title: str = "head",
                note: str = "") -> str:
    """The values of a heatmap as an HTML table inside ``<details>``: reachable with the keyboard
    (the ``<summary>`` takes focus) and read by screen readers, unlike the SVG's hover ``<title>``
    texts. Laid out like the heatmap: one row per ``rows`` entry (layer), one column per ``cols``
    entry (head); ``cells[i][j]`` is the cell's text (escaped; None for no record)."""
    head = (f'<th scope="col">{esc(row_title)} \\ {esc(col_title)}</th>'
            + "".join(f'<th scope="col" class="num">{esc(c)}</th>' for c in cols))
    body = []
    for r, row in zip(rows, cells):
        tds = "".join(f'<td class="num">{esc("" if v is None else v)}</td>' for v in row)
        body.append(f'<tr><th scope="row" class="num">{esc(r)}</th>{tds}</tr>')
    caption = f"<caption>{esc(note)}</caption>" if note else ""
    return (f'<details class="values" id="{esc(element_id)}"><summary>{esc(summary)}</summary>'
            f'<table>{caption}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            f"</details>")
