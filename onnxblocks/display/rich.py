"""Rich display: an HTML summary and an inline SVG picture for onnxblocks objects.

:func:`show` accepts a ``ModelProto``, a model file or artifacts directory path,
a :class:`~onnxblocks.blocks.ModelAccessor`, a built
:class:`~onnxblocks.blocks.Block`, a ``TrainingBlock``, or an ``Artifacts``
result, and returns a :class:`Display` that Jupyter renders.

Dispatch is by registration: :func:`show` is a :func:`functools.singledispatch`
function, and each kind of object registers its renderer (the training and
artifact renderers live in :mod:`onnxblocks.display.training`). The core classes
know nothing of this module: :func:`register_html` registers :func:`repr_html`
with :mod:`onnxblocks._core.html`, which their ``_repr_html_`` asks.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import onnx

from onnxblocks._core import html as _html
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.block import Block, added_nodes
from onnxblocks.display.graph import GraphIndex, TensorInfo, type_shape
from onnxblocks.display.scene import MAX_NODES, build_scene
from onnxblocks.display.summary import BOX, TABLE, TD, TH, summary_table
from onnxblocks.display.svg import scene_to_svg
from onnxblocks.display.views import select
from onnxblocks.losses import Loss

PICTURE = "overflow:auto;max-height:640px;border:1px solid #e2e8f0;margin:4px 0;background:#ffffff"


class Display:
    """A rendered display: HTML (summary and picture) and the picture alone as SVG.

    Jupyter calls :meth:`_repr_html_`; front ends that prefer images call
    :meth:`_repr_svg_`. :meth:`save` writes either to a file.

    Attributes:
        html: The complete HTML fragment.
        svg: The main picture as SVG text.
    """

    def __init__(self, html: str, svg: str) -> None:
        self.html = html
        self.svg = svg

    def _repr_html_(self) -> str:
        return self.html

    def _repr_svg_(self) -> str | None:
        return self.svg or None

    def __repr__(self) -> str:
        return (
            f"<onnxblocks Display: {len(self.html):,} chars of HTML, {len(self.svg):,} chars of "
            "SVG>"
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the picture (``.svg``) or the whole display (``.html``) to ``path``.

        Raises:
            ValueError: if the suffix is neither ``.svg`` nor ``.html``.
        """
        target = Path(path)
        if target.suffix.lower() == ".svg":
            target.write_text(self.svg, encoding="utf-8")
        elif target.suffix.lower() in (".html", ".htm"):
            target.write_text(
                "<!DOCTYPE html><html><head><meta "
                f'charset="utf-8"></head><body>{self.html}</body></html>',
                encoding="utf-8",
            )
        else:
            raise InvalidValueError(
                f"Cannot save a display as '{target.suffix}': use a .svg or .html file name."
            )
        return target


# ---------------------------------------------------------------- pictures
def draw_svg(
    model: onnx.ModelProto | GraphIndex,
    view: str = "full",
    *,
    nodes: Iterable[str] | None = None,
    around: str | Sequence[str] | None = None,
    depth: int = 1,
    context: int = 0,
    max_nodes: int = MAX_NODES,
    params: bool | None = None,
    edges: str = "curved",
    engine: str = "python",
    trainable: Iterable[str] | None = None,
    frozen: Iterable[str] | None = None,
    caption: bool = True,
) -> str:
    """Draw (part of) a model's graph as SVG.

    Args:
        model: The model (weight bytes are not read), or a :class:`GraphIndex`.
        view: ``"full"``, ``"forward"``, ``"loss"``, ``"backward"`` or ``"optimizer"``.
        nodes: Draw only these nodes (names; ``"#<index>"`` for unnamed nodes).
        around: Draw the neighbourhood of this node or value (e.g. a parameter).
        depth: Hops around ``around``.
        context: Hops of neighbours to add, faded, around the selected nodes.
        max_nodes: The most boxes to draw; larger graphs are grouped by name scope,
            repeated blocks and chains, then cut.
        params: Draw parameter boxes (default: when they fit).
        edges: ``"curved"``, ``"straight"`` or ``"orthogonal"``.
        engine: ``"python"`` (built-in layout) or ``"dot"`` (graphviz, when on PATH;
            otherwise a warning and the built-in layout).
        trainable: Names of trainable parameters (else guessed).
        frozen: Names of frozen parameters (else guessed).
        caption: Write a caption (what is shown, how many nodes) above the picture.

    Returns:
        SVG text.

    Raises:
        ValueError: for an unknown view, edge style or engine.
        UnknownNameError: for a node or value name the graph does not have.
    """
    index = model if isinstance(model, GraphIndex) else GraphIndex(model, trainable, frozen)
    selection = select(index, view, nodes=nodes, around=around, depth=depth, context=context)
    scene = build_scene(index, selection, max_nodes=max_nodes, params=params)
    if engine == "dot":
        from onnxblocks.display.dot import dot_available, scene_to_dot_svg

        if dot_available():
            return scene_to_dot_svg(scene)
        warnings.warn(
            "graphviz 'dot' is not on PATH, so the picture uses onnxblocks' built-in layout. "
            "Install graphviz "
            "(e.g. apt-get install graphviz) for dot layouts, or pass engine='python' to silence "
            "this.",
            stacklevel=2,
        )
    elif engine != "python":
        raise InvalidValueError(f"engine must be 'python' or 'dot', not {engine!r}.")
    return scene_to_svg(scene, edges=edges, caption=caption)


