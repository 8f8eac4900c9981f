"""Line plots saved as PNG, with numpy and zlib only (matplotlib is used when importable).

:func:`save_line_plot` draws one or more series with axes, ticks, a title and a
legend. With ``backend="auto"`` it uses matplotlib if it can be imported (nicer
fonts) and otherwise the built-in renderer: anti-aliased lines on a numpy canvas,
a 5x7 bitmap font, and a PNG encoder (:func:`encode_png`). Nothing here needs
a display or changes matplotlib's global state.

:func:`plot_history` turns a :class:`~onnxblocks.runtime.fit.History` into a
loss curve: the loss of every step (faint), its moving average, and the eval
loss at the end of each epoch.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Line colours, cycled over the series (RGB, 0-255).
PALETTE = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75))

# 5x7 bitmap font: 7 rows per glyph, 5 bits per row (bit 4 is the leftmost pixel).
# Lower-case letters are drawn as upper-case.
_FONT: dict[str, tuple[int, ...]] = {
    " ": (0, 0, 0, 0, 0, 0, 0),
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E),
    "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F),
    "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02),
    "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E),
    "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E),
    "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    "A": (0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "B": (0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E),
    "C": (0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E),
    "D": (0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C),
    "E": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F),
    "F": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10),
    "G": (0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F),
    "H": (0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "I": (0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "J": (0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C),
    "K": (0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11),
    "L": (0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F),
    "M": (0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11),
    "N": (0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11),
    "O": (0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "P": (0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10),
    "Q": (0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D),
    "R": (0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11),
    "S": (0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E),
    "T": (0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04),
    "U": (0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "V": (0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "W": (0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A),
    "X": (0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11),
    "Y": (0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04),
    "Z": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F),
    ".": (0, 0, 0, 0, 0, 0x0C, 0x0C),
    ",": (0, 0, 0, 0, 0x0C, 0x04, 0x08),
    "-": (0, 0, 0, 0x0E, 0, 0, 0),
    "+": (0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0),
    ":": (0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0),
    "/": (0, 0x01, 0x02, 0x04, 0x08, 0x10, 0),
    "(": (0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02),
    ")": (0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08),
    "[": (0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E),
    "]": (0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E),
    "%": (0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03),
    "=": (0, 0, 0x1F, 0, 0x1F, 0, 0),
    "_": (0, 0, 0, 0, 0, 0, 0x1F),
    "<": (0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02),
    ">": (0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08),
    "'": (0x04, 0x04, 0x08, 0, 0, 0, 0),
    "?": (0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04),
    "#": (0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A),
}
_GLYPH_W, _GLYPH_H = 5, 7

Series = Sequence[float] | tuple[Sequence[float], Sequence[float]]


# ---------------------------------------------------------------------- PNG
def encode_png(image: np.ndarray) -> bytes:
    """Encode an ``[height, width, 3]`` uint8 RGB array as PNG bytes.

    Raises:
        ValueError: if the array is not ``[h, w, 3]`` uint8.
    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"encode_png takes an [height, width, 3] uint8 array, got {image.dtype} {image.shape}.")
    height, width = image.shape[:2]
    raw = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw.tobytes(), 9)) + \
        chunk(b"IEND", b"")


