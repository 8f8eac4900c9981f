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
from onnxblocks.ir.walk import all_nodes, reads


def replace_node(node: ir.Node, new_nodes: Sequence[ir.Node], new_outputs: Sequence[ir.Value | None]) -> None:
    """Replace ``node`` by ``new_nodes`` (inserted where it was), its outputs by ``new_outputs``, in order.

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
                    f"Output {old.name!r} of node {node.name!r} is still read but has no replacement."
                )
            continue
        olds.append(old)
        news.append(new)
    ir.convenience.replace_nodes_and_values(graph, node, [node], list(new_nodes), olds, news)


def remove_unused_nodes(graph: ir.Graph, keep: Iterable[ir.Value] = ()) -> int:
    """Remove, in place, the nodes whose outputs reach no graph output (nor ``keep``); return how many.

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
    """Make ``outputs`` the graph's outputs and drop every node, input and initializer they do not need."""
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
    """Rename, in place, every value of ``graph`` (subgraphs included) named in ``mapping``; return how many."""
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


def splice_after(value: ir.Value, nodes: Sequence[ir.Node], output: ir.Value, names: NameAuthority) -> None:
    """Insert ``nodes`` after ``value``'s producer and make every other reader of ``value`` read ``output``.

    ``nodes`` read ``value`` (and keep reading it) and compute ``output`` from it, e.g. ``output = value + delta``.
    A graph output keeps its name: ``output`` takes ``value``'s name and ``value`` gets a fresh one.

    Raises:
        ValueError: if ``value`` has no producer in a graph (a graph input or initializer).
    """
    producer = value.producer()
    graph = producer.graph if producer is not None else None
    if producer is None or graph is None:
        raise InvalidValueError(f"value {value.name!r} has no producer node: nothing to insert nodes after")
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
    """Add an initializer ``name`` holding ``array`` (its type and shape set) to ``graph``; return its value.

    Raises:
        ValueError: if ``graph`` already has a value named ``name``.
    """
    if name in graph.initializers or any(v.name == name for v in graph.inputs):
        raise InvalidValueError(f"the graph already has a value named {name!r}")
    tensor = ir.Tensor(array, name=name)
    value = ir.Value(name=name, type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), shape=ir.Shape(array.shape))
    value.const_value = tensor
    graph.register_initializer(value)
    return value
