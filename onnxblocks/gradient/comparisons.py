"""Comparisons of small integers in int32: ONNX Runtime 1.19.2's CPU kernels lack them for 8- and
16-bit types.

``(t == 3)`` on a uint8 tensor exports as ``Equal`` on uint8, which ONNX Runtime's
CPU build has no kernel for (nor for ``Less`` / ``Greater``... on int8, uint8, int16,
uint16), so neither the forward nor the training model would load.
``small_int_comparison_as_int32`` casts both operands to int32 first: every
value of these types is exact in int32, so the result is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir

from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
)

__all__ = ["SmallIntComparisonAsInt32"]

_COMPARISONS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
_SMALL = (
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.UINT16,
)


class SmallIntComparisonAsInt32(NodeRewrite):
    """Cast the operands of a comparison on int8, uint8, int16 or uint16 to int32."""

    name = "small_int_comparison_as_int32"
    op_types = _COMPARISONS
    min_opset = None

    def select(self, node: ir.Node) -> bool:
        return node.op_type in _COMPARISONS and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        a, b = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
        if a is None or b is None:
            return fail("an operand is missing")
        if ctx.types.elem(a) not in _SMALL:
            return fail("the operands are not 8- or 16-bit integers")
        w = ctx.writer(node.outputs[0].name or "compare")
        node.replace_input_with(0, w.cast(a, onnx.TensorProto.INT32))
        node.replace_input_with(1, w.cast(b, onnx.TensorProto.INT32))
        return [*w.nodes, node]
