"""A lock file that serialises the writers of one artifact directory, across processes and threads.

:func:`directory_lock` holds an exclusive ``flock`` (``msvcrt.locking`` on
Windows) on ``<directory>/.onnxblocks-artifacts.lock`` for the time a set of
artifacts is moved into place. A second writer waits, polling, until the first
is done, or raises :class:`TimeoutError` after ``timeout`` seconds.

The lock file is removed when the lock is released, so a directory holds only
artifacts between calls. A writer that locked a file which was removed (and
perhaps re-created) while it waited notices, because the path no longer leads to
the file it holds, and locks again. A killed writer's lock is released by the
operating system with its file descriptors; the file it leaves is reused.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from onnxblocks._core.errors import LockTimeoutError

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # msvcrt is used instead

#: Name of the lock file in an artifact directory.
LOCK_NAME = ".onnxblocks-artifacts.lock"
#: How long a writer waits for another one by default, in seconds.
DEFAULT_TIMEOUT_S = 300.0
#: How often a waiting writer tries again, in seconds.
_POLL_S = 0.02


def try_lock(fd: int) -> bool:
    """Take the exclusive lock of the open file ``fd`` if no other open file holds it; True if
    taken.
    """
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            return False
        return True
    import msvcrt  # pragma: no cover - Windows

    try:  # pragma: no cover - Windows
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:  # pragma: no cover - Windows
        return False
    return True  # pragma: no cover - Windows


def hold(path: Path) -> int:
    """Create the file ``path`` (it must not exist) and lock it for as long as the returned
    descriptor is open.

    The lock says "in use" to :func:`is_held` in any process or thread, until the
    descriptor is closed or its process dies, even after the file is renamed or removed.

    Raises:
        FileExistsError: if ``path`` exists.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        while not try_lock(fd):  # only a reader probing it (is_held) can hold it, for an instant
            time.sleep(_POLL_S)
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_held(path: Path) -> bool:
    """Whether the file ``path`` is locked by a live holder (:func:`hold`); False if it is missing.

    True where it cannot be told (no permission to open it, or Windows, where probing
    a lock would block the holder's reads), so that nothing is ever taken for abandoned
    while in use.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return path.exists()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        if not try_lock(fd):
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def directory_lock(directory: Path, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive lock of ``directory`` (which must exist) inside the with-block.

    Raises:
        TimeoutError: if another writer holds it for more than ``timeout`` seconds.
        PermissionError: if the lock file cannot be created (a read-only directory).
    """
    path = directory / LOCK_NAME
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            while not try_lock(fd):
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"Another generate_artifacts call has been writing into '{directory}' "
                        "for more than "
                        f"{timeout:g} s, so this one gave up waiting for it. Wait until it has "
                        "finished and try "
                        "again, or write into another artifact_directory."
                    )
                time.sleep(_POLL_S)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # the file was removed while this writer waited: lock the one at the path now
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def reading_lock(
    directory: Path | None, timeout: float = DEFAULT_TIMEOUT_S
) -> contextlib.AbstractContextManager[None]:
    """The lock of ``directory`` while a reader takes files of its artifact set (none for ``None``).

    A writer moves the old set aside before it moves the new one in; a reader holding the lock
    sees one whole set. A directory this process cannot write into gets no lock (creating the
    lock file would fail there): its reader takes the files as they are.
    """
    if directory is None or not os.access(directory, os.W_OK):
        return contextlib.nullcontext()
    return directory_lock(directory, timeout)


def files_lock(
    paths: Sequence[Path], timeout: float = DEFAULT_TIMEOUT_S
) -> contextlib.AbstractContextManager[None]:
    """The lock of the directory of ``paths`` while they are replaced together (none for a single
    file).

    Two writers replacing the same files one by one would otherwise interleave: one's
    model with the other's external data, or one's adapter weights with the other's config.
    """
    parents = {p.parent for p in paths}
    if len(paths) < 2 or len(parents) != 1:
        return contextlib.nullcontext()
    return directory_lock(next(iter(parents)), timeout)
