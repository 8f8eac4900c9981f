"""The name authority of one graph: fresh names derived from the names the graph already uses."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.walk import all_nodes, proto_nodes


def graph_names(graph: ir.Graph) -> NameAuthority:
    """A :class:`~onnxblocks._core.naming.NameAuthority` that knows every value and node name of
    ``graph``.

    Names in subgraphs count as used too, so a fresh name never shadows one of them.
    """
    used: set[str] = set()
    used.update(v.name for v in graph.inputs if v.name)
    used.update(v.name for v in graph.outputs if v.name)
    used.update(graph.initializers)
    for node in all_nodes(graph):
        if node.name:
            used.add(node.name)
        used.update(v.name for v in node.outputs if v.name)
        used.update(v.name for v in node.inputs if v is not None and v.name)
    return NameAuthority(used)


def proto_graph_names(graph: onnx.GraphProto) -> NameAuthority:
    """:func:`graph_names` for a ``GraphProto``: every value and node name it uses, subgraphs
    included.

    For a few names added to a protobuf graph that is not otherwise edited (building
    its IR would cost more than the names).
    """
    used: set[str] = set()
    used.update(v.name for v in (*graph.input, *graph.output, *graph.value_info) if v.name)
    used.update(t.name for t in graph.initializer if t.name)
    for node in proto_nodes(graph):
        if node.name:
            used.add(node.name)
        used.update(n for n in (*node.input, *node.output) if n)
    return NameAuthority(used)