def decode_png(data: bytes) -> np.ndarray:
    """Decode a PNG written by :func:`encode_png` (8-bit RGB, filter 0) back to an array."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            if (depth, color) != (8, 2):
                raise ValueError("decode_png reads 8-bit RGB PNGs only")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * 3)
    if rows[:, 0].any():
        raise ValueError("decode_png reads unfiltered PNGs only")
    return rows[:, 1:].reshape(height, width, 3).copy()


# ------------------------------------------------------------------ canvas
class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.pixels = np.ones((height, width, 3), np.float32)
        self.width, self.height = width, height

    def fill(self, x0: int, y0: int, x1: int, y1: int, color: Sequence[float]) -> None:
        x0, x1 = max(0, x0), min(self.width, x1)
        y0, y1 = max(0, y0), min(self.height, y1)
        if x0 < x1 and y0 < y1:
            self.pixels[y0:y1, x0:x1] = color

    def polyline(self, xs: np.ndarray, ys: np.ndarray, color: Sequence[float], width: float,
                 clip: tuple[int, int, int, int]) -> None:
        """Anti-aliased polyline: each pixel's coverage falls off with its distance to the segment."""
        radius = width / 2.0
        col = np.asarray(color, np.float32)
        cx0, cy0, cx1, cy1 = clip
        for i in range(max(1, len(xs) - 1)):
            ax, ay = xs[i], ys[i]
            bx, by = (xs[i + 1], ys[i + 1]) if len(xs) > 1 else (ax, ay)
            if not all(map(math.isfinite, (ax, ay, bx, by))):
                continue
            x0 = max(cx0, math.floor(min(ax, bx) - radius - 1))
            x1 = min(cx1, math.ceil(max(ax, bx) + radius + 1))
            y0 = max(cy0, math.floor(min(ay, by) - radius - 1))
            y1 = min(cy1, math.ceil(max(ay, by) + radius + 1))
            if x0 >= x1 or y0 >= y1:
                continue
            px, py = np.meshgrid(np.arange(x0, x1) + 0.5, np.arange(y0, y1) + 0.5)
            dx, dy = bx - ax, by - ay
            length2 = dx * dx + dy * dy
            t = np.clip(((px - ax) * dx + (py - ay) * dy) / length2, 0.0, 1.0) if length2 > 0 else 0.0
            dist = np.hypot(px - (ax + t * dx), py - (ay + t * dy))
            alpha = np.clip(radius + 0.5 - dist, 0.0, 1.0)[..., None]
            region = self.pixels[y0:y1, x0:x1]
            self.pixels[y0:y1, x0:x1] = region * (1 - alpha) + col * alpha

    def text(self, x: int, y: int, text: str, color: Sequence[float] = (0.1, 0.1, 0.1), scale: int = 2,
             anchor: str = "left", vertical: bool = False) -> None:
        """Draw ``text`` with its top-left corner (or centre/right for ``anchor``) at ``(x, y)``."""
        glyphs = [_FONT.get(ch.upper(), _FONT["?"]) for ch in text]
        if not glyphs:
            return
        bitmap = np.zeros((_GLYPH_H, len(glyphs) * (_GLYPH_W + 1) - 1), bool)
        for i, rows in enumerate(glyphs):
            for r, bits in enumerate(rows):
                for c in range(_GLYPH_W):
                    if bits & (1 << (_GLYPH_W - 1 - c)):
                        bitmap[r, i * (_GLYPH_W + 1) + c] = True
        bitmap = np.kron(bitmap, np.ones((scale, scale), bool))
        if vertical:
            bitmap = np.rot90(bitmap)
        h, w = bitmap.shape
        if anchor == "center":
            x -= w // 2
        elif anchor == "right":
            x -= w
        if vertical:
            y -= h // 2
        ys, xs = np.nonzero(bitmap)
        ys, xs = ys + y, xs + x
        keep = (xs >= 0) & (xs < self.width) & (ys >= 0) & (ys < self.height)
        self.pixels[ys[keep], xs[keep]] = color

    def to_uint8(self) -> np.ndarray:
        return np.clip(np.round(self.pixels * 255), 0, 255).astype(np.uint8)


def text_width(text: str, scale: int = 2) -> int:
    """Width in pixels of ``text`` in the built-in font."""
    return max(0, len(text) * (_GLYPH_W + 1) - 1) * scale


