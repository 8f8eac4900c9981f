"""Normalisation in training: ``LayerNormalizationGrad``, ``BatchNormInternal`` and ``BatchNormalizationGrad``.

Layer norm works on ``X`` flattened to ``[rows, normalized]`` at ``axis``, batch
norm on ``X`` reshaped to ``[N, C, spatial]``: both forms hold for any rank and
keep every dim dynamic. The arithmetic follows ONNX Runtime's CPU kernels.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.portable.context import LoweringContext, Writer, inputs, outputs


def layer_norm_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``(Simplified)LayerNormalizationGrad(dY, X, scale[, mean], inv_std_dev) -> dX, dScale[, dBias]``.

    With ``x = (X - mean) * inv_std`` (``X * inv_std`` when simplified),
    ``B = dY * scale * inv_std``: ``dX = B - mean(B) - x * mean(B * x)`` (no ``mean(B)``
    term when simplified), ``dScale = sum(dY * x)``, ``dBias = sum(dY)`` over rows.
    """
    simplified = node.op_type.startswith("Simplified")
    if simplified:
        dy, x, scale, inv_std = inputs(node, 4)
        mean = None
    else:
        dy, x, scale, mean, inv_std = inputs(node, 5)
    dx, dscale, dbias = outputs(node, 3)
    w = ctx.writer(node)
    elem = ctx.float_type(x)
    axis = node.attributes.get_int("axis", -1)

    def rows(stat: ir.Value) -> ir.Value:  # float statistics [rows..., 1...] -> [rows, 1] in X's type
        column = w.reshape(stat, [-1, 1])
        return w.cast(column, elem) if ctx.elem_type(stat, onnx.TensorProto.FLOAT) != elem else column

    x2, dy2 = w.op("Flatten", [x], axis=axis), w.op("Flatten", [dy], axis=axis)
    inv = rows(inv_std)
    centered = w.op("Sub", [x2, rows(mean)]) if mean else x2
    normed = w.op("Mul", [centered, inv])
    b = w.op("Mul", [w.op("Mul", [dy2, w.reshape(scale, [1, -1])]), inv])
    mean_c = w.reduce("ReduceMean", w.op("Mul", [b, normed]), [1], keepdims=1)
    rest = b if simplified else w.op("Sub", [b, w.reduce("ReduceMean", b, [1], keepdims=1)])
    if dx:
        w.reshape(w.op("Sub", [rest, w.op("Mul", [normed, mean_c])]), w.shape(x), dx)
    if dscale:
        w.reshape(w.reduce("ReduceSum", w.op("Mul", [dy2, normed]), [0], keepdims=0), w.shape(scale), dscale)
    if dbias:
        w.reshape(w.reduce("ReduceSum", dy2, [0], keepdims=0), w.shape(scale), dbias)
    return w.nodes


def _channels(w: Writer, value: ir.Value) -> ir.Value:
    """``[C]`` -> ``[1, C, 1]``, to broadcast over ``X`` as ``[N, C, spatial]``."""
    return w.reshape(value, [1, -1, 1])


def batch_norm_internal(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """Training-mode ``BatchNormInternal(X, scale, B, mean, var) -> Y, running_mean, running_var, saved_mean, inv_std``.

    Batch statistics over ``N`` and the spatial dims, the biased variance,
    ``inv_std = sqrt(1 / (var + eps))``, ``Y = X * (inv_std * scale) + (B - mean * inv_std * scale)``,
    running statistics ``input * momentum + batch * (1 - momentum)``.
    """
    x, scale, bias, input_mean, input_var = inputs(node, 5)
    y, running_mean, running_var, saved_mean, saved_inv_std = outputs(node, 5)
    w = ctx.writer(node)
    elem = ctx.float_type(x)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    epsilon = node.attributes.get_float("epsilon", 1e-5)
    momentum = node.attributes.get_float("momentum", 0.9)
    x3 = w.reshape(x, [0, 0, -1])
    mean = w.reduce("ReduceMean", x3, [0, 2], keepdims=1)
    centered = w.op("Sub", [x3, mean])
    var = w.reduce("ReduceMean", w.op("Mul", [centered, centered]), [0, 2], keepdims=1)
    inv_std = w.op("Sqrt", [w.op("Reciprocal", [w.op("Add", [var, w.scalar(epsilon, elem)])])])
    new_scale = w.op("Mul", [inv_std, _channels(w, scale)])
    new_bias = w.op("Sub", [_channels(w, bias), w.op("Mul", [mean, new_scale])])
    w.reshape(w.op("Add", [w.op("Mul", [x3, new_scale]), new_bias]), w.shape(x), y)
    flat_mean, flat_var = w.reshape(mean, [-1]), w.reshape(var, [-1])
    if saved_mean:
        w.op("Identity", [flat_mean], saved_mean)
    if saved_inv_std:
        w.reshape(inv_std, [-1], saved_inv_std)
    keep, take = w.scalar(momentum, elem), w.const(np.asarray(1.0 - momentum, dtype=dtype), suffix="one_minus")
    for out, running, batch in ((running_mean, input_mean, flat_mean), (running_var, input_var, flat_var)):
        if out:
            w.op("Add", [w.op("Mul", [running, keep]), w.op("Mul", [batch, take])], out)
    return w.nodes


def batch_norm_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``BatchNormalizationGrad(dY, X, scale, saved_mean, saved_inv_std) -> dX, dScale, dBias``.

    With ``m = N * spatial`` and ``x = (X - mean) * inv_std``: ``dBias = sum(dY)``,
    ``dScale = sum(x * dY)``, ``dX = scale * inv_std / m * (m * dY - dBias - x * dScale)``.
    """
    dy, x, scale, saved_mean, inv_std = inputs(node, 5)
    dx, dscale, dbias = outputs(node, 3)
    w = ctx.writer(node)
    elem = ctx.float_type(x)
    x3, dy3 = w.reshape(x, [0, 0, -1]), w.reshape(dy, [0, 0, -1])
    inv = _channels(w, inv_std)
    centered = w.op("Sub", [x3, _channels(w, saved_mean)])
    bias_sum = w.reduce("ReduceSum", dy3, [0, 2], keepdims=1)
    scale_sum = w.reduce("ReduceSum", w.op("Mul", [w.op("Mul", [centered, inv]), dy3]), [0, 2], keepdims=1)
    if dbias:
        w.reshape(bias_sum, [-1], dbias)
    if dscale:
        w.reshape(scale_sum, [-1], dscale)
    if dx:
        shape3 = w.op("Shape", [dy3])
        count = w.cast(w.reduce("ReduceProd", w.op("Gather", [shape3, w.ints([0, 2])], axis=0), None, keepdims=0), elem)
        factor = w.op("Div", [w.op("Mul", [_channels(w, scale), inv]), count])
        inner = w.op("Sub", [w.op("Mul", [dy3, count]), bias_sum])
        inner = w.op("Sub", [inner, w.op("Mul", [w.op("Mul", [centered, scale_sum]), inv])])
        w.reshape(w.op("Mul", [factor, inner]), w.shape(x), dx)
    return w.nodes


LOWERINGS = {
    "LayerNormalizationGrad": layer_norm_grad,
    "SimplifiedLayerNormalizationGrad": layer_norm_grad,
    "BatchNormInternal": batch_norm_internal,
    "BatchNormalizationGrad": batch_norm_grad,
}
