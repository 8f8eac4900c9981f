"""Line plots and loss curves: SVG with no extra dependency, PNG with matplotlib.

:func:`save_line_plot` draws one or more series with axes, ticks, a title and a
legend. The path's suffix picks the format:

- ``.svg`` always works: this module writes the SVG itself, with the primitives
  of :mod:`onnxblocks.display.svg` (polylines, escaped text);
- ``.png`` is drawn by matplotlib on a :class:`matplotlib.figure.Figure` (Agg canvas, never
  pyplot); without matplotlib it raises an ``ImportError`` saying to install it or use ``.svg``.

Where the library picks the file name itself (``onnxblocks demo``),
:func:`default_suffix` decides: ``.png`` when matplotlib can be imported, else
``.svg``. Files are replaced atomically (:func:`onnxblocks.io.atomic_file`).

:func:`plot_history` draws a :class:`~onnxblocks.runtime.fit.History`: every step's loss
(faint), its moving average, and the eval loss at the end of each epoch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.errors import InvalidValueError, MissingDependencyError

#: Line colours, cycled over the series (RGB, 0-255).
PALETTE = (
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
)
#: File suffixes :func:`save_line_plot` writes, and the format of each.
FORMATS = {".svg": "svg", ".png": "png"}
BACKENDS = ("auto", "builtin", "matplotlib")

# advance of one character of the monospace font at 12 px (onnxblocks.display.svg.TITLE_CHAR)
_CHAR = 7.3
_INK, _GRID, _MUTED = "#1e293b", "#e2e8f0", "#475569"

Series = Sequence[float] | np.ndarray | tuple[Sequence[float], Sequence[float]]
Color = tuple[int, int, int] | str
_Data = Mapping[str, tuple[np.ndarray, np.ndarray]]
_Styles = Mapping[str, Mapping[str, Any]]


# ------------------------------------------------------------------ format
def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def default_suffix() -> str:
    """The suffix of a plot file whose name the library picks: ``".png"`` with matplotlib, else
    ``".svg"``.
    """
    return ".png" if _have_matplotlib() else ".svg"


def check_plot_path(path: str | os.PathLike, backend: str = "auto") -> str:
    """Check that :func:`save_line_plot` can write ``path``, and return its format.

    Cheap enough to call before long work (e.g. training) whose result is to be plotted.

    Args:
        path: The plot file.
        backend: As in :func:`save_line_plot`.

    Returns:
        ``"svg"`` or ``"png"``.

    Raises:
        ValueError: for an unknown backend, or a suffix other than ``.svg`` and ``.png``.
        ImportError: when the file needs matplotlib (a ``.png`` path, or ``backend="matplotlib"``)
            and it is not installed.
    """
    if backend not in BACKENDS:
        raise InvalidValueError(
            f"Unknown plot backend {backend!r}: use 'auto', 'builtin' or 'matplotlib'."
        )
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InvalidValueError(
            f"Cannot write the plot '{path}': its suffix picks the format; use a .svg or .png path."
        )
    if (fmt == "png" or backend == "matplotlib") and not _have_matplotlib():
        hint = (
            "install matplotlib or use a .svg path"
            if fmt == "png"
            else "install matplotlib or use backend='auto'"
        )
        raise MissingDependencyError(
            f"Cannot write the plot '{path}': it needs matplotlib, which is not installed; {hint}.",
            name="matplotlib",
        )
    return fmt


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
    """Short label for a tick value: ``0.001``, ``2.5``, ``1e-5``, ``1.2e5``."""
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
    """Save a line plot of one or more series as an SVG or PNG file (the suffix decides).

    Points with a NaN or infinite coordinate are skipped (with ``log_y``, also
    values <= 0); a plot with no point left is refused.

    Args:
        path: The ``.svg`` or ``.png`` file to write (its directory is created).
        series: ``{label: ys}`` or ``{label: (xs, ys)}``, or one unnamed ``ys``.
            Without ``xs`` the points are at 0, 1, 2 ...
        title: Title above the plot.
        xlabel: Label of the x axis.
        ylabel: Label of the y axis.
        log_y: Logarithmic y axis.
        width: Image width in pixels.
        height: Image height in pixels.
        styles: Per-label ``{"color": (r, g, b) or "#rrggbb", "width": px, "alpha": 0..1}``.
        backend: ``"auto"``: the built-in writer for ``.svg``, matplotlib for ``.png``.
            ``"matplotlib"``: matplotlib for both. ``"builtin"``: kept from the time a
            built-in PNG renderer existed; now the same as ``"auto"``.

    Returns:
        The path written.

    Raises:
        ValueError: for an unknown backend or suffix, no finite points, or xs and ys of different
        lengths.
        ImportError: when the file needs matplotlib and it is not installed (see
        :func:`check_plot_path`).
    """
    from onnxblocks.io import atomic_file

    fmt = check_plot_path(path, backend)
    data = _normalize(series, log_y)
    full = _full_styles(data, styles)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "svg" and backend != "matplotlib":
        text = _svg_plot(data, full, (title, xlabel, ylabel), log_y, (width, height))
        with atomic_file(out) as temp:
            temp.write_text(text, encoding="utf-8")
        return out
    figure = _matplotlib_figure(data, full, (title, xlabel, ylabel), log_y, (width, height))
    with atomic_file(out) as temp:
        figure.savefig(temp, format=fmt, dpi=100)
    return out


def _normalize(series: Mapping[str, Series] | Series, log_y: bool) -> _Data:
    if not isinstance(series, Mapping):
        series = {"": series}
    data = {}
    for label, values in series.items():
        if (
            isinstance(values, tuple)
            and len(values) == 2
            and np.ndim(values[0]) == 1
            and np.ndim(values[1]) == 1
        ):
            xs, ys = np.asarray(values[0], np.float64), np.asarray(values[1], np.float64)
        else:
            ys = np.asarray(values, np.float64).reshape(-1)
            xs = np.arange(len(ys), dtype=np.float64)
        if xs.shape != ys.shape:
            raise InvalidValueError(f"series '{label}': {len(xs)} x values but {len(ys)} y values.")
        keep = np.isfinite(xs) & np.isfinite(ys) & ((ys > 0) if log_y else True)
        data[label] = (xs[keep], ys[keep])
    if not any(len(xs) for xs, _ in data.values()):
        suffix = " (log_y drops values <= 0)." if log_y else "."
        raise InvalidValueError("save_line_plot: no finite points to plot" + suffix)
    return data


def _full_styles(
    data: Mapping[str, Any], styles: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict]:
    """``styles`` with a colour (from :data:`PALETTE`), a width and an alpha for every series."""
    full = {k: dict(v) for k, v in (styles or {}).items()}
    for i, label in enumerate(data):
        style = full.setdefault(label, {})
        style.setdefault("color", PALETTE[i % len(PALETTE)])
        style.setdefault("width", 2.0)
        style.setdefault("alpha", 1.0)
    return full


def _css(color: Color) -> str:
    if isinstance(color, str):
        return color
    r, g, b = (round(c) for c in color)
    return f"#{r:02x}{g:02x}{b:02x}"


def _svg_plot(
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


def _matplotlib_figure(
    data: _Data, styles: _Styles, texts: tuple[str, str, str], log_y: bool, size: tuple[int, int]
) -> Any:
    """A :class:`matplotlib.figure.Figure` on an Agg canvas (no pyplot, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    (title, xlabel, ylabel), (width, height), dpi = texts, size, 100
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="tight")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for label, (xs, ys) in data.items():
        style = styles[label]
        color = (
            style["color"]
            if isinstance(style["color"], str)
            else np.asarray(style["color"]) / 255.0
        )
        axes.plot(
            xs,
            ys,
            label=label or None,
            color=color,
            linewidth=float(style["width"]) * 0.75,
            alpha=float(style["alpha"]),
            marker="o" if len(xs) == 1 else None,
        )
    if log_y:
        axes.set_yscale("log")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, color="0.9")
    if any(data):
        axes.legend()
    return figure


