"""Upgrading a sequence optimizer model (the first portable layout) to one tensor per parameter.

* :func:`per_tensor_optimizer` turns an optimizer model with tensor-sequence inputs
  and outputs (what portable artifacts held before the optimizer model was written
  per tensor, :func:`onnxblocks.portable.optimizer.optimizer_model`) into one whose
  parameters, gradients and moments are each their own tensor input and output,
  named as the portable contract names them (``p``, ``<p>_grad``, ``p.exp_avg``,
  ``p.exp_avg_sq``; outputs ``<input>.out``) where those names are free. A runtime
  can then bind them with IOBinding, once, to the buffers they live in (Python
  cannot build a tensor sequence without a numpy round trip). When the
  sequences are only read by ``SequenceAt`` at constant positions and built by
  ``SequenceConstruct`` (as onnxblocks writes them), those nodes are replaced by
  the tensors themselves (no copy); otherwise ``SequenceConstruct`` in front and
  ``SequenceAt`` behind wrap the model as it is.

The rewrite is an edit of the model's IR (:mod:`onnxblocks.ir`); the model passed in is not changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core.contracts import (
    FIRST_ORDER_MOMENTS,
    GRADIENTS,
    PARAMS,
    SECOND_ORDER_MOMENTS,
    UPDATED_SUFFIX,
    gradient_name,
    moment_names,
    updated_name,
)
from onnxblocks._core.errors import InvalidValueError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.edit import remove_unused_nodes
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.walk import subgraphs
from onnxblocks.ir.writer import Writer

#: Sequence ops (SequenceConstruct, SequenceAt) exist from this opset of the default domain on.
_SEQUENCE_OPSET = 11

#: ``(name, ONNX element type, shape)`` of a parameter.
Param = tuple[str, int, Sequence[int]]


@dataclass(frozen=True)
class PerTensorOptimizer:
    """A per-tensor optimizer model and where each sequence element went.

    Attributes:
        model: The wrapped model (tensor inputs and outputs only).
        inputs: ``(sequence input, index) -> tensor input name``.
        outputs: ``(sequence input, index) -> tensor output name`` for each updated
            sequence (``params``, and the moments the optimizer keeps).
        scalars: The model's tensor inputs (``learning_rate``, ``step``).
    """

    model: onnx.ModelProto
    inputs: dict[tuple[str, int], str]
    outputs: dict[tuple[str, int], str]
    scalars: list[str]


def _element_name(sequence: str, param: str) -> str:
    """The contract's name of ``param``'s element of ``sequence`` (``<sequence>.<param>`` for
    another sequence).
    """
    named = {
        PARAMS: param,
        GRADIENTS: gradient_name(param),
        FIRST_ORDER_MOMENTS: moment_names(param)[0],
        SECOND_ORDER_MOMENTS: moment_names(param)[1],
    }
    return named.get(sequence, f"{sequence}.{param}")


def _fresh(names: NameAuthority, base: str) -> str:
    """``base`` when the graph does not use it yet, else a fresh name built from it (reserved
    either way).
    """
    if names.is_used(base):
        return names.fresh(base)
    names.reserve(base)
    return base


def _tensor(name: str, param: Param) -> ir.Value:
    return ir.Value(
        name=name, type=ir.TensorType(ir.DataType(param[1])), shape=ir.Shape(list(param[2]))
    )


def per_tensor_optimizer(
    model: onnx.ModelProto, params: Sequence[Param], path: str = "optimizer model"
) -> PerTensorOptimizer:
    """Wrap a sequence-based optimizer model into a per-tensor one (``model`` is not changed).

    Args:
        model: The optimizer model: ``learning_rate``, ``step`` and tensor-sequence
            inputs (``params``, ``gradients``, moments), and ``<sequence>.out``
            sequence outputs with the updated values.
        params: ``(name, ONNX element type, shape)`` of each trainable parameter, in
            the order the sequences are built.
        path: The model's file, for error messages.

    Returns:
        The wrapped model with the maps from sequence elements to tensor names.

    Raises:
        ValueError: if the model's sequence outputs do not follow the contract or its
            opset is too old for sequence ops.
    """
    ir_model = from_proto(model)
    graph = ir_model.graph
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))
    if opset < _SEQUENCE_OPSET:
        raise InvalidValueError(
            f"The {path} imports opset {opset} of the default domain; the portable backend needs "
            "opset >= "
            f"{_SEQUENCE_OPSET} (sequence ops). Regenerate the artifacts."
        )
    sequences = [v for v in graph.inputs if isinstance(v.type, ir.SequenceType)]
    scalars = [v for v in graph.inputs if v not in sequences]
    updated = {o.name: o for o in graph.outputs}
    names_in = [str(s.name) for s in sequences]
    missing = [updated_name(s) for s in names_in[:1] if updated_name(s) not in updated]
    if not sequences or missing:
        raise InvalidValueError(
            f"The {path} has sequence inputs {names_in} and outputs {list(updated)}; a portable "
            "optimizer model "
            "takes the parameters as a tensor sequence and returns 'params.out' (see "
            "docs/portable.md). Regenerate "
            "the artifacts with portable=True."
        )
    names = graph_names(graph)
    done = _unwrapped(graph, params, sequences, names) or _wrapped(
        graph, params, sequences, updated, names, opset
    )
    inputs, outputs = done
    return PerTensorOptimizer(to_proto(ir_model), inputs, outputs, [str(v.name) for v in scalars])


Maps = tuple[dict[tuple[str, int], str], dict[tuple[str, int], str]]


def _wrapped(
    graph: ir.Graph,
    params: Sequence[Param],
    sequences: list[ir.Value],
    updated: dict[str | None, ir.Value],
    names: NameAuthority,
    opset: int,
) -> Maps:
    """``SequenceConstruct`` in front of the model and ``SequenceAt`` behind it."""
    w = Writer(names, opset, "per_tensor")
    inputs: dict[tuple[str, int], str] = {}
    outputs: dict[tuple[str, int], str] = {}
    new_inputs: list[ir.Value] = []
    for sequence in sequences:
        name = str(sequence.name)
        elements = []
        for index, param in enumerate(params):
            value = _tensor(_fresh(names, _element_name(name, param[0])), param)
            inputs[(name, index)] = str(value.name)
            elements.append(value)
        new_inputs += elements
        built = w.op("SequenceConstruct", elements, ir.Value(name=names.fresh(f"construct.{name}")))
        ir.convenience.replace_all_uses_with(sequence, built)
    front = list(w.nodes)
    w.nodes.clear()
    new_outputs: list[ir.Value] = []
    for sequence in sequences:
        name = str(sequence.name)
        result = updated.get(updated_name(name))
        if result is None:
            continue  # a sequence the optimizer only reads (SGD's moments)
        for index, param in enumerate(params):
            out = _tensor(_fresh(names, updated_name(_element_name(name, param[0]))), param)
            w.op("SequenceAt", [result, w.const(np.int64(index), suffix="position")], out)
            outputs[(name, index)] = str(out.name)
            new_outputs.append(out)
    scalars = [v for v in graph.inputs if v not in sequences]
    graph.inputs.clear()
    graph.inputs.extend([*scalars, *new_inputs])
    for node, value in zip(
        front, sequences, strict=True
    ):  # the sequences keep their names inside the model
        node.outputs[0].name = value.name
    if len(graph):
        graph.insert_before(graph.node(0), front)
    else:
        graph.extend(front)
    graph.extend(w.nodes)
    graph.outputs.clear()
    graph.outputs.extend(new_outputs)
    return inputs, outputs


def _position(value: ir.Value | None) -> int | None:
    """The scalar integer a constant ``value`` holds, or None."""
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    if (
        tensor is None
        or tensor.dtype not in (ir.DataType.INT64, ir.DataType.INT32)
        or len(tensor.shape) > 1
    ):
        return None
    array = tensor.numpy().reshape(-1)
    return int(array[0]) if array.size == 1 else None


def _unwrapped(
    graph: ir.Graph, params: Sequence[Param], sequences: list[ir.Value], names: NameAuthority
) -> Maps | None:
    """The optimizer with its SequenceAt / SequenceConstruct nodes replaced by tensors, or None
    if it has others.
    """
    count = len(params)
    outputs = set(graph.outputs)
    at: list[tuple[ir.Node, ir.Value, int]] = []  # (node, sequence, element)
    built: list[ir.Node] = []
    for node in graph:
        if any(True for _ in subgraphs(node)):
            return None  # a subgraph might read the sequences
        if node.op_type == "SequenceAt" and node.inputs[0] in sequences:
            position = _position(node.inputs[1])
            if position is None or not -count <= position < count:
                return None
            at.append((node, node.inputs[0], position % count))
        elif any(v in sequences for v in node.inputs):
            return None
        if (
            node.op_type == "SequenceConstruct"
            and node.outputs[0] in outputs
            and len(node.inputs) == count
        ):
            built.append(node)
    if {n.outputs[0] for n in built} != outputs or any(o.uses() for o in outputs):
        return None

    element = {
        (str(s.name), i): _tensor(_fresh(names, _element_name(str(s.name), p[0])), p)
        for s in sequences
        for i, p in enumerate(params)
    }
    results: dict[tuple[str, int], ir.Value] = {}
    w = Writer(names, graph.opset_imports.get("", _SEQUENCE_OPSET), "per_tensor")
    for node in built:
        updated = str(node.outputs[0].name)[: -len(UPDATED_SUFFIX)]
        for i, value in enumerate(node.inputs):
            out = _tensor(
                _fresh(names, updated_name(_element_name(updated, params[i][0]))), params[i]
            )
            results[(updated, i)] = w.op("Identity", [value], out)
    for node, read, index in at:
        ir.convenience.replace_all_uses_with(node.outputs[0], element[(str(read.name), index)])
    graph.outputs.clear()
    graph.remove([n for n, _, _ in at] + built, safe=True)
    graph.extend(w.nodes)
    scalars = [v for v in graph.inputs if v not in sequences]
    graph.inputs.clear()
    graph.inputs.extend([*scalars, *element.values()])
    graph.outputs.extend(results.values())
    remove_unused_nodes(graph)  # the positions the SequenceAt nodes read
    inputs = {key: str(v.name) for key, v in element.items()}
    return inputs, {key: str(v.name) for key, v in results.items()}
