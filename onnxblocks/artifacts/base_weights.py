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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxblocks._core import limits as _limits
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
    "check_block_size",
    "quantize",
    "store_base",
    "write_base_weights",
]

#: Base weights of at least this many bytes go to the shared file; smaller ones stay inline (onnx's
#: size_threshold).
BASE_THRESHOLD = 1024
#: The element types a float32 base can be stored in (``generate_artifacts(base_dtype=...)``).
BASE_DTYPES = {
    "float16": onnx.TensorProto.FLOAT16,
    "bfloat16": onnx.TensorProto.BFLOAT16,
    "int8": onnx.TensorProto.INT8,
    "int4": onnx.TensorProto.INT4,
}
#: The quantized element types, and the largest magnitude each stores (symmetric: -q..q).
QUANTIZED: dict[int, int] = {onnx.TensorProto.INT8: 127, onnx.TensorProto.INT4: 7}
#: The block sizes of a quantized base (elements of a row sharing one scale).
QUANT_BLOCK_SIZES = (32, 64, 128)
#: The opset of ``DequantizeLinear`` with ``block_size`` (and of int4).
QUANT_OPSET = 21
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
def base_dtype(value: Any, block_size: Any = 32) -> tuple[int | None, int]:
    """The ONNX element type ``generate_artifacts(base_dtype=...)`` asks for (None: as exported),
    and its ``quant_block_size`` (checked by :func:`check_block_size`).

    Raises:
        InvalidTypeError: for a value that is not a str or None.
        InvalidValueError: for a name other than ``"float16"``, ``"bfloat16"``, ``"int8"`` or
            ``"int4"``, or a block size other than 32, 64 or 128.
    """
    block_size = check_block_size(block_size)
    if value is None:
        return None, block_size
    if not isinstance(value, str):
        raise InvalidTypeError(
            "base_dtype must be None, 'float16', 'bfloat16', 'int8' or 'int4', not "
            f"{type(value).__name__}."
        )
    if value not in BASE_DTYPES:
        raise InvalidValueError(
            f"base_dtype={value!r} is not supported: pass 'float16', 'bfloat16', 'int8' or "
            "'int4', or None to keep the base's type."
        )
    return BASE_DTYPES[value], block_size


