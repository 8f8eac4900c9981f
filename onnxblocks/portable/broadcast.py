"""Broadcasting in reverse: ``BroadcastGradientArgs``, ``DivGrad``, ``ReduceSumTraining``.

The gradient builder reduces a broadcast gradient back to an input's shape with
``ReduceSum(dY, BroadcastGradientArgs(Shape(A), Shape(B)))``. The axes are
computed at run time from the two shapes (:func:`broadcast_axes`), so a dynamic
batch stays dynamic; when the dims are known when lowering (static, or the same
symbol) they become a constant instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.portable.context import LoweringContext, Writer, attributes, describe, inputs, outputs

Dims = Sequence[int | str | None]


def static_broadcast_axes(a: Dims, b: Dims) -> tuple[list[int], list[int]] | None:
    """The axes (descending, as ONNX Runtime lists them) along which ``a`` and ``b`` are broadcast.

    A symbolic dim against 1 counts as broadcast (when the symbol is 1 at run time,
    the reduction is over a size-1 axis: the same numbers). Returns None when a pair
    cannot be decided before run time (an unknown dim, two different symbols).
    """
    ndim = max(len(a), len(b))
    a_axes: list[int] = []
    b_axes: list[int] = []
    for k in range(ndim - 1, -1, -1):
        i, j = k - (ndim - len(a)), k - (ndim - len(b))
        if i < 0:
            a_axes.append(k)
            continue
        if j < 0:
            b_axes.append(k)
            continue
        da, db = a[i], b[j]
        if da is None or db is None:
            return None
        if da == db:
            continue
        if da == 1:
            a_axes.append(k)
        elif db == 1:
            b_axes.append(k)
        elif isinstance(da, str) or isinstance(db, str):
            return None
        else:
            return None  # not broadcastable: leave it to the run time to report
    return a_axes, b_axes


def broadcast_axes(
    w: Writer, a_shape: ir.Value, b_shape: ir.Value, which: Sequence[bool] = (True, True)
) -> list[ir.Value | None]:
    """Run-time ``BroadcastGradientArgs``: int64 axes (descending) to reduce ``a`` and ``b`` over.

    Args:
        w: The writer.
        a_shape: The first int64 1-D shape.
        b_shape: The second int64 1-D shape.
        which: Which of the two axes lists to compute (None for the others).
    """
    one = w.ints([1])
    rank_a, rank_b = w.op("Shape", [a_shape]), w.op("Shape", [b_shape])
    ndim = w.op("Max", [rank_a, rank_b])
    padded = []
    for shape, rank in ((a_shape, rank_a), (b_shape, rank_b)):
        ones = w.op("ConstantOfShape", [w.op("Sub", [ndim, rank])], value=ir.tensor(np.ones(1, np.int64)))
        padded.append(w.concat([ones, shape]))
    a_pad, b_pad = padded
    descending = w.op("Range", [w.reshape(w.op("Sub", [ndim, one]), []), w.const(np.int64(-1)), w.const(np.int64(-1))])
    a_rev, b_rev = w.op("Gather", [a_pad, descending], axis=0), w.op("Gather", [b_pad, descending], axis=0)
    differ = w.op("Not", [w.op("Equal", [a_rev, b_rev])])
    a_one, b_one = w.op("Equal", [a_rev, one]), w.op("Equal", [b_rev, one])
    out: list[ir.Value | None] = []
    for wanted, rank, mask in (
        (which[0], rank_a, w.op("And", [differ, a_one])),
        (which[1], rank_b, w.op("And", [differ, w.op("And", [w.op("Not", [a_one]), b_one])])),
    ):
        if not wanted:
            out.append(None)
            continue
        leading = w.op("Less", [descending, w.op("Sub", [ndim, rank])])
        out.append(w.op("Compress", [descending, w.op("Or", [leading, mask])], axis=0))
    return out


def unbroadcast(w: Writer, ctx: LoweringContext, grad: ir.Value, like: ir.Value, out: str) -> None:
    """Write ``out``: ``grad`` summed over the axes along which ``like`` was broadcast, in ``like``'s shape."""
    g_dims, x_dims = ctx.dims(grad), ctx.dims(like)
    if g_dims is not None and x_dims is not None and list(g_dims) == list(x_dims) and None not in g_dims:
        w.op("Identity", [grad], out)
        return
    axes: ir.Value | list[int] | None = None
    if g_dims is not None and x_dims is not None:
        static = static_broadcast_axes(x_dims, g_dims)
        if static is not None:
            axes = static[0]
            if not axes:
                w.reshape(grad, w.shape(like), out)
                return
    if axes is None:
        if w.opset < 13:
            raise InvalidValueError("run-time broadcast axes need ReduceSum with an axes input (opset 13)")
        (axes,) = [a for a in broadcast_axes(w, w.shape(like), w.shape(grad), (True, False)) if a is not None]
    summed = (
        w.reduce("ReduceSum", grad, axes, keepdims=1, noop_with_empty_axes=1)
        if isinstance(axes, ir.Value)
        else (w.reduce("ReduceSum", grad, axes, keepdims=1))
    )
    w.reshape(summed, w.shape(like), out)


