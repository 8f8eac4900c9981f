"""A tensor's bytes, streamed in bounded chunks and appended to a data file at an aligned offset.

The external data file of a model (:func:`onnxblocks.io.save_model`) and the checkpoint writer
both lay tensors out this way: small tensors on 64-byte boundaries, large ones on page boundaries
so that runtimes can memory-map them.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import onnx
from onnx import numpy_helper

from onnxblocks._core import weights as _weights
from onnxblocks._core.errors import DataFileError, InvalidValueError

#: Tensors of at least this size start on a page boundary in the data file, so runtimes can
#: memory-map them.
_PAGE_ALIGN_FROM = 1024 * 1024
_PAGE = 4096
_SMALL_ALIGN = 64


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


def nbytes(tensor: onnx.TensorProto | _weights.TensorSource) -> int:
    """The byte size of a tensor's data, held, inline or external."""
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
