"""A small SVG plot writer for `explore`'s two plots: panels side by side, each with linear or log axes, tick
labels, a grid, scatter and line series, a legend and a title; a caption over the whole figure.

Written by hand rather than drawn with matplotlib (which `report` and `gantt` still use): importing matplotlib and
rendering the two plots to PNG took ~0.9 s of CPU, as much as the hundred design points of issue 14's sweep, and
that sweep's target counts the whole CLI run, plots included. SVG is text: the same rows give the same bytes,
any browser shows it, and a diff shows what changed. Coordinates are printed with two decimals.

Only what the two plots need: no layout engine, text sizes estimated from the character count (a legend box is
sized by its longest label at ~0.6 em per character).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape as _html_escape

#: matplotlib's default colour cycle ("tab10"), so the plots look as they did.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")

#: Exponents as superscript characters: "10³" in plain text.
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(x: float) -> str:
    """A log axis's tick label in plain text: "10³", "2×10³"."""
    exponent = math.floor(math.log10(x) + 1e-9)
    coeff = x / 10.0**exponent
    power = "10" + str(exponent).translate(_SUPERSCRIPT)
    return power if round(coeff, 6) == 1 else f"{coeff:g}×{power}"


def _num(x: float) -> str:
    """A coordinate: two decimals, no trailing zeros (byte-stable across runs)."""
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def escape(text: str) -> str:
    """Text content escaped for SVG (&, <, >): `xml.sax.saxutils.escape`'s rule, without its import of urllib and
    http (~20 ms of every `explore` run)."""
    return _html_escape(text, quote=False)


@dataclass
class Series:
    """One legend entry: points (scatter) or a polyline, with or without markers."""

    label: str
    xs: list[float]
    ys: list[float]
    colour: str
    line: bool = False
    dashed: bool = False
    markers: bool = True


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    xlog: bool = False
    ylog: bool = False
    integer_x: bool = False  #: ticks only at integers (processor counts)
    series: list[Series] = field(default_factory=list)
    note: str = ""  #: text in the middle of an empty panel


@dataclass(frozen=True)
class _Axis:
    lo: float
    hi: float
    log: bool
    ticks: tuple[tuple[float, str], ...]


def _view(values: Sequence[float], log: bool) -> tuple[float, float]:
    """The axis's range: the data padded by 5 % each side (in log space on a log axis)."""
    if log:
        values = [v for v in values if v > 0]
    if not values:
        return (1.0, 10.0) if log else (0.0, 1.0)
    lo, hi = min(values), max(values)
    if log:
        a, b = math.log10(lo), math.log10(hi)
        if a == b:
            a, b = a - 0.5, b + 0.5
        pad = (b - a) * 0.05
        return 10.0 ** (a - pad), 10.0 ** (b + pad)
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _linear_ticks(lo: float, hi: float, integer: bool) -> tuple[tuple[float, str], ...]:
    """Ticks at multiples of 1, 2 or 5 × 10^k, 4 to 8 of them (integers only where asked)."""
    span = hi - lo
    step = 10.0 ** math.floor(math.log10(span / 5))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= 8:
            step *= factor
            break
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + 1e-9 * step:
        value = k * step
        ticks.append((value, f"{value:g}" if not integer else str(round(value))))
        k += 1
    return tuple(ticks)


