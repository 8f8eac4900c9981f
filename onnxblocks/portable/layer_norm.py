"""Normalisation: layer norm and RMSNorm forwards and gradients, batch norm in training.

The ops: ``SimplifiedLayerNormalization``, ``SkipLayerNormalization``,
``SkipSimplifiedLayerNormalization``, ``LayerNormalization`` below opset 17, their gradients
(``(Simplified)LayerNormalizationGrad``), ``BatchNormInternal`` and ``BatchNormalizationGrad``.

The layer-norm forwards reduce over the dims from ``axis`` on (their statistics
keep those dims as 1, as ONNX's ``LayerNormalization`` does); the gradients work on
``X`` flattened to ``[rows, normalized]`` at ``axis``, batch norm on ``X`` reshaped to
``[N, C, spatial]``: every form keeps every dim dynamic. The arithmetic follows
ONNX Runtime's CPU kernels (statistics in float32 for a float16 ``X``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.portable.lowering_context import LoweringContext, Writer, inputs, outputs

#: Element types whose layer-norm statistics ONNX Runtime computes in float32 (``stash_type=1``).
_LOW_PRECISION = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def _normalize(
    node: ir.Node,
    ctx: LoweringContext,
    w: Writer,
    x: ir.Value,
    scale: ir.Value | None,
    bias: ir.Value | None,
    outs: tuple[str, str, str],
    simplified: bool,
    axis: int = -1,
    like: ir.Value | None = None,
) -> None:
    """Write layer norm (RMSNorm when ``simplified``) of ``x`` over the dims from ``axis`` on.

    ``outs``: the names of ``Y``, the mean and the inverse standard deviation (``""`` when unused);
    ``like``: a graph value of ``x``'s type (when ``x`` is new, so not typed yet).
    ``Y = (x - mean) * inv_std * scale + bias`` with ``inv_std = 1 / sqrt(mean((x - mean)^2) +
    epsilon)``
    (no mean when simplified: ``inv_std = 1 / sqrt(mean(x^2) + epsilon)``).
    """
    y, mean_out, inv_out = outs
    rank = ctx.rank(like or x)
    elem = ctx.float_type(like or x)
    stash = node.attributes.get_int("stash_type", 1)
    stat_elem = onnx.TensorProto.FLOAT if stash == 1 and elem in _LOW_PRECISION else elem
    epsilon = node.attributes.get_float("epsilon", 1e-5)
    xs = w.cast(x, stat_elem) if stat_elem != elem else x
    if (
        rank is None
    ):  # rank unknown (behind other ONNX Runtime ops): on X flattened to [rows, normalized]
        flat, axes = w.op("Flatten", [xs], axis=axis), [1]
    else:
        flat, axes = xs, list(range(axis + rank if axis < 0 else axis, rank))

    def stat_shape(
        value: ir.Value, out: str
    ) -> ir.Value:  # [rows, 1] -> X's dims before axis, then 1s
        if rank is not None:
            return w.op("Identity", [value], out)
        leading, trailing = w.shape(x, end=axis), w.shape(x, start=axis)
        ones = w.op("Add", [w.op("Mul", [trailing, w.ints([0])]), w.ints([1])])
        return w.reshape(value, w.concat([leading, ones]), out)

    centered = flat
    if not simplified:
        mean = w.reduce("ReduceMean", flat, axes, keepdims=1)
        centered = w.op("Sub", [flat, mean])
        if mean_out:
            stat_shape(mean, mean_out)
    variance = w.reduce("ReduceMean", w.op("Mul", [centered, centered]), axes, keepdims=1)
    inv_std = w.op(
        "Reciprocal", [w.op("Sqrt", [w.op("Add", [variance, w.scalar(epsilon, stat_elem)])])]
    )
    if inv_out:
        stat_shape(inv_std, inv_out)
    normed = w.op("Mul", [centered, inv_std])
    if rank is None:
        normed = w.reshape(normed, w.shape(x))
    if stat_elem != elem:
        normed = w.cast(normed, elem)
    scaled = (
        w.op("Mul", [normed, scale], None if bias is not None else y)
        if scale is not None
        else normed
    )
    if bias is not None:
        w.op("Add", [scaled, bias], y)
    elif scale is None:
        w.op("Identity", [scaled], y)


def simplified_layer_norm(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``SimplifiedLayerNormalization(X, scale) -> Y[, inv_std_var]`` (RMSNorm): ``X * inv_std *
    scale``.

    ``inv_std = 1 / sqrt(mean(X^2) + epsilon)`` over the dims from ``axis`` on.
    """
    x, scale = inputs(node, 2)
    y, inv = outputs(node, 2)
    w = ctx.writer(node)
    _normalize(
        node, ctx, w, x, scale, None, (y, "", inv), True, node.attributes.get_int("axis", -1)
    )
    return w.nodes