# ------------------------------------------------------------------- ticks
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
    """Short label for a tick value: ``0.001``, ``2.5``, ``1e-05``, ``12000``."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        mantissa, exponent = f"{value:.1e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.4g}"


# -------------------------------------------------------------------- plot
def save_line_plot(
    path: str | os.PathLike,
    series: Mapping[str, Series] | Series,
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    log_y: bool = False,
    width: int = 900,
    height: int = 540,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    backend: str = "auto",
) -> Path:
    """Save a line plot of one or more series as a PNG file.

    Args:
        path: The ``.png`` file to write (its directory is created).
        series: ``{label: ys}`` or ``{label: (xs, ys)}``, or one unnamed ``ys``.
            Without ``xs`` the points are at 0, 1, 2 ...
        title: Title above the plot.
        xlabel: Label of the x axis.
        ylabel: Label of the y axis.
        log_y: Logarithmic y axis (non-positive values are dropped).
        width: Image width in pixels.
        height: Image height in pixels.
        styles: Per-label ``{"color": (r, g, b), "width": px, "alpha": 0..1}``.
        backend: ``"auto"`` (matplotlib if importable), ``"builtin"`` or ``"matplotlib"``.

    Returns:
        The path written.

    Raises:
        ValueError: for an unknown backend, empty data, or xs and ys of different lengths.
        ImportError: for ``backend="matplotlib"`` when matplotlib is not installed.
    """
    if backend not in ("auto", "builtin", "matplotlib"):
        raise ValueError(f"Unknown plot backend {backend!r}: use 'auto', 'builtin' or 'matplotlib'.")
    data = _normalize(series, log_y)
    styles = {k: dict(v) for k, v in (styles or {}).items()}
    for i, label in enumerate(data):
        style = styles.setdefault(label, {})
        style.setdefault("color", PALETTE[i % len(PALETTE)])
        style.setdefault("width", 2.0)
        style.setdefault("alpha", 1.0)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if backend != "builtin":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            if backend == "matplotlib":
                raise
        else:
            _render_matplotlib(out, data, styles, title, xlabel, ylabel, log_y, width, height)
            return out
    image = render_line_plot(data, styles, title, xlabel, ylabel, log_y, width, height)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(encode_png(image))
    os.replace(tmp, out)
    return out


def _normalize(series: Mapping[str, Series] | Series, log_y: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if not isinstance(series, Mapping):
        series = {"": series}
    data = {}
    for label, values in series.items():
        if isinstance(values, tuple) and len(values) == 2 and np.ndim(values[0]) == 1 and np.ndim(values[1]) == 1:
            xs, ys = np.asarray(values[0], np.float64), np.asarray(values[1], np.float64)
        else:
            ys = np.asarray(values, np.float64).reshape(-1)
            xs = np.arange(len(ys), dtype=np.float64)
        if xs.shape != ys.shape:
            raise ValueError(f"series '{label}': {len(xs)} x values but {len(ys)} y values.")
        keep = np.isfinite(xs) & np.isfinite(ys) & ((ys > 0) if log_y else True)
        data[label] = (xs[keep], ys[keep])
    if not any(len(xs) for xs, _ in data.values()):
        raise ValueError("save_line_plot: no finite points to plot" + (" (log_y drops values <= 0)." if log_y else "."))
    return data


def render_line_plot(
    data: Mapping[str, tuple[np.ndarray, np.ndarray]],
    styles: Mapping[str, Mapping[str, Any]],
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    log_y: bool = False,
    width: int = 900,
    height: int = 540,
) -> np.ndarray:
    """Render a plot with the built-in renderer and return it as an ``[h, w, 3]`` uint8 array."""
    canvas = _Canvas(width, height)
    scale = 2
    left, right, top, bottom = 20 + 10 * (_GLYPH_W + 1) + 8, 24, 24 + (_GLYPH_H * scale + 16 if title else 0), 70
    px0, px1, py0, py1 = left, width - right, top, height - bottom
    all_x = np.concatenate([xs for xs, _ in data.values()])
    all_y = np.concatenate([ys for _, ys in data.values()])
    tx = np.log10(all_y) if log_y else all_y
    x_lo, x_hi = float(all_x.min()), float(all_x.max())
    y_lo, y_hi = float(tx.min()), float(tx.max())
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    pad = (y_hi - y_lo) * 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad

    def sx(x: np.ndarray) -> np.ndarray:
        return px0 + (x - x_lo) / (x_hi - x_lo) * (px1 - px0)

    def sy(y: np.ndarray) -> np.ndarray:
        return py1 - (y - y_lo) / (y_hi - y_lo) * (py1 - py0)

    grid, ink = (0.9, 0.9, 0.9), (0.15, 0.15, 0.15)
    if log_y:
        yticks = [float(e) for e in range(math.ceil(y_lo), math.floor(y_hi) + 1)]
        if len(yticks) < 2:
            yticks = [math.log10(v) for v in nice_ticks(10**y_lo, 10**y_hi) if v > 0]
        ylabels = [format_tick(10**t) for t in yticks]
    else:
        yticks = nice_ticks(y_lo, y_hi)
        ylabels = [format_tick(t) for t in yticks]
    xticks = nice_ticks(x_lo, x_hi, count=max(3, (px1 - px0) // 110))
    for t, label in zip(yticks, ylabels, strict=False):
        y = round(float(sy(np.float64(t))))
        if py0 <= y <= py1:
            canvas.fill(px0, y, px1, y + 1, grid)
            canvas.text(px0 - 8, y - _GLYPH_H + 1, label, ink, scale=1 if len(label) > 9 else scale, anchor="right")
    for t in xticks:
        x = round(float(sx(np.float64(t))))
        if px0 <= x <= px1:
            canvas.fill(x, py0, x + 1, py1, grid)
            canvas.fill(x, py1, x + 1, py1 + 5, ink)
            canvas.text(x, py1 + 10, format_tick(t), ink, scale=scale, anchor="center")
    for label, (xs, ys) in data.items():
        if not len(xs):
            continue
        style = styles[label]
        xs_px, ys_px = _decimate(sx(xs), sy(np.log10(ys) if log_y else ys), px1 - px0)
        color = np.asarray(style["color"], np.float32) / 255.0
        alpha = float(style["alpha"])
        color = color * alpha + (1 - alpha)  # faint lines: blend towards the white background
        canvas.polyline(xs_px, ys_px, color, float(style["width"]), (px0, py0, px1 + 1, py1 + 1))
    canvas.fill(px0, py0, px1 + 1, py0 + 1, ink)
    canvas.fill(px0, py1, px1 + 1, py1 + 1, ink)
    canvas.fill(px0, py0, px0 + 1, py1 + 1, ink)
    canvas.fill(px1, py0, px1 + 1, py1 + 1, ink)
    if title:
        canvas.text(width // 2, 16, title, ink, scale=scale, anchor="center")
    if xlabel:
        canvas.text((px0 + px1) // 2, height - 8 - _GLYPH_H * scale, xlabel, ink, scale=scale, anchor="center")
    if ylabel:
        canvas.text(6, (py0 + py1) // 2, ylabel, ink, scale=scale, vertical=True)
    labels = [lb for lb in data if lb]
    if labels:
        box_w = max(text_width(lb, scale) for lb in labels) + 44
        box_h = len(labels) * (_GLYPH_H * scale + 8) + 8
        bx, by = px1 - box_w - 10, py0 + 10
        canvas.fill(bx, by, bx + box_w, by + box_h, (1, 1, 1))
        canvas.fill(bx, by, bx + box_w, by + 1, grid)
        canvas.fill(bx, by + box_h - 1, bx + box_w, by + box_h, grid)
        for i, label in enumerate(labels):
            y = by + 8 + i * (_GLYPH_H * scale + 8) + _GLYPH_H * scale // 2
            alpha = float(styles[label]["alpha"])
            color = np.asarray(styles[label]["color"], np.float32) / 255.0 * alpha + (1 - alpha)
            canvas.fill(bx + 8, y - 1, bx + 30, y + 2, color)
            canvas.text(bx + 36, y - _GLYPH_H * scale // 2, label, ink, scale=scale)
    return canvas.to_uint8()


def _decimate(xs: np.ndarray, ys: np.ndarray, pixels: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most ~4 points per pixel column (first, min, max, last), so long curves draw fast."""
    if len(xs) <= 4 * max(1, pixels):
        return xs, ys
    columns = np.floor(xs - xs.min()).astype(np.int64)
    keep: list[int] = []
    bounds = np.flatnonzero(np.diff(columns)) + 1
    for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(xs)], strict=False):
        seg = ys[start:stop]
        idx = sorted({start, start + int(seg.argmin()), start + int(seg.argmax()), stop - 1})
        keep.extend(idx)
    return xs[keep], ys[keep]


