"""Bounds-checked reads of a checkpoint's flatbuffer.

The generated accessors (``Checkpoint.ModuleState()``, ``Tensor.Name()``, ...)
do no bounds checks, so each table object they return is re-pointed at a
:class:`CheckedTable` before use (:func:`checked`). That subclass of the
FlatBuffers runtime's ``Table`` checks every read the generated code makes
(table and vtable headers, scalar fields, uoffsets, vector and string lengths,
alignment) against the buffer, and raises :class:`CheckpointFormatError` instead
of reading outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flatbuffers
import numpy as np
from flatbuffers import encode, number_types

from onnxblocks._core.errors import CheckpointFormatError
from onnxblocks.checkpoint.schema import _I32, _MAX_FLATBUFFER_BYTES, _U16, _U32

#: The remedy every format error of a stored checkpoint ends with.
ADVICE = "The checkpoint is truncated or corrupted; restore it from a copy or save it again."


class CheckedTable(flatbuffers.table.Table):
    """The FlatBuffers runtime's ``Table``, with every read checked against the buffer.

    The generated accessors read only through their object's ``_tab``; this class
    answers those reads (``Offset``, ``Get``, ``Indirect``, ``String``, ``Vector``,
    ``VectorLen``, ``GetVectorAsNumpy``) after checking that each lies inside the
    buffer and is aligned for its type, as every FlatBuffers writer aligns it.
    """

    __slots__ = ("_limit", "_object_size", "_vtable", "_vtable_size", "_where")

    def __init__(self, buf: Any, pos: int, where: str) -> None:
        self._where = where
        self._limit = min(len(buf), _MAX_FLATBUFFER_BYTES)
        self._need(pos, _I32.bytewidth, "table", align=_I32.bytewidth)
        super().__init__(buf, pos)
        vtable = pos - encode.Get(_I32.packer_type, buf, pos)
        self._need(vtable, 2 * _U16.bytewidth, "vtable", align=_U16.bytewidth)
        vtable_size = encode.Get(_U16.packer_type, buf, vtable)
        object_size = encode.Get(_U16.packer_type, buf, vtable + _U16.bytewidth)
        if vtable_size < 2 * _U16.bytewidth or vtable_size % _U16.bytewidth:
            self._fail(f"a vtable at byte {vtable} has the impossible size {vtable_size}")
        if object_size < _I32.bytewidth:
            self._fail(f"the table at byte {pos} has the impossible size {object_size}")
        self._need(vtable, vtable_size, "vtable", align=_U16.bytewidth)
        self._need(pos, object_size, "table", align=_I32.bytewidth)
        self._vtable, self._vtable_size, self._object_size = vtable, vtable_size, object_size

    def _fail(self, problem: str) -> None:
        raise CheckpointFormatError(f"{self._where}: {problem}. {ADVICE}")

    def _need(self, pos: int, size: int, what: str, align: int) -> None:
        """Check that ``size`` bytes at ``pos`` lie inside the buffer and ``pos`` is
        ``align``-aligned.
        """
        if pos < 0 or size < 0 or pos + size > self._limit:
            self._fail(
                f"{what} at byte {pos} (+{size} bytes) lies outside the {self._limit}-byte "
                "flatbuffer"
            )
        if pos % align:
            self._fail(f"{what} at byte {pos} is not aligned to {align} bytes")

    def _uoffset_target(self, at: int, what: str) -> int:
        self._need(at, _U32.bytewidth, f"the offset to a {what}", align=_U32.bytewidth)
        offset = encode.Get(_U32.packer_type, self.Bytes, at)
        if (
            offset == 0 or offset >= 2**31
        ):  # as FlatBuffers' verifier: no offset to itself, none that wraps
            self._fail(f"the offset to a {what} at byte {at} is {offset}")
        target = at + offset
        self._need(target, _U32.bytewidth, what, align=_U32.bytewidth)
        return target

    # -- the reads generated code makes
    def Offset(self, vtableOffset: int) -> int:
        if vtableOffset >= self._vtable_size:
            return 0
        offset = encode.Get(_U16.packer_type, self.Bytes, self._vtable + vtableOffset)
        if offset and not _I32.bytewidth <= offset < self._object_size:
            self._fail(
                f"a field of the table at byte {self.Pos} is at offset {offset}, outside the "
                "table's "
                f"{self._object_size} bytes"
            )
        return offset

    def Get(self, flags: Any, off: int) -> Any:
        self._need(off, flags.bytewidth, "a value", align=flags.bytewidth)
        return flags.py_type(encode.Get(flags.packer_type, self.Bytes, off))

    def Indirect(self, off: int) -> int:
        return self._uoffset_target(off, "table")

    def String(self, off: int) -> bytes:
        start = self._uoffset_target(off, "string")
        length = encode.Get(_U32.packer_type, self.Bytes, start)
        start += _U32.bytewidth
        self._need(start, length + 1, "a string", align=1)
        if self.Bytes[start + length] != 0:
            self._fail(f"the string at byte {start} is not NUL-terminated")
        return bytes(self.Bytes[start : start + length])

    def VectorLen(self, off: int) -> int:
        start = self._uoffset_target(self.Pos + off, "vector")
        length = encode.Get(_U32.packer_type, self.Bytes, start)
        self._need(start + _U32.bytewidth, length, f"a vector of {length} elements", align=1)
        return length

    def Vector(self, off: int) -> int:
        return self._uoffset_target(self.Pos + off, "vector") + _U32.bytewidth

    def GetVectorAsNumpy(self, flags: Any, off: int) -> np.ndarray:
        length = self.VectorLen(off)
        start = self.Vector(off)
        if length:
            self._need(
                start,
                length * flags.bytewidth,
                f"a vector of {length} elements",
                align=flags.bytewidth,
            )
        return encode.GetVectorAsNumpy(number_types.to_numpy_type(flags), self.Bytes, length, start)

    def Union(self, t2: Any, off: int) -> None:
        self._fail("a union field was read; checkpoints have none")


def checked(obj: Any, where: str) -> Any:
    """Point a generated table object's reads at a :class:`CheckedTable` (None stays None)."""
    if obj is not None:
        obj._tab = CheckedTable(obj._tab.Bytes, obj._tab.Pos, where)
    return obj


def tables(
    count: Callable[[], int], get: Callable[[int], Any], where: str
) -> list[tuple[str, Any]]:
    """``(where, table)`` for each table of a ``[Table]`` vector.

    ``count`` and ``get`` are the vector's generated ``<Field>Length`` and ``<Field>(j)`` accessors.
    """
    return [(f"{where}[{i}]", checked(get(i), f"{where}[{i}]")) for i in range(count())]


def text(raw: bytes | None, where: str, what: str) -> str | None:
    """A string field as text (None when absent); ``what`` names it in the error."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointFormatError(
            f"{where}: the {what} {raw[:40]!r} is not UTF-8 text. {ADVICE}"
        ) from None


def required_text(raw: bytes | None, where: str, what: str) -> str:
    """A string field ONNX Runtime dereferences without checking: absent, it would crash it."""
    value = text(raw, where, what)
    if value is None:
        raise CheckpointFormatError(f"{where}: the {what} is missing. {ADVICE}")
    return value
