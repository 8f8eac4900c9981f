"""Checking a checkpoint completely, and against the model it is used with, before ONNX Runtime sees
it.

ONNX Runtime trusts a checkpoint: a tensor whose data lies past the end of its
file, or a parameter whose shape differs from the model's input, makes it fail
with a raw message, or crash. :func:`check_checkpoint` reads only metadata (no
tensor values) and refuses such files with an error that names the file, the
tensor and what to do:

* the file itself (through the bounds-checked reader): every offset and length,
  element types, dims, the data file's presence and size, unique names, the
  optimizer moments against their parameters, and nominal files without data;
* against a model (the training model of an artifact set, or any model whose
  parameters are graph inputs or initializers): every checkpoint parameter must
  be one of them, with the same element type and shape; a training model's
  trainable parameters (those with a gradient accumulation buffer) must be
  trainable in the checkpoint. A checkpoint none of whose names the model has is
  "not a checkpoint of this model".
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import onnx

from onnxblocks._core.contracts import buffer_name, checkpoint_moment_name
from onnxblocks._core.errors import (
    CheckpointFormatError,
    CheckpointMismatchError,
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    preview,
)
from onnxblocks.checkpoint import format as _format
from onnxblocks.checkpoint.load import Checkpoint, check_scalars, checkpoint_of
from onnxblocks.checkpoint.mapped import MappedCheckpoint
from onnxblocks.checkpoint.save import EXTRA_PREFIX

__all__ = ["check_checkpoint", "model_parameter_slots", "read_checked"]

#: No tensor ONNX Runtime can hold has this many elements (its sizes are int64).
_MAX_ELEMENTS = 2**62
_CORRUPT = "The checkpoint is corrupted; restore it from a copy or save it again."

Slot = tuple[int, tuple[int | str | None, ...] | None]


def model_parameter_slots(model: onnx.ModelProto) -> dict[str, Slot]:
    """``{name: (element type, dims)}`` of every value that can hold a parameter: graph inputs, then
    initializers.

    ``dims`` entries are ints, symbolic names or None; ``dims`` is None for an unknown rank.
    """
    slots: dict[str, Slot] = {}
    for init in model.graph.initializer:
        slots[init.name] = (init.data_type, tuple(init.dims))
    for vi in model.graph.input:
        tensor = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        dims: tuple[int | str | None, ...] | None = None
        if tensor.HasField("shape"):
            dims = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor.shape.dim
            )
        slots[vi.name] = (tensor.elem_type, dims)
    return slots


def _kind(data_type: int, dims: Iterable[int | str | None] | None) -> str:
    name = (
        _format.LOADABLE_DTYPES[data_type].name
        if data_type in _format.LOADABLE_DTYPES
        else str(data_type)
    )
    if dims is None:
        return f"{name} of any shape"
    return f"{name} [{', '.join('?' if d is None else str(d) for d in dims)}]"


def _fits(dims: tuple[int, ...], want: tuple[int | str | None, ...] | None) -> bool:
    if want is None:
        return True
    return len(dims) == len(want) and all(
        not isinstance(w, int) or w == d for d, w in zip(dims, want, strict=True)
    )


def _check_file(reader: MappedCheckpoint) -> None:
    """Everything ONNX Runtime relies on that the flatbuffer's bounds checks do not cover."""
    parsed, where = reader.parsed, f"Checkpoint '{reader.path}'"
    if parsed.missing:
        raise CheckpointFormatError(
            f"{parsed.missing[0]} is missing; ONNX Runtime requires it. {_CORRUPT}"
        )
    seen: set[str] = set()
    for entry in (*parsed.trainable, *parsed.frozen):
        if entry.name in seen:
            raise CheckpointFormatError(f"{where} holds parameter '{entry.name}' twice. {_CORRUPT}")
        seen.add(entry.name)
    for entry in parsed.entries():
        nonzero = [d for d in entry.dims if d]
        if any(d >= _MAX_ELEMENTS for d in entry.dims) or math.prod(nonzero) >= _MAX_ELEMENTS:
            raise CheckpointFormatError(
                f"{where}: tensor '{entry.name}' has impossible dims {list(entry.dims)}. {_CORRUPT}"
            )
        if parsed.is_nominal:
            if (
                entry.dims
                or entry.external_offset is not None
                or (entry.inline and entry.inline[1])
            ):
                raise CheckpointFormatError(
                    f"{where} is nominal (names and element types only) but tensor "
                    f"'{entry.name}' has dims or data. "
                    f"{_CORRUPT}"
                )
            continue
        end = (entry.external_offset or 0) + entry.nbytes
        if entry.external_offset is not None and end > reader.data_size:
            raise CheckpointFormatError(
                f"{where}: tensor '{entry.name}' needs bytes {entry.external_offset}..{end}"
                f" of '{reader.data_path}', which has {reader.data_size} bytes. The data file is "
                "truncated or belongs "
                "to another checkpoint: restore the checkpoint and its .data file together."
            )
    check_scalars(parsed, where)
    params = {e.name: e for e in parsed.trainable}
    for group in parsed.optimizer_groups:
        counts = {len(moments) for moments in group.moments.values()}
        if len(counts) > 1 or (
            group.moments and set(group.moments) != set(params) and counts != {0}
        ):
            raise CheckpointFormatError(
                f"{where}: optimizer group '{group.name}' holds moments for "
                f"{preview(sorted(group.moments))} "
                f"({sorted(counts)} per parameter) but the trainable parameters are "
                f"{preview(sorted(params))}. "
                f"{_CORRUPT}"
            )
        for name, moments in group.moments.items():
            param = params.get(name)
            if param is None:
                raise CheckpointFormatError(
                    f"{where}: optimizer group '{group.name}' holds moments of '{name}', which "
                    "is not a trainable "
                    f"parameter of the checkpoint. {_CORRUPT}"
                )
            names = [m.name for m in moments]
            if names != [checkpoint_moment_name(i) for i in range(len(moments))]:
                raise CheckpointFormatError(
                    f"{where}: the moments of '{name}' in optimizer group '{group.name}' are "
                    f"named {names}; ONNX "
                    f"Runtime reads {[checkpoint_moment_name(i) for i in range(len(moments))]}. "
                    f"{_CORRUPT}"
                )
            for moment in moments:
                if (moment.data_type, moment.dims) != (param.data_type, param.dims):
                    raise CheckpointFormatError(
                        f"{where}: a moment of '{name}' in optimizer group '{group.name}' is "
                        f"{_kind(moment.data_type, moment.dims)} but the parameter is "
                        f"{_kind(param.data_type, param.dims)}. {_CORRUPT}"
                    )


