"""``Pow`` whose exponent needs a gradient, written so that ONNX Runtime differentiates the exponent
too.

ONNX Runtime 1.19's gradient builder differentiates ``Pow(a, b)`` in its base
only: the exponent is one of its "stop gradient" edges. For ``a ** b`` with both
sides depending on a parameter the exponent's share of the gradient was silently
lost (the sign could even come out wrong against torch); with only the exponent
depending on one, the builder said the parameter was unreachable.

:class:`PowExponentAsExpLog` rewrites each ``Pow`` whose (floating-point)
exponent depends differentiably on a value that requires a gradient into
``|a| ** b`` as ``exp(b * log|a|)`` times a sign, with no ``Pow`` of ``b`` left
(ONNX Runtime refuses any ``Pow`` whose exponent is on the gradient's path):

* The arithmetic runs in float64 for a float32 ``Pow`` (float32 for float16 and
  bfloat16) and the result is cast back, so the value equals ``Pow``'s to its
  precision (for a float64 ``Pow`` it is within a few ulps).
* ``a > 0``: the gradients are torch's, ``b * a ** (b - 1)`` and ``a ** b * log(a)``.
* ``a < 0``: the value is ``Pow``'s, ``(-1) ** b * |a| ** b`` for an integer ``b``
  and NaN otherwise; the base's gradient is torch's, and the exponent's is NaN,
  as torch's ``a ** b * log(a)``.
* ``a == 0``: the value (0, 1 or inf) and the base's gradient (0, 1, inf or
  -inf) are torch's; the exponent's gradient is 0, torch's too except for
  ``b < 0``, where the value is inf and torch's gradient ``-inf``. The sign of a
  zero result may differ (``(-0.0) ** 3``).

The eval model keeps the original ``Pow`` (the rewrite runs on the training copy only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.gradient.dependencies import downstream_values
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
)
from onnxblocks.ir.writer import Writer

_F = onnx.TensorProto
#: The type ``exp(b * log(a))`` is computed in, by the base's type.
_WORK_TYPE: dict[int, int] = {
    _F.FLOAT: _F.DOUBLE,
    _F.DOUBLE: _F.DOUBLE,
    _F.FLOAT16: _F.FLOAT,
    _F.BFLOAT16: _F.FLOAT,
}


class PowExponentAsExpLog(NodeRewrite):
    """Rewrite each ``Pow`` whose exponent depends on ``requires_grad`` so that its exponent gets a
    gradient.

    Nodes whose base or exponent type is unknown or not floating point are left as
    they are (an integer exponent has no gradient).

    Args:
        requires_grad: The names of the values a gradient is wanted for.
    """

    name = "pow_exponent_as_exp_log"
    op_types = frozenset({"Pow"})
    min_opset = None

    def __init__(self, requires_grad: Iterable[str] = ()) -> None:
        self.requires_grad = list(requires_grad)
        self._reached: set[ir.Value] = set()

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        if not self.requires_grad or not any(n.op_type == "Pow" for n in model.graph):
            return {}
        self._reached = downstream_values(model.graph, self.requires_grad)
        return super().apply(model)

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "Pow" and is_default_domain(node) and node.inputs[1] in self._reached

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _rewrite(node, ctx)


def _rewrite(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0].name or "pow"
    a_type, b_type = ctx.types.elem(a), ctx.types.elem(b)
    if a is None or b is None or a_type not in _WORK_TYPE or b_type not in _WORK_TYPE:
        return fail("the base or exponent is not of a known floating-point type")
    work = _WORK_TYPE[a_type]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(work)
    w = ctx.writer(y)

    def const(value: float) -> ir.Value:
        return w.const(value, dtype)

    a, b = _cast(w, a, a_type, work), _cast(w, b, b_type, work)
    zero, one = const(0), const(1)
    # |a| ** b = exp(b * log|a|) where a != 0 (on a base of 1 elsewhere: the untaken branch stays
    # finite)
    nonzero = w.op("Not", [w.op("Equal", [a, zero])])
    magnitude = w.op(
        "Exp", [w.op("Mul", [b, w.op("Log", [w.op("Where", [nonzero, w.op("Abs", [a]), one])])])]
    )
    # the sign for a < 0: (-1) ** b for an integer b, NaN otherwise; comparisons carry no gradient
    negative = w.op("Less", [a, zero])
    floor = w.op("Floor", [b])
    half = w.op("Mul", [floor, const(0.5)])
    odd = w.op("Not", [w.op("Equal", [w.op("Floor", [half]), half])])
    parity = w.op("Where", [odd, const(-1), one])
    sign = w.op(
        "Where", [negative, w.op("Where", [w.op("Equal", [b, floor]), parity, const(np.nan)]), one]
    )
    # Pow(z, 0) is 1, and its gradient is NaN where z is NaN: the exponent's gradient for a < 0, as
    # torch.
    # z = b * 0 + (NaN where a < 0, else 1): b's gradient is that NaN times 0 there, and 0
    # elsewhere.
    z = w.op("Add", [w.op("Mul", [b, zero]), w.op("Where", [negative, const(np.nan), one])])
    nan_gradient = w.op("Pow", [z, zero])
    nonzero_value = w.op("Mul", [w.op("Mul", [magnitude, sign]), nan_gradient])
    # a == 0: Pow(a, e) with an exponent e of b's class that carries no gradient back to b (built
    # from
    # comparisons): the value (0, 1 or inf) and the base's gradient e * 0 ** (e - 1) (0, 1, inf,
    # -inf) are torch's
    positive_b, b_is_zero = w.op("Greater", [b, zero]), w.op("Equal", [b, zero])
    stand_in = w.op("Where", [w.op("Less", [b, zero]), const(-2), const(np.nan)])
    stand_in = w.op("Where", [b_is_zero, zero, stand_in])
    stand_in = w.op("Where", [positive_b, const(0.5), stand_in])
    stand_in = w.op("Where", [w.op("Equal", [b, one]), one, stand_in])
    stand_in = w.op("Where", [w.op("Greater", [b, one]), const(2), stand_in])
    zero_base = w.op(
        "Where", [w.op("Or", [nonzero, b_is_zero]), one, a]
    )  # 1 where it is not used, or b == 0
    zero_value = w.op("Pow", [zero_base, stand_in])
    result = w.op("Where", [nonzero, nonzero_value, zero_value])
    _cast(w, result, work, a_type, out=y)
    return w.nodes


def _cast(
    w: Writer, value: ir.Value, from_type: int, to_type: int, out: str | None = None
) -> ir.Value:
    if from_type == to_type:
        return w.op("Identity", [value], out=out) if out else value
    return w.op("Cast", [value], out=out, to=to_type)
