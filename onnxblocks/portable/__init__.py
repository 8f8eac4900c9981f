"""Portable training graphs: training-only ops lowered to standard ONNX ops (docs/portable.md).

Autodiff stays ONNX Runtime's C++ gradient builder, at generation time; this
package rewrites what it emits so that the training, optimizer and fused step
models run on stock ``onnxruntime`` (any Python, ``onnxruntime-web``, ``-node``):

* :func:`make_portable`: the entry point, from the training build's models.
* :data:`LOWERINGS`: one small named function per training-only op (families in
  ``activations``, ``broadcast``, ``matmul``, ``softmax``, ``normalization``,
  ``indexing``, ``conv``, ``recurrent``), applied by :func:`lower_training_ops`.
* :func:`portable_accumulation`, :func:`portable_optimizer_model`, :func:`step_model`:
  the contract rewrites (accumulated gradients out, updated sequences out, one fused step).
* :func:`non_portable_ops` / :func:`is_portable_op`: the check against what stock
  ONNX Runtime runs (:data:`PORTABLE_CONTRIB_OPS`).

It sits on ``_core`` and ``gradient`` only.
"""

from onnxblocks.portable.accumulation import portable_accumulation, trainable_parameters
from onnxblocks.portable.lower import CONTRACT_OPS, LOWERINGS, lower_training_ops
from onnxblocks.portable.make import PortableModels, check_portable, make_portable, mark_portable
from onnxblocks.portable.ops import PORTABLE_CONTRIB_OPS, is_portable_op, non_portable_ops
from onnxblocks.portable.optimizer import OptimizerSpec, portable_optimizer_model, read_optimizer
from onnxblocks.portable.step import step_model

__all__ = [
    "CONTRACT_OPS",
    "LOWERINGS",
    "PORTABLE_CONTRIB_OPS",
    "OptimizerSpec",
    "PortableModels",
    "portable_accumulation",
    "check_portable",
    "is_portable_op",
    "lower_training_ops",
    "make_portable",
    "mark_portable",
    "non_portable_ops",
    "portable_optimizer_model",
    "read_optimizer",
    "step_model",
    "trainable_parameters",
]
