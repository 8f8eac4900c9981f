"""Writing a set of artifact files all at once: staged, then swapped in under a lock, rolled back on
failure.

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
whose owner is dead on this host (its pid no longer runs, and nobody holds the lock of
its ``.owner`` record) are *leftovers*:
:func:`clean` removes them, and every onnxblocks call that opens an artifact
directory calls it (``generate_artifacts``, ``TrainingSession``, ``onnxblocks
inspect`` / ``train``, ``onnxblocks.web.write_state``), as does ``onnxblocks clean
DIR``. :func:`leftovers` lists them without removing anything. Staging
directories of other hosts (a shared file system) and of live processes are never
touched. Files that are not this prefix's artifacts are never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core.contracts import ArtifactNames
from onnxblocks._core.errors import FileConflictError, IsAFolderError, NotAFolderError
from onnxblocks._core.leftovers import (
    _BOOKKEEPING,
    _JOURNAL,
    _OLD,
    _OWNER,
    _SUFFIXES,
    HOST_TAG,
    OWNER_FILE,
    STAGE_NAME,
    STAGE_PREFIX,
    Leftover,
    _active,
    _active_lock,
    _roll_back,
    claim,
    clean,
    leftovers,
    own,
    recover,
    recover_stale,
    release,
)
from onnxblocks._core.ort import onnxruntime
from onnxblocks.artifacts import lock as _lock

logger = logging.getLogger(__name__)

__all__ = [
    "HOST_TAG",
    "OWNER_FILE",
    "STAGE_NAME",
    "STAGE_PREFIX",
    "Leftover",
    "clean",
    "leftovers",
    "recover",
    "recover_stale",
    "staging",
    "to_ort_format",
]


def _stage_name(target: str | None) -> str:
    token = f"{_tempfiles.writer_token()}@{HOST_TAG}"
    return f".{target}{STAGE_PREFIX}{token}" if target is not None else f"{STAGE_PREFIX}{token}"


def _missing_top(directory: Path) -> Path | None:
    """The topmost missing directory of ``directory`` and its parents (None if ``directory``
    exists).
    """
    if directory.is_dir():
        return None
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    for path in missing:
        if path.parent.exists() and not path.parent.is_dir():
            raise NotAFolderError(
                f"Cannot create artifact_directory '{directory}': '{path.parent}' is a file."
            )
    return missing[-1] if missing else None


@contextlib.contextmanager
def staging(
    directory: Path,
    prefix: str,
    artifact_names: Sequence[str] | None = None,
    lock_timeout: float | None = None,
) -> Iterator[Path]:
    """Yield a staging directory; on success commit what it holds as the set of ``prefix`` in
    ``directory``.

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
    clean(directory, lock_timeout=_lock.DEFAULT_TIMEOUT_S if lock_timeout is None else lock_timeout)
    stage: Path | None = None
    moved: Path | None = None
    records: list[int] = []  # the locked owner records of this call's staging directories
    claimed: list[Path] = []  # and their paths, registered as in use in this process
    timeout = _lock.DEFAULT_TIMEOUT_S if lock_timeout is None else lock_timeout
    try:
        if top is None:
            stage = directory / _stage_name(None)
            claimed.append(stage)
            records.append(claim(stage))
            inner = stage
        else:  # a new directory: built whole beside where it goes, then renamed into place
            stage = top.parent / _stage_name(top.name)
            claimed.append(stage)
            records.append(claim(stage))
            inner = stage / directory.relative_to(top)
            inner.mkdir(parents=True, exist_ok=True)
        yield inner
        if top is not None and _rename_new(stage, top):
            return
        if (
            top is not None
        ):  # another writer created the directory meanwhile: commit into it as into any
            moved = directory / _stage_name(None)
            claimed.append(moved)
            _move_into(inner, directory, moved)
            records.append(own(moved))  # the stage's record was taken out (_rename_new)
            shutil.rmtree(
                stage, ignore_errors=True
            )  # what is left of the stage (its parents of `inner`), if any
            stage, inner = moved, moved
        with _lock.directory_lock(directory, timeout):
            recover_stale(directory)
            _commit(directory, inner, prefix, owned)
    except BaseException:
        for path in (
            stage,
            moved,
        ):  # a rollback cut short keeps its journal and the old files, for the next run
            if path is not None and path.exists() and not (path / _JOURNAL).exists():
                shutil.rmtree(path, ignore_errors=True)
        raise
    # only now, with the folders gone (or left to the next run), may cleaners take them for
    # leftovers
    finally:
        for path in claimed:
            release(path)
        for fd in records:
            release(None, fd)


def _move_into(inner: Path, directory: Path, moved: Path) -> None:
    """Move the staged files ``inner`` to ``moved`` inside ``directory``, which another writer
    created.
    """
    with _active_lock:
        _active.add(moved.name)  # before it exists, as for any staging directory
    try:
        directory.mkdir(
            parents=True, exist_ok=True
        )  # ``directory`` may be below the new one: its parents exist
    except (FileExistsError, NotADirectoryError):
        raise NotAFolderError(
            f"Cannot write the artifacts into '{directory}': a file was put there while they "
            "were generated. "
            "Remove it, or write into another artifact_directory."
        ) from None
    os.rename(inner, moved)


def _rename_new(stage: Path, top: Path) -> bool:
    """Rename the staged new directory ``stage`` to ``top``; False if ``top`` exists by now.

    The owner record is taken out first, so that the new directory holds artifacts only; the
    name (a live pid, registered in this process) keeps ``stage`` from cleaners meanwhile.
    """
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
    """The prefix of another existing set that ``name`` belongs to, if any
    (``nominal_checkpoint``: ``nominal_``).
    """
    for suffix in _SUFFIXES:
        other = name[: -len(suffix)] if name.endswith(suffix) else None
        if other is not None and other != prefix:
            names = ArtifactNames(other)
            if (directory / names.training_model).exists() or (
                directory / names.eval_model
            ).exists():
                return other
    return None


def _commit(directory: Path, stage: Path, prefix: str, owned: Sequence[str]) -> None:
    new = sorted(p.name for p in stage.iterdir() if p.name not in _BOOKKEEPING)
    for name in new:
        target = directory / name
        if target.is_dir() and not target.is_symlink():
            raise IsAFolderError(
                f"Cannot write '{target}': it is a directory, not an artifact file. Nothing was "
                "changed; remove or "
                "rename that directory, or write the artifacts into another artifact_directory."
            )
        other = _owner(name, directory, prefix)
        if other is not None and target.exists():
            raise FileConflictError(
                f"Cannot write '{target}' for the artifacts with prefix {prefix!r}: it is also a "
                "file of the artifacts "
                f"with prefix {other!r} in the same directory. Nothing was changed; choose "
                "another prefix or directory."
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
