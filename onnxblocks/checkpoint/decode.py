"""Reading a checkpoint's flatbuffer through bounds-checked generated accessors.

The generated accessors (``Checkpoint.ModuleState()``, ``Tensor.Name()``, ...)
do no bounds checks, so each table object they return is re-pointed at a
:class:`_CheckedTable` before use. That subclass of the FlatBuffers runtime's
``Table`` checks every read the generated code makes (table and vtable
headers, scalar fields, uoffsets, vector and string lengths, alignment)
against the buffer, and raises :class:`CheckpointFormatError` instead of
reading outside it. :func:`decode_checkpoint` then checks what the schema
cannot say: the version, element types, non-negative dims whose product
matches the ``raw_data`` length, and external-data offsets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np
from flatbuffers import encode, number_types

from onnxblocks._core.errors import CheckpointFormatError
from onnxblocks.checkpoint._generated import ort_training_checkpoint_generated as _fbs
from onnxblocks.checkpoint.schema import (
    _I32,
    _MAX_FLATBUFFER_BYTES,
    _RAW_DATA_VOFFSET,
    _SCHEMA_DTYPES,
    _U16,
    _U32,
    FILE_IDENTIFIER,
    LOADABLE_DTYPES,
    READABLE_VERSIONS,
)

# --------------------------------------------------------------------------- reading: bounds checks
_ADVICE = "The checkpoint is truncated or corrupted; restore it from a copy or save it again."


class _CheckedTable(flatbuffers.table.Table):
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
        raise CheckpointFormatError(f"{self._where}: {problem}. {_ADVICE}")

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


def _checked(obj: Any, where: str) -> Any:
    """Point a generated table object's reads at a :class:`_CheckedTable` (None stays None)."""
    if obj is not None:
        obj._tab = _CheckedTable(obj._tab.Bytes, obj._tab.Pos, where)
    return obj


def _tables(
    count: Callable[[], int], get: Callable[[int], Any], where: str
) -> list[tuple[str, Any]]:
    """``(where, table)`` for each table of a ``[Table]`` vector.

    ``count`` and ``get`` are the vector's generated ``<Field>Length`` and ``<Field>(j)`` accessors.
    """
    return [(f"{where}[{i}]", _checked(get(i), f"{where}[{i}]")) for i in range(count())]


def _text(raw: bytes | None, where: str, what: str) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointFormatError(
            f"{where}: the {what} {raw[:40]!r} is not UTF-8 text. {_ADVICE}"
        ) from None


def _required_text(raw: bytes | None, where: str, what: str) -> str:
    """A string field ONNX Runtime dereferences without checking: absent, it would crash it."""
    text = _text(raw, where, what)
    if text is None:
        raise CheckpointFormatError(f"{where}: the {what} is missing. {_ADVICE}")
    return text


