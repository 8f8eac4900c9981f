"""Graph surgery: the edits passes share, each written once.

Every function edits an ``ir.Graph`` in place through onnx-ir's def-use chains;
none rebuilds a node list by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.dequantize import delayed_dequantize
from onnxblocks.ir.dequantize_rows import View, read_in_row_chunks
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.walk import all_nodes, reads


def replace_node(
    node: ir.Node, new_nodes: Sequence[ir.Node], new_outputs: Sequence[ir.Value | None]
) -> None:
    """Replace ``node`` by ``new_nodes`` (inserted where it was), its outputs by ``new_outputs``, in
    order.

    Each new output takes over the old output's name, type, shape and every use
    (graph outputs included). ``None`` leaves an output that nothing reads.

    Raises:
        ValueError: if an old output is still read and its replacement is None.
    """
    graph = node.graph
    assert graph is not None, f"node {node.name!r} belongs to no graph"
    olds, news = [], []
    for old, new in zip(node.outputs, new_outputs, strict=True):
        if new is None:
            if old.uses() or old.is_graph_output():
                raise InvalidValueError(
                    f"Output {old.name!r} of node {node.name!r} is still read but has no "
                    "replacement."
                )
            continue
        olds.append(old)
        news.append(new)
    ir.convenience.replace_nodes_and_values(graph, node, [node], list(new_nodes), olds, news)


def remove_unused_nodes(graph: ir.Graph, keep: Iterable[ir.Value] = ()) -> int:
    """Remove, in place, the nodes whose outputs reach no graph output (nor ``keep``); return how
    many.

    Nodes inside subgraphs are left alone; a node whose subgraph reads a value
    keeps that value's producer alive.
    """
    live = _live_nodes(graph, [*graph.outputs, *keep])
    dead = [n for n in graph if n not in live]
    if dead:
        graph.remove(dead, safe=False)
        for n in dead:  # detach what the removed nodes read, so uses() stays exact
            for i in range(len(n.inputs)):
                n.replace_input_with(i, None)
    return len(dead)


def _live_nodes(graph: ir.Graph, roots: Iterable[ir.Value]) -> set[ir.Node]:
    live: set[ir.Node] = set()
    stack = [v for v in roots if v is not None]
    seen: set[ir.Value] = set()
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        producer = value.producer()
        if producer is None or producer in live or producer.graph is not graph:
            continue
        live.add(producer)
        stack.extend(reads(producer))
    return live


def cut_to_outputs(graph: ir.Graph, outputs: Sequence[ir.Value]) -> None:
    """Make ``outputs`` the graph's outputs and drop every node, input and initializer they do
    not need.
    """
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    remove_unused_nodes(graph)
    needed = {v for n in graph for v in reads(n)} | set(outputs)
    for value in list(graph.inputs):
        if value not in needed:
            graph.inputs.remove(value)
    for name in [n for n, v in graph.initializers.items() if v not in needed]:
        graph.initializers.pop(name)


def rename_values(graph: ir.Graph, mapping: Mapping[str, str]) -> int:
    """Rename, in place, every value of ``graph`` (subgraphs included) named in ``mapping``;
    return how many.
    """
    count = 0
    values = [*graph.inputs, *graph.initializers.values()]
    values += [v for node in all_nodes(graph) for v in node.outputs]
    for value in values:
        old = value.name
        if old is not None and old in mapping:
            new = mapping[old]
            if graph.initializers.get(old) is value:
                graph.initializers.pop(old)
                value.name = new
                graph.initializers[new] = value
            else:
                value.name = new
            count += 1
    return count


def values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    """Every named value of the top-level graph (inputs, initializers, node outputs), by name."""
    table: dict[str, ir.Value] = {v.name: v for v in graph.inputs if v.name}
    table.update(graph.initializers)
    for node in graph:
        table.update({v.name: v for v in node.outputs if v.name})
    return table


def cast_initializers(
    graph: ir.Graph,
    stored: Mapping[str, ir.TensorProtocol],
    scales: Mapping[str, tuple[ir.TensorProtocol, int]] | None = None,
    views: dict[str, View] | None = None,
) -> list[str]:
    """Store initializers in another element type and cast them back where they are read; return
    those changed.

    For each ``name -> tensor`` of ``stored``, the initializer ``name`` keeps its
    name and takes ``tensor`` (e.g. a float16 stub of a float32 weight) as its
    value, and each node that read it (in subgraphs too) reads a ``Cast`` of it to
    its old element type instead: one ``Cast`` per reading node, inserted before
    it. A node that only moves the weight's elements (``Transpose``, ``Reshape``...)
    is repeated after the ``Cast`` for each of its readers, so each float32 copy
    lives only while its reader runs (and ONNX Runtime can still fuse a
    ``Transpose`` into the ``MatMul`` after it).

    A runtime may run a node as soon as its inputs are ready, so every ``Cast`` of
    a constant would run first and all the cast copies would be alive at once. So
    each ``Cast`` reads through a ``Reshape`` to the same shape whose shape input
    is computed from its reader's first computed input (an empty ``Shape`` slice
    of it): the copy is made when its reader is about to run, and freed after it.
    Initializers that are also graph inputs or outputs are left alone (a feed or a
    reader outside the graph expects the old type).

    ``scales`` names the initializers stored quantized (int8, int4): ``name -> (scale,
    block_size)``. Each is read through ``DequantizeLinear(q, scale, axis=-1, block_size)``
    instead of a ``Cast`` (symmetric: no zero point), and the scale becomes an initializer
    ``<name>.scale`` of the graph (opset 21 is the caller's). With ``views`` (a dict to fill), a
    large quantized table read by rows (an embedding's ``Gather``, an LM head) is dequantized a
    chunk of rows at a time (:mod:`onnxblocks.ir.dequantize_rows`): ``views`` receives the
    chunk initializers, views of the table's bytes the caller stores.
    """
    names = graph_names(graph)
    order = {
        node: i for i, node in enumerate(graph)
    }  # the original nodes' order (insertions keep it)
    changed: list[str] = []
    for name, tensor in stored.items():
        value = graph.initializers.get(name)
        if (
            value is None
            or value.is_graph_input()
            or value.is_graph_output()
            or value.dtype is None
        ):
            continue
        old = value.dtype
        decode = None
        if scales is not None and name in scales:
            scale_tensor, block = scales[name]
            scale = ir.Value(name=scale_tensor.name, const_value=scale_tensor)
            scale.dtype, scale.shape = scale_tensor.dtype, ir.Shape(scale_tensor.shape.numpy())
            graph.register_initializer(scale)
            decode = (scale, block)
            if views is not None:
                read_in_row_chunks(graph, value, tensor.dtype, scale, block, names, views)
        readers: dict[ir.Node, list[int]] = {}
        for user, index in list(value.uses()):
            readers.setdefault(user, []).append(index)
        for user, indices in readers.items():
            assert user.graph is not None, f"node {user.name!r} belongs to no graph"
            if _moves_only(
                user, value
            ):  # a Transpose of the weight: one cast and one copy of it per reader
                out = user.outputs[0]
                for reader, index in list(out.uses()):
                    assert reader.graph is not None, f"node {reader.name!r} belongs to no graph"
                    trigger = _trigger(reader, out, order)
                    nodes = _delayed_cast(reader.graph, value, old, trigger, names, name, decode)
                    mover = ir.Node(
                        user.domain,
                        user.op_type,
                        [nodes[-1].outputs[0], *user.inputs[1:]],
                        attributes=list(user.attributes.values()),
                        name=names.fresh(user.name or f"{name}.{user.op_type.lower()}"),
                    )
                    mover.outputs[0].name = names.fresh(out.name or f"{name}.moved")
                    mover.outputs[0].dtype, mover.outputs[0].shape = old, out.shape
                    reader.graph.insert_before(reader, [*nodes, mover])
                    reader.replace_input_with(index, mover.outputs[0])
                user.graph.remove(user, safe=True)
                continue
            trigger = _computed_input(user, value)
            nodes = _delayed_cast(user.graph, value, old, trigger, names, name, decode)
            user.graph.insert_before(user, nodes)
            for index in indices:
                user.replace_input_with(index, nodes[-1].outputs[0])
        value.const_value = tensor
        value.dtype = tensor.dtype
        changed.append(name)
    return changed


#: Ops that move a tensor's elements without computing with them (they run in any element type).
_MOVERS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def _moves_only(user: ir.Node, value: ir.Value) -> bool:
    """True for a node that only moves the elements of ``value`` (and reads nothing else
    computed).
    """
    if user.op_type not in _MOVERS or user.domain not in ("", "ai.onnx") or len(user.outputs) != 1:
        return False
    if len(user.inputs) == 0 or user.inputs[0] is not value or value in user.inputs[1:]:
        return False
    out = user.outputs[0]
    return not out.is_graph_output() and all(
        v is None or v.producer() is None for v in user.inputs[1:]
    )


def _computed_input(node: ir.Node, other_than: ir.Value) -> ir.Value | None:
    """The first input of ``node`` known only at run time (not ``other_than``): computed by a
    node, or fed, or None.
    """

    def at_run_time(v: ir.Value) -> bool:
        return v.producer() is not None or (v.is_graph_input() and not v.is_initializer())

    return next(
        (v for v in node.inputs if v is not None and v is not other_than and at_run_time(v)), None
    )


def _trigger(reader: ir.Node, via: ir.Value, order: Mapping[ir.Node, int]) -> ir.Value | None:
    """What a cast for ``reader`` (which reads ``via``) waits for: ``reader``'s first computed
    input.

    A reader that only moves the weight further (the backward's ``Transpose`` of the forward's)
    has none: then it is the first computed input of the node after the chain of movers, when
    that value is written before ``reader`` runs (``order``: the top-level graph's original
    node order). Without a trigger the cast would read the constant alone, and a runtime may
    run it first, or fold it into a float32 copy for the session's life (onnxruntime 1.32's
    ``FuseInitializersTransformer`` does).
    """
    node, edge = reader, via
    for _ in range(16):  # a chain of movers is short; a longer one goes untriggered
        found = _computed_input(node, edge)
        if found is not None:
            if node is reader:
                return found
            producer = found.producer()
            if producer is None:  # a graph input: there from the start
                return found
            if producer not in order or reader not in order:
                return None
            return found if order[producer] < order[reader] else None
        if (
            node.op_type not in _MOVERS
            or node.domain not in ("", "ai.onnx")
            or len(node.outputs) != 1
        ):
            return None
        uses = list(node.outputs[0].uses())
        if not uses or uses[0].node.graph is not reader.graph:
            return None
        edge, node = node.outputs[0], uses[0].node
    return None


def _delayed_cast(
    graph: ir.Graph,
    value: ir.Value,
    to: ir.DataType,
    trigger: ir.Value | None,
    names: NameAuthority,
    hint: str,
    decode: tuple[ir.Value, int] | None = None,
) -> list[ir.Node]:
    """The nodes (for ``graph``) computing ``Cast(value, to)`` once ``trigger`` is ready (None:
    at once); with ``decode`` (scale, block size), ``DequantizeLinear`` instead of the ``Cast``.
    """

    def node(op: str, inputs: Sequence[ir.Value], **attributes: int) -> ir.Node:
        attrs = [ir.AttrInt64(k, v) for k, v in attributes.items()]
        made = ir.Node("", op, inputs, attributes=attrs, name=names.fresh(f"{hint}.{op.lower()}"))
        made.outputs[0].name = names.fresh(f"{hint}.{op.lower()}_out")
        return made

    nodes: list[ir.Node] = []
    source = value
    shape = value.shape
    if decode is not None:
        return delayed_dequantize(graph, value, to, trigger, decode, node, names, hint)
    if trigger is not None and shape is not None and all(isinstance(d, int) for d in shape):
        dims = ir.Value(
            name=names.fresh(f"{hint}.dims"), const_value=ir.tensor(list(shape.numpy()), name="")
        )
        dims.const_value.name = dims.name  # type: ignore[union-attr]
        graph.register_initializer(dims)
        empty = node("Shape", [trigger], start=0, end=0)  # empty, but only once the trigger exists
        joined = node("Concat", [empty.outputs[0], dims], axis=0)
        reshaped = node("Reshape", [value, joined.outputs[0]])
        nodes += [empty, joined, reshaped]
        source = reshaped.outputs[0]
    cast = node("Cast", [source], to=to.value)
    cast.outputs[0].dtype, cast.outputs[0].shape = to, shape
    return [*nodes, cast]


def splice_after(
    value: ir.Value, nodes: Sequence[ir.Node], output: ir.Value, names: NameAuthority
) -> None:
    """Insert ``nodes`` after ``value``'s producer and make every other reader of ``value`` read
    ``output``.

    ``nodes`` read ``value`` (and keep reading it) and compute ``output`` from it, e.g. ``output =
    value + delta``.
    A graph output keeps its name: ``output`` takes ``value``'s name and ``value`` gets a fresh one.

    Raises:
        ValueError: if ``value`` has no producer in a graph (a graph input or initializer).
    """
    producer = value.producer()
    graph = producer.graph if producer is not None else None
    if producer is None or graph is None:
        raise InvalidValueError(
            f"value {value.name!r} has no producer node: nothing to insert nodes after"
        )
    own = set(nodes)
    kept = [(use.node, use.idx) for use in value.uses() if use.node in own]
    was_output = value.is_graph_output()
    value.replace_all_uses_with(output, replace_graph_outputs=True)
    for node, index in kept:
        node.replace_input_with(index, value)
    if was_output:
        name = value.name
        value.name = names.fresh(f"{name}.before")
        output.name = name
    graph.insert_after(producer, list(nodes))


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """Add an initializer ``name`` holding ``array`` (its type and shape set) to ``graph``; return
    its value.

    Raises:
        ValueError: if ``graph`` already has a value named ``name``.
    """
    if name in graph.initializers or any(v.name == name for v in graph.inputs):
        raise InvalidValueError(f"the graph already has a value named {name!r}")
    tensor = ir.Tensor(array, name=name)
    value = ir.Value(
        name=name,
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        shape=ir.Shape(array.shape),
    )
    value.const_value = tensor
    graph.register_initializer(value)
    return value
