"""Writing a checkpoint's flatbuffer with the generated builder functions.

:func:`encode_checkpoint` calls the generated builder functions
(``TensorStart``, ``TensorAddName``, ..., ``CheckpointEnd``). Two things stay
by hand because the generated API cannot express them: ``raw_data`` is
reserved with ``TensorStartRawDataVector`` and then filled in place chunk by
chunk (so an inline tensor is never assembled as one ``bytes`` object), and
an empty ``dims`` vector is written without alignment padding, exactly as ONNX
Runtime's C++ builder does, so inline checkpoints are byte-identical to ONNX
Runtime's. Large tensors never enter the buffer at all: they are streamed to
the side file first (see :mod:`onnxblocks.checkpoint.save`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import flatbuffers

from onnxblocks.checkpoint._generated import ort_training_checkpoint_generated as _fbs
from onnxblocks.checkpoint.schema import (
    _U32,
    CHECKPOINT_VERSION,
    FILE_IDENTIFIER,
)


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
    inline_chunks: Callable[[], Iterable[bytes | memoryview]] | None = None
    external_offset: int | None = None
    doc_string: str | None = None


def _dims_vector(builder: Any, values: Sequence[int]) -> int:
    if not values:
        # An empty vector needs no alignment padding (the C++ builder adds none); the
        # generated TensorStartDimsVector would align it to 8 bytes.
        builder.Prep(_U32.bytewidth, 0)
        builder.PlaceUOffsetT(0)
        return builder.Offset()
    _fbs.TensorStartDimsVector(builder, len(values))
    for v in reversed(values):
        builder.PrependInt64(v)
    return builder.EndVector()


def _tensor_vector(builder: Any, start_vector: Callable[[Any, int], int], offsets: Sequence[int]) -> int:
    start_vector(builder, len(offsets))
    for o in reversed(offsets):
        builder.PrependUOffsetTRelative(o)
    return builder.EndVector()


def _raw_data_vector(builder: Any, record: TensorRecord) -> int:
    """A ``raw_data`` vector filled piece by piece (the same bytes ``CreateByteVector`` would write)."""
    assert record.inline_chunks is not None
    size = record.inline_nbytes
    _fbs.TensorStartRawDataVector(builder, size)  # aligns and makes room for `size` bytes
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
    dims = _dims_vector(builder, record.dims)
    raw = _raw_data_vector(builder, record) if record.inline_chunks is not None else 0
    _fbs.TensorStart(builder)
    _fbs.TensorAddName(builder, name)
    if doc:
        _fbs.TensorAddDocString(builder, doc)
    _fbs.TensorAddDims(builder, dims)
    _fbs.TensorAddDataType(builder, record.data_type)
    if record.inline_chunks is not None:
        _fbs.TensorAddRawData(builder, raw)
    if record.external_offset is not None:
        _fbs.TensorAddExternalDataOffset(builder, record.external_offset)
    return _fbs.TensorEnd(builder)


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
    size = 1024 + sum(
        (r.inline_nbytes if r.inline_chunks is not None else 0) + 2 * len(r.name) + 8 * len(r.dims) + 64
        for r in (*trainable, *frozen)
    )
    builder = flatbuffers.Builder(size)
    trainable_offsets = [_tensor(builder, r) for r in trainable]
    frozen_offsets = [_tensor(builder, r) for r in frozen]
    trainable_vector = _tensor_vector(builder, _fbs.ModuleStateStartRequiresGradParamsVector, trainable_offsets)
    frozen_vector = _tensor_vector(builder, _fbs.ModuleStateStartFrozenParamsVector, frozen_offsets)
    _fbs.ModuleStateStart(builder)
    _fbs.ModuleStateAddRequiresGradParams(builder, trainable_vector)
    _fbs.ModuleStateAddFrozenParams(builder, frozen_vector)
    _fbs.ModuleStateAddIsNominalState(builder, nominal)
    _fbs.ModuleStateAddHasExternalData(builder, has_external_data)
    module_state = _fbs.ModuleStateEnd(builder)
    _fbs.CheckpointStart(builder)
    _fbs.CheckpointAddVersion(builder, CHECKPOINT_VERSION)
    _fbs.CheckpointAddModuleState(builder, module_state)
    root = _fbs.CheckpointEnd(builder)
    builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    return memoryview(builder.Bytes)[builder.Head() :]
