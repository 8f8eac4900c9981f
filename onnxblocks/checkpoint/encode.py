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

A training session's checkpoint also holds the optimizer state and the
property bag. They are written in the order ONNX Runtime's ``save_checkpoint``
writes them (module state, optimizer groups sorted by name with their
parameters and moments sorted by name, properties sorted by name and split by
type, then the group vector), so a checkpoint re-written from what
:func:`~onnxblocks.checkpoint.load_checkpoint` read is byte-identical to the
one ONNX Runtime saved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
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
        inline_nbytes: Number of inline bytes (0 for nominal tensors); unused when the data is
        external.
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


@dataclass(frozen=True)
class OptimizerGroupRecord:
    """One optimizer group of a training session's checkpoint.

    Attributes:
        name: The group name (ONNX Runtime's single group is ``"group0"``).
        step: Optimizer steps taken.
        initial_learning_rate: The learning rate stored with the group.
        moments: Per trainable parameter, its moment tensors by name (AdamW:
            ``momentum0`` the first moment, ``momentum1`` the second; SGD: none).
    """

    name: str
    step: int
    initial_learning_rate: float
    moments: Mapping[str, Mapping[str, TensorRecord]] = field(default_factory=dict)


#: A property value as the checkpoint stores it: int64, float32 or str.
PropertyValue = int | float | str


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


def _tensor_vector(
    builder: Any, start_vector: Callable[[Any, int], int], offsets: Sequence[int]
) -> int:
    start_vector(builder, len(offsets))
    for o in reversed(offsets):
        builder.PrependUOffsetTRelative(o)
    return builder.EndVector()


def _raw_data_vector(builder: Any, record: TensorRecord) -> int:
    """A ``raw_data`` vector filled piece by piece (the same bytes ``CreateByteVector`` would
    write).
    """
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
        raise InvalidValueError(
            f"Tensor '{record.name}' does not hold the {size} bytes its dims {list(record.dims)} "
            "and element "
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


def _optimizer_group(builder: Any, group: OptimizerGroupRecord) -> int:
    states = []
    for param in sorted(group.moments):
        moments = group.moments[param]
        tensors = [_tensor(builder, moments[name]) for name in sorted(moments)]
        param_name = builder.CreateString(param)
        vector = _tensor_vector(builder, _fbs.ParameterOptimizerStateStartMomentumsVector, tensors)
        _fbs.ParameterOptimizerStateStart(builder)
        _fbs.ParameterOptimizerStateAddParamName(builder, param_name)
        _fbs.ParameterOptimizerStateAddMomentums(builder, vector)
        states.append(_fbs.ParameterOptimizerStateEnd(builder))
    name = builder.CreateString(group.name)
    vector = _tensor_vector(builder, _fbs.OptimizerGroupStartOptimizerStatesVector, states)
    _fbs.OptimizerGroupStart(builder)
    _fbs.OptimizerGroupAddGroupName(builder, name)
    _fbs.OptimizerGroupAddInitialLearningRate(builder, group.initial_learning_rate)
    _fbs.OptimizerGroupAddStep(builder, group.step)
    _fbs.OptimizerGroupAddOptimizerStates(builder, vector)
    return _fbs.OptimizerGroupEnd(builder)


def _property_bag(builder: Any, properties: Mapping[str, PropertyValue]) -> int:
    ints, floats, strings = [], [], []
    for name in sorted(properties):
        value = properties[name]
        key = builder.CreateString(name)
        if isinstance(value, str):
            text = builder.CreateString(value)
            _fbs.StringPropertyStart(builder)
            _fbs.StringPropertyAddName(builder, key)
            _fbs.StringPropertyAddValue(builder, text)
            strings.append(_fbs.StringPropertyEnd(builder))
        elif isinstance(value, int):
            _fbs.IntPropertyStart(builder)
            _fbs.IntPropertyAddName(builder, key)
            _fbs.IntPropertyAddValue(builder, value)
            ints.append(_fbs.IntPropertyEnd(builder))
        else:
            _fbs.FloatPropertyStart(builder)
            _fbs.FloatPropertyAddName(builder, key)
            _fbs.FloatPropertyAddValue(builder, value)
            floats.append(_fbs.FloatPropertyEnd(builder))
    int_vector = _tensor_vector(builder, _fbs.PropertyBagStartIntsVector, ints)
    float_vector = _tensor_vector(builder, _fbs.PropertyBagStartFloatsVector, floats)
    string_vector = _tensor_vector(builder, _fbs.PropertyBagStartStringsVector, strings)
    _fbs.PropertyBagStart(builder)
    _fbs.PropertyBagAddInts(builder, int_vector)
    _fbs.PropertyBagAddFloats(builder, float_vector)
    _fbs.PropertyBagAddStrings(builder, string_vector)
    return _fbs.PropertyBagEnd(builder)


def check_property(name: Any, value: Any) -> PropertyValue:
    """Check one property for the checkpoint's property bag and return it as stored.

    Raises:
        TypeError: for a name that is not a str, or a value that is not an int
            (bool excluded), float or str.
        ValueError: for an int outside int64.
    """
    if not isinstance(name, str):
        raise InvalidTypeError(
            f"checkpoint property names must be str, not {type(name).__name__} ({name!r})."
        )
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, str, np.integer, np.floating)
    ):
        raise InvalidTypeError(
            f"checkpoint property '{name}' is a {type(value).__name__}; the property bag holds "
            "int, float "
            "(stored as float32) and str. Convert it, or encode it as a str (e.g. json.dumps)."
        )
    if isinstance(value, (int, np.integer)):
        if not -(2**63) <= int(value) < 2**63:
            raise InvalidValueError(
                f"checkpoint property '{name}' = {value} does not fit in int64."
            )
        return int(value)
    return value if isinstance(value, str) else float(value)


