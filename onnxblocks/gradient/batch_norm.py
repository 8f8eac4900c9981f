"""Inference-mode BatchNormalization as elementary ops, so its gradient is the inference one.

ONNX Runtime's pre-training transformers replace *every* ``BatchNormalization``
with ``BatchNormInternal`` in training mode (``BatchNormReplacement`` matches
unconditionally), so the gradient of a node written with ``training_mode=0``
would be taken through batch statistics: not what the node computes. The
training artifacts rely on that replacement (exporters write a training-mode
BatchNorm as inference-mode, see :mod:`onnxblocks.gradient.eval_model`), so this
is not one of :func:`~onnxblocks.gradient.normalize.default_passes`: the
vector-Jacobian graphs of :mod:`onnxblocks.gradient.vjp` run it, because they
take the graph at its word.

``y = (x - mean) * (scale / sqrt(var + epsilon)) + bias``, each per-channel
vector reshaped to ``[C, 1, ..., 1]`` to broadcast over the spatial axes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxblocks._core.errors import GradientError
from onnxblocks.gradient import _graph

__all__ = ["batch_norm_inference_as_elementary", "is_inference_batch_norm"]


def is_inference_batch_norm(node: onnx.NodeProto) -> bool:
    """True for an ai.onnx ``BatchNormalization`` in inference mode (``training_mode`` 0 or absent)."""
    return (
        node.op_type == "BatchNormalization"
        and _graph.is_default_domain(node)
        and not _graph.int_attribute(node, "training_mode", 0)
    )


def batch_norm_inference_as_elementary(model: onnx.ModelProto) -> int:
    """Rewrite each inference-mode ``BatchNormalization`` into Sub, Div, Sqrt, Mul and Add, in place.

    The optional running-statistics outputs of such a node (ONNX Runtime refuses
    them in inference mode) are read from its running-statistics inputs.

    Returns:
        The number of nodes rewritten.

    Raises:
        GradientError: for a node whose input rank is unknown (it cannot be broadcast).
    """
    return _graph.rewrite_nodes(model, is_inference_batch_norm, _elementary, min_opset=None)


def _elementary(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto]:
    x, scale, bias, mean, var = node.input[:5]
    shape = _graph.shape_of(ctx.types, x)
    if shape is None:
        raise GradientError(
            f"BatchNormalization node '{node.name or node.output[0]}' reads '{x}', whose rank is unknown, so "
            "its inference form cannot be written for the gradient. Give the model's inputs a known rank."
        )
    names = ctx.names
    dtype = ctx.dtype(x) or np.dtype(np.float32)
    epsilon = _graph.float_attribute(node, "epsilon", 1e-5)
    base = node.name or node.output[0]
    nodes: list[onnx.NodeProto] = []
    eps = names.fresh(f"{base}.epsilon")
    nodes.append(_graph.constant_node(eps, np.array(epsilon, dtype=dtype), names))
    dims = names.fresh(f"{base}.channel_shape")
    nodes.append(_graph.constant_node(dims, np.array([-1] + [1] * (len(shape) - 2), dtype=np.int64), names))

    def op(op_type: str, inputs: list[str], hint: str) -> str:
        out = names.fresh(f"{base}.{hint}")
        nodes.append(helper.make_node(op_type, inputs, [out], name=names.fresh(f"{base}.{op_type}")))
        return out

    def channels(value: str, hint: str) -> str:
        return op("Reshape", [value, dims], hint)

    inv_std = op("Reciprocal", [op("Sqrt", [op("Add", [var, eps], "var_eps")], "std")], "inv_std")
    factor = op("Mul", [scale, inv_std], "factor")
    centred = op("Sub", [x, channels(mean, "mean_c")], "centred")
    scaled = op("Mul", [centred, channels(factor, "factor_c")], "scaled")
    nodes.append(helper.make_node("Add", [scaled, channels(bias, "bias_c")], [node.output[0]], name=names.fresh(base)))
    for out_index, in_index in ((1, 3), (2, 4)):
        if out_index < len(node.output) and node.output[out_index]:
            nodes.append(
                helper.make_node(
                    "Identity", [node.input[in_index]], [node.output[out_index]], name=names.fresh("Identity")
                )
            )
    return nodes
