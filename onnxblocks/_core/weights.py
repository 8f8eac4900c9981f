"""Weights held aside while a graph is built.

A base model's large initializers never get copied into the model being built.
The working model holds a *stub* for each: a TensorProto with the name, dtype
and dims and an external-data location that marks it as held. The bytes stay
where they were (the caller's TensorProto, the model's external data file, or
the ``.onnx`` file itself for a model read with :func:`load_structure`) and are
read in bounded chunks only when something needs them: a checkpoint, a saved
model, or :meth:`ModelAccessor.materialize`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

#: Initializers of at least this many bytes are held aside rather than copied.
HOLD_THRESHOLD_BYTES = 1024
#: Prefix of the external-data location that marks a stub.
HELD_LOCATION_PREFIX = "onnxblocks-held://"
#: Default chunk size for streaming copies.
CHUNK_BYTES = 16 * 1024 * 1024


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """Size of a tensor's data in bytes, computed from dtype and dims (no I/O)."""
    count = 1
    for d in tensor.dims:
        count *= d
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return count * itemsize


def external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    """The key/value pairs of a tensor's external_data field."""
    return {entry.key: entry.value for entry in tensor.external_data}


def is_stub(tensor: onnx.TensorProto) -> bool:
    """True for a stub standing in for a held tensor."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL and external_info(tensor).get("location", "").startswith(
        HELD_LOCATION_PREFIX
    )


@dataclass(frozen=True)
class TensorSource:
    """Where the bytes of one held tensor live.

    Exactly one of ``tensor`` (a TensorProto owned by the caller, never copied or
    mutated) or ``path`` (an external data file, with ``offset`` and ``length``)
    is set.
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    tensor: onnx.TensorProto | None = None
    path: Path | None = None
    offset: int = 0
    length: int | None = None

    @property
    def nbytes(self) -> int:
        """Size of the data in bytes."""
        if self.path is not None and self.length is not None:
            return self.length
        stub = onnx.TensorProto(data_type=self.data_type, dims=self.dims)
        return tensor_nbytes(stub)

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes | memoryview]:
        """Yield the tensor's little-endian bytes in pieces of at most ``chunk_bytes``.

        Pieces read from a file are ``bytes``. Pieces of an in-memory tensor are
        read-only ``memoryview`` slices of one copy of its data (protobuf hands
        out ``raw_data`` only as a copy), so streaming it copies the bytes once,
        not once more per piece. Both work wherever bytes-like objects do
        (``file.write``, ``b"".join``, ``len``, slice assignment).
        """
        if self.path is not None:
            remaining = self.nbytes
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while remaining > 0:
                    piece = f.read(min(chunk_bytes, remaining))
                    if not piece:
                        raise OSError(
                            f"External data file {self.path} ended early while reading tensor "
                            f"'{self.name}' ({remaining} bytes missing). Is the model's .data file complete?"
                        )
                    remaining -= len(piece)
                    yield piece
            return
        assert self.tensor is not None
        if self.tensor.HasField("raw_data"):
            data = memoryview(self.tensor.raw_data)
        else:
            data = memoryview(numpy_helper.to_array(self.tensor).tobytes())
        for start in range(0, len(data), chunk_bytes):
            yield data[start : start + chunk_bytes]

    def read(self) -> bytes:
        """All of the tensor's bytes at once."""
        if self.tensor is not None and self.tensor.HasField("raw_data"):
            return self.tensor.raw_data
        return b"".join(self.chunks())

    def array(self) -> np.ndarray:
        """The tensor as a numpy array."""
        if self.tensor is not None:
            return numpy_helper.to_array(self.tensor)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.data_type)
        if self.path is not None:
            return np.fromfile(self.path, dtype=dtype, count=self.nbytes // dtype.itemsize, offset=self.offset).reshape(
                self.dims
            )
        raise AssertionError("unreachable")

    def to_tensor_proto(self) -> onnx.TensorProto:
        """A complete TensorProto holding the data (this copies the bytes)."""
        if self.tensor is not None:
            out = onnx.TensorProto()
            out.CopyFrom(self.tensor)
            return out
        out = onnx.TensorProto(name=self.name, data_type=self.data_type, dims=self.dims)
        out.raw_data = self.read()
        return out