def _model_slots(model: onnx.ModelProto | str | os.PathLike) -> tuple[dict[str, Slot], str]:
    if isinstance(model, onnx.ModelProto):
        return model_parameter_slots(model), f"the model '{model.graph.name}'"
    if not isinstance(model, (str, os.PathLike)):
        raise InvalidTypeError(
            "model must be an onnx.ModelProto or a path to an .onnx file, not "
            f"{type(model).__name__}."
        )
    path = Path(os.fspath(model))
    try:
        loaded = onnx.load(os.fspath(path), load_external_data=False)
    except FileNotFoundError:
        raise FileMissingError(f"Model file '{path}' does not exist.") from None
    except Exception as exc:  # protobuf's DecodeError and friends
        raise InvalidValueError(
            f"Cannot read '{path}' as an ONNX model ({type(exc).__name__}). Pass an .onnx file."
        ) from None
    return model_parameter_slots(loaded), f"the model '{path.name}'"


def _check_against(reader: MappedCheckpoint, slots: Mapping[str, Slot], model_name: str) -> None:
    parsed = reader.parsed
    where = f"Checkpoint '{reader.path}'"
    # tensors kept beside the model's (a weight EMA) under the reserved prefix are no model
    # parameters
    entries = [
        e for e in (*parsed.trainable, *parsed.frozen) if not e.name.startswith(EXTRA_PREFIX)
    ]
    names = [e.name for e in entries]
    unknown = [n for n in names if n not in slots]
    trained = {n for n in slots if buffer_name(n) in slots}
    if entries and len(unknown) == len(entries):
        expected = sorted(trained) or sorted(slots)
        raise CheckpointMismatchError(
            f"{where} is not a checkpoint of {model_name}: none of its parameters "
            f"{preview(names)} is a parameter "
            f"of the model ({preview(expected)}). Pass a checkpoint saved from these artifacts "
            "(or from the "
            "model), or the model this checkpoint belongs to."
        )
    if unknown:
        raise CheckpointMismatchError(
            f"{where} is not a checkpoint of {model_name}: its parameters {preview(unknown)} are "
            "not parameters of "
            "the model. Pass a checkpoint saved from these artifacts, or regenerate the "
            "artifacts from the model "
            "the checkpoint belongs to."
        )
    if trained:  # a training model: its trainable parameters are those with gradient buffers
        _check_trainable(where, model_name, parsed, trained)
    for entry in entries:
        data_type, dims = slots[entry.name]
        if data_type and entry.data_type != data_type:
            raise CheckpointMismatchError(
                f"{where} does not fit {model_name}: parameter '{entry.name}' is "
                f"{_kind(entry.data_type, entry.dims)}"
                f" in the checkpoint but the model takes {_kind(data_type, dims)}. Pass a "
                "checkpoint saved from this "
                "model, or convert the parameter to the model's element type."
            )
        if not parsed.is_nominal and not _fits(entry.dims, dims):
            raise CheckpointMismatchError(
                f"{where} does not fit {model_name}: parameter '{entry.name}' has shape "
                f"{list(entry.dims)} in the "
                f"checkpoint but the model takes {_kind(data_type, dims)}. The checkpoint was "
                "saved from a model with "
                "the same names but other shapes: pass a checkpoint saved from these artifacts, "
                "or regenerate the "
                "artifacts from the model the checkpoint belongs to."
            )


