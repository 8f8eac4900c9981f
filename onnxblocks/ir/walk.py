"""Iterating over a graph and the graphs nested in its nodes' attributes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx
import onnx_ir as ir


def all_nodes(graph: ir.Graph | ir.Function) -> Iterator[ir.Node]:
    """Every node of ``graph`` and of the subgraphs in its nodes' attributes, depth first, in
    order.
    """
    yield from ir.traversal.RecursiveGraphIterator(graph)


def proto_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a ``GraphProto`` and of the subgraphs in its nodes' attributes, depth first, in
    order.

    For a read-only look at a protobuf model where building its IR would cost more
    than the work at hand (e.g. listing op types before onnx's version converter,
    which copies the model anyway); edits go through the IR.
    """
    stack: list[Iterator[onnx.NodeProto]] = [iter(graph.node)]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            continue
        yield node
        inner = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        inner += [
            g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs
        ]
        for sub in reversed(inner):
            stack.append(iter(sub.node))


def subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    """The graphs in ``node``'s attributes (``If`` branches, ``Loop``/``Scan`` bodies), not
    recursively.
    """
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()


def outer_reads(node: ir.Node) -> set[ir.Value]:
    """The values defined outside ``node`` that its subgraphs read (recursively)."""
    inner_graphs = {id(g) for g in _nested(node)}
    reads: set[ir.Value] = set()
    for sub in subgraphs(node):
        for inner in all_nodes(sub):
            for value in inner.inputs:
                if value is not None and id(value.graph) not in inner_graphs:
                    reads.add(value)
    return reads


def reads(node: ir.Node) -> list[ir.Value]:
    """The values ``node`` reads: its inputs, then what its subgraphs read from outside it."""
    direct = [v for v in node.inputs if v is not None]
    seen = set(direct)
    return direct + [v for v in outer_reads(node) if v not in seen]


def _nested(node: ir.Node) -> Iterator[ir.Graph]:
    for sub in subgraphs(node):
        yield sub
        for inner in sub:
            yield from _nested(inner)


@dataclass(frozen=True)
class Read:
    """One node reading a value, directly or through ``Identity`` nodes.

    Attributes:
        node: The reader (an ``Identity`` only when its output is a graph output, or inside a
        subgraph).
        index: The input of ``node`` that reads the value (or the last ``Identity``'s output).
        via: The ``Identity`` nodes between the value and ``node``, nearest to the value first.
    """

    node: ir.Node
    index: int
    via: tuple[ir.Node, ...] = ()


def reads_through_identity(value: ir.Value) -> list[Read]:
    """The nodes that read ``value``, following the chains of ``Identity`` nodes of its own graph.

    Exporters that merge identical initializers leave one initializer read by
    ``Identity`` nodes named after the other parameters; the readers past them are
    the ones that use the value. An ``Identity`` whose output is a graph output is
    a reader itself.
    """
    found: list[Read] = []
    queue: list[tuple[ir.Value, tuple[ir.Node, ...]]] = [(value, ())]
    while queue:  # breadth first: direct readers before those behind an Identity
        current, via = queue.pop(0)
        for node, index in current.uses():
            out = node.outputs[0] if node.outputs else None
            follow = (
                node.op_type == "Identity"
                and node.domain in ("", "ai.onnx")
                and node.graph is value.graph
                and out is not None
                and not out.is_graph_output()
                and node not in via
            )
            if follow and out is not None:
                queue.append((out, (*via, node)))
            else:
                found.append(Read(node, index, via))
    return found
