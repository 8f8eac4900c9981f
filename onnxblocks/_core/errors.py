"""Exceptions raised by onnxblocks.

Every error onnxblocks raises on purpose is an :class:`OnnxBlocksError`. Each
class also subclasses the builtin that matches its meaning (``ValueError`` for a
bad value, ``TypeError`` for a wrong kind, ``KeyError`` for an unknown name,
``RuntimeError`` for a call made at the wrong time, ``FileNotFoundError`` for a
missing file...), so callers can catch the precise class, ``OnnxBlocksError``,
or the builtin their code already catches.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class OnnxBlocksError(Exception):
    """Base class of every error onnxblocks raises on purpose."""


class InvalidValueError(OnnxBlocksError, ValueError):
    """An argument, attribute, tensor or file content that onnxblocks cannot use as it is."""


class InvalidTypeError(OnnxBlocksError, TypeError):
    """An argument of the wrong kind (a path where a model was expected, a float where an int
    was...).
    """


class UnknownNameError(OnnxBlocksError, KeyError):
    """A name (value, parameter, input) that the model does not have."""

    def __str__(self) -> str:  # LookupError/KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidIndexError(OnnxBlocksError, IndexError):
    """A position outside what it indexes (a step outside a plan, an epoch not logged...)."""


class StateError(OnnxBlocksError, RuntimeError):
    """A call made when its object cannot serve it (no eval model to export, no optimizer to
    step...).
    """


class OrtRunError(OnnxBlocksError, RuntimeError):
    """ONNX Runtime failed to run a model (its message, cleaned, says why).

    Attributes:
        input_error: True when ONNX Runtime blamed the model or its inputs
            (``InvalidArgument`` and the like), False for a failure while running.
    """

    input_error: bool = False


class TorchExportError(OnnxBlocksError, RuntimeError):
    """torch's exporter could not export a module (the message names the module and what failed)."""


class MissingDependencyError(OnnxBlocksError, ImportError):
    """An optional package the call needs is not installed (the message names the pip command)."""


class FileMissingError(OnnxBlocksError, FileNotFoundError):
    """A file or folder the call needs does not exist."""


class IsAFolderError(OnnxBlocksError, IsADirectoryError):
    """A folder where a file was expected."""


class NotAFolderError(OnnxBlocksError, NotADirectoryError):
    """A file where a folder was expected."""


class FileConflictError(OnnxBlocksError, FileExistsError):
    """A file is in the way of one onnxblocks would write."""


class FileAccessError(OnnxBlocksError, PermissionError):
    """A file or folder onnxblocks may not read or write."""


class DataFileError(OnnxBlocksError, OSError):
    """A data file that cannot be read as its model says (it ends early, it is not where it
    should be...).
    """


class LockTimeoutError(OnnxBlocksError, TimeoutError):
    """Another process held a lock for longer than the call would wait."""


class NpmError(OnnxBlocksError, RuntimeError):
    """npm or the JavaScript client cannot be had; the message says what to install or set."""


class CliError(OnnxBlocksError):
    """An error the ``onnxblocks`` command reports as one line, with its exit code (3: bad input
    by default).
    """

    def __init__(self, message: str, code: int = 3) -> None:
        super().__init__(message)
        self.code = code


class NoActiveModelError(OnnxBlocksError, RuntimeError):
    """A block was called outside ``onnxblocks.base(...)`` / ``onnxblocks.empty_base()``."""


class ValueOperandError(OnnxBlocksError, TypeError):
    """An operator between a graph ``Value`` and an operand it cannot combine with (a plain
    ``str``).
    """


class NotBuiltError(OnnxBlocksError, RuntimeError):
    """A result was asked of a block before the block was built."""


class GradientError(OnnxBlocksError, RuntimeError):
    """ONNX Runtime could not build the gradient graph."""


class CheckpointFormatError(OnnxBlocksError, ValueError):
    """A file is not a valid ONNX Runtime training checkpoint."""


class CheckpointMismatchError(CheckpointFormatError):
    """A valid checkpoint that does not belong to the model it is used with (names, element
    types, shapes).
    """


class TrainingBuildRequiredError(OnnxBlocksError, ImportError):
    """The installed onnxruntime is the stock build, and the call needs onnxruntime-training.

    Running non-portable artifacts needs the training build (``onnxruntime-training``,
    Python <= 3.12); portable artifacts (``generate_artifacts(..., portable=True)``)
    train on stock onnxruntime. Generating artifacts on stock onnxruntime sends ONNX
    Runtime's gradient builder to a worker Python 3.10-3.12 (docs/training.md); this
    is raised when none can be found or set up, saying what to install.
    """


class PortabilityError(OnnxBlocksError, ValueError):
    """A training graph holds an op that portable artifacts cannot express in standard ONNX ops.

    Raised by :mod:`onnxblocks.portable` (``generate_artifacts(..., portable=True)``)
    for a training-only op without a lowering, or one whose lowering needs what the
    graph does not give (a newer opset, a known rank).
    """


def close_matches(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Return up to ``n`` candidates that look like ``name`` (for "did you mean" hints)."""
    return difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.6)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ``" Did you mean 'x'?"`` sentence, or ``""`` when nothing is close."""
    matches = close_matches(name, candidates)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(m) for m in matches) + "?"


def preview(names: Iterable[str], limit: int = 12) -> str:
    """Format a list of names for an error message, truncated after ``limit``."""
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:limit])
    if len(names) > limit:
        shown += f", ... ({len(names) - limit} more)"
    return f"[{shown}]"