def _check_trainable(
    where: str, model_name: str, parsed: _format.ParsedCheckpoint, trained: set[str]
) -> None:
    trainable = {e.name for e in parsed.trainable}
    frozen = {e.name for e in parsed.frozen}
    missing = sorted(trained - trainable)
    extra = sorted(trainable - trained)
    if not missing and not extra:
        return
    if missing:
        problem = (
            f"{preview(missing)} {'are frozen in it' if set(missing) <= frozen else 'are missing'}"
        )
    else:
        problem = (
            f"{preview(extra)} are trainable in it, but the model computes no gradient for them"
        )
    raise CheckpointMismatchError(
        f"{where} holds parameters {preview(sorted(trainable | frozen))}, but {model_name} trains "
        f"{preview(sorted(trained))}: {problem}. It is not a checkpoint of these artifacts: pass "
        "one saved from "
        "them (or regenerate the artifacts with the checkpoint's trainable parameters)."
    )


def check_checkpoint(
    path_to_checkpoint: str | os.PathLike, model: onnx.ModelProto | str | os.PathLike | None = None
) -> _format.ParsedCheckpoint:
    """Check a checkpoint completely, without reading tensor values, and optionally against a model.

    Args:
        path_to_checkpoint: The checkpoint file.
        model: The model it is used with: a training model (its parameters are graph
            inputs, its trainable ones have gradient accumulation buffers), or any
            model whose parameters are initializers; a ``ModelProto`` or an ``.onnx``
            path (read without external data). None checks the file only.

    Returns:
        The checkpoint's metadata.

    Raises:
        TypeError: if an argument has the wrong type.
        FileNotFoundError: if the checkpoint, its ``.data`` file or the model is missing.
        onnxblocks.errors.CheckpointFormatError: if the file is not a valid checkpoint.
        onnxblocks.errors.CheckpointMismatchError: if it does not belong to ``model``,
            naming the parameter, both shapes or element types, and what to do.
    """
    reader = MappedCheckpoint(path_to_checkpoint)
    try:
        _check_file(reader)
        if model is not None:
            _check_against(reader, *_model_slots(model))
    finally:
        reader.close()
    return reader.parsed


def read_checked(
    path_to_checkpoint: str | os.PathLike, model: onnx.ModelProto | None, model_name: str = ""
) -> tuple[_format.ParsedCheckpoint, Checkpoint]:
    """Check a checkpoint as :func:`check_checkpoint` does and return its metadata and values,
    from one read of the file.

    Inline tensors are read-only views of the mapped file (no page is read until a value is
    used); external ones are read-only memory maps of the ``.data`` file.

    Args:
        path_to_checkpoint: The checkpoint file.
        model: The model it is used with (see :func:`check_checkpoint`), or None.
        model_name: How messages name the model (``the model 'training_model.onnx'``).

    Raises:
        As :func:`check_checkpoint`.
    """
    reader = MappedCheckpoint(path_to_checkpoint)
    _check_file(reader)
    if model is not None:
        _check_against(
            reader, model_parameter_slots(model), model_name or f"the model '{model.graph.name}'"
        )
    return reader.parsed, checkpoint_of(reader, copy=False)
