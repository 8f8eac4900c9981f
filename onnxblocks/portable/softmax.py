"""Softmax gradients: ``SoftmaxGrad(_13)``, ``LogSoftmaxGrad(_13)``,
``SoftmaxCrossEntropyLossGrad``.

``*_13`` ops reduce over one axis (opset-13 ``Softmax``); the older ones coerce the
input to 2-D at ``axis`` first (``Flatten``), as opset-1..12 ``Softmax`` did.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.portable.lowering_context import LoweringContext, Writer, inputs, outputs


def _softmax_family(node: ir.Node, ctx: LoweringContext, log: bool) -> list[ir.Node]:
    dy, y = inputs(node, 2)
    w = ctx.writer(node)
    opset13 = node.op_type.endswith("_13")
    axis = node.attributes.get_int("axis", -1 if opset13 else 1)
    out = outputs(node, 1)[0]
    shape = None
    if not opset13:  # coerce to [prod(dims[:axis]), prod(dims[axis:])]
        shape = w.shape(dy)
        dy, y = w.op("Flatten", [dy], axis=axis), w.op("Flatten", [y], axis=axis)
        axis, out = 1, w.fresh("dx2d")
    if log:  # dX = dY - exp(Y) * sum(dY)
        total = w.reduce("ReduceSum", dy, [axis], keepdims=1)
        result = w.op("Sub", [dy, w.op("Mul", [w.op("Exp", [y]), total])], out)
    else:  # dX = (dY - sum(dY * Y)) * Y
        total = w.reduce("ReduceSum", w.op("Mul", [dy, y]), [axis], keepdims=1)
        result = w.op("Mul", [w.op("Sub", [dy, total]), y], out)
    if shape is not None:
        w.reshape(result, shape, outputs(node, 1)[0])
    return w.nodes


def softmax_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``SoftmaxGrad(_13)(dY, Y) = (dY - sum(dY * Y, axis)) * Y``."""
    return _softmax_family(node, ctx, log=False)


def log_softmax_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``LogSoftmaxGrad(_13)(dY, Y) = dY - exp(Y) * sum(dY, axis)``."""
    return _softmax_family(node, ctx, log=True)


def softmax_cross_entropy_loss_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``SoftmaxCrossEntropyLoss(Internal)Grad(dY, log_prob, label[, weight][, ignore_index])``.

    ``dX[n, c, ...] = (exp(log_prob) - onehot(label)) * weight[label] * dY``, zero where
    ``label == ignore_index``; with ``reduction="mean"`` ``dY`` is divided by the
    count (or the weight sum) of the labels not ignored, when that is not zero.
    """
    dy, log_prob, label, weight, ignore_input = inputs(node, 5)
    w = ctx.writer(node)
    elem = ctx.float_type(log_prob)
    reduction = node.attributes.get_string("reduction", "mean")
    ignore_attr = node.attributes.get_int("ignore_index", None)

    valid, safe_label = _valid_labels(w, label, ignore_input, ignore_attr)
    diff = w.op("Sub", [w.op("Exp", [log_prob]), _one_hot(w, log_prob, safe_label, elem)])

    sample_weight = w.op("Gather", [weight, safe_label], axis=0) if weight is not None else None
    if reduction == "none":
        factor = w.op("Mul", [sample_weight, dy]) if sample_weight else dy
    else:
        scaled = dy
        if reduction == "mean":
            if sample_weight:
                counted = (
                    w.op("Where", [valid, sample_weight, w.scalar(0, elem)])
                    if valid
                    else sample_weight
                )
                denominator = w.reduce("ReduceSum", counted, None, keepdims=0)
            elif valid:
                denominator = w.cast(
                    w.reduce("ReduceSum", w.cast(valid, onnx.TensorProto.INT64), None, keepdims=0),
                    elem,
                )
            else:
                denominator = w.cast(w.op("Size", [label]), elem)
            nonzero = w.op("Not", [w.op("Equal", [denominator, w.scalar(0, elem)])])
            scaled = w.op("Where", [nonzero, w.op("Div", [dy, denominator]), dy])
        factor = w.op("Mul", [sample_weight, scaled]) if sample_weight else scaled
    if valid:  # ignored samples: a zero factor (per sample, cheaper than a Where over [N, C, ...])
        factor = w.op("Mul", [factor, w.cast(valid, elem)])
    if sample_weight or valid or reduction == "none":
        factor = w.unsqueeze(factor, [1])
    w.op("Mul", [diff, factor], outputs(node, 1)[0])
    return w.nodes


def _one_hot(w: Writer, scores: ir.Value, label: ir.Value, elem: int) -> ir.Value:
    """The one-hot encoding of ``label`` (``[N, d...]``) along axis 1 of ``scores`` (``[N, C,
    d...]``), of ``elem``.

    A ``ScatterElements`` of ones into zeros, not ``OneHot``: ONNX Runtime's ``OneHot``
    kernels cover few (index, value) type pairs (not int32 labels, not double).
    """
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    index = w.unsqueeze(label, [1])
    zeros = w.op("ConstantOfShape", [w.op("Shape", [scores])], value=ir.tensor(np.zeros(1, dtype)))
    ones = w.op("ConstantOfShape", [w.op("Shape", [index])], value=ir.tensor(np.ones(1, dtype)))
    return w.op("ScatterElements", [zeros, index, ones], axis=1)


def _valid_labels(
    w: Writer, label: ir.Value, ignore_input: ir.Value | None, ignore_attr: int | None
) -> tuple[ir.Value | None, ir.Value]:
    """``(label != ignore_index, label with ignored entries set to 0)``; ``(None, label)``
    without an ignore index.
    """
    if ignore_input is not None:
        ignore = w.cast(ignore_input, onnx.TensorProto.INT64)
    elif ignore_attr is not None:
        ignore = w.const(ignore_attr, "int64")
    else:
        return None, label
    label64 = w.cast(label, onnx.TensorProto.INT64)
    valid = w.op("Not", [w.op("Equal", [label64, ignore])])
    return valid, w.op("Where", [valid, label64, w.const(0, "int64")])


LOWERINGS = {
    "SoftmaxGrad": softmax_grad,
    "SoftmaxGrad_13": softmax_grad,
    "LogSoftmaxGrad": log_softmax_grad,
    "LogSoftmaxGrad_13": log_softmax_grad,
    "SoftmaxCrossEntropyLossGrad": softmax_cross_entropy_loss_grad,
    "SoftmaxCrossEntropyLossInternalGrad": softmax_cross_entropy_loss_grad,
}