def layer_norm(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """ONNX Runtime's ``LayerNormalization(X, scale[, B]) -> Y[, mean, inv_std_dev]`` below opset
    17.
    """
    x, scale, bias = inputs(node, 3)
    w = ctx.writer(node)
    outs = outputs(node, 3)
    _normalize(
        node,
        ctx,
        w,
        x,
        scale,
        bias,
        (outs[0], outs[1], outs[2]),
        False,
        node.attributes.get_int("axis", -1),
    )
    return w.nodes


def skip_layer_norm(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``Skip(Simplified)LayerNormalization(input, skip, gamma[, beta][, bias])`` over the last dim.

    ``s = input + skip (+ bias)``, then layer norm (RMSNorm when simplified) of ``s``;
    outputs ``Y``, the mean, the inverse standard deviation and ``s`` (each optional but ``Y``).
    The simplified form has no ``beta`` (its fourth input is ``bias``).
    """
    simplified = node.op_type.startswith("SkipSimplified")
    if simplified:
        x, skip, gamma, bias = inputs(node, 4)
        beta = None
    else:
        x, skip, gamma, beta, bias = inputs(node, 5)
    y, mean, inv, total = outputs(node, 4)
    w = ctx.writer(node)
    summed = w.op("Add", [x, skip], None if bias is not None else total or None)
    if bias is not None:
        summed = w.op("Add", [summed, bias], total or None)
    _normalize(node, ctx, w, summed, gamma, beta, (y, mean, inv), simplified, like=x)
    return w.nodes


def layer_norm_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``(Simplified)LayerNormalizationGrad(dY, X, scale[, mean], inv_std_dev) -> dX, dScale[,
    dBias]``.

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

    def rows(
        stat: ir.Value,
    ) -> ir.Value:  # float statistics [rows..., 1...] -> [rows, 1] in X's type
        column = w.reshape(stat, [-1, 1])
        return (
            w.cast(column, elem) if ctx.elem_type(stat, onnx.TensorProto.FLOAT) != elem else column
        )

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
        w.reshape(
            w.reduce("ReduceSum", w.op("Mul", [dy2, normed]), [0], keepdims=0),
            w.shape(scale),
            dscale,
        )
    if dbias:
        w.reshape(w.reduce("ReduceSum", dy2, [0], keepdims=0), w.shape(scale), dbias)
    return w.nodes


def _channels(w: Writer, value: ir.Value) -> ir.Value:
    """``[C]`` -> ``[1, C, 1]``, to broadcast over ``X`` as ``[N, C, spatial]``."""
    return w.reshape(value, [1, -1, 1])


def batch_norm_internal(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """Training-mode ``BatchNormInternal(X, scale, B, mean, var) -> Y, running_mean, running_var,
    saved_mean, inv_std``.

    Batch statistics over ``N`` and the spatial dims, the biased variance,
    ``inv_std = sqrt(1 / (var + eps))``, ``Y = X * (inv_std * scale) + (B - mean * inv_std *
    scale)``,
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
    keep, take = (
        w.scalar(momentum, elem),
        w.const(np.asarray(1.0 - momentum, dtype=dtype), suffix="one_minus"),
    )
    for out, running, batch in (
        (running_mean, input_mean, flat_mean),
        (running_var, input_var, flat_var),
    ):
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
    scale_sum = w.reduce(
        "ReduceSum", w.op("Mul", [w.op("Mul", [centered, inv]), dy3]), [0, 2], keepdims=1
    )
    if dbias:
        w.reshape(bias_sum, [-1], dbias)
    if dscale:
        w.reshape(scale_sum, [-1], dscale)
    if dx:
        shape3 = w.op("Shape", [dy3])
        count = w.cast(
            w.reduce(
                "ReduceProd", w.op("Gather", [shape3, w.ints([0, 2])], axis=0), None, keepdims=0
            ),
            elem,
        )
        factor = w.op("Div", [w.op("Mul", [_channels(w, scale), inv]), count])
        inner = w.op("Sub", [w.op("Mul", [dy3, count]), bias_sum])
        inner = w.op("Sub", [inner, w.op("Mul", [w.op("Mul", [centered, scale_sum]), inv])])
        w.reshape(w.op("Mul", [factor, inner]), w.shape(x), dx)
    return w.nodes


LOWERINGS = {
    "SimplifiedLayerNormalization": simplified_layer_norm,
    "LayerNormalization": layer_norm,
    "SkipLayerNormalization": skip_layer_norm,
    "SkipSimplifiedLayerNormalization": skip_layer_norm,
    "LayerNormalizationGrad": layer_norm_grad,
    "SimplifiedLayerNormalizationGrad": layer_norm_grad,
    "BatchNormInternal": batch_norm_internal,
    "BatchNormalizationGrad": batch_norm_grad,
}
