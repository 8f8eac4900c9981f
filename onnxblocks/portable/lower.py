"""The lowering pass: every training-only node of a model replaced by standard ONNX ops.

:data:`LOWERINGS` is the table, op type -> lowering, gathered from the family
modules (each lowering is a small named function, tested on its own in
``tests/test_portable_lowering.py``). :func:`lower_training_ops` walks the graph in
order, keeps standard and portable nodes, lowers the others, and raises
:class:`~onnxblocks.errors.PortabilityError` for a node without a lowering.

The optimizer and accumulation ops (``AdamWOptimizer``, ``SGDOptimizerV2``,
``InplaceClipGradNorm``, ``InPlaceAccumulatorV2``) are not here: they change the
models' contract, and :mod:`onnxblocks.portable.optimizer` and
:mod:`onnxblocks.portable.accumulation` rewrite them.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import PortabilityError, preview
from onnxblocks.portable import activations, broadcast, conv, indexing, matmul, normalization, recurrent, softmax
from onnxblocks.portable.context import LoweringContext, describe
from onnxblocks.portable.ops import PORTABLE_CONTRIB_OPS, is_portable_op

#: A lowering: ``(node, ctx) -> nodes`` writing the node's outputs with standard ops.
Lowering = Callable[[onnx.NodeProto, LoweringContext], list[onnx.NodeProto]]

#: Every lowering, by op type (``com.microsoft`` ops and ONNX Runtime's default-domain gradient ops).
LOWERINGS: dict[str, Lowering] = {
    **activations.LOWERINGS,
    **broadcast.LOWERINGS,
    **matmul.LOWERINGS,
    **softmax.LOWERINGS,
    **normalization.LOWERINGS,
    **indexing.LOWERINGS,
    **conv.LOWERINGS,
    **recurrent.LOWERINGS,
}

#: Ops handled by the contract rewrites, not by :func:`lower_training_ops`.
CONTRACT_OPS = frozenset({"InPlaceAccumulatorV2", "AdamWOptimizer", "SGDOptimizerV2", "InplaceClipGradNorm"})


def lower_training_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Replace, in place, every node of ``model`` that stock ONNX Runtime cannot run by standard ops.

    Portable ``com.microsoft`` ops that have a standard form (``FusedMatMul``) are
    lowered too; the others (``Gelu``...) stay. Nodes of the contract ops
    (:data:`CONTRACT_OPS`) are left for the contract rewrites.

    Returns:
        How many nodes of each op type were lowered.

    Raises:
        PortabilityError: naming the first node (and every other op type) without a lowering,
            or a node whose lowering needs what the model lacks (a newer opset, a known rank).
    """
    blocked = [n for n in model.graph.node if n.op_type not in CONTRACT_OPS and _to_lower(n) and not _lowerable(n)]
    if blocked:
        missing = sorted({(n.domain or "ai.onnx", n.op_type) for n in blocked})
        first = blocked[0]
        raise PortabilityError(
            f"{describe(first)} has no standard-op lowering, so these artifacts cannot train on stock ONNX Runtime "
            f"(ops without one: {preview(f'{d}:{o}' for d, o in missing)}). Rewrite that part of the model with "
            "ops onnxblocks lowers (docs/portable.md lists them), or generate non-portable artifacts "
            "(portable=False) for onnxruntime-training."
        )
    ctx = LoweringContext(model)
    nodes: list[onnx.NodeProto] = []
    counts: dict[str, int] = {}
    for node in list(model.graph.node):
        if node.op_type in CONTRACT_OPS or not _to_lower(node):
            nodes.append(node)
            ctx.record([node])
            continue
        replacement = LOWERINGS[node.op_type](node, ctx)
        ctx.record(replacement)
        like = _OUTPUT_LIKE_INPUT.get(node.op_type)
        if like is not None and len(node.input) > like:  # when inference could not type the gradient
            ctx.set_type(node.output[0], like=node.input[like])
        nodes.extend(replacement)
        if replacement != [node]:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    nodes = [_without_noop_reduction(n, ctx) for n in nodes]
    del model.graph.node[:]
    model.graph.node.extend(_live(nodes, {o.name for o in model.graph.output}))
    _prune_unused_opsets(model)
    return counts


def _without_noop_reduction(node: onnx.NodeProto, ctx: LoweringContext) -> onnx.NodeProto:
    """``ReduceSum(x, [])`` with ``noop_with_empty_axes=1`` (broadcast axes that turned out empty) as ``Identity``."""
    if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx") or len(node.input) < 2 or not node.input[1]:
        return node
    noop = any(a.name == "noop_with_empty_axes" and a.i == 1 for a in node.attribute)
    axes = ctx.constant(node.input[1])
    if not noop or axes is None or axes.size:
        return node
    return onnx.helper.make_node("Identity", [node.input[0]], list(node.output), name=node.name)


def _live(nodes: list[onnx.NodeProto], graph_outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nothing reads (shape arithmetic a lowering made constant)."""
    needed = set(graph_outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output if o):
            kept.append(node)
            needed.update(_reads(node))
    return kept[::-1]


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values ``node`` reads, its subgraphs' outer-scope reads included."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            for inner in graph.node:
                names |= _reads(inner)
    return names


#: Ops whose first output has the type of one of their inputs (by index), for the type table.
_OUTPUT_LIKE_INPUT = {
    "ReluGrad": 0,
    "SigmoidGrad": 0,
    "TanhGrad": 0,
    "GeluGrad": 0,
    "FastGeluGrad": 0,
    "QuickGeluGrad": 0,
    "DropoutGrad": 0,
    "Scale": 0,
    "SoftmaxGrad_13": 0,
    "SoftmaxGrad": 0,
    "LogSoftmaxGrad_13": 0,
    "LogSoftmaxGrad": 0,
    "SoftmaxCrossEntropyLossGrad": 1,
    "LayerNormalizationGrad": 1,
    "BatchNormalizationGrad": 1,
    "BatchNormInternal": 0,
}


def _to_lower(node: onnx.NodeProto) -> bool:
    """True for a node the pass replaces: not portable, or a portable contrib op with a standard form."""
    if node.domain in ("", "ai.onnx", "ai.onnx.ml"):
        return not is_portable_op(node.op_type, node.domain)
    return node.domain != _limits.MS_DOMAIN or node.op_type in LOWERINGS or node.op_type not in PORTABLE_CONTRIB_OPS


def _lowerable(node: onnx.NodeProto) -> bool:
    return node.op_type in LOWERINGS and node.domain in ("", "ai.onnx", _limits.MS_DOMAIN)


def _prune_unused_opsets(model: onnx.ModelProto) -> None:
    """Drop the opset imports of domains no node uses any more (ONNX Runtime's training domains)."""
    used = {n.domain or "" for n in _all_nodes(model.graph)}
    keep = [o for o in model.opset_import if (o.domain or "") in used or o.domain in ("", "ai.onnx")]
    if len(keep) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(keep)


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                out.extend(_all_nodes(g))
    return out


__all__ = ["CONTRACT_OPS", "LOWERINGS", "Lowering", "lower_training_ops"]
