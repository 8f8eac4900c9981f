"""Writing ONNX Runtime training checkpoints, streaming large parameters to a side file.

The flatbuffer has to be built back to front in memory, so it only ever holds
metadata and small data. When the parameters' total size is above
``external_data_threshold``, their bytes are copied in bounded chunks (from the
caller's TensorProtos, from a model's external data file, or from an
onnxblocks TensorSource) into ``<checkpoint>.data``, and the flatbuffer records
only each tensor's offset there. ONNX Runtime's ``load_checkpoint`` reads both.

A checkpoint can also carry a training run's optimizer state (step, learning
rate and moments per optimizer group) and its property bag, laid out as ONNX
Runtime's ``save_checkpoint`` lays them out, so a run saved by one backend
resumes on another: ``save_checkpoint((ck.trainable, ck.frozen), path,
optimizer_state=ck.optimizer_state, properties=ck.properties)`` re-writes what
:func:`~onnxblocks.checkpoint.load_checkpoint` read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core import weights as _weights
from onnxblocks._core.contracts import STEP_PROPERTY, checkpoint_moment_name
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, IsAFolderError
from onnxblocks._core.paths import as_path
from onnxblocks.checkpoint import format as _format
from onnxblocks.checkpoint import storage as _storage
from onnxblocks.checkpoint.optimizer_state import OptimizerState
from onnxblocks.io import tensor_chunks, write_aligned, write_tensor

#: Above this many parameter bytes in total, tensor data goes to ``<checkpoint>.data``.
DEFAULT_EXTERNAL_DATA_THRESHOLD = 64 * 1024 * 1024
#: Never keep more than this inline: a flatbuffer cannot exceed 2 GiB.
MAX_INLINE_BYTES = 1024 * 1024 * 1024
#: With external data, tensors smaller than this still stay inline.
MIN_EXTERNAL_BYTES = 64
#: Size of the pieces tensor bytes are copied in.
CHUNK_BYTES = 4 * 1024 * 1024

Parameter = onnx.TensorProto | _weights.TensorSource
#: Frozen tensors whose names start with this are kept beside the model's parameters (a weight EMA:
#: ``onnxblocks.extra/ema/<parameter>``): ONNX Runtime loads and saves them as it does any frozen
#: parameter, the
#: model never reads them, and onnxblocks' checks and backends leave them out of the model's
#: parameters.
EXTRA_PREFIX = "onnxblocks.extra/"


@dataclass(frozen=True)
class _Param:
    """One tensor to save (a parameter or a moment): its metadata and where its bytes come from."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    nbytes: int
    source: Parameter | np.ndarray
    doc_string: str | None

    def chunks(self, base_dir: str | os.PathLike | None) -> Iterator[bytes | memoryview]:
        source = self.source
        if isinstance(source, np.ndarray):
            data = source.reshape(-1).view(np.uint8).data  # the array's bytes, not a copy
            for start in range(0, len(data), CHUNK_BYTES):
                yield data[start : start + CHUNK_BYTES]
            return
        yield from tensor_chunks(source, base_dir, CHUNK_BYTES)

    def write(self, out: Any, base_dir: str | os.PathLike | None) -> int:
        if isinstance(self.source, np.ndarray):
            return write_aligned(out, self.chunks(base_dir), self.nbytes, self.name)
        return write_tensor(out, self.source, base_dir, self.nbytes, self.name)


def _from_array(name: str, value: Any, role: str) -> _Param:
    array = np.asarray(value)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    data_type = next((t for t, d in _format.LOADABLE_DTYPES.items() if d == dtype), None)
    if data_type is None:
        raise InvalidValueError(
            f"{role} '{name}' is a {array.dtype} array, which ONNX Runtime cannot load from a "
            "checkpoint. "
            "Cast it to float32 (or another numeric type) first."
        )
    array = np.ascontiguousarray(array, dtype=dtype)
    return _Param(name, data_type, tuple(int(d) for d in array.shape), array.nbytes, array, None)


def external_data_path(path: str | os.PathLike) -> Path:
    """The side file holding a checkpoint's external tensor data: ``<checkpoint>.data``."""
    p = Path(os.fspath(path))
    return p.with_name(p.name + _format.EXTERNAL_DATA_SUFFIX)


def _describe(param: Any, role: str, index: int) -> _Param:
    if isinstance(param, tuple) and len(param) == 2 and isinstance(param[0], str):
        return _from_array(param[0], param[1], f"{role} parameter")
    if isinstance(param, _weights.TensorSource):
        return _Param(param.name, param.data_type, tuple(param.dims), param.nbytes, param, None)
    if isinstance(param, onnx.TensorProto):
        doc = param.doc_string if param.HasField("doc_string") else None
        return _Param(
            param.name,
            param.data_type,
            tuple(param.dims),
            _weights.tensor_nbytes(param),
            param,
            doc,
        )
    raise InvalidTypeError(
        f"{role} parameter #{index} is a {type(param).__name__}; checkpoints take "
        "onnx.TensorProto or "
        "onnxblocks TensorSource objects (e.g. accessor.weights.source(name)), or a {name: "
        "array} mapping."
    )


