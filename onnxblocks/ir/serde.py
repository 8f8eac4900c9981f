"""Protobuf <-> IR at the boundaries of a graph edit.

Models come in and go out as ``onnx.ModelProto`` (ONNX Runtime's gradient builder,
the files on disk); in between they are ``ir.Model``. Tensors are not copied:
an inline initializer stays backed by its TensorProto, and a held weight stub
(``onnxblocks-held://`` location) or an external tensor stays an
``ir.ExternalTensor`` whose bytes are never read here. A model onnx-ir cannot read
(:mod:`onnxblocks.ir.wellformed`) is refused with an error naming its offenders.
"""

from __future__ import annotations

import os

import onnx
import onnx_ir as ir

from onnxblocks.ir import wellformed
from onnxblocks.ir.proto import replace_field


def from_proto(model: onnx.ModelProto, source: str | os.PathLike | None = None) -> ir.Model:
    """The IR of ``model`` (``model`` is not changed; its tensors are shared, not copied).

    Args:
        model: The model.
        source: The file it was read from, for an error's message.

    Raises:
        InvalidValueError: for a model onnx-ir cannot read (a value defined twice...),
            naming the value, the node and ``source``.
    """
    try:
        return ir.serde.deserialize_model(model)
    except ir.serde.SerdeError as exc:
        raise wellformed.unreadable(model, exc, source) from exc


def to_proto(model: ir.Model, initializer_types: bool = True) -> onnx.ModelProto:
    """``model`` as a ModelProto (inline tensors are serialized; external ones keep their
    locations).

    Args:
        model: The model.
        initializer_types: False to leave out the ``value_info`` entries onnx-ir writes for
            initializers (their tensors say their types), as a model read from a file had them.
    """
    proto = ir.serde.serialize_model(model)
    if not initializer_types:
        graph = proto.graph
        names = {init.name for init in graph.initializer}
        if any(vi.name in names for vi in graph.value_info):
            replace_field(graph.value_info, [vi for vi in graph.value_info if vi.name not in names])
    return proto


def graph_from_proto(graph: onnx.GraphProto) -> ir.Graph:
    """The IR of one graph.

    Raises:
        InvalidValueError: for a graph onnx-ir cannot read, naming the value and the node.
    """
    try:
        return ir.serde.deserialize_graph(graph)
    except ir.serde.SerdeError as exc:
        raise wellformed.unreadable(onnx.helper.make_model(graph), exc, None) from exc
