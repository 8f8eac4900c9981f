"""Element types and shapes of a graph's values, from onnx shape inference, without changing the
graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.ir.serde import to_proto


def infer_proto_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The type of every value of ``model``'s top-level graph that onnx shape inference knows, by
    name.

    Best effort: data propagation is on (shapes computed with ``Shape`` / ``Concat``
    / ``Gather`` stay known); when inference fails, the types the model declares.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:
            inferred = model
    g = inferred.graph
    types = {vi.name: vi.type for vi in list(g.value_info) + list(g.input) + list(g.output)}
    for init in g.initializer:
        types.setdefault(
            init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
        )
    return types


class ValueTypes:
    """The inferred element type and shape of each value of one graph, looked up by value.

    The graph is not changed: the types live here, not on the values. A value
    inference knows nothing of falls back to the type and shape the graph declares.
    """

    def __init__(self, types: dict[str, onnx.TypeProto]) -> None:
        self._types = types

    @classmethod
    def infer(cls, model: ir.Model) -> ValueTypes:
        """The types of ``model``'s top-level values (the model is serialized once for onnx's
        inference).
        """
        return cls(infer_proto_types(to_proto(model)))

    def _tensor(self, value: ir.Value) -> onnx.TypeProto.Tensor | None:
        t = self._types.get(value.name or "")
        if t is None or t.WhichOneof("value") != "tensor_type":
            return None
        return t.tensor_type

    def elem(self, value: ir.Value | None) -> int | None:
        """The ONNX element type (``onnx.TensorProto.FLOAT``...) of ``value``, or None when
        unknown.
        """
        if value is None:
            return None
        t = self._tensor(value)
        if t is not None and t.elem_type:
            return int(t.elem_type)
        if isinstance(value.type, ir.TensorType) and value.type.dtype != ir.DataType.UNDEFINED:
            return int(value.type.dtype)
        return None

    def dtype(self, value: ir.Value | None) -> np.dtype | None:
        """The numpy dtype of ``value``, or None when its element type is unknown."""
        elem = self.elem(value)
        return None if elem is None else onnx.helper.tensor_dtype_to_np_dtype(elem)

    def shape(self, value: ir.Value | None) -> list[int | None] | None:
        """Static dims of ``value`` (None for a symbolic or unknown dim), or None for an unknown
        rank.
        """
        if value is None:
            return None
        t = self._tensor(value)
        if t is not None and t.HasField("shape"):
            return [
                d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in t.shape.dim
            ]
        if t is None and value.shape is not None:
            return [d if isinstance(d, int) else None for d in value.shape]
        return None

    def dims(self, value: ir.Value | None) -> list[int | str | None] | None:
        """Dims of ``value``: an int when static, the symbol's name when symbolic, None when
        unknown.

        Two dims of one name are equal: inference carries the names through ``Shape`` and its
        arithmetic.
        """
        t = self._tensor(value) if value is not None else None
        if t is None or not t.HasField("shape"):
            shape = self.shape(value)
            return None if shape is None else [d for d in shape]
        kinds = [d.WhichOneof("value") for d in t.shape.dim]
        return [
            d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None
            for d, kind in zip(t.shape.dim, kinds, strict=True)
        ]


def static_dims(dims: list[int | None] | None) -> list[int] | None:
    """``dims`` when every one is static, else None."""
    if dims is None:
        return None
    static = [d for d in dims if d is not None]
    return static if len(static) == len(dims) else None
