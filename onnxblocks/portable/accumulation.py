"""Gradient accumulation in standard ops: the portable training model's contract.

ONNX Runtime's training build accumulates each gradient in place
(``InPlaceAccumulatorV2``) and outputs a bool flag. A portable training model keeps
the same inputs (``<p>_grad.accumulation.buffer`` per trainable parameter, then
``lazy_reset_grad``) and outputs the **new buffer value** as
``<p>_grad.accumulation.out``::

    <p>_grad.accumulation.out = lazy_reset_grad ? <p>_grad : buffer + <p>_grad

same type and shape as ``p`` (one ``If`` on ``lazy_reset_grad`` for all parameters). The
runtime feeds it back as the next step's buffer.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

from onnxblocks._core.contracts import LAZY_RESET_GRAD, accumulated_name
from onnxblocks._core.errors import PortabilityError
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass

ACCUMULATOR = "InPlaceAccumulatorV2"


def accumulators(graph: ir.Graph) -> list[ir.Node]:
    """The ``InPlaceAccumulatorV2`` nodes of a training graph, in graph order."""
    return [n for n in graph if n.op_type == ACCUMULATOR]


def _parameters(graph: ir.Graph) -> list[ir.Value]:
    by_output = {accumulated_name(v.name): v for v in graph.inputs if v.name}
    found = []
    for node in accumulators(graph):
        out = node.outputs[0].name if node.outputs else ""
        param = by_output.get(out or "")
        if param is None:
            raise PortabilityError(
                f"Accumulator node '{node.name}' writes '{out}', which is not "
                f"'{accumulated_name('<param>')}' for a "
                "graph input: the training model does not follow onnxblocks' contract. Generate "
                "it with "
                "onnxblocks.generate_artifacts."
            )
        found.append(param)
    return found


class AccumulateGradients(Pass):
    """Rewrite the accumulators into one standard ``If`` on ``lazy_reset_grad``.

    Its ``then`` branch passes each gradient through, its ``else`` branch adds it to the
    buffer (one pass over each buffer either way; ``Where`` would read both and runs
    several times slower on ONNX Runtime's CPU). Each ``<p>_grad.accumulation.out``
    output becomes a tensor of ``p``'s type and shape. :attr:`trainable` holds the
    trainable parameters afterwards, in the order of the accumulators.
    """

    name = "accumulation"

    def __init__(self) -> None:
        super().__init__()
        self.trainable: list[str] = []

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        params = _parameters(graph)
        self.trainable = [p.name for p in params if p.name is not None]
        found = accumulators(graph)
        if not found:
            return {}
        flags = {n.inputs[2] for n in found if len(n.inputs) > 2 and n.inputs[2] is not None}
        if len(flags) > 1:
            raise PortabilityError(
                "The accumulators read different reset flags "
                f"{sorted(str(f.name) for f in flags)}; expected "
                f"'{LAZY_RESET_GRAD}'."
            )
        names = graph_names(graph)
        new_nodes: list[ir.Node] = []
        new_values: list[ir.Value] = []
        if not flags:
            for node in found:
                buffer, grad = node.inputs[0], node.inputs[1]
                add = ir.node("Add", [buffer, grad], name=names.fresh("Add"))
                new_nodes.append(add)
                new_values.append(add.outputs[0])
        else:
            then_nodes, else_nodes = [], []
            for node in found:
                buffer, grad = node.inputs[0], node.inputs[1]
                hint = grad.name if grad is not None and grad.name else "gradient"
                passed = ir.Value(name=names.fresh(f"{hint}.reset"))
                summed = ir.Value(name=names.fresh(f"{hint}.accumulated"))
                then_nodes.append(
                    ir.node("Identity", [grad], outputs=[passed], name=names.fresh("Identity"))
                )
                else_nodes.append(
                    ir.node("Add", [buffer, grad], outputs=[summed], name=names.fresh("Add"))
                )
            for param, node in zip(params, then_nodes, strict=True):
                _like(node.outputs[0], param)
            for param, node in zip(params, else_nodes, strict=True):
                _like(node.outputs[0], param)
            then_branch = ir.Graph(
                [], [n.outputs[0] for n in then_nodes], nodes=then_nodes, name=names.fresh("reset")
            )
            else_branch = ir.Graph(
                [],
                [n.outputs[0] for n in else_nodes],
                nodes=else_nodes,
                name=names.fresh("accumulate"),
            )
            (flag,) = flags
            branch = ir.node(
                "If",
                [flag],
                {"then_branch": then_branch, "else_branch": else_branch},
                num_outputs=len(found),
                name=names.fresh("GradientAccumulation"),
            )
            new_nodes.append(branch)
            new_values.extend(branch.outputs)
        olds = [n.outputs[0] for n in found]
        ir.convenience.replace_nodes_and_values(
            graph, found[-1], found, new_nodes, olds, new_values
        )
        for value, param in zip(new_values, params, strict=True):
            _like(value, param)
        return {ACCUMULATOR: len(found)}


def _like(value: ir.Value, param: ir.Value) -> None:
    value.type = param.type
    value.shape = ir.Shape(param.shape) if param.shape is not None else None
