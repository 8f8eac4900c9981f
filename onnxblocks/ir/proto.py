"""Protobuf-level graph edits at the boundaries, where building the IR would cost a round trip.

Two places edit a ``GraphProto`` directly: the hand-off to ONNX Runtime's C++
gradient builder (which takes and returns protobuf) and the signature work around
it (lifting parameters to inputs, restoring held constants, choosing outputs).
Those edits touch the graph's input, output and initializer lists, never its
nodes; they are written here once, beside the read-only helpers they use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TypeVar

import onnx

from onnxblocks.ir.walk import proto_nodes

_T = TypeVar("_T")


def replace_field(field: Any, items: Iterable[_T]) -> None:
    """Replace the contents of a repeated protobuf field (``graph.input``, ``.output``,
    ``.initializer``).

    ``items`` may hold elements of ``field`` itself (protobuf keeps them valid when
    the field is cleared; ``extend`` copies them back in).
    """
    kept = list(items)
    del field[:]
    field.extend(kept)


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """The names the subgraphs of ``node`` read, recursively (values of the outer graphs
    included).
    """
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in graphs:
            for inner in proto_nodes(sub):
                names.update(inner.input)
    return names


def readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Each value name -> the top-level nodes that read it (a subgraph's reads count for its
    node).
    """
    found: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in set(node.input) | subgraph_reads(node):
            if name:
                found[name].append(node)
    return found


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of ``model`` (callers pass working models whose large weights are held stubs)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def set_attribute(node: onnx.NodeProto, name: str, value: object) -> None:
    """Set (or replace) an attribute of a protobuf node."""
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))
