"""What depends on what in a forward graph, and the checks that must pass before ONNX Runtime sees
it.

ONNX Runtime's gradient builder aborts the process (SIGABRT, an assertion on a
node's input index) on a control-flow node whose subgraphs read values that
depend on a trainable parameter, and reports a constant loss as "couldn't find
the producer node". :func:`check_differentiable` finds both cases first and
raises a :class:`~onnxblocks.errors.GradientError` naming the node or values.

A value *depends differentiably* on another when a path of nodes leads from one
to the other without crossing an input that ONNX Runtime never differentiates
(:data:`STOP_INPUTS`: shapes, indices, conditions, comparisons...) or a cast to
a non-float type. Reads from inside a subgraph count as inputs of the node that
holds the subgraph.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import onnx
import onnx_ir as ir

from onnxblocks._core.errors import GradientError, preview
from onnxblocks.ir.edit import values_by_name
from onnxblocks.ir.walk import outer_reads, reads, subgraphs

#: Inputs (by position; ``None``: all of them) through which ONNX Runtime builds no gradient.
#: A subset of ONNX Runtime 1.19's own list, plus ops whose outputs are indices or booleans.
STOP_INPUTS: dict[str, frozenset[int] | None] = {
    **dict.fromkeys(
        (
            "Not",
            "And",
            "Or",
            "Xor",
            "Equal",
            "Less",
            "LessOrEqual",
            "Greater",
            "GreaterOrEqual",
            "IsInf",
            "IsNaN",
            "NonZero",
            "Shape",
            "Size",
            "ConstantOfShape",
            "Range",
            "OneHot",
            "ArgMax",
            "ArgMin",
            "EyeLike",
            "RandomNormalLike",
            "RandomUniformLike",
            "Bernoulli",
            "Multinomial",
        ),
        None,
    ),
    "Pow": frozenset({1}),
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "GatherND": frozenset({1}),
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "ReduceSum": frozenset({1}),
    "Split": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "TopK": frozenset({1}),
    "Dropout": frozenset({1, 2}),
    "Clip": frozenset({1, 2}),
    "Where": frozenset({0}),
    "Scatter": frozenset({1}),
    "ScatterElements": frozenset({1}),
    "ScatterND": frozenset({1}),
    "SoftmaxCrossEntropyLoss": frozenset({1, 2}),
}
#: Element types a differentiable value may have.
_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.DOUBLE,
}


def has_subgraph(node: ir.Node) -> bool:
    """True for a node with a graph attribute (``If``, ``Loop``, ``Scan``...)."""
    return next(subgraphs(node), None) is not None


def _passes(node: ir.Node, value: ir.Value) -> bool:
    """Whether a gradient can flow from ``node``'s outputs back into its input ``value``."""
    if node.domain not in ("", "ai.onnx"):
        return True
    if node.op_type == "Cast":
        return node.attributes.get_int("to", 0) in _FLOAT_TYPES
    stops = STOP_INPUTS.get(node.op_type, frozenset())
    if stops is None:
        return False
    positions = [i for i, v in enumerate(node.inputs) if v is value]
    return not positions or any(i not in stops for i in positions)  # not positions: a subgraph read


def _values(graph: ir.Graph, names: Iterable[str | ir.Value]) -> list[ir.Value]:
    table: dict[str, ir.Value] | None = None
    found = []
    for item in names:
        if isinstance(item, ir.Value):
            found.append(item)
            continue
        table = table if table is not None else values_by_name(graph)
        if item in table:
            found.append(table[item])
    return found


