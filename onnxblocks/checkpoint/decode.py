"""Reading a checkpoint's flatbuffer into its metadata: tensor entries, optimizer groups,
properties.

Every read goes through the bounds-checked accessors of
:mod:`onnxblocks.checkpoint.checked_table`. :func:`decode_checkpoint` then checks
what the schema cannot say: the version, element types, non-negative dims whose product
matches the ``raw_data`` length, and external-data offsets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxblocks._core.errors import CheckpointFormatError
from onnxblocks.checkpoint._generated import ort_training_checkpoint_generated as _fbs
from onnxblocks.checkpoint.checked_table import ADVICE, checked, required_text, tables, text
from onnxblocks.checkpoint.schema import (
    _RAW_DATA_VOFFSET,
    _SCHEMA_DTYPES,
    FILE_IDENTIFIER,
    LOADABLE_DTYPES,
    READABLE_VERSIONS,
)


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
    name = text(tensor.Name(), where, "name")
    if not name:
        raise CheckpointFormatError(f"{where}: a tensor has no name. {ADVICE}")
    where = f"{where} ('{name}')"
    text(
        tensor.DocString(), where, "doc string"
    )  # never used, but ONNX Runtime's verifier follows it
    for j in range(tensor.StringDataLength()):
        tensor.StringData(j)
    if tensor.DimsIsNone():
        raise CheckpointFormatError(
            f"{where}: the tensor has no dims vector (ONNX Runtime requires one). {ADVICE}"
        )
    dims = tuple(
        tensor.Dims(j) for j in range(tensor.DimsLength())
    )  # (no numpy view pinning a memory map)
    if any(d < 0 for d in dims):
        raise CheckpointFormatError(
            f"{where}: the tensor has a negative dimension {list(dims)}. {ADVICE}"
        )
    data_type = tensor.DataType()
    if data_type not in _SCHEMA_DTYPES:
        raise CheckpointFormatError(
            f"{where}: the tensor has element type {data_type}, which the checkpoint schema does "
            f"not define. {ADVICE}"
        )
    inline = None
    raw_at = tensor._tab.Offset(_RAW_DATA_VOFFSET)
    if raw_at:
        inline = (tensor._tab.Vector(raw_at), tensor.RawDataLength())
    offset = tensor.ExternalDataOffset()
    if offset < -1:
        raise CheckpointFormatError(
            f"{where}: the tensor's external data offset is {offset}. {ADVICE}"
        )
    entry = TensorEntry(name, data_type, dims, inline, offset if offset >= 0 else None)
    if nominal:
        if inline is None and entry.external_offset is None:
            raise CheckpointFormatError(
                f"{where}: the nominal tensor has no (empty) data field. {ADVICE}"
            )
        return entry  # names and element types only
    dtype_of(entry, where)  # an element type ONNX Runtime cannot load data of
    if entry.external_offset is not None:
        if not external:
            raise CheckpointFormatError(
                f"{where}: the tensor has external data but the checkpoint says it has none. "
                f"{ADVICE}"
            )
        return entry
    if inline is None:
        raise CheckpointFormatError(
            f"{where}: the tensor has neither inline nor external data. {ADVICE}"
        )
    if inline[1] != entry.nbytes:
        raise CheckpointFormatError(
            f"{where}: the tensor has {inline[1]} bytes of data but its dims {list(dims)} and "
            "element type "
            f"{_SCHEMA_DTYPES[data_type]} need {entry.nbytes}. {ADVICE}"
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
    root = checked(_fbs.Checkpoint.GetRootAs(buf, 0), where)
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
    module = checked(root.ModuleState(), f"{where} > module_state")
    if module is not None:
        nominal, external = module.IsNominalState(), module.HasExternalData()
        if module.RequiresGradParamsIsNone() or module.FrozenParamsIsNone():
            missing.append(f"{where} > module_state: the trainable or the frozen parameter vector")
        trainable = [
            _tensor_entry(t, w, nominal=nominal, external=external)
            for w, t in tables(
                module.RequiresGradParamsLength,
                module.RequiresGradParams,
                f"{where} > requires_grad_params",
            )
        ]
        frozen = [
            _tensor_entry(t, w, nominal=nominal, external=external)
            for w, t in tables(
                module.FrozenParamsLength, module.FrozenParams, f"{where} > frozen_params"
            )
        ]
    groups: list[OptimizerGroupEntry] = []
    for g_where, g in tables(
        root.OptimizerGroupsLength, root.OptimizerGroups, f"{where} > optimizer_groups"
    ):
        group = OptimizerGroupEntry(
            name=required_text(g.GroupName(), g_where, "group name"),
            step=g.Step(),
            initial_learning_rate=g.InitialLearningRate(),
        )
        if g.OptimizerStatesIsNone():
            raise CheckpointFormatError(
                f"{g_where}: the group has no optimizer state vector. {ADVICE}"
            )
        if any(other.name == group.name for other in groups):
            raise CheckpointFormatError(
                f"{g_where}: optimizer group '{group.name}' appears twice. {ADVICE}"
            )
        for s_where, state in tables(
            g.OptimizerStatesLength, g.OptimizerStates, f"{g_where} > optimizer_states"
        ):
            param = required_text(state.ParamName(), s_where, "parameter name")
            if state.MomentumsIsNone() or param in group.moments:
                raise CheckpointFormatError(
                    f"{s_where}: the state of parameter '{param}' has no moment vector or "
                    f"appears twice. {ADVICE}"
                )
            group.moments[param] = [
                _tensor_entry(t, w, nominal=nominal, external=external)
                for w, t in tables(state.MomentumsLength, state.Momentums, f"{s_where} > momentums")
            ]
        groups.append(group)
    properties: dict[str, int | float | str] = {}
    bag = checked(root.PropertyBag(), f"{where} > property_bag")
    if bag is not None:
        numbers = (("ints", bag.IntsLength, bag.Ints), ("floats", bag.FloatsLength, bag.Floats))
        for kind, count, get in numbers:
            for p_where, prop in tables(count, get, f"{where} > property_bag > {kind}"):
                properties[required_text(prop.Name(), p_where, "property name")] = prop.Value()
        for p_where, prop in tables(
            bag.StringsLength, bag.Strings, f"{where} > property_bag > strings"
        ):
            properties[required_text(prop.Name(), p_where, "property name")] = required_text(
                prop.Value(), p_where, "property value"
            )
    return ParsedCheckpoint(
        version, nominal, external, trainable, frozen, groups, properties, missing
    )
