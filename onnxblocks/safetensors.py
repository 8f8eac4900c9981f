"""The safetensors file format, read and written with numpy alone (no ``safetensors`` package
needed).

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON,
then the tensors' bytes (little-endian, C order, back to back). The header maps
each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets
into the bytes after the header) and may hold ``"__metadata__"``, an object of
strings. The web state (:mod:`onnxblocks.web.state`) and PEFT adapter files
(:mod:`onnxblocks.peft.files`) use it. The JavaScript client
(``js/src/safetensors.mjs``) reads and writes the same format; so does the
``safetensors`` package.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxblocks._core.errors import (
    DataFileError,
    FileAccessError,
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    IsAFolderError,
)
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
_CODES = {
    dtype.newbyteorder("=") if dtype.byteorder == "<" else dtype: code
    for code, dtype in DTYPES.items()
}
_METADATA = "__metadata__"
#: Largest header this reader accepts (the reference implementation's limit).
MAX_HEADER_BYTES = 100_000_000


def _code(name: str, array: np.ndarray) -> str:
    dtype = array.dtype.newbyteorder("=") if array.dtype.byteorder in "<>" else array.dtype
    code = _CODES.get(dtype)
    if code is None:
        supported = ", ".join(str(d) for d in _CODES)
        raise InvalidTypeError(
            f"tensor '{name}' has dtype {array.dtype}; the web format supports {supported}."
        )
    return code


def write_safetensors(
    path: str | os.PathLike,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``tensors`` (in the mapping's order) and string ``metadata`` as a safetensors file,
    atomically.

    Args:
        path: The file to write (replaced whole or not at all).
        tensors: Arrays by name.
        metadata: ``__metadata__``: string values by string key.

    Returns:
        The path written.

    Raises:
        TypeError: for an unsupported dtype, a non-string metadata value, or the reserved name
        ``__metadata__``.
    """
    header: dict[str, object] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise InvalidTypeError(
                f"safetensors metadata must map strings to strings; not so for {bad[:5]}."
            )
        header[_METADATA] = dict(metadata)
    arrays = []
    offset = 0
    for name, value in tensors.items():
        if name == _METADATA:
            raise InvalidTypeError(
                f"'{_METADATA}' is reserved in safetensors files; rename the tensor."
            )
        array = np.asarray(value)
        code = _code(name, array)
        array = np.asarray(
            array, dtype=DTYPES[code], order="C"
        )  # not ascontiguousarray: it makes scalars 1-D
        header[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
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


def read_safetensors(
    path: str | os.PathLike, *, widen_bf16: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file, trusting nothing in it.

    The header must be a JSON object without repeated keys; each tensor a
    supported dtype, a shape of at most 64 non-negative integers (not booleans),
    and ``data_offsets`` that are exactly the bytes its dtype and shape need.
    Sorted by offset, the tensors tile the data bytes: the first starts at 0, each
    starts where the one before ends, the last ends at the end of the file, so
    no tensor is read out of another's bytes and none overlaps or aliases another
    (the rule of the reference implementation).

    Args:
        path: The file.
        widen_bf16: Accept ``BF16`` tensors (numpy has no bfloat16) and return them as float32,
            exactly (PEFT adapters trained in bfloat16 are saved so).

    Returns:
        ``(tensors, metadata)``: arrays by name in file order (native byte order, writable copies)
        and the ``__metadata__`` strings.

    Raises:
        onnxblocks.errors.FileMissingError: if the file does not exist.
        onnxblocks.errors.IsAFolderError: if the path is a folder.
        onnxblocks.errors.FileAccessError: if the file may not be read.
        onnxblocks.errors.InvalidValueError: for a truncated or malformed file (the message names
        it).
        onnxblocks.errors.InvalidTypeError: for a dtype numpy/ONNX Runtime JS cannot hold here (e.g.
        ``BF16``).
    """
    target = Path(os.fspath(path))
    raw = _read_bytes(target)
    if len(raw) < 8:
        raise InvalidValueError(
            f"'{target}' has {len(raw)} bytes: too short for a safetensors file."
        )
    (length,) = struct.unpack("<Q", raw[:8])
    if length > min(len(raw) - 8, MAX_HEADER_BYTES):
        raise InvalidValueError(
            f"'{target}' claims a {length}-byte header but has {len(raw) - 8} bytes after the "
            "length: the file is "
            "truncated or not a safetensors file."
        )
    try:
        header = json.loads(raw[8 : 8 + length].decode("utf-8"), object_pairs_hook=_unique_keys)
    except _RepeatedKeyError as exc:
        raise InvalidValueError(
            f"'{target}': the safetensors header holds {exc.args[0]!r} twice."
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidValueError(
            f"'{target}': the safetensors header is not UTF-8 JSON ({exc})."
        ) from None
    if not isinstance(header, dict):
        raise InvalidValueError(f"'{target}': the safetensors header must be a JSON object.")
    metadata = header.pop(_METADATA, None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidValueError(f"'{target}': __metadata__ must be an object of strings.")
    data = memoryview(raw)[8 + length :]
    entries = {
        name: _entry(target, name, entry, len(data), widen_bf16) for name, entry in header.items()
    }
    _check_tiling(target, entries, len(data))
    tensors = {name: _tensor(entry, data) for name, entry in entries.items()}
    return tensors, dict(metadata)


class _RepeatedKeyError(InvalidValueError):
    """A JSON object holds a key twice (raised inside the parser, reported naming the file)."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKeyError(key)
        out[key] = value
    return out


def _read_bytes(target: Path) -> bytes:
    try:
        return target.read_bytes()
    except FileNotFoundError:
        raise FileMissingError(
            f"No file at '{target}'. Pass the path of a safetensors file."
        ) from None
    except IsADirectoryError:
        raise IsAFolderError(
            f"'{target}' is a folder; pass the path of a safetensors file."
        ) from None
    except PermissionError:
        raise FileAccessError(
            f"'{target}' may not be read (permission denied); check its permissions."
        ) from None
    except OSError as exc:
        raise DataFileError(f"'{target}' cannot be read ({exc.strerror or exc}).") from None


#: Most dimensions a tensor may have (numpy's limit); no dimension may reach ``_MAX_DIM``.
_MAX_RANK, _MAX_DIM = 64, 2**62


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int
    bf16: bool = False


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: bfloat16's storage: the upper half of a float32 (read only with ``widen_bf16``).
_BF16 = np.dtype("<u2")


def _entry(target: Path, name: str, entry: object, size: int, widen_bf16: bool = False) -> _Entry:
    """One tensor's header entry, checked on its own (its span inside the ``size`` data bytes),
    before tiling.
    """
    if not isinstance(entry, dict):
        raise InvalidValueError(f"'{target}': the header entry of '{name}' is not an object.")
    extra = sorted(set(entry) - {"dtype", "shape", "data_offsets"})
    if extra:
        raise InvalidValueError(
            f"'{target}': the header entry of '{name}' has unknown fields {extra}."
        )
    code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(code, str) or (code not in DTYPES and not (widen_bf16 and code == "BF16")):
        raise InvalidTypeError(
            f"'{target}': tensor '{name}' has dtype {code!r}; supported: {', '.join(DTYPES)}."
        )
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_RANK
        or not all(_is_int(d) and 0 <= d < _MAX_DIM for d in shape)
    ):
        raise InvalidValueError(
            f"'{target}': tensor '{name}' has shape {shape!r:.80}; expected at most {_MAX_RANK} "
            "integers in [0, 2**62)."
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) and o >= 0 for o in offsets)
    ):
        raise InvalidValueError(
            f"'{target}': tensor '{name}' has data_offsets {offsets!r:.80}; expected [begin, "
            "end], two integers >= 0."
        )
    begin, end = offsets
    if end < begin:
        raise InvalidValueError(
            f"'{target}': tensor '{name}' has data_offsets {offsets}, which end before they "
            "begin. The file is "
            "corrupted; write it again."
        )
    if end > size:
        raise InvalidValueError(
            f"'{target}': tensor '{name}' spans data bytes [{begin}, {end}) but the file has "
            f"{size} data bytes: its "
            "span lies outside the data (the file is truncated, or its header is corrupted). "
            "Write it again."
        )
    dtype = _BF16 if code == "BF16" else DTYPES[code]
    needed = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if end - begin != needed:
        raise InvalidValueError(
            f"'{target}': tensor '{name}' ({code} {shape}) needs {needed} bytes, its "
            f"data_offsets {offsets} span "
            f"{offsets[1] - offsets[0]}."
        )
    return _Entry(name, dtype, tuple(shape), offsets[0], offsets[1], code == "BF16")


