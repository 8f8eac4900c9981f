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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PureWindowsPath

import numpy as np
import onnx
from onnx import numpy_helper

from onnxblocks._core import structure as _structure
from onnxblocks._core.errors import DataFileError, FileMissingError, InvalidValueError

#: Initializers of at least this many bytes are held aside rather than copied.
HOLD_THRESHOLD_BYTES = 1024
#: Prefix of the external-data location that marks a stub.
HELD_LOCATION_PREFIX = "onnxblocks-held://"
#: Default chunk size for streaming copies.
CHUNK_BYTES = 16 * 1024 * 1024


#: Element types ONNX stores two to a byte (the first element in the low nibble).
FOUR_BIT_TYPES = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4})


def pack_four_bit(values: np.ndarray) -> np.ndarray:
    """4-bit integers (any integer array, values in range) as ONNX stores them: ``uint8``, two a
    byte, the first in the low nibble, an odd count padded with 0.
    """
    flat = values.reshape(-1).astype(np.int16) & 0x0F
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int16)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """Size of a tensor's data in bytes, computed from dtype and dims (no I/O)."""
    count = 1
    for d in tensor.dims:
        count *= d
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    if tensor.data_type in FOUR_BIT_TYPES:  # two elements a byte
        return (count + 1) // 2
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return count * itemsize


def external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    """The key/value pairs of a tensor's external_data field."""
    return {entry.key: entry.value for entry in tensor.external_data}


def is_held_location(location: object) -> bool:
    """True for the external location of a stub standing in for a held tensor (a TensorProto's
    ``location`` entry, or an IR external tensor's ``location``).
    """
    return str(location).startswith(HELD_LOCATION_PREFIX)


def is_stub(tensor: onnx.TensorProto) -> bool:
    """True for a stub standing in for a held tensor."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL and is_held_location(
        external_info(tensor).get("location", "")
    )


def _little_endian(values: np.ndarray, source: TensorSource) -> np.ndarray:
    """``values`` as a C-contiguous little-endian array of the source's dtype and shape.

    Raises:
        ValueError: if the values do not have the source's dtype and shape.
    """
    array = np.asarray(values)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(source.data_type)
    if array.dtype != dtype or tuple(array.shape) != tuple(source.dims):
        raise InvalidValueError(
            f"Tensor '{source.name}' was declared {dtype}{list(source.dims)} but its values are "
            f"{array.dtype}{list(array.shape)}. Pass values of the declared dtype and shape."
        )
    return np.ascontiguousarray(array.astype(dtype.newbyteorder("<"), copy=False))


@dataclass(frozen=True)
class TensorSource:
    """Where the bytes of one held tensor live.

    Exactly one of ``tensor`` (a TensorProto owned by the caller, never copied or
    mutated), ``path`` (an external data file, with ``offset`` and ``length``) or
    ``load`` (a function returning the values as a numpy array, called only when
    the bytes are read, e.g. a trained parameter fetched from a runtime) is set.
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    tensor: onnx.TensorProto | None = None
    path: Path | None = None
    offset: int = 0
    length: int | None = None
    load: Callable[[], np.ndarray] | None = field(default=None, compare=False, repr=False)

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
                        raise DataFileError(
                            f"External data file {self.path} ended early while reading tensor "
                            f"'{self.name}' ({remaining} bytes missing). Is the model's .data "
                            "file complete?"
                        )
                    remaining -= len(piece)
                    yield piece
            return
        if self.load is not None and self.data_type in FOUR_BIT_TYPES:
            data = pack_four_bit(self.load()).data
            for start in range(0, len(data), chunk_bytes):
                yield data[start : start + chunk_bytes]
            return
        if self.load is not None:
            data = _little_endian(self.load(), self).reshape(-1).view(np.uint8).data
            for start in range(0, len(data), chunk_bytes):
                yield data[start : start + chunk_bytes]
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
        if self.load is not None:
            return _little_endian(self.load(), self)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.data_type)
        if self.path is not None:
            return np.fromfile(
                self.path, dtype=dtype, count=self.nbytes // dtype.itemsize, offset=self.offset
            ).reshape(self.dims)
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

    def hold(
        self, tensor: onnx.TensorProto, base_dir: str | os.PathLike | None
    ) -> onnx.TensorProto:
        """Record where ``tensor``'s bytes are and return a stub to put in the graph.

        ``tensor`` is referenced, not copied. For a tensor with external data,
        ``base_dir`` is the directory its location is relative to.

        Raises:
            ValueError: if the tensor has external data but ``base_dir`` is unknown, or
                its external data is refused by :func:`external_source` (a location
                outside ``base_dir``, a length its dims do not need, a short file).
            FileNotFoundError: if its external data file does not exist.
        """
        dims = tuple(tensor.dims)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = external_info(tensor)
            location = info.get("location", "")
            if is_held_location(location):
                raise InvalidValueError(
                    f"Initializer '{tensor.name}' is an onnxblocks stub, not real data. Pass the "
                    "model "
                    "returned by to_model_proto() or accessor.materialize() instead of the "
                    "working model."
                )
            if base_dir is None:
                raise InvalidValueError(
                    f"Initializer '{tensor.name}' keeps its data in the external file "
                    f"'{location}', but the "
                    "model's directory is unknown. Pass model_path= (the .onnx file the model "
                    "was loaded "
                    "from) or load the model from a path."
                )
            source = external_source(tensor, base_dir)
        else:
            source = TensorSource(tensor.name, tensor.data_type, dims, tensor=tensor)
        self._sources[tensor.name] = source
        return make_stub(tensor.name, tensor.data_type, dims)

    def add(self, source: TensorSource) -> onnx.TensorProto:
        """Register an existing source (e.g. from another store) and return its stub."""
        self._sources[source.name] = source
        return make_stub(source.name, source.data_type, source.dims)


