"""ConvTranspose as Conv: ONNX Runtime 1.19.2 has no CPU kernel for ``ConvTransposeGrad``.

The gradient builder knows ConvTranspose, but the training model then fails to
load on CPU ("Could not find an implementation for ConvTransposeGrad"). A
transposed convolution is a convolution of the zero-upsampled input with the
flipped, channel-swapped kernel:

* the input ``[N, C, D1, ...]`` gets ``stride - 1`` zeros after every element
  (``Unsqueeze`` a unit axis after each spatial axis, ``Pad`` it to the stride,
  ``Reshape`` back), which leaves ``stride - 1`` extra zeros at the end;
* the kernel ``[C_in, C_out/group, k...]`` is regrouped into
  ``[C_out, C_in/group, k...]`` and flipped along its spatial axes (``Gather``
  with reversed indices);
* ``Conv`` with stride 1, the same dilation and group, and padding
  ``dilation * (k - 1) - pad`` at the start and ``dilation * (k - 1) - pad +
  output_padding - (stride - 1)`` at the end (negative padding crops the input
  with ``Slice``).

Every op on the way has a CPU gradient, and the kernel's gradient flows back to
the ConvTranspose weight through the regrouping.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnxblocks.ir.attributes import int_attribute, ints_attribute, string_attribute, value
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
    optional_input,
)
from onnxblocks.ir.types import static_dims
from onnxblocks.ir.writer import INT64_MAX as _INT64_MAX


class ConvTransposeAsConv(NodeRewrite):
    """Rewrite ``ConvTranspose`` into ``Conv`` on a zero-upsampled input.

    Rewritten: nodes whose weight shape is static, with ``auto_pad`` NOTSET or
    VALID and no ``output_shape`` attribute (the torch exporters' form). Others are
    left as they are.
    """

    name = "conv_transpose_as_conv"
    op_types = frozenset({"ConvTranspose"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "ConvTranspose" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _rewrite(node, ctx)


def _rewrite(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    x, weight = node.inputs[0], node.inputs[1]
    bias = optional_input(node, 2)
    wshape = static_dims(ctx.types.shape(weight))
    auto_pad = string_attribute(node, "auto_pad", "NOTSET")
    if x is None or weight is None:
        return fail("an input is missing")
    if wshape is None or len(wshape) < 3:
        return fail("the weight's shape is not known (or has no spatial dims)")
    if auto_pad not in ("NOTSET", "VALID") or value(node, "output_shape") is not None:
        return fail("auto_pad SAME_* or output_shape: the output size is decided at run time")
    n = len(wshape) - 2
    c_in, c_out_per_group, kernel = wshape[0], wshape[1], wshape[2:]
    group = int_attribute(node, "group", 1)
    strides = ints_attribute(node, "strides", [1] * n)
    dilations = ints_attribute(node, "dilations", [1] * n)
    output_padding = ints_attribute(node, "output_padding", [0] * n)
    pads = [0] * (2 * n) if auto_pad == "VALID" else ints_attribute(node, "pads", [0] * (2 * n))
    if c_in % group or ints_attribute(node, "kernel_shape", kernel) != kernel:
        return fail("the group does not divide the channels, or kernel_shape is not the weight's")

    w = ctx.writer(node.outputs[0].name or "conv_transpose")
    spatial = list(range(2, 2 + n))
    # 1. zero-upsample the input: stride - 1 zeros after each element
    upsampled = x
    if any(s > 1 for s in strides):
        unit_axes = [3 + 2 * i for i in range(n)]
        expanded = w.unsqueeze(x, unit_axes)
        rank = 2 + 2 * n
        end_pads = [0] * rank
        for i, s in enumerate(strides):
            end_pads[unit_axes[i]] = s - 1
        padded = w.pad(expanded, [0] * rank + end_pads)
        sizes = w.slice(w.op("Shape", [x]), [2], [_INT64_MAX], [0])
        target = w.op("Concat", [w.ints([0, 0]), w.op("Mul", [sizes, w.ints(strides)])], axis=0)
        upsampled = w.op("Reshape", [padded, target])
    # 2. padding of the equivalent Conv; negative padding crops
    begin = [dilations[i] * (kernel[i] - 1) - pads[i] for i in range(n)]
    end = [
        dilations[i] * (kernel[i] - 1) - pads[n + i] + output_padding[i] - (strides[i] - 1)
        for i in range(n)
    ]
    if any(b < 0 for b in begin) or any(e < 0 for e in end):
        starts = [max(0, -b) for b in begin]
        ends = [e if e < 0 else _INT64_MAX for e in end]
        upsampled = w.slice(upsampled, starts, ends, spatial)
    conv_pads = [max(0, b) for b in begin] + [max(0, e) for e in end]
    # 3. the kernel: [C_in, C_out/g, k...] -> [C_out, C_in/g, k...], flipped
    if group == 1:
        swapped = w.op("Transpose", [weight], perm=[1, 0, *spatial])
    else:
        grouped = w.op(
            "Reshape", [weight, w.ints([group, c_in // group, c_out_per_group, *kernel])]
        )
        regrouped = w.op("Transpose", [grouped], perm=[0, 2, 1, *range(3, 3 + n)])
        swapped = w.op(
            "Reshape", [regrouped, w.ints([group * c_out_per_group, c_in // group, *kernel])]
        )
    flipped = swapped
    for axis, size in zip(spatial, kernel, strict=True):
        if size > 1:  # Gather with reversed indices: SliceGrad fails on negative steps
            flipped = w.op("Gather", [flipped, w.ints(list(range(size - 1, -1, -1)))], axis=axis)
    # 4. the convolution
    inputs = [upsampled, flipped] + ([bias] if bias is not None else [])
    w.op(
        "Conv",
        inputs,
        out=node.outputs[0].name,
        dilations=dilations,
        group=group,
        kernel_shape=kernel,
        pads=conv_pads,
        strides=[1] * n,
    )
    return w.nodes
