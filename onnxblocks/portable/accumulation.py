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

import onnx
from onnx import helper

from onnxblocks._core.contracts import LAZY_RESET_GRAD, accumulated_name
from onnxblocks._core.errors import PortabilityError
from onnxblocks.gradient import _graph

ACCUMULATOR = "InPlaceAccumulatorV2"


def accumulators(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ``InPlaceAccumulatorV2`` nodes of a training model, in graph order."""
    return [n for n in model.graph.node if n.op_type == ACCUMULATOR]


def trainable_parameters(model: onnx.ModelProto) -> list[str]:
    """Names of the trainable parameters of a training model: those whose gradient it accumulates.

    Raises:
        PortabilityError: if an accumulator's output is not named ``<p>_grad.accumulation.out``
            for a parameter ``p`` among the graph inputs.
    """
    graph_inputs = {i.name for i in model.graph.input}
    names = []
    for node in accumulators(model):
        out = node.output[0] if node.output else ""
        param = next((p for p in graph_inputs if accumulated_name(p) == out), None)
        if param is None:
            raise PortabilityError(
                f"Accumulator node '{node.name}' writes '{out}', which is not '<param>_grad.accumulation.out' for a "
                "graph input: the training model does not follow onnxblocks' contract. Generate it with "
                "onnxblocks.generate_artifacts."
            )
        names.append(param)
    return names


def portable_accumulation(model: onnx.ModelProto) -> list[str]:
    """Rewrite the accumulators of ``model``, in place, into one standard ``If`` on ``lazy_reset_grad``.

    Its ``then`` branch passes each gradient through, its ``else`` branch adds it to the
    buffer (one pass over each buffer either way; ``Where`` would read both and runs
    several times slower on ONNX Runtime's CPU). Each ``<p>_grad.accumulation.out``
    output becomes a tensor of ``p``'s type and shape.

    Returns:
        The trainable parameters, in the order of the accumulators.
    """
    params = trainable_parameters(model)
    graph = model.graph
    names = _graph.name_authority(graph)
    types = {i.name: i.type for i in graph.input}
    found = [(i, n) for i, n in enumerate(graph.node) if n.op_type == ACCUMULATOR]
    flags = {n.input[2] for _, n in found if len(n.input) > 2 and n.input[2]}
    if len(flags) > 1:
        raise PortabilityError(
            f"The accumulators read different reset flags {sorted(flags)}; expected '{LAZY_RESET_GRAD}'."
        )
    replacement: list[onnx.NodeProto] = []
    then_nodes: list[onnx.NodeProto] = []
    else_nodes: list[onnx.NodeProto] = []
    then_out: list[onnx.ValueInfoProto] = []
    else_out: list[onnx.ValueInfoProto] = []
    outs: list[str] = []
    for (_, node), param in zip(found, params, strict=True):
        buffer, grad, out = node.input[0], node.input[1], node.output[0]
        if not flags:
            replacement.append(helper.make_node("Add", [buffer, grad], [out], name=names.fresh("Add")))
            continue
        passed, summed = names.fresh(f"{grad}.reset"), names.fresh(f"{grad}.accumulated")
        then_nodes.append(helper.make_node("Identity", [grad], [passed], name=names.fresh("Identity")))
        else_nodes.append(helper.make_node("Add", [buffer, grad], [summed], name=names.fresh("Add")))
        then_out.append(helper.make_value_info(passed, types[param]))
        else_out.append(helper.make_value_info(summed, types[param]))
        outs.append(out)
    if flags:
        then_branch = helper.make_graph(then_nodes, names.fresh("reset"), [], then_out)
        else_branch = helper.make_graph(else_nodes, names.fresh("accumulate"), [], else_out)
        (flag,) = flags
        replacement.append(
            helper.make_node(
                "If",
                [flag],
                outs,
                name=names.fresh("GradientAccumulation"),
                then_branch=then_branch,
                else_branch=else_branch,
            )
        )
    last = found[-1][0] if found else -1
    nodes = [n for i, n in enumerate(graph.node) if n.op_type != ACCUMULATOR or i == last]
    at = next((i for i, n in enumerate(nodes) if n.op_type == ACCUMULATOR), len(nodes))
    del graph.node[:]
    graph.node.extend([*nodes[:at], *replacement, *nodes[at + 1 :]])
    positions = {o.name: i for i, o in enumerate(graph.output)}
    for param in params:
        out = accumulated_name(param)
        if out in positions:
            graph.output[positions[out]].CopyFrom(helper.make_value_info(out, types[param]))
    return params
