"""Atomic file writes: each target appears complete or not at all.

Files are written to temporary names in the target's directory and moved over the targets only
when complete, so a reader never sees half a file and a killed writer leaves the old file in place.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from pathlib import Path

from onnxblocks._core import dirlock as _dirlock
from onnxblocks._core import tempfiles as _tempfiles
from onnxblocks._core.errors import FileMissingError, IsAFolderError, NotAFolderError
from onnxblocks._core.paths import write_error


@contextlib.contextmanager
def atomic_outputs(*targets: str | os.PathLike) -> Iterator[list[Path]]:
    """Write several files so that each appears complete or not at all.

    Yields one temporary path per target, in the target's directory. When the ``with`` block
    ends normally each temporary file is moved over its target (``os.replace``), in the order
    given (put the file that refers to the others last), under the directory's lock when there
    are several, so two writers never interleave. When it raises, every temporary file is
    removed and the targets are left as they were. Temporary names carry the writer's process
    id (:mod:`onnxblocks._core.tempfiles`): those of killed runs in the targets' directories
    are removed first. Files are created with the umask, as ``open()`` creates them.

    Raises:
        FileNotFoundError: if a target's directory does not exist.
        NotADirectoryError: if a target's directory is a file.
        IsADirectoryError: if a target is a directory.
    """
    finals = [Path(os.fspath(t)) for t in targets]
    for final in finals:
        if not final.parent.is_dir():
            if final.parent.exists() or any(p.is_file() for p in final.parents):
                raise NotAFolderError(
                    f"Cannot write '{final}': '{final.parent}' is not a directory (a path below "
                    "a file?). "
                    "Choose a path inside a directory."
                )
            raise FileMissingError(
                f"Cannot write '{final}': directory '{final.parent}' does not exist. Create it "
                "first."
            )
        if (
            final.is_dir() and not final.is_symlink()
        ):  # checked first: a write would fail only at its end
            raise IsAFolderError(
                f"Cannot write '{final}': it is a directory. Pass a file path (inside it?)."
            )
    for parent in dict.fromkeys(f.parent for f in finals):
        _tempfiles.remove_stale(parent)
    temps = [_tempfiles.temp_path(f) for f in finals]
    try:
        # the writers create them (pre-creating and truncating them would force a flush on ext4)
        yield temps
        with _dirlock.files_lock(finals):
            for temp, final in zip(temps, finals, strict=True):
                os.replace(temp, final)
    except BaseException as exc:
        for temp in temps:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        named = write_error(exc, finals)
        if named is not None:
            # a clear error naming the target, not "[Errno 13] ... <temp name>"
            raise named from None
        shown = _tempfiles.without_temp_names(exc, dict(zip(temps, finals, strict=True)))
        if shown is not None:
            raise shown from None  # messages name the targets, not temporary files
        raise


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, companions: bool = False) -> Iterator[Path]:
    """Write one file so that it appears complete or not at all.

    The one-target form of :func:`atomic_outputs`: yields the temporary path
    (in the target's directory, not created yet), moves it over ``target`` when
    the ``with`` block ends normally, and removes it when the block raises.

    Args:
        target: The file to write.
        companions: Also move the files the writer put beside the temporary file
            under names that extend it, to the same extension of the target
            (``<temp>.data`` becomes ``<target>.data``, as ONNX Runtime writes a
            checkpoint's external data). They are moved before the target, and
            removed with it when the block raises.

    Raises:
        FileNotFoundError: if the target's directory does not exist.
    """
    with atomic_outputs(target) as (temp,):
        pattern = glob.escape(temp.name) + "?*"
        try:
            yield temp
            if companions:
                final = Path(os.fspath(target))
                for companion in sorted(temp.parent.glob(pattern)):
                    os.replace(
                        companion, final.with_name(final.name + companion.name[len(temp.name) :])
                    )
        except BaseException:
            if companions:
                for leftover in temp.parent.glob(pattern):
                    leftover.unlink(missing_ok=True)
            raise
