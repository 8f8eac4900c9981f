"""Elementwise ops: the GELU family and ``ReluGrad``, ``SigmoidGrad``, ``TanhGrad``,
``DropoutGrad``, ``Scale``.

The GELU family: ``Gelu``, ``FastGelu``, ``QuickGelu``, ``BiasGelu`` and their gradients.

Each follows the arithmetic of ONNX Runtime's CPU kernel step by step (same
operations, same float32 constants), so the standard-op form gives the kernel's
numbers. The forward GELUs are ``com.microsoft`` inference ops that ONNX Runtime's
fusions write while the gradient is built (even from the standard opset-20 ``Gelu``).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.portable.lowering_context import LoweringContext, Writer, inputs, outputs

#: erf(x / sqrt 2) GELU: x * exp(-x^2 / 2) * (1 / sqrt(2 pi)).
_GELU_ALPHA = 2.0 / math.sqrt(math.pi) * math.sqrt(0.5) * 0.5
#: tanh GELU: sqrt(2 / pi), 0.044715 and 3 * 0.044715 * sqrt(2 / pi).
_FAST_ALPHA = 2.0 / math.sqrt(math.pi) * math.sqrt(0.5)
_FAST_GAMMA = 0.044715


def relu_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``ReluGrad(dY, X) = dY * (X > 0)`` (X may be Relu's input or output).

    A product with the 0/1 mask rather than ``Where``, which ONNX Runtime's CPU kernel runs
    several times slower; the numbers are the same (a zero may carry ``dY``'s sign).
    """
    dy, x = inputs(node, 2)
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    positive = w.op("Greater", [x, w.scalar(0, ctx.float_type(x))])
    w.op("Mul", [dy, w.cast(positive, elem)], outputs(node, 1)[0])
    return w.nodes


def leaky_relu_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``LeakyReluGrad(dY, Y) = Y > 0 ? dY : alpha * dY``."""
    dy, y = inputs(node, 2)
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    alpha = node.attributes.get_float("alpha", 0.01)
    scaled = w.op("Mul", [dy, w.scalar(alpha, elem)])
    w.op("Where", [w.op("Greater", [y, w.scalar(0, elem)]), dy, scaled], outputs(node, 1)[0])
    return w.nodes


def sigmoid_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``SigmoidGrad(dY, Y) = dY * Y * (1 - Y)``."""
    dy, y = inputs(node, 2)
    w = ctx.writer(node)
    one_minus = w.op("Sub", [w.scalar(1, ctx.float_type(y)), y])
    w.op("Mul", [w.op("Mul", [dy, y]), one_minus], outputs(node, 1)[0])
    return w.nodes


def tanh_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``TanhGrad(dY, Y) = dY * (1 - Y * Y)``."""
    dy, y = inputs(node, 2)
    w = ctx.writer(node)
    one_minus = w.op("Sub", [w.scalar(1, ctx.float_type(y)), w.op("Mul", [y, y])])
    w.op("Mul", [dy, one_minus], outputs(node, 1)[0])
    return w.nodes


def _gelu_grad(w: Writer, x: ir.Value, dy: ir.Value, elem: int, out: str) -> None:
    """``dY * (0.5 * (erf(x / sqrt 2) + 1) + x * alpha * exp(-0.5 * x * x))``."""
    erf = w.op("Erf", [w.op("Mul", [x, w.scalar(math.sqrt(0.5), elem)])])
    cdf = w.op("Mul", [w.scalar(0.5, elem), w.op("Add", [erf, w.scalar(1, elem)])])
    square = w.op("Mul", [w.op("Mul", [w.scalar(-0.5, elem), x]), x])
    pdf = w.op("Mul", [w.op("Mul", [x, w.scalar(_GELU_ALPHA, elem)]), w.op("Exp", [square])])
    w.op("Mul", [dy, w.op("Add", [cdf, pdf])], out)


def _fast_gelu_grad(w: Writer, x: ir.Value, dy: ir.Value, elem: int, out: str) -> None:
    """``dY * 0.5 * (t + (1 - t^2) * (a x + 3 a g x^3) + 1)`` with ``t = tanh(a x + a g x^3)``."""
    alpha = w.scalar(_FAST_ALPHA, elem)
    cube = w.op("Mul", [w.op("Mul", [x, x]), x])
    inner = w.op(
        "Add",
        [w.op("Mul", [alpha, x]), w.op("Mul", [w.scalar(_FAST_ALPHA * _FAST_GAMMA, elem), cube])],
    )
    t = w.op("Tanh", [inner])
    sech2 = w.op("Sub", [w.scalar(1, elem), w.op("Mul", [t, t])])
    slope = w.op(
        "Add",
        [
            w.op("Mul", [alpha, x]),
            w.op("Mul", [w.scalar(_FAST_GAMMA * _FAST_ALPHA * 3.0, elem), cube]),
        ],
    )
    total = w.op("Add", [w.op("Add", [t, w.op("Mul", [sech2, slope])]), w.scalar(1, elem)])
    w.op("Mul", [dy, w.op("Mul", [w.scalar(0.5, elem), total])], out)


def _biased(w: Writer, x: ir.Value, bias: ir.Value | None) -> ir.Value:
    return w.op("Add", [x, bias]) if bias is not None else x


def gelu(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``Gelu(X) = 0.5 * X * (1 + erf(X / sqrt 2))`` and ``BiasGelu(A, B) = Gelu(A + B)``."""
    x, bias = inputs(node, 2)
    w = ctx.writer(node)
    elem = ctx.float_type(x)
    x = _biased(w, x, bias)
    erf = w.op("Erf", [w.op("Mul", [x, w.scalar(math.sqrt(0.5), elem)])])
    half_x = w.op("Mul", [x, w.scalar(0.5, elem)])
    w.op("Mul", [half_x, w.op("Add", [erf, w.scalar(1, elem)])], outputs(node, 1)[0])
    return w.nodes


