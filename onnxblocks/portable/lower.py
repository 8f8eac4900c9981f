"""The lowering pass: every training-only node of a model replaced by standard ONNX ops.

:data:`LOWERINGS` is the table, op type -> lowering, gathered from the family
modules (each lowering is a small named function, tested on its own in
``tests/portable/test_portable_lowering.py``). :func:`lower_training_ops` walks the graph in
order, keeps standard and portable nodes, lowers the others, and raises
:class:`~onnxblocks.errors.PortabilityError` for a node without a lowering.

The optimizer and accumulation ops (``AdamWOptimizer``, ``SGDOptimizerV2``,
``InplaceClipGradNorm``, ``InPlaceAccumulatorV2``) are not here: they change the
models' contract, and :mod:`onnxblocks.portable.optimizer` and
:mod:`onnxblocks.portable.accumulation` rewrite them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import PortabilityError, preview
from onnxblocks.ir.edit import remove_unused_nodes, replace_node, values_by_name
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.rewrite import NoMatch, note_miss
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.types import copy_type, infer_types
from onnxblocks.ir.walk import all_nodes
from onnxblocks.portable import (
    activations,
    broadcast,
    conv,
    fused_ops,
    indexing,
    layer_norm,
    lstm,
    matmul,
    recurrent,
    softmax,
)
from onnxblocks.portable.lowering_context import LoweringContext, describe
from onnxblocks.portable.ops import PortableMode, is_portable_op, portable_mode

#: A lowering: ``(node, ctx) -> nodes`` writing the node's outputs (by name) with standard ops, or
#: :func:`~onnxblocks.ir.rewrite.fail` saying why the node stays as it is.
Lowering = Callable[[ir.Node, LoweringContext], list[ir.Node] | NoMatch]

#: Every lowering, by op type (``com.microsoft`` ops and ONNX Runtime's default-domain gradient
#: ops).
LOWERINGS: dict[str, Lowering] = {
    **activations.LOWERINGS,
    **broadcast.LOWERINGS,
    **matmul.LOWERINGS,
    **fused_ops.LOWERINGS,
    **softmax.LOWERINGS,
    **layer_norm.LOWERINGS,
    **indexing.LOWERINGS,
    **conv.LOWERINGS,
    **recurrent.LOWERINGS,
    **lstm.LOWERINGS,
}

#: Ops handled by the contract rewrites, not by :class:`LowerTrainingOps`.
CONTRACT_OPS = frozenset(
    {"InPlaceAccumulatorV2", "AdamWOptimizer", "SGDOptimizerV2", "InplaceClipGradNorm"}
)


class LowerTrainingOps(Pass):
    """Replace every node a portable model of ``mode`` may not hold by standard ops (see
    :func:`lower_training_ops`).

    Its changes are how many nodes of each op type were lowered.

    Args:
        mode: ``"standard"`` (default): every non-standard op is lowered; ``"onnxruntime"``:
            the contrib ops stock ONNX Runtime runs
            (:data:`~onnxblocks.portable.ops.PORTABLE_CONTRIB_OPS`) stay.

    Raises:
        InvalidValueError: for an unknown ``mode``.
    """

    name = "lowering"

    def __init__(self, mode: PortableMode | bool = "standard") -> None:
        self.mode: PortableMode = portable_mode(mode, "mode")
        #: Why the last lowering left nodes as they were: (node name, reason).
        self.misses: list[tuple[str, str]] = []

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        """Raises: PortabilityError: as :func:`lower_training_ops` says.

        The types the lowerings read come from onnx shape inference, which knows none
        of ONNX Runtime's own ops (``SimplifiedLayerNormalization``, ``ConcatTraining``...),
        so what follows them in the graph is often of unknown shape. When that left a
        broadcast reduction undecided, the graph is lowered a second time, from the
        original, reading the types that inference finds on the first, all-standard result.
        """
        original = model.clone() if _has_broadcast_gradients(model.graph) else None
        first = self._lower(model, None)
        if original is None or not first.undecided_axes:
            return first.counts
        infer_types(model)
        hints = values_by_name(model.graph)
        second = self._lower(original, hints)
        model.graph = original.graph
        return second.counts

    def _lower(self, model: ir.Model, hints: dict[str, ir.Value] | None) -> LoweringContext:
        graph = model.graph
        ctx = LoweringContext(model, self.mode, hints)
        self.misses = []  # those of the lowering whose graph is kept: the second, when it runs
        opset = ctx.opset

        def to_lower(node: ir.Node) -> bool:
            return node.op_type not in CONTRACT_OPS and _to_lower(node, self.mode, opset)

        blocked = [n for n in graph if to_lower(n) and not _lowerable(n)]
        if blocked:
            missing = sorted({(n.domain or "ai.onnx", n.op_type) for n in blocked})
            first = blocked[0]
            raise PortabilityError(
                f"{describe(first)} has no standard-op lowering, so these artifacts cannot train "
                "on stock ONNX "
                f"Runtime (ops without one: {preview(f'{d}:{o}' for d, o in missing)}). Rewrite "
                "that part of the "
                "model with ops onnxblocks lowers (docs/portable.md lists them), or generate "
                "non-portable artifacts "
                "(portable=False) for onnxruntime-training."
            )
        counts: dict[str, int] = {}
        for node in list(graph):
            if not to_lower(node):
                ctx.record([node])
                continue
            replacement = LOWERINGS[node.op_type](node, ctx)
            if isinstance(replacement, NoMatch):
                note_miss(self.misses, self.name, node, replacement.reason)
                ctx.record([node])
                continue
            produced = {v.name: v for n in replacement for v in n.outputs if v.name}
            olds = list(node.outputs)
            new_outputs = [produced.get(v.name) if v.name else None for v in node.outputs]
            for old, new in zip(node.outputs, new_outputs, strict=True):
                if new is None:
                    _unlink(node, old, lambda n: n.op_type in CONTRACT_OPS or to_lower(n))
            replace_node(node, replacement, new_outputs)
            for old, new in zip(olds, new_outputs, strict=True):
                if new is not None:
                    copy_type(new, old)
            ctx.record(replacement)
            like = _OUTPUT_LIKE_INPUT.get(node.op_type)
            if (
                like is not None and len(node.inputs) > like and node.outputs
            ):  # when inference could not type it
                ctx.set_type(new_outputs[0], like=node.inputs[like])
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        for node in list(graph):
            _drop_noop_reduction(node, ctx)
        remove_unused_nodes(graph)
        _prune_unused_opsets(model)
        ctx.counts.update(counts)
        return ctx


def lower_training_ops(
    model: onnx.ModelProto, mode: PortableMode | bool = "standard"
) -> dict[str, int]:
    """Replace, in place, every node of ``model`` that a portable model of ``mode`` may not hold by
    standard ops.

    ``mode="standard"`` (the default) lowers every ``com.microsoft`` op and every op of
    ONNX Runtime's own (``SimplifiedLayerNormalization``...); ``mode="onnxruntime"``
    keeps the contrib ops stock ONNX Runtime runs on CPU (``Gelu``, ``FusedMatMul``...). Nodes of
    the contract ops
    (:data:`CONTRACT_OPS`) are left for the contract rewrites. Nodes nothing reads
    afterwards (shape arithmetic that became a constant) are dropped. The model is
    rewritten through :class:`LowerTrainingOps` on its IR.

    Returns:
        How many nodes of each op type were lowered.

    Raises:
        PortabilityError: naming the first node (and every other op type) without a lowering,
            or a node whose lowering needs what the model lacks (a newer opset, a known rank).
        InvalidValueError: for an unknown ``mode``.
    """
    lowering = LowerTrainingOps(mode)
    ir_model = from_proto(model)
    counts = dict(lowering.apply(ir_model))
    model.CopyFrom(to_proto(ir_model))
    return counts


def _unlink(node: ir.Node, value: ir.Value, lowered: Callable[[ir.Node], bool]) -> None:
    """Detach an output the lowering does not write from its readers, which must be lowered too (and
    ignore it).

    Raises:
        PortabilityError: if a node that stays reads it (or it is a graph output).
    """
    keeping = [use.node for use in value.uses() if not lowered(use.node)]
    if keeping or value.is_graph_output():
        reader = f"node '{keeping[0].name}' ({keeping[0].op_type})" if keeping else "a graph output"
        raise PortabilityError(
            f"{describe(node)}: its output '{value.name}' has no standard-op form, but {reader} "
            "reads it. Generate "
            "non-portable artifacts (portable=False) for onnxruntime-training."
        )
    for use in list(value.uses()):
        use.node.replace_input_with(use.idx, None)


def _drop_noop_reduction(node: ir.Node, ctx: LoweringContext) -> None:
    """``ReduceSum(x, [])`` with ``noop_with_empty_axes=1`` (broadcast axes that turned out
    empty) as ``Identity``.
    """
    if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return
    axes_value = node.inputs[1]
    if axes_value is None or node.attributes.get_int("noop_with_empty_axes", 0) != 1:
        return
    axes = ctx.constant(axes_value)
    if axes is None or axes.size:
        return
    identity = ir.node("Identity", [node.inputs[0]], name=node.name)
    replace_node(node, [identity], [identity.outputs[0]])


#: Ops whose first output has the type of one of their inputs (by index), for the type table.
_OUTPUT_LIKE_INPUT = {
    "ReluGrad": 0,
    "SigmoidGrad": 0,
    "TanhGrad": 0,
    "GeluGrad": 0,
    "FastGeluGrad": 0,
    "QuickGeluGrad": 0,
    "Gelu": 0,
    "FastGelu": 0,
    "QuickGelu": 0,
    "BiasGelu": 0,
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


def _has_broadcast_gradients(graph: ir.Graph) -> bool:
    return any(n.op_type in ("BroadcastGradientArgs", "DivGrad") for n in graph)


def _to_lower(node: ir.Node, mode: PortableMode, opset: int) -> bool:
    """True for a node the pass replaces: one a portable model of ``mode`` may not hold."""
    return not is_portable_op(node.op_type, node.domain, opset, mode)


def _lowerable(node: ir.Node) -> bool:
    return node.op_type in LOWERINGS and node.domain in ("", "ai.onnx", _limits.MS_DOMAIN)


def _prune_unused_opsets(model: ir.Model) -> None:
    """Drop the opset imports of domains no node uses any more (ONNX Runtime's training domains)."""
    used = {n.domain or "" for n in all_nodes(model.graph)}
    for domain in list(model.graph.opset_imports):
        if domain not in used and domain not in ("", "ai.onnx"):
            del model.graph.opset_imports[domain]


__all__ = ["CONTRACT_OPS", "LOWERINGS", "LowerTrainingOps", "Lowering", "lower_training_ops"]