def _check(params: list[_Param], nominal: bool) -> None:
    seen: set[str] = set()
    for p in params:
        if not p.name:
            raise InvalidValueError(
                "A parameter has an empty name; every checkpoint parameter needs a unique name."
            )
        if p.name in seen:
            raise InvalidValueError(
                f"Parameter '{p.name}' appears twice in the checkpoint parameters; names must be "
                "unique across "
                "the trainable and frozen lists. Remove the duplicate."
            )
        seen.add(p.name)
        if p.data_type not in _format.LOADABLE_DTYPES and not nominal:
            kind = (
                onnx.TensorProto.DataType.Name(p.data_type)
                if p.data_type in onnx.TensorProto.DataType.values()
                else str(p.data_type)
            )
            raise InvalidValueError(
                f"Parameter '{p.name}' has element type {kind}, which ONNX Runtime 1.19.2 cannot "
                "load from a "
                "checkpoint. Cast it to float32 (or another numeric type) first."
            )
        if any(d < 0 for d in p.dims):
            raise InvalidValueError(
                f"Parameter '{p.name}' has a negative dimension {list(p.dims)}."
            )
        if isinstance(p.source, onnx.TensorProto) and _weights.is_stub(p.source):
            raise InvalidValueError(
                f"Parameter '{p.name}' is an onnxblocks stub, not data. Pass its TensorSource "
                "(accessor.weights.source(name)) or the finished model's initializer."
            )


