"""Resize as a product with constant interpolation matrices: ONNX Runtime 1.19.2 has no CPU
``ResizeGrad``.

``F.interpolate`` and ``nn.Upsample`` export as ``Resize``; ONNX Runtime builds a
``ResizeGrad`` node for it, which its CPU build cannot run. Every Resize mode
(nearest, linear, cubic, with any coordinate transformation) is separable: along
each resized axis the output is a fixed linear map ``M`` (``out x in``) of the
input. With static input and output lengths, ``resize_as_matmul`` computes
``M`` once, by running ONNX Runtime's own Resize on an identity matrix with the
node's attributes (so the values are exactly ONNX Runtime's), and applies it with
``MatMul``. Where ``M`` only repeats elements (nearest with an integer factor), the
cheaper ``Unsqueeze`` / ``Expand`` / ``Reshape`` repeats them instead.

Two exceptions. ``sizes`` computed at run time from the input's shape (the dynamo
exporter's ``F.interpolate(size=...)`` with a dynamic batch) are read off the inferred
shapes: the resized axes need static lengths. And for the dynamo exporter's
``aten.upsample_nearest{1,2,3}d`` (its metadata names the call), ``M`` is torch's:
ATen picks the source index in float32 as ``floor(i * scale)``, ONNX Runtime as
``floor(i / (out / in))``, and the two differ where the product is near an integer
(e.g. 14 -> 16). The torchscript exporter records no call: its nodes keep ONNX
Runtime's values, and differ from torch there in the forward pass too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks.ir import attributes
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
    optional_input,
)
from onnxblocks.ir.types import ValueTypes, static_dims
from onnxblocks.ir.writer import Writer

#: The dynamo exporter's record of the aten call a node comes from.
_FX_NODE = "pkg.torch.onnx.fx_node"
#: ``aten.upsample_nearest{1,2,3}d.vec(input, output_size, scale_factors)`` in that record.
_TORCH_NEAREST = re.compile(
    r"target=torch\.ops\.aten\.upsample_nearest([123])d\.vec\]\(args = \(%[^,]+, "
    r"(None|\[[^\]]*\]), (None|\[[^\]]*\])\)"
)
_SEPARABLE_ATTRIBUTES = (
    "mode",
    "coordinate_transformation_mode",
    "nearest_mode",
    "cubic_coeff_a",
    "exclude_outside",
    "extrapolation_value",
    "antialias",
)


class ResizeAsMatMul(NodeRewrite):
    """Rewrite ``Resize`` with static shapes and constant scales/sizes into ``MatMul`` s (or
    repeats).

    Left as they are: nodes whose input or output shape is not static, whose
    ``roi``/``scales``/``sizes`` are not constants, or with ``keep_aspect_ratio_policy``
    other than ``stretch``.
    """

    name = "resize_as_matmul"
    op_types = frozenset({"Resize"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "Resize" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _rewrite(node, ctx)


def _argument(
    node: ir.Node, constants: ConstantTable, index: int
) -> tuple[bool, np.ndarray | None]:
    """(known, value) of an optional constant input: (True, None) when absent."""
    argument = optional_input(node, index)
    if argument is None:
        return True, None
    value = constants.folded(argument)
    if value is None:
        return False, None
    return True, value if value.size else None


def _rewrite(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    types, constants, opset = ctx.types, ctx.constants, ctx.opset
    x, y = node.inputs[0], node.outputs[0].name or "resize"
    in_shape, elem = types.shape(x), types.elem(x)
    if x is None or in_shape is None or elem is None:
        return fail("the input's shape or element type is not known")
    if attributes.string_attribute(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return fail("keep_aspect_ratio_policy is not stretch")
    known = [_argument(node, constants, i) for i in (1, 2, 3)]
    rank = len(in_shape)
    listed = attributes.ints_attribute(node, "axes", None)
    axes = [a + rank if a < 0 else a for a in listed] if listed is not None else list(range(rank))
    roi, scales, given = (v for _, v in known)
    sizes: np.ndarray | list[int | None] | None = given
    if known[0][0] and known[1][0] and not known[2][0] and scales is None:
        # sizes computed at run time (the dynamo exporter's Concat(Shape(x)[:2], size) for a dynamic
        # batch)
        computed = _sizes_from_shapes(types, x, node.outputs[0], axes)
        if isinstance(computed, NoMatch):
            return computed
        sizes = computed
    elif not all(k for k, _ in known):
        return fail("roi, scales or sizes is not a constant")
    if scales is None and sizes is None:
        return fail("neither scales nor sizes is given")
    factors = _torch_nearest_factors(node, rank)
    # (input, output) length of each resized axis: floor(in * scale), or the size (ONNX's
    # definition)
    resized: dict[int, tuple[int, int]] = {}
    for position, axis in enumerate(axes):
        size = in_shape[axis]
        if sizes is not None:
            length = sizes[position]
            if length is None or size == int(length):
                continue
            out = int(length)
        else:
            assert scales is not None  # one of scales and sizes is given (checked above)
            if float(scales[position]) == 1.0:
                continue
            if size is None:
                return fail(f"axis {axis} is resized and its input length is not static")
            # torch's own factor where known: the float32 scale can floor one lower (25 * 0.12)
            factor = (factors or {}).get(axis) or float(scales[position])
            out = int(np.floor(size * factor))
        if size is None:
            return fail(f"axis {axis} is resized and its input length is not static")
        resized[axis] = (size, out)
    attrs = {k: attributes.value(node, k) for k in node.attributes if k in _SEPARABLE_ATTRIBUTES}
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    w = ctx.writer(y)
    current, shape = x, list(in_shape)
    for i, (axis, (size, out_size)) in enumerate(resized.items()):
        position = axes.index(axis)
        scale = float(scales[position]) if scales is not None else None
        region = (
            (float(roi[position]), float(roi[len(axes) + position])) if roi is not None else None
        )
        if factors is not None:
            matrix = _torch_nearest_matrix(size, out_size, factors.get(axis, scale))
        else:
            matrix = _interpolation_matrix(size, out_size, scale, region, attrs, opset)
        output = y if i == len(resized) - 1 else None
        current = _apply(w, current, axis, shape, matrix.astype(dtype), output)
        shape[axis] = out_size
    if not resized:
        w.op("Identity", [x], out=y)
    return w.nodes


def _torch_nearest_factors(node: ir.Node, rank: int) -> dict[int, float | None] | None:
    """The scale factor per spatial axis that the dynamo exporter's
    ``aten.upsample_nearest{1,2,3}d`` got.

    None for any other node. The factors are read from the exporter's record of the call
    (None for an axis resized to a size); torch computes with the double it was given,
    which the float32 ``scales`` input rounds. Empty when the record does not parse:
    the ``scales`` input then stands in.
    """
    record = node.metadata_props.get(_FX_NODE, "")
    if "target=torch.ops.aten.upsample_nearest" not in record or "exact" in record:
        return None
    expected = {
        "mode": "nearest",
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
    }
    defaults = {
        "mode": "nearest",
        "coordinate_transformation_mode": "half_pixel",
        "nearest_mode": "round_prefer_floor",
    }
    if any(attributes.string_attribute(node, k, defaults[k]) != v for k, v in expected.items()):
        return None
    match = _TORCH_NEAREST.search(record)
    if match is None:
        return {}
    spatial, listed = int(match.group(1)), match.group(3)
    if listed == "None":
        return dict.fromkeys(range(rank - spatial, rank))
    factors = [float(v) for v in listed.strip("[]").split(",")]
    return (
        dict(zip(range(rank - spatial, rank), factors, strict=True))
        if len(factors) == spatial
        else {}
    )


def _torch_nearest_matrix(size: int, out: int, factor: float | None) -> np.ndarray:
    """``M`` of torch's ``upsample_nearest``: output ``i`` reads ``min(floor(i * scale), size -
    1)``.

    ``scale`` is ``1 / factor`` for a scale factor, else ``size / out``; ATen computes it
    and the product in float32, which decides the index where ``i * scale`` is near an
    integer (ONNX Runtime's ``i / (out / size)`` can land on the other side there).
    """
    scale = np.float32(1.0 / factor) if factor else np.float32(size) / np.float32(out)
    source = np.minimum(
        np.floor(np.arange(out, dtype=np.float32) * scale).astype(np.int64), size - 1
    )
    matrix = np.zeros((out, size), np.float32)
    matrix[np.arange(out), source] = 1.0
    return matrix


def _sizes_from_shapes(
    types: ValueTypes, x: ir.Value, y: ir.Value, axes: list[int]
) -> list[int | None] | NoMatch:
    """The output length of each axis of ``axes`` from the inferred shapes (None: the input's), or
    :func:`fail` when they do not give it.

    An axis whose input and output dims are one symbol keeps its length; the others
    need both lengths static.
    """
    before, after = types.dims(x), types.dims(y)
    if before is None or after is None or len(before) != len(after):
        return fail("sizes are computed at run time and the input's or output's rank is not known")
    sizes: list[int | None] = []
    for axis in axes:
        old, new = before[axis], after[axis]
        if old is not None and old == new:
            sizes.append(None)
        elif isinstance(old, int) and isinstance(new, int):
            sizes.append(new)
        else:
            return fail(f"sizes are computed at run time and axis {axis}'s lengths are not static")
    return sizes


def _interpolation_matrix(
    size: int,
    out: int,
    scale: float | None,
    region: tuple[float, float] | None,
    attrs: dict,
    opset: int,
) -> np.ndarray:
    """``M`` (``out x size``) with ``resize(v) = M @ v`` along one axis, computed by ONNX
    Runtime's Resize.
    """
    from onnxblocks._core.ort import onnxruntime

    ort = onnxruntime()
    inputs = ["x", "roi", "scales", "sizes"]
    inits = [
        onnx.numpy_helper.from_array(
            np.array([0, region[0], 1, region[1]] if region else [], np.float32), "roi"
        )
    ]
    if scale is not None:
        inits += [onnx.numpy_helper.from_array(np.array([1.0, scale], np.float32), "scales")]
        inputs = inputs[:3]
    else:
        inits += [
            onnx.numpy_helper.from_array(np.array([], np.float32), "scales"),
            onnx.numpy_helper.from_array(np.array([size, out], np.int64), "sizes"),
        ]
    probe = helper.make_model(
        helper.make_graph(
            [helper.make_node("Resize", inputs, ["y"], **attrs)],
            "probe",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [size, size])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            inits,
        ),
        opset_imports=[helper.make_opsetid("", max(opset, 13))],
    )
    _limits.stamp_versions(probe)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (result,) = session.run(None, {"x": np.eye(size, dtype=np.float32)})
    return np.asarray(result).T  # row k of the input (a unit vector) gives column k of M


def _repeats(matrix: np.ndarray) -> int | None:
    """The factor ``r`` when ``M`` repeats each element ``r`` times in order, else None."""
    out, size = matrix.shape
    if out % size:
        return None
    factor = out // size
    expected = np.repeat(np.eye(size), factor, axis=0)
    return factor if np.array_equal(matrix, expected) else None


def _apply(
    w: Writer, x: ir.Value, axis: int, shape: list[int | None], matrix: np.ndarray, out: str | None
) -> ir.Value:
    """``M`` applied along ``axis`` of ``x`` (of ``shape``)."""
    rank = len(shape)
    factor = _repeats(matrix)
    trailing = static_dims(shape[axis + 1 :])
    if factor is not None and trailing is not None:
        # nearest, integer factor: [..., n, ...] -> [..., n, r, ...] -> [..., n*r, ...]
        expanded = w.op(
            "Expand",
            [
                w.unsqueeze(x, [axis + 1]),
                w.ints([1] * (axis + 1) + [factor] + [1] * (rank - axis - 1)),
            ],
        )
        target = [0] * axis + [-1] + trailing  # 0 copies a leading dim (a dynamic batch)
        return w.op("Reshape", [expanded, w.ints(target)], out=out)
    if axis == rank - 1:
        return w.op(
            "MatMul", [x, w.const(np.ascontiguousarray(matrix.T), suffix="interpolation")], out=out
        )
    if axis == rank - 2:
        return w.op("MatMul", [w.const(matrix, suffix="interpolation"), x], out=out)
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = w.op("Transpose", [x], perm=perm)
    product = w.op(
        "MatMul", [moved, w.const(np.ascontiguousarray(matrix.T), suffix="interpolation")]
    )
    inverse = [perm.index(a) for a in range(rank)]
    return w.op("Transpose", [product], out=out, perm=inverse)
