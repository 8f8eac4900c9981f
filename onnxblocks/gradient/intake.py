"""What a model must satisfy when it enters onnxblocks, fixed on a copy where it can be, refused
clearly where not.

* :func:`fit_model`: an ai.onnx opset import is required, a model above the
  runtime's opset is converted down (:func:`onnxblocks.ir.opset.fit_opset`),
  and nodes out of order are sorted topologically.
* :func:`sort_topologically`: the node order onnx and ONNX Runtime require
  (a producer before its readers, subgraph reads included), stable for a graph
  already in order; a cycle is refused naming its nodes.
* :func:`check_ranks`: graph inputs and outputs whose rank is unknown, which
  onnx's checker refuses, are named before the check runs.

The caller's ModelProto is never changed: :func:`fit_model` works on the copy it is given.
"""

from __future__ import annotations

import heapq
import itertools

import onnx
import onnx_ir as ir
from onnx_ir.serde import serialize_graph

from onnxblocks._core.errors import InvalidValueError, preview
from onnxblocks.ir import walk
from onnxblocks.ir.opset import fit_opset
from onnxblocks.ir.serde import graph_from_proto

__all__ = ["check_ranks", "fit_model", "is_sorted", "sort_topologically"]


def fit_model(model: onnx.ModelProto, what: str = "the base model") -> onnx.ModelProto:
    """Check ``model``'s opset import, convert it down if needed, and sort its nodes, in place where
    possible.

    Args:
        model: A working copy (it is changed in place; its large weights may be stubs).
        what: How messages name the model.

    Returns:
        ``model``, or a converted copy when its opset is above what the runtime implements.

    Raises:
        ValueError: for a model without an ai.onnx opset import, one that cannot be converted
            to a supported opset (naming the ops that block it), or whose nodes form a cycle.
    """
    model = fit_opset(model, what)
    sort_topologically(model.graph, what)
    return model


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    )


def is_sorted(graph: onnx.GraphProto) -> bool:
    """True when every node comes after the producers of the values it reads (subgraph reads
    included).
    """
    if any(_has_subgraph(node) for node in graph.node):  # what subgraphs read: from the IR
        return graph_is_sorted(graph_from_proto(graph))
    produced = {out for node in graph.node for out in node.output if out}
    seen: set[str] = set()
    for node in graph.node:
        if any(name in produced and name not in seen for name in node.input):
            return False
        seen.update(node.output)
    return True


def graph_is_sorted(graph: ir.Graph) -> bool:
    """True when every node of ``graph`` comes after the producers of the values it reads
    (subgraph reads included).
    """
    position = {node: i for i, node in enumerate(graph)}
    return all(
        position.get(v.producer(), -1) < i  # type: ignore[arg-type]
        for i, node in enumerate(graph)
        for v in walk.reads(node)
    )


def sort_topologically(graph: onnx.GraphProto, what: str = "the base model") -> int:
    """Put ``graph``'s nodes in topological order, in place, keeping the given order where it is
    one.

    Returns:
        The number of nodes that moved (0 for a sorted graph).

    Raises:
        ValueError: if the nodes read each other in a cycle (naming some of them).
    """
    if is_sorted(graph):
        return 0
    ir_graph = graph_from_proto(graph)
    nodes = list(ir_graph)
    position = {node: i for i, node in enumerate(nodes)}
    waiting = [0] * len(nodes)
    readers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        producers = {position[p] for v in walk.reads(node) if (p := v.producer()) in position}
        for source in producers - {i}:
            waiting[i] += 1
            readers[source].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for reader in readers[i]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    if len(order) < len(nodes):
        stuck = [
            nodes[i].name or f"{nodes[i].op_type} writing '{nodes[i].outputs[0].name}'"
            for i in set(range(len(nodes))) - set(order)
        ]
        raise InvalidValueError(
            f"The nodes of {what} read each other in a cycle, so no order computes them: "
            f"{preview(sorted(stuck))}. "
            "An ONNX graph must be acyclic; fix the model (a loop must be a Loop node)."
        )
    moved = sum(1 for place, i in enumerate(order) if place != i)
    first = nodes[order[0]]
    if ir_graph.node(0) is not first:
        ir_graph.insert_before(ir_graph.node(0), first)
    for before, after in itertools.pairwise(order):
        ir_graph.insert_after(nodes[before], nodes[after])  # moves the node
    graph.CopyFrom(serialize_graph(ir_graph))
    return moved


def _has_rank(value: onnx.ValueInfoProto) -> bool:
    kind = value.type.WhichOneof("value")
    return kind != "tensor_type" or value.type.tensor_type.HasField("shape")


def check_ranks(model: onnx.ModelProto, what: str, outputs: bool = True) -> None:
    """Raise a clear error for graph inputs (and ``outputs``) whose rank is unknown.

    onnx's checker requires the rank (not the dims) of every graph input and output.

    Raises:
        ValueError: naming the inputs / outputs without a shape.
    """
    inputs = [v.name for v in model.graph.input if not _has_rank(v)]
    missing = inputs or (
        [v.name for v in model.graph.output if not _has_rank(v)] if outputs else []
    )
    if not missing:
        return
    names = preview(missing)
    roles = (
        "graph inputs" if inputs else "graph outputs"
    )  # the inputs first: outputs computed from them follow
    raise InvalidValueError(
        f"The {roles} {names} of {what} have no shape (their rank is unknown), which onnx's "
        "checker refuses "
        "and the losses need. Declare their shape in the base model (symbolic dims are fine, "
        "e.g. ['batch', 3]), "
        "for instance with onnx.helper.make_tensor_value_info(name, elem_type, shape)."
    )