def save_checkpoint(
    parameters: tuple[
        Sequence[Parameter] | Mapping[str, Any], Sequence[Parameter] | Mapping[str, Any]
    ],
    path_to_checkpoint: str | os.PathLike,
    nominal_checkpoint: bool = False,
    *,
    external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD,
    base_dir: str | os.PathLike | None = None,
    optimizer_state: OptimizerState | Mapping[str, Mapping[str, Any]] | None = None,
    properties: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``(trainable, frozen)`` parameters as an ONNX Runtime training checkpoint.

    The file loads with ONNX Runtime's ``CheckpointState.load_checkpoint``. Up to
    ``external_data_threshold`` bytes of parameters in total are stored inline in
    the checkpoint file, byte for byte as ONNX Runtime's own writer does. Above
    it, every tensor of at least 64 bytes is streamed in bounded chunks into
    ``<checkpoint>.data`` instead, so memory use stays flat however large the
    model. The old checkpoint is replaced all-or-nothing, its data file with it,
    even when interrupted or killed (see :mod:`onnxblocks.checkpoint.storage`);
    a stale ``.data`` file is removed when the new checkpoint does not need
    one, and temporary files of killed saves are removed.

    Args:
        parameters: ``(trainable, frozen)``: sequences of ``onnx.TensorProto`` or
            :class:`~onnxblocks._core.weights.TensorSource`, or ``{name: array}``
            mappings (numpy arrays, e.g. a loaded :class:`Checkpoint`'s
            ``trainable`` and ``frozen``). Their bytes are read, never copied as
            a whole nor modified.
        path_to_checkpoint: The checkpoint file to write.
        nominal_checkpoint: Write names and element types only, no data (the
            training session later takes the values from the training model).
        external_data_threshold: Total parameter bytes above which data goes to
            the side file; 0 always uses it. At most 1 GiB is ever kept inline.
        base_dir: Directory that TensorProtos with external data are relative to.
        optimizer_state: The optimizer state: an :class:`OptimizerState` (what
            :attr:`Checkpoint.optimizer_state` holds; ``OptimizerState.single(step, lr,
            {param: [first, second, ...]})`` for ONNX Runtime's group ``"group0"``), or
            its dict form ``{group: {"step": int, "initial_learning_rate": float,
            "moments": {param: [first, second, ...]}}}`` (AdamW: two moments per
            trainable parameter, SGD: none). None writes a freshly generated
            checkpoint's layout (no group vector); ``{}`` a training session's
            without optimizer state.
        properties: The property bag: int (int64), float (stored as float32) or
            str values by name.

    Returns:
        The path of the checkpoint file.

    Raises:
        TypeError: if ``parameters`` is not a (trainable, frozen) pair of tensors, or
            a property is not an int, float or str.
        ValueError: for duplicate names, unsupported element types, stubs, data
            that does not match its shape, or moments that do not match a
            trainable parameter.
    """
    if not (isinstance(parameters, (tuple, list)) and len(parameters) == 2):
        raise InvalidTypeError(
            "parameters must be a (trainable, frozen) pair of sequences of onnx.TensorProto / "
            "TensorSource, "
            f"not {type(parameters).__name__}. Pass e.g. ([w, b], [])."
        )
    _hyper.count(external_data_threshold, "external_data_threshold")
    groups = []
    params: Any
    for role, params in zip(("Trainable", "Frozen"), parameters, strict=True):
        if isinstance(params, Mapping):
            params = list(params.items())  # (name, array) pairs, see _describe
        if isinstance(params, (str, bytes, onnx.TensorProto)) or not isinstance(params, Sequence):
            raise InvalidTypeError(
                f"The {role.lower()} parameters must be a sequence of tensors or a {{name: "
                "array} mapping, not "
                f"{type(params).__name__}."
            )
        groups.append([_describe(p, role, i) for i, p in enumerate(params)])
    trainable, frozen = groups
    _check(trainable + frozen, nominal_checkpoint)
    bag = {name: _format.check_property(name, value) for name, value in (properties or {}).items()}
    if STEP_PROPERTY in bag:
        _hyper.step(bag[STEP_PROPERTY], f"property '{STEP_PROPERTY}'")
    states = _optimizer_states(optimizer_state, trainable, nominal_checkpoint)
    moments = [m for _, per_param in states for ms in per_param.values() for m in ms.values()]

    target = as_path(path_to_checkpoint, "path_to_checkpoint")
    if target.is_dir():
        raise IsAFolderError(
            f"'{target}' is a directory; save_checkpoint writes a checkpoint *file*. Pass a file "
            "path, e.g. "
            f"'{target / 'checkpoint'}'."
        )
    total = sum(p.nbytes for p in trainable + frozen + moments)
    use_external = not nominal_checkpoint and total > min(external_data_threshold, MAX_INLINE_BYTES)

    with _storage.replacing(
        target
    ) as staged:  # header and data file replace the old pair all-or-nothing
        offsets: dict[int, int] = {}  # by id(_Param): a moment has its parameter's tensor name
        if use_external:
            with open(staged.data, "wb") as data:
                for p in trainable + frozen + moments:
                    if p.nbytes >= MIN_EXTERNAL_BYTES:
                        offsets[id(p)] = p.write(data, base_dir)

        def record(p: _Param) -> _format.TensorRecord:
            if nominal_checkpoint:
                return _format.TensorRecord(
                    p.name, p.data_type, (), 0, tuple, doc_string=p.doc_string
                )
            if id(p) in offsets:
                return _format.TensorRecord(
                    p.name,
                    p.data_type,
                    p.dims,
                    external_offset=offsets[id(p)],
                    doc_string=p.doc_string,
                )
            return _format.TensorRecord(
                p.name,
                p.data_type,
                p.dims,
                p.nbytes,
                lambda: p.chunks(base_dir),
                doc_string=p.doc_string,
            )

        buffer = _format.encode_checkpoint(
            [record(p) for p in trainable],
            [record(p) for p in frozen],
            nominal=nominal_checkpoint,
            has_external_data=use_external,
            optimizer_groups=None
            if optimizer_state is None
            else [
                _format.OptimizerGroupRecord(
                    name,
                    step,
                    lr,
                    {
                        param: {k: record(m) for k, m in ms.items()}
                        for param, ms in per_param.items()
                    },
                )
                for (name, step, lr), per_param in states
            ],
            properties=bag,
        )
        with open(staged.header, "wb") as f:
            f.write(buffer)
    return target


def _optimizer_states(
    optimizer_state: OptimizerState | Mapping[str, Any] | None,
    trainable: list[_Param],
    nominal: bool,
) -> list[tuple[tuple[str, int, float], dict[str, dict[str, _Param]]]]:
    """Check the optimizer state against the trainable parameters.

    Returns:
        ``((group, step, learning rate), {param: {moment name: tensor}})`` per group.
    """
    if not optimizer_state:
        return []
    if nominal:
        raise InvalidValueError(
            "A nominal checkpoint holds no values, so it cannot hold optimizer state. Pass one "
            "or the other."
        )
    state = OptimizerState.of(optimizer_state)
    shapes = {p.name: (p.data_type, p.dims) for p in trainable}
    out = []
    for group in state.groups:
        per_param: dict[str, dict[str, _Param]] = {}
        for param, arrays in group.moments.items():
            if param not in shapes:
                raise InvalidValueError(
                    f"optimizer group '{group.name}' holds moments of '{param}', which is not a "
                    "trainable parameter of the "
                    f"checkpoint ({sorted(shapes)}). Save the optimizer state with the "
                    "parameters it belongs to."
                )
            moments = {
                checkpoint_moment_name(i): _from_array(param, a, "moment of")
                for i, a in enumerate(arrays)
            }
            for name, m in moments.items():
                if (m.data_type, m.dims) != shapes[param]:
                    raise InvalidValueError(
                        f"moment '{name}' of parameter '{param}' in optimizer group "
                        f"'{group.name}' has shape {list(m.dims)} "
                        f"(element type {m.data_type}); the parameter has shape "
                        f"{list(shapes[param][1])} (element "
                        f"type {shapes[param][0]}). Moments have their parameter's shape and type."
                    )
            per_param[param] = {
                name: _Param(name, m.data_type, m.dims, m.nbytes, m.source, None)
                for name, m in moments.items()
            }
        out.append(((group.name, group.step, group.initial_learning_rate), per_param))
    return out
