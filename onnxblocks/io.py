"""Saving models whose weights are held aside, streaming their bytes; atomic file writes.

:func:`save_model` writes a model in which large initializers are onnxblocks
stubs (see :mod:`onnxblocks._core.weights`) or large inline tensors: their
bytes are streamed in bounded chunks into one external data file beside the
model, and the saved initializers point at it with locations relative to the
model's directory. Nothing is written in place: files are written to temporary
names in the target directory and moved over the targets only when complete
(:func:`atomic_outputs`; :func:`atomic_file` for one file).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import onnx

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core import limits as _limits
from onnxblocks._core import tensor_bytes as _tensor_bytes
from onnxblocks._core import weights as _weights

# Writers elsewhere in the package import these from here, the module that saves files.
from onnxblocks._core.atomic import atomic_file as atomic_file
from onnxblocks._core.atomic import atomic_outputs as atomic_outputs
from onnxblocks._core.errors import (
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    IsAFolderError,
)
from onnxblocks._core.paths import as_path
from onnxblocks._core.proto import copy_fields
from onnxblocks._core.tensor_bytes import tensor_chunks as tensor_chunks
from onnxblocks._core.tensor_bytes import write_aligned as write_aligned
from onnxblocks._core.tensor_bytes import write_tensor as write_tensor

__all__ = ["load_model", "save_model"]

#: Inline initializers of at least this many bytes go to the external data file by default.
DEFAULT_EXTERNAL_DATA_THRESHOLD = 1024


def _weights_kind(data_type: int, dims: Iterable[int]) -> str:
    return f"{onnx.TensorProto.DataType.Name(data_type).lower()}{list(dims)}"


def _check_location(location: str) -> str:
    path = Path(location)
    if path.is_absolute() or ".." in path.parts or not location or location.endswith(("/", "\\")):
        raise InvalidValueError(
            f"location={location!r} must be a file name relative to the model's directory, "
            "inside it "
            "(no absolute path, no '..')."
        )
    return path.as_posix()


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose graph has no initializers (those are added one by one)."""
    out = onnx.ModelProto()
    copy_fields(model, out, skip={"graph"})
    copy_fields(model.graph, out.graph, skip={"initializer"})
    return out


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    weights: _weights.WeightStore | Mapping[str, _weights.TensorSource] | None = None,
    *,
    external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD,
    location: str | None = None,
    base_dir: str | os.PathLike | None = None,
    references: Mapping[str, tuple[str, int, int]] | None = None,
) -> Path:
    """Save ``model`` to ``path``, streaming large initializers into one external data file.

    Held stubs are resolved from ``weights``; inline initializers of at least
    ``external_data_threshold`` bytes and initializers already stored externally
    are copied too, in bounded chunks. Smaller initializers stay inline. The
    model is stamped with an IR version the installed ONNX Runtime loads. The
    caller's model is not changed.

    Args:
        model: The model, e.g. ``accessor.working_model`` of a build.
        path: The ``.onnx`` file to write.
        weights: Where stubs' bytes are: a WeightStore (``accessor.weights``) or a
            mapping from name to TensorSource.
        external_data_threshold: Inline initializers of at least this many bytes
            go to the data file; 0 moves every non-empty one.
        location: Name of the data file, relative to the model's directory;
            default ``<model file name>.data``.
        base_dir: Directory that existing external-data locations in ``model`` are
            relative to (where it was loaded from).
        references: Initializers whose bytes are in a file beside the model already (the
            base weights a set shares): name -> (location, offset, length), not copied.

    Returns:
        The path of the data file, or of the model when nothing went external.

    Raises:
        ValueError: for a stub ``weights`` does not know, a bad ``location``, or
            external data without ``base_dir``.
    """
    if not isinstance(model, onnx.ModelProto):
        raise InvalidTypeError(
            f"save_model() takes an onnx.ModelProto, not {type(model).__name__}."
        )
    _hyper.count(external_data_threshold, "external_data_threshold")
    target = as_path(path, "path")
    data_location = _check_location(location if location is not None else target.name + ".data")
    data_path = target.parent / data_location
    if data_path.resolve() == target.resolve():
        raise InvalidValueError(
            f"location={data_location!r} is the model file itself; choose another name."
        )

    shared = {
        name: (_check_location(where), at, n) for name, (where, at, n) in (references or {}).items()
    }

    def source_of(init: onnx.TensorProto) -> onnx.TensorProto | _weights.TensorSource | None:
        if _weights.is_stub(init):
            if weights is None or init.name not in weights:
                raise InvalidValueError(
                    f"Initializer '{init.name}' is a held stub but weights= does not know it. "
                    "Pass the build's "
                    "weights (accessor.weights), or save the finished model "
                    "(block.to_model_proto())."
                )
            source = (
                weights.source(init.name)
                if isinstance(weights, _weights.WeightStore)
                else weights[init.name]
            )
            if (source.data_type, tuple(source.dims)) != (init.data_type, tuple(init.dims)):
                raise InvalidValueError(
                    f"The weights for '{init.name}' are "
                    f"{_weights_kind(source.data_type, source.dims)} but the "
                    f"model's stub is {_weights_kind(init.data_type, init.dims)}. Pass the "
                    "weights of the build "
                    "this model comes from."
                )
            return source
        if init.data_location == onnx.TensorProto.EXTERNAL:
            return init
        if (
            init.data_type != onnx.TensorProto.STRING
            and _weights.tensor_nbytes(init) >= external_data_threshold
            and _weights.tensor_nbytes(init) > 0
        ):
            return init
        return None

    plan = [
        (init, None if init.name in shared else source_of(init)) for init in model.graph.initializer
    ]
    out = _skeleton(model)
    external = [(init, src) for init, src in plan if src is not None]
    with atomic_outputs(*([data_path] if external else []), target) as temps:
        offsets: dict[str, tuple[int, int]] = {}
        if external:
            with open(temps[0], "wb") as data:
                for init, src in external:
                    assert src is not None
                    size = _tensor_bytes.nbytes(src)
                    offset = write_tensor(data, src, base_dir, size, init.name)
                    offsets[init.name] = (offset, size)
        for init, maybe_src in plan:
            if maybe_src is None and init.name not in shared:
                out.graph.initializer.append(init)
                continue
            stub = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims)
            if init.doc_string:
                stub.doc_string = init.doc_string
            stub.data_location = onnx.TensorProto.EXTERNAL
            where, offset, size = shared.get(init.name) or (data_location, *offsets[init.name])
            for key, value in (("location", where), ("offset", str(offset)), ("length", str(size))):
                entry = stub.external_data.add()
                entry.key, entry.value = key, value
            out.graph.initializer.append(stub)
        _limits.stamp_versions(out)
        with open(temps[-1], "wb") as f:
            f.write(out.SerializeToString())
    return data_path if external else target


