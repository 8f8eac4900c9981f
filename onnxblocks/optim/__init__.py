"""Optimizer models for ONNX Runtime's training API: AdamW, SGD and gradient clipping.

Build one inside ``with onnxblocks.empty_base():`` by calling it with the
``(trainable, frozen)`` parameters, then take ``.to_model_proto()``. The model
follows the input contract documented in :mod:`onnxblocks.optim.base`.
"""

from onnxblocks.optim import contrib
from onnxblocks.optim.adamw import AdamW, AdamWUpdate
from onnxblocks.optim.base import Optimizer
from onnxblocks.optim.clip import ClipGradNorm
from onnxblocks.optim.compat import AdamWOptimizer, ReferenceAdamW, ReferenceSGD, SGDOptimizer
from onnxblocks.optim.sgd import SGD, SGDUpdate

__all__ = [
    "SGD",
    "AdamW",
    "AdamWOptimizer",
    "AdamWUpdate",
    "ClipGradNorm",
    "Optimizer",
    "ReferenceAdamW",
    "ReferenceSGD",
    "SGDOptimizer",
    "SGDUpdate",
    "contrib",
]
