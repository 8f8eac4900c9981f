"""Min and max with torch's gradient on ties, and their bfloat16 forms in float32.

ONNX Runtime 1.19.2 has no gradient builder for ``ReduceMax`` / ``ReduceMin``.
torch has two rules for the elements that tie for a reduction's extremum:

* ``torch.max(x)`` / ``torch.min(x)`` (no ``dim``) and ``amax`` / ``amin`` share the
  gradient evenly among the tied elements (``dy / k`` each, ``k`` the number of ties;
  NaN counts as the extremum when a reduced slice holds one);
* ``torch.max(x, dim)`` / ``torch.min(x, dim)`` give it to the element whose index they
  return (the first).

:class:`ExtremaWithTorchTies` writes the first rule as a selection the builder
can differentiate: ``sum(where(mask, x, 0) / count(mask))`` over the reduced axes,
``mask`` marking the ties (computed from ``ReduceMax`` / ``ReduceMin`` through
``Equal``, which no gradient crosses). The quotients are summed in a wider type
(float32 for float16 and bfloat16, float64 for float32), so the value is exactly the
extremum after the cast back; in float64 the ``k`` quotients of a tie can sum to a
few units in the last place away from it. The second rule is ``TopK(k=1)``, which
returns the first of the tied elements. A node gets it when the dynamo exporter's
metadata names ``aten.max.dim`` / ``aten.min.dim``. The torchscript exporter records
no aten op, and ``amax(x, dim)`` and ``max(x, dim).values`` export to the same
one-axis ``ReduceMax``: without the record, a one-axis reduction gets the index rule
(``max(x, dim)``, the older idiom), reductions over several or all axes the even one.

Elementwise ``Max`` / ``Min`` need nothing: ONNX Runtime's builder already splits
the gradient among the inputs equal to the result (``torch.maximum``: half each).
The same pass computes ``Max``, ``Min``, ``ArgMax`` and ``ArgMin`` of bfloat16 inputs in
float32 (exact: the values, indices and ties are the same), which ONNX Runtime's CPU has
no kernel for (``torch.maximum``, ``argmax``, the indices of ``max(x, dim)`` in bfloat16).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.ir.attributes import int_attribute
from onnxblocks.ir.rewrite import (
    NodeRewrite,
    NoMatch,
    RewriteContext,
    fail,
    is_default_domain,
    optional_input,
)

__all__ = ["ExtremaWithTorchTies"]

_F = onnx.TensorProto
_LARGEST = {"ReduceMax": 1, "ReduceMin": 0}
_ATEN_DIM = {"ReduceMax": "aten.max.dim", "ReduceMin": "aten.min.dim"}
#: The type the quotients of a tie are summed in, per float type: wide enough to round back exactly.
_WIDE: dict[int, int] = {
    _F.FLOAT16: _F.FLOAT,
    _F.BFLOAT16: _F.FLOAT,
    _F.FLOAT: _F.DOUBLE,
    _F.DOUBLE: _F.DOUBLE,
}
_NUMPY: dict[int, type] = {_F.FLOAT: np.float32, _F.DOUBLE: np.float64}
#: The dynamo exporter's record of the aten call a node comes from.
_FX_NODE = "pkg.torch.onnx.fx_node"


class ExtremaWithTorchTies(NodeRewrite):
    """Rewrite float ``ReduceMax`` / ``ReduceMin`` into selections with torch's gradient on ties.

    bfloat16 ``Max``, ``Min``, ``ArgMax`` and ``ArgMin`` are computed in float32.

    Left as they are: integer reductions (no gradient), run-time axes with
    ``noop_with_empty_axes``.
    """

    name = "extrema_with_torch_ties"
    op_types = frozenset({*_LARGEST, "Max", "Min", "ArgMax", "ArgMin"})
    min_opset = None

    def select(self, node: ir.Node) -> bool:
        return node.op_type in self.op_types and is_default_domain(node)

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        if node.op_type not in _LARGEST:
            return _in_float32(node, ctx)
        x = node.inputs[0]
        if x is None or ctx.types.elem(x) not in _WIDE:
            return fail("the input is not floating-point: integer reductions carry no gradient")
        axes = ctx.reduction_axes(node)
        if not axes and int_attribute(node, "noop_with_empty_axes", 0):
            if axes is None:
                return fail("run-time axes and noop_with_empty_axes: the identity when empty")
            w = ctx.writer(node.outputs[0].name or "reduce")
            w.op("Identity", [x], out=node.outputs[0].name)
            return w.nodes
        if axes is not None and _returns_index(node, axes):
            topk = _first_index(node, axes, ctx)
            if topk is not None:
                return topk
        return _even_share(node, optional_input(node, 1) if axes is None else axes, ctx)


def _returns_index(node: ir.Node, axes: list[int]) -> bool:
    """True when ``node`` is the value of ``max(x, dim)`` / ``min(x, dim)``: torch's gradient goes
    to the index.

    The dynamo exporter records the aten op of each node. Without that record (the
    torchscript exporter), a reduction over one axis is taken for ``max(x, dim)``, the
    older idiom: ``amax(x, dim)`` exports to the same node.
    """
    if len(axes) != 1:
        return False
    record = node.metadata_props.get(_FX_NODE)
    if record is None:
        return True
    return f"target=torch.ops.{_ATEN_DIM[node.op_type]}]" in record


def _even_share(
    node: ir.Node, axes: list[int] | ir.Value | None, ctx: RewriteContext
) -> list[ir.Node]:
    """``sum(where(mask, x, 0) / count(mask))`` over ``axes``, in the wide type: each tie gets
    ``dy / k``.
    """
    x, y = node.inputs[0], node.outputs[0].name or "reduce"
    assert x is not None
    elem = ctx.types.elem(x)
    assert elem is not None
    wide = _WIDE[elem]
    keepdims = int_attribute(node, "keepdims", 1)
    reduced = axes if isinstance(axes, ir.Value) or axes else None  # no axes: every axis
    w = ctx.writer(y)
    xw = w.cast(x, wide) if wide != elem else x
    zero = w.scalar(0.0, _NUMPY[wide])
    nan = w.op("IsNaN", [xw])
    extremum = w.reduce(node.op_type, xw, reduced, keepdims=1)
    # NaN wherever a slice holds a NaN, as torch's amax; the sum of the NaNs, else 0
    poisoned = w.op(
        "Add",
        [extremum, w.reduce("ReduceSum", w.op("Where", [nan, xw, zero]), reduced, keepdims=1)],
    )
    ties = w.op("Equal", [xw, poisoned])
    mask = w.op("Or", [ties, w.op("And", [nan, w.op("IsNaN", [poisoned])])])
    count = w.reduce("ReduceSum", w.cast(mask, wide), reduced, keepdims=1)
    share = w.op("Div", [w.op("Where", [mask, xw, zero]), count])
    if wide == elem:
        w.reduce("ReduceSum", share, reduced, keepdims=keepdims, out=y)
    else:
        w.cast(w.reduce("ReduceSum", share, reduced, keepdims=keepdims), elem, out=y)
    return w.nodes


def _first_index(node: ir.Node, axes: list[int], ctx: RewriteContext) -> list[ir.Node] | None:
    """``TopK(k=1)`` along the one reduced axis: the gradient goes to the first extremum, as
    ``max(x, dim)``'s.
    """
    x, y = node.inputs[0], node.outputs[0].name or "reduce"
    assert x is not None
    keepdims = int_attribute(node, "keepdims", 1)
    shape = ctx.types.shape(x)
    axis = axes[0]
    if axis < 0:
        if shape is None:
            if not keepdims:
                return None
        else:
            axis += len(shape)
    w = ctx.writer(y)
    bfloat16 = ctx.types.elem(x) == _F.BFLOAT16
    final = y
    if bfloat16:  # no bfloat16 TopK kernel on the CPU: the extremum of the float32 values is exact
        x, y = w.cast(x, _F.FLOAT), w.fresh("float32")
    largest = _LARGEST[node.op_type]
    values = w.ops(
        "TopK",
        [x, w.ints([1])],
        [w.fresh("values"), w.fresh("indices")],
        axis=axis,
        largest=largest,
    )[0]
    if keepdims:
        w.op("Identity", [values], out=y)
    else:
        w.squeeze(values, [axis], out=y)
    if bfloat16:
        w.cast(w.nodes[-1].outputs[0], _F.BFLOAT16, out=final)
    return w.nodes


def _in_float32(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    """A bfloat16 ``Max``, ``Min``, ``ArgMax`` or ``ArgMin`` between casts to float32 (exact) and
    back.
    """
    if not node.inputs or any(v is None or ctx.types.elem(v) != _F.BFLOAT16 for v in node.inputs):
        return fail("not every input is bfloat16")
    y = node.outputs[0].name or node.op_type.lower()
    w = ctx.writer(y)
    inputs = [w.cast(v, _F.FLOAT) for v in node.inputs if v is not None]
    attrs = {name: attr.value for name, attr in node.attributes.items()}
    if node.op_type.startswith("Arg"):
        w.op(node.op_type, inputs, out=y, **attrs)
    else:
        w.cast(w.op(node.op_type, inputs, **attrs), _F.BFLOAT16, out=y)
    return w.nodes
