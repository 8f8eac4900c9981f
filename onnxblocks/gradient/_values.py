"""Reading a protobuf graph's values around ONNX Runtime's gradient builder: inferred types, shapes,
element types; setting a node attribute.
"""

from __future__ import annotations

import onnx


def infer_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of the values of ``model`` from onnx shape inference (best effort, no weight bytes
    read).

    Data propagation is on: shapes computed with ``Shape`` / ``Concat`` / ``Gather``
    (as the exporters and the passes write ``Reshape`` targets) stay known. The same
    inference as :func:`onnxblocks.ir.types.infer_proto_types`, which it is.
    """
    from onnxblocks.ir.types import infer_proto_types

    return infer_proto_types(model)


def shape_of(types: dict[str, onnx.TypeProto], name: str) -> list[int | None] | None:
    """Static dims of a tensor value (None for a symbolic or unknown dim), or None for an unknown
    rank.
    """
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.WhichOneof("value") == "dim_value" else None
        for d in t.tensor_type.shape.dim
    ]


def elem_type(types: dict[str, onnx.TypeProto], name: str) -> int | None:
    """Element type of a tensor value, or None if unknown."""
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type":
        return None
    return t.tensor_type.elem_type or None


def set_attribute(node: onnx.NodeProto, name: str, value: object) -> None:
    """Set (or replace) a node attribute."""
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))
