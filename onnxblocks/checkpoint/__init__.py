"""ONNX Runtime training checkpoints, written and read by onnxblocks (streaming large parameters).

See :mod:`onnxblocks.checkpoint.format` for the file format.
"""

from onnxblocks._core.errors import CheckpointMismatchError
from onnxblocks.checkpoint.format import CheckpointFormatError
from onnxblocks.checkpoint.load import (
    Checkpoint,
    is_checkpoint,
    load_checkpoint,
    load_checkpoint_to_model,
    read_parameter_names,
)
from onnxblocks.checkpoint.optimizer_state import OptimizerGroup, OptimizerState
from onnxblocks.checkpoint.save import external_data_path, save_checkpoint
from onnxblocks.checkpoint.validate import check_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "OptimizerGroup",
    "OptimizerState",
    "check_checkpoint",
    "external_data_path",
    "is_checkpoint",
    "load_checkpoint",
    "load_checkpoint_to_model",
    "read_parameter_names",
    "save_checkpoint",
]
