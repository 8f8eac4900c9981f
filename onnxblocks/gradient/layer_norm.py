"""LayerNormalization in the form ONNX Runtime's gradient builder differentiates.

ONNX Runtime's ``LayerNormalization`` gradient (ai.onnx or com.microsoft, and
``SimplifiedLayerNormalization``) reads inputs and outputs the exporters leave
out, and always writes the gradients of its scale and bias:

* ``layer_norm_zero_bias`` (a normalisation pass) gives a node without a bias
  an explicit zero bias;
* ``expose_layer_norm_statistics`` (a normalisation pass) gives it the
  ``Mean`` / ``InvStdDev`` outputs its gradient reads;
* :func:`unshare_norm_constants` (a step of
  :func:`~onnxblocks.gradient.builder.build_training_graphs`, not a pass: see its
  docstring) makes their constant scales and biases initializers to lift; a scale or
  bias two nodes share gets an input per reader from
  :mod:`onnxblocks.gradient.frozen_reads`, for norms and every other op alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.attributes import int_attribute
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.rewrite import NodeRewrite, NoMatch, RewriteContext, fail
from onnxblocks.ir.types import ValueTypes, static_dims

#: Normalisation ops whose gradient reads extra outputs and writes the gradients of its scale and
#: bias.
NORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization")

# op type -> number of outputs the gradient needs (Y, mean, inv_std_dev) / (Y, inv_std_dev)
_NORM_OUTPUTS = {"LayerNormalization": 3, "SimplifiedLayerNormalization": 2}


def _is_norm(node: ir.Node) -> bool:
    return node.op_type in NORM_OPS and node.domain in ("", "ai.onnx", _limits.MS_DOMAIN)


class ExposeLayerNormStatistics(Pass):
    """Give every LayerNormalization the optional outputs its gradient reads.

    ``LayerNormalization`` (ai.onnx or com.microsoft) gets its ``Mean`` and
    ``InvStdDev`` outputs, ``SimplifiedLayerNormalization`` its ``inv_std_var``.
    The new outputs have fresh names and nothing reads them in the forward graph.
    """

    name = "expose_layer_norm_statistics"
    op_types = frozenset(NORM_OPS)

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        names: NameAuthority | None = None
        changes: dict[str, int] = {}
        for node in model.graph:
            wanted = _NORM_OUTPUTS.get(node.op_type)
            if wanted is None or not _is_norm(node):
                continue
            if len(node.outputs) >= wanted and all(v.name for v in node.outputs[:wanted]):
                continue
            names = names or graph_names(model.graph)
            base = node.outputs[0].name
            suffixes = ["mean", "inv_std_dev"] if wanted == 3 else ["inv_std_dev"]
            if len(node.outputs) < wanted:
                node.resize_outputs(wanted)
            for i, suffix in zip(range(1, wanted), suffixes, strict=True):
                if not node.outputs[i].name:
                    node.outputs[i].name = names.fresh(f"{base}.{suffix}")
            changes[node.op_type] = changes.get(node.op_type, 0) + 1
        return changes


class LayerNormZeroBias(NodeRewrite):
    """Give every ``LayerNormalization`` without a bias an explicit zero bias.

    ONNX Runtime's LayerNormalization gradient reads the bias input
    (``i < node_->InputDefs().size()`` otherwise); the dynamo exporter leaves it
    out for ``bias=False``, ``elementwise_affine=False`` and ``F.layer_norm(x, shape,
    weight)``. The zeros have the normalised shape (``x.shape[axis:]``) or the
    scale's shape: a constant when one is static, ``ConstantOfShape(Shape(scale))``
    otherwise.
    """

    name = "layer_norm_zero_bias"
    op_types = frozenset({"LayerNormalization"})
    min_opset = None

    def select(self, node: ir.Node) -> bool:
        return (
            node.op_type == "LayerNormalization"
            and _is_norm(node)
            and len(node.inputs) >= 2
            and (len(node.inputs) < 3 or node.inputs[2] is None)
        )

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        scale = node.inputs[1]
        dtype = ctx.dtype(scale)
        if scale is None or dtype is None:
            return fail("the scale is missing or its element type is not known")
        writer = ctx.writer(f"{node.outputs[0].name}.bias")
        shape = _normalized_shape(node, ctx.types)
        if shape is not None:
            bias = writer.const(np.zeros(shape, dtype=dtype), suffix="zeros")
        else:
            zero = ir.tensor(np.zeros(1, dtype=dtype), name="value")
            bias = writer.op("ConstantOfShape", [writer.op("Shape", [scale])], value=zero)
        node.resize_inputs(3)
        node.replace_input_with(2, bias)
        return [*writer.nodes, node]


def _normalized_shape(node: ir.Node, types: ValueTypes) -> list[int] | None:
    """The static shape a LayerNormalization normalises over (``x.shape[axis:]``), else its
    scale's, else None.
    """
    x = types.shape(node.inputs[0])
    if x is not None:
        axis = int_attribute(node, "axis", -1)
        dims = static_dims(x[axis:] if axis < 0 else x[axis:] if axis < len(x) else None)
        if dims:
            return dims
    return static_dims(types.shape(node.inputs[1]))


def unshare_norm_constants(graph: ir.Graph) -> tuple[set[str], bool]:
    """Make the constant scales and biases of normalisation nodes initializers; return them, to
    lift.

    ONNX Runtime's LayerNormalization gradient always writes ``<scale>_grad`` and
    ``<bias>_grad``; two such nodes whose constant scale and bias are fed by another
    LayerNormalization fail with "Duplicate definition of name (<bias>_grad)". Here
    (in place) Constant nodes feeding a scale or bias become initializers, and the
    constant scales and biases are returned: the caller makes them graph inputs while
    ONNX Runtime builds the gradient (as frozen parameters are, which works) and
    initializers again afterwards. A scale or bias that several nodes read is given
    an input per reader by :func:`~onnxblocks.gradient.frozen_reads.alias_frozen_reads`.

    This is an explicit step of
    :func:`~onnxblocks.gradient.builder.build_training_graphs`, not a pass of
    :func:`~onnxblocks.gradient.rewrites.normalize`, because a pass is
    ``model -> count`` on the forward graph and this step is not: it returns
    names the caller must lift, and must run *after*
    parameters became graph inputs (the initializers it returns are then constants
    only; a frozen parameter lifted here would come back as an initializer) and on
    the training copy only (the eval model keeps its constants).

    Args:
        graph: The training copy of the forward model's graph, parameters already graph
            inputs (edited in place).

    Returns:
        The names of the constant (initializer) scales and biases of normalisation nodes, and
        whether the graph changed.
    """
    changed = False
    wanted = {v for node in graph if _is_norm(node) for v in node.inputs[1:3] if v is not None}
    wanted_names = {v.name for v in wanted if v.name}
    constants = ConstantTable(graph)
    for node in list(graph):
        out = node.outputs[0] if node.outputs else None
        if node.op_type == "Constant" and out in wanted and not out.is_initializer():
            value = constants.value(out)
            if value is not None:  # the constant becomes an initializer of the same name
                init = ir.Value(
                    name=out.name, type=ir.TensorType(ir.DataType.from_numpy(value.dtype))
                )
                init.shape = ir.Shape(value.shape)
                init.const_value = ir.tensor(value, name=out.name)
                ir.convenience.replace_all_uses_with(out, init, replace_graph_outputs=True)
                graph.remove(node, safe=True)
                graph.register_initializer(init)
                changed = True
    return wanted_names & set(graph.initializers), changed
