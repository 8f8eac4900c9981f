"""Writing ONNX Runtime training checkpoints, streaming large parameters to a side file.

The flatbuffer has to be built back to front in memory, so it only ever holds
metadata and small data. When the parameters' total size is above
``external_data_threshold``, their bytes are copied in bounded chunks (from the
caller's TensorProtos, from a model's external data file, or from an
onnxblocks TensorSource) into ``<checkpoint>.data``, and the flatbuffer records
only each tensor's offset there. ONNX Runtime's ``load_checkpoint`` reads both.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from onnxblocks._core import weights as _weights
from onnxblocks.checkpoint import format as _format
from onnxblocks.io import atomic_outputs, tensor_chunks, write_tensor

#: Above this many parameter bytes in total, tensor data goes to ``<checkpoint>.data``.
DEFAULT_EXTERNAL_DATA_THRESHOLD = 64 * 1024 * 1024
#: Never keep more than this inline: a flatbuffer cannot exceed 2 GiB.
MAX_INLINE_BYTES = 1024 * 1024 * 1024
#: With external data, tensors smaller than this still stay inline.
MIN_EXTERNAL_BYTES = 64
#: Size of the pieces tensor bytes are copied in.
CHUNK_BYTES = 4 * 1024 * 1024

Parameter = onnx.TensorProto | _weights.TensorSource


@dataclass(frozen=True)
class _Param:
    """One parameter to save: its metadata and where its bytes come from."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    nbytes: int
    source: Parameter
    doc_string: str | None


def external_data_path(path: str | os.PathLike) -> Path:
    """The side file holding a checkpoint's external tensor data: ``<checkpoint>.data``."""
    p = Path(os.fspath(path))
    return p.with_name(p.name + _format.EXTERNAL_DATA_SUFFIX)


def _describe(param: Any, role: str, index: int) -> _Param:
    if isinstance(param, _weights.TensorSource):
        return _Param(param.name, param.data_type, tuple(param.dims), param.nbytes, param, None)
    if isinstance(param, onnx.TensorProto):
        doc = param.doc_string if param.HasField("doc_string") else None
        return _Param(param.name, param.data_type, tuple(param.dims), _weights.tensor_nbytes(param), param, doc)
    raise TypeError(
        f"{role} parameter #{index} is a {type(param).__name__}; checkpoints take onnx.TensorProto or "
        "onnxblocks TensorSource objects (e.g. accessor.weights.source(name))."
    )


def _check(params: list[_Param], nominal: bool) -> None:
    seen: set[str] = set()
    for p in params:
        if not p.name:
            raise ValueError("A parameter has an empty name; every checkpoint parameter needs a unique name.")
        if p.name in seen:
            raise ValueError(
                f"Parameter '{p.name}' appears twice in the checkpoint parameters; names must be unique across "
                "the trainable and frozen lists. Remove the duplicate."
            )
        seen.add(p.name)
        if p.data_type not in _format.LOADABLE_DTYPES and not nominal:
            kind = (
                onnx.TensorProto.DataType.Name(p.data_type)
                if p.data_type in onnx.TensorProto.DataType.values()
                else str(p.data_type)
            )
            raise ValueError(
                f"Parameter '{p.name}' has element type {kind}, which ONNX Runtime 1.19.2 cannot load from a "
                "checkpoint. Cast it to float32 (or another numeric type) first."
            )
        if any(d < 0 for d in p.dims):
            raise ValueError(f"Parameter '{p.name}' has a negative dimension {list(p.dims)}.")
        if not isinstance(p.source, _weights.TensorSource) and _weights.is_stub(p.source):
            raise ValueError(
                f"Parameter '{p.name}' is an onnxblocks stub, not data. Pass its TensorSource "
                "(accessor.weights.source(name)) or the finished model's initializer."
            )


