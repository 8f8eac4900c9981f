"""Portable training graphs: training-only ops lowered to standard ONNX ops (docs/portable.md).

Autodiff stays ONNX Runtime's C++ gradient builder, at generation time; this
package rewrites what it emits so that the training, optimizer and fused step
models run on stock ``onnxruntime`` (any Python, ``onnxruntime-web``, ``-node``):

* :func:`make_portable`: the entry point, from the training build's models.
* :data:`LOWERINGS`: one small named function per training-only or contrib op (families in
  ``activations``, ``broadcast``, ``matmul``, ``fused_ops``, ``softmax``, ``layer_norm``,
  ``indexing``, ``conv``, ``recurrent``), applied by the :class:`LowerTrainingOps` pass
  (:func:`lower_training_ops` on a ``ModelProto``).
* :class:`AccumulateGradients`, :func:`optimizer_model`, :class:`FuseStep`: the contract
  rewrites (accumulated gradients out; updated parameters and moments out, one tensor
  each; one fused step), passes on :mod:`onnxblocks.ir`'s contract;
  :func:`portable_optimizer_model` writes the optimizer with the training build's
  sequence inputs.
* :func:`non_portable_ops` / :func:`is_portable_op`: the check of a portable mode:
  ``"standard"`` (the default: standard ONNX ops only) or ``"onnxruntime"`` (also the
  contrib ops stock ONNX Runtime runs on CPU, :data:`PORTABLE_CONTRIB_OPS`).

It sits on ``_core`` and ``ir`` only (every graph edit is an :mod:`onnxblocks.ir` pass).
"""

from onnxblocks.portable.lower import LOWERINGS
from onnxblocks.portable.make import PortableModels, check_portable, make_portable
from onnxblocks.portable.ops import is_portable_op, non_portable_ops

__all__ = [
    "LOWERINGS",
    "PortableModels",
    "check_portable",
    "is_portable_op",
    "make_portable",
    "non_portable_ops",
]