# --------------------------------------------------------------------------- reading: the model
@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a parsed checkpoint; its bytes are at ``inline`` or ``external_offset``.

    Attributes:
        name: Tensor name.
        data_type: ONNX element type.
        dims: Shape (empty in nominal checkpoints).
        inline: ``(position, length)`` of the inline bytes in the checkpoint file, or None.
        external_offset: Offset in the side data file, or None.
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    inline: tuple[int, int] | None
    external_offset: int | None

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes, from its dims and element type."""
        return math.prod(self.dims) * dtype_of(self).itemsize


@dataclass
class OptimizerGroupEntry:
    """A parsed optimizer group: its step, initial learning rate and per-parameter moments."""

    name: str
    step: int
    initial_learning_rate: float
    moments: dict[str, list[TensorEntry]] = field(default_factory=dict)


@dataclass
class ParsedCheckpoint:
    """The metadata of a checkpoint file (no tensor bytes are copied)."""

    version: int
    is_nominal: bool
    has_external_data: bool
    trainable: list[TensorEntry]
    frozen: list[TensorEntry]
    optimizer_groups: list[OptimizerGroupEntry]
    properties: dict[str, int | float | str]
    #: Fields ONNX Runtime requires that the file lacks (this reader reads them as empty).
    missing: list[str] = field(default_factory=list)

    def entries(self) -> list[TensorEntry]:
        """Every tensor: parameters, then optimizer moments."""
        moments = [m for g in self.optimizer_groups for ms in g.moments.values() for m in ms]
        return [*self.trainable, *self.frozen, *moments]


def dtype_of(entry: TensorEntry, where: str = "checkpoint") -> np.dtype:
    """The numpy dtype of a checkpoint tensor (``where`` names the file in the error).

    Raises:
        CheckpointFormatError: for an element type checkpoints cannot hold.
    """
    try:
        return LOADABLE_DTYPES[entry.data_type]
    except KeyError:
        kind = _SCHEMA_DTYPES.get(entry.data_type, str(entry.data_type))
        raise CheckpointFormatError(
            f"Tensor '{entry.name}' of {where} has ONNX element type {kind}, which ONNX Runtime "
            "1.19.2 "
            "cannot load from a checkpoint. Save the parameter as float32 (or another numeric "
            "type)."
        ) from None


def _tensor_entry(tensor: Any, where: str, *, nominal: bool, external: bool) -> TensorEntry:
    name = _text(tensor.Name(), where, "name")
    if not name:
        raise CheckpointFormatError(f"{where}: a tensor has no name. {_ADVICE}")
    where = f"{where} ('{name}')"
    _text(
        tensor.DocString(), where, "doc string"
    )  # never used, but ONNX Runtime's verifier follows it
    for j in range(tensor.StringDataLength()):
        tensor.StringData(j)
    if tensor.DimsIsNone():
        raise CheckpointFormatError(
            f"{where}: the tensor has no dims vector (ONNX Runtime requires one). {_ADVICE}"
        )
    dims = tuple(
        tensor.Dims(j) for j in range(tensor.DimsLength())
    )  # (no numpy view pinning a memory map)
    if any(d < 0 for d in dims):
        raise CheckpointFormatError(
            f"{where}: the tensor has a negative dimension {list(dims)}. {_ADVICE}"
        )
    data_type = tensor.DataType()
    if data_type not in _SCHEMA_DTYPES:
        raise CheckpointFormatError(
            f"{where}: the tensor has element type {data_type}, which the checkpoint schema does "
            f"not define. {_ADVICE}"
        )
    inline = None
    raw_at = tensor._tab.Offset(_RAW_DATA_VOFFSET)
    if raw_at:
        inline = (tensor._tab.Vector(raw_at), tensor.RawDataLength())
    offset = tensor.ExternalDataOffset()
    if offset < -1:
        raise CheckpointFormatError(
            f"{where}: the tensor's external data offset is {offset}. {_ADVICE}"
        )
    entry = TensorEntry(name, data_type, dims, inline, offset if offset >= 0 else None)
    if nominal:
        if inline is None and entry.external_offset is None:
            raise CheckpointFormatError(
                f"{where}: the nominal tensor has no (empty) data field. {_ADVICE}"
            )
        return entry  # names and element types only
    dtype_of(entry, where)  # an element type ONNX Runtime cannot load data of
    if entry.external_offset is not None:
        if not external:
            raise CheckpointFormatError(
                f"{where}: the tensor has external data but the checkpoint says it has none. "
                f"{_ADVICE}"
            )
        return entry
    if inline is None:
        raise CheckpointFormatError(
            f"{where}: the tensor has neither inline nor external data. {_ADVICE}"
        )
    if inline[1] != entry.nbytes:
        raise CheckpointFormatError(
            f"{where}: the tensor has {inline[1]} bytes of data but its dims {list(dims)} and "
            "element type "
            f"{_SCHEMA_DTYPES[data_type]} need {entry.nbytes}. {_ADVICE}"
        )
    return entry


def decode_checkpoint(buf: Any, where: str = "checkpoint") -> ParsedCheckpoint:
    """Parse a checkpoint flatbuffer (bytes or a memory map) into its metadata, checking every
    offset.

    Only the metadata is read: tensor bytes are located, never touched.

    Raises:
        CheckpointFormatError: if ``buf`` is not an ONNX Runtime training checkpoint, is
            truncated or corrupted, or uses a version this reader does not know.
    """
    if len(buf) < 8 or not _fbs.Checkpoint.CheckpointBufferHasIdentifier(buf, 0):
        raise CheckpointFormatError(
            f"{where} is not an ONNX Runtime training checkpoint (file identifier "
            f"{bytes(buf[4:8]) if len(buf) >= 8 else b''!r}, expected {FILE_IDENTIFIER!r}). Pass "
            "a checkpoint "
            "written by onnxblocks.checkpoint.save_checkpoint or by ONNX Runtime."
        )
    root = _checked(_fbs.Checkpoint.GetRootAs(buf, 0), where)
    version = root.Version()
    if version not in READABLE_VERSIONS:
        raise CheckpointFormatError(
            f"{where} has checkpoint version {version}; this reader knows versions "
            f"{READABLE_VERSIONS}. "
            "Use the ONNX Runtime version that wrote it, or check that the file is not corrupted."
        )
    trainable: list[TensorEntry] = []
    frozen: list[TensorEntry] = []
    missing: list[str] = []
    nominal = external = False
    module = _checked(root.ModuleState(), f"{where} > module_state")
    if module is not None:
        nominal, external = module.IsNominalState(), module.HasExternalData()
        if module.RequiresGradParamsIsNone() or module.FrozenParamsIsNone():
            missing.append(f"{where} > module_state: the trainable or the frozen parameter vector")
        trainable = [
            _tensor_entry(t, w, nominal=nominal, external=external)
            for w, t in _tables(
                module.RequiresGradParamsLength,
                module.RequiresGradParams,
                f"{where} > requires_grad_params",
            )
        ]
        frozen = [
            _tensor_entry(t, w, nominal=nominal, external=external)
            for w, t in _tables(
                module.FrozenParamsLength, module.FrozenParams, f"{where} > frozen_params"
            )
        ]
    groups: list[OptimizerGroupEntry] = []
    for g_where, g in _tables(
        root.OptimizerGroupsLength, root.OptimizerGroups, f"{where} > optimizer_groups"
    ):
        group = OptimizerGroupEntry(
            name=_required_text(g.GroupName(), g_where, "group name"),
            step=g.Step(),
            initial_learning_rate=g.InitialLearningRate(),
        )
        if g.OptimizerStatesIsNone():
            raise CheckpointFormatError(
                f"{g_where}: the group has no optimizer state vector. {_ADVICE}"
            )
        if any(other.name == group.name for other in groups):
            raise CheckpointFormatError(
                f"{g_where}: optimizer group '{group.name}' appears twice. {_ADVICE}"
            )
        for s_where, state in _tables(
            g.OptimizerStatesLength, g.OptimizerStates, f"{g_where} > optimizer_states"
        ):
            param = _required_text(state.ParamName(), s_where, "parameter name")
            if state.MomentumsIsNone() or param in group.moments:
                raise CheckpointFormatError(
                    f"{s_where}: the state of parameter '{param}' has no moment vector or "
                    f"appears twice. {_ADVICE}"
                )
            group.moments[param] = [
                _tensor_entry(t, w, nominal=nominal, external=external)
                for w, t in _tables(
                    state.MomentumsLength, state.Momentums, f"{s_where} > momentums"
                )
            ]
        groups.append(group)
    properties: dict[str, int | float | str] = {}
    bag = _checked(root.PropertyBag(), f"{where} > property_bag")
    if bag is not None:
        numbers = (("ints", bag.IntsLength, bag.Ints), ("floats", bag.FloatsLength, bag.Floats))
        for kind, count, get in numbers:
            for p_where, prop in _tables(count, get, f"{where} > property_bag > {kind}"):
                properties[_required_text(prop.Name(), p_where, "property name")] = prop.Value()
        for p_where, prop in _tables(
            bag.StringsLength, bag.Strings, f"{where} > property_bag > strings"
        ):
            properties[_required_text(prop.Name(), p_where, "property name")] = _required_text(
                prop.Value(), p_where, "property value"
            )
    return ParsedCheckpoint(
        version, nominal, external, trainable, frozen, groups, properties, missing
    )