def count_noun(n: int, noun: str) -> str:
    """``3 nodes``, ``1 node``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def picture(svg: str) -> str:
    """An SVG picture in a scrolling frame."""
    return f'<div style="{PICTURE}">{svg}</div>'


def details(summary: str, body: str, open_: bool = False) -> str:
    """A collapsible HTML section."""
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{body}</details>"


# ---------------------------------------------------------------- dispatch
_VIEW_KEYS = {
    "view",
    "nodes",
    "around",
    "depth",
    "context",
    "max_nodes",
    "params",
    "edges",
    "engine",
    "caption",
}


def show(obj: Any, **view: Any) -> Display:
    """Summarize and draw an onnxblocks object.

    Args:
        obj: A ``ModelProto``; a path to an ``.onnx`` file or to an artifacts
            directory; a :class:`~onnxblocks.blocks.ModelAccessor`; a built
            :class:`~onnxblocks.blocks.Block` or ``TrainingBlock``; or an
            ``Artifacts`` result of ``generate_artifacts``.
        **view: Picture options of :func:`draw_svg` (``view``, ``nodes``, ``around``,
            ``depth``, ``context``, ``max_nodes``, ``params``, ``edges``, ``engine``),
            plus ``model="training" | "eval" | "optimizer"`` for training blocks and
            artifacts (which model the main picture shows), and ``trainable=`` /
            ``frozen=`` for plain models.

    Returns:
        A :class:`Display` (Jupyter shows it; ``.html``, ``.svg`` and ``.save()`` give the parts).

    Raises:
        TypeError: for an object that cannot be displayed, or an unknown option.
    """
    allowed = _VIEW_KEYS | {"model", "trainable", "frozen"}
    unknown = set(view) - allowed
    if unknown:
        raise InvalidTypeError(
            f"show() got unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}."
        )
    return render(obj, **view)


@functools.singledispatch
def render(obj: Any, **view: Any) -> Display:
    """The :class:`Display` of ``obj``; register a renderer per class with ``@render.register``.

    Raises:
        TypeError: for a class no renderer is registered for.
    """
    raise InvalidTypeError(
        f"onnxblocks.display.show() cannot display a {type(obj).__name__}. Pass an "
        "onnx.ModelProto, a path to "
        "an .onnx file or artifacts directory, a ModelAccessor, a built Block or TrainingBlock, "
        "or Artifacts."
    )


def repr_html(obj: Any, **view: Any) -> str:
    """The HTML Jupyter shows for ``obj`` (see :func:`show`).

    Unlike :func:`show`, this never raises: the ``_repr_html_`` hooks call it,
    and a display that fails (artifact files deleted since, say) shows the
    error in a box instead of a traceback.
    """
    try:
        return show(obj, **view).html
    except Exception as exc:  # a display hook must not raise
        return (
            f'<div style="{BOX};border:1px solid #fca5a5;background:#fef2f2;padding:6px">'
            f"onnxblocks could not display this {escape(type(obj).__name__)}: "
            f"{escape(type(exc).__name__)}: {escape(str(exc))}</div>"
        )


def split_view(view: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``show()`` options into picture options (for :func:`draw_svg`) and the rest."""
    pic = {k: v for k, v in view.items() if k in _VIEW_KEYS}
    rest = {k: v for k, v in view.items() if k not in _VIEW_KEYS}
    return pic, rest


