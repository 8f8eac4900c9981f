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

import numpy as np
import onnx

from onnxblocks.gradient import _graph

_LARGEST = {"ReduceMax": 1, "ReduceMin": 0}


def reduce_extremum_as_topk(model: onnx.ModelProto) -> int:
    """Rewrite float ``ReduceMax`` / ``ReduceMin`` with constant axes (and known rank for several axes) into ``TopK``.

    Returns:
        The number of nodes rewritten.
    """
    return _graph.rewrite_nodes(
        model, lambda n: n.op_type in _LARGEST and _graph.is_default_domain(n), _reduce_extremum
    )


def _reduce_extremum(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    types, constants, names, opset = ctx.types, ctx.constants, ctx.names, ctx.opset
    x, y = node.input[0], node.output[0]
    if _graph.elem_type(types, x) not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
        return None  # integer reductions carry no gradient
    if len(node.input) > 1 and node.input[1]:
        value = constants.folded(node.input[1])
        if value is None:
            return None
        axes = [int(a) for a in value.reshape(-1)]
    else:
        axes = _graph.ints_attribute(node, "axes", [])
    keepdims = _graph.int_attribute(node, "keepdims", 1)
    if not axes and _graph.int_attribute(node, "noop_with_empty_axes", 0):
        return None
    shape = _graph.shape_of(types, x)
    rank = len(shape) if shape is not None else None
    if rank is None and (len(axes) != 1 or (axes[0] < 0 and keepdims == 0)):
        return None
    if rank is not None:
        axes = sorted({a + rank if a < 0 else a for a in axes} or set(range(rank)))
    w = _graph.NodeWriter(names, opset, y)
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
    return w.nodes


def cumsum_as_matmul(model: onnx.ModelProto) -> int:
    """Rewrite float ``CumSum`` along an axis of static length ``n`` into ``MatMul`` with an ``n x n`` 0/1 matrix.

    ``CumSum`` (``torch.cumsum``) has no gradient builder. Column ``j`` of the matrix
    marks the positions summed into position ``j`` (``k <= j``; ``<`` with
    ``exclusive``, ``>=`` / ``>`` with ``reverse``).

    Returns:
        The number of nodes rewritten.
    """
    return _graph.rewrite_nodes(model, lambda n: n.op_type == "CumSum" and _graph.is_default_domain(n), _cumsum)


def _cumsum(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    types, constants, names, opset = ctx.types, ctx.constants, ctx.names, ctx.opset
    x, y = node.input[0], node.output[0]
    elem, shape = _graph.elem_type(types, x), _graph.shape_of(types, x)
    axis_value = constants.folded(node.input[1])
    if (
        elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)
        or shape is None
        or axis_value is None
    ):
        return None
    rank = len(shape)
    axis = int(axis_value.reshape(-1)[0])
    axis = axis + rank if axis < 0 else axis
    length = shape[axis]
    if length is None:
        return None
    k, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    exclusive = _graph.int_attribute(node, "exclusive", 0)
    reverse = _graph.int_attribute(node, "reverse", 0)
    if reverse:
        mask = k > j if exclusive else k >= j
    else:
        mask = k < j if exclusive else k <= j
    w = _graph.NodeWriter(names, opset, y)
    matrix = w.const(mask.astype(onnx.helper.tensor_dtype_to_np_dtype(elem)), suffix="triangle")
    if axis == rank - 1:
        w.op("MatMul", [x, matrix], out=y)
    else:
        perm = [a for a in range(rank) if a != axis] + [axis]
        product = w.op("MatMul", [w.op("Transpose", [x], perm=perm), matrix])
        w.op("Transpose", [product], out=y, perm=[perm.index(a) for a in range(rank)])
    return w.nodes