def save_checkpoint(
    parameters: tuple[Sequence[Parameter], Sequence[Parameter]],
    path_to_checkpoint: str | os.PathLike,
    nominal_checkpoint: bool = False,
    *,
    external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD,
    base_dir: str | os.PathLike | None = None,
) -> Path:
    """Write ``(trainable, frozen)`` parameters as an ONNX Runtime training checkpoint.

    The file loads with ONNX Runtime's ``CheckpointState.load_checkpoint``. Up to
    ``external_data_threshold`` bytes of parameters in total are stored inline in
    the checkpoint file, byte for byte as ONNX Runtime's own writer does. Above
    it, every tensor of at least 64 bytes is streamed in bounded chunks into
    ``<checkpoint>.data`` instead, so memory use stays flat however large the
    model. Both files are written atomically (temporary files in the target
    directory, then renamed); a stale ``.data`` file from an earlier save is
    removed when the new checkpoint does not need one.

    Args:
        parameters: ``(trainable, frozen)``: sequences of ``onnx.TensorProto`` or
            :class:`~onnxblocks._core.weights.TensorSource`. Their bytes are read,
            never copied as a whole nor modified.
        path_to_checkpoint: The checkpoint file to write.
        nominal_checkpoint: Write names and element types only, no data (the
            training session later takes the values from the training model).
        external_data_threshold: Total parameter bytes above which data goes to
            the side file; 0 always uses it. At most 1 GiB is ever kept inline.
        base_dir: Directory that TensorProtos with external data are relative to.

    Returns:
        The path of the checkpoint file.

    Raises:
        TypeError: if ``parameters`` is not a (trainable, frozen) pair of tensors.
        ValueError: for duplicate names, unsupported element types, stubs, or
            data that does not match its shape.
    """
    if not (isinstance(parameters, (tuple, list)) and len(parameters) == 2):
        raise TypeError(
            "parameters must be a (trainable, frozen) pair of sequences of onnx.TensorProto / TensorSource, "
            f"not {type(parameters).__name__}. Pass e.g. ([w, b], [])."
        )
    if (
        isinstance(external_data_threshold, bool)
        or not isinstance(external_data_threshold, int)
        or external_data_threshold < 0
    ):
        raise ValueError(f"external_data_threshold must be an int >= 0, got {external_data_threshold!r}.")
    groups = []
    for role, params in zip(("Trainable", "Frozen"), parameters, strict=True):
        if isinstance(params, (str, bytes, onnx.TensorProto)) or not isinstance(params, Sequence):
            raise TypeError(
                f"The {role.lower()} parameters must be a sequence of tensors, not {type(params).__name__}."
            )
        groups.append([_describe(p, role, i) for i, p in enumerate(params)])
    trainable, frozen = groups
    _check(trainable + frozen, nominal_checkpoint)

    target = Path(os.fspath(path_to_checkpoint))
    if target.is_dir():
        raise IsADirectoryError(
            f"'{target}' is a directory; save_checkpoint writes a checkpoint *file*. Pass a file path, e.g. "
            f"'{target / 'checkpoint'}'."
        )
    data_path = external_data_path(target)
    total = sum(p.nbytes for p in trainable + frozen)
    use_external = not nominal_checkpoint and total > min(external_data_threshold, MAX_INLINE_BYTES)

    with atomic_outputs(*([data_path] if use_external else []), target) as temps:
        offsets: dict[str, int] = {}
        if use_external:
            with open(temps[0], "wb") as data:
                for p in trainable + frozen:
                    if p.nbytes >= MIN_EXTERNAL_BYTES:
                        offsets[p.name] = write_tensor(data, p.source, base_dir, p.nbytes, p.name)

        def record(p: _Param) -> _format.TensorRecord:
            if nominal_checkpoint:
                return _format.TensorRecord(p.name, p.data_type, (), 0, tuple, doc_string=p.doc_string)
            if p.name in offsets:
                return _format.TensorRecord(
                    p.name, p.data_type, p.dims, external_offset=offsets[p.name], doc_string=p.doc_string
                )
            return _format.TensorRecord(
                p.name,
                p.data_type,
                p.dims,
                p.nbytes,
                lambda: tensor_chunks(p.source, base_dir, CHUNK_BYTES),
                doc_string=p.doc_string,
            )

        buffer = _format.encode_checkpoint(
            [record(p) for p in trainable],
            [record(p) for p in frozen],
            nominal=nominal_checkpoint,
            has_external_data=use_external,
        )
        with open(temps[-1], "wb") as f:
            f.write(buffer)
    if not use_external:
        with contextlib.suppress(FileNotFoundError):
            data_path.unlink()
    return target