def plot_history(
    history: Any,
    path: str | os.PathLike,
    title: str = "Training loss",
    smoothing: float = 0.9,
    log_y: bool = False,
    backend: str = "auto",
) -> Path:
    """Save the loss curve of a :class:`~onnxblocks.runtime.fit.History` as SVG or PNG (see
    :func:`save_line_plot`).

    Plots the loss of every ``train_step`` (faint), its debiased exponential
    moving average (weight ``smoothing`` on the past; non-finite losses are
    skipped), and, when recorded, the eval loss at the last step of each epoch.

    Args:
        history: What :func:`~onnxblocks.runtime.fit` returned.
        path: The ``.svg`` or ``.png`` file to write.
        title: Title above the plot.
        smoothing: Weight of the past in the moving average, in ``[0, 1)``.
        log_y: Logarithmic loss axis.
        backend: As in :func:`save_line_plot`.

    Returns:
        The path written.

    Raises:
        ValueError: if the history has no losses, none is finite, or ``smoothing`` is outside ``[0,
        1)``.
        ImportError: for a ``.png`` path without matplotlib.
    """
    check_plot_path(path, backend)
    if not 0 <= smoothing < 1:
        raise InvalidValueError(f"plot_history: smoothing must be in [0, 1), got {smoothing}.")
    losses = np.asarray(history.losses, np.float64).reshape(-1)
    if not len(losses):
        raise InvalidValueError(
            f"Cannot plot '{path}': the history has no losses (no training step was recorded)."
        )
    series: dict[str, Series] = {"train loss (per step)": losses}
    styles: dict[str, dict[str, Any]] = {
        "train loss (per step)": {"color": PALETTE[0], "alpha": 0.3, "width": 1.5}
    }
    if len(losses) > 1:
        smooth = np.full_like(losses, np.nan)
        acc, seen = 0.0, 0
        for i, v in enumerate(losses):  # debiased exponential moving average over the finite losses
            if math.isfinite(v):
                acc, seen = smoothing * acc + (1 - smoothing) * v, seen + 1
                smooth[i] = acc / (1 - smoothing**seen)
        series["train loss (smoothed)"] = smooth
        styles["train loss (smoothed)"] = {"color": PALETTE[0], "width": 2.5}
    eval_losses = [e.get("eval_loss") for e in history.epochs]
    if any(v is not None for v in eval_losses):
        ends = list(getattr(history, "epoch_ends", []))
        if len(ends) != len(eval_losses):
            per_epoch = len(losses) / max(1, len(eval_losses))
            ends = [round(per_epoch * (i + 1)) for i in range(len(eval_losses))]
        xs = [end - 1 for end, v in zip(ends, eval_losses, strict=True) if v is not None]
        ys = [v for v in eval_losses if v is not None]
        series["eval loss (per epoch)"] = (xs, ys)
        styles["eval loss (per epoch)"] = {"color": PALETTE[1], "width": 2.5}
    return save_line_plot(
        path,
        series,
        title=title,
        xlabel="step",
        ylabel="loss",
        log_y=log_y,
        styles=styles,
        backend=backend,
    )
