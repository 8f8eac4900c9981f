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

import contextlib
import errno
import glob
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx import numpy_helper

from onnxblocks._core import dirlock as _dirlock
from onnxblocks._core import limits as _limits
from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core import weights as _weights
from onnxblocks._core.errors import (
    DataFileError,
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    IsAFolderError,
    NotAFolderError,
)
from onnxblocks._core.paths import as_path, write_error
from onnxblocks._core.proto import copy_fields

__all__ = ["load_model", "save_model"]

#: Inline initializers of at least this many bytes go to the external data file by default.
DEFAULT_EXTERNAL_DATA_THRESHOLD = 1024
#: Tensors of at least this size start on a page boundary in the data file, so runtimes can
#: memory-map them.
_PAGE_ALIGN_FROM = 1024 * 1024
_PAGE = 4096
_SMALL_ALIGN = 64


@contextlib.contextmanager
def atomic_outputs(*targets: str | os.PathLike) -> Iterator[list[Path]]:
    """Write several files so that each appears complete or not at all.

    Yields one temporary path per target, in the target's directory. When the ``with`` block
    ends normally each temporary file is moved over its target (``os.replace``), in the order
    given (put the file that refers to the others last), under the directory's lock when there
    are several, so two writers never interleave. When it raises, every temporary file is
    removed and the targets are left as they were. Temporary names carry the writer's process
    id (:mod:`onnxblocks._core.tempfiles`): those of killed runs in the targets' directories
    are removed first. Files are created with the umask, as ``open()`` creates them.

    Raises:
        FileNotFoundError: if a target's directory does not exist.
        NotADirectoryError: if a target's directory is a file.
        IsADirectoryError: if a target is a directory.
    """
    finals = [Path(os.fspath(t)) for t in targets]
    for final in finals:
        if not final.parent.is_dir():
            if final.parent.exists() or any(p.is_file() for p in final.parents):
                raise NotAFolderError(
                    f"Cannot write '{final}': '{final.parent}' is not a directory (a path below "
                    "a file?). "
                    "Choose a path inside a directory."
                )
            raise FileMissingError(
                f"Cannot write '{final}': directory '{final.parent}' does not exist. Create it "
                "first."
            )
        if (
            final.is_dir() and not final.is_symlink()
        ):  # checked first: a write would fail only at its end
            raise IsAFolderError(
                f"Cannot write '{final}': it is a directory. Pass a file path (inside it?)."
            )
    for parent in dict.fromkeys(f.parent for f in finals):
        _tempfiles.remove_stale(parent)
    temps = [_tempfiles.temp_path(f) for f in finals]
    try:
        # the writers create them (pre-creating and truncating them would force a flush on ext4)
        yield temps
        with _dirlock.files_lock(finals):
            for temp, final in zip(temps, finals, strict=True):
                os.replace(temp, final)
    except BaseException as exc:
        for temp in temps:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        named = write_error(exc, finals)
        if named is not None:
            # a clear error naming the target, not "[Errno 13] ... <temp name>"
            raise named from None
        shown = _tempfiles.without_temp_names(exc, dict(zip(temps, finals, strict=True)))
        if shown is not None:
            raise shown from None  # messages name the targets, not temporary files
        raise


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, companions: bool = False) -> Iterator[Path]:
    """Write one file so that it appears complete or not at all.

    The one-target form of :func:`atomic_outputs`: yields the temporary path
    (in the target's directory, not created yet), moves it over ``target`` when
    the ``with`` block ends normally, and removes it when the block raises.

    Args:
        target: The file to write.
        companions: Also move the files the writer put beside the temporary file
            under names that extend it, to the same extension of the target
            (``<temp>.data`` becomes ``<target>.data``, as ONNX Runtime writes a
            checkpoint's external data). They are moved before the target, and
            removed with it when the block raises.

    Raises:
        FileNotFoundError: if the target's directory does not exist.
    """
    with atomic_outputs(target) as (temp,):
        pattern = glob.escape(temp.name) + "?*"
        try:
            yield temp
            if companions:
                final = Path(os.fspath(target))
                for companion in sorted(temp.parent.glob(pattern)):
                    os.replace(
                        companion, final.with_name(final.name + companion.name[len(temp.name) :])
                    )
        except BaseException:
            if companions:
                for leftover in temp.parent.glob(pattern):
                    leftover.unlink(missing_ok=True)
            raise