def encode_checkpoint(
    trainable: Sequence[TensorRecord],
    frozen: Sequence[TensorRecord],
    *,
    nominal: bool,
    has_external_data: bool,
    optimizer_groups: Sequence[OptimizerGroupRecord] | None = None,
    properties: Mapping[str, PropertyValue] | None = None,
) -> memoryview:
    """Encode a checkpoint's flatbuffer.

    The layout matches ONNX Runtime's own writer: for the same inline tensors,
    groups and properties the bytes are identical. Without ``optimizer_groups``
    and ``properties`` it is a freshly generated checkpoint (module state only);
    a training session's save passes ``optimizer_groups`` (empty without
    optimizer state, as ONNX Runtime writes an empty vector then) and its
    properties. Inline data is copied into the buffer chunk by chunk, so memory
    use is the size of the finished buffer.

    Args:
        trainable: The trainable parameters, in file order.
        frozen: The frozen parameters, in file order.
        nominal: Write a nominal checkpoint (names and element types only).
        has_external_data: Tensor data lives in the side file.
        optimizer_groups: Optimizer state, or None to write no group vector.
        properties: The property bag (values as :func:`check_property` returns them).

    Returns:
        A view of the finished buffer (valid until the next call).

    Raises:
        ValueError: if a tensor's inline chunks do not add up to its size.
    """
    moments = [r for g in optimizer_groups or () for ms in g.moments.values() for r in ms.values()]
    size = 1024 + sum(
        (r.inline_nbytes if r.inline_chunks is not None else 0)
        + 2 * len(r.name)
        + 8 * len(r.dims)
        + 64
        for r in (*trainable, *frozen, *moments)
    )
    size += sum(
        64 + 2 * len(k) + (2 * len(v) if isinstance(v, str) else 0)
        for k, v in (properties or {}).items()
    )
    builder = flatbuffers.Builder(size)
    trainable_offsets = [_tensor(builder, r) for r in trainable]
    frozen_offsets = [_tensor(builder, r) for r in frozen]
    trainable_vector = _tensor_vector(
        builder, _fbs.ModuleStateStartRequiresGradParamsVector, trainable_offsets
    )
    frozen_vector = _tensor_vector(builder, _fbs.ModuleStateStartFrozenParamsVector, frozen_offsets)
    _fbs.ModuleStateStart(builder)
    _fbs.ModuleStateAddRequiresGradParams(builder, trainable_vector)
    _fbs.ModuleStateAddFrozenParams(builder, frozen_vector)
    _fbs.ModuleStateAddIsNominalState(builder, nominal)
    _fbs.ModuleStateAddHasExternalData(builder, has_external_data)
    module_state = _fbs.ModuleStateEnd(builder)
    groups = [
        _optimizer_group(builder, g) for g in sorted(optimizer_groups or (), key=lambda g: g.name)
    ]
    bag = _property_bag(builder, properties) if properties else 0
    group_vector = (
        _tensor_vector(builder, _fbs.CheckpointStartOptimizerGroupsVector, groups)
        if optimizer_groups is not None
        else 0
    )
    _fbs.CheckpointStart(builder)
    _fbs.CheckpointAddVersion(builder, CHECKPOINT_VERSION)
    _fbs.CheckpointAddModuleState(builder, module_state)
    if group_vector:
        _fbs.CheckpointAddOptimizerGroups(builder, group_vector)
    if bag:
        _fbs.CheckpointAddPropertyBag(builder, bag)
    root = _fbs.CheckpointEnd(builder)
    builder.Finish(root, file_identifier=FILE_IDENTIFIER)
    return memoryview(builder.Bytes)[builder.Head() :]