class WeightStore:
    """The held tensors of one build, by name."""

    def __init__(self) -> None:
        self._sources: dict[str, TensorSource] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def __len__(self) -> int:
        return len(self._sources)

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def source(self, name: str) -> TensorSource:
        """The source of a held tensor."""
        return self._sources[name]

    def hold(self, tensor: onnx.TensorProto, base_dir: str | os.PathLike | None) -> onnx.TensorProto:
        """Record where ``tensor``'s bytes are and return a stub to put in the graph.

        ``tensor`` is referenced, not copied. For a tensor with external data,
        ``base_dir`` is the directory its location is relative to.

        Raises:
            ValueError: if the tensor has external data but ``base_dir`` is unknown.
            FileNotFoundError: if its external data file does not exist.
        """
        dims = tuple(tensor.dims)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = external_info(tensor)
            location = info.get("location", "")
            if location.startswith(HELD_LOCATION_PREFIX):
                raise ValueError(
                    f"Initializer '{tensor.name}' is an onnxblocks stub, not real data. Pass the model "
                    "returned by to_model_proto() or accessor.materialize() instead of the working model."
                )
            if base_dir is None:
                raise ValueError(
                    f"Initializer '{tensor.name}' keeps its data in the external file '{location}', but the "
                    "model's directory is unknown. Pass model_path= (the .onnx file the model was loaded "
                    "from) or load the model from a path."
                )
            path = Path(base_dir) / location
            if not path.is_file():
                raise FileNotFoundError(
                    f"External data file '{path}' of initializer '{tensor.name}' does not exist. Keep the "
                    "model's .data file beside the .onnx file, or pass the right model_path=."
                )
            length = int(info["length"]) if "length" in info else None
            source = TensorSource(
                tensor.name, tensor.data_type, dims, path=path, offset=int(info.get("offset", 0)), length=length
            )
            if length is None:
                source = TensorSource(
                    tensor.name, tensor.data_type, dims, path=path, offset=source.offset, length=source.nbytes
                )
        else:
            source = TensorSource(tensor.name, tensor.data_type, dims, tensor=tensor)
        self._sources[tensor.name] = source
        return make_stub(tensor.name, tensor.data_type, dims)

    def add(self, source: TensorSource) -> onnx.TensorProto:
        """Register an existing source (e.g. from another store) and return its stub."""
        self._sources[source.name] = source
        return make_stub(source.name, source.data_type, source.dims)


def make_stub(name: str, data_type: int, dims: tuple[int, ...] | list[int]) -> onnx.TensorProto:
    """A TensorProto with no data whose external location marks it as held."""
    stub = onnx.TensorProto(name=name, data_type=data_type, dims=dims)
    stub.data_location = onnx.TensorProto.EXTERNAL
    entry = stub.external_data.add()
    entry.key = "location"
    entry.value = HELD_LOCATION_PREFIX + name
    return stub


def should_hold(tensor: onnx.TensorProto, threshold: int | None = None) -> bool:
    """Whether a base-model initializer is held aside rather than copied."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return True
    limit = HOLD_THRESHOLD_BYTES if threshold is None else threshold
    return tensor_nbytes(tensor) >= limit


# ------------------------------------------------------------------ loading a model file without its weights
# Protobuf field numbers (onnx.proto) and wire types used by load_structure().
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def load_structure(path: str | os.PathLike, threshold: int | None = None) -> onnx.ModelProto:
    """Load an ``.onnx`` file without reading the bytes of its large inline initializers.

    ``onnx.load`` parses the whole file, weights included. This reads only the
    model's structure: every initializer whose ``raw_data`` has at least
    ``threshold`` bytes (default :data:`HOLD_THRESHOLD_BYTES`) comes back as an
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
    limit = HOLD_THRESHOLD_BYTES if threshold is None else threshold
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ValueError(f"'{path}' is empty; it is not an ONNX model.")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                blob = _rewrite_model(data, path.name, limit)
            except (IndexError, ValueError) as exc:
                raise ValueError(
                    f"'{path}' is not a valid ONNX model file ({exc}). Check that the file is complete."
                ) from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(blob)
    except Exception as exc:  # protobuf raises DecodeError and others
        raise ValueError(f"'{path}' is not a valid ONNX model file ({exc}).") from None
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
            raise ValueError("malformed varint")


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
    """Yield ``(field, wire_type, field_start, payload_start, field_end)`` for each field in ``data[start:end]``."""
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
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError("truncated protobuf field")
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
    kept += _encode_varint(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _encode_varint(onnx.TensorProto.EXTERNAL)
    return bytes(kept)
