"""Paths given by users: their type, and whether a file can be written there, checked before any
work.

:func:`as_path` turns an argument into a :class:`~pathlib.Path` or raises a
``TypeError`` / ``ValueError`` that names the parameter (a number where a path
is expected, an empty string, a NUL byte). :func:`check_output_file` and
:func:`check_output_dir` find, before a long run, what would make writing its
result fail at the end: a directory where a file is expected, a path below a
file, a read-only or missing directory, a name too long for the file system.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from pathlib import Path

from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core.errors import (
    DataFileError,
    FileAccessError,
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    IsAFolderError,
    NotAFolderError,
    OnnxBlocksError,
)

#: Longest file name (bytes) most file systems take, when ``pathconf`` cannot tell.
_NAME_MAX = 255
#: Longest path (bytes) Linux takes, when ``pathconf`` cannot tell.
_PATH_MAX = 4096


def as_path(value: object, parameter: str) -> Path:
    """``value`` as a Path.

    Raises:
        TypeError: if ``value`` is not a ``str`` or ``os.PathLike`` (bytes are refused too).
        ValueError: if it is empty or holds a NUL character.
    """
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise InvalidTypeError(
            f"{parameter} must be a path (str or os.PathLike), not {type(value).__name__} "
            f"{value!r:.60}."
        )
    text = os.fspath(value)
    if not isinstance(text, str):
        raise InvalidTypeError(
            f"{parameter} must be a str path, not bytes {text!r:.60}; decode it first."
        )
    if not text:
        raise InvalidValueError(f"{parameter} is an empty path; pass a file or directory name.")
    if "\0" in text:
        raise InvalidValueError(
            f"{parameter} {text!r:.80} holds a NUL character, which no file name can; remove it."
        )
    return Path(text)


def _limit(directory: Path, name: str, default: int) -> int:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return int(os.pathconf(directory, name))
    return default


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path.cwd()


def _check_names(path: Path, parameter: str, directory: Path) -> None:
    name_max = _limit(directory, "PC_NAME_MAX", _NAME_MAX)
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise InvalidValueError(
                f"{parameter}: the name {part[:40]!r}... is {len(os.fsencode(part))} bytes long; "
                "the file system "
                f"takes at most {name_max}. Choose a shorter name."
            )
    if len(os.fsencode(os.path.abspath(path))) >= _limit(directory, "PC_PATH_MAX", _PATH_MAX):
        raise InvalidValueError(
            f"{parameter}: the path '{path}' is too long for the file system. Choose a shorter one."
        )


def _check_writable_dir(directory: Path, parameter: str, target: Path) -> None:
    """Create and remove a probe file in ``directory``: the check that sees permissions, ACLs and
    read-only mounts.
    """
    if not directory.is_dir():
        raise NotAFolderError(
            f"{parameter}: cannot write '{target}': '{directory}' is a file, not a directory (a "
            "path below a "
            "file?). Choose a path inside a directory."
        )
    probe = _tempfiles.temp_path(directory / "write-probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        read_only = exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        reason = "is read-only" if read_only else f"cannot hold new files ({exc.strerror})"
        raise FileAccessError(
            f"{parameter}: cannot write '{target}': directory '{directory}' {reason}. Choose a "
            "writable directory."
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_output_file(value: object, parameter: str, *, create_parents: bool = False) -> Path:
    """Check, before any work, that a file can be written at ``value``; return it as a Path.

    Args:
        value: The path.
        parameter: Its name, for messages (``"--save"``, ``"path"``).
        create_parents: The writer creates missing directories: only the nearest
            existing ancestor must be a writable directory.

    Raises:
        TypeError, ValueError: as :func:`as_path`, or for a name too long.
        IsADirectoryError: if ``value`` is a directory.
        NotADirectoryError: if a parent is a file.
        FileNotFoundError: if the parent directory is missing (and not ``create_parents``).
        PermissionError: if the directory is not writable.
    """
    path = as_path(value, parameter)
    parent = path.parent if str(path.parent) else Path(".")
    existing = _existing_ancestor(parent)
    _check_names(path, parameter, existing if existing.is_dir() else existing.parent)
    if path.is_dir():
        raise IsAFolderError(f"{parameter}: '{path}' is a directory; pass a file path inside it.")
    if existing != parent and existing.is_dir() and not create_parents:
        raise FileMissingError(
            f"{parameter}: cannot write '{path}': directory '{parent}' does not exist. Create it "
            "first."
        )
    _check_writable_dir(existing, parameter, path)
    return path


def check_output_dir(value: object, parameter: str) -> Path:
    """Check, before any work, that a directory can be created or written at ``value``; return it as
    a Path.

    Raises:
        TypeError, ValueError: as :func:`as_path`, or for a name too long.
        NotADirectoryError: if ``value`` or a parent is a file.
        PermissionError: if the directory (or the nearest existing parent) is not writable.
    """
    path = as_path(value, parameter)
    existing = _existing_ancestor(path)
    _check_names(path, parameter, existing if existing.is_dir() else existing.parent)
    if existing == path and not path.is_dir():
        raise NotAFolderError(
            f"{parameter}: '{path}' exists and is not a directory. Choose a directory path."
        )
    _check_writable_dir(existing, parameter, path)
    return path


_WRITE_ERRORS: tuple[tuple[type[OSError], type[OnnxBlocksError], str], ...] = (
    (
        PermissionError,
        FileAccessError,
        "permission denied (a read-only file or directory?); choose a writable path",
    ),
    (IsADirectoryError, IsAFolderError, "a directory is in the way; pass a file path"),
    (
        NotADirectoryError,
        NotAFolderError,
        "a file is in the way of its directory; choose a path inside a directory",
    ),
    (
        FileNotFoundError,
        FileMissingError,
        "its directory disappeared while writing; create it and try again",
    ),
)


def write_error(exc: BaseException, finals: Sequence[Path]) -> OnnxBlocksError | None:
    """An ``OSError`` of the file system while writing ``finals``, as an onnxblocks error naming
    them (else None).

    ``[Errno 13] Permission denied: '.x.123-abc.tmp'`` becomes ``FileAccessError("Cannot write 'x':
    permission
    denied ...")``; an ``OSError`` without an errno (a reader's own) is left as it is.
    """
    if not isinstance(exc, OSError) or isinstance(exc, OnnxBlocksError) or exc.errno is None:
        return None  # not the file system's (a reader's own OSError keeps its message)
    where = ", ".join(f"'{f}'" for f in finals)
    for builtin, ours, advice in _WRITE_ERRORS:
        if isinstance(exc, builtin):
            return ours(f"Cannot write {where}: {advice}.")
    reason = exc.strerror or type(exc).__name__
    return DataFileError(
        f"Cannot write {where}: {reason} (no space left, or a file system error?)."
    )
