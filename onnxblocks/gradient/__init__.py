"""Gradient graphs: ONNX Runtime's native autodiff, wrapped.

:func:`build_training_graphs` turns a forward model whose first output is the
loss into the training model (with gradient accumulation) and the eval model
that ONNX Runtime's training API runs. onnxruntime is imported only when a
gradient is built.
"""

import onnxblocks.ir.lazy  # noqa: F401  # first: onnx-ir's sympy loads only if symbolic dims are computed with
from onnxblocks.gradient.accumulation import (
    LAZY_RESET_GRAD,
    accumulated_name,
    add_gradient_accumulation,
    buffer_name,
    gradient_name,
)
from onnxblocks.gradient.activations import activations_as_elementary
from onnxblocks.gradient.batch_norm import batch_norm_inference_as_elementary
from onnxblocks.gradient.builder import TrainingGraphs, build_training_graphs, check_training_model
from onnxblocks.gradient.conv_transpose import conv_transpose_as_conv
from onnxblocks.gradient.eval_model import disable_training_mode
from onnxblocks.gradient.group_norm import group_norm_as_elementary
from onnxblocks.gradient.indexing import (
    border_pad_as_gather,
    depth_to_space_as_reshape,
    negative_step_slice_as_gather,
)
from onnxblocks.gradient.layer_norm import expose_layer_norm_statistics, layer_norm_zero_bias
from onnxblocks.gradient.normalize import (
    cast_like_as_cast,
    default_passes,
    expose_dropout_mask,
    gelu_as_contrib_gelu,
    normalize,
    softplus_as_elementary,
    split_to_sequence_as_split,
)
from onnxblocks.gradient.parameters import ParameterPartition, partition_parameters
from onnxblocks.gradient.pooling import average_pool_as_conv, check_pool_shapes
from onnxblocks.gradient.recurrent import recurrent_as_elementary, recurrent_directions_as_forward
from onnxblocks.gradient.reductions import cumsum_as_matmul, reduce_extremum_as_topk
from onnxblocks.gradient.resize import resize_as_matmul
from onnxblocks.gradient.split import SplitVjp, split_vjp_graph
from onnxblocks.gradient.vjp import VjpGraph, build_vjp_graph

__all__ = [
    "LAZY_RESET_GRAD",
    "ParameterPartition",
    "SplitVjp",
    "TrainingGraphs",
    "VjpGraph",
    "accumulated_name",
    "activations_as_elementary",
    "add_gradient_accumulation",
    "average_pool_as_conv",
    "batch_norm_inference_as_elementary",
    "border_pad_as_gather",
    "buffer_name",
    "build_training_graphs",
    "build_vjp_graph",
    "check_training_model",
    "cast_like_as_cast",
    "check_pool_shapes",
    "conv_transpose_as_conv",
    "cumsum_as_matmul",
    "default_passes",
    "depth_to_space_as_reshape",
    "disable_training_mode",
    "expose_dropout_mask",
    "expose_layer_norm_statistics",
    "gelu_as_contrib_gelu",
    "gradient_name",
    "group_norm_as_elementary",
    "layer_norm_zero_bias",
    "negative_step_slice_as_gather",
    "normalize",
    "partition_parameters",
    "recurrent_as_elementary",
    "recurrent_directions_as_forward",
    "reduce_extremum_as_topk",
    "resize_as_matmul",
    "softplus_as_elementary",
    "split_vjp_graph",
    "split_to_sequence_as_split",
]