def broadcast_gradient_args(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``BroadcastGradientArgs(a_shape, b_shape) -> (a_axes, b_axes)``: constants when decidable, else run-time."""
    a_shape, b_shape = inputs(node, 2)
    a_out, b_out = outputs(node, 2)
    w = ctx.writer(node)
    sources = [ctx.shape_source(a_shape), ctx.shape_source(b_shape)]
    dims = [ctx.dims(s) if s else None for s in sources]
    static = static_broadcast_axes(dims[0], dims[1]) if dims[0] is not None and dims[1] is not None else None
    if static is not None:
        for name, axes in zip((a_out, b_out), static, strict=True):
            if name:
                w.named_const(name, np.array(axes, dtype=np.int64))
        return w.nodes
    computed = broadcast_axes(w, a_shape, b_shape, (bool(a_out), bool(b_out)))
    for name, value in zip((a_out, b_out), computed, strict=True):
        if name and value is not None:
            w.op("Identity", [value], name)
    return w.nodes


def div_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``DivGrad(dY, A, B) -> (dY / B, -dY * A / B^2)``, each summed back to its input's shape."""
    dy, a, b = inputs(node, 3)
    da, db = outputs(node, 2)
    w = ctx.writer(node)
    if _needs_runtime_axes(ctx, dy, a, b):
        ctx.require_opset(node, 13, "ReduceSum with run-time axes")
    if da:
        full = w.op("Div", [dy, b])
        ctx.record(w.nodes)
        unbroadcast(w, ctx, full, a, da)
    if db:
        full = w.op("Neg", [w.op("Div", [w.op("Mul", [dy, a]), w.op("Mul", [b, b])])])
        ctx.record(w.nodes)
        unbroadcast(w, ctx, full, b, db)
    return w.nodes


def _needs_runtime_axes(ctx: LoweringContext, dy: ir.Value | None, a: ir.Value | None, b: ir.Value | None) -> bool:
    g = ctx.dims(dy)
    return any(g is None or ctx.dims(x) is None or static_broadcast_axes(ctx.dims(x) or [], g) is None for x in (a, b))


def reduce_sum_training(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``ReduceSumTraining(X, axes)``: ``ReduceSum`` with an axes input (opset 13)."""
    ctx.require_opset(node, 13, "ReduceSum with an axes input")
    w = ctx.writer(node)
    w.ops("ReduceSum", list(node.inputs), outputs(node, len(node.outputs)), **attributes(node))
    if len(node.outputs) != 1:
        raise InvalidValueError(f"{describe(node)} has {len(node.outputs)} outputs")
    return w.nodes


LOWERINGS = {
    "BroadcastGradientArgs": broadcast_gradient_args,
    "DivGrad": div_grad,
    "ReduceSumTraining": reduce_sum_training,
}
