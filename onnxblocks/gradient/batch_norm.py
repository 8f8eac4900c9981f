"""Inference-mode BatchNormalization as elementary ops, so its gradient is the inference one.

ONNX Runtime's pre-training transformers replace *every* ``BatchNormalization``
with ``BatchNormInternal`` in training mode (``BatchNormReplacement`` matches
unconditionally), so the gradient of a node written with ``training_mode=0``
would be taken through batch statistics: not what the node computes. The
training artifacts rely on that replacement (exporters write a training-mode
BatchNorm as inference-mode, see :mod:`onnxblocks.gradient.eval_model`), so this
is not one of :func:`~onnxblocks.gradient.normalization.default_passes`: the
vector-Jacobian graphs of :mod:`onnxblocks.gradient.vjp` run it, because they
take the graph at its word.

``y = (x - mean) * (scale / sqrt(var + epsilon)) + bias``, each per-channel
vector reshaped to ``[C, 1, ..., 1]`` to broadcast over the spatial axes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks._core.errors import GradientError
from onnxblocks.gradient._rewrite import NodeRewrite, RewriteContext, is_default_domain, on_proto
from onnxblocks.ir.attributes import float_attribute, int_attribute

__all__ = ["BatchNormInferenceAsElementary", "batch_norm_inference_as_elementary", "is_inference_batch_norm"]


def is_inference_batch_norm(node: ir.Node) -> bool:
    """True for an ai.onnx ``BatchNormalization`` in inference mode (``training_mode`` 0 or absent)."""
    return (
        node.op_type == "BatchNormalization" and is_default_domain(node) and not int_attribute(node, "training_mode", 0)
    )


class BatchNormInferenceAsElementary(NodeRewrite):
    """Rewrite each inference-mode ``BatchNormalization`` into Sub, Div, Sqrt, Mul and Add.

    The optional running-statistics outputs of such a node (ONNX Runtime refuses
    them in inference mode) are read from its running-statistics inputs.

    Raises:
        GradientError: for a node whose input rank is unknown (it cannot be broadcast).
    """

    name = "batch_norm_inference_as_elementary"
    op_types = frozenset({"BatchNormalization"})
    min_opset = None

    def select(self, node: ir.Node) -> bool:
        return is_inference_batch_norm(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | None:
        return _elementary(node, ctx)


batch_norm_inference_as_elementary = on_proto(
    BatchNormInferenceAsElementary,
    "batch_norm_inference_as_elementary",
    """Rewrite each inference-mode ``BatchNormalization`` into Sub, Div, Sqrt, Mul and Add, in place.

    Returns:
        The number of nodes rewritten.

    Raises:
        GradientError: for a node whose input rank is unknown (it cannot be broadcast).
    """,
    wanted=lambda model: any(n.op_type == "BatchNormalization" for n in model.graph.node),
)


def _elementary(node: ir.Node, ctx: RewriteContext) -> list[ir.Node]:
    x, scale, bias, mean, var = node.inputs[:5]
    shape = ctx.types.shape(x)
    if x is None or shape is None:
        raise GradientError(
            f"BatchNormalization node '{node.name or node.outputs[0].name}' reads "
            f"'{x.name if x is not None else ''}', whose rank is unknown, so "
            "its inference form cannot be written for the gradient. Give the model's inputs a known rank."
        )
    assert scale is not None and bias is not None and mean is not None and var is not None  # required inputs
    dtype = ctx.dtype(x) or np.dtype(np.float32)
    epsilon = float_attribute(node, "epsilon", 1e-5)
    w = ctx.writer(node.name or node.outputs[0].name or "batch_norm")
    eps = w.const(np.array(epsilon, dtype=dtype), suffix="epsilon")
    dims = w.ints([-1] + [1] * (len(shape) - 2))

    def channels(value: ir.Value) -> ir.Value:
        return w.reshape(value, dims)

    inv_std = w.op("Reciprocal", [w.op("Sqrt", [w.op("Add", [var, eps])])])
    factor = w.op("Mul", [scale, inv_std])
    centred = w.op("Sub", [x, channels(mean)])
    scaled = w.op("Mul", [centred, channels(factor)])
    w.op("Add", [scaled, channels(bias)], out=node.outputs[0].name)
    for out_index, in_index in ((1, 3), (2, 4)):
        if out_index < len(node.outputs) and node.outputs[out_index].name:
            w.op("Identity", [node.inputs[in_index]], out=node.outputs[out_index].name)
    return w.nodes
