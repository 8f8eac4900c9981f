"""Which integer inputs of a model are indices, and the values each may hold.

An index input is an integer graph input that reaches, through reshapes, casts and
``Where``, the label input of ``SoftmaxCrossEntropyLoss`` / ``NegativeLogLikelihoodLoss``
(classes: axis 1 of the scores) or the indices of ``GatherElements`` (valid:
``[0, size)``, as ``torch.gather``) or ``Gather`` (valid: ``[-size, size)``, as ONNX).
A loss's ``ignore_index`` (the attribute of the fused losses, or the
``Where(Equal(labels, c))`` masking of the composed ones) is allowed besides.
:func:`index_rules` reads them from the model; the batch guards
(:mod:`onnxblocks.runtime.guards`) check each batch against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: Ops an index passes through unchanged in value (the input positions it may come in at).
_PASS_THROUGH = {
    "Identity": (0,),
    "Reshape": (0,),
    "Flatten": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Expand": (0,),
    "Transpose": (0,),
    "Slice": (0,),
    "Tile": (0,),
    "Cast": (0,),
    "Where": (1, 2),
}
_INTEGER_TYPES = {
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
}
_LOSSES = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")


@dataclass(frozen=True)
class IndexRule:
    """The values an index input may hold.

    Attributes:
        input: The graph input.
        low: Smallest valid value, or None (any negative value is valid: the size is unknown).
        high: One past the largest valid value, or None when the size is unknown.
        allowed: Values valid besides (a loss's ``ignore_index``).
        what: What the values index, for messages (``"the 3 classes of 'logits' (axis 1)
            in SoftmaxCrossEntropyLoss node 'loss'"``).
    """

    input: str
    low: int | None
    high: int | None
    allowed: frozenset[int]
    what: str


class _Shapes:
    """Element types and shapes of a model's values, from its declarations, then from shape
    inference if needed.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self._known = self._read(model)
        self._inferred = False

    @staticmethod
    def _read(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | None, ...] | None]]:
        known: dict[str, tuple[int, tuple[int | None, ...] | None]] = {}
        for init in model.graph.initializer:
            known[init.name] = (init.data_type, tuple(init.dims))
        for vi in (*model.graph.value_info, *model.graph.output, *model.graph.input):
            tensor = vi.type.tensor_type
            dims = None
            if tensor.HasField("shape"):
                dims = tuple(
                    d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim
                )
            known[vi.name] = (tensor.elem_type, dims)
        return known

    def dims(self, name: str) -> tuple[int | None, ...] | None:
        found = self._known.get(name)
        if (found is None or found[1] is None) and not self._inferred:
            self._inferred = True
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
            except Exception:  # a model onnx cannot infer: sizes stay unknown
                return None
            self._known = {**self._read(inferred), **self._known}
            found = self._known.get(name)
        return None if found is None else found[1]

    def elem_type(self, name: str) -> int:
        found = self._known.get(name)
        return 0 if found is None else found[0]


def _constant_int(model_constants: dict[str, np.ndarray], name: str) -> int | None:
    value = model_constants.get(name)
    if value is None or value.size != 1 or value.dtype.kind not in "iu":
        return None
    return int(value.reshape(()))


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {
        init.name: numpy_helper.to_array(init)
        for init in model.graph.initializer
        if init.dims in ([], [1])
    }
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.attribute:
            attr = node.attribute[0]
            if (
                attr.name == "value"
                and attr.t.data_type in _INTEGER_TYPES
                and len(attr.t.dims) <= 1
            ):
                out[node.output[0]] = numpy_helper.to_array(attr.t)
            elif attr.name in ("value_int", "value_ints"):
                out[node.output[0]] = np.asarray(helper.get_attribute_value(attr), dtype=np.int64)
    return out


def _masked_value(
    producers: dict[str, onnx.NodeProto],
    constants: dict[str, np.ndarray],
    node: onnx.NodeProto,
    position: int,
    traced: set[str],
) -> int | None:
    """For ``Where(cond, a, b)`` reached at ``position``: the value ``c`` that ``cond`` replaces
    (``labels == c``).
    """
    cond, negated = node.input[0], False
    while cond in producers and producers[cond].op_type == "Not":
        cond, negated = producers[cond].input[0], not negated
    equal = producers.get(cond)
    if equal is None or equal.op_type != "Equal" or len(equal.input) != 2:
        return None
    a, b = equal.input
    value = (
        _constant_int(constants, b)
        if a in traced
        else _constant_int(constants, a)
        if b in traced
        else None
    )
    # Where keeps input 1 where cond holds: the masked value is replaced when it selects input 2
    # there.
    replaced = (position == 1 and negated) or (position == 2 and not negated)
    return value if replaced else None


def index_rules(model: onnx.ModelProto, inputs: Sequence[str]) -> list[IndexRule]:
    """The index rules of the integer graph inputs ``inputs`` of ``model`` (see the module
    docstring).
    """
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    producers: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, position))
        for name in node.output:
            producers[name] = node
    shapes = _Shapes(model)
    constants: dict[str, np.ndarray] | None = None
    rules: list[IndexRule] = []
    for graph_input in inputs:
        if shapes.elem_type(graph_input) not in _INTEGER_TYPES:
            continue
        traced = {graph_input}
        stack: list[tuple[str, frozenset[int]]] = [(graph_input, frozenset())]
        seen: set[tuple[str, frozenset[int]]] = set()
        while stack:
            value, allowed = stack.pop()
            if (value, allowed) in seen:
                continue
            seen.add((value, allowed))
            for node, position in consumers.get(value, []):
                if node.domain not in ("", "ai.onnx"):
                    continue
                rule = _rule_of(node, position, graph_input, allowed, shapes)
                if rule is not None:
                    rules.append(rule)
                    continue
                if position not in _PASS_THROUGH.get(node.op_type, ()):
                    continue
                if (
                    node.op_type == "Cast"
                    and helper.get_node_attr_value(node, "to") not in _INTEGER_TYPES
                ):
                    continue
                more = allowed
                if node.op_type == "Where":
                    constants = _constants(model) if constants is None else constants
                    masked = _masked_value(producers, constants, node, position, traced)
                    more = allowed | {masked} if masked is not None else allowed
                traced.update(node.output[:1])
                stack.append((node.output[0], more))
    return rules


def _rule_of(
    node: onnx.NodeProto, position: int, graph_input: str, allowed: frozenset[int], shapes: _Shapes
) -> IndexRule | None:
    """The rule a consumer sets on the index reaching it at ``position``, or None when it is not
    an indexer.
    """
    label = node.name or node.output[0]
    if node.op_type in _LOSSES and position == 1:
        axis, data, signed = 1, node.input[0], False
        ignore = next((a.i for a in node.attribute if a.name == "ignore_index"), None)
        if ignore is not None:
            allowed = allowed | {ignore}
        noun = "classes"
    elif node.op_type in ("GatherElements", "Gather") and position == 1:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        data, signed, noun = node.input[0], node.op_type == "Gather", "entries"
    else:
        return None
    dims = shapes.dims(data)
    size = None
    if dims is not None and -len(dims) <= axis < len(dims):
        size = dims[axis % len(dims)] or None
        axis %= len(dims)
    count = f"the {size} {noun}" if size is not None else f"the {noun}"
    what = f"{count} of '{data}' (axis {axis}) in {node.op_type} node '{label}'"
    low = (-size if size is not None else None) if signed else 0
    return IndexRule(graph_input, low, size, allowed, what)