def downstream_values(
    graph: ir.Graph, sources: Iterable[str | ir.Value], differentiable: bool = True
) -> set[ir.Value]:
    """The values of ``graph`` that depend on ``sources`` (values or names; ``sources`` included).

    Args:
        graph: The graph (subgraph reads count as reads of the node holding the subgraph).
        sources: The values to start from (names of values the graph does not have are ignored).
        differentiable: Follow only the inputs a gradient flows through (see :data:`STOP_INPUTS`).
    """
    readers: dict[ir.Value, list[ir.Node]] = defaultdict(list)
    for node in graph:
        for value in reads(node):
            readers[value].append(node)
    reached = set(_values(graph, sources))
    stack = list(reached)
    while stack:
        value = stack.pop()
        for node in readers.get(value, ()):
            if differentiable and not _passes(node, value):
                continue
            for out in node.outputs:
                if out not in reached:
                    reached.add(out)
                    stack.append(out)
    return reached


def upstream_values(
    graph: ir.Graph, targets: Iterable[str | ir.Value], differentiable: bool = True
) -> set[ir.Value]:
    """The values ``targets`` (values or names) depend on (``targets`` included).

    Args:
        graph: The graph (subgraph reads count as reads of the node holding the subgraph).
        targets: The values to start from.
        differentiable: Follow only the inputs a gradient flows through (see :data:`STOP_INPUTS`).
    """
    reached = set(_values(graph, targets))
    stack = list(reached)
    while stack:
        node = stack.pop().producer()
        if node is None or node.graph is not graph:
            continue
        for value in reads(node):
            if value not in reached and (not differentiable or _passes(node, value)):
                reached.add(value)
                stack.append(value)
    return reached


def check_differentiable(graph: ir.Graph, requires_grad: Iterable[str], loss: str) -> None:
    """Refuse what ONNX Runtime's gradient builder would crash on, or report without naming the
    cause.

    Run it once parameters are graph inputs. A parameter that does not reach a loss
    that depends on something else is left to ONNX Runtime, whose message names it.

    Raises:
        GradientError: for a control-flow node (``If``, ``Loop``, ``Scan``) that reads a
            value depending on a value of ``requires_grad`` and that the loss depends on;
            for a loss that depends differentiably on no graph input (a constant loss).
    """
    wanted = list(dict.fromkeys(requires_grad))
    if wanted:
        _check_control_flow(graph, wanted, loss)
    if loss not in {v.name for v in downstream_values(graph, list(graph.inputs))}:
        what = (
            f"any value that requires a gradient ({preview(wanted)})"
            if wanted
            else "any graph input"
        )
        raise GradientError(
            f"The loss '{loss}' does not depend on {what}: for training it is a constant "
            "(computed from constants, "
            "or from shapes, comparisons or integer casts, which have no gradient), so there is "
            "nothing to "
            "differentiate. Compute the loss from the model's outputs, and name in requires_grad "
            "the parameters "
            "those outputs are computed from."
        )


def _check_control_flow(graph: ir.Graph, wanted: list[str], loss: str) -> None:
    nodes = [n for n in graph if has_subgraph(n)]
    if not nodes:
        return
    reached = downstream_values(graph, wanted)
    needed = upstream_values(graph, [loss], differentiable=False)
    for node in nodes:
        if not any(o in needed for o in node.outputs):
            continue
        direct = [v for v in node.inputs if v is not None]
        inner = sorted(outer_reads(node) - set(direct), key=lambda v: v.name or "")
        read = [v for v in dict.fromkeys([*direct, *inner]) if v in reached]
        if not read:
            continue
        feeding = {v.name for v in upstream_values(graph, read)}
        params = [p for p in wanted if p in feeding]
        names = [v.name or "" for v in read]
        label = f"'{node.name}'" if node.name else f"(unnamed, writing '{node.outputs[0].name}')"
        raise GradientError(
            f"ONNX Runtime cannot differentiate control flow: {node.op_type} node {label} reads "
            f"{preview(names)}, which depend on the trainable {preview(params)}, and the loss "
            f"'{loss}' depends on "
            f"its outputs. ONNX Runtime has no gradient for {node.op_type} (its gradient builder "
            "would abort the "
            "process). Export the model with the branch or loop resolved (a fixed condition, an "
            "unrolled loop), or "
            "freeze the parameters upstream of it (frozen_params / requires_grad(name, False))."
        )
