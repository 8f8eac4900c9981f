"""Pooling ops whose gradient kernels need static shapes.

ONNX Runtime 1.19.2's CPU ``AveragePoolGrad`` and ``MaxPoolGrad`` take the shape
of the gradient they write from the graph's *static* shape information, not from
the data: a dimension that is symbolic (a dynamic batch, a dynamic image size)
reads as 0, and training crashes the process (``Floating point exception`` for
``AveragePool``, a segmentation fault for ``MaxPool``) or fails with "The shape of
dY and indices does not match".

* ``average_pool_as_conv`` rewrites ``AveragePool`` whose input is not fully
  static, or not float32, into a depthwise ``Conv`` with a constant kernel (and a
  constant divisor map where the window count varies), whose gradient reads
  shapes from the data.
* :func:`check_pool_shapes` raises a :class:`~onnxblocks.errors.GradientError`
  naming any pooling node left whose gradient would crash.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core.errors import GradientError
from onnxblocks.ir.attributes import int_attribute, ints_attribute, string_attribute
from onnxblocks.ir.rewrite import NodeRewrite, NoMatch, RewriteContext, fail, is_default_domain
from onnxblocks.ir.types import infer_proto_types, static_dims


def _window_counts(
    size: int, out: int, kernel: int, stride: int, begin: int, end: int, include_pad: bool
) -> np.ndarray | NoMatch:
    """How many elements each output position of one axis averages, or :func:`fail` where ONNX
    Runtime differs.

    With ``count_include_pad`` the divisor is the window size. A window that
    reaches past the padded input (``ceil_mode``) or that holds no input element is
    left to ONNX Runtime's own kernel, whose results there (the full window size,
    NaN) no exporter relies on.
    """
    counts = np.zeros(out, dtype=np.float64)
    for o in range(out):
        start = o * stride - begin
        if start + kernel > size + end and include_pad:
            return fail("a window reaches past the padded input: ONNX Runtime's divisor differs")
        counts[o] = kernel if include_pad else max(0, min(start + kernel, size) - max(start, 0))
    return counts if counts.all() else fail("a window holds no input element")


class AveragePoolAsConv(NodeRewrite):
    """Rewrite ``AveragePool`` into a depthwise ``Conv`` where ONNX Runtime's AveragePoolGrad would
    fail.

    Rewritten: AveragePool nodes whose input has a symbolic or unknown dimension
    or is not float32, with a static channel count, ``auto_pad`` NOTSET or VALID
    and no dilation. The kernel is ``1/prod(kernel_shape)`` everywhere; where the
    divisor varies (``count_include_pad=0`` with padding, ``ceil_mode=1``) the
    spatial dimensions must be static and the output is multiplied by a constant
    map of ``prod(kernel_shape) / count``. Other nodes are left as they are
    (:func:`check_pool_shapes` names them).
    """

    name = "average_pool_as_conv"
    op_types = frozenset({"AveragePool"})
    min_opset = None

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "AveragePool" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _average_pool(node, ctx)


def _average_pool(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    types = ctx.types
    x, y = node.inputs[0], node.outputs[0].name or "pool"
    shape, elem = types.shape(x), types.elem(x)
    if x is None or shape is None or elem is None:
        return fail("the input's shape or element type is not known")
    if len(shape) < 3 or shape[1] is None:
        return fail("the input has no spatial dims or its channel count is not static")
    if all(d is not None for d in shape) and elem == onnx.TensorProto.FLOAT:
        return fail("the input is static and float32: AveragePoolGrad handles it")
    kernel = ints_attribute(node, "kernel_shape", [])
    n = len(kernel)
    auto_pad = string_attribute(node, "auto_pad", "NOTSET")
    dilated = any(d != 1 for d in ints_attribute(node, "dilations", [1] * n))
    if n != len(shape) - 2:
        return fail("kernel_shape does not match the input's spatial dims")
    if auto_pad not in ("NOTSET", "VALID") or dilated:
        return fail("auto_pad is SAME_* or the pooling is dilated")
    strides = ints_attribute(node, "strides", [1] * n)
    pads = [0] * (2 * n) if auto_pad == "VALID" else ints_attribute(node, "pads", [0] * (2 * n))
    ceil_mode = int_attribute(node, "ceil_mode", 0)
    include_pad = bool(int_attribute(node, "count_include_pad", 0))
    uniform = not ceil_mode and (include_pad or not any(pads))
    conv_pads = list(pads)
    scale = None
    if not uniform:
        out_shape = types.shape(node.outputs[0])
        spatial = static_dims(shape[2:])
        out_spatial = static_dims(out_shape[2:] if out_shape is not None else None)
        if spatial is None or out_spatial is None:
            return fail("the divisor varies and the spatial dims are not static")
        counts = []
        for axis in range(n):
            size, out = spatial[axis], out_spatial[axis]
            begin, end = pads[axis], pads[n + axis]
            count = _window_counts(size, out, kernel[axis], strides[axis], begin, end, include_pad)
            if isinstance(count, NoMatch):
                return count
            counts.append(count)
            # ceil_mode: pad the end so that Conv's floor gives the same number of windows
            needed = (out - 1) * strides[axis] + kernel[axis] - (size + begin + end)
            conv_pads[n + axis] = end + max(0, needed)
        grid = counts[0]
        for more in counts[1:]:
            grid = np.multiply.outer(grid, more)
        scale = math.prod(kernel) / grid
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    w = ctx.writer(y)
    weight = w.op(
        "Expand", [w.const(1.0 / math.prod(kernel), dtype), w.ints([shape[1], 1, *kernel])]
    )
    conv_out = w.op(
        "Conv",
        [x, weight],
        out=y if scale is None else w.fresh("sum"),
        group=shape[1],
        kernel_shape=kernel,
        pads=conv_pads,
        strides=strides,
    )
    if scale is not None:
        w.op("Mul", [conv_out, w.const(scale.astype(dtype), suffix="divisor")], out=y)
    return w.nodes


def check_pool_shapes(forward: onnx.ModelProto, training: onnx.ModelProto) -> None:
    """Raise when ONNX Runtime's pooling gradient would crash on a dynamic dimension.

    ``MaxPoolGrad`` needs static channel and spatial dimensions (the batch may be
    dynamic); ``AveragePoolGrad`` needs every dimension static. Only pooling nodes
    that got a gradient node in ``training`` are checked, and only dimensions known
    to be symbolic count (an unknown shape is left to ONNX Runtime).

    Raises:
        GradientError: naming the node, its input's shape and what to do.
    """
    grads = [n for n in training.graph.node if n.op_type in ("MaxPoolGrad", "AveragePoolGrad")]
    if not grads:
        return
    differentiated = {(n.op_type[: -len("Grad")], n.name.split("_Grad/")[0]) for n in grads}
    unnamed = {op for op, name in differentiated if not name}
    types = infer_proto_types(forward)
    for node in forward.graph.node:
        if (node.op_type, node.name) not in differentiated and node.op_type not in unnamed:
            continue
        t = types.get(node.input[0])
        if (
            t is None
            or t.WhichOneof("value") != "tensor_type"
            or not t.tensor_type.HasField("shape")
        ):
            continue
        dims = list(t.tensor_type.shape.dim)
        label = [
            d.dim_value if d.WhichOneof("value") == "dim_value" else (d.dim_param or "?")
            for d in dims
        ]
        first = 1 if node.op_type == "MaxPool" else 0
        if all(d.WhichOneof("value") == "dim_value" for d in dims[first:]):
            continue
        need = (
            "static channel and spatial dimensions (the batch may be dynamic)"
            if first
            else "static dimensions"
        )
        raise GradientError(
            f"Node '{node.name}' ({node.op_type}) has input '{node.input[0]}' of shape {label}, "
            "but ONNX Runtime's "
            f"{node.op_type}Grad needs {need}: training would crash. Export the model with "
            "static shapes there "
            "(dynamic axes only on the batch dimension), or freeze the parameters before this "
            "node so no "
            "gradient flows through it."
        )