@render.register(onnx.ModelProto)
@render.register(GraphIndex)
def show_model(model: onnx.ModelProto | GraphIndex, title: str = "", **view: Any) -> Display:
    """The display of a plain model: summary tables and a picture."""
    pic, rest = split_view(view)
    rest.pop("model", None)
    index = (
        model
        if isinstance(model, GraphIndex)
        else GraphIndex(model, rest.get("trainable"), rest.get("frozen"))
    )
    svg = draw_svg(index, **pic)
    head = f"<div style='font-size:13px;margin-bottom:4px'><b>{title}</b></div>" if title else ""
    html = f'<div style="{BOX}">{head}{summary_table(index)}{picture(svg)}</div>'
    return Display(html, svg)


@render.register(ModelAccessor)
def _show_accessor(accessor: ModelAccessor, **view: Any) -> Display:
    model = accessor.proto()
    state = "being built" if getattr(accessor, "_open", False) else "built"
    held = len(accessor.weights)
    extra = f" · {held:,} initializer(s) held aside (not copied)" if held else ""
    return show_model(model, title=f"Model {state}{extra}", **view)


def not_built(name: str, kind: str, purpose: str) -> Display:
    """The display of a block that was not called yet."""
    html = (
        f'<div style="{BOX}"><b>{name}</b>{kind} has not been built yet: call it inside '
        f"<code>with onnxblocks.base(model):</code> {purpose}.</div>"
    )
    return Display(html, "")


@render.register(Block)
def _show_block(block: Block, *, is_loss: bool = False, **view: Any) -> Display:
    name = escape(type(block).__name__)
    accessor = getattr(block, "_accessor", None)
    if accessor is None:
        return not_built(name, "", "to add its nodes")
    index = GraphIndex(accessor.proto(), loss_nodes=added_nodes(block) if is_loss else ())
    names = [n for n in added_nodes(block) if n in index.by_name or n.startswith("#")]
    rows = []
    for n in names:
        node = index.node(n)
        outs = ", ".join(f"{o}: {_type_text(index, o, accessor)}" for o in node.outputs)
        rows.append(
            f'<tr><td style="{TD}">{escape(node.op_type)}</td><td '
            f'style="{TD}">{escape(node.name)}</td>'
            f'<td style="{TD}">{escape(", ".join(i for i in node.inputs if i))}</td>'
            f'<td style="{TD}">{escape(outs)}</td></tr>'
        )
    table = (
        f'<table style="{TABLE}"><thead><tr><th style="{TH}">op</th><th style="{TH}">name</th>'
        f'<th style="{TH}">inputs</th><th '
        f'style="{TH}">outputs</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
    pic, _ = split_view(view)
    if not any(k in pic for k in ("nodes", "around")) and pic.get("view") in (None, "auto"):
        pic.pop("view", None)
        pic["nodes"] = names
        pic.setdefault("context", 1)
    svg = draw_svg(index, **pic) if names or "nodes" not in pic else ""
    html = (
        f'<div style="{BOX}"><div style="font-size:13px"><b>{name}</b> added {len(names):,} '
        "node(s) to a model "
        f"of {len(index.nodes):,} nodes</div>{table}{picture(svg) if svg else ''}"
        + details("Model around them", summary_table(index))
        + "</div>"
    )
    return Display(html, svg)


@render.register(Loss)
def _show_loss(block: Loss, **view: Any) -> Display:
    return _show_block(block, is_loss=True, **view)


def _type_text(index: GraphIndex, name: str, accessor: Any = None) -> str:
    dtype, shape = index.value_type(name)
    if dtype == "?" and accessor is not None:
        known = accessor.type_of(name)
        if known is not None:
            dtype, shape = type_shape(known)
    return dtype + TensorInfo(name, "value", dtype, shape).shape_text


def register_html() -> None:
    """Register :func:`repr_html` as the rich display of every class :func:`render` knows."""
    for cls in render.registry:
        if isinstance(cls, type) and issubclass(cls, _html.HtmlDisplay):
            _html.register(cls)(repr_html)
