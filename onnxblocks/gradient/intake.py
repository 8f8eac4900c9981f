"""What a model must satisfy when it enters onnxblocks, fixed on a copy where it can be, refused clearly where not.

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

import onnx

from onnxblocks._core.errors import preview
from onnxblocks.gradient._graph import subgraph_reads
from onnxblocks.ir.opset import fit_opset

__all__ = ["check_ranks", "fit_model", "is_sorted", "sort_topologically"]


def fit_model(model: onnx.ModelProto, what: str = "the base model") -> onnx.ModelProto:
    """Check ``model``'s opset import, convert it down if needed, and sort its nodes, in place where possible.

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


def _reads(node: onnx.NodeProto) -> set[str]:
    return {n for n in node.input if n} | subgraph_reads(node)


def is_sorted(graph: onnx.GraphProto) -> bool:
    """True when every node comes after the producers of the values it reads."""
    produced = {out for node in graph.node for out in node.output if out}
    seen: set[str] = set()
    for node in graph.node:
        if any(name in produced and name not in seen for name in _reads(node)):
            return False
        seen.update(node.output)
    return True


def sort_topologically(graph: onnx.GraphProto, what: str = "the base model") -> int:
    """Put ``graph``'s nodes in topological order, in place, keeping the given order where it is one.

    Returns:
        The number of nodes that moved (0 for a sorted graph).

    Raises:
        ValueError: if the nodes read each other in a cycle (naming some of them).
    """
    if is_sorted(graph):
        return 0
    nodes = list(graph.node)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    waiting = [0] * len(nodes)
    readers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for source in {producer[n] for n in _reads(node) if n in producer and producer[n] != i}:
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
            nodes[i].name or f"{nodes[i].op_type} writing '{nodes[i].output[0]}'"
            for i in set(range(len(nodes))) - set(order)
        ]
        raise ValueError(
            f"The nodes of {what} read each other in a cycle, so no order computes them: {preview(sorted(stuck))}. "
            "An ONNX graph must be acyclic; fix the model (a loop must be a Loop node)."
        )
    moved = sum(1 for position, i in enumerate(order) if position != i)
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)
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
    missing = inputs or ([v.name for v in model.graph.output if not _has_rank(v)] if outputs else [])
    if not missing:
        return
    names = preview(missing)
    roles = "graph inputs" if inputs else "graph outputs"  # the inputs first: outputs computed from them follow
    raise ValueError(
        f"The {roles} {names} of {what} have no shape (their rank is unknown), which onnx's checker refuses "
        "and the losses need. Declare their shape in the base model (symbolic dims are fine, e.g. ['batch', 3]), "
        "for instance with onnx.helper.make_tensor_value_info(name, elem_type, shape)."
    )
