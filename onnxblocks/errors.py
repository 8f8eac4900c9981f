"""The exceptions onnxblocks raises on purpose (public home of :mod:`onnxblocks._core.errors`)."""

from onnxblocks._core.errors import (
    CheckpointFormatError,
    GradientError,
    NoActiveModelError,
    NotBuiltError,
    OnnxBlocksError,
    UnknownNameError,
)

__all__ = [
    "CheckpointFormatError",
    "GradientError",
    "NoActiveModelError",
    "NotBuiltError",
    "OnnxBlocksError",
    "UnknownNameError",
]
