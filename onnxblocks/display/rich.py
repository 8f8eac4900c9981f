"""Rich display: an HTML summary and an inline SVG picture for onnxblocks objects.

:func:`show` accepts a ``ModelProto``, a model file or artifacts directory path,
a :class:`~onnxblocks.blocks.ModelAccessor`, a built
:class:`~onnxblocks.blocks.Block`, a ``TrainingBlock``, or an ``Artifacts``
result, and returns a :class:`Display` that Jupyter renders. :func:`repr_html`
is what the ``_repr_html_`` hooks of those classes call.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import onnx

from onnxblocks.blocks.block import _added_nodes
from onnxblocks.display.graph import GraphIndex, TensorInfo, type_shape
from onnxblocks.display.scene import MAX_NODES, build_scene
from onnxblocks.display.summary import BOX, TABLE, TD, TDR, TH, format_bytes, header_line, summary_table
from onnxblocks.display.svg import scene_to_svg
from onnxblocks.display.views import select

#: Artifact files, in display order (a prefix may come before each name).
ARTIFACT_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")
#: Checkpoints up to this size are opened (with onnxruntime) to learn which parameters train.
CHECKPOINT_READ_LIMIT = 512 * 1024 * 1024
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
        return f"<onnxblocks Display: {len(self.html):,} chars of HTML, {len(self.svg):,} chars of SVG>"

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
                f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{self.html}</body></html>',
                encoding="utf-8",
            )
        else:
            raise ValueError(f"Cannot save a display as '{target.suffix}': use a .svg or .html file name.")
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
            "graphviz 'dot' is not on PATH, so the picture uses onnxblocks' built-in layout. Install graphviz "
            "(e.g. apt-get install graphviz) for dot layouts, or pass engine='python' to silence this.",
            stacklevel=2,
        )
    elif engine != "python":
        raise ValueError(f"engine must be 'python' or 'dot', not {engine!r}.")
    return scene_to_svg(scene, edges=edges, caption=caption)


def _count(n: int, noun: str) -> str:
    """``3 nodes``, ``1 node``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _picture(svg: str) -> str:
    return f'<div style="{PICTURE}">{svg}</div>'


