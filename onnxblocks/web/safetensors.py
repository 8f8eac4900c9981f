"""The safetensors file format, read and written with numpy alone (no ``safetensors`` package needed).

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON,
then the tensors' bytes (little-endian, C order, back to back). The header maps
each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets
into the bytes after the header) and may hold ``"__metadata__"``, an object of
strings. The JavaScript client (``js/src/safetensors.mjs``) reads and writes the
same format; so does the ``safetensors`` package.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.io import atomic_file

#: safetensors dtype codes and their numpy dtypes (the ones ONNX Runtime's JavaScript API has).
DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F16": np.dtype("<f2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}
_CODES = {dtype.newbyteorder("=") if dtype.byteorder == "<" else dtype: code for code, dtype in DTYPES.items()}
_METADATA = "__metadata__"
#: Largest header this reader accepts (the reference implementation's limit).
MAX_HEADER_BYTES = 100_000_000


def _code(name: str, array: np.ndarray) -> str:
    dtype = array.dtype.newbyteorder("=") if array.dtype.byteorder in "<>" else array.dtype
    code = _CODES.get(dtype)
    if code is None:
        supported = ", ".join(str(d) for d in _CODES)
        raise InvalidTypeError(f"tensor '{name}' has dtype {array.dtype}; the web format supports {supported}.")
    return code


def write_safetensors(
    path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` (in the mapping's order) and string ``metadata`` as a safetensors file, atomically.

    Args:
        path: The file to write (replaced whole or not at all).
        tensors: Arrays by name.
        metadata: ``__metadata__``: string values by string key.

    Returns:
        The path written.

    Raises:
        TypeError: for an unsupported dtype, a non-string metadata value, or the reserved name ``__metadata__``.
    """
    header: dict[str, object] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise InvalidTypeError(f"safetensors metadata must map strings to strings; not so for {bad[:5]}.")
        header[_METADATA] = dict(metadata)
    arrays = []
    offset = 0
    for name, value in tensors.items():
        if name == _METADATA:
            raise InvalidTypeError(f"'{_METADATA}' is reserved in safetensors files; rename the tensor.")
        array = np.asarray(value)
        code = _code(name, array)
        array = np.asarray(array, dtype=DTYPES[code], order="C")  # not ascontiguousarray: it makes scalars 1-D
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        arrays.append(array)
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # pad to 8 bytes, as the reference writer does
    target = Path(os.fspath(path))
    with atomic_file(target) as temp, open(temp, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for array in arrays:
            f.write(array.reshape(-1).view(np.uint8).data)
    return target


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file.

    Returns:
        ``(tensors, metadata)``: arrays by name in file order (native byte order, writable copies)
        and the ``__metadata__`` strings.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: for a truncated or malformed file (the message names it).
        TypeError: for a dtype numpy/ONNX Runtime JS cannot hold here (e.g. ``BF16``).
    """
    target = Path(os.fspath(path))
    raw = target.read_bytes()
    if len(raw) < 8:
        raise InvalidValueError(f"'{target}' has {len(raw)} bytes: too short for a safetensors file.")
    (length,) = struct.unpack("<Q", raw[:8])
    if length > min(len(raw) - 8, MAX_HEADER_BYTES):
        raise InvalidValueError(
            f"'{target}' claims a {length}-byte header but has {len(raw) - 8} bytes after the length."
        )
    try:
        header = json.loads(raw[8 : 8 + length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidValueError(f"'{target}': the safetensors header is not UTF-8 JSON ({exc}).") from None
    if not isinstance(header, dict):
        raise InvalidValueError(f"'{target}': the safetensors header must be a JSON object.")
    metadata = header.pop(_METADATA, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidValueError(f"'{target}': __metadata__ must be an object of strings.")
    data = memoryview(raw)[8 + length :]
    tensors: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        tensors[name] = _tensor(target, name, entry, data)
    return tensors, dict(metadata)


def _tensor(target: Path, name: str, entry: object, data: memoryview) -> np.ndarray:
    if not isinstance(entry, dict):
        raise InvalidValueError(f"'{target}': the header entry of '{name}' is not an object.")
    code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if code not in DTYPES:
        raise InvalidTypeError(f"'{target}': tensor '{name}' has dtype {code!r}; supported: {', '.join(DTYPES)}.")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidValueError(f"'{target}': tensor '{name}' has shape {shape!r}; expected non-negative integers.")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= len(data)
    ):
        raise InvalidValueError(
            f"'{target}': tensor '{name}' has data_offsets {offsets!r} outside the {len(data)} data bytes."
        )
    dtype = DTYPES[code]
    count = int(np.prod(shape, dtype=np.int64))
    if offsets[1] - offsets[0] != count * dtype.itemsize:
        raise InvalidValueError(
            f"'{target}': tensor '{name}' ({code} {shape}) needs {count * dtype.itemsize} bytes, "
            f"its data_offsets span {offsets[1] - offsets[0]}."
        )
    flat = np.frombuffer(data[offsets[0] : offsets[1]], dtype=dtype, count=count)
    return flat.astype(dtype.newbyteorder("="), copy=True).reshape(shape)
