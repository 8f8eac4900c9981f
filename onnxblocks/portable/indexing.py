"""Indexing gradients and the training forms of Concat/Split.

``GatherGrad`` and ``GatherElementsGrad`` scatter-add ``dY`` into zeros of the
input's shape (``ScatterND`` / ``ScatterElements`` with ``reduction="add"``, opset
16; in float32 for float16 and bfloat16, which ONNX Runtime's CPU kernels cannot add
in). ``SliceGrad`` scatters ``dY`` to the positions the slice read (each position
once, so opset 11 suffices). ``ConcatTraining`` / ``SplitTraining`` are ``Concat``
/ ``Split`` plus the per-input lengths along the axis.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.portable.lowering_context import (
    INT64_MAX,
    LoweringContext,
    Writer,
    inputs,
    outputs,
    unsupported,
)


def zeros(w: Writer, shape: ir.Value | None, elem_type: int) -> ir.Value:
    """``ConstantOfShape(shape)`` of ``elem_type`` zeros."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    return w.op("ConstantOfShape", [shape], value=ir.tensor(np.zeros(1, dtype)))


#: Element types ONNX Runtime's CPU ``ScatterElements`` / ``ScatterND`` cannot add in
#: (``reduction="add"``).
_NO_SCATTER_ADD = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def scatter_add(
    w: Writer,
    op_type: str,
    shape: ir.Value,
    elem_type: int,
    indices: ir.Value,
    updates: ir.Value,
    out: str | ir.Value | None = None,
    **attrs: Any,
) -> ir.Value:
    """``op_type`` (``ScatterElements`` / ``ScatterND``) adding ``updates`` at ``indices`` into
    zeros of ``shape``.

    In float16 and bfloat16 the sum is taken in float32 and cast back: ONNX Runtime's
    CPU kernels have no ``reduction="add"`` for them (it fails at the first run).
    """
    if elem_type not in _NO_SCATTER_ADD:
        return w.op(
            op_type, [zeros(w, shape, elem_type), indices, updates], out, reduction="add", **attrs
        )
    wide = onnx.TensorProto.FLOAT
    summed = w.op(
        op_type, [zeros(w, shape, wide), indices, w.cast(updates, wide)], reduction="add", **attrs
    )
    return w.cast(summed, elem_type, out)


def _product(w: Writer, dims: ir.Value) -> ir.Value:
    """Product of an int64 1-D tensor as ``[1]`` (1 for an empty one)."""
    return w.reduce("ReduceProd", w.concat([w.ints([1]), dims]), [0], keepdims=1)


def gather_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``GatherGrad(shape, indices, dY)``: scatter-add the rows of ``dY`` at ``indices`` along
    ``axis``.

    ``X`` is seen as ``[P, D, Q]`` around ``axis`` and ``dY`` as ``[P, K, Q]`` (``K``:
    the number of indices); with ``axis=0`` ``dY`` scatters as it is.
    """
    ctx.require_opset(node, 16, "ScatterND with reduction='add'")
    shape, indices, dy = inputs(node, 3)
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    axis = node.attributes.get_int("axis", 0)
    index = w.cast(indices, onnx.TensorProto.INT64)
    if axis < 0:
        axis_value = w.op("Add", [w.ints([axis]), w.op("Shape", [shape])])
    else:
        axis_value = w.ints([axis])
    size = w.op(
        "Gather", [shape, w.reshape(axis_value, [])], axis=0
    )  # a scalar: indices keep their shape
    index = w.op(
        "Where", [w.op("Less", [index, w.const(0, "int64")]), w.op("Add", [index, size]), index]
    )
    size = w.reshape(size, [1])
    if axis == 0:
        scatter_add(w, "ScatterND", shape, elem, w.unsqueeze(index, [-1]), dy, outputs(node, 1)[0])
        return w.nodes
    before = _product(w, w.op("Slice", [shape, w.ints([0]), axis_value, w.ints([0])]))
    after = _product(
        w,
        w.op(
            "Slice",
            [shape, w.op("Add", [axis_value, w.ints([1])]), w.ints([INT64_MAX]), w.ints([0])],
        ),
    )
    count = w.reshape(w.op("Size", [index]), [1])
    rows = w.op(
        "Transpose", [w.reshape(dy, w.concat([before, count, after]))], perm=[1, 0, 2]
    )  # [K, P, Q]
    target = w.concat([size, before, after])
    scattered = scatter_add(
        w, "ScatterND", target, elem, w.reshape(index, [-1, 1]), rows
    )  # [D, P, Q]
    w.reshape(w.op("Transpose", [scattered], perm=[1, 0, 2]), shape, outputs(node, 1)[0])
    return w.nodes


def gather_elements_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``GatherElementsGrad(dY, shape, indices) = ScatterElements(zeros(shape), indices, dY,
    reduction="add")``.
    """
    ctx.require_opset(node, 16, "ScatterElements with reduction='add'")
    dy, shape, indices = inputs(node, 3)
    w = ctx.writer(node)
    axis = node.attributes.get_int("axis", 0)
    scatter_add(
        w, "ScatterElements", shape, ctx.float_type(dy), indices, dy, outputs(node, 1)[0], axis=axis
    )
    return w.nodes


