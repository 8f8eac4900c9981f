"""Reading ONNX Runtime training checkpoints: parameter values, parameter names, and models filled
from them.

Every reader here maps the checkpoint file into memory after checking that it is
a regular file (a FIFO or device would otherwise block or never end), and parses
it with :func:`onnxblocks.checkpoint.format.decode_checkpoint`, which checks every
offset before following it (:class:`onnxblocks.checkpoint.mapped.MappedCheckpoint`).
The optimizer state comes out as an :class:`~onnxblocks.checkpoint.OptimizerState`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.contracts import STEP_PROPERTY
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks._core.paths import as_path
from onnxblocks.checkpoint import format as _format
from onnxblocks.checkpoint import storage as _storage
from onnxblocks.checkpoint.mapped import MappedCheckpoint, map_file, open_regular
from onnxblocks.checkpoint.optimizer_state import OptimizerGroup, OptimizerState


@dataclass
class Checkpoint:
    """The contents of a checkpoint.

    Arrays of tensors kept in the external data file are read-only memory maps
    (nothing is read until used); inline ones are copies.

    Attributes:
        trainable: Trainable parameters by name, in file order.
        frozen: Frozen parameters by name, in file order.
        is_nominal: True for a nominal checkpoint (names only; the arrays are empty).
        has_external_data: True when tensor data lives in ``<checkpoint>.data``.
        version: The checkpoint format version.
        properties: User properties (ints, floats, strings) saved by a training session.
        optimizer_state: The optimizer groups (step, initial learning rate, moments per
            parameter) a training session saved; empty otherwise.
    """

    trainable: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray]
    is_nominal: bool
    has_external_data: bool
    version: int
    properties: dict[str, int | float | str] = field(default_factory=dict)
    optimizer_state: OptimizerState = field(default_factory=OptimizerState)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.trainable:
            return self.trainable[name]
        if name in self.frozen:
            return self.frozen[name]
        names = [*self.trainable, *self.frozen]
        raise UnknownNameError(
            f"The checkpoint has no parameter '{name}'.{did_you_mean(name, names)}"
        )

    def __iter__(self) -> Iterator[str]:
        yield from self.trainable
        yield from self.frozen


def is_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` is a regular file that starts like an ONNX Runtime training checkpoint.

    Only the file identifier (bytes 4..8, ``ODTC``) is read. A missing path, a
    directory or a non-regular file (FIFO, device) is not a checkpoint and is never read.
    """
    try:
        fd = open_regular(Path(os.fspath(path)), "File")
    except (OSError, _format.CheckpointFormatError):
        return False
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
    return head[4:8] == _format.FILE_IDENTIFIER


