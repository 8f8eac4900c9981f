"""LayerNormalization in the form ONNX Runtime's gradient builder differentiates.

ONNX Runtime's ``LayerNormalization`` gradient (ai.onnx or com.microsoft, and
``SimplifiedLayerNormalization``) reads inputs and outputs the exporters leave
out, and always writes the gradients of its scale and bias:

* :func:`layer_norm_zero_bias` (a normalisation pass) gives a node without a bias
  an explicit zero bias;
* :func:`expose_layer_norm_statistics` (a normalisation pass) gives it the
  ``Mean`` / ``InvStdDev`` outputs its gradient reads;
* :func:`unshare_layer_norm_constants` (a step of
  :func:`~onnxblocks.gradient.builder.build_training_graphs`, not a pass: see its
  docstring) keeps two nodes from writing the gradient of one scale or bias.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks.gradient import _graph
from onnxblocks.gradient.folding import ConstantTable

#: Normalisation ops whose gradient reads extra outputs and writes the gradients of its scale and bias.
NORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization")

# op type -> number of outputs the gradient needs (Y, mean, inv_std_dev) / (Y, inv_std_dev)
_NORM_OUTPUTS = {"LayerNormalization": 3, "SimplifiedLayerNormalization": 2}


def _is_norm(node: onnx.NodeProto) -> bool:
    return node.op_type in NORM_OPS and node.domain in ("", "ai.onnx", _limits.MS_DOMAIN)


def expose_layer_norm_statistics(model: onnx.ModelProto) -> int:
    """Give every LayerNormalization the optional outputs its gradient reads.

    ``LayerNormalization`` (ai.onnx or com.microsoft) gets its ``Mean`` and
    ``InvStdDev`` outputs, ``SimplifiedLayerNormalization`` its ``inv_std_var``.
    The new outputs have fresh names and nothing reads them in the forward graph.

    Returns:
        The number of nodes that got outputs.
    """
    names = _graph.name_authority(model.graph)
    changed = 0
    for node in model.graph.node:
        wanted = _NORM_OUTPUTS.get(node.op_type)
        if wanted is None or not _is_norm(node):
            continue
        if len(node.output) >= wanted and all(node.output[:wanted]):
            continue
        base = node.output[0]
        suffixes = ["mean", "inv_std_dev"] if wanted == 3 else ["inv_std_dev"]
        while len(node.output) < wanted:
            node.output.append("")
        for i, suffix in zip(range(1, wanted), suffixes, strict=True):
            if not node.output[i]:
                node.output[i] = names.fresh(f"{base}.{suffix}")
        changed += 1
    return changed


def layer_norm_zero_bias(model: onnx.ModelProto) -> int:
    """Give every ``LayerNormalization`` without a bias an explicit zero bias.

    ONNX Runtime's LayerNormalization gradient reads the bias input
    (``i < node_->InputDefs().size()`` otherwise); the dynamo exporter leaves it
    out for ``bias=False``, ``elementwise_affine=False`` and ``F.layer_norm(x, shape,
    weight)``. The zeros have the normalised shape (``x.shape[axis:]``) or the
    scale's shape: a constant when one is static, ``ConstantOfShape(Shape(scale))``
    otherwise.

    Returns:
        The number of nodes that got a bias.
    """
    return _graph.rewrite_nodes(
        model,
        lambda n: (
            n.op_type == "LayerNormalization"
            and _is_norm(n)
            and len(n.input) >= 2
            and (len(n.input) < 3 or not n.input[2])
        ),
        _zero_bias,
        min_opset=None,
    )


def _zero_bias(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    scale = node.input[1]
    dtype = ctx.dtype(scale)
    if dtype is None:
        return None
    writer = ctx.writer(f"{node.output[0]}.bias")
    shape = _normalized_shape(node, ctx.types)
    if shape is not None:
        bias = writer.const(np.zeros(shape, dtype=dtype), suffix="zeros")
    else:
        zero = onnx.numpy_helper.from_array(np.zeros(1, dtype=dtype), "value")
        bias = writer.op("ConstantOfShape", [writer.op("Shape", [scale])], value=zero)
    del node.input[2:]
    node.input.append(bias)
    return [*writer.nodes, node]


def _normalized_shape(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> list[int] | None:
    """The static shape a LayerNormalization normalises over (``x.shape[axis:]``), else its scale's, else None."""
    x = _graph.shape_of(types, node.input[0])
    if x is not None:
        axis = _graph.int_attribute(node, "axis", -1)
        dims = _graph.static_dims(x[axis:] if axis < 0 else x[axis:] if axis < len(x) else None)
        if dims:
            return dims
    return _graph.static_dims(_graph.shape_of(types, node.input[1]))


def unshare_layer_norm_constants(model: onnx.ModelProto, trainable: Iterable[str]) -> set[str]:
    """Keep two normalisation nodes from writing the gradient of one scale or bias; return constants to lift.

    ONNX Runtime's LayerNormalization gradient always writes ``<scale>_grad`` and
    ``<bias>_grad``. Two such nodes whose scale or bias is the same value (a shared
    constant or frozen parameter), or whose constant scale and bias are fed by
    another LayerNormalization, fail with "Duplicate definition of name
    (<bias>_grad)". Here (in place):

    * Constant nodes feeding a scale or bias become initializers;
    * a scale or bias (not trainable) that an earlier normalisation node already reads
      is read through an ``Identity`` of its own;

    and the constant scales and biases are returned: the caller makes them graph
    inputs while ONNX Runtime builds the gradient (as frozen parameters are, which
    works) and initializers again afterwards.

    This is an explicit step of
    :func:`~onnxblocks.gradient.builder.build_training_graphs`, not a pass of
    :func:`~onnxblocks.gradient.normalize.normalize`, because a pass is
    ``model -> count`` on the forward graph and this step is not: it reads the
    trainable set, returns names the caller must lift, and must run *after*
    parameters became graph inputs (the initializers it returns are then constants
    only; a frozen parameter lifted here would come back as an initializer) and on
    the training copy only (the eval model needs no aliases).

    Args:
        model: The training copy of the forward model, parameters already graph inputs.
        trainable: The values that get a gradient (their own ``_grad`` is wanted: never aliased).

    Returns:
        The names of the constant (initializer) scales and biases of normalisation nodes.
    """
    graph = model.graph
    wanted = {name for node in graph.node if _is_norm(node) for name in node.input[1:3] if name}
    if not wanted:
        return set()
    trained = set(trainable)
    initializers = {init.name for init in graph.initializer}
    constants = ConstantTable(graph)
    names = _graph.name_authority(graph)
    seen: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in wanted - initializers:
            value = constants.value(node.output[0])
            if value is not None:
                graph.initializer.append(onnx.numpy_helper.from_array(value, node.output[0]))
                initializers.add(node.output[0])
                continue
        if _is_norm(node):
            for i in (1, 2):
                name = node.input[i] if len(node.input) > i else ""
                if not name or name in trained:
                    continue
                if name in seen:
                    alias = names.fresh(f"{name}.alias")
                    nodes.append(helper.make_node("Identity", [name], [alias], name=names.fresh("Identity")))
                    node.input[i] = alias
                seen.add(name)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return wanted & initializers