def check_block_size(value: Any) -> int:
    """``quant_block_size``, checked.

    Raises:
        InvalidTypeError: for a value that is not an int.
        InvalidValueError: for a size other than 32, 64 or 128.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(
            f"quant_block_size must be an int (32, 64 or 128), not {type(value).__name__}."
        )
    if value not in QUANT_BLOCK_SIZES:
        raise InvalidValueError(f"quant_block_size={value} is not supported: pass 32, 64 or 128.")
    return int(value)


def cast_base(
    training: onnx.ModelProto,
    evaluation: onnx.ModelProto,
    step: onnx.ModelProto | None,
    store: _weights.WeightStore,
    dtype: int | None,
    block_size: int = 32,
) -> tuple[
    onnx.ModelProto,
    onnx.ModelProto,
    onnx.ModelProto | None,
    _weights.WeightStore,
    dict[str, tuple[str, int, int, int, int]],
]:
    """The models with their float32 base weights stored as ``dtype``, each cast back to float32
    where it is read.

    The base weights are those :func:`base_names` finds; each keeps its name, takes
    the element type ``dtype`` and is read through a ``Cast`` to float32 (see
    :func:`onnxblocks.ir.edit.cast_initializers`). Their bytes are converted when the
    base file is written (rounded to nearest even), one tensor at a time. The models
    record ``onnxblocks.base_dtype`` in their metadata. Neither the models nor
    ``store`` is changed; a ``dtype`` of None changes nothing.

    int8 and int4 (:func:`quantize`) apply to the 2-D base weights whose rows split into
    blocks of ``block_size``; each is read through ``DequantizeLinear`` with its scales
    ``<name>.scale`` (stored in the base file too), and the models import opset 21. Other
    base weights stay float32.

    A large quantized table read by rows (a tied embedding and LM head) is read a chunk of rows
    at a time through views of its bytes (:mod:`onnxblocks.ir.dequantize_rows`).

    Returns:
        The training, eval and step models (the step model None if it was), a store
        holding the converted weights, and the views: ``chunk -> (table, byte offset,
        length, rows)`` (``onnxblocks.ir.dequantize_rows.place_views`` places them in the
        base file; a view of a table too small for the base file is in the store).
    """
    names = [
        n
        for n in base_names((training, evaluation, step), store)
        if store.source(n).data_type == _FLOAT
    ]
    if dtype in QUANTIZED:
        names = [n for n in names if _quantizable(store.source(n), block_size)]
    views: dict[str, tuple[str, int, int, int, int]] = {}
    if dtype is None or not names:
        return training, evaluation, step, store, views
    import onnx_ir as ir

    from onnxblocks.ir import edit, serde  # a lower layer, loaded on first use (it imports onnx-ir)
    from onnxblocks.ir.dequantize_rows import views_in_store
    from onnxblocks.ir.opset import convert_opset

    converted = _weights.WeightStore()
    for name in store:
        converted.add(store.source(name))
    target = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    stubs: dict[str, ir.TensorProtocol] = {}
    scales: dict[str, tuple[ir.TensorProtocol, int]] = {}

    def stub(name: str, kind: int, dims: Sequence[int]) -> ir.ExternalTensor:
        where, shape = _weights.HELD_LOCATION_PREFIX + name, ir.Shape(dims)
        return ir.ExternalTensor(where, None, None, ir.DataType(kind), shape=shape, name=name)

    for name in names:
        source = store.source(name)
        if dtype in QUANTIZED:
            quant = functools.partial(quantize, source, QUANTIZED[dtype], block_size)
            values = functools.partial(_part, quant, 0)
            converted.add(_weights.TensorSource(name, dtype, source.dims, load=values))
            scale_name = f"{name}.scale"
            scale_dims = (*source.dims[:-1], source.dims[-1] // block_size)
            scale_values = functools.partial(_part, quant, 1)
            converted.add(_weights.TensorSource(scale_name, _FLOAT, scale_dims, load=scale_values))
            scales[name] = (stub(scale_name, _FLOAT, scale_dims), block_size)
        else:
            load = functools.partial(_convert, source, target)
            converted.add(_weights.TensorSource(name, dtype, source.dims, load=load))
        stubs[name] = stub(name, dtype, source.dims)

    def cast(model: onnx.ModelProto) -> onnx.ModelProto:
        if scales and (_limits.onnx_opset(model) or 0) < QUANT_OPSET:
            model = convert_opset(model, QUANT_OPSET, "an artifact model with a quantized base")
        graph_ir = serde.from_proto(model)
        edit.cast_initializers(graph_ir.graph, stubs, scales, views)
        graph_ir.metadata_props[BASE_DTYPE_METADATA] = onnx.TensorProto.DataType.Name(dtype).lower()
        return serde.to_proto(graph_ir)

    cast_step = cast(step) if step is not None else None
    models = cast(training), cast(evaluation), cast_step
    views_in_store(views, converted, BASE_THRESHOLD)
    return *models, converted, views


def _part(quant: Callable[[], tuple[np.ndarray, np.ndarray]], index: int) -> np.ndarray:
    return quant()[index]


def _quantizable(source: _weights.TensorSource, block_size: int) -> bool:
    return len(source.dims) == 2 and source.dims[-1] % block_size == 0


def quantize(
    source: _weights.TensorSource, limit: int, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric blockwise quantization of a 2-D float32 weight along its rows.

    Each block of ``block_size`` elements of a row shares the scale ``max|w| / limit``
    (1 for a block of zeros); ``q = round(w / scale)`` (to nearest even) in ``[-limit,
    limit]``. ``DequantizeLinear(q, scale, axis=-1, block_size)`` gives ``q * scale``.

    Returns:
        ``(q, scale)``: ``q`` as int8 (int4 values for ``limit`` 7; packed when written),
        ``scale`` float32 of shape ``[rows, cols / block_size]``.
    """
    values = source.array().astype(np.float32)
    rows, cols = values.shape
    blocks = values.reshape(rows, cols // block_size, block_size)
    peak = np.abs(blocks).max(axis=-1)
    scale = np.where(peak > 0, peak / np.float32(limit), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(blocks / scale[..., None]), -limit, limit).astype(np.int8)
    return q.reshape(rows, cols), scale


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