def _details(summary: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{body}</details>"


# ---------------------------------------------------------------- dispatch
_VIEW_KEYS = {"view", "nodes", "around", "depth", "context", "max_nodes", "params", "edges", "engine", "caption"}


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
        raise TypeError(f"show() got unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}.")
    from onnxblocks.blocks.accessor import ModelAccessor
    from onnxblocks.blocks.block import Block

    if isinstance(obj, onnx.ModelProto):
        return _show_model(obj, **view)
    if isinstance(obj, GraphIndex):
        return _show_model(obj, **view)
    if isinstance(obj, (str, os.PathLike)):
        return _show_path(Path(obj), **view)
    if isinstance(obj, ModelAccessor):
        return _show_accessor(obj, **view)
    if _is_training_block(obj):
        return _show_training_block(obj, **view)
    if isinstance(obj, Block):
        return _show_block(obj, **view)
    if _is_artifacts(obj):
        return _show_artifacts(obj, **view)
    raise TypeError(
        f"onnxblocks.display.show() cannot display a {type(obj).__name__}. Pass an onnx.ModelProto, a path to "
        "an .onnx file or artifacts directory, a ModelAccessor, a built Block or TrainingBlock, or Artifacts."
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


def _split(view: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pic = {k: v for k, v in view.items() if k in _VIEW_KEYS}
    rest = {k: v for k, v in view.items() if k not in _VIEW_KEYS}
    return pic, rest


def _show_model(model: onnx.ModelProto | GraphIndex, title: str = "", **view: Any) -> Display:
    pic, rest = _split(view)
    rest.pop("model", None)
    index = model if isinstance(model, GraphIndex) else GraphIndex(model, rest.get("trainable"), rest.get("frozen"))
    svg = draw_svg(index, **pic)
    head = f"<div style='font-size:13px;margin-bottom:4px'><b>{title}</b></div>" if title else ""
    html = f'<div style="{BOX}">{head}{summary_table(index)}{_picture(svg)}</div>'
    return Display(html, svg)


def _show_path(path: Path, **view: Any) -> Display:
    if path.is_dir():
        return _show_artifacts_dir(path, **view)
    if not path.is_file():
        raise FileNotFoundError(f"'{path}' does not exist. Pass an .onnx file or a directory of training artifacts.")
    model = onnx.load(str(path), load_external_data=False)
    return _show_model(model, title=f"{escape(path.name)} ({format_bytes(path.stat().st_size)})", **view)


def _show_accessor(accessor: Any, **view: Any) -> Display:
    model = accessor.working_model
    state = "being built" if getattr(accessor, "_open", False) else "built"
    held = len(accessor.weights)
    extra = f" · {held:,} initializer(s) held aside (not copied)" if held else ""
    return _show_model(model, title=f"Model {state}{extra}", **view)


def _not_built(name: str, kind: str, purpose: str) -> Display:
    """The display of a block that was not called yet."""
    html = (
        f'<div style="{BOX}"><b>{name}</b>{kind} has not been built yet: call it inside '
        f"<code>with onnxblocks.base(model):</code> {purpose}.</div>"
    )
    return Display(html, "")


def _show_block(block: Any, **view: Any) -> Display:
    name = escape(type(block).__name__)
    accessor = getattr(block, "_accessor", None)
    if accessor is None:
        return _not_built(name, "", "to add its nodes")
    index = GraphIndex(accessor.working_model, loss_nodes=_added_nodes(block) if _is_loss(block) else ())
    names = [n for n in _added_nodes(block) if n in index.by_name or n.startswith("#")]
    rows = []
    for n in names:
        node = index.node(n)
        outs = ", ".join(f"{o}: {_type_text(index, o, accessor)}" for o in node.outputs)
        rows.append(
            f'<tr><td style="{TD}">{escape(node.op_type)}</td><td style="{TD}">{escape(node.name)}</td>'
            f'<td style="{TD}">{escape(", ".join(i for i in node.inputs if i))}</td>'
            f'<td style="{TD}">{escape(outs)}</td></tr>'
        )
    table = (
        f'<table style="{TABLE}"><thead><tr><th style="{TH}">op</th><th style="{TH}">name</th>'
        f'<th style="{TH}">inputs</th><th style="{TH}">outputs</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
    pic, _ = _split(view)
    if not any(k in pic for k in ("nodes", "around")) and pic.get("view") in (None, "auto"):
        pic.pop("view", None)
        pic["nodes"] = names
        pic.setdefault("context", 1)
    svg = draw_svg(index, **pic) if names or "nodes" not in pic else ""
    html = (
        f'<div style="{BOX}"><div style="font-size:13px"><b>{name}</b> added {len(names):,} node(s) to a model '
        f"of {len(index.nodes):,} nodes</div>{table}{_picture(svg) if svg else ''}"
        + _details("Model around them", summary_table(index))
        + "</div>"
    )
    return Display(html, svg)


def _is_loss(block: Any) -> bool:
    try:
        from onnxblocks.losses._base import Loss
    except ImportError:
        return False
    return isinstance(block, Loss)


def _type_text(index: GraphIndex, name: str, accessor: Any = None) -> str:
    dtype, shape = index.value_type(name)
    if dtype == "?" and accessor is not None:
        known = accessor.type_of(name)
        if known is not None:
            dtype, shape = type_shape(known)
    return dtype + TensorInfo(name, "value", dtype, shape).shape_text


# ---------------------------------------------------------------- training
def _is_training_block(obj: Any) -> bool:
    try:
        from onnxblocks.blocks.training import TrainingBlock
    except ImportError:
        return False
    return isinstance(obj, TrainingBlock)


def _is_artifacts(obj: Any) -> bool:
    try:
        from onnxblocks.artifacts import Artifacts
    except ImportError:
        return False
    return isinstance(obj, Artifacts)


def _gradient_table(index: GraphIndex) -> str:
    """Rows ``param -> gradient -> accumulation buffer -> accumulated output`` of a training graph."""
    produced = set(index.producer)
    inputs = {t.name for t in index.state} | {t.name for t in index.inputs}
    outputs = {t.name for t in index.outputs}
    rows = []
    trainable = [p for p in index.params if p.trainable]
    for p in trainable[:50]:
        grad = f"{p.name}_grad"
        buf = f"{grad}.accumulation.buffer"
        out = f"{grad}.accumulation.out"

        def cell(value: str, present: bool) -> str:
            return f'<td style="{TD}">{escape(value) if present else "—"}</td>'

        rows.append(
            f'<tr><td style="{TD}">{escape(p.name)}</td>{cell(grad, grad in produced or grad in outputs)}'
            f"{cell(buf, buf in inputs)}{cell(out, out in outputs)}</tr>"
        )
    if not rows:
        return "<div>No gradients: this graph has no trainable parameter.</div>"
    more = (f'<tr><td colspan="4" style="{TD}">… {len(trainable) - 50:,} more</td></tr>'
            if len(trainable) > 50 else "")
    return (
        f'<div style="margin-top:6px"><b>Gradients</b> ({len(trainable):,})</div>'
        f'<table style="{TABLE}"><thead><tr><th style="{TH}">parameter</th><th style="{TH}">gradient</th>'
        f'<th style="{TH}">accumulation buffer (input)</th><th style="{TH}">accumulated (output)</th></tr></thead>'
        f"<tbody>{''.join(rows)}{more}</tbody></table>"
    )


def _training_display(
    title: str,
    models: dict[str, onnx.ModelProto],
    trainable: Iterable[str] | None,
    frozen: Iterable[str] | None,
    files: str = "",
    notes: Sequence[str] = (),
    loss: str | None = None,
    loss_nodes: Sequence[str] | None = None,
    **view: Any,
) -> Display:
    """Shared display of a training model with its eval and optimizer models."""
    pic, rest = _split(view)
    main = rest.get("model", "training")
    if main not in models:
        raise ValueError(f"model={main!r} is not available here; choose one of {sorted(models)}.")
    trainable = list(trainable) if trainable is not None else None
    frozen = list(frozen) if frozen is not None else None
    indexes = {
        k: GraphIndex(m, trainable, frozen, loss="" if k == "optimizer" else loss,
                      loss_nodes=None if k == "optimizer" else loss_nodes)
        for k, m in models.items()
    }
    out = [f'<div style="{BOX}"><div style="font-size:13px;margin-bottom:4px"><b>{title}</b></div>', files]
    out.extend(f'<div style="color:#64748b">{escape(n)}</div>' for n in notes)
    train = indexes.get("training")
    if train is not None:
        out.append(summary_table(train))
        out.append(_gradient_table(train))
    svg = draw_svg(indexes[main], **pic)
    out.append(f"<div style='margin-top:6px'><b>{escape(main)} model</b></div>")
    if main != "training":
        out.append(header_line(indexes[main]))
    out.append(_picture(svg))
    for kind, index in indexes.items():
        if kind == main:
            continue
        body = header_line(index)
        if kind != "optimizer" and train is not None:
            only = _compare_io(train, index)
            if only:
                body += f'<div style="color:#475569">{only}</div>'
        small = {k: v for k, v in pic.items() if k not in ("nodes", "around")}
        body += _picture(draw_svg(index, **small))
        out.append(_details(f"{escape(kind)} model ({_count(len(index.nodes), 'node')})", body))
    out.append("</div>")
    return Display("".join(out), svg)


def _compare_io(train: GraphIndex, other: GraphIndex) -> str:
    t_in = {t.name for t in train.inputs + train.params + train.state}
    o_in = {t.name for t in other.inputs + other.params + other.state}
    t_out = {t.name for t in train.outputs}
    o_out = {t.name for t in other.outputs}
    bits = []
    if t_in - o_in:
        bits.append(f"inputs only in training: {len(t_in - o_in)}")
    if t_out - o_out:
        bits.append(f"outputs only in training: {len(t_out - o_out)} (gradients / accumulation)")
    return escape(" · ".join(bits))


def _show_training_block(block: Any, **view: Any) -> Display:
    name = escape(type(block).__name__)
    graphs = getattr(block, "_graphs", None)
    if graphs is None:
        return _not_built(name, " (training block)", "to build the training and eval models")
    partition = graphs.partition
    trainable, frozen = list(partition.trainable), list(partition.frozen)
    title = (
        f"{name}: training and eval models · {len(trainable):,} trainable, {len(frozen):,} frozen parameter(s)"
        f" · loss <code>{escape(graphs.user_outputs[0])}</code>"
    )
    return _training_display(
        title,
        {"training": graphs.training, "eval": graphs.eval},
        trainable,
        frozen,
        loss=graphs.user_outputs[0],
        loss_nodes=_added_nodes(block),
        **view,
    )


def _find_artifacts(directory: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for kind in ARTIFACT_FILES:
        matches = sorted(p for p in directory.iterdir() if p.name.endswith(kind))
        if matches:
            found[kind] = min(matches, key=lambda p: len(p.name))
    return found


def _checkpoint_params(path: Path) -> tuple[list[str], list[str]] | None:
    """(trainable, frozen) parameter names read from an ORT checkpoint, or None when unreadable."""
    size = _checkpoint_size(path)
    if size > CHECKPOINT_READ_LIMIT:
        return None
    try:
        from onnxblocks._core.ort import capi

        _pybind_state = capi()

        state = _pybind_state.load_checkpoint(os.fspath(path))
        trainable, frozen = [], []
        for name in state.parameter_names():
            (trainable if state.get_parameter(name).requires_grad else frozen).append(name)
        return trainable, frozen
    except Exception:  # fall back to what the graph says
        return None


def _checkpoint_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    siblings = [p for p in path.parent.iterdir() if p.name.startswith(path.name) and p.is_file()]
    return sum(p.stat().st_size for p in siblings)


def _files_table(found: dict[str, Path], models: dict[str, onnx.ModelProto]) -> str:
    rows = []
    for kind, path in found.items():
        model = models.get(kind.replace("_model.onnx", ""))
        size = _checkpoint_size(path) if kind == "checkpoint" else path.stat().st_size
        info = (f"{_count(len(model.graph.node), 'node')}, {_count(len(model.graph.input), 'input')}, "
                f"{_count(len(model.graph.output), 'output')}") if model is not None else ""
        rows.append(
            f'<tr><td style="{TD}">{escape(path.name)}</td><td style="{TDR}">{size:,}</td>'
            f'<td style="{TD}">{format_bytes(size)}</td><td style="{TD}">{info}</td></tr>'
        )
    return (
        f'<table style="{TABLE}"><thead><tr><th style="{TH}">file</th><th style="{TH}">bytes</th>'
        f'<th style="{TH}"></th><th style="{TH}">graph</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def _show_artifacts_dir(
    directory: Path,
    trainable: Iterable[str] | None = None,
    frozen: Iterable[str] | None = None,
    **view: Any,
) -> Display:
    found = _find_artifacts(directory)
    if "training_model.onnx" not in found:
        raise FileNotFoundError(
            f"'{directory}' has no training_model.onnx. Pass the directory generate_artifacts() wrote to, "
            "or an .onnx file."
        )
    return _show_found(directory, found, trainable, frozen, **view)


def _show_found(
    directory: Path,
    found: dict[str, Path],
    trainable: Iterable[str] | None,
    frozen: Iterable[str] | None,
    loss: str | None = None,
    **view: Any,
) -> Display:
    models = {
        kind.replace("_model.onnx", ""): onnx.load(str(path), load_external_data=False)
        for kind, path in found.items()
        if kind.endswith(".onnx")
    }
    notes: list[str] = []
    if trainable is None and frozen is None and "checkpoint" in found:
        params = _checkpoint_params(found["checkpoint"])
        if params is None:
            notes.append("The checkpoint was not read (too large or unreadable): frozen parameters show as inputs.")
        else:
            trainable, frozen = params
    title = f"Training artifacts in {escape(str(directory))}"
    return _training_display(title, models, trainable, frozen, _files_table(found, models), notes, loss=loss, **view)


def _show_artifacts(artifacts: Any, **view: Any) -> Display:
    """Display an ``onnxblocks.artifacts.Artifacts`` (paths and parameter names are known)."""
    found = {"training_model.onnx": Path(artifacts.training_model), "eval_model.onnx": Path(artifacts.eval_model)}
    if artifacts.optimizer_model is not None:
        found["optimizer_model.onnx"] = Path(artifacts.optimizer_model)
    found["checkpoint"] = Path(artifacts.checkpoint)
    missing = [str(p) for p in found.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"Artifact file(s) {missing} no longer exist. Generate the artifacts again, or show() the directory "
            "that holds them."
        )
    trainable = view.pop("trainable", list(artifacts.requires_grad))
    frozen = view.pop("frozen", list(artifacts.frozen_params))
    loss = artifacts.output_names[0] if artifacts.output_names else None
    return _show_found(Path(artifacts.directory), found, trainable, frozen, loss=loss, **view)