def _log_ticks(lo: float, hi: float) -> tuple[tuple[float, str], ...]:
    """Every decade in view; over fewer than two decades also 2…9 × 10^k, so an axis always has labelled ticks
    (the labels that would overlap are dropped when drawn: `_thinned`)."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decades = [10.0**e for e in range(first, last + 1) if lo <= 10.0**e <= hi]
    if len(decades) >= 2:
        return tuple((d, power_label(d)) for d in decades)
    return tuple((m * 10.0**e, power_label(m * 10.0**e)) for e in range(first, last + 1) for m in range(1, 10)
                 if lo <= m * 10.0**e <= hi)


def _thinned(places: Sequence[tuple[float, str]], size: float, along_text: bool) -> list[tuple[float, str]]:
    """Tick labels at pixel positions, those that would overlap a kept one blanked: decades and round values
    (no "×") kept first, then the rest left to right. `along_text`: the axis runs along the text (x: a label
    takes ~0.6 em per character), else across it (y: one line, ~1.2 em)."""
    def extent(place: float, label: str) -> tuple[float, float]:
        half = (len(label) * 0.6 * size if along_text else 1.2 * size) / 2 + 3
        return place - half, place + half

    kept: list[tuple[float, float]] = []
    shown = set()
    order = sorted(range(len(places)), key=lambda i: ("×" in places[i][1], i))
    for i in order:
        place, label = places[i]
        a, b = extent(place, label)
        if label and all(b <= c or a >= d for c, d in kept):
            kept.append((a, b))
            shown.add(i)
    return [(place, label if i in shown else "") for i, (place, label) in enumerate(places)]


def _axis(values: Sequence[float], log: bool, integer: bool = False) -> _Axis:
    lo, hi = _view(values, log)
    if not log:
        return _Axis(lo, hi, log, _linear_ticks(lo, hi, integer))
    ticks = _log_ticks(lo, hi)
    if not ticks:  # within one step of the 1…9 × 10^k ladder (7e8 and 7e8 + 1): widened to the steps around it
        e = math.floor(math.log10(lo))
        below = math.floor(lo / 10.0**e + 1e-9)
        lo, hi = below * 10.0**e, (below + 1) * 10.0**e
        ticks = _log_ticks(lo, hi)
    return _Axis(lo, hi, log, ticks)


def _scale(axis: _Axis, value: float, start: float, length: float) -> float:
    """Pixel position of `value` along an axis drawn from `start` over `length` pixels."""
    if axis.log:
        lo, hi, value = math.log10(axis.lo), math.log10(axis.hi), math.log10(value)
    else:
        lo, hi = axis.lo, axis.hi
    return start + (value - lo) / (hi - lo) * length


#: Figure geometry, pixels (matplotlib's inches at 100 dpi): margins around the panels and between them.
MARGIN = {"left": 95, "right": 15, "bottom": 55, "top": 60, "between": 105}


def render(panels: Sequence[Panel], caption: str, panel_width: int, height: int) -> str:
    """The figure's SVG text: `panels` side by side, each `panel_width` pixels of the figure's width."""
    count = max(1, len(panels))
    width = count * panel_width
    m = MARGIN
    axis_width = (width - m["left"] - m["right"] - (count - 1) * m["between"]) / count
    axis_height = height - m["top"] - m["bottom"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{_num(width / 2)}" y="18" font-size="11" text-anchor="middle">{escape(caption)}</text>']
    for i, panel in enumerate(panels):
        left = m["left"] + i * (axis_width + m["between"])
        out.extend(_panel(panel, left, m["top"], axis_width, axis_height))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _panel(panel: Panel, left: float, top: float, width: float, height: float) -> list[str]:
    xs = [x for s in panel.series for x in s.xs]
    ys = [y for s in panel.series for y in s.ys]
    xaxis = _axis(xs, panel.xlog, panel.integer_x)
    yaxis = _axis(ys, panel.ylog)
    bottom, right = top + height, left + width
    out = [f'<g><text x="{_num(left + width / 2)}" y="{_num(top - 8)}" font-size="12" text-anchor="middle">'
           f'{escape(panel.title)}</text>']
    xticks = _thinned([(_scale(xaxis, value, left, width), label) for value, label in xaxis.ticks], 10, True)
    yticks = _thinned([(_scale(yaxis, value, bottom, -height), label) for value, label in yaxis.ticks], 10, False)
    for place, label in xticks:
        out.extend(_tick(place, label, (top, bottom), vertical=True))
    for place, label in yticks:
        out.extend(_tick(place, label, (left, right), vertical=False))
    out.append(f'<rect x="{_num(left)}" y="{_num(top)}" width="{_num(width)}" height="{_num(height)}" '
               f'fill="none" stroke="black"/>')
    out.append(f'<text x="{_num(left + width / 2)}" y="{_num(bottom + 38)}" font-size="11" text-anchor="middle">'
               f'{escape(panel.xlabel)}</text>')
    out.append(f'<text transform="translate({_num(left - 62)},{_num(top + height / 2)}) rotate(-90)" '
               f'font-size="11" text-anchor="middle">{escape(panel.ylabel)}</text>')
    for s in panel.series:
        points = _points(s, xaxis, yaxis, left, bottom, width, height)
        if s.line and len(points) > 1:
            dash = ' stroke-dasharray="5,3"' if s.dashed else ""
            path = " ".join(f"{_num(x)},{_num(y)}" for x, y in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" stroke-width="1.2"{dash}/>')
        if s.markers:
            radius = "2.5" if s.line else "3"
            opacity = "" if s.line else ' fill-opacity="0.7"'
            out.extend(f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{radius}" fill="{s.colour}"{opacity}/>'
                       for x, y in points)
    if panel.note:
        out.append(f'<text x="{_num(left + width / 2)}" y="{_num(top + height / 2)}" font-size="10" '
                   f'text-anchor="middle">{escape(panel.note)}</text>')
    out.extend(_legend(panel.series, [p for s in panel.series for p in _points(s, xaxis, yaxis, left, bottom, width,
                                                                                 height)], left, top, width, height))
    out.append("</g>")
    return out


def _tick(place: float, label: str, across: tuple[float, float], vertical: bool) -> list[str]:
    """A tick at `place` along an axis: its grid line across the panel (`across`: its two edges, the axis at the
    first for y, the second for x), the tick mark outside and its label (x below, y to the left)."""
    a, b = (_num(v) for v in across)
    p = _num(place)
    if vertical:  # on the x axis, at the bottom edge b
        grid, mark = (p, a, p, b), (p, b, p, _num(across[1] + 4))
        text = f'<text x="{p}" y="{_num(across[1] + 17)}" font-size="10" text-anchor="middle">'
    else:  # on the y axis, at the left edge a
        grid, mark = (a, p, b, p), (_num(across[0] - 4), p, a, p)
        text = f'<text x="{_num(across[0] - 7)}" y="{p}" font-size="10" text-anchor="end" dominant-baseline="middle">'
    out = [f'<line x1="{grid[0]}" y1="{grid[1]}" x2="{grid[2]}" y2="{grid[3]}" stroke="#b0b0b0" '
           f'stroke-width="0.8" stroke-opacity="0.3"/>',
           f'<line x1="{mark[0]}" y1="{mark[1]}" x2="{mark[2]}" y2="{mark[3]}" stroke="black"/>']
    if label:
        out.append(f"{text}{escape(label)}</text>")
    return out


def _points(s: Series, xaxis: _Axis, yaxis: _Axis, left: float, bottom: float, width: float,
            height: float) -> list[tuple[float, float]]:
    """A series' points in pixels (a log axis drops values ≤ 0)."""
    return [(_scale(xaxis, x, left, width), _scale(yaxis, y, bottom, -height))
            for x, y in zip(s.xs, s.ys, strict=True) if (x > 0 or not xaxis.log) and (y > 0 or not yaxis.log)]