def gather_nd_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``GatherNDGrad(shape, indices, dY)`` with ``batch_dims=0``: ``ScatterND(zeros, indices,
    dY, "add")``.
    """
    ctx.require_opset(node, 16, "ScatterND with reduction='add'")
    if node.attributes.get_int("batch_dims", 0) != 0:
        raise unsupported(node, "batch_dims other than 0")
    shape, indices, dy = inputs(node, 3)
    w = ctx.writer(node)
    scatter_add(w, "ScatterND", shape, ctx.float_type(dy), indices, dy, outputs(node, 1)[0])
    return w.nodes


def slice_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``SliceGrad(dY, shape, starts, ends[, axes][, steps])``: ``dY`` written where the slice read,
    zeros elsewhere.

    With unit steps and known axes this is ``Pad(dY)`` by the slice's margins (constants where
    the dims and bounds are, computed otherwise). Otherwise the same ``Slice`` applied to the
    flat positions ``0..size-1`` (in ``shape``) gives the position of every element of ``dY``;
    those int64 positions are twice a float32 input, so that form is kept for the rest.
    """
    dy, shape, starts, ends, axes, steps = inputs(node, 6)
    w = ctx.writer(node)
    pads = _slice_margins(w, ctx, dy, shape, starts, ends, axes, steps)
    if isinstance(pads, list):
        w.pad(dy, pads, outputs(node, 1)[0])
        return w.nodes
    if pads is not None:
        w.op("Pad", [dy, pads], outputs(node, 1)[0])
        return w.nodes
    ctx.require_opset(node, 11, "ScatterND")
    size = w.reduce("ReduceProd", shape, None, keepdims=0)
    positions = w.reshape(w.op("Range", [w.const(np.int64(0)), size, w.const(np.int64(1))]), shape)
    read = w.op(
        "Slice",
        [positions, starts, ends, *([axes] if axes or steps else []), *([steps] if steps else [])],
    )
    flat = zeros(w, w.reshape(size, [1]), ctx.float_type(dy))
    scattered = w.op("ScatterND", [flat, w.reshape(read, [-1, 1]), w.reshape(dy, [-1])])
    w.reshape(scattered, shape, outputs(node, 1)[0])
    return w.nodes


#: Element types whose ``Pad`` every runtime the portable artifacts target has a kernel for.
_PADDABLE = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def _slice_margins(
    w: Writer,
    ctx: LoweringContext,
    dy: ir.Value,
    shape: ir.Value,
    starts: ir.Value,
    ends: ir.Value,
    axes: ir.Value | None,
    steps: ir.Value | None,
) -> list[int] | ir.Value | None:
    """``Pad``'s pads putting a unit-step slice's gradient back in place (a list when all are
    static, an int64 value otherwise), or None when the slice is not one (steps other than 1,
    axes or rank unknown or out of range, opset below 11, a dtype ``Pad`` may lack).

    Per sliced axis of size ``d``, as ``Slice`` reads its bounds: ``s`` and ``e`` with ``d``
    added when negative, clamped to ``[0, d]``; ``s`` zeros before, ``d - s - max(e - s, 0)``
    after. Each is a Python int when its inputs are constants, an int64 ``[1]`` otherwise.
    """
    rank = ctx.rank(dy)
    count = ctx.shape(starts)
    step_values = ctx.constant(steps) if steps is not None else None
    if (
        rank is None
        or ctx.opset < 11
        or ctx.float_type(dy) not in _PADDABLE
        or count is None
        or len(count) != 1
        or count[0] is None
        or (steps is not None and (step_values is None or np.any(step_values != 1)))
    ):
        return None
    axis_values = ctx.constant(axes) if axes is not None else np.arange(count[0])
    if axis_values is None:
        return None
    sliced = [int(a) + rank if a < 0 else int(a) for a in axis_values.reshape(-1)]
    if any(
        not 0 <= a < rank for a in sliced
    ):  # an invalid slice: ONNX Runtime says why at run time
        return None
    source = ctx.shape_source(shape)
    dims = ctx.shape(source) if source is not None else None
    known = ctx.constant(shape)
    if known is not None:
        dims = [int(d) for d in known.reshape(-1)]
    starts_c, ends_c = ctx.constant(starts), ctx.constant(ends)
    before: list[int | ir.Value] = [0] * rank
    after: list[int | ir.Value] = [0] * rank
    for i, axis in enumerate(sliced):
        dim = dims[axis] if dims is not None else None
        start, end = (int(c.reshape(-1)[i]) if c is not None else None for c in (starts_c, ends_c))
        if dim is not None and start is not None and end is not None:
            s, e = _clamp(start, dim), _clamp(end, dim)
            before[axis], after[axis] = s, dim - s - max(e - s, 0)
            continue
        d = w.ints([dim]) if dim is not None else w.op("Gather", [shape, w.ints([axis])], axis=0)
        first = _placed(w, start, starts, i, d)
        placed = _placed(w, end, ends, i, d)
        last = placed if isinstance(placed, ir.Value) else w.ints([placed])
        before[axis] = first
        if isinstance(first, int):  # 0: the slice's length is its end
            after[axis] = w.op("Sub", [d, last])
            continue
        taken = _at_least_zero(w, w.op("Sub", [last, first]))
        after[axis] = w.op("Sub", [w.op("Sub", [d, first]), taken])
    pads = [*before, *after]
    static = [p for p in pads if isinstance(p, int)]
    if len(static) == len(pads):
        return static
    return w.concat([p if isinstance(p, ir.Value) else w.ints([p]) for p in pads])


