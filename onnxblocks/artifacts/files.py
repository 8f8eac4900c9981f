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

A writer killed during step 3 leaves its journal behind: the next writer into the
directory (or :func:`recover`) rolls the set back to the old files first. Files
that are not this prefix's artifacts are never touched. A failure removes the
directories the call created.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core.contracts import ArtifactNames
from onnxblocks._core.errors import FileConflictError, IsAFolderError, NotAFolderError
from onnxblocks._core.ort import onnxruntime
from onnxblocks.artifacts import lock as _lock

logger = logging.getLogger(__name__)

#: Start of a staging directory's name; the rest is ``<pid>-<12 hex digits>``.
STAGE_PREFIX = ".onnxblocks-artifacts-"
#: Inside a staging directory: the journal of a commit in progress, and the old files moved aside.
_JOURNAL, _OLD = ".journal", ".old"
#: Every file name a set may hold, without its prefix.
_SUFFIXES = tuple(ArtifactNames("").owned())

_active: set[Path] = set()  # staging directories of this process in use (another thread may be staging)
_active_lock = threading.Lock()


@contextlib.contextmanager
def staging(
    directory: Path, prefix: str, artifact_names: Sequence[str] | None = None, lock_timeout: float | None = None
) -> Iterator[Path]:
    """Yield an empty staging directory; on success commit what it holds as the set of ``prefix`` in ``directory``.

    Args:
        directory: The artifact directory; created (with its parents) if missing.
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
    created = _make_directory(directory)
    stage: Path | None = None
    try:
        stage = directory / f"{STAGE_PREFIX}{_tempfiles.writer_token()}"
        with _active_lock:  # before it exists: another thread's recovery must never take it for a stale one
            _active.add(stage)
        os.mkdir(stage)  # the umask applies, as for any mkdir
        yield stage
        with _lock.directory_lock(directory, _lock.DEFAULT_TIMEOUT_S if lock_timeout is None else lock_timeout):
            recover_stale(directory)
            _commit(directory, stage, prefix, owned)
    except BaseException:
        if stage is not None and not (stage / _JOURNAL).exists():  # else a rollback was cut short: the old
            shutil.rmtree(stage, ignore_errors=True)  # files are still in it, for the next run to put back
        for path in reversed(created):  # only empty directories: another writer may be using one
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    finally:
        if stage is not None:
            with _active_lock:
                _active.discard(stage)


def _make_directory(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents (with the umask); return those created, top first."""
    missing = [p for p in (directory, *directory.parents) if not p.exists()][::-1]
    for path in missing:
        if path.parent.exists() and not path.parent.is_dir():
            raise NotAFolderError(f"Cannot create artifact_directory '{directory}': '{path.parent}' is a file.")
    directory.mkdir(parents=True, exist_ok=True)
    return missing


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
    new = sorted(p.name for p in stage.iterdir() if p.name not in (_JOURNAL, _OLD))
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


def _is_stale(path: Path) -> bool:
    if (path / _JOURNAL).exists():  # a commit runs only under the lock, which the caller holds
        return True
    token = path.name[len(STAGE_PREFIX) :]
    match = _tempfiles.WRITER_NAME.match(token)
    if match is None:
        return False
    pid = int(match.group("pid"))
    if pid == os.getpid():
        with _active_lock:
            return path not in _active
    return not _tempfiles.writer_alive(pid)


def recover_stale(directory: Path) -> list[Path]:
    """Roll back the interrupted commits of killed writers and remove their staging directories.

    The caller holds the directory's lock (see :func:`recover`).

    Returns:
        The staging directories removed.
    """
    removed = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        stages = [Path(e.path) for e in entries if e.name.startswith(STAGE_PREFIX) and e.is_dir(follow_symlinks=False)]
    for stage in stages:
        if not _is_stale(stage):
            continue
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
    """Under the directory's lock, undo what killed writers left half done in ``directory``.

    :func:`staging` does this before each commit; call it before reading a directory
    that a killed run may have been writing.

    Returns:
        The staging directories removed.
    """
    path = Path(os.fspath(directory))
    if not path.is_dir():
        return []
    with _lock.directory_lock(path, _lock.DEFAULT_TIMEOUT_S if lock_timeout is None else lock_timeout):
        return recover_stale(path)


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