def fast_gelu(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``FastGelu(X[, bias]) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`` with
    ``x = X + bias``.
    """
    x, bias = inputs(node, 2)
    w = ctx.writer(node)
    elem = ctx.float_type(x)
    x = _biased(w, x, bias)
    cube = w.op("Mul", [w.op("Mul", [x, x]), x])
    inner = w.op("Add", [x, w.op("Mul", [cube, w.scalar(_FAST_GAMMA, elem)])])
    t = w.op("Tanh", [w.op("Mul", [inner, w.scalar(_FAST_ALPHA, elem)])])
    half_x = w.op("Mul", [x, w.scalar(0.5, elem)])
    w.op("Mul", [half_x, w.op("Add", [t, w.scalar(1, elem)])], outputs(node, 1)[0])
    return w.nodes


def quick_gelu(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``QuickGelu(X) = X * sigmoid(alpha * X)`` (``alpha`` 1.702 by default)."""
    (x,) = inputs(node, 1)
    w = ctx.writer(node)
    elem = ctx.float_type(x)
    alpha = node.attributes.get_float("alpha", 1.702)
    scaled = w.op("Mul", [x, w.scalar(alpha, elem)]) if alpha != 1.0 else x
    w.op("Mul", [x, w.op("Sigmoid", [scaled])], outputs(node, 1)[0])
    return w.nodes


def gelu_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``GeluGrad(dY, X)`` (erf GELU) and ``BiasGeluGrad_dX(dY, X, B)`` (on ``X + B``)."""
    dy, x, bias = inputs(node, 3)
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    _gelu_grad(w, w.op("Add", [x, bias]) if bias else x, dy, elem, outputs(node, 1)[0])
    return w.nodes


def fast_gelu_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``FastGeluGrad(dY, X)`` (tanh GELU) and ``BiasFastGeluGrad_dX(dY, X, B)``."""
    dy, x, bias = inputs(node, 3)
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    _fast_gelu_grad(w, w.op("Add", [x, bias]) if bias else x, dy, elem, outputs(node, 1)[0])
    return w.nodes


def quick_gelu_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``QuickGeluGrad(dY, X) = dY * s * (1 + alpha * x * (1 - s))`` with ``s = sigmoid(alpha *
    x)``.
    """
    dy, x = inputs(node, 2)
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    alpha = w.scalar(node.attributes.get_float("alpha", 1.702), elem)
    ax = w.op("Mul", [x, alpha])
    s = w.op("Sigmoid", [ax])
    one = w.scalar(1, elem)
    w.op(
        "Mul",
        [w.op("Mul", [dy, s]), w.op("Add", [one, w.op("Mul", [ax, w.op("Sub", [one, s])])])],
        outputs(node, 1)[0],
    )
    return w.nodes


def dropout_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``DropoutGrad(dY, mask, ratio=0.5) = mask * dY / (1 - ratio)``, ``dY`` itself when ``ratio ==
    0``.

    ``training_mode`` is not read (as in ONNX Runtime's kernel).
    """
    dy, mask, ratio = inputs(node, 3)
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    known = ctx.constant(ratio) if ratio else np.float32(0.5)
    if known is not None and float(np.asarray(known).reshape(-1)[0]) == 0.0:
        w.op("Identity", [dy], outputs(node, 1)[0])
        return w.nodes
    kept = w.op("Mul", [w.cast(mask, elem), dy])
    ratio_f = (
        w.reshape(w.cast(ratio, onnx.TensorProto.FLOAT), [])
        if ratio
        else w.scalar(0.5, onnx.TensorProto.FLOAT)
    )
    keep = w.op("Sub", [w.scalar(1, onnx.TensorProto.FLOAT), ratio_f])
    scaled = w.op("Div", [kept, w.cast(keep, elem) if elem != onnx.TensorProto.FLOAT else keep])
    if known is None:  # a run-time ratio: 0 passes dY through, whatever the mask
        zero = w.op("Equal", [ratio_f, w.scalar(0, onnx.TensorProto.FLOAT)])
        w.op("Where", [zero, dy, scaled], outputs(node, 1)[0])
    else:
        w.op("Identity", [scaled], outputs(node, 1)[0])
    return w.nodes


def scale(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``Scale(X, s) = X * (T)(float)s``, or ``X * (T)(1.0f / (float)s)`` with ``scale_down=1``."""
    x, s = inputs(node, 2)
    w = ctx.writer(node)
    elem = ctx.float_type(x)
    factor = w.reshape(w.cast(s, onnx.TensorProto.FLOAT), [])
    if node.attributes.get_int("scale_down", 0):
        factor = w.op("Div", [w.scalar(1, onnx.TensorProto.FLOAT), factor])
    w.op(
        "Mul",
        [x, w.cast(factor, elem) if elem != onnx.TensorProto.FLOAT else factor],
        outputs(node, 1)[0],
    )
    return w.nodes


LOWERINGS = {
    "Gelu": gelu,
    "BiasGelu": gelu,
    "FastGelu": fast_gelu,
    "QuickGelu": quick_gelu,
    "ReluGrad": relu_grad,
    "LeakyReluGrad": leaky_relu_grad,
    "SigmoidGrad": sigmoid_grad,
    "TanhGrad": tanh_grad,
    "GeluGrad": gelu_grad,
    "BiasGeluGrad_dX": gelu_grad,
    "FastGeluGrad": fast_gelu_grad,
    "BiasFastGeluGrad_dX": fast_gelu_grad,
    "QuickGeluGrad": quick_gelu_grad,
    "DropoutGrad": dropout_grad,
    "Scale": scale,
}