def _clamp(bound: int, dim: int) -> int:
    """``bound`` (+ ``dim`` when negative) within ``[0, dim]``, as ``Slice`` reads it."""
    return min(max(bound + dim if bound < 0 else bound, 0), dim)


def _placed(
    w: Writer, bound: int | None, bounds: ir.Value, i: int, dim: ir.Value
) -> ir.Value | int:
    """Entry ``i`` of a ``Slice`` bound input (``bound`` when a constant) on an axis of run-time
    size ``dim``, as ``Slice`` reads it: an int64 ``[1]``, or 0 for a start of 0.

    A constant costs a node or three; a run-time bound is read, wrapped and clamped (``Where``
    rather than ``Min``/``Max``: no broadcast arithmetic, the same on every runtime).
    """
    if bound == 0:
        return 0
    if bound is not None and bound >= INT64_MAX // 2:  # "to the end"
        return dim
    if bound is not None and bound > 0:
        limit = w.ints([bound])
        return w.op("Where", [w.op("Less", [dim, limit]), dim, limit])
    if bound is not None:
        return _at_least_zero(w, w.op("Add", [dim, w.ints([bound])]))
    read = w.op("Gather", [w.cast(bounds, onnx.TensorProto.INT64), w.ints([i])], axis=0)
    wrapped = w.op("Where", [w.op("Less", [read, w.ints([0])]), w.op("Add", [read, dim]), read])
    low = _at_least_zero(w, wrapped)
    return w.op("Where", [w.op("Less", [dim, low]), dim, low])


def _at_least_zero(w: Writer, x: ir.Value) -> ir.Value:
    """``max(x, 0)`` of an int64 ``[1]``."""
    zero = w.ints([0])
    return w.op("Where", [w.op("Less", [x, zero]), zero, x])


def concat_training(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``ConcatTraining(x...) -> (Concat(x...), [len(x_i) along axis])``."""
    concat, lengths = outputs(node, 2)
    w = ctx.writer(node)
    axis = node.attributes.get_int("axis", 0)
    parts = [x for x in node.inputs if x is not None]
    w.concat(parts, axis, out=concat)
    if lengths:
        w.concat([w.dim(x, axis) for x in parts], 0, out=lengths)
    return w.nodes


def split_training(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``SplitTraining(x, split) = Split(x, split)`` (``Slice`` s of the running sums before
    opset 13).
    """
    x, split = inputs(node, 2)
    w = ctx.writer(node)
    axis = node.attributes.get_int("axis", 0)
    pieces = outputs(node, len(node.outputs))
    if split is None:
        attrs: dict[str, Any] = {"num_outputs": len(pieces)} if ctx.opset >= 18 else {}
        w.ops("Split", [x], pieces, axis=axis, **attrs)
    elif ctx.opset >= 13:
        w.ops("Split", [x, split], pieces, axis=axis)
    else:
        ends = w.op("CumSum", [split, w.const(np.int64(0))])
        starts = w.op("Sub", [ends, split])
        for i, piece in enumerate(pieces):
            if piece:
                at = w.ints([i])
                begin, end = (
                    w.op("Gather", [starts, at], axis=0),
                    w.op("Gather", [ends, at], axis=0),
                )
                w.op("Slice", [x, begin, end, w.ints([axis])], piece)
    return w.nodes


LOWERINGS = {
    "GatherGrad": gather_grad,
    "GatherElementsGrad": gather_elements_grad,
    "GatherNDGrad": gather_nd_grad,
    "SliceGrad": slice_grad,
    "ConcatTraining": concat_training,
    "SplitTraining": split_training,
}
