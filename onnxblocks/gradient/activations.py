"""Activations without a gradient builder in ONNX Runtime, written with ops that have one.

ONNX Runtime 1.19.2 cannot differentiate ``Elu``, ``Selu``, ``Celu``,
``HardSigmoid``, ``HardSwish``, ``PRelu``, ``Mish``, ``ThresholdedRelu``,
``Shrink``, ``Softsign`` and ``Sign`` (whose gradient is 0); the torch exporters emit
most of them (``nn.ELU``, ``nn.SELU``, ``nn.CELU``, ``nn.Hardsigmoid``,
``nn.Hardswish``, ``nn.PReLU``, ``nn.Mish``, ``nn.Hardshrink``/``nn.Softshrink``,
``torch.sign``). ``activations_as_elementary``
rewrites each into ``Where``, ``Exp``, ``Clip``, ``Mul``... with the op's ONNX
definition, so forward values are unchanged.

The exponential branches read ``Where(x > 0, 0, x)`` instead of ``x``: the branch
``Where`` does not take stays finite, so its gradient is never ``0 * inf``. The
``Where`` conditions follow torch's choice at the kinks (``x > 0`` selects the
linear branch), so gradients at exactly 0 equal torch's.
``Mish`` becomes ``x * Tanh(Softplus(x))``; the Softplus pass that runs after it
(``softplus_as_elementary``, below) finishes the job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks.ir.attributes import float_attribute
from onnxblocks.ir.rewrite import NodeRewrite, NoMatch, RewriteContext, fail, is_default_domain
from onnxblocks.ir.writer import Writer

# (writer, node, x, y, numpy dtype) -> None; writes nodes whose last output is named y
_Rewrite = Callable[[Writer, ir.Node, ir.Value, str, np.dtype], None]


def _attr(node: ir.Node, name: str, default: float) -> float:
    return float_attribute(node, name, default)


def _exp_below_zero(
    w: Writer, x: ir.Value, dtype: np.dtype, scale: float, inner: float, y: str
) -> ir.Value:
    """``y = x > 0 ? x : scale * (exp(inner * x) - 1)`` (inner, scale: the ELU family's
    constants).
    """
    zero, one = w.const(0, dtype), w.const(1, dtype)
    positive = w.op("Greater", [x, zero])
    safe = w.op("Where", [positive, zero, x])
    if inner != 1.0:
        safe = w.op("Mul", [safe, w.const(inner, dtype)])
    negative = w.op("Mul", [w.op("Sub", [w.op("Exp", [safe]), one]), w.const(scale, dtype)])
    return w.op("Where", [positive, x, negative], out=y)


def _elu(w, node, x, y, dtype):
    _exp_below_zero(w, x, dtype, _attr(node, "alpha", 1.0), 1.0, y)


def _celu(w, node, x, y, dtype):
    alpha = _attr(node, "alpha", 1.0)
    _exp_below_zero(w, x, dtype, alpha, 1.0 / alpha, y)


def _selu(w, node, x, y, dtype):
    alpha = _attr(node, "alpha", 1.6732632423543772848170429916717)
    gamma = _attr(node, "gamma", 1.0507009873554804934193349852946)
    elu = _exp_below_zero(w, x, dtype, alpha, 1.0, w.fresh("elu"))
    w.op("Mul", [elu, w.const(gamma, dtype)], out=y)


def _hard_sigmoid(w, x, dtype, alpha, beta, out=None):
    """``max(0, min(1, alpha * x + beta))`` with slope 0 at both kinks, as torch's hardsigmoid and
    hardswish.

    (``Clip``'s gradient would include the kinks.)
    """
    linear = w.op("Add", [w.op("Mul", [x, w.const(alpha, dtype)]), w.const(beta, dtype)])
    zero, one = w.const(0, dtype), w.const(1, dtype)
    upper = w.op("Where", [w.op("Less", [linear, one]), linear, one])
    return w.op("Where", [w.op("Greater", [linear, zero]), upper, zero], out=out)


def _hardsigmoid(w, node, x, y, dtype):
    _hard_sigmoid(w, x, dtype, _attr(node, "alpha", 0.2), _attr(node, "beta", 0.5), out=y)


def _hardswish(w, node, x, y, dtype):
    w.op("Mul", [x, _hard_sigmoid(w, x, dtype, 1.0 / 6.0, 0.5)], out=y)


def _prelu(w, node, x, y, dtype):
    positive = w.op("Greater", [x, w.const(0, dtype)])
    w.op("Where", [positive, x, w.op("Mul", [x, node.inputs[1]])], out=y)


def _mish(w, node, x, y, dtype):
    w.op("Mul", [x, w.op("Tanh", [w.op("Softplus", [x])])], out=y)


def _thresholded_relu(w, node, x, y, dtype):
    above = w.op("Greater", [x, w.const(_attr(node, "alpha", 1.0), dtype)])
    w.op("Where", [above, x, w.const(0, dtype)], out=y)


def _shrink(w, node, x, y, dtype):
    lambd, bias = _attr(node, "lambd", 0.5), _attr(node, "bias", 0.0)
    below = w.op("Less", [x, w.const(-lambd, dtype)])
    above = w.op("Greater", [x, w.const(lambd, dtype)])
    inner = w.op("Where", [above, w.op("Sub", [x, w.const(bias, dtype)]), w.const(0, dtype)])
    w.op("Where", [below, w.op("Add", [x, w.const(bias, dtype)]), inner], out=y)


def _sign(w, node, x, y, dtype):
    # gradient 0 everywhere: the comparisons carry none (NaN gives 0 instead of NaN)
    zero = w.const(0, dtype)
    negative = w.op("Where", [w.op("Less", [x, zero]), w.const(-1, dtype), zero])
    w.op("Where", [w.op("Greater", [x, zero]), w.const(1, dtype), negative], out=y)


def _softsign(w, node, x, y, dtype):
    w.op("Div", [x, w.op("Add", [w.op("Abs", [x]), w.const(1, dtype)])], out=y)


#: ai.onnx op type -> its rewrite.
REWRITES: dict[str, _Rewrite] = {
    "Elu": _elu,
    "Celu": _celu,
    "Selu": _selu,
    "HardSigmoid": _hardsigmoid,
    "HardSwish": _hardswish,
    "PRelu": _prelu,
    "Mish": _mish,
    "ThresholdedRelu": _thresholded_relu,
    "Shrink": _shrink,
    "Softsign": _softsign,
    "Sign": _sign,
}


class ActivationsAsElementary(NodeRewrite):
    """Rewrite the activations in :data:`REWRITES` into ops ONNX Runtime can differentiate.

    Nodes whose input element type is unknown are left as they are.
    """

    name = "activations_as_elementary"
    op_types = frozenset(REWRITES)
    min_opset = None

    def select(self, node: ir.Node) -> bool:
        return node.op_type in REWRITES and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        x, y = node.inputs[0], node.outputs[0].name or ""
        dtype = ctx.dtype(x)
        if x is None or dtype is None:
            return fail("the input is missing or its element type is not known")
        writer = ctx.writer(y)
        REWRITES[node.op_type](writer, node, x, y, dtype)
        return writer.nodes


#: Above this input, softplus(x) is x to float precision (torch.nn.Softplus's default threshold).
SOFTPLUS_THRESHOLD = 20.0


class SoftplusAsElementary(NodeRewrite):
    """Rewrite ``Softplus(x)`` into ``Where(x > 20, x, Log(1 + Exp(Min(x, 20))))``.

    That is torch's Softplus (threshold 20); it differs from ``log(1 + exp(x))``
    by less than 2e-9 relative above the threshold. ``Min`` keeps ``Exp`` finite in
    the branch ``Where`` does not take, so its gradient is never ``0 * inf``.
    Nodes whose input type is unknown are left as they are.
    """

    name = "softplus_as_elementary"
    op_types = frozenset({"Softplus"})
    min_opset = None

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "Softplus" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        x, y = node.inputs[0], node.outputs[0].name or ""
        dtype = ctx.dtype(x)
        if x is None or dtype is None:
            return fail("the input is missing or its element type is not known")
        w = ctx.writer(y)
        limit, one = w.const(SOFTPLUS_THRESHOLD, dtype, "threshold"), w.const(1, dtype, "one")
        log = w.op("Log", [w.op("Add", [w.op("Exp", [w.op("Min", [x, limit])]), one])])
        w.op("Where", [w.op("Greater", [x, limit]), x, log], out=y)
        return w.nodes