def read_parameter_names(path_to_checkpoint: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The ``(trainable_names, frozen_names)`` of a checkpoint, in file order, without reading
    tensor data.

    Only the flatbuffer metadata is read (the file is memory-mapped, so pages
    holding inline tensor bytes are never touched) and the ``.data`` side file is
    not opened.

    Raises:
        FileNotFoundError: if the checkpoint does not exist.
        onnxblocks.checkpoint.CheckpointFormatError: if the path is not a regular file or
            not a valid checkpoint.
    """
    path = as_path(path_to_checkpoint, "path_to_checkpoint")
    buf = map_file(_storage.resolve(path), path)
    try:
        parsed = _format.decode_checkpoint(buf, f"checkpoint '{path}'")
    finally:
        if isinstance(buf, mmap.mmap):
            with contextlib.suppress(
                BufferError
            ):  # a view kept alive by a traceback: it closes when freed
                buf.close()
    return [e.name for e in parsed.trainable], [e.name for e in parsed.frozen]


def check_scalars(parsed: _format.ParsedCheckpoint, where: str) -> None:
    """The step counters and learning rates, through the same checks as the session's setters.

    Raises:
        onnxblocks.errors.CheckpointFormatError: naming ``where`` and the value.
    """
    values: list[tuple[str, object, object]] = (
        [(f"the step property '{STEP_PROPERTY}'", parsed.properties[STEP_PROPERTY], _hyper.step)]
        if STEP_PROPERTY in parsed.properties
        else []
    )
    for group in parsed.optimizer_groups:
        values.append((f"the step of optimizer group '{group.name}'", group.step, _hyper.step))
        values.append(
            (
                f"the learning rate of optimizer group '{group.name}'",
                group.initial_learning_rate,
                _hyper.learning_rate,
            )
        )
    for what, value, check in values:
        try:
            check(value, what)  # type: ignore[operator]
        except (InvalidTypeError, InvalidValueError) as exc:
            raise _format.CheckpointFormatError(
                f"{where}: {exc} The checkpoint is corrupted; restore it from a copy or save it "
                "again."
            ) from None


def load_checkpoint(path_to_checkpoint: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by onnxblocks or by ONNX Runtime.

    Raises:
        FileNotFoundError: if the checkpoint (or its ``.data`` file) is missing.
        onnxblocks.checkpoint.CheckpointFormatError: if the file is not a valid checkpoint.
    """
    reader = MappedCheckpoint(path_to_checkpoint)
    check_scalars(reader.parsed, f"Checkpoint '{reader.path}'")
    return checkpoint_of(reader)


def checkpoint_of(reader: MappedCheckpoint, copy: bool = True) -> Checkpoint:
    """The contents of a checkpoint already mapped by ``reader`` (its scalars checked).

    Args:
        reader: The mapped checkpoint.
        copy: Copy inline tensors (False: read-only views of the mapped file, which stays
            mapped while any of them lives; no page is read until one is used).
    """
    parsed = reader.parsed
    optimizer_state = OptimizerState(
        tuple(
            OptimizerGroup(
                g.name,
                g.step,
                g.initial_learning_rate,
                {
                    p: [reader.array(m, inline_copy=copy) for m in moments]
                    for p, moments in g.moments.items()
                },
            )
            for g in parsed.optimizer_groups
        )
    )
    return Checkpoint(
        trainable={e.name: reader.array(e, inline_copy=copy) for e in parsed.trainable},
        frozen={e.name: reader.array(e, inline_copy=copy) for e in parsed.frozen},
        is_nominal=parsed.is_nominal,
        has_external_data=parsed.has_external_data,
        version=parsed.version,
        properties=dict(parsed.properties),
        optimizer_state=optimizer_state,
    )


def load_checkpoint_to_model(
    path_to_checkpoint: str | os.PathLike, model: onnx.ModelProto, *, strict: bool = False
) -> onnx.ModelProto:
    """Return a copy of ``model`` whose initializers hold the checkpoint's parameter values.

    Initializers named like a checkpoint parameter get its data (inline, in
    ``raw_data``); the model's other initializers (constants, buffers) are kept.
    ``model`` itself is not changed.

    At least one parameter must match an initializer: a checkpoint that matches
    none is not a checkpoint of this model, and loading it would silently change
    nothing. Checkpoint parameters the model does not have (e.g. parameters only
    the loss uses) are skipped with a :class:`UserWarning` naming them, or refused
    with ``strict=True``.

    Args:
        path_to_checkpoint: The checkpoint file.
        model: The model to fill (typically the inference model).
        strict: Refuse a checkpoint with parameters that are not initializers of ``model``.

    Raises:
        TypeError: if ``model`` is not an ``onnx.ModelProto``.
        ValueError: for a nominal checkpoint (it has no values), a checkpoint none of
            whose parameters is an initializer of the model (or, with ``strict``, one
            that has parameters the model lacks), or a parameter whose element type
            or shape differs from the model's initializer.
        onnxblocks.errors.CheckpointFormatError: if the file is not a valid checkpoint.
    """
    if not isinstance(model, onnx.ModelProto):
        raise InvalidTypeError(
            f"load_checkpoint_to_model() takes an onnx.ModelProto, not {type(model).__name__}."
        )
    reader = MappedCheckpoint(path_to_checkpoint)
    parsed = reader.parsed
    if parsed.is_nominal:
        raise InvalidValueError(
            f"Checkpoint '{reader.path}' is nominal: it names the parameters but holds no "
            "values. Load a "
            "complete checkpoint (saved with nominal_checkpoint=False, or by a training session)."
        )
    entries = {e.name: e for e in (*parsed.trainable, *parsed.frozen)}
    initializers = {init.name for init in model.graph.initializer}
    unmatched = [name for name in entries if name not in initializers]
    if len(unmatched) == len(entries) or (strict and unmatched):
        inputs = [name for name in unmatched if name in {i.name for i in model.graph.input}]
        hint = (
            f" The model takes {preview(inputs)} as graph inputs (a training or eval model?): "
            "pass the inference "
            "model, whose parameters are initializers."
            if inputs
            else " Pass the model the checkpoint was trained from."
        )
        what = (
            "none of its parameters"
            if len(unmatched) == len(entries)
            else f"parameters {preview(unmatched)}"
        )
        raise InvalidValueError(
            f"Checkpoint '{reader.path}' is not a checkpoint of this model: {what} "
            f"({preview(entries)}) {'is' if len(unmatched) == 1 else 'are'} an initializer of "
            "the model "
            f"(initializers: {preview(sorted(initializers))}).{hint}"
        )
    if unmatched:
        warnings.warn(
            f"Checkpoint parameters {preview(unmatched)} are not initializers of the model; they "
            "were not loaded. "
            "Pass strict=True to refuse such checkpoints.",
            UserWarning,
            stacklevel=2,
        )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        entry = entries.get(init.name)
        if entry is None:
            continue
        if entry.data_type != init.data_type or tuple(entry.dims) != tuple(init.dims):
            raise InvalidValueError(
                f"Checkpoint parameter '{entry.name}' is {_format.dtype_of(entry)} "
                f"{list(entry.dims)} but the "
                f"model's initializer is {_np_name(init.data_type)} {list(init.dims)}. "
                "The checkpoint belongs to a different model (same names, other shapes); pass "
                "the model it was "
                "trained from."
            )
        replacement = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
        if init.doc_string:
            replacement.doc_string = init.doc_string
        replacement.raw_data = reader.raw(entry)
        init.CopyFrom(replacement)
    return out


def _np_name(data_type: int) -> str:
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, ValueError):
        return f"element type {data_type}"