def _legend(series: Sequence[Series], points: Sequence[tuple[float, float]], left: float, top: float,
            width: float, height: float) -> list[str]:
    """A boxed legend, one row per series, in the corner of the panel that covers the fewest points (upper
    right, upper left, lower left, lower right among equals: matplotlib's "best", by corners)."""
    if not series:
        return []
    row, size = 13, 9
    text_width = max(len(s.label) for s in series) * size * 0.6
    box_width, box_height = text_width + 34, row * len(series) + 8
    corners = [(left + width - box_width - 6, top + 6), (left + 6, top + 6),
               (left + 6, top + height - box_height - 6), (left + width - box_width - 6, top + height - box_height - 6)]

    def covered(corner: tuple[float, float]) -> int:
        x, y = corner
        return sum(x - 4 <= px <= x + box_width + 4 and y - 4 <= py <= y + box_height + 4 for px, py in points)

    x0, y0 = min(corners, key=covered)
    out = [f'<rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(box_width)}" height="{_num(box_height)}" '
           f'fill="white" fill-opacity="0.8" stroke="#cccccc"/>']
    for k, s in enumerate(series):
        y = y0 + 4 + row * k + row / 2
        if s.line:
            dash = ' stroke-dasharray="5,3"' if s.dashed else ""
            out.append(f'<line x1="{_num(x0 + 6)}" y1="{_num(y)}" x2="{_num(x0 + 24)}" y2="{_num(y)}" '
                       f'stroke="{s.colour}" stroke-width="1.2"{dash}/>')
        if s.markers:
            out.append(f'<circle cx="{_num(x0 + 15)}" cy="{_num(y)}" r="3" fill="{s.colour}"/>')
        out.append(f'<text x="{_num(x0 + 30)}" y="{_num(y)}" font-size="{size}" dominant-baseline="middle">'
                   f'{escape(s.label)}</text>')
    return out
