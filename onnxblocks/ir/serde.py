"""Protobuf <-> IR at the boundaries of a graph edit.

Models come in and go out as ``onnx.ModelProto`` (ONNX Runtime's gradient builder,
the files on disk); in between they are ``ir.Model``. Tensors are not copied:
an inline initializer stays backed by its TensorProto, and a held weight stub
(``onnxblocks-held://`` location) or an external tensor stays an
``ir.ExternalTensor`` whose bytes are never read here.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir


def from_proto(model: onnx.ModelProto) -> ir.Model:
    """The IR of ``model`` (``model`` is not changed; its tensors are shared, not copied)."""
    return ir.serde.deserialize_model(model)


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """``model`` as a ModelProto (inline tensors are serialized; external ones keep their locations)."""
    return ir.serde.serialize_model(model)


def graph_from_proto(graph: onnx.GraphProto) -> ir.Graph:
    """The IR of one graph."""
    return ir.serde.deserialize_graph(graph)
