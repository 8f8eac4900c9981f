"""onnxblocks: compose ONNX training graphs in Python.

Build losses as Blocks on top of any ONNX model, differentiate them with ONNX
Runtime's native gradient builder, and write the training artifacts (training
model, eval model, checkpoint, optimizer model) that ONNX Runtime's training API
runs. Importing onnxblocks imports neither torch nor onnxruntime.
"""

from __future__ import annotations

from onnxblocks import blocks
from onnxblocks.blocks import (
    Block,
    ForwardBlock,
    ModelAccessor,
    Value,
    base,
    custom_op_library,
    empty_base,
    value,
)
from onnxblocks.errors import GradientError, NoActiveModelError, NotBuiltError, OnnxBlocksError, UnknownNameError

__version__ = "0.1.0"

__all__ = [
    "Block",
    "ForwardBlock",
    "GradientError",
    "ModelAccessor",
    "NoActiveModelError",
    "NotBuiltError",
    "OnnxBlocksError",
    "UnknownNameError",
    "Value",
    "__version__",
    "base",
    "blocks",
    "custom_op_library",
    "empty_base",
    "value",
]
