"""The frozen base of an artifact set: its weights stored once, in one file every model references.

A model's weights that do not train stay constants of the training, eval and
step graphs (every initializer that is neither in ``requires_grad`` nor in
``frozen_params``; with LoRA, the whole base model). Written with each model,
they would be stored once per model (three copies of a 540 MB base for portable
artifacts). Instead, every held base weight of at least :data:`BASE_THRESHOLD`
bytes is written once, into ``<prefix>base_weights.bin`` in the artifact
directory, and each model's initializer refers to it by location, offset and
length (the ONNX external-data fields). Smaller tensors stay inline.

The file is a *hard link* of the source model's external data file when every
shared tensor lies in that one file at an offset its element type aligns
(offsets kept, no byte copied, no disk space used) and the file system allows
it; else the tensors are streamed into a new file, page-aligned from 1 MiB.
Either way the file is made in the staging directory of
:mod:`onnxblocks.artifacts.files` and committed with the rest of the set, so a
killed run never leaves a half-written one.

A hard link shares the source file's bytes: rewriting that file in place (not
writing a new file) changes the artifacts too. Export a new model to a new path.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxblocks._core import weights as _weights
from onnxblocks._core.contracts import BASE_DTYPE_METADATA, ONNX_SUFFIX
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError

logger = logging.getLogger(__name__)

__all__ = [
    "BASE_DTYPES",
    "BASE_DTYPE_METADATA",
    "BASE_THRESHOLD",
    "BaseWeights",
    "base_dtype",
    "base_names",
    "cast_base",
    "store_base",
    "write_base_weights",
]

#: Base weights of at least this many bytes go to the shared file; smaller ones stay inline (onnx's
#: size_threshold).
BASE_THRESHOLD = 1024
#: The element types a float32 base can be stored in (``generate_artifacts(base_dtype=...)``).
BASE_DTYPES = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}
_FLOAT = onnx.TensorProto.FLOAT
#: The largest finite float16.
_FLOAT16_MAX = 65504.0


@dataclass(frozen=True)
class BaseWeights:
    """The shared file of one artifact set, as written.

    Attributes:
        path: The file (in the staging directory while the set is written).
        references: Initializer name -> (location, offset, length), for
        ``save_model(references=...)``.
        linked: True when the file is a hard link of the source model's external data file.
    """

    path: Path
    references: dict[str, tuple[str, int, int]]
    linked: bool

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors the file holds (a linked file may hold more: the source's other
        tensors).
        """
        return sum(length for _, _, length in self.references.values())


def base_names(
    models: Sequence[onnx.ModelProto | None],
    store: _weights.WeightStore,
    threshold: int = BASE_THRESHOLD,
) -> list[str]:
    """The initializers the models share through the base file, in the order they first appear.

    These are the held weights (stubs whose bytes the build's ``store`` knows: the
    base model's weights, the same bytes in every model that names them) of at
    least ``threshold`` bytes. Parameters fed from the checkpoint are graph inputs,
    not initializers, so they are never among them.
    """
    found: dict[str, None] = {}
    for model in models:
        if model is None:
            continue
        for init in model.graph.initializer:
            if init.name in found or not _weights.is_stub(init) or init.name not in store:
                continue
            if store.source(init.name).nbytes >= threshold:
                found[init.name] = None
    return list(found)


def store_base(
    target: Path, models: Sequence[onnx.ModelProto | None], store: _weights.WeightStore
) -> dict[str, tuple[str, int, int]]:
    """Write the base weights ``models`` share once, into ``target``; their references (none: no
    file written).

    Raises:
        ValueError: if a held tensor's bytes do not match its dims and element type.
        OSError: if a source file ends early or ``target`` cannot be written.
    """
    shared = base_names(models, store)
    if not shared:
        return {}
    return write_base_weights(target, [store.source(n) for n in shared]).references


def write_base_weights(target: Path, sources: Sequence[_weights.TensorSource]) -> BaseWeights:
    """Write the shared base file ``target`` holding ``sources``: a hard link where the layout fits,
    else a copy.

    ``target`` must not exist (it is a path in a fresh staging directory).

    Raises:
        ValueError: if a source's bytes do not match its dims and element type.
        OSError: if the source file ends early or ``target`` cannot be written.
    """
    location = target.name
    linked = _link(target, sources)
    if linked is not None:
        logger.info(
            "Base weights: %s hard-linked from %s (%d tensors).",
            target.name,
            sources[0].path,
            len(linked),
        )
        return BaseWeights(
            target, {n: (location, o, s) for n, (o, s) in linked.items()}, linked=True
        )
    from onnxblocks.io import write_tensor  # a lower layer, loaded on first use

    references: dict[str, tuple[str, int, int]] = {}
    with open(target, "wb") as out:
        for source in sources:
            size = source.nbytes
            offset = write_tensor(out, source, None, size, source.name)
            references[source.name] = (location, offset, size)
    logger.info("Base weights: %d tensors written to %s.", len(references), target.name)
    return BaseWeights(target, references, linked=False)