def tensor_chunks(
    tensor: onnx.TensorProto | _weights.TensorSource,
    base_dir: str | os.PathLike | None = None,
    chunk_bytes: int = _weights.CHUNK_BYTES,
) -> Iterator[bytes | memoryview]:
    """Yield a tensor's little-endian bytes in pieces of at most ``chunk_bytes``.

    Accepts a :class:`~onnxblocks._core.weights.TensorSource`, an inline
    TensorProto (raw or typed fields), or a TensorProto with external data whose
    location is relative to ``base_dir``.

    Raises:
        ValueError: for an onnxblocks stub, external data without ``base_dir``, or string tensors.
    """
    if isinstance(tensor, _weights.TensorSource):
        yield from tensor.chunks(chunk_bytes)
        return
    if _weights.is_stub(tensor):
        raise InvalidValueError(
            f"Tensor '{tensor.name}' is an onnxblocks stub (its bytes are held by a build). Pass "
            "the build's "
            "weights (accessor.weights) or its TensorSource instead."
        )
    if tensor.data_type == onnx.TensorProto.STRING:
        raise InvalidValueError(
            f"Tensor '{tensor.name}' holds strings, which cannot be streamed as raw bytes."
        )
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        if base_dir is None:
            raise InvalidValueError(
                f"Tensor '{tensor.name}' keeps its data in the external file "
                f"'{_weights.external_info(tensor).get('location', '')}', but the directory it "
                "is relative to is "
                "unknown. Pass base_dir= (the directory of the .onnx file it came from)."
            )
        store = _weights.WeightStore()
        store.hold(tensor, base_dir)
        yield from store.source(tensor.name).chunks(chunk_bytes)
        return
    if tensor.HasField("raw_data"):
        data = memoryview(tensor.raw_data)
    else:
        array = numpy_helper.to_array(tensor)
        data = memoryview(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    for start in range(0, len(data), chunk_bytes):
        yield bytes(data[start : start + chunk_bytes])


def _nbytes(tensor: onnx.TensorProto | _weights.TensorSource) -> int:
    if isinstance(tensor, _weights.TensorSource):
        return tensor.nbytes
    return _weights.tensor_nbytes(tensor)


def write_aligned(
    out: BinaryIO,
    chunks: Iterable[bytes | memoryview],
    expected: int,
    name: str,
    align_for: int | None = None,
) -> int:
    """Append ``chunks`` to ``out`` at an aligned offset; return the offset.

    The alignment is a page for tensors of ``align_for`` (default ``expected``) bytes or more.

    Raises:
        ValueError: if the chunks do not add up to ``expected`` bytes.
    """
    size = expected if align_for is None else align_for
    align = _PAGE if size >= _PAGE_ALIGN_FROM else _SMALL_ALIGN
    position = out.tell()
    padding = -position % align
    if padding:
        out.write(b"\0" * padding)
        position += padding
    written = 0
    for chunk in chunks:
        out.write(chunk)
        written += len(chunk)
    if written != expected:
        raise InvalidValueError(
            f"Tensor '{name}' produced {written} bytes but its dims and element type need "
            f"{expected}. "
            "Its data does not match its shape; fix the tensor."
        )
    return position


def write_tensor(
    out: BinaryIO,
    tensor: onnx.TensorProto | _weights.TensorSource,
    base_dir: str | os.PathLike | None,
    expected: int,
    name: str,
) -> int:
    """Append one tensor's bytes to ``out`` at an aligned offset; return the offset.

    A tensor whose bytes are in a file (a file-backed TensorSource) is copied by
    the kernel (``os.copy_file_range``) without passing through Python; other
    tensors are streamed in chunks (:func:`tensor_chunks`).

    Raises:
        ValueError: if the tensor's data does not match ``expected`` bytes.
        OSError: if its source file ends early.
    """
    source = (
        tensor if isinstance(tensor, _weights.TensorSource) and tensor.path is not None else None
    )
    if (
        source is None
        or source.path is None
        or not hasattr(os, "copy_file_range")
        or expected < _PAGE_ALIGN_FROM
    ):
        return write_aligned(out, tensor_chunks(tensor, base_dir), expected, name)
    position = write_aligned(out, (), 0, name, align_for=expected)
    out.flush()
    with open(source.path, "rb") as f:
        done = 0
        try:
            while done < expected:
                n = os.copy_file_range(
                    f.fileno(), out.fileno(), expected - done, source.offset + done
                )
                if n == 0:
                    raise DataFileError(
                        f"External data file {source.path} ended early while copying tensor "
                        f"'{name}' "
                        f"({expected - done} bytes missing). Is the model's .data file complete?"
                    )
                done += n
        except OSError as exc:
            if done or exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            return write_aligned(
                out, tensor_chunks(tensor, base_dir), expected, name
            )  # no kernel copy here
    out.seek(position + expected)
    return position


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
    if (
        isinstance(external_data_threshold, bool)
        or not isinstance(external_data_threshold, int)
        or external_data_threshold < 0
    ):
        raise InvalidValueError(
            f"external_data_threshold must be an int >= 0, got {external_data_threshold!r}."
        )
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
                    size = _nbytes(src)
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