def load_model(path: str | os.PathLike, load_external_data: bool = False) -> onnx.ModelProto:
    """Load a model file, by default leaving external data on disk.

    Open a build on it with ``onnxblocks.base(model, model_path=path)``; its
    large weights are then read in chunks only when needed.

    Raises:
        TypeError: if ``path`` is not a path.
        FileNotFoundError: if ``path`` does not exist.
        IsADirectoryError: if it is a directory.
        ValueError: if it is not a regular file, not an ONNX model (a protobuf
            decoding error), or its external data is refused (a location outside
            the model's directory, data shorter than its dims need).
    """
    resolved = as_path(path, "path")
    if not resolved.exists():
        raise FileMissingError(f"Model file '{resolved}' does not exist.")
    if resolved.is_dir():
        raise IsAFolderError(f"'{resolved}' is a directory; pass the .onnx file inside it.")
    if not resolved.is_file():
        raise InvalidValueError(
            f"'{resolved}' is not a regular file (a pipe or device?); pass an .onnx file."
        )
    try:
        return onnx.load(os.fspath(resolved), load_external_data=load_external_data)
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # protobuf's DecodeError, onnx's ValidationError for external data
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if (
            type(exc).__name__ == "DecodeError"
        ):  # protobuf's wording ("Wire format was corrupt") says nothing more
            detail = (
                "its bytes do not decode as an ONNX model (the file is truncated or of another "
                "kind)"
            )
        raise InvalidValueError(
            f"Cannot load '{resolved}' as an ONNX model: {detail}. Check that the file is a "
            "complete .onnx model "
            "(and its external data files are beside it)."
        ) from None
