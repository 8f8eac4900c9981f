"""Line plots and loss curves: SVG with no extra dependency, PNG with matplotlib.

:func:`save_line_plot` draws one or more series with axes, ticks, a title and a
legend. The path's suffix picks the format:

- ``.svg`` always works: :mod:`onnxblocks.runtime.svg_plot` writes the SVG itself, with the
  primitives of :mod:`onnxblocks.display.svg` (polylines, escaped text);
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
from onnxblocks.runtime.svg_plot import _Data, _Styles, svg_plot
from onnxblocks.runtime.svg_plot import format_tick as format_tick
from onnxblocks.runtime.svg_plot import nice_ticks as nice_ticks

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

Series = Sequence[float] | np.ndarray | tuple[Sequence[float], Sequence[float]]


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
            ``"matplotlib"``: matplotlib for both. ``"builtin"``: the same as ``"auto"``
            (the built-in writer draws SVG only).

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
        text = svg_plot(data, full, (title, xlabel, ylabel), log_y, (width, height))
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
