"""Loss curves and line plots: the SVG writer checked numerically, PNG through matplotlib, and life without it."""

from __future__ import annotations

import struct
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from onnxblocks.runtime import plot as plotting
from onnxblocks.runtime import plot_history, save_line_plot
from onnxblocks.runtime.fit import History

SVG = "{http://www.w3.org/2000/svg}"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: the SVG writer prints every pixel coordinate rounded to this step (``svg_polyline``)
PIXEL_STEP = 0.1


def assert_same_pixels(actual, expected, coordinates: int) -> None:
    """``actual`` and ``expected`` are one exact pixel value, up to the printing of the coordinates they come from.

    Not a float tolerance: each printed coordinate is within ``PIXEL_STEP / 2`` of the exact mapping, and the
    two sides together are made of ``coordinates`` of them (a difference of two points is two; a coefficient
    counts as many). The factor ``1 + 1e-9`` is the binary rounding of the parsed decimal strings.
    """
    bound = coordinates * PIXEL_STEP / 2 * (1 + 1e-9)
    gap = float(np.max(np.abs(np.asarray(actual, float) - np.asarray(expected, float))))
    assert gap <= bound, (
        f"{gap:.3g} px apart: more than the rounding of {coordinates} printed coordinates"
    )


def polylines(path) -> dict[str, np.ndarray]:
    """``{series label: [[x, y], ...]}`` of the polylines in an SVG file (label from the ``<title>``)."""
    root = ET.parse(path).getroot()
    out = {}
    for line in root.iter(SVG + "polyline"):
        title = line.find(SVG + "title")
        points = [[float(v) for v in pair.split(",")] for pair in line.get("points").split()]
        out[title.text if title is not None else ""] = np.array(points)
    return out


def texts(path) -> list[str]:
    return [t.text for t in ET.parse(path).getroot().iter(SVG + "text")]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def history(losses, eval_losses=(), epoch_ends=()) -> History:
    epochs = [{"epoch": i + 1, "eval_loss": v} for i, v in enumerate(eval_losses)]
    return History(losses=list(losses), epochs=epochs, epoch_ends=list(epoch_ends))


# --------------------------------------------------------------------- SVG
def test_svg_maps_the_data_monotonically(tmp_path):
    path = save_line_plot(
        tmp_path / "sub" / "p.svg",
        {"a": [3.0, 2.0, 1.5, 1.0], "b": ([0, 3], [1.0, 3.0])},
        title="Loss <&> 'q'",
        xlabel="step",
        ylabel="loss",
        width=400,
        height=300,
    )
    assert path == tmp_path / "sub" / "p.svg"
    root = ET.parse(path).getroot()
    assert (root.get("width"), root.get("height")) == ("400", "300")
    lines = polylines(path)
    a, b = lines["a"], lines["b"]
    assert len(a) == 4 and len(b) == 2
    assert np.all(np.diff(a[:, 0]) > 0)  # x grows with the step ...
    assert_same_pixels(np.diff(a[:, 0]), np.diff(a[:, 0])[0], coordinates=4)  # ... evenly
    assert np.all(np.diff(a[:, 1]) > 0)  # lower loss is drawn lower (SVG y grows downwards)
    assert a[0, 1] == min(a[:, 1].min(), b[:, 1].min())  # the highest loss is drawn highest
    assert_same_pixels(
        a[0], [b[0, 0], b[1, 1]], coordinates=2
    )  # one mapping for both series: (0, 3)
    assert_same_pixels(a[-1], [b[1, 0], b[0, 1]], coordinates=2)  # (3, 1)
    # linear: 3 -> 2 is twice 2 -> 1.5 in pixels (two coordinates on the left, twice two on the right)
    assert_same_pixels(a[1, 1] - a[0, 1], 2 * (a[2, 1] - a[1, 1]), coordinates=6)
    # everything inside the picture
    assert np.all((a >= 0) & (a <= [400, 300])) and np.all((b >= 0) & (b <= [400, 300]))
    # colours from the palette, escaped text, a legend
    strokes = {
        line.find(SVG + "title").text: line.get("stroke") for line in root.iter(SVG + "polyline")
    }
    assert strokes == {"a": "#1f77b4", "b": "#d62728"}
    assert {"Loss <&> 'q'", "step", "loss", "a", "b"} <= set(texts(path))