def _link(
    target: Path, sources: Sequence[_weights.TensorSource]
) -> dict[str, tuple[int, int]] | None:
    """Hard-link the one external data file all ``sources`` lie in; their (offset, length), or
    None where it cannot.
    """
    paths = {s.path for s in sources}
    if not sources or len(paths) != 1 or None in paths:
        return None  # in memory, or spread over several files
    source = paths.pop()
    assert source is not None
    if source.suffix == ONNX_SUFFIX:
        return None  # weights inside a model file: between protobuf fields, not aligned
    for s in sources:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(s.data_type).itemsize
        if s.offset % max(itemsize, 1):
            return (
                None  # a runtime would map the tensor at an address its element type does not align
            )
    try:
        os.link(source, target)
    except (
        OSError
    ) as exc:  # another file system (EXDEV), no hard links (EPERM), too many links (EMLINK)
        logger.info("Base weights: cannot hard-link %s (%s); copying.", source, exc.strerror or exc)
        return None
    size = target.stat().st_size
    if any(
        s.offset + s.nbytes > size for s in sources
    ):  # changed since it was checked: copy what we read
        target.unlink()
        return None
    return {s.name: (s.offset, s.nbytes) for s in sources}


# ------------------------------------------------------------------ a base stored in float16 /
# bfloat16
def base_dtype(value: Any) -> int | None:
    """The ONNX element type ``generate_artifacts(base_dtype=...)`` asks for (None: as exported).

    Raises:
        InvalidTypeError: for a value that is not a str or None.
        InvalidValueError: for a name other than ``"float16"`` or ``"bfloat16"``.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidTypeError(
            f"base_dtype must be None, 'float16' or 'bfloat16', not {type(value).__name__}."
        )
    if value not in BASE_DTYPES:
        raise InvalidValueError(
            f"base_dtype={value!r} is not supported: pass 'float16' or 'bfloat16', or None to "
            "keep the base's type."
        )
    return BASE_DTYPES[value]


def cast_base(
    training: onnx.ModelProto,
    evaluation: onnx.ModelProto,
    step: onnx.ModelProto | None,
    store: _weights.WeightStore,
    dtype: int | None,
) -> tuple[onnx.ModelProto, onnx.ModelProto, onnx.ModelProto | None, _weights.WeightStore]:
    """The models with their float32 base weights stored as ``dtype``, each cast back to float32
    where it is read.

    The base weights are those :func:`base_names` finds; each keeps its name, takes
    the element type ``dtype`` and is read through a ``Cast`` to float32 (see
    :func:`onnxblocks.ir.edit.cast_initializers`). Their bytes are converted when the
    base file is written (rounded to nearest even), one tensor at a time. The models
    record ``onnxblocks.base_dtype`` in their metadata. Neither the models nor
    ``store`` is changed; a ``dtype`` of None changes nothing.

    Returns:
        The training, eval and step models (the step model None if it was) and a store
        holding the converted weights.
    """
    names = [
        n
        for n in base_names((training, evaluation, step), store)
        if store.source(n).data_type == _FLOAT
    ]
    if dtype is None or not names:
        return training, evaluation, step, store
    import onnx_ir as ir

    from onnxblocks.ir import edit, serde  # a lower layer, loaded on first use (it imports onnx-ir)

    converted = _weights.WeightStore()
    for name in store:
        converted.add(store.source(name))
    target = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    stubs: dict[str, ir.TensorProtocol] = {}
    for name in names:
        source = store.source(name)
        converted.add(
            _weights.TensorSource(
                name, dtype, source.dims, load=functools.partial(_convert, source, target)
            )
        )
        where, shape = _weights.HELD_LOCATION_PREFIX + name, ir.Shape(source.dims)
        stubs[name] = ir.ExternalTensor(
            where, None, None, ir.DataType(dtype), shape=shape, name=name
        )

    def cast(model: onnx.ModelProto) -> onnx.ModelProto:
        graph_ir = serde.from_proto(model)
        edit.cast_initializers(graph_ir.graph, stubs)
        graph_ir.metadata_props[BASE_DTYPE_METADATA] = onnx.TensorProto.DataType.Name(dtype).lower()
        return serde.to_proto(graph_ir)

    return cast(training), cast(evaluation), cast(step) if step is not None else None, converted


def _convert(source: _weights.TensorSource, dtype: np.dtype) -> np.ndarray:
    """A float32 base weight in ``dtype`` (float16: refused where a value does not fit)."""
    values = source.array()
    if dtype == np.float16:
        finite = values[np.isfinite(values)]
        if finite.size and float(np.abs(finite).max()) > _FLOAT16_MAX:
            raise InvalidValueError(
                f"Base weight '{source.name}' holds {float(np.abs(finite).max()):g}, beyond "
                "float16's range "
                f"(+-{_FLOAT16_MAX:g}). Store the base as base_dtype='bfloat16' (float32's "
                "range), or keep float32."
            )
    return values.astype(dtype)
