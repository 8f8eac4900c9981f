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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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

#: Sequence ops (SequenceConstruct, SequenceAt) exist from this opset of the default domain on.
_SEQUENCE_OPSET = 11


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
    """The contract's name of ``param``'s element of ``sequence`` (``<sequence>.<param>`` for another sequence)."""
    named = {
        PARAMS: param,
        GRADIENTS: gradient_name(param),
        FIRST_ORDER_MOMENTS: moment_names(param)[0],
        SECOND_ORDER_MOMENTS: moment_names(param)[1],
    }
    return named.get(sequence, f"{sequence}.{param}")


def _all_names(graph: onnx.GraphProto) -> Iterator[str]:
    for value in (*graph.input, *graph.output, *graph.value_info):
        yield value.name
    for init in graph.initializer:
        yield init.name
    for node in graph.node:
        yield from node.input
        yield from node.output
        for attr in node.attribute:
            for sub in (attr.g, *attr.graphs) if attr.HasField("g") or attr.graphs else ():
                yield from _all_names(sub)


def per_tensor_optimizer(
    model: onnx.ModelProto, params: Sequence[tuple[str, int, Sequence[int]]], path: str = "optimizer model"
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
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < _SEQUENCE_OPSET:
        raise ValueError(
            f"The {path} imports opset {opset} of the default domain; the portable backend needs opset >= "
            f"{_SEQUENCE_OPSET} (sequence ops). Regenerate the artifacts."
        )
    sequences = [i.name for i in graph.input if i.type.WhichOneof("value") == "sequence_type"]
    scalars = [i.name for i in graph.input if i.name not in sequences]
    updated = {o.name: o for o in graph.output}
    missing = [updated_name(s) for s in sequences[:1] if updated_name(s) not in updated]
    if not sequences or missing:
        raise ValueError(
            f"The {path} has sequence inputs {sequences} and outputs {list(updated)}; a portable optimizer model "
            "takes the parameters as a tensor sequence and returns 'params.out' (see docs/portable.md). Regenerate "
            "the artifacts with portable=True."
        )
    taken = set(_all_names(graph))
    direct = _unwrapped(model, params, sequences, scalars, taken)
    if direct is not None:
        return direct

    fresh = _namer(taken)

    wrapped = onnx.ModelProto()
    wrapped.CopyFrom(model)
    body = wrapped.graph
    del body.input[:]
    del body.output[:]
    body.input.extend(i for i in graph.input if i.name in scalars)
    inputs: dict[tuple[str, int], str] = {}
    outputs: dict[tuple[str, int], str] = {}
    front, back, positions = [], [], []
    for index in range(len(params)):
        position = fresh(f"onnxblocks.position.{index}")
        positions.append(numpy_helper.from_array(np.array(index, np.int64), position))
    for sequence in sequences:
        names = []
        for index, (param, elem, shape) in enumerate(params):
            name = inputs[(sequence, index)] = fresh(_element_name(sequence, param))
            body.input.append(helper.make_tensor_value_info(name, elem, list(shape)))
            names.append(name)
        front.append(helper.make_node("SequenceConstruct", names, [sequence], name=fresh(f"construct.{sequence}")))
        result = updated_name(sequence)
        if result not in updated:
            continue  # a sequence the optimizer only reads (SGD's moments)
        for index, (param, elem, shape) in enumerate(params):
            name = outputs[(sequence, index)] = fresh(updated_name(_element_name(sequence, param)))
            back.append(
                helper.make_node("SequenceAt", [result, positions[index].name], [name], name=fresh(f"at.{name}"))
            )
            body.output.append(helper.make_tensor_value_info(name, elem, list(shape)))
    nodes = [*front, *graph.node, *back]
    del body.node[:]
    body.node.extend(nodes)
    body.initializer.extend(positions)
    return PerTensorOptimizer(wrapped, inputs, outputs, scalars)


def _constant_positions(graph: onnx.GraphProto) -> dict[str, int]:
    """Scalar integer constants of the graph (initializers and ``Constant`` nodes), by name."""
    out = {}
    tensors = [(t.name, t) for t in graph.initializer]
    tensors += [(n.output[0], n.attribute[0].t) for n in graph.node if n.op_type == "Constant" and n.attribute]
    for name, tensor in tensors:
        if tensor.data_type in (TensorProto.INT64, TensorProto.INT32) and len(tensor.dims) <= 1:
            value = numpy_helper.to_array(tensor).reshape(-1)
            if value.size == 1:
                out[name] = int(value[0])
    return out


def _unwrapped(
    model: onnx.ModelProto,
    params: Sequence[tuple[str, int, Sequence[int]]],
    sequences: list[str],
    scalars: list[str],
    taken: set[str],
) -> PerTensorOptimizer | None:
    """The optimizer with its SequenceAt / SequenceConstruct nodes replaced by tensors, or None if it has others."""
    graph, count = model.graph, len(params)
    positions = _constant_positions(graph)
    outputs = {o.name for o in graph.output}
    at: dict[int, tuple[str, int]] = {}  # node index -> (sequence, element)
    built: dict[int, str] = {}  # node index -> the sequence output it builds
    for index, node in enumerate(graph.node):
        if any(a.HasField("g") or a.graphs for a in node.attribute):
            return None  # a subgraph might read the sequences
        if node.op_type == "SequenceAt" and node.input[0] in sequences:
            position = positions.get(node.input[1])
            if position is None or not -count <= position < count:
                return None
            at[index] = (node.input[0], position % count)
        elif any(name in sequences for name in node.input):
            return None
        if node.op_type == "SequenceConstruct" and node.output[0] in outputs and len(node.input) == count:
            built[index] = node.output[0]
    consumed = {name for node in graph.node for name in node.input}
    if set(built.values()) != outputs or outputs & consumed:
        return None

    fresh = _namer(taken)

    inputs = {(s, i): fresh(_element_name(s, p)) for s in sequences for i, (p, _, _) in enumerate(params)}
    result = {
        (o[: -len(UPDATED_SUFFIX)], i): fresh(updated_name(_element_name(o[: -len(UPDATED_SUFFIX)], p)))
        for o in outputs
        for i, (p, _, _) in enumerate(params)
    }
    nodes = []
    for index, node in enumerate(graph.node):
        if index in at:
            nodes.append(helper.make_node("Identity", [inputs[at[index]]], [node.output[0]], name=node.name))
        elif index in built:
            sequence = built[index][: -len(UPDATED_SUFFIX)]
            for i, value in enumerate(node.input):
                nodes.append(helper.make_node("Identity", [value], [result[(sequence, i)]], name=fresh(f"out.{value}")))
        else:
            nodes.append(node)
    wrapped = onnx.ModelProto()
    wrapped.CopyFrom(model)
    body = wrapped.graph
    del body.input[:], body.output[:], body.node[:]
    body.input.extend(i for i in graph.input if i.name in scalars)
    for (_, i), name in inputs.items():
        body.input.append(helper.make_tensor_value_info(name, params[i][1], list(params[i][2])))
    for (_, i), name in result.items():
        body.output.append(helper.make_tensor_value_info(name, params[i][1], list(params[i][2])))
    body.node.extend(nodes)
    gone = {*sequences, *outputs}
    kept = [v for v in graph.value_info if v.name not in gone]
    del body.value_info[:]
    body.value_info.extend(kept)
    return PerTensorOptimizer(wrapped, inputs, result, scalars)


def _namer(taken: set[str]) -> Callable[[str], str]:
    """A name maker: ``base`` when it is free, else ``base_1``, ``base_2`` ... (each reserved in ``taken``)."""

    def fresh(base: str) -> str:
        name, n = base, 0
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        return name

    return fresh
