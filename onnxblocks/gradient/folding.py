"""Constant folding for the gradient passes.

The values of Constant nodes, inline initializers and foldable subgraphs (shape
arithmetic), evaluated with onnx's reference evaluator.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnxblocks._core import weights as _weights
from onnxblocks.gradient._values import int_attribute, shape_of

#: Ops :meth:`ConstantTable.folded` evaluates when all their inputs are constants (index arithmetic).
_FOLDABLE = frozenset(
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
_FOLD_LIMIT = 4096


class ConstantTable:
    """Values of a graph's Constant nodes and inline initializers, by name (indexed once)."""

    def __init__(
        self, graph: onnx.GraphProto, opset: int | None = None, types: dict[str, onnx.TypeProto] | None = None
    ) -> None:
        self._initializers = {i.name: i for i in graph.initializer}
        self._constants = {
            n.output[0]: n for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output
        }
        self._producers = {o: n for n in graph.node for o in n.output if o}
        self._opset = opset
        self._types = types or {}
        self._folded: dict[str, np.ndarray | None] = {}

    def value(self, name: str) -> np.ndarray | None:
        """The value of ``name``, or None when it is not a known constant (held weights included)."""
        init = self._initializers.get(name)
        if init is not None:
            if _weights.is_stub(init) or init.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return numpy_helper.to_array(init)
        node = self._constants.get(name)
        if node is None:
            return None
        for attr in node.attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
            if attr.name == "value_int":
                return np.array(attr.i, dtype=np.int64)
            if attr.name == "value_ints":
                return np.array(list(attr.ints), dtype=np.int64)
            if attr.name == "value_float":
                return np.array(attr.f, dtype=np.float32)
            if attr.name == "value_floats":
                return np.array(list(attr.floats), dtype=np.float32)
        return None

    def folded(self, name: str, depth: int = 0) -> np.ndarray | None:
        """The value of ``name``, also when small index arithmetic on constants computes it, else None.

        The torchscript exporter without constant folding computes pads, scales and
        shapes with Concat / Cast / Slice... of Constants; onnx's reference evaluator
        runs those nodes (results up to 4096 elements).
        """
        direct = self.value(name)
        if direct is not None or self._opset is None:
            return direct
        if name in self._folded:
            return self._folded[name]
        self._folded[name] = None  # also guards cycles
        node = self._producers.get(name)
        if node is not None and node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
            self._folded[name] = self._static_shape(node)
            return self._folded[name]
        if node is None or node.op_type not in _FOLDABLE or node.domain not in ("", "ai.onnx") or depth > 24:
            return None
        inputs = [self.folded(i, depth + 1) if i else None for i in node.input]
        feeds = {i: v for i, v in zip(node.input, inputs, strict=True) if i and v is not None}
        if any(i and i not in feeds for i in node.input):
            return None
        try:
            from onnx.reference import ReferenceEvaluator

            graph = onnx.helper.make_graph(
                [node],
                "fold",
                [
                    onnx.helper.make_tensor_value_info(
                        i, onnx.helper.np_dtype_to_tensor_dtype(feeds[i].dtype), feeds[i].shape
                    )
                    for i in node.input
                    if i
                ],
                [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o],
            )
            model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", self._opset)])
            results = ReferenceEvaluator(model).run(None, feeds)
        except Exception:
            return None
        for output, result in zip([o for o in node.output if o], results, strict=False):
            array = np.asarray(result)
            self._folded[output] = array if array.size <= _FOLD_LIMIT else None
        return self._folded.get(name)

    def _static_shape(self, node: onnx.NodeProto) -> np.ndarray | None:
        """``Shape(x)`` when the (sliced) shape of ``x`` is static in the inferred types (or x is a folded constant)."""
        known = self.folded(node.input[0]) if node.input[0] in self._producers else self.value(node.input[0])
        dims = list(known.shape) if known is not None else shape_of(self._types, node.input[0])
        if dims is None:
            return None
        dims = _shape_slice(node, dims)
        if any(d is None for d in dims):
            return None
        return np.array(dims, dtype=np.int64)


def _shape_slice(node: onnx.NodeProto, dims: list[int | None]) -> list[int | None]:
    start = int_attribute(node, "start", 0)
    end = int_attribute(node, "end", None)
    return dims[start:] if end is None else dims[start:end]
