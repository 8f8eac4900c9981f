"""Convolution and pooling gradients: ``ConvGrad``, ``MaxPoolGrad``, ``AveragePoolGrad``.

* ``dX`` of a convolution is the transposed convolution of ``dY`` with the same
  weights; it is cut or zero-padded at the end of each spatial axis to ``X``'s
  size (the input positions no window reached get no gradient).
* ``dW`` is itself a convolution: the batch becomes the channels, ``X`` (as
  ``[C_in/group, group*N, ...]``) is convolved with ``dY`` (as ``[C_out, N, ...]``,
  the kernel) with the forward stride as dilation and the dilation as stride.
* ``MaxPoolGrad`` scatters ``dY`` to the positions in ``Indices`` (flat over ``X``,
  as ONNX's ``MaxPool`` returns them), adding where windows overlap.
* ``AveragePoolGrad`` is the transposed convolution of ``dY / window size`` with
  a kernel of ones, per channel.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.ir.types import has_type
from onnxblocks.portable.indexing import zeros
from onnxblocks.portable.lowering_context import (
    GRADIENT_OF,
    LoweringContext,
    Writer,
    inputs,
    name_of,
    outputs,
    unsupported,
)


def _ints(node: ir.Node, name: str, default: list[int] | None) -> list[int] | None:
    values = node.attributes.get_ints(name, None)
    return list(values) if values is not None else default


class _Window:
    """The window attributes of a Conv or pool node, with ONNX's defaults for ``spatial`` axes."""

    def __init__(
        self,
        node: ir.Node,
        spatial: int,
        padding: bool = True,
        kernel: list[int | None] | None = None,
        sizes: list[int | None] | None = None,
    ) -> None:
        """``kernel`` / ``sizes``: the static kernel and input spatial dims when known
        (``auto_pad=SAME_*``).
        """
        self.spatial = spatial
        self.kernel = _ints(node, "kernel_shape", None)
        self.strides: list[int] = _ints(node, "strides", None) or [1] * spatial
        self.dilations: list[int] = _ints(node, "dilations", None) or [1] * spatial
        self.pads: list[int] = _ints(node, "pads", None) or [0] * (2 * spatial)
        if not padding:  # the caller reads only the kernel, strides and dilations
            return
        auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
        if auto_pad == "VALID":
            self.pads = [0] * (2 * spatial)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            known: list[int | None] | None = list(self.kernel) if self.kernel else kernel
            self.pads = self._same(node, auto_pad, known, sizes)
        elif auto_pad not in ("NOTSET", ""):
            raise unsupported(
                node, f"auto_pad={auto_pad!r} with strides {self.strides} or no kernel_shape"
            )
        if node.attributes.get_int("ceil_mode", 0):
            raise unsupported(node, "ceil_mode=1")

    def _same(
        self,
        node: ir.Node,
        auto_pad: str,
        kernel: list[int | None] | None,
        sizes: list[int | None] | None,
    ) -> list[int]:
        """Explicit pads of ``auto_pad=SAME_*``.

        ``ceil(size / stride)`` outputs, the odd pad at the end (UPPER) or the start (LOWER). With
        stride 1
        the total is ``(kernel - 1) * dilation`` whatever the size; other strides need the static
        size.
        """
        if kernel is None or any(k is None for k in kernel):
            raise unsupported(node, f"auto_pad={auto_pad!r} with a kernel of unknown size")
        begin, end = [], []
        for axis, (k, s, d) in enumerate(zip(kernel, self.strides, self.dilations, strict=True)):
            assert k is not None
            reach = (k - 1) * d + 1
            if s == 1:
                total = reach - 1
            else:
                size = sizes[axis] if sizes is not None and axis < len(sizes) else None
                if size is None:
                    raise unsupported(
                        node,
                        f"auto_pad={auto_pad!r} with stride {s} over a dim known only at run time",
                    )
                total = max(0, (-(-size // s) - 1) * s + reach - size)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return begin + end


def _spatial_rank(node: ir.Node, ctx: LoweringContext, weight: ir.Value | None = None) -> int:
    for name in ("kernel_shape", "strides", "dilations"):
        values = _ints(node, name, None)
        if values:
            return len(values)
    if weight is not None and ctx.rank(weight) is not None:
        return ctx.require_rank(node, weight) - 2
    raise unsupported(node, "a window without kernel_shape on an input of unknown rank")


def _fit_to(w: Writer, y: ir.Value, like: ir.Value, spatial: int, out: str | ir.Value) -> None:
    """Cut ``y`` to ``like``'s spatial size, then zero-pad its ends up to it (``y``: ``[N, C,
    ...]``).
    """
    target = w.shape(like, 2)
    axes = w.ints(list(range(2, 2 + spatial)))
    cut = w.op("Slice", [y, w.ints([0] * spatial), target, axes])
    missing = w.op("Sub", [target, w.shape(cut, 2)])
    pads = w.concat([w.ints([0] * (2 + spatial + 2)), missing])
    w.op("Pad", [cut, pads], out)


def _transposed(
    w: Writer,
    dy: ir.Value | None,
    weight: ir.Value | None,
    window: _Window,
    group: int = 1,
    out: str | ir.Value | None = None,
) -> ir.Value:
    """``ConvTranspose(dy, weight)`` with the window's strides, dilations and leading pads only."""
    begin = window.pads[: window.spatial]
    return w.op(
        "ConvTranspose",
        [dy, weight],
        out,
        group=group,
        strides=window.strides,
        dilations=window.dilations,
        pads=begin + [0] * window.spatial,
    )


def _transposed_into(
    ctx: LoweringContext,
    w: Writer,
    dy: ir.Value | None,
    weight: ir.Value | None,
    x: ir.Value | None,
    window: _Window,
    group: int,
    out: str | ir.Value,
) -> None:
    """``out = _fit_to(_transposed(dy, weight), x)``, with the cut and the pad written only where
    needed.

    When the spatial sizes of ``dY``, ``X`` and the kernel are static (a dynamic batch leaves them
    so), the
    transposed convolution's size is known: it is written straight to ``out`` when it is ``X``'s
    (each
    ``Slice`` and ``Pad`` copies the whole gradient), else cut or padded by constants.
    """
    spatial = window.spatial
    dy_dims, x_dims, w_dims = ctx.shape(dy), ctx.shape(x), ctx.shape(weight)
    kernel = window.kernel or (w_dims[2:] if w_dims is not None else None)
    sizes = [dy_dims[2:] if dy_dims else None, x_dims[2:] if x_dims else None, kernel]
    if any(v is None or len(v) != spatial or any(d is None for d in v) for v in sizes):
        # sizes known only at run time: the transposed size is X's plus the end pad, less what the
        # stride's
        # floor dropped (at most stride - 1), so the attributes tell when a cut alone, or nothing,
        # fits it
        assert x is not None
        end = window.pads[spatial:]
        if not any(end) and all(s == 1 for s in window.strides):
            _transposed(w, dy, weight, window, group, out)
        elif all(e >= s - 1 for e, s in zip(end, window.strides, strict=True)):
            y = _transposed(w, dy, weight, window, group)
            w.op(
                "Slice",
                [y, w.ints([0] * spatial), w.shape(x, 2), w.ints(list(range(2, 2 + spatial)))],
                out,
            )
        else:
            _fit_to(w, _transposed(w, dy, weight, window, group), x, spatial, out)
        return
    begin = window.pads[:spatial]
    dy_sizes, x_sizes, k_sizes = ([int(d or 0) for d in v or []] for v in sizes)
    have = [
        s * (n - 1) + (k - 1) * d + 1 - b
        for n, k, s, d, b in zip(
            dy_sizes, k_sizes, window.strides, window.dilations, begin, strict=True
        )
    ]
    want = x_sizes
    cut = [min(h, x) for h, x in zip(have, want, strict=True)]
    missing = [x - c for x, c in zip(want, cut, strict=True)]
    if cut == have and not any(missing):
        _transposed(w, dy, weight, window, group, out)
        return
    y = _transposed(w, dy, weight, window, group)
    if cut != have:
        y = w.slice(
            y, [0] * spatial, cut, list(range(2, 2 + spatial)), out=None if any(missing) else out
        )
    if any(missing):
        w.op("Pad", [y, w.ints([0] * (2 + spatial + 2) + missing)], out)


def conv_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``ConvGrad(dY, X, W) -> dX, dW, dB`` (see the module docs)."""
    dy, x, weight = inputs(node, 3)
    dx, dw, db = outputs(node, 3)
    spatial = _spatial_rank(node, ctx, weight)
    weight_dims, x_dims = ctx.shape(weight), ctx.shape(x)
    window = _Window(
        node,
        spatial,
        kernel=weight_dims[2:] if weight_dims is not None else None,
        sizes=x_dims[2:] if x_dims is not None else None,
    )
    group = node.attributes.get_int("group", 1)
    w = ctx.writer(node)
    rest = list(range(3, 3 + spatial))
    if db:
        w.reduce("ReduceSum", w.reshape(dy, [0, 0, -1]), [0, 2], keepdims=0, out=db)
    if dx:
        _transposed_into(ctx, w, dy, weight, x, window, group, dx)
    if dw:
        x_shape, dy_shape = w.shape(x), w.shape(dy)
        batch = w.op("Gather", [x_shape, w.ints([0])], axis=0)
        per_group = w.dim(weight, 1)
        groups = w.ints([group])
        # X [N, Cin, S] -> [N, g, Cin/g, S] -> [Cin/g, g, N, S] -> [Cin/g, g*N, S]
        x5 = w.reshape(x, w.concat([batch, groups, per_group, w.shape(x, 2)]))
        xt = w.op("Transpose", [x5], perm=[2, 1, 0, *rest])
        xt = w.reshape(xt, w.concat([per_group, w.op("Mul", [groups, batch]), w.shape(x, 2)]))
        # dY [N, Cout, O] -> [N, g, Cout/g, O] -> [g, Cout/g, N, O] -> [Cout, N, O]
        dy5 = w.reshape(dy, w.concat([batch, groups, w.ints([-1]), w.shape(dy, 2)]))
        dyt = w.op("Transpose", [dy5], perm=[1, 2, 0, *rest])
        dyt = w.reshape(
            dyt, w.concat([w.op("Gather", [dy_shape, w.ints([1])], axis=0), batch, w.shape(dy, 2)])
        )
        full = w.op(
            "Conv",
            [xt, dyt],
            group=group,
            strides=window.dilations,
            dilations=window.strides,
            pads=window.pads,
        )  # [Cin/g, Cout, K']
        kernel = w.ints(window.kernel) if window.kernel else w.shape(weight, 2)
        cut = w.op(
            "Slice", [full, w.ints([0] * spatial), kernel, w.ints(list(range(2, 2 + spatial)))]
        )
        w.op("Transpose", [cut], dw, perm=[1, 0, *range(2, 2 + spatial)])
    return w.nodes


def max_pool_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``MaxPoolGrad(dY, Indices)``: ``dY`` scatter-added at the flat ``Indices`` into zeros of
    ``X``'s shape.
    """
    dy, indices = inputs(node, 2)
    pool = ctx.producer(indices)
    if pool is None or pool.op_type != "MaxPool" or list(pool.outputs[1:2]) != [indices]:
        raise unsupported(
            node, f"Indices '{name_of(indices)}' that are not the second output of a MaxPool node"
        )
    if pool.attributes.get_int("storage_order", 0):
        raise unsupported(node, "MaxPool storage_order=1")
    x = pool.inputs[0]
    if x is None:
        raise unsupported(node, "a MaxPool without an input")
    window = _Window(pool, _spatial_rank(pool, ctx), padding=False)
    kernel = window.kernel or []
    overlapping = not kernel or any(
        s < (k - 1) * d + 1
        for s, k, d in zip(window.strides, kernel, window.dilations, strict=False)
    )
    w = ctx.writer(node)
    flat = zeros(w, w.reshape(w.op("Size", [x]), [1]), ctx.float_type(dy))
    attrs = {}
    if overlapping:
        ctx.require_opset(node, 16, "ScatterElements with reduction='add' (overlapping windows)")
        attrs["reduction"] = "add"
    scattered = w.op(
        "ScatterElements", [flat, w.reshape(indices, [-1]), w.reshape(dy, [-1])], axis=0, **attrs
    )
    w.reshape(scattered, w.shape(x), outputs(node, 1)[0])
    return w.nodes


def average_pool_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``AveragePoolGrad(dY)``: each output's gradient spread evenly over its window (pads
    excluded or not).
    """
    (dy,) = inputs(node, 1)
    x = _pooled_input(node, ctx)
    spatial = _spatial_rank(node, ctx)
    auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
    if auto_pad.startswith(
        "SAME"
    ):  # (ConvGrad's SAME pads are tested against torch; pools' are not)
        raise unsupported(node, f"auto_pad={auto_pad!r}")
    window = _Window(node, spatial)
    if window.kernel is None:
        raise unsupported(node, "a pool without kernel_shape")
    if any(d != 1 for d in window.dilations):
        raise unsupported(node, "dilations")
    w = ctx.writer(node)
    elem = ctx.float_type(dy)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    ones = w.const(np.ones([1, 1, *window.kernel], dtype), suffix="window")
    include_pad = node.attributes.get_int("count_include_pad", 0)
    if include_pad or not any(window.pads):
        scaled = w.op("Div", [dy, w.scalar(float(math.prod(window.kernel)), elem)])
    else:  # divide by how many input (not pad) positions each window covered
        image = zeros(w, w.concat([w.ints([1, 1]), w.shape(x, 2)]), elem)
        image = w.op("Add", [image, w.scalar(1, elem)])
        counts = w.op("Conv", [image, ones], strides=window.strides, pads=window.pads)
        scaled = w.op("Div", [dy, counts])
    per_channel = w.reshape(scaled, w.concat([w.ints([-1, 1]), w.shape(dy, 2)]))
    spread = _transposed(w, per_channel, ones, window)
    back = ir.Value(name=w.fresh("fit"))
    _fit_to(w, spread, w.reshape(x, w.concat([w.ints([-1, 1]), w.shape(x, 2)])), spatial, back)
    w.reshape(back, w.shape(x), outputs(node, 1)[0])
    return w.nodes


def _pooled_input(node: ir.Node, ctx: LoweringContext) -> ir.Value:
    """The pooled input ``X``, from the gradient's name (``X_grad``) or from the pool that wrote
    ``Y``.
    """
    match = GRADIENT_OF.match(outputs(node, 1)[0])
    if match:
        known = ctx.original_value(match.group("value"))
        found = ctx.value(match.group("value")) if has_type(known) else None
        if found is not None:
            return found
    match = GRADIENT_OF.match(name_of(node.inputs[0] if node.inputs else None))
    pool = ctx.producer(ctx.value(match.group("value"))) if match else None
    if pool is not None and pool.op_type == "AveragePool" and pool.inputs[0] is not None:
        return pool.inputs[0]
    raise unsupported(
        node, f"a gradient whose pooled input cannot be found (output '{outputs(node, 1)[0]}')"
    )


LOWERINGS = {
    "ConvGrad": conv_grad,
    "MaxPoolGrad": max_pool_grad,
    "AveragePoolGrad": average_pool_grad,
}
