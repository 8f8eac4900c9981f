"""Writing a set of artifact files all at once: staged, then swapped in under a lock, rolled back on failure.

:func:`staging` yields a staging directory inside the artifact directory
(``.onnxblocks-artifacts-<pid>-<token>``, created with the umask as ``mkdir``
creates it). When the caller has written the new set there, the set is
*committed* under the directory's lock (:mod:`onnxblocks.artifacts.lock`):

1. Stale staging directories of killed writers are recovered and removed.
2. Nothing is moved if a new file would replace a directory, or a file that
   belongs to another prefix's set (``nominal_checkpoint`` is also the checkpoint
   of the prefix ``nominal_``).
3. A journal is written; every existing file of this prefix's set (the names
   of :meth:`~onnxblocks._core.contracts.ArtifactNames.owned` that are not another
   existing set's) is moved aside into the staging directory, then every new file
   is moved in; removing the journal is the commit point.
4. On any failure or interrupt (``KeyboardInterrupt`` included) before that
   point, the new files are taken out again and the old ones put back.

A writer killed during step 3 leaves its journal behind: the next call that opens
the directory rolls the set back to the old files first. Staging directories
whose owner is dead on this host (its pid no longer runs) are *leftovers*:
:func:`clean` removes them, and every onnxblocks call that opens an artifact
directory calls it (``generate_artifacts``, ``TrainingSession``, ``onnxblocks
inspect`` / ``train``, ``onnxblocks.web.write_state``), as does ``onnxblocks clean
DIR``. :func:`leftovers` lists them without removing anything. Staging
directories of other hosts (a shared file system) and of live processes are never
touched. Files that are not this prefix's artifacts are never touched.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core.contracts import ArtifactNames
from onnxblocks._core.errors import FileConflictError, IsAFolderError, NotAFolderError
from onnxblocks._core.ort import onnxruntime
from onnxblocks.artifacts import lock as _lock

logger = logging.getLogger(__name__)

#: In a staging directory's name: what comes before ``<pid>-<token>@<host>``.
STAGE_PREFIX = ".onnxblocks-artifacts-"
#: A staging directory's name: ``[.<target>].onnxblocks-artifacts-<pid>-<token>[@<host>]``.
STAGE_NAME = re.compile(
    r"^(?:\.(?P<target>.+))?\.onnxblocks-artifacts-(?P<pid>\d+)-(?P<token>[0-9a-f]{12})(?:@(?P<host>[0-9a-f]{8}))?$"
)
#: Inside a staging directory: the journal of a commit in progress, the old files moved aside, the owner record.
_JOURNAL, _OLD, _OWNER = ".journal", ".old", ".owner"
#: The owner record of a staging directory (the one file in it before the caller writes).
OWNER_FILE = _OWNER
_BOOKKEEPING = (_JOURNAL, _OLD, _OWNER, ".journal.tmp")
#: Every file name a set may hold, without its prefix.
_SUFFIXES = tuple(ArtifactNames("").owned())
#: This host, as staging directories name it.
HOST_TAG = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]

_active: set[Path] = set()  # staging directories of this process in use (another thread may be staging)
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


def _stage_name(target: str | None) -> str:
    token = f"{_tempfiles.writer_token()}@{HOST_TAG}"
    return f".{target}{STAGE_PREFIX}{token}" if target is not None else f"{STAGE_PREFIX}{token}"


def _make_stage(stage: Path) -> None:
    with _active_lock:  # before it exists: another thread's cleanup must never take it for a stale one
        _active.add(stage)
    os.mkdir(stage)  # the umask applies, as for any mkdir
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "host_tag": HOST_TAG, "started": time.time()}
    (stage / _OWNER).write_text(json.dumps(owner))


def _forget(stage: Path | None) -> None:
    if stage is not None:
        with _active_lock:
            _active.discard(stage)


def _missing_top(directory: Path) -> Path | None:
    """The topmost missing directory of ``directory`` and its parents (None if ``directory`` exists)."""
    if directory.is_dir():
        return None
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    for path in missing:
        if path.parent.exists() and not path.parent.is_dir():
            raise NotAFolderError(f"Cannot create artifact_directory '{directory}': '{path.parent}' is a file.")
    return missing[-1] if missing else None


@contextlib.contextmanager
def staging(
    directory: Path, prefix: str, artifact_names: Sequence[str] | None = None, lock_timeout: float | None = None
) -> Iterator[Path]:
    """Yield a staging directory; on success commit what it holds as the set of ``prefix`` in ``directory``.

    The directory yielded holds nothing but, perhaps, :data:`OWNER_FILE`.

    Args:
        directory: The artifact directory; created (with its parents) if missing, in one rename.
        prefix: The set's prefix: its files are ``ArtifactNames(prefix).owned()``.
        artifact_names: The names the set owns (default: those of ``prefix``).
        lock_timeout: Seconds to wait for another writer of ``directory``
            (default :data:`onnxblocks.artifacts.lock.DEFAULT_TIMEOUT_S`).

    Raises:
        NotADirectoryError: if ``directory`` (or a parent) is a file.
        IsADirectoryError: if a new file would replace a directory.
        FileExistsError: if a new file would replace a file of another prefix's set.
        TimeoutError: if another writer holds the directory for more than ``lock_timeout``.
    """
    owned = list(artifact_names) if artifact_names is not None else ArtifactNames(prefix).owned()
    if directory.exists() and not directory.is_dir():
        raise NotAFolderError(f"artifact_directory '{directory}' exists and is not a directory.")
    top = _missing_top(directory)
    clean(directory, lock_timeout=lock_timeout)  # what killed writers left in or beside it
    stage: Path | None = None
    moved: Path | None = None
    timeout = _lock.DEFAULT_TIMEOUT_S if lock_timeout is None else lock_timeout
    try:
        if top is None:
            stage = directory / _stage_name(None)
            _make_stage(stage)
            inner = stage
        else:  # a new directory: built whole beside where it goes, then renamed into place
            stage = top.parent / _stage_name(top.name)
            _make_stage(stage)
            inner = stage / directory.relative_to(top)
            inner.mkdir(parents=True, exist_ok=True)
        yield inner
        if top is not None and _rename_new(stage, top):
            return
        if top is not None:  # another writer created the directory meanwhile: commit into it as into any
            directory.mkdir(parents=True, exist_ok=True)
            moved = directory / _stage_name(None)
            with _active_lock:
                _active.add(moved)
            os.rename(inner, moved)
            (moved / _OWNER).write_text((stage / _OWNER).read_text())
            shutil.rmtree(stage, ignore_errors=True)
            _forget(stage)
            stage, inner = moved, moved
        with _lock.directory_lock(directory, timeout):
            recover_stale(directory)
            _commit(directory, inner, prefix, owned)
    except BaseException:
        for path in (stage, moved):  # a rollback cut short keeps its journal and the old files, for the next run
            if path is not None and path.exists() and not (path / _JOURNAL).exists():
                shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        _forget(stage)
        _forget(moved)


def _rename_new(stage: Path, top: Path) -> bool:
    """Rename the staged new directory ``stage`` to ``top``; False if ``top`` exists by now."""
    (stage / _OWNER).unlink()
    if top.exists():
        return False
    try:
        os.rename(stage, top)
    except OSError:
        if top.exists():  # created by another writer in between
            return False
        raise
    return True


def _owner(name: str, directory: Path, prefix: str) -> str | None:
    """The prefix of another existing set that ``name`` belongs to, if any (``nominal_checkpoint``: ``nominal_``)."""
    for suffix in _SUFFIXES:
        other = name[: -len(suffix)] if name.endswith(suffix) else None
        if other is not None and other != prefix:
            names = ArtifactNames(other)
            if (directory / names.training_model).exists() or (directory / names.eval_model).exists():
                return other
    return None


def _commit(directory: Path, stage: Path, prefix: str, owned: Sequence[str]) -> None:
    new = sorted(p.name for p in stage.iterdir() if p.name not in _BOOKKEEPING)
    for name in new:
        target = directory / name
        if target.is_dir() and not target.is_symlink():
            raise IsAFolderError(
                f"Cannot write '{target}': it is a directory, not an artifact file. Nothing was changed; remove or "
                "rename that directory, or write the artifacts into another artifact_directory."
            )
        other = _owner(name, directory, prefix)
        if other is not None and target.exists():
            raise FileConflictError(
                f"Cannot write '{target}' for the artifacts with prefix {prefix!r}: it is also a file of the artifacts "
                f"with prefix {other!r} in the same directory. Nothing was changed; choose another prefix or directory."
            )
    old = [
        name
        for name in dict.fromkeys([*new, *owned])
        if os.path.lexists(directory / name)
        and not (directory / name).is_dir()
        and (name in new or _owner(name, directory, prefix) is None)
    ]
    journal = stage / _JOURNAL
    with open(stage / ".journal.tmp", "w") as f:
        json.dump({"new": new, "old": old}, f)
    os.replace(stage / ".journal.tmp", journal)
    try:
        _swap(directory, stage, new, old)
    except BaseException:
        _roll_back(directory, stage, new, old)
        raise
    journal.unlink()  # the commit point
    for name in old:
        if name not in new:
            logger.info("Removed %s, left by an earlier run.", directory / name)
    shutil.rmtree(stage, ignore_errors=True)


def _swap(directory: Path, stage: Path, new: Sequence[str], old: Sequence[str]) -> None:
    aside = stage / _OLD
    aside.mkdir()
    for name in old:
        os.replace(directory / name, aside / name)
    for name in new:
        os.replace(stage / name, directory / name)


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
            return path not in _active
    return not _tempfiles.writer_alive(pid)


def _candidates(directory: Path) -> list[tuple[Path, re.Match[str]]]:
    """The staging directories in ``directory`` and those beside it (or beside its missing parents) for it."""
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
                if match and match.group("target") == target and entry.is_dir(follow_symlinks=False):
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
    """The staging directories in and beside ``directory``: stale ones (of dead owners) and live ones.

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
    """Remove the leftovers of killed runs in and beside ``directory``; roll back their commits cut short.

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
    removed: list[Path] = _tempfiles.remove_stale(path) if path.is_dir() else []  # probes, half-saved checkpoints
    inside = False
    for stage, match in stale:
        if match.group("target") is None:
            inside = True  # in the artifact directory: under its lock, with any rollback
            continue
        shutil.rmtree(stage, ignore_errors=True)  # a new directory never committed: no journal in it
        logger.info("Removed %s, left by a killed run.", stage)
        removed.append(stage)
    if inside or (path / _lock.LOCK_NAME).exists():  # a lock file left by a killed writer goes with the lock
        try:
            with _lock.directory_lock(path, _lock.DEFAULT_TIMEOUT_S if lock_timeout is None else lock_timeout):
                removed += recover_stale(path)
        except PermissionError:
            logger.warning("Cannot lock %s to remove what killed runs left in it (no write permission).", path)
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
            continue  # a commit runs only under the lock, which the caller holds: a journal means its writer died
        journal = stage / _JOURNAL
        if journal.exists():
            try:
                entry = json.loads(journal.read_text())
                new, old = list(entry["new"]), list(entry["old"])
            except (OSError, ValueError, KeyError, TypeError):  # unreadable: put back whatever was moved aside
                new, old = [], [p.name for p in (stage / _OLD).iterdir()] if (stage / _OLD).is_dir() else []
            _roll_back(directory, stage, new, old)
            logger.warning("Restored the artifacts in %s that a killed run was replacing.", directory)
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


def to_ort_format(model_path: Path, target: Path, custom_op_libraries: Sequence[str]) -> Path:
    """Write the ORT-format copy of ``model_path`` to ``target``.

    This is what ``convert_onnx_models_to_ort`` does, without torch.
    """
    ort = onnxruntime()

    options = ort.SessionOptions()
    options.optimized_model_filepath = os.fspath(target)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.add_session_config_entry("session.save_model_format", "ORT")
    for library in custom_op_libraries:
        options.register_custom_ops_library(library)
    ort.InferenceSession(
        os.fspath(model_path),
        sess_options=options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=["NchwcTransformer"],
    )
    return target
