"""This module owns the report's heatmaps: the SVG grid of coloured cells (one per layer × head),
its cell size, and the same values as a keyboard- and screen-reader-readable HTML table."""

from __future__ import annotations

from .svg_colour import ColourScale, text_colour
from .svg_primitives import AXIS, FONT, GRID, MISSING, esc, num

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
