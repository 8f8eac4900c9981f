"""Float64 gradients that stay float64: where ONNX Runtime's gradient builder rounds to float32.

ONNX Runtime 1.19.2 differentiates a float64 graph with float64 kernels, except:

* ``ReduceMean``: its gradient scales ``dY`` by ``1/N`` with the ``com.microsoft`` op ``Scale``,
  whose CPU kernel computes the factor in float32 whatever the tensor type
  (``(T)(1.0f / (float)N)``): about 3e-8 relative off wherever ``N`` is no power of two.
  Instance and group norms inherit it (:mod:`~onnxblocks.gradient.group_norm` writes them
  with ``ReduceMean``), and so does every float64 mean of a user's model.
* ``LayerNormalization``: its ``Mean`` / ``InvStdDev`` outputs, which the gradient reads, are
  float32 (``stash_type`` 1: ONNX Runtime has no kernel for a float64 stash), and
  ``LayerNormalizationGrad`` sums in float32: about 1e-7 relative off.

:class:`Float64LayerNormAsElementary` writes a float64 LayerNormalization with elementary ops
(torch's formula; its means are ``ReduceMean``), then :class:`Float64ReduceMeanAsSumDiv` writes
each float64 ``ReduceMean`` as ``ReduceSum`` divided by the element count in float64, so ONNX
Runtime differentiates a sum and a division, both in float64. The forward values are the same to
float64 rounding. Other float types are left alone: their ``Scale`` factor rounds no coarser than
the type itself.

The portable lowering's ``Scale`` keeps the kernel's float32 factor (both backends compute the same
numbers); after these passes no float64 ``Scale`` reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks.ir.attributes import float_attribute, int_attribute
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
    optional_input,
)
from onnxblocks.ir.walk import all_nodes
from onnxblocks.ir.writer import Writer

__all__ = [
    "Float64LayerNormAsElementary",
    "Float64ReduceMeanAsSumDiv",
]

_DOUBLE = onnx.TensorProto.DOUBLE


def may_hold_float64(model: ir.Model) -> bool:
    """False when no value of ``model`` can be float64, seen without type inference (cheap).

    A float64 value comes from a graph input, an initializer, a declared value type, or a node
    attribute that names or holds float64 (``Cast``'s ``to``, a ``dtype``, a constant tensor).
    Model-local functions are not looked into: a model with any may hold float64.
    """
    graph = model.graph
    if model.functions:
        return True
    if any(v.dtype == ir.DataType.DOUBLE for v in [*graph.inputs, *graph.initializers.values()]):
        return True
    for node in all_nodes(graph):
        if any(v.dtype == ir.DataType.DOUBLE for v in node.outputs):
            return True
        if any(_names_float64(attr) for attr in node.attributes.values()):
            return True
    return False


def _names_float64(attr: ir.Attr) -> bool:
    """True for an attribute by which its node writes float64 (a type named, a tensor held)."""
    if attr.is_ref():
        return False
    if attr.type == ir.AttributeType.INT:
        return attr.name in ("to", "dtype") and attr.value == _DOUBLE
    return attr.type == ir.AttributeType.TENSOR and attr.value.dtype == ir.DataType.DOUBLE


class _Float64Rewrite(NodeRewrite):
    """A rewrite of float64 nodes only: a model without float64 values is not even type-inferred."""

    min_opset = None

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        if not any(self.select(n) for n in model.graph) or not may_hold_float64(model):
            return {}
        return super().apply(model)


class Float64ReduceMeanAsSumDiv(_Float64Rewrite):
    """Rewrite float64 ``ReduceMean`` into ``ReduceSum`` divided by the element count, in float64.

    Every form: axes as the attribute (up to opset 17) or the input (opset 18), none (every
    axis), ``keepdims``, ``noop_with_empty_axes`` (an identity then). The count is a constant
    when the reduced dims are static, ``ReduceProd`` of the reduced dims of ``Shape(x)`` when
    some are symbolic, and ``Size(x) / Size(sum)`` when the axes are known only at run time.
    """

    name = "float64_reduce_mean_as_sum_div"
    op_types = frozenset({"ReduceMean"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "ReduceMean" and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        x = node.inputs[0]
        if x is None or ctx.types.elem(x) != _DOUBLE:
            return fail("the input is missing or not float64")
        y = node.outputs[0].name or "mean"
        keepdims = int_attribute(node, "keepdims", 1)
        noop = int_attribute(node, "noop_with_empty_axes", 0)
        axes = ctx.reduction_axes(node)
        shape = ctx.types.shape(x)
        if axes and shape is not None and not all(-len(shape) <= a < len(shape) for a in axes):
            return fail("an axis is out of the input's rank: left for ONNX Runtime to name")
        w = ctx.writer(y)
        if axes == [] and noop:  # nothing reduced
            w.op("Identity", [x], out=y)
            return w.nodes
        if axes is None:  # run-time axes: the count is what the sum leaves out
            axes_input = optional_input(node, 1)
            assert axes_input is not None
            noop_attr = noop or None  # the attribute only where the node has it
            total = w.reduce("ReduceSum", x, axes_input, keepdims, noop_with_empty_axes=noop_attr)
            count = w.op("Div", [_size(w, x), _size(w, total)])
        else:
            total = w.reduce("ReduceSum", x, axes or None, keepdims)
            count = _count(w, x, axes, ctx)
        w.op("Div", [total, count], out=y)
        return w.nodes


def _size(w: Writer, x: ir.Value) -> ir.Value:
    """The number of elements of ``x``, a float64 scalar."""
    return w.cast(w.op("Size", [x]), _DOUBLE)


def _count(w: Writer, x: ir.Value, axes: list[int], ctx: RewriteContext) -> ir.Value:
    """The number of elements ``x`` has along ``axes`` (every axis when empty), a float64 scalar."""
    shape = ctx.types.shape(x)
    if shape is not None:
        dims = [shape[a] for a in axes] if axes else shape
        if all(d is not None for d in dims):
            return w.const(float(np.prod(np.array(dims, dtype=np.int64))), np.float64, "count")
    if not axes:
        return _size(w, x)
    # Gather takes negative axes as they are: the rank need not be known
    dims_value = w.op("Gather", [w.op("Shape", [x]), w.ints(axes)], axis=0)
    return w.cast(w.op("ReduceProd", [dims_value], keepdims=0), _DOUBLE)


#: LayerNormalization's domains: ai.onnx (opset 17) and com.microsoft, one definition.
_NORM_DOMAINS = ("", "ai.onnx", _limits.MS_DOMAIN)


class Float64LayerNormAsElementary(_Float64Rewrite):
    """Rewrite float64 ``LayerNormalization`` into elementary ops, as torch computes it.

    ``mean = ReduceMean(x)``, ``d = x - mean``, ``inv_std_dev = 1 / Sqrt(ReduceMean(d * d) +
    epsilon)`` over the axes from ``axis`` on, ``Y = d * inv_std_dev * scale + bias``. A
    ``Mean`` or ``InvStdDev`` output that something reads is cast to the node's ``stash_type``
    (the type the op gives them). A node with a non-negative ``axis`` and an input of unknown
    rank is left as it is.
    """

    name = "float64_layer_norm_as_elementary"
    op_types = frozenset({"LayerNormalization"})

    def select(self, node: ir.Node) -> bool:
        return node.op_type == "LayerNormalization" and node.domain in _NORM_DOMAINS

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        x, scale = node.inputs[0], optional_input(node, 1)
        bias = optional_input(node, 2)
        if x is None or scale is None or ctx.types.elem(x) != _DOUBLE:
            return fail("the input or the scale is missing, or the input is not float64")
        axis = int_attribute(node, "axis", -1)
        if axis < 0:
            axes = list(range(axis, 0))
        else:
            shape = ctx.types.shape(x)
            if shape is None:
                return fail("axis is non-negative and the input's rank is not known")
            axes = list(range(axis, len(shape)))
        # a float attribute: its default is the float32 1e-5 too, as the op and its kernel read it
        epsilon = float(np.float32(float_attribute(node, "epsilon", 1e-5)))
        y = node.outputs[0].name or "norm"
        w = ctx.writer(y)
        mean = w.reduce_mean(x, axes)
        centered = w.op("Sub", [x, mean])
        variance = w.reduce_mean(w.op("Mul", [centered, centered]), axes)
        shifted = w.op("Add", [variance, w.const(epsilon, np.float64, "epsilon")])
        inv_std_dev = w.op("Reciprocal", [w.op("Sqrt", [shifted])])
        scaled = w.op("Mul", [w.op("Mul", [centered, inv_std_dev]), scale])
        if bias is not None:
            w.op("Add", [scaled, bias], out=y)
        else:
            w.op("Identity", [scaled], out=y)
        stash = int_attribute(node, "stash_type", onnx.TensorProto.FLOAT)
        for statistic, out in zip((mean, inv_std_dev), node.outputs[1:3], strict=False):
            if out.name and (out.uses() or out.is_graph_output()):
                w.cast(statistic, stash, out=out.name)
        return w.nodes
