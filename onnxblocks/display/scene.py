"""What a picture draws: boxes (nodes, groups, inputs, parameters, outputs) and edges.

:func:`build_scene` turns a :class:`~onnxblocks.display.views.Selection` of a
:class:`~onnxblocks.display.graph.GraphIndex` into a :class:`Scene` of at most
``max_nodes`` boxes. Small selections are drawn node by node with their inputs,
parameters and outputs; large ones are collapsed (see
:mod:`onnxblocks.display.collapse`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxblocks.display.collapse import Group, collapse, group_edges
from onnxblocks.display.graph import GraphIndex, TensorInfo
from onnxblocks.display.views import Selection

TIMES = "\u00d7"  # multiplication sign, as in MatMul (times) 4

#: Default cap on the number of boxes in one picture.
MAX_NODES = 300


@dataclass
class Box:
    """One box of a picture.

    Attributes:
        key: Unique id within the scene.
        kind: Drawing style: a node part (``forward``, ``loss``, ``backward``,
            ``accumulation``, ``optimizer``), ``input``, ``output``, ``param``,
            ``frozen``, ``state``, ``value`` (a value from outside the selection),
            ``group`` or ``more``.
        title: First line (op type, value name, or group label).
        subtitle: Second line (node name, shape, or group size).
        tooltip: Full details, shown on hover.
        order: Sort key following graph order.
        dim: Drawn faded (context around a selection).
        part: For groups, the part of their nodes.
        emphasis: Drawn with a thick outline (e.g. the value a neighbourhood is around).
    """

    key: str
    kind: str
    title: str
    subtitle: str = ""
    tooltip: str = ""
    order: float = 0.0
    dim: bool = False
    part: str = ""
    emphasis: bool = False


@dataclass
class Scene:
    """Boxes and edges to lay out and draw, with a caption."""

    boxes: list[Box]
    edges: list[tuple[str, str]]
    caption: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def node_count(self) -> int:
        """Number of operator boxes (nodes or groups) in the scene."""
        return sum(1 for b in self.boxes if b.kind not in _VALUE_KINDS)


_VALUE_KINDS = {"input", "output", "param", "frozen", "state", "value"}


def build_scene(
    index: GraphIndex,
    selection: Selection,
    max_nodes: int = MAX_NODES,
    params: bool | None = None,
) -> Scene:
    """Build the boxes and edges for a selection.

    Args:
        index: The graph.
        selection: The nodes to draw.
        max_nodes: The most boxes to draw; larger selections are collapsed.
        params: Draw parameter boxes; by default only when they fit under ``max_nodes``.

    Returns:
        The scene.
    """
    drawn = sorted(set(selection.nodes) | set(selection.context))
    total = len(index.nodes)
    what = selection.description or "selection"
    if not drawn:
        return Scene([], [], f"{what}: no nodes", notes=[_empty_note(index, what)])
    if len(drawn) <= max_nodes:
        scene = _node_scene(index, selection, drawn, max_nodes, params)
        scene.caption = f"{what}: {len(selection.nodes):,} of {total:,} nodes"
        if selection.context:
            scene.caption += f" (+{len(selection.context):,} around them, faded)"
        return scene
    budget = max(max_nodes - 2 * min(len(index.inputs) + len(index.outputs), 40), max_nodes // 2)
    groups, how = collapse(index, drawn, budget)
    scene = _group_scene(index, groups, set(selection.nodes))
    scene.caption = f"{what}: {len(drawn):,} of {total:,} nodes in {len(groups):,} boxes ({how})"
    return scene


def _empty_note(index: GraphIndex, what: str) -> str:
    parts = index.part_counts()
    present = ", ".join(f"{p} ({n})" for p, n in parts.items()) or "none"
    return f"Nothing to draw for the {what}. Parts of this graph: {present}."


def _tensor_tooltip(t: TensorInfo) -> str:
    size = f", {t.nbytes:,} bytes" if t.nbytes is not None else ""
    status = (
        {True: ", trainable", False: ", frozen", None: ""}[t.trainable] if t.role == "param" else ""
    )
    kind = "type unknown" if t.dtype == "?" and t.shape is None else f"{t.dtype}{t.shape_text}"
    return f"{t.role} {t.name}: {kind}{size}{status}"


def _value_box(index: GraphIndex, name: str, order: float, highlight: set[str]) -> Box:
    t = index.tensors.get(name)
    if t is None:
        dtype, shape = index.value_type(name)
        t = TensorInfo(name, "value", dtype, shape)
    kind = t.role
    if t.role == "param":
        kind = "frozen" if t.trainable is False else "param"
    return Box(
        key="v:" + name,
        kind=kind,
        title=name,
        subtitle=(t.dtype if t.dtype != "?" else "")
        if t.shape is None
        else f"{t.dtype}{t.shape_text}",
        tooltip=_tensor_tooltip(t),
        order=order,
        emphasis=name in highlight,
    )


def _node_scene(
    index: GraphIndex, selection: Selection, drawn: list[int], max_nodes: int, params: bool | None
) -> Scene:
    drawn_set = set(drawn)
    context = set(selection.context)
    focused_only = len(drawn) < len(index.nodes)
    boxes: list[Box] = []
    for i in drawn:
        node = index.nodes[i]
        ins = ", ".join(f"{v}" for v in node.inputs if v)
        outs = ", ".join(node.outputs)
        domain = f" ({node.domain})" if node.domain else ""
        boxes.append(
            Box(
                key=f"n:{i}",
                kind=index.parts[i],
                title=node.op_type,
                subtitle=node.name,
                tooltip=f"{node.op_type}{domain} {node.name} [{index.parts[i]}]\ninputs: "
                f"{ins}\noutputs: {outs}",
                order=i,
                dim=i in context,
            )
        )
    # Values that feed the drawn nodes from outside them, and graph outputs they produce.
    sources: dict[str, float] = {}
    for i in drawn:
        for v in index.nodes[i].inputs:
            if not v or (v in index.producer and index.producer[v] in drawn_set):
                continue
            t = index.tensors.get(v)
            role = t.role if t is not None else "value"
            if role == "constant":
                continue
            if role == "value" and not focused_only:
                continue
            sources[v] = min(sources.get(v, i), i) - 0.5
    sinks = {
        o.name: index.producer[o.name] + 0.5
        for o in index.outputs
        if o.name in index.producer and index.producer[o.name] in drawn_set
    }
    param_names = [
        v for v in sources if index.tensors.get(v) is not None and index.tensors[v].role == "param"
    ]
    notes: list[str] = []
    show_params = (
        params if params is not None else len(boxes) + len(sources) + len(sinks) <= max_nodes
    )
    if not show_params and param_names:
        for v in param_names:
            del sources[v]
        notes.append(
            f"{len(param_names):,} parameter boxes not drawn (pass params=True to draw them)."
        )
    if len(boxes) + len(sources) + len(sinks) > max_nodes:
        outside = [v for v in sources if v not in index.tensors]
        for v in outside:
            del sources[v]
        if outside:
            notes.append(f"{len(outside):,} values from outside the selection not drawn.")
    for v, order in sources.items():
        box = _value_box(index, v, order, selection.highlight)
        box.dim = all(c in context for c in index.consumers.get(v, ()) if c in drawn_set)
        boxes.append(box)
    for v, order in sinks.items():
        box = _value_box(index, v, order, selection.highlight)
        box.key = "o:" + v
        box.kind = "output"
        boxes.append(box)
    edges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for i in drawn:
        for v in index.nodes[i].inputs:
            if not v:
                continue
            p = index.producer.get(v)
            src = (
                f"n:{p}"
                if p is not None and p in drawn_set
                else ("v:" + v if v in sources else None)
            )
            if src is not None and (src, f"n:{i}") not in seen:
                seen.add((src, f"n:{i}"))
                edges.append((src, f"n:{i}"))
    for v in sinks:
        edges.append((f"n:{index.producer[v]}", "o:" + v))
    for box in boxes:
        if box.key.startswith("v:") and box.title in selection.highlight:
            box.emphasis = True
    for k, i in enumerate(drawn):  # emphasise the producer of a highlighted intermediate value
        if any(o in selection.highlight for o in index.nodes[i].outputs):
            boxes[k].emphasis = True
    boxes.sort(key=lambda b: b.order)
    return Scene(boxes, edges, notes=notes)


def _group_scene(index: GraphIndex, groups: list[Group], focus: set[int]) -> Scene:
    boxes: list[Box] = []
    for k, g in enumerate(groups):
        ops = index.op_counts(g.members)
        top = ", ".join(f"{op}{TIMES}{n}" for op, n in list(ops.items())[:3]) + (
            " …" if len(ops) > 3 else ""
        )
        if len(g.members) == 1 and not g.truncated:
            node = index.nodes[g.members[0]]
            title, subtitle = node.op_type, node.name
        elif g.truncated:
            title, subtitle = g.label, "not drawn"
        else:
            title = g.label + (f" {TIMES}{g.repeat}" if g.repeat > 1 else "")
            subtitle = f"{len(g.members):,} nodes: {top}"
        n_params = sum(
            1
            for m in g.members
            for v in index.nodes[m].inputs
            if v in index.tensors and index.tensors[v].role == "param"
        )
        tip_scopes = (
            ("\nscopes: " + ", ".join(g.scopes[:8]) + (" …" if len(g.scopes) > 8 else ""))
            if g.scopes
            else ""
        )
        boxes.append(
            Box(
                key=f"g:{k}",
                kind="more" if g.truncated else ("group" if len(g.members) > 1 else g.part),
                title=title,
                subtitle=subtitle,
                tooltip=f"{g.label} [{g.part}]: {len(g.members):,} nodes, {n_params} parameter "
                "uses\n" + ", ".join(f"{op}{TIMES}{n}" for op, n in ops.items()) + tip_scopes,
                order=g.order,
                part=g.part,
                dim=not any(m in focus for m in g.members),
            )
        )
    edges = [(f"g:{a}", f"g:{b}") for a, b in group_edges(index, groups)]
    gid = {m: k for k, g in enumerate(groups) for m in g.members}
    # Graph inputs and outputs stay visible, unless there are very many.
    for t in index.inputs[:40]:
        targets = {gid[c] for c in index.consumers.get(t.name, ()) if c in gid}
        if targets:
            boxes.append(
                _value_box(index, t.name, min(groups[k].order for k in targets) - 0.5, set())
            )
            edges.extend(("v:" + t.name, f"g:{k}") for k in sorted(targets))
    for t in index.outputs[:40]:
        p = index.producer.get(t.name)
        if p in gid:
            box = _value_box(index, t.name, groups[gid[p]].order + 0.5, set())
            box.key, box.kind = "o:" + t.name, "output"
            boxes.append(box)
            edges.append((f"g:{gid[p]}", "o:" + t.name))
    boxes.sort(key=lambda b: b.order)
    return Scene(boxes, edges)
