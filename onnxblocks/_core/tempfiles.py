"""Temporary files that name their writer, so that those of killed runs can be recognised and
removed.

Every temporary file or directory onnxblocks writes beside a destination is named
``.<destination name>.<pid>-<12 hex digits>.tmp`` (a writer may append a suffix,
as ONNX Runtime appends ``.data`` for a checkpoint's side file). The process id
says who writes it: when that process no longer exists, the run was killed
before it could clean up, and :func:`remove_stale` deletes the leftovers. Files
of live processes (this one included: another thread may be writing) are never
touched, nor is any name that does not follow the pattern.

On Windows, where a process cannot be probed without a handle, no temporary
file counts as stale.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
from pathlib import Path

from onnxblocks._core.ort_errors import clean_message, is_ort_error

logger = logging.getLogger(__name__)

#: ``.<target>.<pid>-<token>.tmp`` and anything a writer appends to it.
TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.(?P<pid>\d+)-(?P<token>[0-9a-f]{12})\.tmp(?:\..+)?$")
#: A versioned item named by its writer: ``<pid>-<token>``.
WRITER_NAME = re.compile(r"^(?P<pid>\d+)-(?P<token>[0-9a-f]{12})$")
#: Longest part of the destination's name kept in a temporary name (file names are limited to 255
#: bytes).
_MAX_TARGET_CHARS = 120


def writer_token() -> str:
    """``<pid>-<12 hex digits>``: a fresh name that says which process made it."""
    return f"{os.getpid()}-{secrets.token_hex(6)}"


def temp_path(target: str | os.PathLike) -> Path:
    """A fresh temporary path beside ``target``: ``.<name>.<pid>-<token>.tmp`` (nothing is
    created).
    """
    final = Path(os.fspath(target))
    return final.parent / f".{final.name[:_MAX_TARGET_CHARS]}.{writer_token()}.tmp"


def writer_alive(pid: int) -> bool:
    """Whether process ``pid`` may still be writing (always True where it cannot be checked)."""
    if pid == os.getpid() or os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # it exists (another user's), or the id cannot be probed
    return True


def is_stale(name: str) -> bool:
    """True for a temporary name (:data:`TEMP_NAME` or :data:`WRITER_NAME`) whose writer is dead."""
    match = TEMP_NAME.match(name) or WRITER_NAME.match(name)
    return match is not None and not writer_alive(int(match.group("pid")))


def remove_stale(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and directories of dead writers from ``directory`` (not
    recursively).

    Returns:
        The paths removed. Errors (a file vanishing, no permission) are ignored.
    """
    removed: list[Path] = []
    candidates: list[os.DirEntry[str]] = []
    with contextlib.suppress(OSError), os.scandir(os.fspath(directory)) as entries:
        candidates = [e for e in entries if e.name.startswith(".") and TEMP_NAME.match(e.name)]
    for entry in candidates:
        if not is_stale(entry.name):
            continue
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        logger.info("Removed %s, left by a killed run.", path)
        removed.append(path)
    return removed


def without_temp_names(exc: BaseException, names: dict[Path, Path]) -> BaseException | None:
    """``exc`` again, naming the checkpoint instead of its temporary files (and without C++
    plumbing), or None.
    """
    if not isinstance(exc, Exception):
        return None

    def shown(text: str) -> str:
        for temp, final in names.items():
            text = text.replace(os.fspath(temp), os.fspath(final)).replace(temp.name, final.name)
        return text

    text = shown(clean_message(exc) if is_ort_error(exc) else str(exc))
    if text == str(exc):
        return None
    if isinstance(exc, OSError) and exc.errno is not None and exc.filename is not None:
        return type(exc)(exc.errno, exc.strerror, shown(os.fspath(exc.filename)))
    try:
        return type(exc)(text)
    except Exception:  # an exception class that takes other arguments
        return RuntimeError(text) if isinstance(exc, RuntimeError) else ValueError(text)