def test_svg_log_scale(tmp_path):
    values = [1000.0, 100.0, 10.0, 1.0]
    log = polylines(save_line_plot(tmp_path / "log.svg", {"v": values}, log_y=True))["v"]
    lin = polylines(save_line_plot(tmp_path / "lin.svg", {"v": values}))["v"]
    assert_same_pixels(
        np.diff(log[:, 1]), np.diff(log[:, 1])[0], coordinates=4
    )  # one decade, one spacing
    assert np.diff(lin[:, 1])[0] > 5 * np.diff(lin[:, 1])[1]
    assert {"1", "10", "100", "1000"} <= set(texts(tmp_path / "log.svg"))
    # log_y drops values <= 0 (their steps stay where they were)
    kept = polylines(
        save_line_plot(tmp_path / "drop.svg", {"v": [10.0, 0.0, -1.0, 1.0]}, log_y=True)
    )["v"]
    assert len(kept) == 2
    with pytest.raises(ValueError, match="no finite points.*log_y drops values <= 0"):
        save_line_plot(tmp_path / "none.svg", [-1.0, 0.0], log_y=True)
    assert not (tmp_path / "none.svg").exists()


def test_svg_skips_nan_and_inf(tmp_path):
    path = save_line_plot(tmp_path / "p.svg", [3.0, float("nan"), 2.0, float("inf"), 1.0])
    (points,) = polylines(path).values()
    assert len(points) == 3
    assert_same_pixels(
        points[1, 0] - points[0, 0], points[2, 0] - points[1, 0], coordinates=4
    )  # steps 0, 2, 4
    assert points[0, 1] < points[1, 1] < points[2, 1]
    with pytest.raises(ValueError, match="no finite points"):
        save_line_plot(tmp_path / "q.svg", [float("nan"), float("-inf")])
    with pytest.raises(ValueError, match="no finite points"):
        save_line_plot(tmp_path / "q.svg", {"a": []})
    with pytest.raises(ValueError, match="3 x values but 2 y values"):
        save_line_plot(tmp_path / "q.svg", {"a": ([0, 1, 2], [1.0, 2.0])})
    assert not (tmp_path / "q.svg").exists()


def test_svg_styles_single_points_and_long_series(tmp_path):
    path = save_line_plot(
        tmp_path / "p.svg",
        {"one": ([5], [2.0]), "many": [1.0, 3.0]},
        styles={"one": {"color": "#123456"}, "many": {"color": (0, 128, 255), "alpha": 0.3}},
    )
    root = ET.parse(path).getroot()
    (dot,) = root.iter(SVG + "circle")  # a single point is drawn as a dot
    assert dot.get("fill") == "#123456"
    many = next(p for p in root.iter(SVG + "polyline") if p.find(SVG + "title").text == "many")
    assert (many.get("stroke"), many.get("stroke-opacity")) == ("#0080ff", "0.3")
    # 100k points are thinned to a few per pixel column, keeping the extremes
    rng = np.random.default_rng(0)
    ys = rng.random(100_000)
    ys[12_345], ys[67_890] = 5.0, -4.0
    (points,) = polylines(save_line_plot(tmp_path / "long.svg", ys, width=600, height=300)).values()
    assert len(points) <= 4 * 600
    assert np.all(np.diff(points[:, 0]) >= 0)
    top, bottom = points[:, 1].argmin(), points[:, 1].argmax()
    assert (
        points[top, 0] < points[bottom, 0]
    )  # the maximum (step 12345) comes before the minimum (step 67890)


def test_plot_history_svg(tmp_path):
    h = history([4.0, 3.0, 2.0, 1.5, 1.2, 1.0], eval_losses=[2.5, 1.1], epoch_ends=[3, 6])
    lines = polylines(plot_history(h, tmp_path / "h.svg", title="run 1"))
    raw, smooth, evals = (
        lines["train loss (per step)"],
        lines["train loss (smoothed)"],
        lines["eval loss (per epoch)"],
    )
    assert len(raw) == len(smooth) == 6 and len(evals) == 2
    assert_same_pixels(
        smooth[0], raw[0], coordinates=2
    )  # the debiased average starts at the first loss
    assert np.all(np.diff(smooth[:, 1]) > 0)  # and falls with the loss
    assert_same_pixels(
        evals[:, 0], raw[[2, 5], 0], coordinates=2
    )  # eval losses at the epochs' last steps
    assert raw[1, 1] < evals[0, 1] < raw[2, 1]  # 3.0 > 2.5 > 2.0
    assert "run 1" in texts(tmp_path / "h.svg")
    # non-finite losses: skipped by both curves
    lines = polylines(
        plot_history(history([3.0, float("nan"), 2.0, float("inf"), 1.0]), tmp_path / "n.svg")
    )
    assert len(lines["train loss (per step)"]) == len(lines["train loss (smoothed)"]) == 3
    log = polylines(plot_history(history([100.0, 10.0, 1.0]), tmp_path / "log.svg", log_y=True))
    assert_same_pixels(*np.diff(log["train loss (per step)"][:, 1]), coordinates=4)


