"""ReduceMax / ReduceMin as TopK and CumSum as MatMul: ONNX Runtime 1.19.2 has no gradient builder for them.

``torch.amax`` / ``amin``, ``x.max(dim)`` and ``x.min(dim)`` export as ``ReduceMax``
/ ``ReduceMin``. :func:`reduce_extremum_as_topk` takes the largest (smallest)
element with ``TopK(k=1)``, whose gradient ONNX Runtime has: the reduced axes are
moved last and merged (``Transpose``, ``Reshape``) when there are several.

The gradient goes to the element TopK selects. Where several elements tie for the
maximum, torch's ``amax`` shares it among them equally (``max(dim)`` gives it to one):
the sum over the tied elements is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.gradient._rewrite import NodeRewrite, RewriteContext, is_default_domain, on_proto, optional_input
from onnxblocks.ir.attributes import int_attribute, ints_attribute

_LARGEST = {"ReduceMax": 1, "ReduceMin": 0}
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


class ReduceExtremumAsTopK(NodeRewrite):
    """Rewrite float ``ReduceMax`` / ``ReduceMin`` with constant axes (known rank for several) into ``TopK``.

    bfloat16 is reduced in float32 (``Cast``, ``TopK``, ``Cast``): ONNX Runtime's CPU has no bfloat16 TopK.
    """

    name = "reduce_extremum_as_topk"
    op_types = frozenset(_LARGEST)

    def select(self, node: ir.Node) -> bool:
        return node.op_type in _LARGEST and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | None:
        return _reduce_extremum(node, ctx)


reduce_extremum_as_topk = on_proto(
    ReduceExtremumAsTopK,
    "reduce_extremum_as_topk",
    """Rewrite, in place, float ``ReduceMax`` / ``ReduceMin`` with constant axes into ``TopK``.

    Returns:
        The number of nodes rewritten.
    """,
)


def _reduce_extremum(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | None:
    types, constants = ctx.types, ctx.constants
    x, y = node.inputs[0], node.outputs[0].name or "reduce"
    bfloat16 = x is not None and types.elem(x) == onnx.TensorProto.BFLOAT16
    if x is None or (types.elem(x) not in _FLOATS and not bfloat16):
        return None  # integer reductions carry no gradient
    axes_input = optional_input(node, 1)
    if axes_input is not None:
        value = constants.folded(axes_input)
        if value is None:
            return None
        axes = [int(a) for a in value.reshape(-1)]
    else:
        axes = ints_attribute(node, "axes", [])
    keepdims = int_attribute(node, "keepdims", 1)
    if not axes and int_attribute(node, "noop_with_empty_axes", 0):
        return None
    shape = types.shape(x)
    rank = len(shape) if shape is not None else None
    if rank is None and (len(axes) != 1 or (axes[0] < 0 and keepdims == 0)):
        return None
    if rank is not None:
        axes = sorted({a + rank if a < 0 else a for a in axes} or set(range(rank)))
    w = ctx.writer(y)
    final = y
    if bfloat16:  # no bfloat16 TopK kernel on the CPU: the extremum of the float32 values is exact
        x, y = w.cast(x, onnx.TensorProto.FLOAT), w.fresh("float32")
    largest = _LARGEST[node.op_type]
    one = w.ints([1])
    if len(axes) == 1:
        values = w.ops("TopK", [x, one], [w.fresh("values"), w.fresh("indices")], axis=axes[0], largest=largest)[0]
        if keepdims:
            w.op("Identity", [values], out=y)
        else:
            w.squeeze(values, axes, out=y)
    else:
        assert rank is not None  # several axes: an unknown rank returned above
        kept = [a for a in range(rank) if a not in axes]
        moved = w.op("Transpose", [x], perm=kept + axes)
        merged = w.op("Reshape", [moved, w.ints([0] * len(kept) + [-1])])
        values = w.ops("TopK", [merged, one], [w.fresh("values"), w.fresh("indices")], axis=len(kept), largest=largest)[
            0
        ]
        flat = w.squeeze(values, [len(kept)])
        if keepdims:
            w.unsqueeze(flat, axes, out=y)
        else:
            w.op("Identity", [flat], out=y)
    if bfloat16:
        w.cast(w.nodes[-1].outputs[0], onnx.TensorProto.BFLOAT16, out=final)
    return w.nodes


class CumSumAsMatMul(NodeRewrite):
    """Rewrite float ``CumSum`` along an axis of static length ``n`` into ``MatMul`` with an ``n x n`` 0/1 matrix.

    ``CumSum`` (``torch.cumsum``) has no gradient builder. Column ``j`` of the matrix
    marks the positions summed into position ``j`` (``k <= j``; ``<`` with
    ``exclusive``, ``>=`` / ``>`` with ``reverse``).
    """

    name = "cumsum_as_matmul"
    op_types = frozenset({"CumSum"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "CumSum" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | None:
        return _cumsum(node, ctx)


cumsum_as_matmul = on_proto(
    CumSumAsMatMul,
    "cumsum_as_matmul",
    """Rewrite, in place, float ``CumSum`` along an axis of static length into ``MatMul`` with a 0/1 matrix.

    Returns:
        The number of nodes rewritten.
    """,
)


def _cumsum(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | None:
    types, constants = ctx.types, ctx.constants
    x, y = node.inputs[0], node.outputs[0].name or "cumsum"
    elem, shape = types.elem(x), types.shape(x)
    axis_value = constants.folded(optional_input(node, 1))
    if x is None or elem not in _FLOATS or shape is None or axis_value is None:
        return None
    rank = len(shape)
    axis = int(axis_value.reshape(-1)[0])
    axis = axis + rank if axis < 0 else axis
    length = shape[axis]
    if length is None:
        return None
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
