"""Staging folders of artifact writers: their names, and the leftovers of killed writers, found and
removed.

A staging folder (of :mod:`onnxblocks.artifacts.files`) is named
``[.<target>].onnxblocks-artifacts-<pid>-<token>@<host>``: inside an artifact
directory, or beside a directory ``<target>`` not created yet. Its owner is the
process ``pid`` on the host whose name hashes to ``host``, and holds the lock
(:func:`onnxblocks._core.dirlock.hold`) of its owner record ``.owner`` while it
uses the folder. The folder is a *leftover* only when both say its owner is gone:
that process no longer runs on this host, and nobody holds the record's lock (a
folder made a moment ago has no record yet; its name alone keeps it, as the
pid in it is alive). :func:`leftovers` lists those in
and beside a directory, :func:`clean` removes them (rolling back a commit one cut
short, from its journal) together with a killed writer's lock and temporary files.
Folders of live processes, and of other hosts (a shared file system), are never touched.

It lives in ``_core`` so that readers (the runtime, the display) can clean a directory
without importing the generator.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxblocks._core import dirlock as _lock
from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core.contracts import ArtifactNames
from onnxblocks._core.errors import LockTimeoutError

logger = logging.getLogger(__name__)

#: In a staging directory's name: what comes before ``<pid>-<token>@<host>``.
STAGE_PREFIX = ".onnxblocks-artifacts-"
#: A staging directory's name: ``[.<target>].onnxblocks-artifacts-<pid>-<token>[@<host>]``.
STAGE_NAME = re.compile(
    r"^(?:\.(?P<target>.+))?\.onnxblocks-artifacts-(?P<pid>\d+)-(?P<token>[0-9a-f]{12})(?:@(?P<host>[0-9a-f]{8}))?$"
)
#: Inside a staging directory: the journal of a commit in progress, the old files moved aside, the
#: owner record.
_JOURNAL, _OLD, _OWNER = ".journal", ".old", ".owner"
#: The owner record of a staging directory (the one file in it before the caller writes), locked by
#: its owner.
OWNER_FILE = _OWNER
_BOOKKEEPING = (_JOURNAL, _OLD, _OWNER, ".journal.tmp")
#: Every file name a set may hold, without its prefix.
_SUFFIXES = tuple(ArtifactNames("").owned())
#: This host, as staging directories name it.
HOST_TAG = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]

# names of this process's staging directories in use (another thread may be staging): by name, which
# is
# unique (pid and random token), as one folder is reached by many paths (relative, through links)
_active: set[str] = set()
_active_lock = threading.Lock()


@dataclass(frozen=True)
class Leftover:
    """A staging directory found beside or in an artifact directory.

    Attributes:
        path: The staging directory.
        pid: Its owner's process id.
        host: Its owner's host tag (:data:`HOST_TAG` on this host).
        stale: True when its owner is dead on this host (it can be removed).
        interrupted_commit: True when it holds the journal of a commit cut short.
        nbytes: The size of the files in it.
    """

    path: Path
    pid: int
    host: str
    stale: bool
    interrupted_commit: bool
    nbytes: int


def _roll_back(directory: Path, stage: Path, new: Sequence[str], old: Sequence[str]) -> None:
    """Take out the new files already moved in and put the old ones back; the journal goes last.

    Idempotent, so that a rollback cut short (by a kill) is finished by the next one: a
    file with an old version is restored by moving that version over it (one atomic
    step), and one without is removed only if it was moved in.
    """
    aside = stage / _OLD
    for name in dict.fromkeys([*new, *old]):
        if name in old:
            if os.path.lexists(aside / name):
                os.replace(aside / name, directory / name)
        elif not os.path.lexists(stage / name):  # a new file without an old version, moved in
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)
    with contextlib.suppress(FileNotFoundError):
        (stage / _JOURNAL).unlink()


def _is_stale(path: Path, match: re.Match[str]) -> bool:
    host = match.group("host")
    if host is not None and host != HOST_TAG:
        return False  # another host's (a shared file system): its pid means nothing here
    pid = int(match.group("pid"))
    if pid == os.getpid():
        with _active_lock:
            return path.name not in _active
    return not _tempfiles.writer_alive(pid) and not _lock.is_held(path / _OWNER)


def claim(stage: Path) -> int:
    """Create the staging directory ``stage`` of this process and its locked owner record.

    The name is registered as in use before the folder exists, so that no other
    thread's cleanup takes it for a leftover in between.

    Returns:
        The descriptor holding the owner record's lock: close it (and :func:`release`
        the name) when the folder is gone.
    """
    with _active_lock:
        _active.add(stage.name)
    os.mkdir(stage)  # the umask applies, as for any mkdir
    return own(stage)


def own(stage: Path) -> int:
    """Write the locked owner record of this process's staging directory ``stage``; return its
    descriptor.
    """
    with _active_lock:
        _active.add(stage.name)
    fd = _lock.hold(stage / _OWNER)
    try:
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "host_tag": HOST_TAG,
            "started": time.time(),
        }
        os.write(fd, json.dumps(owner).encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def release(stage: Path | None, fd: int | None = None) -> None:
    """Let ``stage`` count as a leftover again once its files are gone: forget its name, close
    its record.
    """
    if stage is not None:
        with _active_lock:
            _active.discard(stage.name)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _candidates(directory: Path) -> list[tuple[Path, re.Match[str]]]:
    """The staging directories in ``directory`` and those beside it (or beside its missing
    parents) for it.
    """
    found: list[tuple[Path, re.Match[str]]] = []
    places: list[tuple[Path, str | None]] = []
    path = directory
    while True:
        places.append((path.parent, path.name))
        if path.exists() or path.parent == path:
            break
        path = path.parent
    if directory.is_dir():
        places.append((directory, None))
    for place, target in places:
        with contextlib.suppress(OSError), os.scandir(place) as entries:
            for entry in entries:
                match = STAGE_NAME.match(entry.name)
                if (
                    match
                    and match.group("target") == target
                    and entry.is_dir(follow_symlinks=False)
                ):
                    found.append((Path(entry.path), match))
    return found


def _size(path: Path) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def leftovers(directory: str | os.PathLike) -> list[Leftover]:
    """The staging directories in and beside ``directory``: stale ones (of dead owners) and live
    ones.

    Nothing is removed (see :func:`clean`).
    """
    path = Path(os.fspath(directory))
    return [
        Leftover(
            stage,
            int(match.group("pid")),
            match.group("host") or HOST_TAG,
            _is_stale(stage, match),
            (stage / _JOURNAL).exists(),
            _size(stage),
        )
        for stage, match in _candidates(path)
    ]


def clean(directory: str | os.PathLike, lock_timeout: float | None = None) -> list[Path]:
    """Remove the leftovers of killed runs in and beside ``directory``; roll back their commits cut
    short.

    Temporary files of dead writers (:mod:`onnxblocks._core.tempfiles`: a write
    probe, a checkpoint being saved) go too. Cheap when there is nothing to remove
    (a directory listing or two, no lock). The lock
    file of a killed writer is removed too (by taking and releasing the lock). A commit
    cut short is rolled back under the directory's lock; if the lock file cannot be
    created (a read-only directory), such a leftover is kept and logged.

    Returns:
        The staging directories removed.

    Raises:
        TimeoutError: if another writer holds the directory's lock for more than ``lock_timeout``.
    """
    path = Path(os.fspath(directory))
    stale = [(stage, match) for stage, match in _candidates(path) if _is_stale(stage, match)]
    removed: list[Path] = (
        _tempfiles.remove_stale(path) if path.is_dir() else []
    )  # probes, half-saved checkpoints
    inside = False
    for stage, match in stale:
        if match.group("target") is None:
            inside = True  # in the artifact directory: under its lock, with any rollback
            continue
        shutil.rmtree(
            stage, ignore_errors=True
        )  # a new directory never committed: no journal in it
        logger.info("Removed %s, left by a killed run.", stage)
        removed.append(stage)
    if not inside and not (path / _lock.LOCK_NAME).exists():
        return removed
    # a rollback waits for the lock; a lock file alone (a killed writer's, or a live one's) is only
    # tried:
    # taking and releasing the lock removes a dead writer's file, and a live writer removes its own
    timeout = (_lock.DEFAULT_TIMEOUT_S if lock_timeout is None else lock_timeout) if inside else 0.0
    try:
        with _lock.directory_lock(path, timeout):
            removed += recover_stale(path)
    except PermissionError:
        logger.warning(
            "Cannot lock %s to remove what killed runs left in it (no write permission).", path
        )
    except LockTimeoutError:
        if inside:
            raise
    return removed


def recover_stale(directory: Path) -> list[Path]:
    """Roll back the interrupted commits of killed writers and remove their staging directories.

    The caller holds the directory's lock (see :func:`clean`).

    Returns:
        The staging directories removed.
    """
    removed = []
    stages = [(p, m) for p, m in _candidates(directory) if m.group("target") is None]
    for stage, match in stages:
        if not (stage / _JOURNAL).exists() and not _is_stale(stage, match):
            # a commit runs only under the lock, which the caller holds: a journal means its writer
            # died
            continue
        journal = stage / _JOURNAL
        if journal.exists():
            try:
                entry = json.loads(journal.read_text())
                new, old = list(entry["new"]), list(entry["old"])
            except (
                OSError,
                ValueError,
                KeyError,
                TypeError,
            ):  # unreadable: put back whatever was moved aside
                new, old = (
                    [],
                    [p.name for p in (stage / _OLD).iterdir()] if (stage / _OLD).is_dir() else [],
                )
            _roll_back(directory, stage, new, old)
            logger.warning(
                "Restored the artifacts in %s that a killed run was replacing.", directory
            )
        shutil.rmtree(stage, ignore_errors=True)
        logger.info("Removed %s, left by a killed run.", stage)
        removed.append(stage)
    return removed


def recover(directory: str | os.PathLike, lock_timeout: float | None = None) -> list[Path]:
    """Undo what killed writers left half done in ``directory`` (the same as :func:`clean`).

    Returns:
        The staging directories removed.
    """
    return clean(directory, lock_timeout)
