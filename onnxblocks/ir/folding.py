"""Constant values of a graph, and small index arithmetic on them folded with onnx's reference
evaluator.

The torchscript exporter without constant folding computes pads, scales and
shapes with ``Concat`` / ``Cast`` / ``Slice``... of ``Constant`` s; passes read
those values here without changing the graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.ir.attributes import int_attribute
from onnxblocks.ir.types import ValueTypes

#: Ops :meth:`ConstantTable.folded` evaluates when all their inputs are constants (index
#: arithmetic).
FOLDABLE = frozenset(
    {
        "Constant",
        "ConstantOfShape",
        "Concat",
        "Cast",
        "Unsqueeze",
        "Squeeze",
        "Slice",
        "Reshape",
        "Transpose",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Gather",
        "Identity",
        "Range",
        "Expand",
        "Flatten",
        "Min",
        "Max",
        "Abs",
        "Floor",
        "Ceil",
        "Sqrt",
    }
)
#: Largest result (elements) folding produces.
FOLD_LIMIT = 4096


def _default_domain(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _fold_unsqueeze(node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
    x = inputs[0]
    axes_value = inputs[1] if len(inputs) > 1 else None
    axes = (
        [int(a) for a in axes_value.reshape(-1)]
        if axes_value is not None
        else node.attributes.get_ints("axes")
    )
    if x is None or axes is None:
        return None
    rank = x.ndim + len(axes)
    normalized = sorted(a + rank if a < 0 else a for a in axes)
    if len(set(normalized)) != len(normalized) or any(not 0 <= a < rank for a in normalized):
        return None
    for axis in normalized:
        x = np.expand_dims(x, axis)
    return [x]


def _fold_identity(node: ir.Node, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
    return [inputs[0]] if inputs and inputs[0] is not None else None


#: Ops folded with numpy, without onnx's reference evaluator (the common index arithmetic of
#: exporters).
_NUMPY_FOLDS = {"Unsqueeze": _fold_unsqueeze, "Identity": _fold_identity}


class ConstantTable:
    """The values of a graph's Constant nodes and inline initializers, and what folds from them.

    Args:
        graph: The graph whose values are read (subgraph values are not constants here).
        opset: The default-domain opset to fold at; None: no folding, plain constants only.
        types: Inferred types, for ``Shape`` of a value whose shape is static.
    """

    def __init__(
        self, graph: ir.Graph, opset: int | None = None, types: ValueTypes | None = None
    ) -> None:
        self._graph = graph
        self._opset = opset
        self._types = types
        self._folded: dict[ir.Value, np.ndarray | None] = {}

    def value(self, value: ir.Value | None) -> np.ndarray | None:
        """The value of ``value``, or None when it is not a known constant (held and external
        weights included).
        """
        if value is None:
            return None
        if value.is_initializer() and value.graph is self._graph:
            tensor = value.const_value
            if tensor is None or isinstance(tensor, ir.ExternalTensor):
                return None
            return tensor.numpy()
        node = value.producer()
        if (
            node is None
            or node.op_type != "Constant"
            or not _default_domain(node)
            or node.graph is not self._graph
        ):
            return None
        if node.outputs[0] is not value:
            return None
        for name, attr in node.attributes.items():
            if name == "value":
                return attr.as_tensor().numpy()
            if name == "value_int":
                return np.array(attr.as_int(), dtype=np.int64)
            if name == "value_ints":
                return np.array(list(attr.as_ints()), dtype=np.int64)
            if name == "value_float":
                return np.array(attr.as_float(), dtype=np.float32)
            if name == "value_floats":
                return np.array(list(attr.as_floats()), dtype=np.float32)
        return None

    def folded(self, value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
        """The value of ``value``, also when small index arithmetic on constants computes it, else
        None.

        Results up to :data:`FOLD_LIMIT` elements; ``Shape`` of a value whose
        (sliced) shape is static folds too.
        """
        direct = self.value(value)
        if direct is not None or self._opset is None or value is None:
            return direct
        if value in self._folded:
            return self._folded[value]
        self._folded[value] = None  # also guards cycles
        node = value.producer()
        if node is None or node.graph is not self._graph:
            return None
        if node.op_type == "Shape" and _default_domain(node):
            self._folded[value] = self._static_shape(node)
            return self._folded[value]
        if node.op_type not in FOLDABLE or not _default_domain(node) or depth > 24:
            return None
        inputs = [self.folded(i, depth + 1) if i is not None else None for i in node.inputs]
        if any(i is not None and v is None for i, v in zip(node.inputs, inputs, strict=True)):
            return None
        fast = _NUMPY_FOLDS.get(node.op_type)
        results = fast(node, inputs) if fast is not None else None
        if results is None:
            results = self._evaluate(node, inputs)
        if results is None:
            return None
        for output, result in zip(node.outputs, results, strict=False):
            array = np.asarray(result)
            self._folded[output] = array if array.size <= FOLD_LIMIT else None
        return self._folded.get(value)

    def _evaluate(self, node: ir.Node, inputs: list[np.ndarray | None]) -> list | None:
        """``node`` run by onnx's reference evaluator on ``inputs``, or None when it fails."""
        try:
            from onnx.reference import ReferenceEvaluator

            proto = ir.serde.serialize_node(node)
            names = [f"in{k}" if v is not None else "" for k, v in enumerate(inputs)]
            outs = [f"out{k}" for k in range(len(node.outputs))]
            del proto.input[:]
            proto.input.extend(names)
            del proto.output[:]
            proto.output.extend(outs)
            feeds = {n: v for n, v in zip(names, inputs, strict=True) if n and v is not None}
            graph = onnx.helper.make_graph(
                [proto],
                "fold",
                [
                    onnx.helper.make_tensor_value_info(
                        n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape
                    )
                    for n, v in feeds.items()
                ],
                [
                    onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                    for o in outs
                ],
            )
            model = onnx.helper.make_model(
                graph, opset_imports=[onnx.helper.make_opsetid("", self._opset or 13)]
            )
            return list(ReferenceEvaluator(model).run(None, feeds))
        except Exception:
            return None

    def _static_shape(self, node: ir.Node) -> np.ndarray | None:
        """``Shape(x)`` when the (sliced) shape of ``x`` is static in the inferred types (or x
        folds).
        """
        x = node.inputs[0]
        if x is None:
            return None
        known = self.folded(x) if x.producer() is not None else self.value(x)
        dims = (
            list(known.shape)
            if known is not None
            else (self._types.shape(x) if self._types else None)
        )
        if dims is None:
            return None
        start = int_attribute(node, "start", 0)
        end = int_attribute(node, "end", None)
        dims = dims[start:] if end is None else dims[start:end]
        if any(d is None for d in dims):
            return None
        return np.array(dims, dtype=np.int64)