def _external_int(tensor: onnx.TensorProto, info: dict[str, str], key: str) -> int | None:
    raw = info.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidValueError(
            f"Initializer '{tensor.name}' has external data {key}={raw!r}; it must be an integer "
            ">= 0. The model "
            "file is corrupted; export it again."
        )
    return value


def _external_path(tensor: onnx.TensorProto, location: str, base_dir: str | os.PathLike) -> Path:
    """The data file of an external tensor, refused (as ``onnx.load`` refuses it) when outside
    ``base_dir``.
    """
    relative = PurePath(location)
    parts = Path(os.path.normpath(location)).parts if location else ()
    if (
        not location
        or "\0" in location
        or relative.is_absolute()
        or PureWindowsPath(location).anchor
        or location.startswith(("/", "\\"))
        or (parts and parts[0] == os.pardir)
    ):
        raise InvalidValueError(
            f"Initializer '{tensor.name}' keeps its data at location {location!r}, which is not "
            "a file inside the "
            f"model's directory '{base_dir}' (onnx.load refuses it too: absolute paths and '..' "
            "could read any "
            "file). Keep the data file beside the .onnx file and give its name relative to it."
        )
    path = Path(base_dir) / location
    if path.is_symlink():
        raise InvalidValueError(
            f"Initializer '{tensor.name}' keeps its data in '{path}', which is a symbolic link; "
            "onnx.load refuses "
            "those. Replace the link by the file itself."
        )
    if not path.exists():
        raise FileMissingError(
            f"External data file '{path}' of initializer '{tensor.name}' does not exist. Keep the "
            "model's .data file beside the .onnx file, or pass the right model_path=."
        )
    if not path.is_file():
        raise InvalidValueError(
            f"External data '{path}' of initializer '{tensor.name}' is not a regular file (a "
            "directory, pipe or "
            "device). Point the location at the model's data file."
        )
    return path


def external_source(tensor: onnx.TensorProto, base_dir: str | os.PathLike) -> TensorSource:
    """Where the bytes of a tensor with external data are, checked against its dims and the file.

    Raises:
        ValueError: for a location outside ``base_dir`` (absolute, ``..``, a symbolic
            link), an offset or length that is not an integer >= 0, a length other
            than the dims and element type need, or data past the end of the file.
        FileNotFoundError: if the data file does not exist.
    """
    info = external_info(tensor)
    path = _external_path(tensor, info.get("location", ""), base_dir)
    offset = _external_int(tensor, info, "offset") or 0
    length = _external_int(tensor, info, "length")
    dims = tuple(tensor.dims)
    if (
        tensor.data_type == onnx.TensorProto.STRING
        or tensor.data_type not in onnx.TensorProto.DataType.values()
    ):
        raise InvalidValueError(
            f"Initializer '{tensor.name}' has external data of element type {tensor.data_type}, "
            "which cannot be "
            "read as raw bytes. Store it inline."
        )
    if any(d < 0 for d in dims):
        raise InvalidValueError(
            f"Initializer '{tensor.name}' has a negative dimension {list(dims)}."
        )
    need = tensor_nbytes(tensor)
    if length is not None and length != need:
        raise InvalidValueError(
            f"Initializer '{tensor.name}' declares {length} bytes of external data "
            f"(length={length}) but its dims "
            f"{list(dims)} and element type {onnx.TensorProto.DataType.Name(tensor.data_type)} "
            f"need {need}. The "
            "model file is corrupted or was edited; export it again."
        )
    size = path.stat().st_size
    if offset + need > size:
        raise InvalidValueError(
            f"Initializer '{tensor.name}' needs bytes {offset}..{offset + need} of '{path}', "
            f"which has only {size} "
            "bytes. The data file is truncated or belongs to another model; keep the .onnx file "
            "and its data file "
            "together."
        )
    return TensorSource(tensor.name, tensor.data_type, dims, path=path, offset=offset, length=need)


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


def load_structure(path: str | os.PathLike, threshold: int | None = None) -> onnx.ModelProto:
    """Load an ``.onnx`` file without reading its large inline initializers (see
    :mod:`onnxblocks._core.structure`).

    Every initializer whose ``raw_data`` has at least ``threshold`` bytes (default
    :data:`HOLD_THRESHOLD_BYTES`) comes back as an external-data reference into the
    file itself, so ``base(model, model_path=path)`` holds it as a :class:`TensorSource`.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is not a valid protobuf-encoded ModelProto.
    """
    return _structure.load_structure(path, HOLD_THRESHOLD_BYTES if threshold is None else threshold)
