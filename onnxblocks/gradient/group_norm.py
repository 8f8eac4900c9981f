"""Instance and group normalization, written with ops ONNX Runtime can differentiate.

ONNX Runtime 1.19.2 has no gradient builder for ``InstanceNormalization`` (which
the torch exporters emit for ``nn.InstanceNorm*d`` and, on a reshaped input, for
``nn.GroupNorm``) nor for ``GroupNormalization`` (the dynamo exporter at opset 21).
Both normalise groups of channels of ``x: [N, C, ...]`` over the group's channels
and all spatial positions:

* ``x`` is reshaped to ``[N, G, -1]``;
* ``mean`` and ``var`` (biased) are ``ReduceMean`` over the last axis;
* ``(x - mean) / Sqrt(var + epsilon)`` is reshaped back and scaled and shifted
  per channel (per group for opset-18 ``GroupNormalization``).

Instance normalization is the case ``G = C``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.ir.attributes import float_attribute, int_attribute
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
)
from onnxblocks.ir.writer import Writer

_KINDS = ("InstanceNormalization", "GroupNormalization")


class GroupNormAsElementary(NodeRewrite):
    """Rewrite ``InstanceNormalization`` and ``GroupNormalization`` into elementary ops.

    Any input shape works. Nodes whose input element type is unknown are left as
    they are.
    """

    name = "group_norm_as_elementary"
    op_types = frozenset(_KINDS)

    def select(self, node: ir.Node) -> bool:
        return node.op_type in _KINDS and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        x, scale, bias = node.inputs[0], node.inputs[1], node.inputs[2]
        elem = ctx.types.elem(x)
        if x is None or scale is None or bias is None:
            return fail("an input is missing")
        if elem is None:
            return fail("the input's element type is not known")
        epsilon = float(
            np.float32(float_attribute(node, "epsilon", 1e-5))
        )  # a float32 attribute, default too
        if node.op_type == "InstanceNormalization":
            groups, per_channel = 0, False  # Reshape's 0: one group per channel, affine per group
        else:
            groups, per_channel = int_attribute(node, "num_groups"), ctx.opset >= 21
        y = node.outputs[0].name or "norm"
        w = ctx.writer(y)
        _write(w, x, scale, bias, groups, per_channel, epsilon, elem, y)
        return w.nodes


def _write(
    w: Writer,
    x: ir.Value,
    scale: ir.Value,
    bias: ir.Value,
    groups: int,
    per_channel: bool,
    epsilon: float,
    elem: int,
    y: str,
) -> None:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    grouped = w.op("Reshape", [x, w.ints([0, groups, -1])])
    mean = w.reduce_mean(grouped, [2])
    centered = w.op("Sub", [grouped, mean])
    var = w.reduce_mean(w.op("Mul", [centered, centered]), [2])
    normed = w.op("Div", [centered, w.op("Sqrt", [w.op("Add", [var, w.const(epsilon, dtype)])])])
    shape = w.op("Shape", [x])
    if per_channel:  # [N, G, L] -> [N, C, L/(C/G)]
        leading = w.slice(shape, [0], [2], [0])
        normed = w.op("Reshape", [normed, w.op("Concat", [leading, w.ints([-1])], axis=0)])
    column = w.ints([-1, 1])
    affine = w.op(
        "Add",
        [w.op("Mul", [normed, w.op("Reshape", [scale, column])]), w.op("Reshape", [bias, column])],
    )
    w.op("Reshape", [affine, shape], out=y)
