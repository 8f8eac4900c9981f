"""Broadcasting in reverse: ``BroadcastGradientArgs``, ``DivGrad``, ``ReduceSumTraining``.

The gradient builder reduces a broadcast gradient back to an input's shape with
``ReduceSum(dY, BroadcastGradientArgs(Shape(A), Shape(B)))``. Each axis is decided
when lowering where the dims decide it (static, the same symbol, the other side
static 1: :func:`plan_reduction`); only an undecided axis is checked at run time,
on the two shapes, so a dynamic batch stays dynamic at the cost of a few nodes.
With a rank unknown, the whole computation runs at run time (:func:`broadcast_axes`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.portable.lowering_context import (
    LoweringContext,
    Writer,
    attributes,
    describe,
    inputs,
    outputs,
)

Dims = Sequence[int | str | None]


def plan_reduction(own: Dims, other: Dims) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Which axes (descending) to sum a broadcast gradient over, back to the shape of one operand.

    ``own`` are that operand's dims, ``other`` the other operand's (an int when static,
    a symbol's name, None when unknown). As in ONNX Runtime's ``BroadcastGradientArgs``,
    an axis is summed when the operand lacks it (a leading axis), or holds 1 there
    while the other operand does not. An axis is decided here when the dims decide
    it: static dims, the same symbol on both sides, or the other operand static 1.
    The others are checked at run time.

    Returns:
        ``(fixed, checked)``: the axes summed for sure, and ``(axis, own axis, other
        axis)`` of those summed when, at run time, the operand's dim is 1 and the other's is not.
    """
    ndim = max(len(own), len(other))
    fixed: list[int] = []
    checked: list[tuple[int, int, int]] = []
    for k in range(ndim - 1, -1, -1):
        i, j = k - (ndim - len(own)), k - (ndim - len(other))
        if i < 0:
            fixed.append(k)
            continue
        if j < 0:
            continue  # the other operand lacks this axis: it is the one broadcast there, if any
        d, e = own[i], other[j]
        if d is not None and d == e:
            continue
        if isinstance(d, int) and (d != 1 or isinstance(e, int)):
            if d == 1 and e != 1:
                fixed.append(k)
        elif e != 1:
            checked.append((k, i, j))
    return fixed, checked


def reduction_axes(
    w: Writer, shape: ir.Value, other_shape: ir.Value, own: Dims, other: Dims
) -> ir.Value | list[int]:
    """The axes of :func:`plan_reduction`: a list when all are decided, else an int64 1-D value.

    The undecided axes are checked together on the two shapes (``Shape`` of the
    operand and of the other): ``own == 1 and own != other``, and a ``Compress``
    keeps those that hold.
    """
    fixed, checked = plan_reduction(own, other)
    if not checked:
        return fixed
    mine = w.op("Gather", [shape, w.ints([i for _, i, _ in checked])], axis=0)
    theirs = w.op("Gather", [other_shape, w.ints([j for _, _, j in checked])], axis=0)
    one = w.op("Equal", [mine, w.ints([1] * len(checked))])
    summed = w.op("And", [one, w.op("Not", [w.op("Equal", [mine, theirs])])])
    candidates = sorted(fixed + [k for k, _, _ in checked], reverse=True)
    if fixed:  # one mask over every candidate, in descending order: True for the fixed ones
        position = {k: n + 1 for n, (k, _, _) in enumerate(checked)}
        padded = w.concat([w.named_const(w.fresh("true"), np.array([True])), summed])
        summed = w.op("Gather", [padded, w.ints([position.get(k, 0) for k in candidates])], axis=0)
    return w.op("Compress", [w.ints(candidates), summed], axis=0)


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
        ones = w.op(
            "ConstantOfShape", [w.op("Sub", [ndim, rank])], value=ir.tensor(np.ones(1, np.int64))
        )
        padded.append(w.concat([ones, shape]))
    a_pad, b_pad = padded
    descending = w.op(
        "Range",
        [w.reshape(w.op("Sub", [ndim, one]), []), w.const(np.int64(-1)), w.const(np.int64(-1))],
    )
    a_rev, b_rev = (
        w.op("Gather", [a_pad, descending], axis=0),
        w.op("Gather", [b_pad, descending], axis=0),
    )
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
    """Write ``out``: ``grad`` summed over the axes along which ``like`` was broadcast, in
    ``like``'s shape.
    """
    g_dims, x_dims = ctx.dims(grad), ctx.dims(like)
    if (
        g_dims is not None
        and x_dims is not None
        and list(g_dims) == list(x_dims)
        and None not in g_dims
    ):
        w.op("Identity", [grad], out)
        return
    axes: ir.Value | list[int]
    if g_dims is not None and x_dims is not None:
        axes = reduction_axes(w, w.shape(like), w.shape(grad), x_dims, g_dims)
        if isinstance(axes, list) and not axes:
            w.reshape(grad, w.shape(like), out)
            return
        if not isinstance(axes, list):
            ctx.undecided_axes += 1
    else:
        if w.opset < 13:
            raise InvalidValueError(
                "run-time broadcast axes need ReduceSum with an axes input (opset 13)"
            )
        ctx.undecided_axes += 1
        (axes,) = [
            a
            for a in broadcast_axes(w, w.shape(like), w.shape(grad), (True, False))
            if a is not None
        ]
    summed = (
        w.reduce("ReduceSum", grad, axes, keepdims=1, noop_with_empty_axes=1)
        if isinstance(axes, ir.Value)
        else (w.reduce("ReduceSum", grad, axes, keepdims=1))
    )
    w.reshape(summed, w.shape(like), out)


def broadcast_gradient_args(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``BroadcastGradientArgs(a_shape, b_shape) -> (a_axes, b_axes)``: decided here per axis where
    the dims allow.

    With both ranks known, each output is a constant, or a constant joined with a
    run-time check of the undecided axes (:func:`reduction_axes`); with a rank
    unknown, the whole computation runs at run time (:func:`broadcast_axes`).
    """
    a_shape, b_shape = inputs(node, 2)
    a_out, b_out = outputs(node, 2)
    w = ctx.writer(node)
    sources = [ctx.shape_source(a_shape), ctx.shape_source(b_shape)]
    dims = [ctx.dims(s) if s else None for s in sources]
    if dims[0] is not None and dims[1] is not None:
        pairs = (
            (a_out, a_shape, b_shape, dims[0], dims[1]),
            (b_out, b_shape, a_shape, dims[1], dims[0]),
        )
        for name, shape, other_shape, own, other in pairs:
            if not name:
                continue
            axes = reduction_axes(w, shape, other_shape, own, other)
            if isinstance(axes, list):
                w.named_const(name, np.array(axes, dtype=np.int64))
            else:
                ctx.undecided_axes += 1
                w.op("Identity", [axes], name)
        return w.nodes
    ctx.undecided_axes += 1
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


def _needs_runtime_axes(
    ctx: LoweringContext, dy: ir.Value | None, a: ir.Value | None, b: ir.Value | None
) -> bool:
    g = ctx.dims(dy)
    return any(
        g is None or ctx.dims(x) is None or plan_reduction(ctx.dims(x) or [], g)[1] for x in (a, b)
    )


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
