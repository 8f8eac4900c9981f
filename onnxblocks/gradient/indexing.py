"""Slices with negative steps and non-constant padding as ``Gather``; DepthToSpace as
Reshape/Transpose.

* ``Slice`` with a negative step (``torch.flip``, ``x[::-1]``): ONNX Runtime 1.19.2
  builds a ``SliceGrad`` that fails at run time with ``narrowing_error``.
* ``Pad`` in ``reflect``, ``edge`` or ``wrap`` mode (``F.pad(mode="reflect" |
  "replicate" | "circular")``, ``Conv2d(padding_mode="reflect")``): its gradient
  builder supports constant padding only.

Both select elements by position, which ``Gather`` (whose gradient ONNX Runtime
has on CPU) does with explicit indices: ``[T-1, ..., 0]`` for a flip, the
mirrored, repeated or wrapped border positions for a pad (concatenated around the
input, one axis after the other, as ``numpy.pad`` does). Indices are constants
when the axis length is static, computed from ``Shape`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks.ir.attributes import int_attribute, string_attribute
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
    optional_input,
)
from onnxblocks.ir.types import static_dims
from onnxblocks.ir.writer import Writer


def _axis_length(w: Writer, x: ir.Value, axis: int) -> ir.Value:
    """A scalar int64: the runtime length of ``x`` along ``axis``."""
    return w.squeeze(w.slice(w.op("Shape", [x]), [axis], [axis + 1], [0]), [0])


# ------------------------------------------------------------------ Slice
class NegativeStepSliceAsGather(NodeRewrite):
    """Rewrite each ``Slice`` with constant arguments and a negative step into ``Slice`` (steps >
    0) + ``Gather``.
    """

    name = "negative_step_slice_as_gather"
    op_types = frozenset({"Slice"})

    def select(self, node: ir.Node) -> bool:
        return (
            node.op_type == "Slice"
            and is_default_domain(node)
            and optional_input(node, 4) is not None
        )

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _negative_step_slice(node, ctx)


def _negative_step_slice(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    step_values = ctx.plain_constants.folded(
        node.inputs[4]
    )  # without shapes first: most steps are plain constants
    if step_values is not None and not (step_values < 0).any():
        return fail("no step is negative")
    types, table = ctx.types, ctx.constants
    args = [table.folded(value) for value in node.inputs[1:5]]
    known = [a for a in args if a is not None]
    x = node.inputs[0]
    if x is None:
        return fail("the input is missing")
    if len(known) < len(args):
        return fail("starts, ends, axes or steps is not a constant")
    if not (known[3] < 0).any():
        return fail("no step is negative")
    shape = types.shape(x)
    starts, ends, axes, steps = ([int(v) for v in a.reshape(-1)] for a in known)
    if any(a < 0 for a in axes):
        if shape is None:
            return fail("an axis is negative and the input's rank is not known")
        axes = [a + len(shape) if a < 0 else a for a in axes]
    y = node.outputs[0].name or "slice"
    w = ctx.writer(y)
    kept = [(s, e, a, st) for s, e, a, st in zip(starts, ends, axes, steps, strict=True) if st > 0]
    flipped = [
        (s, e, a, st) for s, e, a, st in zip(starts, ends, axes, steps, strict=True) if st < 0
    ]
    current = x
    if kept:
        kept_starts, kept_ends, kept_axes, kept_steps = (list(v) for v in zip(*kept, strict=True))
        current = w.slice(current, kept_starts, kept_ends, kept_axes, kept_steps)
    for i, (start, end, axis, step) in enumerate(flipped):
        length = shape[axis] if shape is not None else None
        indices = _slice_indices(w, current, axis, length, start, end, step)
        out = y if i == len(flipped) - 1 else None
        current = w.op("Gather", [current, indices], out=out, axis=axis)
    return w.nodes


def _slice_indices(
    w: Writer, x: ir.Value, axis: int, length: int | None, start: int, end: int, step: int
) -> ir.Value:
    """The positions a negative-step slice takes along ``axis`` (ONNX's clamping rules)."""
    if length is not None:
        return w.ints(np.arange(length)[slice(start, end, step)].tolist())
    n = _axis_length(w, x, axis)
    one = w.const(1, np.int64)

    def offset(value: int) -> ir.Value:  # value, or length + value for a negative one
        return w.op("Add", [n, w.const(value, np.int64)]) if value < 0 else w.const(value, np.int64)

    last = w.op("Sub", [n, one])
    first = w.op("Max", [w.op("Min", [offset(max(start, -(2**62))), last]), w.const(0, np.int64)])
    stop = w.op("Max", [w.op("Min", [offset(max(end, -(2**62))), last]), w.const(-1, np.int64)])
    return w.index_range(first, stop, w.const(step, np.int64))


# ------------------------------------------------------------------ Pad
class BorderPadAsGather(NodeRewrite):
    """Rewrite ``Pad`` in reflect, edge or wrap mode (constant, non-negative pads) into
    ``Gather`` + ``Concat``.
    """

    name = "border_pad_as_gather"
    op_types = frozenset({"Pad"})

    def select(self, node: ir.Node) -> bool:
        return (
            node.op_type == "Pad"
            and is_default_domain(node)
            and _mode(node) in ("reflect", "edge", "wrap")
        )

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _border_pad(node, ctx)


def _border_pad(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    types, constants = ctx.types, ctx.constants
    pads = constants.folded(optional_input(node, 1))
    axes_input = optional_input(node, 3)
    axes = constants.folded(axes_input)
    x = node.inputs[0]
    if x is None:
        return fail("the input is missing")
    if pads is None or (axes_input is not None and axes is None):
        return fail("pads or axes is not a constant")
    shape = types.shape(x)
    rank = (
        len(shape) if shape is not None else (len(pads.reshape(-1)) // 2 if axes is None else None)
    )
    if rank is None:
        return fail("axes are given and the input's rank is not known")
    pad_list = [int(p) for p in pads.reshape(-1)]
    axis_list = (
        [int(a) + rank if int(a) < 0 else int(a) for a in axes.reshape(-1)]
        if axes is not None
        else list(range(rank))
    )
    if any(p < 0 for p in pad_list):
        return fail("a pad is negative (a crop)")
    if len(pad_list) != 2 * len(axis_list):
        return fail("pads do not hold two entries per axis")
    y = node.outputs[0].name or "pad"
    w = ctx.writer(y)
    current = x
    todo = [
        (a, pad_list[i], pad_list[len(axis_list) + i])
        for i, a in enumerate(axis_list)
        if pad_list[i] or pad_list[len(axis_list) + i]
    ]
    if not todo:
        w.op("Identity", [current], out=y)
    for i, (axis, before, after) in enumerate(todo):
        length = shape[axis] if shape is not None else None
        parts = []
        if before:
            parts.append(
                w.op(
                    "Gather",
                    [current, _border(w, current, axis, length, _mode(node), before, True)],
                    axis=axis,
                )
            )
        parts.append(current)
        if after:
            parts.append(
                w.op(
                    "Gather",
                    [current, _border(w, current, axis, length, _mode(node), after, False)],
                    axis=axis,
                )
            )
        out = y if i == len(todo) - 1 else None
        current = w.op("Concat", parts, out=out, axis=axis)
    return w.nodes


def _mode(node: ir.Node) -> str:
    return string_attribute(node, "mode", "constant")


def _border(
    w: Writer, x: ir.Value, axis: int, length: int | None, mode: str, count: int, before: bool
) -> ir.Value:
    """Indices of the ``count`` border elements before (or after) ``x`` along ``axis``, in output
    order.
    """
    # positions relative to the start (non-negative) or to the end (negative: -1 is the last
    # element)
    if mode == "reflect":
        relative = list(range(count, 0, -1)) if before else [-2 - k for k in range(count)]
    elif mode == "edge":
        relative = [0] * count if before else [-1] * count
    else:  # wrap
        relative = list(range(-count, 0)) if before else list(range(count))
    if length is not None:
        return w.ints([r % length if r < 0 else r for r in relative])
    if all(r >= 0 for r in relative):
        return w.ints(relative)
    return w.op("Add", [w.ints(relative), _axis_length(w, x, axis)])  # all negative here


# ------------------------------------------------------------------ DepthToSpace / SpaceToDepth
class DepthToSpaceAsReshape(NodeRewrite):
    """Rewrite ``DepthToSpace`` / ``SpaceToDepth`` with static C, H, W into ``Reshape`` /
    ``Transpose`` / ``Reshape``.

    Neither has a gradient builder (``nn.PixelShuffle``, ``nn.PixelUnshuffle``); the
    rearrangement is the ONNX definition's (DCR and CRD modes).
    """

    name = "depth_to_space_as_reshape"
    op_types = frozenset({"DepthToSpace", "SpaceToDepth"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type in ("DepthToSpace", "SpaceToDepth") and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _depth_to_space(node, ctx)


def _depth_to_space(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    x = node.inputs[0]
    shape = ctx.types.shape(x)
    chw = static_dims(shape[1:]) if shape is not None and len(shape) == 4 else None
    if x is None or chw is None:
        return fail("the input is not 4-D with static C, H and W")
    c, h, wd = chw
    b = int_attribute(node, "blocksize")
    y = node.outputs[0].name or "depth_to_space"
    w = ctx.writer(y)
    if node.op_type == "DepthToSpace":
        if c % (b * b):
            return fail("the channel count is not divisible by blocksize squared")
        crd = _mode_of(node) == "CRD"
        split = [0, c // (b * b), b, b, h, wd] if crd else [0, b, b, c // (b * b), h, wd]
        perm = [0, 1, 4, 2, 5, 3] if crd else [0, 3, 4, 1, 5, 2]
        final = [0, c // (b * b), h * b, wd * b]
    else:
        if h % b or wd % b:
            return fail("H or W is not divisible by blocksize")
        split, perm, final = (
            [0, c, h // b, b, wd // b, b],
            [0, 3, 5, 1, 2, 4],
            [0, c * b * b, h // b, wd // b],
        )
    moved = w.op("Transpose", [w.op("Reshape", [x, w.ints(split)])], perm=perm)
    w.op("Reshape", [moved, w.ints(final)], out=y)
    return w.nodes


def _mode_of(node: ir.Node) -> str:
    return string_attribute(node, "mode", "DCR")
