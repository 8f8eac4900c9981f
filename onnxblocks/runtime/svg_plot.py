"""A line plot drawn as SVG text, with no dependency beyond numpy.

Axes with round ticks (:func:`nice_ticks`, labelled by :func:`format_tick`), one polyline per
series (decimated to the plot's pixel width), a title, axis labels and a legend, built from the
primitives of :mod:`onnxblocks.display.svg`. :func:`onnxblocks.runtime.plot.save_line_plot` writes
it for ``.svg`` paths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

Color = tuple[int, int, int] | str
_Data = Mapping[str, tuple[np.ndarray, np.ndarray]]
_Styles = Mapping[str, Mapping[str, Any]]

# advance of one character of the monospace font at 12 px (onnxblocks.display.svg.TITLE_CHAR)
_CHAR = 7.3
_INK, _GRID, _MUTED = "#1e293b", "#e2e8f0", "#475569"


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        value += step
    return ticks


def format_tick(value: float) -> str:
    """Short label for a tick value: ``0.001``, ``2.5``, ``1e-5``, ``1.2e5``."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        mantissa, exponent = f"{value:.1e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.4g}"


def _css(color: Color) -> str:
    if isinstance(color, str):
        return color
    r, g, b = (round(c) for c in color)
    return f"#{r:02x}{g:02x}{b:02x}"


def svg_plot(
    data: _Data, styles: _Styles, texts: tuple[str, str, str], log_y: bool, size: tuple[int, int]
) -> str:
    """The SVG text of a plot (``texts``: title, x label, y label; ``size``: width, height)."""
    from onnxblocks.display.svg import svg_document, svg_polyline, svg_text

    (title, xlabel, ylabel), (width, height) = texts, size

    all_x = np.concatenate([xs for xs, _ in data.values()])
    all_y = np.concatenate([ys for _, ys in data.values()])
    ty = np.log10(all_y) if log_y else all_y
    x_lo, x_hi = float(all_x.min()), float(all_x.max())
    y_lo, y_hi = float(ty.min()), float(ty.max())
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    pad = (y_hi - y_lo) * 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad
    top, right, bottom = 16 + (28 if title else 0), 24, 30 + (22 if xlabel else 0)
    count = max(3, (height - top - bottom) // 55)
    if log_y:  # ticks at the powers of ten, or at round values when the range spans less than two
        yticks = [float(e) for e in range(math.ceil(y_lo), math.floor(y_hi) + 1)]
        if len(yticks) < 2:
            yticks = [math.log10(v) for v in nice_ticks(10**y_lo, 10**y_hi, count) if v > 0]
        ylabels = [format_tick(10**t) for t in yticks]
    else:
        yticks = nice_ticks(y_lo, y_hi, count)
        ylabels = [format_tick(t) for t in yticks]
    left = 10 + (22 if ylabel else 0) + max((len(s) for s in ylabels), default=1) * _CHAR + 8
    px0, px1, py0, py1 = left, width - right, top, height - bottom

    def sx(x: np.ndarray | float) -> np.ndarray:
        return px0 + (np.asarray(x) - x_lo) / (x_hi - x_lo) * (px1 - px0)

    def sy(y: np.ndarray | float) -> np.ndarray:
        return py1 - (np.asarray(y) - y_lo) / (y_hi - y_lo) * (py1 - py0)

    parts, grid, marks = [], [], []
    for t, label in zip(yticks, ylabels, strict=True):
        y = float(sy(t))
        if py0 - 0.5 <= y <= py1 + 0.5:
            grid.append(f"M{px0:.1f},{y:.1f}H{px1:.1f}")
            parts.append(svg_text(px0 - 6, y + 4, label, size=12, fill=_MUTED, anchor="end"))
    for t in nice_ticks(x_lo, x_hi, count=max(3, int(px1 - px0) // 110)):
        x = float(sx(t))
        if px0 - 0.5 <= x <= px1 + 0.5:
            grid.append(f"M{x:.1f},{py0:.1f}V{py1:.1f}")
            marks.append(f"M{x:.1f},{py1:.1f}v5")
            parts.append(
                svg_text(x, py1 + 18, format_tick(t), size=12, fill=_MUTED, anchor="middle")
            )
    body = [f'<path d="{"".join(grid)}" stroke="{_GRID}" fill="none"/>', *parts]
    for label, (xs, ys) in data.items():
        if not len(xs):
            continue
        style = styles[label]
        color, alpha, line = _css(style["color"]), float(style["alpha"]), float(style["width"])
        xs_px, ys_px = _decimate(sx(xs), sy(np.log10(ys) if log_y else ys), int(px1 - px0))
        if len(xs_px) == 1:  # one point: a dot, since a polyline through it draws nothing
            body.append(
                f'<circle cx="{xs_px[0]:.1f}" cy="{ys_px[0]:.1f}" r="{line + 1:g}" fill="{color}" '
                f'fill-opacity="{alpha:g}"/>'
            )
        body.append(svg_polyline(zip(xs_px, ys_px, strict=True), color, line, alpha, title=label))
    body.append(
        f'<rect x="{px0:.1f}" y="{py0:.1f}" width="{px1 - px0:.1f}" height="{py1 - py0:.1f}" '
        'fill="none" '
        f'stroke="{_INK}"/><path d="{"".join(marks)}" stroke="{_INK}"/>'
    )
    if title:
        body.append(
            svg_text(
                width / 2,
                28,
                title,
                size=15,
                fill=_INK,
                anchor="middle",
                bold=True,
                limit=max(8, int(width / 8.8)),
            )
        )
    if xlabel:
        body.append(
            svg_text((px0 + px1) / 2, height - 10, xlabel, size=12, fill=_INK, anchor="middle")
        )
    if ylabel:
        body.append(
            svg_text(20, (py0 + py1) / 2, ylabel, size=12, fill=_INK, anchor="middle", rotate=-90)
        )
    labels = [lb for lb in data if lb]
    if labels:
        box_w, box_h = max(min(len(lb), 40) for lb in labels) * _CHAR + 46, len(labels) * 20 + 10
        bx, by = px1 - box_w - 10, py0 + 10
        body.append(
            f'<g><rect x="{bx:.1f}" y="{by:.1f}" width="{box_w:.1f}" height="{box_h}" '
            'fill="#ffffff" '
            f'fill-opacity="0.9" stroke="{_GRID}"/>'
        )
        for i, label in enumerate(labels):
            y = by + 15 + 20 * i
            style = styles[label]
            body.append(
                f'<path d="M{bx + 8:.1f},{y:.1f}h24" stroke="{_css(style["color"])}" '
                f'stroke-width="{float(style["width"]):g}" '
                f'stroke-opacity="{float(style["alpha"]):g}"/>'
            )
            body.append(svg_text(bx + 38, y + 4, label, size=12, fill=_INK, limit=40))
        body.append("</g>")
    return svg_document(width, height, "".join(body), font_size=12)


def _decimate(xs: np.ndarray, ys: np.ndarray, pixels: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most ~4 points per pixel column (first, min, max, last), so long curves stay
    small.
    """
    if len(xs) <= 4 * max(1, pixels):
        return xs, ys
    columns = np.floor(xs - xs.min()).astype(np.int64)
    keep: list[int] = []
    bounds = np.flatnonzero(np.diff(columns)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(xs)], strict=True):
        seg = ys[start:stop]
        keep.extend(sorted({start, start + int(seg.argmin()), start + int(seg.argmax()), stop - 1}))
    return xs[keep], ys[keep]
