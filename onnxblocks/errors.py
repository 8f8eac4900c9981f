"""The exceptions onnxblocks raises on purpose (public home of :mod:`onnxblocks._core.errors`)."""

from onnxblocks._core.errors import (
    CheckpointFormatError,
    CheckpointMismatchError,
    GradientError,
    NoActiveModelError,
    NotBuiltError,
    OnnxBlocksError,
    PortabilityError,
    TrainingBuildRequiredError,
    UnknownNameError,
    ValueOperandError,
)

__all__ = [
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "GradientError",
    "NoActiveModelError",
    "NotBuiltError",
    "OnnxBlocksError",
    "PortabilityError",
    "TrainingBuildRequiredError",
    "UnknownNameError",
    "ValueOperandError",
]