def test_plot_history_refuses_clearly(tmp_path):
    with pytest.raises(ValueError, match="no losses"):
        plot_history(history([]), tmp_path / "h.svg")
    with pytest.raises(ValueError, match="no finite points"):
        plot_history(history([float("nan")] * 3), tmp_path / "h.svg")
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\)"):
        plot_history(history([1.0, 2.0]), tmp_path / "h.svg", smoothing=1.0)
    with pytest.raises(ValueError, match=r"'.*h\.pdf'.*use a \.svg or \.png path"):
        plot_history(history([1.0, 2.0]), tmp_path / "h.pdf")
    with pytest.raises(ValueError, match="Unknown plot backend 'cairo'"):
        save_line_plot(tmp_path / "h.svg", [1.0], backend="cairo")
    assert list(tmp_path.iterdir()) == []


def test_ticks():
    assert plotting.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
    assert plotting.nice_ticks(2, 2) == [2] and plotting.nice_ticks(0, float("inf")) == []
    assert [plotting.format_tick(v) for v in (0, 2.5, 1e-5, 120000)] == [
        "0",
        "2.5",
        "1e-5",
        "1.2e5",
    ]


# --------------------------------------------------------------------- PNG
def test_png_through_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    assert plotting.default_suffix() == ".png"
    path = save_line_plot(
        tmp_path / "p.png",
        {"a": [3.0, 2.0, 1.5, 1.0], "b": ([0, 3], [1.0, 3.0])},
        title="Loss",
        xlabel="step",
        ylabel="loss",
        width=320,
        height=200,
        log_y=True,
    )
    assert png_size(path.read_bytes()) == (320, 200)
    h = history([4.0, 3.0, 2.0, 1.0], eval_losses=[2.5], epoch_ends=[4])
    assert png_size(plot_history(h, tmp_path / "h.PNG").read_bytes()) == (900, 540)
    # backend="matplotlib" draws SVG too
    svg = save_line_plot(tmp_path / "m.svg", [1.0, 2.0], backend="matplotlib")
    assert ET.parse(svg).getroot().tag == SVG + "svg" and b"Matplotlib" in svg.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "h.PNG",
        "m.svg",
        "p.png",
    ]  # no temporary files left


def test_png_never_touches_pyplot(tmp_path):
    pytest.importorskip("matplotlib")
    code = (
        f"import sys; from onnxblocks.runtime import save_line_plot; save_line_plot({str(tmp_path / 'p.png')!r}, "
        "[1.0, 2.0]); print('matplotlib.pyplot' in sys.modules)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "False" and (tmp_path / "p.png").read_bytes()[:8] == PNG_SIGNATURE


def test_png_failure_leaves_the_old_file(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    target = tmp_path / "p.png"
    target.write_bytes(b"old")

    def broken(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        save_line_plot(target, [1.0, 2.0])
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["p.png"]


# ------------------------------------------------------ without matplotlib
def test_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert plotting.default_suffix() == ".svg"
    with pytest.raises(
        ImportError, match=r"'.*loss\.png'.*install matplotlib or use a \.svg path"
    ) as caught:
        save_line_plot(tmp_path / "loss.png", [1.0, 2.0])
    assert caught.value.name == "matplotlib"
    with pytest.raises(ImportError, match="install matplotlib or use a .svg path"):
        plot_history(history([]), tmp_path / "loss.png")  # the format is checked first
    with pytest.raises(ImportError, match="install matplotlib or use backend='auto'"):
        save_line_plot(tmp_path / "loss.svg", [1.0, 2.0], backend="matplotlib")
    assert list(tmp_path.iterdir()) == []
    for backend in ("auto", "builtin"):
        path = plot_history(history([3.0, 2.0, 1.0]), tmp_path / f"{backend}.svg", backend=backend)
        assert set(polylines(path)) == {"train loss (per step)", "train loss (smoothed)"}
    with pytest.raises(ImportError, match="install matplotlib or use a .svg path"):
        plotting.check_plot_path(tmp_path / "x.png")
    assert plotting.check_plot_path(tmp_path / "x.SVG") == "svg"


def test_svg_primitives():
    from onnxblocks.display.svg import svg_document, svg_polyline, svg_text

    body = svg_text(
        5, 10, "a<b & 'c'", anchor="end", rotate=-90, bold=True, limit=5
    ) + svg_polyline([(0, 0), (1.5, 2.04)], "#ff0000", 2, 0.5, title="x<y")
    root = ET.fromstring(svg_document(30, 20, body))
    text, line = root.find(SVG + "text"), root.find(SVG + "polyline")
    assert (
        text.text == "a<…c'"
        and text.get("text-anchor") == "end"
        and "rotate(-90" in text.get("transform")
    )
    assert line.get("points") == "0.0,0.0 1.5,2.0"
    assert line.find(SVG + "title").text == "x<y" and line.get("stroke-opacity") == "0.5"
    assert root.get("viewBox") == "0 0 30 20" and root.find(SVG + "rect").get("fill") == "#ffffff"
    assert ET.fromstring(svg_document(1, 1, "", background="")).find(SVG + "rect") is None
