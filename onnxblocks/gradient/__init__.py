"""Gradient graphs: ONNX Runtime's native autodiff, wrapped.

:func:`build_training_graphs` turns a forward model whose first output is the
loss into the training model (with gradient accumulation) and the eval model
that ONNX Runtime's training API runs. onnxruntime is imported only when a
gradient is built.
"""

from onnxblocks.gradient.accumulation import (
    LAZY_RESET_GRAD,
    accumulated_name,
    add_gradient_accumulation,
    buffer_name,
    gradient_name,
)
from onnxblocks.gradient.builder import TrainingGraphs, build_training_graphs
from onnxblocks.gradient.eval_model import disable_training_mode
from onnxblocks.gradient.normalize import (
    cast_like_as_cast,
    default_passes,
    expose_layer_norm_statistics,
    gelu_as_contrib_gelu,
    normalize,
    softplus_as_elementary,
    split_to_sequence_as_split,
)
from onnxblocks.gradient.parameters import ParameterPartition, partition_parameters

__all__ = [
    "LAZY_RESET_GRAD",
    "ParameterPartition",
    "TrainingGraphs",
    "accumulated_name",
    "add_gradient_accumulation",
    "buffer_name",
    "build_training_graphs",
    "cast_like_as_cast",
    "default_passes",
    "disable_training_mode",
    "expose_layer_norm_statistics",
    "gelu_as_contrib_gelu",
    "gradient_name",
    "normalize",
    "partition_parameters",
    "softplus_as_elementary",
    "split_to_sequence_as_split",
]
