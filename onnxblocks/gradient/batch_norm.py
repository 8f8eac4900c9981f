"""Inference-mode BatchNormalization as elementary ops, so its gradient is the inference one.

ONNX Runtime's pre-training transformers replace *every* ``BatchNormalization``
with ``BatchNormInternal`` in training mode (``BatchNormReplacement`` matches
unconditionally), so the gradient of a node written with ``training_mode=0``
would be taken through batch statistics: not what the node computes. The
training artifacts rely on that replacement (exporters write a training-mode
BatchNorm as inference-mode, see :mod:`onnxblocks.gradient.eval_model`), so this
is not one of :func:`~onnxblocks.gradient.rewrites.default_passes`: the
vector-Jacobian graphs of :mod:`onnxblocks.gradient.vjp` run it, because they
take the graph at its word.

``y = (x - mean) * (scale / sqrt(var + epsilon)) + bias``, each per-channel
vector reshaped to ``[C, 1, ..., 1]`` to broadcast over the spatial axes.

:func:`private_running_statistics` (a step of the training model, after ONNX Runtime's
gradient builder) keeps the training-mode ``BatchNormInternal`` from overwriting constants.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import GradientError
from onnxblocks.ir.attributes import float_attribute, int_attribute
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.rewrite import NodeRewrite, RewriteContext, is_default_domain
from onnxblocks.ir.writer import Writer

__all__ = [
    "BatchNormInferenceAsElementary",
    "is_inference_batch_norm",
    "private_running_statistics",
]


def is_inference_batch_norm(node: ir.Node) -> bool:
    """True for an ai.onnx ``BatchNormalization`` in inference mode (``training_mode`` 0 or
    absent).
    """
    return (
        node.op_type == "BatchNormalization"
        and is_default_domain(node)
        and not int_attribute(node, "training_mode", 0)
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

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node]:
        return _elementary(node, ctx)


def _elementary(node: ir.Node, ctx: RewriteContext) -> list[ir.Node]:
    x, scale, bias, mean, var = node.inputs[:5]
    shape = ctx.types.shape(x)
    if x is None or shape is None:
        raise GradientError(
            f"BatchNormalization node '{node.name or node.outputs[0].name}' reads "
            f"'{x.name if x is not None else ''}', whose rank is unknown, so "
            "its inference form cannot be written for the gradient. Give the model's inputs a "
            "known rank."
        )
    assert (
        scale is not None and bias is not None and mean is not None and var is not None
    )  # required inputs
    dtype = ctx.dtype(x) or np.dtype(np.float32)
    epsilon = float(
        np.float32(float_attribute(node, "epsilon", 1e-5))
    )  # a float32 attribute, default too
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


def _is_constant(value: ir.Value, held: Collection[str]) -> bool:
    if value.name in held:
        return True
    return value.is_initializer() and not value.is_graph_input()


def private_running_statistics(model: ir.Model, held: Collection[str] = ()) -> int:
    """Give each training-mode ``BatchNormInternal`` running statistics of its own to write into;
    return how many.

    ONNX Runtime's kernel writes the updated running mean and variance into the buffers
    of its inputs 3 and 4, and its common subexpression elimination merges equal
    constants when a session loads: in a fresh model the running mean (zeros) and
    variance (ones) equal a constant (frozen) bias and scale, which the first step then
    overwrites, so every later gradient is wrong. The training model never outputs the
    running statistics (the eval model keeps the constants), so a node whose statistics
    are constants reads instead a ``[C]`` slice of its input (``x[0, :, 0, ...]``, and its
    ``Abs`` for the variance): values computed at run time, which no optimization merges.
    Statistics fed as graph inputs (frozen parameters) are left alone.

    Args:
        model: The training model ONNX Runtime built (changed in place).
        held: Constants that are graph inputs only while ONNX Runtime builds (held weights,
            lifted constants): statistics among them are constants too.
    """
    graph = model.graph
    if not any(n.op_type == "BatchNormInternal" for n in graph):
        return 0
    names = graph_names(graph)
    opset = model.opset_imports.get("", _limits.DEFAULT_ONNX_OPSET)
    count = 0
    for node in list(graph):
        stats = node.inputs[3:5]
        if (
            node.op_type != "BatchNormInternal"
            or node.domain != _limits.MS_DOMAIN
            or len(stats) < 2
        ):
            continue
        if not any(v is not None and _is_constant(v, held) for v in stats):
            continue
        w = Writer(names, opset, f"{node.name or 'batch_norm'}.running")
        first = w.const(np.array(0, dtype=np.int64), suffix="first")
        sample = w.op(
            "Flatten", [w.op("Gather", [node.inputs[0], first], axis=0)], axis=1
        )  # [C, rest]
        mean = w.op("Gather", [sample, first], axis=1)
        var = w.op("Abs", [mean])
        graph.insert_before(node, w.nodes)
        node.replace_input_with(3, mean)
        node.replace_input_with(4, var)
        for (
            value
        ) in stats:  # the constants stay in the eval model; here nothing reads them any more
            if value is not None and value.name and not value.uses() and value.is_initializer():
                graph.initializers.pop(value.name)
        count += 1
    return count
