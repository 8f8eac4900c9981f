"""Values the gradient does not flow through: ``Identity`` nodes named ``onnxblocks.stop_gradient``.

A block that computes a gradient itself (the chunked cross entropy,
:mod:`onnxblocks.losses.chunked`) writes its result through such an ``Identity`` and adds a
surrogate term whose gradient is that result. ONNX Runtime's gradient builder has no
stop-gradient op, so while it builds:

* each reader of a stop's output reads a graph input of its own (an *alias*) instead, so no
  gradient reaches the nodes that computed the value (a ``Loop`` among them, which ONNX Runtime
  cannot differentiate);
* the stop's input is a graph output, so the builder keeps those nodes.

:func:`restore_stopped` undoes both on ONNX Runtime's result: the readers read the value again
and the extra outputs leave the graph. Outside training builds the node is a plain ``Identity``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxblocks._core.contracts import STOP_GRADIENT_NODE
from onnxblocks._core.errors import GradientError, preview
from onnxblocks.ir.edit import remove_unused_nodes, values_by_name
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.types import has_type, infer_types, type_proto
from onnxblocks.ir.walk import reads

__all__ = ["StoppedGradients", "cut_stopped", "is_stop", "restore_stopped"]


@dataclass(frozen=True)
class StoppedGradients:
    """What :func:`cut_stopped` changed.

    Attributes:
        aliases: Each alias graph input, and the value (the stop's input) it stands for.
        kept: The values made graph outputs so that ONNX Runtime keeps their producers.
    """

    aliases: Mapping[str, str] = field(default_factory=dict)
    kept: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.aliases)


def is_stop(node: ir.Node) -> bool:
    """True for a stop-gradient ``Identity``."""
    return (
        node.op_type == "Identity"
        and node.domain in ("", "ai.onnx")
        and (node.name or "").startswith(STOP_GRADIENT_NODE)
    )


def _owned(stops: list[ir.Node]) -> set[ir.Node]:
    """The nodes whose every output flows only into ``stops`` (directly or through such nodes)."""
    owned: set[ir.Node] = set(stops)
    frontier = list(stops)
    while frontier:
        node = frontier.pop()
        for value in reads(node):
            producer = value.producer()
            if producer is None or producer in owned or producer.graph is not node.graph:
                continue
            users = {use.node for out in producer.outputs for use in out.uses()}
            outputs = any(o.is_graph_output() for o in producer.outputs)
            if users <= owned and not outputs:
                owned.add(producer)
                frontier.append(producer)
    return owned


def cut_stopped(model: ir.Model, requires_grad: Iterable[str]) -> StoppedGradients:
    """Give each reader of a stop's output an alias input, and keep the stop's input as an output.

    Args:
        model: The training copy of the forward model, parameters already graph inputs (changed
            in place).
        requires_grad: The values whose gradient is built.

    Returns:
        The aliases and kept outputs, for :func:`restore_stopped`.

    Raises:
        GradientError: when a value of ``requires_grad`` is read only to compute a stopped value:
            its gradient would miss that use.
    """
    wanted = set(requires_grad)
    graph = model.graph
    stops = [n for n in graph if is_stop(n)]
    if not stops:
        return StoppedGradients()
    if not all(has_type(n.outputs[0]) or has_type(n.inputs[0]) for n in stops):
        infer_types(model)  # an alias input needs a type
    trained = sorted({v.name or "" for n in _owned(stops) for v in reads(n) if v.name in wanted})
    if trained:
        raise GradientError(
            f"Stop-gradient nodes ('{stops[0].name}'...) compute their values from the "
            f"trainable {preview(trained)}, whose gradient would then miss that use. Freeze "
            "them (a chunked loss's head_weight is a frozen weight), or use the loss without "
            "chunk_size."
        )
    names = graph_names(graph)
    aliases: dict[str, str] = {}
    kept: list[str] = []
    for stop in stops:
        source, out = stop.inputs[0], stop.outputs[0]
        assert source is not None and source.name
        typed = type_proto(out) or type_proto(source)
        alias = ir.Value(
            name=names.fresh(f"{out.name}.stopped"),
            type=None if typed is None else ir.serde.deserialize_type_proto_for_type(typed),
            shape=None if typed is None else ir.serde.deserialize_type_proto_for_shape(typed),
        )
        graph.inputs.append(alias)
        ir.convenience.replace_all_uses_with(out, alias)
        if out.is_graph_output():
            raise GradientError(
                f"The stop-gradient node '{stop.name}' writes the graph output '{out.name}'; "
                "a stopped value is an intermediate of the loss."
            )
        graph.remove(stop, safe=True)
        if not source.is_graph_output() and not source.is_graph_input():
            graph.outputs.append(source)
            kept.append(source.name)
        aliases[alias.name or ""] = source.name
    # what the stopped values were computed from instead (a head's [B, T, V] logits) would run
    remove_unused_nodes(graph)
    return StoppedGradients(aliases, tuple(kept))


def restore_stopped(graph: ir.Graph, done: StoppedGradients) -> bool:
    """On ONNX Runtime's result, read each alias as its value again and drop the kept outputs (in
    place); True when the graph changed.

    Raises:
        GradientError: when ONNX Runtime dropped a stopped value.
    """
    if not done:
        return False
    values = values_by_name(graph)
    for alias_name, source_name in done.aliases.items():
        alias, source = values.get(alias_name), values.get(source_name)
        if source is None:
            raise GradientError(
                f"ONNX Runtime's gradient builder dropped the stopped value '{source_name}'."
            )
        if alias is None:  # nothing read it
            continue
        if alias in graph.inputs:
            graph.inputs.remove(alias)
        ir.convenience.replace_all_uses_with(alias, source)
    for name in done.kept:
        value = values.get(name)
        if value is not None and value in graph.outputs:
            graph.outputs.remove(value)
    graph.sort()  # ONNX Runtime ordered the stopped values' producers after their readers
    return True
