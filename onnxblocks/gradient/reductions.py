"""CumSum as MatMul: ONNX Runtime 1.19.2 has no gradient builder for it.

(``ReduceMax`` / ``ReduceMin`` are :mod:`onnxblocks.gradient.extrema`'s.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.ir.attributes import int_attribute
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
    optional_input,
)

_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


class CumSumAsMatMul(NodeRewrite):
    """Rewrite float ``CumSum`` along an axis of static length ``n`` into ``MatMul`` with an ``n x
    n`` 0/1 matrix.

    ``CumSum`` (``torch.cumsum``) has no gradient builder. Column ``j`` of the matrix
    marks the positions summed into position ``j`` (``k <= j``; ``<`` with
    ``exclusive``, ``>=`` / ``>`` with ``reverse``).
    """

    name = "cumsum_as_matmul"
    op_types = frozenset({"CumSum"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "CumSum" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _cumsum(node, ctx)


def _cumsum(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    types, constants = ctx.types, ctx.constants
    x, y = node.inputs[0], node.outputs[0].name or "cumsum"
    elem, shape = types.elem(x), types.shape(x)
    axis_value = constants.folded(optional_input(node, 1))
    if x is None or elem not in _FLOATS:
        return fail("the input is not float32, float64 or float16")
    if shape is None:
        return fail("the input's rank is not known")
    if axis_value is None:
        return fail("the axis is not a constant")
    rank = len(shape)
    axis = int(axis_value.reshape(-1)[0])
    axis = axis + rank if axis < 0 else axis
    length = shape[axis]
    if length is None:
        return fail("the summed axis is not static")
    k, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    exclusive = int_attribute(node, "exclusive", 0)
    reverse = int_attribute(node, "reverse", 0)
    if reverse:
        mask = k > j if exclusive else k >= j
    else:
        mask = k < j if exclusive else k <= j
    w = ctx.writer(y)
    matrix = w.const(mask.astype(onnx.helper.tensor_dtype_to_np_dtype(elem)), suffix="triangle")
    if axis == rank - 1:
        w.op("MatMul", [x, matrix], out=y)
    else:
        perm = [a for a in range(rank) if a != axis] + [axis]
        product = w.op("MatMul", [w.op("Transpose", [x], perm=perm), matrix])
        w.op("Transpose", [product], out=y, perm=[perm.index(a) for a in range(rank)])
    return w.nodes
