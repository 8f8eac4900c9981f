"""Reading ONNX Runtime training checkpoints: parameter values, and models filled from them."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnxblocks.checkpoint import format as _format
from onnxblocks.checkpoint.save import external_data_path
from onnxblocks._core.errors import did_you_mean


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
        optimizer_state: Per optimizer group: ``{"step": int, "initial_learning_rate": float,
            "moments": {param: [arrays]}}``, when a training session saved it.
    """

    trainable: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray]
    is_nominal: bool
    has_external_data: bool
    version: int
    properties: dict[str, int | float | str] = field(default_factory=dict)
    optimizer_state: dict[str, dict] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.trainable:
            return self.trainable[name]
        if name in self.frozen:
            return self.frozen[name]
        names = [*self.trainable, *self.frozen]
        raise KeyError(f"The checkpoint has no parameter '{name}'.{did_you_mean(name, names)}")

    def __iter__(self) -> Iterator[str]:
        yield from self.trainable
        yield from self.frozen


class _Reader:
    """A checkpoint file mapped into memory, with its optional side data file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(os.fspath(path))
        if self.path.is_dir():
            raise IsADirectoryError(f"'{self.path}' is a directory; pass the checkpoint file inside it.")
        if not self.path.is_file():
            raise FileNotFoundError(f"Checkpoint file '{self.path}' does not exist.")
        with open(self.path, "rb") as f:
            self.buf: mmap.mmap | bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) \
                if os.path.getsize(self.path) else b""
        self.parsed = _format.decode_checkpoint(self.buf, f"checkpoint '{self.path}'")
        self.data_path = external_data_path(self.path)
        if self.parsed.has_external_data and not self.data_path.is_file():
            raise FileNotFoundError(
                f"Checkpoint '{self.path}' keeps its tensor data in '{self.data_path}', which does not exist. "
                "Keep the .data file beside the checkpoint."
            )

    def raw(self, entry: _format.TensorEntry) -> bytes:
        """All bytes of one tensor."""
        return self.array(entry, copy=True).tobytes()

    def array(self, entry: _format.TensorEntry, copy: bool = False) -> np.ndarray:
        """One tensor as a numpy array (a read-only memory map for external data unless ``copy``)."""
        dtype = _format.dtype_of(entry)
        if self.parsed.is_nominal:
            return np.empty((0,), dtype)
        size = entry.nbytes
        if entry.external_offset is not None:
            if not self.parsed.has_external_data:
                raise _format.CheckpointFormatError(
                    f"Tensor '{entry.name}' of checkpoint '{self.path}' has external data but the checkpoint "
                    "says it has none. The file is invalid."
                )
            if entry.external_offset + size > os.path.getsize(self.data_path):
                raise _format.CheckpointFormatError(
                    f"Tensor '{entry.name}' needs bytes {entry.external_offset}..{entry.external_offset + size} of "
                    f"'{self.data_path}', which is shorter. The data file is truncated or belongs to another "
                    "checkpoint."
                )
            count = size // dtype.itemsize
            if count == 0:
                return np.empty(entry.dims, dtype)
            mapped = np.memmap(self.data_path, dtype=dtype, mode="r", offset=entry.external_offset,
                               shape=(count,)).reshape(entry.dims)
            return np.array(mapped) if copy else mapped
        if entry.inline is None:
            raise _format.CheckpointFormatError(
                f"Tensor '{entry.name}' of checkpoint '{self.path}' has neither inline nor external data."
            )
        start, length = entry.inline
        if length != size:
            raise _format.CheckpointFormatError(
                f"Tensor '{entry.name}' of checkpoint '{self.path}' has {length} bytes but its dims "
                f"{list(entry.dims)} need {size}."
            )
        return np.frombuffer(self.buf, dtype=dtype, count=size // dtype.itemsize, offset=start) \
            .reshape(entry.dims).copy()


def load_checkpoint(path_to_checkpoint: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by onnxblocks or by ONNX Runtime.

    Raises:
        FileNotFoundError: if the checkpoint (or its ``.data`` file) is missing.
        onnxblocks.checkpoint.CheckpointFormatError: if the file is not a valid checkpoint.
    """
    reader = _Reader(path_to_checkpoint)
    parsed = reader.parsed
    optimizer_state = {
        g.name: {
            "step": g.step,
            "initial_learning_rate": g.initial_learning_rate,
            "moments": {p: [reader.array(m) for m in moments] for p, moments in g.moments.items()},
        }
        for g in parsed.optimizer_groups
    }
    return Checkpoint(
        trainable={e.name: reader.array(e) for e in parsed.trainable},
        frozen={e.name: reader.array(e) for e in parsed.frozen},
        is_nominal=parsed.is_nominal,
        has_external_data=parsed.has_external_data,
        version=parsed.version,
        properties=dict(parsed.properties),
        optimizer_state=optimizer_state,
    )


def load_checkpoint_to_model(path_to_checkpoint: str | os.PathLike, model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of ``model`` whose initializers hold the checkpoint's parameter values.

    Initializers named like a checkpoint parameter get its data (inline, in
    ``raw_data``); others are kept. ``model`` itself is not changed.

    Raises:
        ValueError: for a nominal checkpoint (it has no values), or a parameter whose
            element type or shape differs from the model's initializer.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"load_checkpoint_to_model() takes an onnx.ModelProto, not {type(model).__name__}.")
    reader = _Reader(path_to_checkpoint)
    parsed = reader.parsed
    if parsed.is_nominal:
        raise ValueError(
            f"Checkpoint '{reader.path}' is nominal: it names the parameters but holds no values. Load a "
            "complete checkpoint (saved with nominal_checkpoint=False, or by a training session)."
        )
    entries = {e.name: e for e in (*parsed.trainable, *parsed.frozen)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        entry = entries.get(init.name)
        if entry is None:
            continue
        if entry.data_type != init.data_type or tuple(entry.dims) != tuple(init.dims):
            raise ValueError(
                f"Checkpoint parameter '{entry.name}' is {_format.dtype_of(entry)} {list(entry.dims)} but the "
                f"model's initializer is {onnx.helper.tensor_dtype_to_np_dtype(init.data_type)} {list(init.dims)}. "
                "The checkpoint belongs to a different model."
            )
        replacement = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
        if init.doc_string:
            replacement.doc_string = init.doc_string
        replacement.raw_data = reader.raw(entry)
        init.CopyFrom(replacement)
    return out
