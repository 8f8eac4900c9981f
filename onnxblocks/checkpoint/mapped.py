"""A checkpoint file mapped into memory, read only after checking it is a regular file.

A FIFO or a device would block a reader or never end, so every path is checked
(``stat``) before it is opened, and again (``fstat``) after, and opened
non-blocking. :class:`MappedCheckpoint` maps the file, parses its metadata with
:func:`onnxblocks.checkpoint.format.decode_checkpoint` (which checks every offset
before following it) and hands out its tensors as arrays: copies or read-only
views of inline data, read-only memory maps of the ``.data`` side file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from pathlib import Path

import numpy as np

from onnxblocks._core.errors import FileMissingError, IsAFolderError
from onnxblocks._core.paths import as_path
from onnxblocks.checkpoint import format as _format
from onnxblocks.checkpoint import storage as _storage
from onnxblocks.checkpoint.save import external_data_path

_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(path: Path, mode: int, what: str) -> _format.CheckpointFormatError:
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    return _format.CheckpointFormatError(
        f"{what} '{path}' is {kind}, not a regular file; reading it could block or never end. "
        "Pass the "
        "checkpoint file that save_checkpoint or ONNX Runtime wrote."
    )


def regular_file_size(path: Path, what: str) -> int:
    """The size of ``path``, after checking (without opening it) that it is an existing regular
    file.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileMissingError(f"{what} '{path}' does not exist.") from None
    if stat.S_ISDIR(info.st_mode):
        raise IsAFolderError(f"'{path}' is a directory; pass the checkpoint file inside it.")
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode, what)
    return info.st_size


#: O_NONBLOCK: should the path turn into a FIFO between the check and the open, the open does not
#: block.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of ``path``, which is checked to be a regular file before and after
    opening.
    """
    regular_file_size(path, what)
    fd = os.open(path, _OPEN_FLAGS)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _not_regular(path, info.st_mode, what)
    return fd


def map_file(path: Path, shown: Path | None = None) -> mmap.mmap | bytes:
    """The checkpoint file, memory-mapped read-only (``b""`` when empty); errors name ``shown``
    (default ``path``).
    """
    try:
        fd = open_regular(path, "Checkpoint file")
    except FileNotFoundError:
        raise FileMissingError(f"Checkpoint file '{shown or path}' does not exist.") from None
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if os.fstat(fd).st_size else b""
    finally:
        os.close(fd)


class MappedCheckpoint:
    """A checkpoint file mapped into memory, with its optional side data file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = as_path(path, "path_to_checkpoint")
        self.real = _storage.resolve(
            self.path
        )  # one version's header and data, whatever a save does meanwhile
        self.buf = map_file(self.real, self.path)
        self.parsed = _format.decode_checkpoint(self.buf, f"checkpoint '{self.path}'")
        self.data_path = external_data_path(self.path)  # (the name messages use)
        self.data_size = 0
        if self.parsed.has_external_data and any(
            e.external_offset is not None for e in self.parsed.entries()
        ):
            try:
                self.data_size = regular_file_size(
                    external_data_path(self.real), "External data file"
                )
            except FileNotFoundError:
                raise FileMissingError(
                    f"Checkpoint '{self.path}' keeps its tensor data in '{self.data_path}', "
                    "which does not exist. "
                    "Keep the .data file beside the checkpoint."
                ) from None

    def close(self) -> None:
        """Unmap the checkpoint file (arrays already returned stay valid: they are copies or own
        maps).
        """
        if isinstance(self.buf, mmap.mmap):
            with contextlib.suppress(
                BufferError
            ):  # a view kept alive by a traceback: it closes when freed
                self.buf.close()

    def raw(self, entry: _format.TensorEntry) -> bytes:
        """All bytes of one tensor."""
        return self.array(entry, copy=True).tobytes()

    def array(
        self, entry: _format.TensorEntry, copy: bool = False, inline_copy: bool = True
    ) -> np.ndarray:
        """One tensor as a numpy array (a read-only memory map for external data unless
        ``copy``; a copy of inline data unless ``inline_copy`` is False: then a read-only view).
        """
        dtype = _format.dtype_of(entry, f"checkpoint '{self.path}'")
        if self.parsed.is_nominal:
            return np.empty((0,), dtype)
        size = entry.nbytes
        count = size // dtype.itemsize
        if count == 0:
            return self._shaped(np.empty((0,), dtype), entry)
        if entry.external_offset is not None:
            if not self.parsed.has_external_data:
                raise _format.CheckpointFormatError(
                    f"Tensor '{entry.name}' of checkpoint '{self.path}' has external data but "
                    "the checkpoint "
                    "says it has none. The file is invalid."
                )
            if entry.external_offset + size > self.data_size:
                raise _format.CheckpointFormatError(
                    f"Tensor '{entry.name}' needs bytes "
                    f"{entry.external_offset}..{entry.external_offset + size} of "
                    f"'{self.data_path}', which is shorter ({self.data_size} bytes). The data "
                    "file is truncated or "
                    "belongs to another checkpoint: restore the checkpoint and its .data file "
                    "together."
                )
            mapped = np.memmap(
                external_data_path(self.real),
                dtype=dtype,
                mode="r",
                offset=entry.external_offset,
                shape=(count,),
            )
            return self._shaped(np.array(mapped) if copy else mapped, entry)
        if entry.inline is None:
            raise _format.CheckpointFormatError(
                f"Tensor '{entry.name}' of checkpoint '{self.path}' has neither inline nor "
                "external data."
            )
        start, length = entry.inline
        if length != size:
            raise _format.CheckpointFormatError(
                f"Tensor '{entry.name}' of checkpoint '{self.path}' has {length} bytes but its "
                "dims "
                f"{list(entry.dims)} need {size}."
            )
        view = np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)
        return self._shaped(view.copy() if copy or inline_copy else view, entry)

    def _shaped(self, flat: np.ndarray, entry: _format.TensorEntry) -> np.ndarray:
        try:
            return flat.reshape(entry.dims)
        except ValueError:  # e.g. a zero-size tensor whose other dims are too large for numpy
            raise _format.CheckpointFormatError(
                f"Tensor '{entry.name}' of checkpoint '{self.path}' has dims {list(entry.dims)}, "
                "which numpy cannot "
                "represent. The checkpoint is corrupted; restore it from a copy or save it again."
            ) from None
