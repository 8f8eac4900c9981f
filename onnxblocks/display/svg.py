"""Draw a :class:`~onnxblocks.display.scene.Scene` as standalone SVG text.

The SVG uses presentation attributes only (no ``<style>``, no scripts), so it
renders the same inline in Jupyter, in exported HTML and as an ``.svg`` file.
Hovering a box shows its details (an SVG ``<title>``). The primitives at the end
(:func:`svg_document`, :func:`svg_text`, :func:`svg_polyline`) serve other pictures
too, e.g. the runtime's loss curves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from xml.sax.saxutils import escape, quoteattr

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.display.layout import layered_layout
from onnxblocks.display.scene import Box, Scene

FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"
#: Approximate advance of one character at the title (12 px) and subtitle (10 px) sizes.
TITLE_CHAR = 7.3
SUB_CHAR = 6.1
CAPTION_CHAR = 6.8
TITLE_MAX = 36
SUB_MAX = 38
CAPTION_HEIGHT = 22.0
LEGEND_HEIGHT = 26.0

#: ``kind -> (fill, stroke, dash, corner radius, label)``.
STYLES: dict[str, tuple[str, str, str, float, str]] = {
    "forward": ("#dbeafe", "#2563eb", "", 4, "forward op"),
    "loss": ("#ede9fe", "#7c3aed", "", 4, "loss op"),
    "backward": ("#ffedd5", "#ea580c", "", 4, "gradient op"),
    "accumulation": ("#dcfce7", "#16a34a", "", 4, "accumulation"),
    "optimizer": ("#fce7f3", "#db2777", "", 4, "optimizer op"),
    "input": ("#ecfdf5", "#059669", "", 14, "input"),
    "output": ("#fef2f2", "#dc2626", "", 14, "output"),
    "param": ("#fef9c3", "#a16207", "", 2, "trainable / parameter"),
    "frozen": ("#f1f5f9", "#64748b", "4 3", 2, "frozen parameter"),
    "state": ("#f5f5f4", "#78716c", "2 2", 2, "gradient buffer / flag"),
    "value": ("#ffffff", "#94a3b8", "4 3", 14, "value from outside"),
    "group": ("#e0e7ff", "#4338ca", "", 8, "group of nodes"),
    "more": ("#f8fafc", "#94a3b8", "6 3", 8, "not drawn"),
}
_GROUP_FILLS = {
    "forward": "#dbeafe",
    "loss": "#ede9fe",
    "backward": "#ffedd5",
    "accumulation": "#dcfce7",
    "optimizer": "#fce7f3",
}


def shorten(text: str, limit: int) -> str:
    """Cut ``text`` in the middle with an ellipsis so it has at most ``limit`` characters."""
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: (keep + 1) // 2] + "…" + text[len(text) - keep // 2 :]


def box_size(box: Box) -> tuple[float, float]:
    """Width and height of a box from its labels."""
    title = shorten(box.title, TITLE_MAX)
    sub = shorten(box.subtitle, SUB_MAX)
    width = max(len(title) * TITLE_CHAR, len(sub) * SUB_CHAR) + 16
    height = 36.0 if sub else 24.0
    return max(width, 48.0), height


def scene_to_svg(scene: Scene, edges: str = "curved", caption: bool = True) -> str:
    """Lay out and draw a scene.

    Args:
        scene: What to draw.
        edges: ``"curved"``, ``"straight"`` or ``"orthogonal"``.
        caption: Write the scene's caption above the picture.

    Returns:
        SVG text (a complete ``<svg>`` element).

    Raises:
        ValueError: for an unknown edge style.
    """
    if edges not in ("curved", "straight", "orthogonal"):
        raise InvalidValueError(
            f"edges must be 'curved', 'straight' or 'orthogonal', not {edges!r}."
        )
    lines = [scene.caption, *scene.notes] if caption and scene.caption else []
    top = CAPTION_HEIGHT + 14.0 * (len(lines) - 1) if lines else 0.0
    if not scene.boxes:
        lines = [scene.caption, *scene.notes] if caption else scene.notes
        return _empty_svg(lines or ["(empty graph)"])
    keys = [b.key for b in scene.boxes]
    sizes = [box_size(b) for b in scene.boxes]
    lay = layered_layout(keys, sizes, scene.edges)
    kinds = []
    for b in scene.boxes:
        if b.kind not in kinds:
            kinds.append(b.kind)
    legend_w = sum(len(STYLES[k][4]) * SUB_CHAR + 34 for k in kinds) + 10
    width = max(
        lay.width, legend_w, max((len(line) for line in lines), default=0) * CAPTION_CHAR + 20
    )
    height = lay.height + top + LEGEND_HEIGHT
    parts: list[str] = []
    marker = _marker_id(scene)
    parts.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family={quoteattr(FONT)} font-size="10">'
    )
    parts.append(
        f'<defs><marker id="{marker}" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
        'markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" fill="#64748b"/></marker></defs>'
    )
    parts.append(f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>')
    for k, line in enumerate(lines):
        color = "#334155" if k == 0 else "#64748b"
        parts.append(
            f'<text x="10" y="{15 + 14 * k}" font-size="11" fill="{color}">{escape(line)}</text>'
        )
    dim = {b.key for b in scene.boxes if b.dim}
    parts.append(
        f'<g transform="translate(0,{top:.0f})" fill="none" stroke="#94a3b8" stroke-width="1.2">'
    )
    for src, dst, points in lay.edges:
        faded = ' opacity="0.35"' if src in dim or dst in dim else ""
        parts.append(f'<path d="{_path(points, edges)}" marker-end="url(#{marker})"{faded}/>')
    parts.append("</g>")
    parts.append(f'<g transform="translate(0,{top:.0f})">')
    for box in scene.boxes:
        x, y, w, h = lay.boxes[box.key]
        parts.append(_box_svg(box, x, y, w, h))
    parts.append("</g>")
    parts.append(_legend(kinds, height - LEGEND_HEIGHT + 4))
    parts.append("</svg>")
    return "".join(parts)


def _marker_id(scene: Scene) -> str:
    digest = hashlib.sha1(
        ("|".join(b.key for b in scene.boxes) + scene.caption).encode()
    ).hexdigest()
    return f"ob-arrow-{digest[:10]}"


def _path(points: list[tuple[float, float]], style: str) -> str:
    x0, y0 = points[0]
    d = [f"M{x0:.1f},{y0:.1f}"]
    for x1, y1 in points[1:]:
        if style == "straight":
            d.append(f"L{x1:.1f},{y1:.1f}")
        elif style == "orthogonal":
            mid = (y0 + y1) / 2
            d.append(f"V{mid:.1f}H{x1:.1f}V{y1:.1f}")
        else:
            dy = (y1 - y0) / 2
            d.append(f"C{x0:.1f},{y0 + dy:.1f} {x1:.1f},{y1 - dy:.1f} {x1:.1f},{y1:.1f}")
        x0, y0 = x1, y1
    return "".join(d)


def _box_svg(box: Box, x: float, y: float, w: float, h: float) -> str:
    fill, stroke, dash, radius, _ = STYLES.get(box.kind, STYLES["forward"])
    if box.kind == "group" and box.part in _GROUP_FILLS:
        fill = _GROUP_FILLS[box.part]
    stroke_width = 2.6 if box.emphasis else (1.8 if box.kind == "group" else 1.0)
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    opacity = ' opacity="0.4"' if box.dim else ""
    title = shorten(box.title, TITLE_MAX)
    sub = shorten(box.subtitle, SUB_MAX)
    cx = x + w / 2
    out = [f"<g{opacity}><title>{escape(box.tooltip or box.title)}</title>"]
    out.append(
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{radius}" '
        f'fill="{fill}" '
        f'stroke="{stroke}" stroke-width="{stroke_width}"{dash_attr}/>'
    )
    if box.kind == "group":  # a second outline marks a box that stands for many nodes
        out.append(
            f'<rect x="{x + 3:.1f}" y="{y + 3:.1f}" width="{w - 6:.1f}" height="{h - 6:.1f}" '
            f'rx="{max(radius - 2, 0)}" '
            f'fill="none" stroke="{stroke}" stroke-width="0.6"/>'
        )
    weight = (
        ' font-weight="bold"'
        if box.kind not in ("input", "output", "param", "frozen", "state", "value")
        else ""
    )
    if sub:
        out.append(
            f'<text x="{cx:.1f}" y="{y + 15:.1f}" text-anchor="middle" font-size="12" '
            f'fill="#0f172a"{weight}>'
            f"{escape(title)}</text>"
        )
        out.append(
            f'<text x="{cx:.1f}" y="{y + 29:.1f}" text-anchor="middle" '
            f'fill="#475569">{escape(sub)}</text>'
        )
    else:
        out.append(
            f'<text x="{cx:.1f}" y="{y + 16:.1f}" text-anchor="middle" font-size="12" '
            f'fill="#0f172a"{weight}>'
            f"{escape(title)}</text>"
        )
    out.append("</g>")
    return "".join(out)


def _legend(kinds: list[str], y: float) -> str:
    out = [f'<g transform="translate(10,{y:.0f})">']
    x = 0.0
    for kind in kinds:
        fill, stroke, dash, radius, label = STYLES.get(kind, STYLES["forward"])
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<rect x="{x:.0f}" y="2" width="18" height="12" rx="{min(radius, 6)}" fill="{fill}" '
            f'stroke="{stroke}"{dash_attr}/>'
        )
        out.append(f'<text x="{x + 23:.0f}" y="12" fill="#475569">{escape(label)}</text>')
        x += len(label) * SUB_CHAR + 34
    out.append("</g>")
    return "".join(out)


def _empty_svg(lines: list[str]) -> str:
    width = max(len(line) for line in lines) * SUB_CHAR + 24
    height = 18 * len(lines) + 16
    texts = "".join(
        f'<text x="12" y="{20 + 18 * k}" fill="#334155">{escape(line)}</text>'
        for k, line in enumerate(lines)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'viewBox="0 0 {width:.0f} {height}" font-family={quoteattr(FONT)} font-size="11">'
        f'<rect x="0" y="0" width="{width:.0f}" height="{height}" fill="#ffffff" '
        f'stroke="#e2e8f0"/>{texts}</svg>'
    )


# ------------------------------------------------------------ primitives
def svg_document(
    width: float, height: float, body: str, font_size: float = 10, background: str = "#ffffff"
) -> str:
    """Wrap ``body`` in a standalone ``<svg>`` element of ``width`` x ``height`` pixels.

    The root has the same attributes as :func:`scene_to_svg`'s (namespace, size,
    ``viewBox``, :data:`FONT`), and a background rectangle unless ``background`` is empty.

    Args:
        width: Width in pixels.
        height: Height in pixels.
        body: SVG elements to put inside.
        font_size: Default font size of the text inside, in pixels.
        background: Fill of the background rectangle (``""`` for none).

    Returns:
        SVG text (a complete ``<svg>`` element).
    """
    back = ""
    if background:
        back = (
            f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" '
            f"fill={quoteattr(background)}/>"
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family={quoteattr(FONT)} '
        f'font-size="{font_size:g}">'
        f"{back}{body}</svg>"
    )


def svg_text(
    x: float,
    y: float,
    text: str,
    size: float | None = None,
    fill: str = "#334155",
    anchor: str = "start",
    rotate: float = 0.0,
    bold: bool = False,
    limit: int | None = None,
) -> str:
    """One ``<text>`` element with its baseline at ``(x, y)``; ``text`` is escaped.

    Args:
        x: Anchor point, x.
        y: Baseline, y.
        text: The text (plain, not markup).
        size: Font size in pixels (default: the document's).
        fill: Text colour.
        anchor: ``"start"``, ``"middle"`` or ``"end"`` (SVG ``text-anchor``).
        rotate: Degrees to rotate the text about ``(x, y)`` (``-90`` reads bottom to top).
        bold: Bold text.
        limit: Shorten the text to this many characters (:func:`shorten`).

    Returns:
        The ``<text>`` element.
    """
    if limit is not None:
        text = shorten(text, limit)
    attrs = f'x="{x:.1f}" y="{y:.1f}"'
    if size is not None:
        attrs += f' font-size="{size:g}"'
    if anchor != "start":
        attrs += f' text-anchor="{anchor}"'
    if rotate:
        attrs += f' transform="rotate({rotate:g} {x:.1f} {y:.1f})"'
    if bold:
        attrs += ' font-weight="bold"'
    return f"<text {attrs} fill={quoteattr(fill)}>{escape(text)}</text>"


def svg_polyline(
    points: Iterable[tuple[float, float]],
    stroke: str,
    width: float = 1.0,
    opacity: float = 1.0,
    title: str = "",
) -> str:
    """An unfilled ``<polyline>`` through ``points`` (pixel coordinates, rounded to 0.1).

    Args:
        points: ``(x, y)`` pairs.
        stroke: Line colour.
        width: Line width in pixels.
        opacity: Line opacity, 0 to 1.
        title: Tooltip (an SVG ``<title>`` child), e.g. the series' name.

    Returns:
        The ``<polyline>`` element.
    """
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    faint = f' stroke-opacity="{opacity:g}"' if opacity < 1 else ""
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (
        f'<polyline points="{coords}" fill="none" stroke={quoteattr(stroke)} '
        f'stroke-width="{width:g}"{faint} '
        f'stroke-linejoin="round" stroke-linecap="round">{tip}</polyline>'
    )
