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

import onnx

from onnxblocks.gradient import _graph


def group_norm_as_elementary(model: onnx.ModelProto) -> int:
    """Rewrite ``InstanceNormalization`` and ``GroupNormalization`` into elementary ops.

    Any input shape works. Nodes whose input element type is unknown are left as
    they are.

    Returns:
        The number of nodes rewritten.
    """
    kinds = ("InstanceNormalization", "GroupNormalization")
    return _graph.rewrite_nodes(model, lambda n: n.op_type in kinds and _graph.is_default_domain(n), _rewrite)


def _rewrite(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    x, scale, bias = node.input[0], node.input[1], node.input[2]
    elem = _graph.elem_type(ctx.types, x)
    if elem is None:
        return None
    epsilon = _graph.float_attribute(node, "epsilon", 1e-5)
    if node.op_type == "InstanceNormalization":
        groups, per_channel = 0, False  # Reshape's 0: one group per channel, affine per group
    else:
        groups, per_channel = _graph.int_attribute(node, "num_groups"), ctx.opset >= 21
    w = ctx.writer(node.output[0])
    _write(w, x, scale, bias, groups, per_channel, epsilon, elem, node.output[0])
    return w.nodes


def _write(
    w: _graph.NodeWriter,
    x: str,
    scale: str,
    bias: str,
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
    affine = w.op("Add", [w.op("Mul", [normed, w.op("Reshape", [scale, column])]), w.op("Reshape", [bias, column])])
    w.op("Reshape", [affine, shape], out=y)
