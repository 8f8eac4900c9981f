"""ONNX Runtime's on-device-training checkpoint format ("ODTC"), written and read without generated code.

A checkpoint is one FlatBuffers file (file identifier ``ODTC``) whose root
table is::

    table Checkpoint   { version:int32; module_state:ModuleState;
                         optimizer_groups:[OptimizerGroup]; property_bag:PropertyBag; }
    table ModuleState  { requires_grad_params:[Tensor]; frozen_params:[Tensor];
                         is_nominal_state:bool; has_external_data:bool; }
    table Tensor       { name:string; doc_string:string; dims:[int64]; data_type:int32;
                         raw_data:[uint8]; string_data:[string]; external_data_offset:int64 = -1; }
    table OptimizerGroup          { group_name:string; step:int64; initial_learning_rate:float;
                                    optimizer_states:[ParameterOptimizerState]; }
    table ParameterOptimizerState { param_name:string; momentums:[Tensor]; }
    table PropertyBag  { ints:[IntProperty]; floats:[FloatProperty]; strings:[StringProperty]; }

(``onnxruntime/core/flatbuffers/schema/ort_training_checkpoint.fbs`` and
``ort.fbs``). A tensor keeps its little-endian bytes either inline in
``raw_data`` or, when the module state ``has_external_data``, at
``external_data_offset`` in the side file ``<checkpoint>.data``, with the length
implied by dims and data type. A *nominal* checkpoint stores names and element
types only: empty dims and empty ``raw_data``, as ONNX Runtime's own writer does.

FlatBuffers are built back to front, so the writer here only ever puts small
metadata (and, below a size threshold, small tensors) into the buffer; large
tensor bytes are streamed to the side file first (see
:mod:`onnxblocks.checkpoint.save`). The field slots below are the schema's, as data.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxblocks._core.errors import CheckpointFormatError

#: File identifier at bytes 4..8 of every checkpoint.
FILE_IDENTIFIER = b"ODTC"
#: The checkpoint version onnxruntime-training 1.19.2 writes (and reads).
CHECKPOINT_VERSION = 2
#: Versions this reader understands.
READABLE_VERSIONS = (1, 2)
#: Suffix of the side file holding external tensor data.
EXTERNAL_DATA_SUFFIX = ".data"

#: Field slots (the order of fields in each schema table).
CHECKPOINT_FIELDS = {"version": 0, "module_state": 1, "optimizer_groups": 2, "property_bag": 3}
MODULE_STATE_FIELDS = {"requires_grad_params": 0, "frozen_params": 1, "is_nominal_state": 2, "has_external_data": 3}
TENSOR_FIELDS = {
    "name": 0, "doc_string": 1, "dims": 2, "data_type": 3, "raw_data": 4, "string_data": 5,
    "external_data_offset": 6,
}
OPTIMIZER_GROUP_FIELDS = {"group_name": 0, "step": 1, "initial_learning_rate": 2, "optimizer_states": 3}
PARAMETER_OPTIMIZER_STATE_FIELDS = {"param_name": 0, "momentums": 1}
PROPERTY_BAG_FIELDS = {"ints": 0, "floats": 1, "strings": 2}
PROPERTY_FIELDS = {"name": 0, "value": 1}

#: ONNX element types ONNX Runtime 1.19.2 can load from a checkpoint, with their numpy dtypes.
LOADABLE_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),   # FLOAT
    2: np.dtype("u1"),    # UINT8
    3: np.dtype("i1"),    # INT8
    4: np.dtype("<u2"),   # UINT16
    5: np.dtype("<i2"),   # INT16
    6: np.dtype("<i4"),   # INT32
    7: np.dtype("<i8"),   # INT64
    9: np.dtype("?"),     # BOOL
    11: np.dtype("<f8"),  # DOUBLE
    12: np.dtype("<u4"),  # UINT32
    13: np.dtype("<u8"),  # UINT64
}


# --------------------------------------------------------------------------- writing
@dataclass(frozen=True)
class TensorRecord:
    """What the flatbuffer says about one tensor.

    Attributes:
        name: The tensor name.
        data_type: ONNX element type.
        dims: The shape (empty in a nominal checkpoint).
        inline_nbytes: Number of inline bytes (0 for nominal tensors); unused when the data is external.
        inline_chunks: Produces the inline bytes in pieces, or None when the data is external.
        external_offset: Byte offset in the side file, or None when the data is inline.
        doc_string: Optional documentation string.
    """

    name: str
    data_type: int
    dims: tuple[int, ...]
    inline_nbytes: int = 0
    inline_chunks: Callable[[], Iterable[bytes]] | None = None
    external_offset: int | None = None
    doc_string: str | None = None


def _int64_vector(builder: Any, values: Sequence[int]) -> int:
    if not values:
        # An empty vector needs no alignment padding (the C++ builder adds none).
        builder.Prep(4, 0)
        builder.PlaceUOffsetT(0)
        return builder.Offset()
    builder.StartVector(8, len(values), 8)
    for v in reversed(values):
        builder.PrependInt64(v)
    return builder.EndVector()


def _offset_vector(builder: Any, offsets: Sequence[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for o in reversed(offsets):
        builder.PrependUOffsetTRelative(o)
    return builder.EndVector()


def _byte_vector(builder: Any, record: TensorRecord) -> int:
    """A ``[uint8]`` vector filled piece by piece (the same bytes ``CreateByteVector`` would write)."""
    assert record.inline_chunks is not None
    size = record.inline_nbytes
    builder.StartVector(1, size, 1)  # aligns and makes room for `size` bytes
    end = builder.Head()
    position = end - size
    for chunk in record.inline_chunks():
        if position + len(chunk) > end:
            position = end + 1
            break
        builder.Bytes[position : position + len(chunk)] = chunk
        position += len(chunk)
    if position != end:
        raise ValueError(
            f"Tensor '{record.name}' does not hold the {size} bytes its dims {list(record.dims)} and element "
            "type need. Fix the tensor's data or its shape."
        )
    builder.head = end - size
    return builder.EndVector()


def _tensor(builder: Any, record: TensorRecord) -> int:
    name = builder.CreateString(record.name)
    doc = builder.CreateString(record.doc_string) if record.doc_string is not None else 0
    dims = _int64_vector(builder, record.dims)
    raw = _byte_vector(builder, record) if record.inline_chunks is not None else 0
    builder.StartObject(len(TENSOR_FIELDS))
    builder.PrependUOffsetTRelativeSlot(TENSOR_FIELDS["name"], name, 0)
    if doc:
        builder.PrependUOffsetTRelativeSlot(TENSOR_FIELDS["doc_string"], doc, 0)
    builder.PrependUOffsetTRelativeSlot(TENSOR_FIELDS["dims"], dims, 0)
    builder.PrependInt32Slot(TENSOR_FIELDS["data_type"], record.data_type, 0)
    if record.inline_chunks is not None:
        builder.PrependUOffsetTRelativeSlot(TENSOR_FIELDS["raw_data"], raw, 0)
    if record.external_offset is not None:
        builder.PrependInt64Slot(TENSOR_FIELDS["external_data_offset"], record.external_offset, -1)
    return builder.EndObject()


def encode_checkpoint(
    trainable: Sequence[TensorRecord],
    frozen: Sequence[TensorRecord],
    *,
    nominal: bool,
    has_external_data: bool,
) -> memoryview:
    """Encode a checkpoint's flatbuffer (module state only, as a freshly saved checkpoint has).

    The layout matches ONNX Runtime's own writer: for the same inline tensors the
    bytes are identical. Inline data is copied into the buffer chunk by chunk, so
    memory use is the size of the finished buffer.

    Returns:
        A view of the finished buffer (valid until the next call).

    Raises:
        ValueError: if a tensor's inline chunks do not add up to its size.
    """
    import flatbuffers

    size = 1024 + sum(
        (r.inline_nbytes if r.inline_chunks is not None else 0) + 2 * len(r.name) + 8 * len(r.dims) + 64
        for r in (*trainable, *frozen)
    )
    builder = flatbuffers.Builder(size)
    trainable_offsets = [_tensor(builder, r) for r in trainable]
    frozen_offsets = [_tensor(builder, r) for r in frozen]
    trainable_vector = _offset_vector(builder, trainable_offsets)
    frozen_vector = _offset_vector(builder, frozen_offsets)
    builder.StartObject(len(MODULE_STATE_FIELDS))
    builder.PrependUOffsetTRelativeSlot(MODULE_STATE_FIELDS["requires_grad_params"], trainable_vector, 0)
    builder.PrependUOffsetTRelativeSlot(MODULE_STATE_FIELDS["frozen_params"], frozen_vector, 0)
    builder.PrependBoolSlot(MODULE_STATE_FIELDS["is_nominal_state"], nominal, False)
    builder.PrependBoolSlot(MODULE_STATE_FIELDS["has_external_data"], has_external_data, False)
    module_state = builder.EndObject()
    builder.StartObject(len(CHECKPOINT_FIELDS))
    builder.PrependInt32Slot(CHECKPOINT_FIELDS["version"], CHECKPOINT_VERSION, 0)
    builder.PrependUOffsetTRelativeSlot(CHECKPOINT_FIELDS["module_state"], module_state, 0)
    root = builder.EndObject()
    builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    return memoryview(builder.Bytes)[builder.Head() :]


# --------------------------------------------------------------------------- reading
class _Table:
    """Read access to one flatbuffer table (little-endian, as the format defines)."""

    def __init__(self, buf: Any, pos: int, where: str) -> None:
        self.buf, self.pos, self.where = buf, pos, where
        self._check(pos, 4)
        vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self._check(vtable, 4)
        self.vtable = vtable
        self.vtable_size = struct.unpack_from("<H", buf, vtable)[0]
        self._check(vtable, self.vtable_size)

    def _check(self, pos: int, size: int) -> None:
        if pos < 0 or pos + size > len(self.buf):
            raise CheckpointFormatError(
                f"{self.where}: offset {pos} (+{size} bytes) is outside the {len(self.buf)}-byte file. "
                "The checkpoint is truncated or not an ONNX Runtime checkpoint."
            )

    def field(self, slot: int) -> int | None:
        entry = 4 + 2 * slot
        if entry + 2 > self.vtable_size:
            return None
        offset = struct.unpack_from("<H", self.buf, self.vtable + entry)[0]
        return self.pos + offset if offset else None

    def scalar(self, slot: int, fmt: str, default: Any) -> Any:
        at = self.field(slot)
        if at is None:
            return default
        self._check(at, struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, at)[0]

    def _indirect(self, slot: int) -> int | None:
        at = self.field(slot)
        if at is None:
            return None
        self._check(at, 4)
        target = at + struct.unpack_from("<I", self.buf, at)[0]
        self._check(target, 4)
        return target

    def string(self, slot: int) -> str | None:
        at = self._indirect(slot)
        if at is None:
            return None
        length = struct.unpack_from("<I", self.buf, at)[0]
        self._check(at + 4, length)
        return bytes(self.buf[at + 4 : at + 4 + length]).decode("utf-8")

    def vector(self, slot: int) -> tuple[int, int] | None:
        """(position of the first element, element count) of a vector field."""
        at = self._indirect(slot)
        if at is None:
            return None
        return at + 4, struct.unpack_from("<I", self.buf, at)[0]

    def tables(self, slot: int, what: str) -> list[_Table]:
        vec = self.vector(slot)
        if vec is None:
            return []
        start, count = vec
        self._check(start, 4 * count)
        out = []
        for i in range(count):
            at = start + 4 * i
            out.append(_Table(self.buf, at + struct.unpack_from("<I", self.buf, at)[0], f"{self.where} > {what}[{i}]"))
        return out


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
        return int(np.prod(self.dims, dtype=np.int64)) * dtype_of(self).itemsize


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


def dtype_of(entry: TensorEntry) -> np.dtype:
    """The numpy dtype of a checkpoint tensor.

    Raises:
        CheckpointFormatError: for an element type checkpoints cannot hold.
    """
    try:
        return LOADABLE_DTYPES[entry.data_type]
    except KeyError:
        raise CheckpointFormatError(
            f"Checkpoint tensor '{entry.name}' has ONNX element type {entry.data_type}, which ONNX Runtime "
            "checkpoints do not support."
        ) from None


def _tensor_entry(table: _Table) -> TensorEntry:
    name = table.string(TENSOR_FIELDS["name"])
    if name is None:
        raise CheckpointFormatError(f"{table.where}: a tensor has no name. The checkpoint is invalid.")
    dims_vec = table.vector(TENSOR_FIELDS["dims"])
    dims: tuple[int, ...] = ()
    if dims_vec is not None:
        start, count = dims_vec
        table._check(start, 8 * count)
        dims = struct.unpack_from(f"<{count}q", table.buf, start)
    raw = table.vector(TENSOR_FIELDS["raw_data"])
    offset = table.scalar(TENSOR_FIELDS["external_data_offset"], "<q", -1)
    if raw is not None:
        table._check(raw[0], raw[1])
    return TensorEntry(
        name=name,
        data_type=table.scalar(TENSOR_FIELDS["data_type"], "<i", 0),
        dims=tuple(dims),
        inline=raw,
        external_offset=offset if offset >= 0 else None,
    )


def decode_checkpoint(buf: Any, where: str = "checkpoint") -> ParsedCheckpoint:
    """Parse a checkpoint flatbuffer (bytes or a memory map) into its metadata.

    Raises:
        CheckpointFormatError: if ``buf`` is not an ONNX Runtime training checkpoint
            or uses a version this reader does not know.
    """
    if len(buf) < 8 or bytes(buf[4:8]) != FILE_IDENTIFIER:
        raise CheckpointFormatError(
            f"{where} is not an ONNX Runtime training checkpoint (file identifier "
            f"{bytes(buf[4:8]) if len(buf) >= 8 else b''!r}, expected {FILE_IDENTIFIER!r})."
        )
    root = _Table(buf, struct.unpack_from("<I", buf, 0)[0], where)
    version = root.scalar(CHECKPOINT_FIELDS["version"], "<i", 0)
    if version not in READABLE_VERSIONS:
        raise CheckpointFormatError(
            f"{where} has checkpoint version {version}; this reader knows versions {READABLE_VERSIONS}."
        )
    module_pos = root._indirect(CHECKPOINT_FIELDS["module_state"])
    trainable: list[TensorEntry] = []
    frozen: list[TensorEntry] = []
    nominal = external = False
    if module_pos is not None:
        module = _Table(buf, module_pos, f"{where} > module_state")
        trainable = [_tensor_entry(t) for t in module.tables(MODULE_STATE_FIELDS["requires_grad_params"], "param")]
        frozen = [_tensor_entry(t) for t in module.tables(MODULE_STATE_FIELDS["frozen_params"], "frozen_param")]
        nominal = bool(module.scalar(MODULE_STATE_FIELDS["is_nominal_state"], "<B", 0))
        external = bool(module.scalar(MODULE_STATE_FIELDS["has_external_data"], "<B", 0))
    groups = []
    for g in root.tables(CHECKPOINT_FIELDS["optimizer_groups"], "optimizer_group"):
        group = OptimizerGroupEntry(
            name=g.string(OPTIMIZER_GROUP_FIELDS["group_name"]) or "",
            step=g.scalar(OPTIMIZER_GROUP_FIELDS["step"], "<q", 0),
            initial_learning_rate=g.scalar(OPTIMIZER_GROUP_FIELDS["initial_learning_rate"], "<f", 0.0),
        )
        for state in g.tables(OPTIMIZER_GROUP_FIELDS["optimizer_states"], "optimizer_state"):
            param = state.string(PARAMETER_OPTIMIZER_STATE_FIELDS["param_name"]) or ""
            group.moments[param] = [
                _tensor_entry(t) for t in state.tables(PARAMETER_OPTIMIZER_STATE_FIELDS["momentums"], "momentum")
            ]
        groups.append(group)
    properties: dict[str, int | float | str] = {}
    bag_pos = root._indirect(CHECKPOINT_FIELDS["property_bag"])
    if bag_pos is not None:
        bag = _Table(buf, bag_pos, f"{where} > property_bag")
        for kind, fmt in (("ints", "<q"), ("floats", "<f")):
            for prop in bag.tables(PROPERTY_BAG_FIELDS[kind], kind):
                properties[prop.string(PROPERTY_FIELDS["name"]) or ""] = prop.scalar(PROPERTY_FIELDS["value"], fmt, 0)
        for prop in bag.tables(PROPERTY_BAG_FIELDS["strings"], "strings"):
            properties[prop.string(PROPERTY_FIELDS["name"]) or ""] = prop.string(PROPERTY_FIELDS["value"]) or ""
    return ParsedCheckpoint(version, nominal, external, trainable, frozen, groups, properties)
