"""Reading a graph's values for the gradient passes: inferred types, shapes, element types, node attributes."""

from __future__ import annotations

import onnx


def infer_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of the values of ``model`` from onnx shape inference (best effort, no weight bytes read).

    Data propagation is on: shapes computed with ``Shape`` / ``Concat`` / ``Gather``
    (as the exporters and the passes write ``Reshape`` targets) stay known.
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
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    return types


def shape_of(types: dict[str, onnx.TypeProto], name: str) -> list[int | None] | None:
    """Static dims of a tensor value (None for a symbolic or unknown dim), or None for an unknown rank."""
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in t.tensor_type.shape.dim]


def elem_type(types: dict[str, onnx.TypeProto], name: str) -> int | None:
    """Element type of a tensor value, or None if unknown."""
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type":
        return None
    return t.tensor_type.elem_type or None


def attribute(node: onnx.NodeProto, name: str, default: object = None) -> object:
    """The value of a node attribute, or ``default``."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def set_attribute(node: onnx.NodeProto, name: str, value: object) -> None:
    """Set (or replace) a node attribute."""
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))
