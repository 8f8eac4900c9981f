"""Slices with negative steps and non-constant padding as ``Gather``; DepthToSpace as Reshape/Transpose.

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

import numpy as np
import onnx

from onnxblocks.gradient import _graph


def _axis_length(w: _graph.NodeWriter, x: str, axis: int) -> str:
    """A scalar int64: the runtime length of ``x`` along ``axis``."""
    return w.squeeze(w.slice(w.op("Shape", [x]), [axis], [axis + 1], [0]), [0])


# ------------------------------------------------------------------ Slice
def negative_step_slice_as_gather(model: onnx.ModelProto) -> int:
    """Rewrite each ``Slice`` with constant arguments and a negative step into ``Slice`` (positive steps) + ``Gather``.

    Returns:
        The number of nodes rewritten.
    """
    return _graph.rewrite_nodes(
        model,
        lambda n: n.op_type == "Slice" and _graph.is_default_domain(n) and len(n.input) > 4 and n.input[4],
        _negative_step_slice,
    )


def _negative_step_slice(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    step_values = ctx.plain_constants.folded(node.input[4])  # without shapes first: most steps are plain constants
    if step_values is not None and not (step_values < 0).any():
        return None
    types, table = ctx.types, ctx.constants
    args = [table.folded(name) for name in node.input[1:5]]
    known = [a for a in args if a is not None]
    if len(known) < len(args) or not (known[3] < 0).any():
        return None
    shape = _graph.shape_of(types, node.input[0])
    starts, ends, axes, steps = ([int(v) for v in a.reshape(-1)] for a in known)
    if any(a < 0 for a in axes):
        if shape is None:
            return None
        axes = [a + len(shape) if a < 0 else a for a in axes]
    w = ctx.writer(node.output[0])
    kept = [(s, e, a, st) for s, e, a, st in zip(starts, ends, axes, steps, strict=True) if st > 0]
    flipped = [(s, e, a, st) for s, e, a, st in zip(starts, ends, axes, steps, strict=True) if st < 0]
    current = node.input[0]
    if kept:
        kept_starts, kept_ends, kept_axes, kept_steps = (list(v) for v in zip(*kept, strict=True))
        current = w.slice(current, kept_starts, kept_ends, kept_axes, kept_steps)
    for i, (start, end, axis, step) in enumerate(flipped):
        length = shape[axis] if shape is not None else None
        indices = _slice_indices(w, current, axis, length, start, end, step)
        out = node.output[0] if i == len(flipped) - 1 else None
        current = w.op("Gather", [current, indices], out=out, axis=axis)
    return w.nodes


def _slice_indices(w: _graph.NodeWriter, x: str, axis: int, length: int | None, start: int, end: int, step: int) -> str:
    """The positions a negative-step slice takes along ``axis`` (ONNX's clamping rules)."""
    if length is not None:
        return w.ints(np.arange(length)[slice(start, end, step)].tolist())
    n = _axis_length(w, x, axis)
    one = w.const(1, np.int64)

    def offset(value: int) -> str:  # value, or length + value for a negative one
        return w.op("Add", [n, w.const(value, np.int64)]) if value < 0 else w.const(value, np.int64)

    last = w.op("Sub", [n, one])
    first = w.op("Max", [w.op("Min", [offset(max(start, -(2**62))), last]), w.const(0, np.int64)])
    stop = w.op("Max", [w.op("Min", [offset(max(end, -(2**62))), last]), w.const(-1, np.int64)])
    return w.index_range(first, stop, w.const(step, np.int64))


# ------------------------------------------------------------------ Pad
def border_pad_as_gather(model: onnx.ModelProto) -> int:
    """Rewrite ``Pad`` in reflect, edge or wrap mode (constant, non-negative pads) into ``Gather`` + ``Concat``.

    Returns:
        The number of nodes rewritten.
    """
    return _graph.rewrite_nodes(
        model,
        lambda n: n.op_type == "Pad" and _graph.is_default_domain(n) and _mode(n) in ("reflect", "edge", "wrap"),
        _border_pad,
    )


def _border_pad(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    types, constants, names, opset = ctx.types, ctx.constants, ctx.names, ctx.opset
    pads = constants.folded(node.input[1]) if len(node.input) > 1 else None
    axes = constants.folded(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    if pads is None or (len(node.input) > 3 and node.input[3] and axes is None):
        return None
    shape = _graph.shape_of(types, node.input[0])
    rank = len(shape) if shape is not None else (len(pads.reshape(-1)) // 2 if axes is None else None)
    if rank is None:
        return None
    pad_list = [int(p) for p in pads.reshape(-1)]
    axis_list = (
        [int(a) + rank if int(a) < 0 else int(a) for a in axes.reshape(-1)] if axes is not None else list(range(rank))
    )
    if any(p < 0 for p in pad_list) or len(pad_list) != 2 * len(axis_list):
        return None
    w = _graph.NodeWriter(names, opset, node.output[0])
    current = node.input[0]
    todo = [
        (a, pad_list[i], pad_list[len(axis_list) + i])
        for i, a in enumerate(axis_list)
        if pad_list[i] or pad_list[len(axis_list) + i]
    ]
    if not todo:
        w.op("Identity", [current], out=node.output[0])
    for i, (axis, before, after) in enumerate(todo):
        length = shape[axis] if shape is not None else None
        parts = []
        if before:
            parts.append(
                w.op("Gather", [current, _border(w, current, axis, length, _mode(node), before, True)], axis=axis)
            )
        parts.append(current)
        if after:
            parts.append(
                w.op("Gather", [current, _border(w, current, axis, length, _mode(node), after, False)], axis=axis)
            )
        out = node.output[0] if i == len(todo) - 1 else None
        current = w.op("Concat", parts, out=out, axis=axis)
    return w.nodes


def _mode(node: onnx.NodeProto) -> str:
    return _graph.string_attribute(node, "mode", "constant")


def _border(w: _graph.NodeWriter, x: str, axis: int, length: int | None, mode: str, count: int, before: bool) -> str:
    """Indices of the ``count`` border elements before (or after) ``x`` along ``axis``, in output order."""
    # positions relative to the start (non-negative) or to the end (negative: -1 is the last element)
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
def depth_to_space_as_reshape(model: onnx.ModelProto) -> int:
    """Rewrite ``DepthToSpace`` / ``SpaceToDepth`` with static C, H, W into ``Reshape`` / ``Transpose`` / ``Reshape``.

    Neither has a gradient builder (``nn.PixelShuffle``, ``nn.PixelUnshuffle``); the
    rearrangement is the ONNX definition's (DCR and CRD modes).

    Returns:
        The number of nodes rewritten.
    """
    kinds = ("DepthToSpace", "SpaceToDepth")
    return _graph.rewrite_nodes(model, lambda n: n.op_type in kinds and _graph.is_default_domain(n), _depth_to_space)


def _depth_to_space(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    types, names, opset = ctx.types, ctx.names, ctx.opset
    shape = _graph.shape_of(types, node.input[0])
    chw = _graph.static_dims(shape[1:]) if shape is not None and len(shape) == 4 else None
    if chw is None:
        return None
    c, h, wd = chw
    b = _graph.int_attribute(node, "blocksize")
    w = _graph.NodeWriter(names, opset, node.output[0])
    if node.op_type == "DepthToSpace":
        if c % (b * b):
            return None
        crd = _mode_of(node) == "CRD"
        split = [0, c // (b * b), b, b, h, wd] if crd else [0, b, b, c // (b * b), h, wd]
        perm = [0, 1, 4, 2, 5, 3] if crd else [0, 3, 4, 1, 5, 2]
        final = [0, c // (b * b), h * b, wd * b]
    else:
        if h % b or wd % b:
            return None
        split, perm, final = [0, c, h // b, b, wd // b, b], [0, 3, 5, 1, 2, 4], [0, c * b * b, h // b, wd // b]
    moved = w.op("Transpose", [w.op("Reshape", [node.input[0], w.ints(split)])], perm=perm)
    w.op("Reshape", [moved, w.ints(final)], out=node.output[0])
    return w.nodes


def _mode_of(node: onnx.NodeProto) -> str:
    return _graph.string_attribute(node, "mode", "DCR")
