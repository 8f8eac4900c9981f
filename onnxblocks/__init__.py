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
import warnings
from typing import Any

from onnxblocks import errors
from onnxblocks._core import html as _html
from onnxblocks._core.version import __version__
from onnxblocks.errors import OnnxBlocksError

# Rich displays: the display layer registers its renderers when a notebook first asks for one.
_html.set_loader(lambda: importlib.import_module("onnxblocks.display"))

# Loaded on first attribute access, to keep `import onnxblocks` fast.
# The blocks, losses and optimizers too (they import onnx): a federated client's process, started
# for every message, trains with the runtime and never builds a graph.
_LAZY_MODULES = {
    "artifacts",
    "blocks",
    "losses",
    "optim",
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
    **{
        name: "onnxblocks.blocks"
        for name in (
            "Block",
            "ForwardBlock",
            "ModelAccessor",
            "ScriptBlock",
            "TrainingBlock",
            "Value",
            "base",
            "custom_op_library",
            "empty_base",
            "from_onnxscript",
            "value",
        )
    },
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

# Errors live in onnxblocks.errors; these top-level spellings resolve there for one release, with a
# DeprecationWarning naming the import to write (docs/api.md, "Moved names").
_MOVED = {name: "onnxblocks.errors" for name in errors.__all__ if name != "OnnxBlocksError"}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"onnxblocks.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    if name in _MOVED:
        warnings.warn(
            f"onnxblocks.{name} is deprecated: use {_MOVED[name]}.{name} "
            f"(from {_MOVED[name]} import {name}).",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'onnxblocks' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(__all__) | _LAZY_MODULES)


__all__ = [
    "Artifacts",
    "Block",
    "ForwardBlock",
    "LossType",
    "ModelAccessor",
    "OnnxBlocksError",
    "OptimType",
    "ScriptBlock",
    "TrainingBlock",
    "TrainingSession",
    "Value",
    "__version__",
    "base",
    "blocks",
    "custom_op_library",
    "empty_base",
    "errors",
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
