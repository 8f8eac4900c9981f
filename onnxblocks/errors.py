"""The exceptions onnxblocks raises on purpose (public home of :mod:`onnxblocks._core.errors`).

Every one is an :class:`OnnxBlocksError` and also the builtin that matches its meaning, so existing
``except ValueError`` (``TypeError``, ``KeyError``, ``FileNotFoundError``...) code keeps working.
"""

from onnxblocks._core.errors import (
    CheckpointFormatError,
    CheckpointMismatchError,
    DataFileError,
    FileAccessError,
    FileConflictError,
    FileMissingError,
    GradientError,
    InvalidIndexError,
    InvalidTypeError,
    InvalidValueError,
    IsAFolderError,
    LockTimeoutError,
    MissingDependencyError,
    NoActiveModelError,
    NotAFolderError,
    NotBuiltError,
    OnnxBlocksError,
    OrtRunError,
    PortabilityError,
    StateError,
    TrainingBuildRequiredError,
    UnknownNameError,
    ValueOperandError,
)

__all__ = [
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "DataFileError",
    "FileAccessError",
    "FileConflictError",
    "FileMissingError",
    "GradientError",
    "InvalidIndexError",
    "InvalidTypeError",
    "InvalidValueError",
    "IsAFolderError",
    "LockTimeoutError",
    "MissingDependencyError",
    "NoActiveModelError",
    "NotAFolderError",
    "NotBuiltError",
    "OnnxBlocksError",
    "OrtRunError",
    "PortabilityError",
    "StateError",
    "TrainingBuildRequiredError",
    "UnknownNameError",
    "ValueOperandError",
]