def _check_tiling(target: Path, entries: Mapping[str, _Entry], size: int) -> None:
    """The tensors, sorted by offset, cover the ``size`` data bytes exactly once (each inside them
    already).

    Overlaps are reported before gaps: an overlap names both tensors that claim the same
    bytes, where a gap can only name its neighbours (the tensor moved away is elsewhere).
    """
    overlaps: list[str] = []
    gaps: list[str] = []
    at, last = 0, None  # the furthest end so far, and the tensor that reaches it
    for entry in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin < at and last is not None:
            overlaps.append(
                f"tensor '{entry.name}' (data bytes [{entry.begin}, {entry.end})) overlaps "
                f"'{last.name}' "
                f"(data bytes [{last.begin}, {last.end})): no two tensors may share bytes"
            )
        elif entry.begin > at:
            after = f"after '{last.name}' " if last is not None else ""
            gaps.append(
                f"data bytes [{at}, {entry.begin}) {after}and before '{entry.name}' belong to no "
                "tensor"
            )
        if last is None or entry.end >= at:
            at, last = entry.end, entry
    if at < size:
        after = f" after '{last.name}', the last tensor," if last is not None else ""
        gaps.append(f"data bytes [{at}, {size}){after} belong to no tensor")
    if overlaps or gaps:
        raise InvalidValueError(
            f"'{target}': {(overlaps + gaps)[0]}. The file is corrupted; write it again."
        )


def _tensor(entry: _Entry, data: memoryview) -> np.ndarray:
    count = math.prod(entry.shape)
    flat = np.frombuffer(data[entry.begin : entry.end], dtype=entry.dtype, count=count)
    if entry.bf16:  # the 16 high bits of a float32
        return (flat.astype(np.uint32) << 16).view(np.float32).reshape(entry.shape)
    return flat.astype(entry.dtype.newbyteorder("="), copy=True).reshape(entry.shape)
