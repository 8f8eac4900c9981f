"""Optimizers: the torch.optim family (SGD, Adam, AdamW, Adagrad, RMSprop), Lamb, parameter groups,
gradient clipping.

Build one inside ``with onnxblocks.empty_base():`` by calling it with the
``(trainable, frozen)`` parameters, then take ``.to_model_proto()``; or pass it to
``generate_artifacts(optimizer=...)``. The model follows the input contract
documented in :mod:`onnxblocks.optim.base`. The reference's classes (its AdamW
defaults, ``AdamWOptimizer``, ``SGDOptimizer``) are in :mod:`onnxblocks.compat`.
"""

from __future__ import annotations

import warnings
from typing import Any

from onnxblocks.optim.adamw import AdamW
from onnxblocks.optim.base import Optimizer
from onnxblocks.optim.clip import ClipGradNorm
from onnxblocks.optim.param_groups import NormBiasParams, no_decay_norm_bias
from onnxblocks.optim.sgd import SGD
from onnxblocks.optim.standard import StandardOptimizer
from onnxblocks.optim.torch_family import Adagrad, Adam, Lamb, RMSprop

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "ClipGradNorm",
    "Lamb",
    "NormBiasParams",
    "Optimizer",
    "RMSprop",
    "StandardOptimizer",
    "no_decay_norm_bias",
]

#: Names importable here for one release, each read warning: name -> (module, home for the message).
_MOVED = {
    "ReferenceAdamW": ("onnxblocks.optim._reference", "onnxblocks.compat.ReferenceAdamW"),
    "ReferenceSGD": ("onnxblocks.optim._reference", "onnxblocks.compat.ReferenceSGD"),
    "AdamWOptimizer": ("onnxblocks.optim._reference", "onnxblocks.compat.AdamWOptimizer"),
    "SGDOptimizer": ("onnxblocks.optim._reference", "onnxblocks.compat.SGDOptimizer"),
    "AdamWUpdate": ("onnxblocks.optim.adamw", "onnxblocks.optim.adamw.AdamWUpdate"),
    "SGDUpdate": ("onnxblocks.optim.sgd", "onnxblocks.optim.sgd.SGDUpdate"),
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        module, home = _MOVED[name]
        warnings.warn(
            f"onnxblocks.optim.{name} is deprecated: use {home}.", DeprecationWarning, stacklevel=2
        )
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'onnxblocks.optim' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(__all__)
