"""Loading an ``.onnx`` file without reading the bytes of its large inline initializers.

:func:`load_structure` turns every large ``raw_data`` field into an external-data
reference into the ``.onnx`` file itself, so that a build holds those tensors
as :class:`~onnxblocks._core.weights.TensorSource` objects that read from disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx

from onnxblocks._core.errors import InvalidValueError

# Protobuf field numbers (onnx.proto) and wire types used by load_structure().
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def load_structure(path: str | os.PathLike, threshold: int) -> onnx.ModelProto:
    """Load an ``.onnx`` file without reading the bytes of its large inline initializers.

    ``onnx.load`` parses the whole file, weights included. This reads only the
    model's structure: every initializer whose ``raw_data`` has at least
    ``threshold`` bytes comes back as an
    external-data tensor whose ``location`` is the ``.onnx`` file itself, with
    the ``offset`` and ``length`` of its bytes there. Tensors that already use
    external data files keep their locations. Locations are relative to the
    file's directory, so ``base(model, model_path=path)`` holds every such
    tensor as a :class:`TensorSource` that reads straight from disk.

    The cost is O(graph structure): the weights are skipped, not read.

    Args:
        path: The ``.onnx`` file.
        threshold: Smallest ``raw_data`` size (bytes) left in the file.

    Returns:
        The model, with large inline initializers turned into references into ``path``.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is not a valid protobuf-encoded ModelProto.
    """
    import mmap

    path = Path(os.fspath(path))
    limit = threshold
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise InvalidValueError(f"'{path}' is empty; it is not an ONNX model.")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                blob = _rewrite_model(data, path.name, limit)
            except (IndexError, ValueError) as exc:
                raise InvalidValueError(
                    f"'{path}' is not a valid ONNX model file ({exc}). Check that the file is "
                    "complete."
                ) from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(blob)
    except Exception as exc:  # protobuf raises DecodeError and others
        raise InvalidValueError(f"'{path}' is not a valid ONNX model file ({exc}).") from None
    return model


def _varint(data: Any, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise InvalidValueError("malformed varint")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(data: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield ``(field, wire_type, field_start, payload_start, field_end)`` for each field in
    ``data[start:end]``.
    """
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, pos = _varint(data, pos)
            payload = pos
        elif wire == _FIXED64:
            payload, pos = pos, pos + 8
        elif wire == _FIXED32:
            payload, pos = pos, pos + 4
        elif wire == _LENGTH:
            length, payload = _varint(data, pos)
            pos = payload + length
        else:
            raise InvalidValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise InvalidValueError("truncated protobuf field")
        yield field, wire, field_start, payload, pos


def _length_field(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | _LENGTH) + _encode_varint(len(payload)) + payload


def _rewrite_model(data: Any, location: str, limit: int) -> bytes:
    out = bytearray()
    for field, wire, start, payload, end in _fields(data, 0, len(data)):
        if field == _MODEL_GRAPH and wire == _LENGTH:
            out += _length_field(field, _rewrite_graph(data, payload, end, location, limit))
        else:
            out += data[start:end]
    return bytes(out)


def _rewrite_graph(data: Any, start: int, end: int, location: str, limit: int) -> bytes:
    out = bytearray()
    for field, wire, f_start, payload, f_end in _fields(data, start, end):
        if field == _GRAPH_INITIALIZER and wire == _LENGTH:
            out += _length_field(field, _rewrite_tensor(data, payload, f_end, location, limit))
        else:
            out += data[f_start:f_end]
    return bytes(out)


def _rewrite_tensor(data: Any, start: int, end: int, location: str, limit: int) -> bytes:
    raw: tuple[int, int] | None = None
    kept = bytearray()
    for field, wire, f_start, payload, f_end in _fields(data, start, end):
        if field == _TENSOR_RAW_DATA and wire == _LENGTH:
            raw = (payload, f_end - payload)
            continue
        kept += data[f_start:f_end]
    if raw is None or raw[1] < limit:
        return bytes(data[start:end])
    offset, length = raw
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = _length_field(1, key.encode()) + _length_field(2, value.encode())
        kept += _length_field(_TENSOR_EXTERNAL_DATA, entry)
    kept += _encode_varint(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _encode_varint(
        onnx.TensorProto.EXTERNAL
    )
    return bytes(kept)
