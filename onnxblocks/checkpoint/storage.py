"""A checkpoint's files on disk, and replacing them all-or-nothing.

A checkpoint is a header file (the flatbuffer) and, when its tensors are stored
externally, a side file. ONNX Runtime finds the side file by appending ``.data``
to the path it is given, so a header cannot name its data file, and replacing
one checkpoint with external data by another takes two renames: interrupted
between them, the old header would read the new data, silently. So:

* A checkpoint without external data is one file, replaced by one rename; a
  ``.data`` file left beside it afterwards is removed (the new header never reads it).
* Replacing a checkpoint that has no data file by one that has: the data file
  first (the old header does not read it), then the header.
* Replacing a checkpoint with external data by another: the pair is kept in a
  version directory, ``.<name>.versions/<pid>-<token>/{<name>, <name>.data}``,
  and ``<name>`` and ``<name>.data`` are symbolic links through
  ``.<name>.versions/current``. One atomic rename of ``current`` swaps both
  files at once, for ONNX Runtime and every other reader. A regular pair is
  first moved into that layout by hard links, so it reads the same bytes at
  every moment. Where symbolic or hard links are not supported, the pair is
  renamed data first (not atomic; documented).

Readers resolve the header with :func:`resolve` (the real path of the current
version) and take its data file beside the real path, so a save running
meanwhile cannot mix two versions. Temporary files and version directories are
named after their writer's process id (:mod:`onnxblocks._core.tempfiles`); those
of killed runs are removed by the next save. Files and directories are created
with the umask, as ``open()`` and ``mkdir()`` create them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core.errors import FileMissingError, IsAFolderError
from onnxblocks.checkpoint.schema import EXTERNAL_DATA_SUFFIX

#: Suffix of the directory holding the versions of a checkpoint with external data.
VERSIONS_SUFFIX = ".versions"
#: Name of the link to the current version inside it.
CURRENT = "current"


def data_path_of(path: str | os.PathLike) -> Path:
    """The side file ONNX Runtime reads for the checkpoint ``path``: ``<path>.data``."""
    p = Path(os.fspath(path))
    return p.with_name(p.name + EXTERNAL_DATA_SUFFIX)


def versions_dir(target: Path) -> Path:
    """``.<name>.versions`` beside the checkpoint ``target``."""
    return target.with_name(f".{target.name}{VERSIONS_SUFFIX}")


def resolve(path: str | os.PathLike) -> Path:
    """The real path of a checkpoint's header: its current version when versioned, else ``path``
    itself.

    Read the header and ``<real path>.data`` from it, so that both come from one version.
    """
    p = Path(os.fspath(path))
    return Path(os.path.realpath(p)) if _versioned(p) else p


@dataclass(frozen=True)
class Staged:
    """The temporary files of a checkpoint being written, beside its target.

    Attributes:
        header: Write the flatbuffer here.
        data: Write the external data here (ONNX Runtime's ``save_checkpoint`` on
            ``header`` writes it there by itself); leave it absent when there is none.
    """

    header: Path
    data: Path


@contextlib.contextmanager
def replacing(target: str | os.PathLike) -> Iterator[Staged]:
    """Stage a checkpoint beside ``target``, then replace ``target`` (and its data file)
    all-or-nothing.

    Temporary files of killed runs beside ``target``, and versions no link points
    to, are removed first. When the block raises, the staged files are removed and
    the old checkpoint is untouched.

    Raises:
        FileNotFoundError: if the target's directory does not exist.
        IsADirectoryError: if the target is a directory.
    """
    final = Path(os.fspath(target))
    if not final.parent.is_dir():
        raise FileMissingError(
            f"Cannot write checkpoint '{final}': directory '{final.parent}' does not exist."
        )
    if final.is_dir():
        raise IsAFolderError(
            f"'{final}' is a directory; a checkpoint is a file. Pass a file path, e.g. "
            f"'{final / 'checkpoint'}'."
        )
    remove_stale(final)
    header = _tempfiles.temp_path(final)
    staged = Staged(header, data_path_of(header))
    try:
        yield staged
        commit(final, staged.header, staged.data if os.path.lexists(staged.data) else None)
    except BaseException as exc:
        for leftover in (staged.header, staged.data):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        shown = _tempfiles.without_temp_names(
            exc, {staged.data: data_path_of(final), staged.header: final}
        )
        if shown is not None:
            raise shown from None
        raise


def commit(target: Path, header: Path, data: Path | None) -> None:
    """Move a written header (and its data file, if any) over the checkpoint ``target``,
    all-or-nothing.
    """
    data_target = data_path_of(target)
    if data is None:
        os.replace(header, target)  # the new header reads no data: one rename
        _remove_data(target)
        return
    if not os.path.lexists(target) or not os.path.lexists(data_target):
        os.replace(
            data, data_target
        )  # no old header reads a data file: data first, then the header
        os.replace(header, target)
        _remove_versions(target, keep=None)
        return
    if not _versioned(target) and not _enter_versions(target):
        os.replace(data, data_target)  # no links on this file system: not atomic
        os.replace(header, target)
        return
    _link(target, data_target)  # both names read the current version (repairs a half-made layout)
    _link(target, target)
    version = versions_dir(target) / _tempfiles.writer_token()
    old = _current(target)
    os.mkdir(version)
    try:
        os.replace(data, version / data_target.name)
        os.replace(header, version / target.name)
        _switch(target, version.name)  # the one atomic step: both names now read the new version
    except BaseException:
        if _current(target) != version.name:
            shutil.rmtree(version, ignore_errors=True)
        raise
    _remove_versions(target, keep=version.name, also=old)


def remove_stale(target: Path) -> None:
    """Remove temporary files of killed writers beside ``target`` and versions of it that nothing
    uses.
    """
    _tempfiles.remove_stale(target.parent)
    if versions_dir(target).is_dir():
        _tempfiles.remove_stale(
            versions_dir(target)
        )  # a `current` link being made when its writer died
    if _versioned(target) or os.path.islink(
        data_path_of(target)
    ):  # (the latter: a layout being entered)
        _remove_stale_versions(target)
    elif versions_dir(target).is_dir():
        _remove_versions(target, keep=None)  # nothing reads through it any more


# --------------------------------------------------------------------------- the versioned layout
def _link_text(target: Path, name: str) -> str:
    """The relative text of the link ``<name>`` -> ``.<target>.versions/current/<name>``."""
    return os.path.join(versions_dir(target).name, CURRENT, name)


def _versioned(target: Path) -> bool:
    """True when ``target`` is the link into its versions directory."""
    try:
        return os.readlink(target) == _link_text(target, target.name)
    except OSError:
        return False


def _current(target: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(versions_dir(target) / CURRENT))
    except OSError:
        return None


def _symlink_over(text: str, where: Path) -> None:
    """Make ``where`` a symbolic link with ``text``, atomically (a temporary link renamed over
    it).
    """
    temp = _tempfiles.temp_path(where)
    os.symlink(text, temp)
    try:
        os.replace(temp, where)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise


def _switch(target: Path, version: str) -> None:
    _symlink_over(version, versions_dir(target) / CURRENT)


def _link(target: Path, name_path: Path) -> None:
    """Point ``name_path`` (the header or the data file) at the current version, unless it
    already does.
    """
    text = _link_text(target, name_path.name)
    with contextlib.suppress(OSError):
        if os.readlink(name_path) == text:
            return
    _symlink_over(text, name_path)


def _enter_versions(target: Path) -> bool:
    """Move a regular header and data file into the versioned layout without a moment of mismatch.

    Both are hard-linked into a first version, ``current`` points at it, and then
    the data file and the header are replaced by links that read the same bytes.

    Returns:
        False (nothing changed) when the file system has no hard or symbolic links.
    """
    directory = versions_dir(target)
    version = directory / _tempfiles.writer_token()
    data_target = data_path_of(target)
    try:
        directory.mkdir(exist_ok=True)
        os.mkdir(version)
        os.link(target, version / target.name)
        os.link(data_target, version / data_target.name)
        _switch(target, version.name)
    except (OSError, NotImplementedError):
        shutil.rmtree(version, ignore_errors=True)
        return False
    _link(target, data_target)  # the same bytes as before: the old header still reads its own data
    _link(target, target)
    return True


def _remove_stale_versions(target: Path) -> None:
    """Remove the versions of dead writers that ``current`` does not point to."""
    directory, current = versions_dir(target), _current(target)
    with contextlib.suppress(OSError), os.scandir(directory) as scan:
        stale = [
            e.path for e in scan if e.name not in (current, CURRENT) and _tempfiles.is_stale(e.name)
        ]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)


def _remove_data(target: Path) -> None:
    """After an inline header replaced ``target``: remove the data file (or its link) and the
    versions.
    """
    with contextlib.suppress(FileNotFoundError):
        data_path_of(target).unlink()
    _remove_versions(target, keep=None)


def _remove_versions(target: Path, keep: str | None, also: str | None = None) -> None:
    """Remove the versions of ``target`` except ``keep`` (all of them when it is None).

    Versions of other live processes stay (they may be staging one); those of dead
    ones, of this process and ``also`` (the version just replaced) go.
    """
    directory = versions_dir(target)
    if not directory.is_dir() or directory.is_symlink():
        return
    mine = f"{os.getpid()}-"
    with os.scandir(directory) as scan:
        entries = [
            e
            for e in scan
            if e.name not in (keep, CURRENT) and _tempfiles.WRITER_NAME.match(e.name)
        ]
    for entry in entries:
        if (
            keep is None
            or entry.name == also
            or entry.name.startswith(mine)
            or _tempfiles.is_stale(entry.name)
        ):
            shutil.rmtree(entry.path, ignore_errors=True)
    if keep is None:
        with contextlib.suppress(FileNotFoundError):
            (directory / CURRENT).unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()