def _render_matplotlib(
    path: Path,
    data: Mapping[str, tuple[np.ndarray, np.ndarray]],
    styles: Mapping[str, Mapping[str, Any]],
    title: str,
    xlabel: str,
    ylabel: str,
    log_y: bool,
    width: int,
    height: int,
) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 100
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for label, (xs, ys) in data.items():
        style = styles[label]
        axes.plot(xs, ys, label=label or None, color=np.asarray(style["color"]) / 255.0,
                  linewidth=float(style["width"]) * 0.75, alpha=float(style["alpha"]))
    if log_y:
        axes.set_yscale("log")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, color="0.9")
    if any(data):
        axes.legend()
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png")
    os.replace(tmp, path)


def plot_history(
    history: Any,
    path: str | os.PathLike,
    title: str = "Training loss",
    smoothing: float = 0.9,
    log_y: bool = False,
    backend: str = "auto",
) -> Path:
    """Save the loss curve of a :class:`~onnxblocks.runtime.fit.History` as a PNG.

    Plots the loss of every ``train_step`` (faint), its debiased exponential
    moving average (weight ``smoothing`` on the past), and, when recorded, the eval loss
    at the last step of each epoch.

    Returns:
        The path written.
    """
    losses = np.asarray(history.losses, np.float64)
    series: dict[str, Series] = {"train loss (per step)": losses}
    styles: dict[str, dict[str, Any]] = {"train loss (per step)": {"color": PALETTE[0], "alpha": 0.3, "width": 1.5}}
    if len(losses) > 1:
        smooth = np.empty_like(losses)
        acc = 0.0
        for i, v in enumerate(losses):  # debiased exponential moving average
            acc = smoothing * acc + (1 - smoothing) * v
            smooth[i] = acc / (1 - smoothing ** (i + 1))
        series["train loss (smoothed)"] = smooth
        styles["train loss (smoothed)"] = {"color": PALETTE[0], "width": 2.5}
    eval_losses = [e.get("eval_loss") for e in history.epochs]
    if any(v is not None for v in eval_losses):
        ends = list(getattr(history, "epoch_ends", []))
        if len(ends) != len(eval_losses):
            per_epoch = len(losses) / max(1, len(eval_losses))
            ends = [round(per_epoch * (i + 1)) for i in range(len(eval_losses))]
        xs = [end - 1 for end, v in zip(ends, eval_losses, strict=False) if v is not None]
        ys = [v for v in eval_losses if v is not None]
        series["eval loss (per epoch)"] = (xs, ys)
        styles["eval loss (per epoch)"] = {"color": PALETTE[1], "width": 2.5}
    return save_line_plot(path, series, title=title, xlabel="step", ylabel="loss", log_y=log_y, styles=styles,
                          backend=backend)
