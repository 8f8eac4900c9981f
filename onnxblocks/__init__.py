"""onnxblocks: compose ONNX training graphs in Python.

Build losses as Blocks on top of any ONNX model, differentiate them with ONNX
Runtime's native gradient builder, and write the training artifacts (training
model, eval model, checkpoint, optimizer model) that ONNX Runtime's training API
runs. Importing onnxblocks imports neither torch, onnxruntime nor onnxscript:
the submodules that need them (artifacts, runtime, checkpoint, display, compat)
are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from onnxblocks import blocks, losses, optim
from onnxblocks._core import html as _html
from onnxblocks._core.version import __version__
from onnxblocks.blocks import (
    Block,
    ForwardBlock,
    ModelAccessor,
    ScriptBlock,
    TrainingBlock,
    Value,
    base,
    custom_op_library,
    empty_base,
    from_onnxscript,
    value,
)
from onnxblocks.errors import (
    CheckpointFormatError,
    CheckpointMismatchError,
    CliError,
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
    NpmError,
    OnnxBlocksError,
    OrtRunError,
    PortabilityError,
    StateError,
    TorchExportError,
    TrainingBuildRequiredError,
    UnknownNameError,
    ValueOperandError,
)

# Rich displays: the display layer registers its renderers when a notebook first asks for one.
_html.set_loader(lambda: importlib.import_module("onnxblocks.display"))

# Loaded on first attribute access, to keep `import onnxblocks` fast.
_LAZY_MODULES = {
    "artifacts",
    "checkpoint",
    "compat",
    "datasets",
    "demo",
    "display",
    "gradient",
    "io",
    "runtime",
}
_LAZY_NAMES = {
    "generate_artifacts": "onnxblocks.artifacts",
    "Artifacts": "onnxblocks.artifacts",
    "LossType": "onnxblocks.artifacts",
    "OptimType": "onnxblocks.artifacts",
    "save_checkpoint": "onnxblocks.checkpoint",
    "load_checkpoint": "onnxblocks.checkpoint",
    "load_checkpoint_to_model": "onnxblocks.checkpoint",
    "save_model": "onnxblocks.io",
    "TrainingSession": "onnxblocks.runtime",
    "fit": "onnxblocks.runtime",
    "show": "onnxblocks.display",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"onnxblocks.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'onnxblocks' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(__all__) | _LAZY_MODULES)


__all__ = [
    "Artifacts",
    "Block",
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "CliError",
    "DataFileError",
    "FileAccessError",
    "FileConflictError",
    "FileMissingError",
    "ForwardBlock",
    "GradientError",
    "InvalidIndexError",
    "InvalidTypeError",
    "InvalidValueError",
    "IsAFolderError",
    "LockTimeoutError",
    "LossType",
    "MissingDependencyError",
    "ModelAccessor",
    "NoActiveModelError",
    "NotAFolderError",
    "NotBuiltError",
    "NpmError",
    "OnnxBlocksError",
    "OptimType",
    "OrtRunError",
    "PortabilityError",
    "ScriptBlock",
    "StateError",
    "TorchExportError",
    "TrainingBlock",
    "TrainingBuildRequiredError",
    "TrainingSession",
    "UnknownNameError",
    "Value",
    "ValueOperandError",
    "__version__",
    "base",
    "blocks",
    "custom_op_library",
    "empty_base",
    "fit",
    "from_onnxscript",
    "generate_artifacts",
    "load_checkpoint",
    "load_checkpoint_to_model",
    "losses",
    "optim",
    "save_checkpoint",
    "save_model",
    "show",
    "value",
]
