"""Training artifacts: the files ONNX Runtime's training API runs.

:func:`generate_artifacts` writes, into one directory:

==============================  ==========================================================
file                            what it is
==============================  ==========================================================
``{prefix}training_model.onnx`` forward + loss + gradient graph + gradient accumulation
``{prefix}eval_model.onnx``     forward + loss, training-mode Dropout/BatchNorm off
``{prefix}checkpoint``          trainable and frozen parameters
``{prefix}optimizer_model.onnx`` the optimizer (only with ``optimizer=``)
``{prefix}nominal_checkpoint``  parameter names and types only (``nominal_checkpoint=True``)
``*.ort``                       ORT-format copies of the models (``ort_format=True``)
``*.data``                      external data of a model or checkpoint, when large
==============================  ==========================================================

The names are the contract of :class:`onnxblocks._core.contracts.ArtifactNames`.
:mod:`onnxblocks.artifacts.generate` builds the models; :mod:`onnxblocks.artifacts.files`
writes the set all at once.
"""

from onnxblocks.artifacts.generate import Artifacts, LossType, OptimType, generate_artifacts

__all__ = ["Artifacts", "LossType", "OptimType", "generate_artifacts"]
